"""The libssh2 engine (fleet/ssh/native.py) against real sshd nodes: which hosts it takes, which it
hands to paramiko, and that a run's outcome is the same through either library.

The rest of the cluster tests run through it too (it is the default for fresh connections of a
run of steps); these pin what is its own: the choice, the hand-over on every host key verdict
but "known", and the places where libssh2 differs from paramiko (an exit status of 0 that may
mean none, a command that leaves its output open behind it)."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, run_fleet

pytestmark = pytest.mark.root


def _engines(result: FleetResult) -> dict[str, str | None]:
    """host -> the `ssh` of its HostConnected event."""
    return {x["host"]: x.get("ssh") for x in result.json_lines() if x["event"] == "HostConnected"}


def _hosts(result: FleetResult) -> dict[str, dict[str, Any]]:
    return dict(result.final()["hosts"])


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _exec(sandbox: Any, tmp_path: Path, *args: str, **kw: Any) -> FleetResult:
    return run_fleet(sandbox, "exec", *args, "--json", log_dir=tmp_path / "logs", **kw)


def test_fresh_connections_of_a_run_use_libssh2_and_the_switch_turns_it_off(
    sandbox: Any, tmp_path: Path
) -> None:
    names = {n.name for n in sandbox.nodes()}
    default = _exec(sandbox, tmp_path, "true")
    flag = _exec(sandbox, tmp_path, "true", "--ssh-engine", "paramiko")
    env = _exec(sandbox, tmp_path, "true", extra_env={"FLEET_SSH_ENGINE": "paramiko"})

    assert default.code == flag.code == env.code == 0, default.stdout + flag.stdout + env.stdout
    assert _engines(default) == dict.fromkeys(names, "libssh2")
    assert _engines(flag) == dict.fromkeys(names, "paramiko")
    assert _engines(env) == dict.fromkeys(names, "paramiko")


def _known_without(sandbox: Any, tmp_path: Path, node: Any, replacement: str = "") -> Path:
    """The sandbox's known_hosts with `node`'s lines replaced."""
    lines = [
        line
        for line in sandbox.known_hosts_path.read_text().splitlines()
        if line.split()[0] != node.address
    ]
    if replacement:
        lines.append(replacement)
    return _write(tmp_path / "known_hosts", "\n".join(lines) + "\n")


def _config(sandbox: Any, tmp_path: Path, known: Path, checking: str) -> Path:
    return _write(
        tmp_path / "ssh_config",
        "Host *\n"
        "    User root\n"
        f"    IdentityFile {sandbox.key_path}\n"
        f"    UserKnownHostsFile {known}\n"
        "    GlobalKnownHostsFile /dev/null\n"
        f"    StrictHostKeyChecking {checking}\n"
        "    IdentityAgent none\n",
    )


def test_a_host_key_not_on_record_goes_to_paramiko_which_refuses_it(
    sandbox: Any, tmp_path: Path
) -> None:
    node, other = sandbox.nodes()[:2]
    known = _known_without(sandbox, tmp_path, node)
    result = _exec(
        sandbox,
        tmp_path,
        "hostname",
        "-l",
        f"{node.name},{other.name}",
        ssh_config=_config(sandbox, tmp_path, known, "yes"),
    )

    assert result.code == 4, result.stdout + result.stderr
    hosts = _hosts(result)
    assert hosts[node.name]["reason"] == "host key unknown"
    assert hosts[other.name]["outcome"] == "ok"
    assert _engines(result) == {other.name: "libssh2"}


def test_accept_new_records_through_paramiko_then_the_next_run_is_libssh2(
    sandbox: Any, tmp_path: Path
) -> None:
    node = sandbox.nodes()[0]
    known = _known_without(sandbox, tmp_path, node)
    config = _config(sandbox, tmp_path, known, "accept-new")

    first = _exec(sandbox, tmp_path, "true", "-l", node.name, ssh_config=config)
    second = _exec(sandbox, tmp_path, "true", "-l", node.name, ssh_config=config)

    assert first.code == second.code == 0, first.stdout + second.stdout
    assert node.address in known.read_text()
    assert _engines(first) == {node.name: "paramiko"}
    assert _engines(second) == {node.name: "libssh2"}


def test_a_changed_host_key_is_refused_and_nothing_is_run(sandbox: Any, tmp_path: Path) -> None:
    """libssh2 sees a key that is not the one on record: it hangs up unauthenticated, and
    paramiko's path names the change with both fingerprints."""
    node = sandbox.nodes()[0]
    wrong = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes(range(32)))
    known = _known_without(sandbox, tmp_path, node, f"{node.address} ssh-ed25519 {wrong.decode()}")
    marker = f"/tmp/fleet-native-changed-{tmp_path.name}"
    result = _exec(
        sandbox,
        tmp_path,
        f"touch {marker}",
        "-l",
        node.name,
        ssh_config=_config(sandbox, tmp_path, known, "yes"),
    )

    assert result.code == 4, result.stdout + result.stderr
    host = _hosts(result)[node.name]
    assert host["reason"] == "host key changed"
    assert "SHA256:" in host["last_line"]
    assert sandbox.run_on(node, f"test -e {marker}").returncode == 1


