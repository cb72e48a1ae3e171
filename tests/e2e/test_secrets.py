"""Secrets typed at fleet's prompts never appear in anything a run writes or prints.

The sudo password (-K) is covered in test_sudo_and_jump.py; here, an encrypted SSH key's
passphrase (--ask-key-pass), against a real node that accepts only that key.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, fleet_env, keeper_pids, poll, run_fleet

pytestmark = pytest.mark.root

PASSPHRASE = "k3y-Pass phrase!'$(x)"


@pytest.fixture
def encrypted_key(sandbox: Any, tmp_path: Path) -> Iterator[tuple[Any, Path, Path]]:
    """A passphrase-protected key authorised on node01 only; an ssh_config that offers only it
    and an inventory that names no key of its own."""
    node = sandbox.nodes()[0]
    key = tmp_path / "id_locked"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-f", str(key)], check=True
    )
    authorized = node.node_dir / "authorized_keys"
    original = authorized.read_text()
    authorized.write_text(original + key.with_suffix(".pub").read_text())
    config = tmp_path / "ssh_config"
    config.write_text(sandbox.ssh_config_path.read_text().replace(str(sandbox.key_path), str(key)))
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        f"all:\n  hosts:\n    {node.name}: {{ansible_host: {node.address}, ansible_user: root}}\n"
    )
    try:
        yield node, config, inventory
    finally:
        authorized.write_text(original)


def _run_with_stdin(
    inventory: Path, config: Path, log_dir: Path, *args: str, **env_extra: str
) -> tuple[int, str]:
    env = fleet_env(
        None, log_dir, inventory=inventory, ssh_config=config, SSH_AUTH_SOCK="", **env_extra
    )
    proc = subprocess.run(
        [*FLEET, *args],
        input=PASSPHRASE + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        start_new_session=True,  # no controlling terminal: getpass reads stdin
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_encrypted_key_without_passphrase_is_named_not_retried(
    sandbox: Any, encrypted_key: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    node, config, inventory = encrypted_key
    result = run_fleet(
        sandbox,
        "exec",
        "true",
        "--limit",
        node.name,
        "--json",
        ssh_config=config,
        inventory=inventory,
        log_dir=tmp_path,
        extra_env={"SSH_AUTH_SOCK": ""},
    )
    assert result.code == 4
    final = result.final()["hosts"][node.name]
    assert final["reason"] == "authentication failed"
    assert "encrypted" in final["last_line"]


def test_key_passphrase_is_used_and_never_written_anywhere(
    sandbox: Any, encrypted_key: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    node, config, inventory = encrypted_key
    logs = tmp_path / "logs"
    code, output = _run_with_stdin(
        inventory,
        config,
        logs,
        "exec",
        "echo reached $(hostname)",
        "--limit",
        node.name,
        "--ask-key-pass",
        "--json",
    )
    assert code == 0, output
    assert f"reached {node.name}" in output
    assert PASSPHRASE not in output
    written = [p for p in logs.rglob("*") if p.is_file()]
    assert any(p.name == "summary.json" for p in written)
    for path in written:
        assert PASSPHRASE not in path.read_text(errors="replace"), path


def test_no_keeper_is_forked_after_a_passphrase_was_typed(
    sandbox: Any, encrypted_key: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    """A process forked from the command holds a copy of its memory, the typed passphrase
    included, and a keeper lives on for the window: with a typed secret the first command
    neither becomes its keepers (no worker stays) nor forks them, it spawns them (a fresh
    interpreter, sent only what it needs)."""
    _node, config, inventory = encrypted_key
    runtime = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))  # short: a socket's path
    runtime.chmod(0o700)
    logs = tmp_path / "logs"
    env = {"XDG_RUNTIME_DIR": str(runtime), "FLEET_PERSIST": "60", "FLEET_KEEPERS": "1"}
    try:
        code, output = _run_with_stdin(
            inventory, config, logs, "exec", "true", "--ask-key-pass", "--json", **env
        )
        assert code == 0, output
        (keeper,) = keeper_pids(runtime)
        argv = Path(f"/proc/{keeper}/cmdline").read_bytes().split(b"\0")
        assert b"-m" in argv  # spawned: `python -m fleet.ssh.keeper SOCKET`
        (summary,) = logs.rglob("summary.json")
        assert json.loads(summary.read_text()).get("workers", []) == []
    finally:
        subprocess.run(
            [*FLEET, "disconnect"],
            env=fleet_env(
                None, logs, inventory=inventory, ssh_config=config, XDG_RUNTIME_DIR=str(runtime)
            ),
            capture_output=True,
            timeout=60,
            check=False,
        )
        for pid in keeper_pids(runtime):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        assert poll(lambda: not keeper_pids(runtime), 30)
        shutil.rmtree(runtime, ignore_errors=True)
