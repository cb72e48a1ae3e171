"""The OpenSSH client as the bulk path of `fleet push` / `fleet pull` (fleet/ssh/openssh.py,
fleet/transfer/pipe.py) against real sshd nodes: the bytes it carries are verified and
byte-identical, paramiko still carries them where there is no `ssh`, the route accepts only the
host key fleet verified on its own connection, and neither its pinned known_hosts nor its ssh
processes outlive fleet.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, fleet_env, poll, run_fleet

pytestmark = pytest.mark.root


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def node_sha(sandbox: Any, node: str, path: str) -> str:
    return sandbox.run_on(node, f"sha256sum < {shlex.quote(path)}").stdout.split()[0]


@pytest.fixture
def remote(sandbox: Any) -> Iterator[str]:
    path = f"/tmp/xfer-ssh-{uuid.uuid4().hex[:8]}"
    yield path
    for node in ("node01", "node02"):
        sandbox.run_on(node, f"rm -rf {shlex.quote(path)}")


def ssh_processes(marker: Path) -> list[str]:
    """Command lines of the processes that name `marker` (fleet's private pin directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(marker).encode() in cmdline:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def events(result: Any, kind: str) -> list[dict[str, Any]]:
    return [x for x in result.json_lines() if x["event"] == kind]


def test_push_and_pull_over_ssh_are_verified_byte_identical_and_say_so(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    source = tmp_path / "blob"
    source.write_bytes(os.urandom(5_000_000))
    pins = tmp_path / "pins"
    pins.mkdir()
    env = {"TMPDIR": str(pins)}
    logs = tmp_path / "logs"
    push = run_fleet(
        sandbox, "push", str(source), f"{remote}/blob", "-l", "node01", "--json",
        log_dir=logs, extra_env=env,
    )  # fmt: skip
    assert push.code == 0, push.stdout + push.stderr
    [planned] = events(push, "TransferPlanned")
    [moved] = events(push, "FileMoved")
    assert planned["via"] == "ssh"
    assert (moved["action"], moved["via"]) == ("copied", "ssh")
    assert moved["sha256"] == sha(source) == node_sha(sandbox, "node01", f"{remote}/blob")
    out = tmp_path / "out"
    pull = run_fleet(
        sandbox, "pull", f"{remote}/blob", str(out), "-l", "node01", "--json",
        log_dir=logs, extra_env=env,
    )  # fmt: skip
    assert pull.code == 0, pull.stdout + pull.stderr
    [moved] = events(pull, "FileMoved")
    assert (moved["action"], moved["via"]) == ("copied", "ssh")
    assert (out / "node01" / "blob").read_bytes() == source.read_bytes()
    # the run record says which path carried the bytes
    lines = [x for p in logs.rglob("events.jsonl") for x in p.read_text().splitlines()]
    recorded = [json.loads(x) for x in lines]
    assert {e["via"] for e in recorded if "via" in e} == {"ssh"}
    assert list(pins.iterdir()) == []  # the pinned known_hosts and the master's socket: gone
    assert ssh_processes(pins) == []


def test_without_an_ssh_binary_paramiko_carries_the_same_bytes(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    source = tmp_path / "blob"
    source.write_bytes(os.urandom(3_000_000))
    logs = tmp_path / "logs"
    env = {"PATH": str(tmp_path / "empty-path")}
    push = run_fleet(
        sandbox, "push", str(source), f"{remote}/blob", "-l", "node02", "--json",
        log_dir=logs, extra_env=env,
    )  # fmt: skip
    assert push.code == 0, push.stdout + push.stderr
    [planned] = events(push, "TransferPlanned")
    assert planned["via"] == "paramiko (no ssh binary on PATH)"
    [moved] = events(push, "FileMoved")
    assert (moved["action"], moved["via"]) == ("copied", "paramiko")
    assert node_sha(sandbox, "node02", f"{remote}/blob") == sha(source)
    out = tmp_path / "out"
    pull = run_fleet(
        sandbox, "pull", f"{remote}/blob", str(out), "-l", "node02", "--json",
        log_dir=logs, extra_env=env,
    )  # fmt: skip
    assert pull.code == 0, pull.stdout + pull.stderr
    [moved] = events(pull, "FileMoved")
    assert (moved["action"], moved["via"]) == ("copied", "paramiko")
    assert (out / "node02" / "blob").read_bytes() == source.read_bytes()


@pytest.fixture
def sessions(sandbox: Any) -> Iterator[tuple[Any, Any]]:
    """fleet's own verified connections to node01 and node02."""
    from fleet.core.hosts import Host
    from fleet.ssh.settings import SshSettings
    from fleet.ssh.transport import SSHTransport

    transport = SSHTransport(SshSettings(ssh_config=sandbox.ssh_config_path))
    one = transport.connect(Host(name="node01", address="node01"))
    two = transport.connect(Host(name="node02", address="node02"))
    try:
        yield one, two
    finally:
        one.close()
        two.close()
        transport.close()


def test_the_bulk_path_refuses_any_host_key_but_the_one_fleet_verified(
    sessions: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from fleet.ssh import openssh
    from fleet.ssh.transport import ConnectFailed
    from fleet.transfer import pipe

    one, two = sessions
    # the route pins node01's verified key: ssh runs the command there
    route = openssh.route(one)
    assert isinstance(route, openssh.Route)
    try:
        with pipe.Pipe(route.argv(b"echo ran-on-node01"), cancel=threading.Event()) as ok:
            said = b"".join(ok.chunks())
            assert ok.wait() == 0
        assert said == b"ran-on-node01\n"
        # the pin holds another key (node02's): ssh refuses node01 before any command runs
        other = two.client.get_transport().get_remote_server_key()
        (route.pin_dir / "known_hosts").write_text(
            f"{openssh.ALIAS} {other.get_name()} {other.get_base64()}\n"
        )
        with pipe.Pipe(route.argv(b"echo ran-on-node01"), cancel=threading.Event()) as bad:
            said = b"".join(bad.chunks())
            with pytest.raises(ConnectFailed, match="Host key verification failed"):
                bad.wait()
        assert said == b""
    finally:
        route.close()
    assert not route.pin_dir.exists()
    # fleet's route for node01 built from a key node01 does not hold: the host fails, no
    # quiet fallback to another path
    monkeypatch.setattr(one.client.get_transport(), "get_remote_server_key", lambda: other)
    with pytest.raises(ConnectFailed) as refused:
        pipe.open_route(one, threading.Event())
    assert refused.value.reason == "host key changed"


def test_a_killed_pull_over_ssh_leaves_no_whole_file_no_ssh_behind_and_resumes(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    sandbox.run_on("node01", f"mkdir -p {remote} && head -c 8000000 /dev/urandom > {remote}/big")
    want = node_sha(sandbox, "node01", f"{remote}/big")
    out = tmp_path / "out"
    logs = tmp_path / "logs"
    pins = tmp_path / "pins"
    pins.mkdir()
    args = ["pull", remote, str(out), "-l", "node01", "--bwlimit-node", "1M", "--plain"]
    proc = subprocess.Popen(
        [*FLEET, *args],
        env=fleet_env(sandbox, logs, TMPDIR=str(pins)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    landing = out / "node01" / Path(remote).name

    def part_grew() -> list[Path]:
        parts = list(landing.glob(".fleet-part-*")) if landing.exists() else []
        return [p for p in parts if p.stat().st_size > 1_000_000]

    try:
        assert poll(part_grew, timeout_s=30), "no part file grew"
        assert ssh_processes(pins), "the pull did not go through ssh"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert not (landing / "big").exists()  # nothing that looks whole
    # fleet died without cleaning up: its ssh processes end by themselves (their pipes closed)
    assert poll(lambda: not ssh_processes(pins), timeout_s=30), ssh_processes(pins)
    rerun = run_fleet(sandbox, "pull", remote, str(out), "-l", "node01", "--json", log_dir=logs)
    assert rerun.code == 0, rerun.stdout + rerun.stderr
    [moved] = events(rerun, "FileMoved")
    assert (moved["action"], moved["via"]) == ("resumed", "ssh")
    assert moved["moved_bytes"] < 8_000_000
    assert sha(landing / "big") == want
    assert not list(landing.glob(".fleet-part-*"))


def test_a_node_that_lies_about_a_pushed_files_checksum_gets_no_file(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    source = tmp_path / "blob"
    source.write_bytes(os.urandom(2_000_000))
    fake = "#!/bin/sh\ncat >/dev/null; echo " + "0" * 64 + "  -\n"
    for tool in ("sha256sum", "openssl"):  # whichever the node hashes with lies
        sandbox.run_on(
            "node02",
            f"printf %s {shlex.quote(fake)} > /usr/local/bin/{tool}; "
            f"chmod +x /usr/local/bin/{tool}",
        )
    try:
        result = run_fleet(
            sandbox, "push", str(source), f"{remote}/blob", "-l", "node02", "--json",
            log_dir=tmp_path / "logs",
        )  # fmt: skip
    finally:
        sandbox.run_on("node02", "rm -f /usr/local/bin/sha256sum /usr/local/bin/openssl")
    assert result.code == 3, result.stdout + result.stderr
    [moved] = events(result, "FileMoved")
    assert (moved["action"], moved["via"]) == ("failed", "ssh")
    assert "sha256 mismatch" in moved["error"]
    assert sandbox.run_on("node02", f"ls -A {remote}").stdout.split() == []


def test_a_tree_of_small_files_and_a_large_one_each_take_their_path_and_land_whole(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    """Small files go a few at a time on fleet's own connection, the large one alone through
    `ssh`; each file's event says which, every byte lands verified and nothing is left over."""
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    small = {f"sub/s{i:02d}": os.urandom(100 + i) for i in range(24)}
    small["top"] = b""  # an empty file too
    for rel, data in small.items():
        (tree / rel).write_bytes(data)
    (tree / "big").write_bytes(os.urandom(3_000_000))
    logs = tmp_path / "logs"
    to_node = ("push", str(tree), f"{remote}/", "-l", "node01", "--json")
    push = run_fleet(sandbox, *to_node, log_dir=logs)
    assert push.code == 0, push.stdout + push.stderr
    moved = {e["path"]: e for e in events(push, "FileMoved")}
    assert set(moved) == {*small, "big"}
    assert {moved[rel]["via"] for rel in small} == {"paramiko"}
    assert moved["big"]["via"] == "ssh"
    assert {e["action"] for e in moved.values()} == {"copied"}
    listing = sandbox.run_on(
        "node01", f"cd {shlex.quote(remote)}/tree && find . -type f -exec sha256sum {{}} +"
    ).stdout
    on_node = {line.split()[1][2:]: line.split()[0] for line in listing.splitlines()}
    assert on_node == {rel: sha(tree / rel) for rel in [*small, "big"]}  # no part, no leftover
    again = run_fleet(sandbox, *to_node, log_dir=logs)
    assert {e["action"] for e in events(again, "FileMoved")} == {"skipped"}
    out = tmp_path / "out"
    back = ("pull", f"{remote}/tree", str(out), "-l", "node01", "--json")
    pull = run_fleet(sandbox, *back, log_dir=logs)
    assert pull.code == 0, pull.stdout + pull.stderr
    pulled = {e["path"]: e["via"] for e in events(pull, "FileMoved")}
    assert pulled == {**dict.fromkeys(small, "paramiko"), "big": "ssh"}
    for rel in [*small, "big"]:
        assert (out / "node01" / "tree" / rel).read_bytes() == (tree / rel).read_bytes()
    assert not list((out / "node01").rglob(".fleet-part-*"))