def test_an_unusable_identity_goes_to_paramiko_which_says_why(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[0]
    stranger = tmp_path / "id_stranger"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
        check=True,
        capture_output=True,
    )
    inventory = _write(
        tmp_path / "inventory.yaml",
        f"all:\n  hosts:\n    {node.name}:\n      ansible_host: {node.address}\n"
        f"      ansible_user: root\n      ansible_ssh_private_key_file: {stranger}\n",
    )
    config = _write(
        tmp_path / "ssh_config",
        f"Host *\n    IdentityAgent none\n    UserKnownHostsFile {sandbox.known_hosts_path}\n"
        "    GlobalKnownHostsFile /dev/null\n",
    )
    result = _exec(sandbox, tmp_path, "true", inventory=inventory, ssh_config=config)

    assert result.code == 4, result.stdout + result.stderr
    assert _hosts(result)[node.name]["reason"] == "authentication failed"


SCRIPT = """
name: parity
steps:
  - name: streams
    run: "echo out-1; echo err-1 >&2; printf 'no-newline'"
  - name: stdin
    script: fed.sh
  - name: status
    run: "exit 7"
    on_error: continue
  - name: signal
    run: "kill -TERM $$"
    on_error: continue
  - name: holder
    run: "sleep 60 >/dev/null 2>&1 & sleep 60 & echo started"
    timeout: 30
"""


def _outcome(result: FleetResult, host: str) -> list[tuple[str, Any, Any]]:
    """Each step's (name, exit code, timed out) for one host."""
    return [
        (x["step"], x["exit_code"], x["timed_out"])
        for x in result.json_lines()
        if x["event"] == "StepFinished" and x["host"] == host
    ]


def _lines(result: FleetResult, host: str) -> list[tuple[str, str]]:
    return [
        (x["stream"], x["line"])
        for x in result.json_lines()
        if x["event"] == "OutputLine" and x["host"] == host and x["stream"] == "stdout"
    ]


def test_a_playbook_has_the_same_outcome_through_either_library(
    sandbox: Any, tmp_path: Path
) -> None:
    node = sandbox.nodes()[0]
    playbook = _write(tmp_path / "parity.yaml", SCRIPT)
    _write(tmp_path / "fed.sh", "echo fed on stdin\n")
    runs = {
        engine: run_fleet(
            sandbox,
            "run",
            str(playbook),
            "--json",
            "--yes",
            "-l",
            node.name,
            "--ssh-engine",
            engine,
            log_dir=tmp_path / engine,
        )
        for engine in ("auto", "paramiko")
    }
    native, reference = runs["auto"], runs["paramiko"]

    assert _engines(native) == {node.name: "libssh2"}
    assert native.code == reference.code == 3, native.stdout + native.stderr
    assert _outcome(native, node.name) == _outcome(reference, node.name)
    steps = {step: (code, late) for step, code, late in _outcome(native, node.name)}
    assert steps["status"] == (7, False)
    assert steps["signal"] == (128 + 15, False)  # died of TERM, as sshd's exit-signal said
    # The holder's sleep keeps its stdout open for a minute: the step still ends, as ok.
    assert steps["holder"] == (0, False)
    assert _lines(native, node.name) == _lines(reference, node.name)
    assert ("stdout", "no-newline") in _lines(native, node.name)
    sandbox.run_on(node, "pkill -f 'sleep 60' || true")


def test_a_step_past_its_timeout_is_killed_on_the_node(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[0]
    tag = "sleep 987.654"  # a pattern no other test's process has
    result = _exec(
        sandbox,
        tmp_path,
        tag,
        "-l",
        node.name,
        "--timeout",
        "2",
    )

    assert _engines(result) == {node.name: "libssh2"}
    assert _hosts(result)[node.name]["outcome"] == "timed_out", result.stdout
    finished = [x for x in result.json_lines() if x["event"] == "StepFinished"]
    assert finished[0]["timed_out"] is True
    assert sandbox.run_on(node, f"pgrep -f '{tag}'").returncode == 1
