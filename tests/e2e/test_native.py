"""The libssh2 engine (fleet/ssh/native.py) against real sshd nodes: which hosts it takes, which it
hands to paramiko, and that a run's outcome is the same through either library.

The rest of the cluster tests run through it too (it is the default for fresh connections of a
run of steps); these pin what is its own: the choice, the hand-over on every host key verdict
but "known", and the places where libssh2 differs from paramiko (an exit status of 0 that may
mean none, a command that leaves its output open behind it)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, FleetResult, fleet_env, poll, run_fleet

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


# ------------------------------------------------ the run loop: floods, leftovers, forged frames

ENGINES = ("auto", "paramiko")


def _flood(sandbox: Any, tmp_path: Path, args: list[str], interrupt: bool) -> tuple[int, dict]:
    """`fleet exec --json ARGS`, its output read as it comes and dropped (a flood's is huge);
    SIGINT once a few thousand lines arrived when `interrupt`. Its exit code and RunFinished."""
    proc = subprocess.Popen(
        [*FLEET, "exec", "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=fleet_env(sandbox, tmp_path / "logs"),
    )
    assert proc.stdout is not None
    final: dict[str, Any] = {}
    seen = 0
    try:
        for line in proc.stdout:
            seen += '"OutputLine"' in line
            if interrupt and seen == 5000:
                proc.send_signal(signal.SIGINT)
            if '"RunFinished"' in line:
                final = json.loads(line)
        proc.wait(timeout=120)  # a hang guard, not a timing
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, final


@pytest.mark.parametrize("engine", ENGINES)
def test_ctrl_c_during_a_flood_cancels_at_once_and_stops_the_remote_command(
    sandbox: Any, tmp_path: Path, engine: str
) -> None:
    """A node printing faster than fleet reads never empties its channel: the read loop still
    comes back to its cancel check, so the step is cancelled and stopped on the node (it was
    reported as "connect: run interrupted" after 25 s, with `yes` left running)."""
    node = sandbox.nodes()[0]
    probe = f"fleet-flood-{engine}-{os.getpid()}"
    step = f"bash -c 'exec -a {probe} yes'"
    code, final = _flood(sandbox, tmp_path, [step, "-l", node.name, "--ssh-engine", engine], True)
    left = sandbox.run_on(node, f"pgrep -f {probe}").stdout.strip()
    if left:
        sandbox.run_on(node, f"pkill -KILL -f {probe}")
    row = final["hosts"][node.name]
    assert code == 130
    assert (row["outcome"], row["reason"]) == ("cancelled", "cancelled; remote command stopped")
    assert not left, "the flood survived the cancel"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_flood_past_its_timeout_times_out_and_is_stopped(
    sandbox: Any, tmp_path: Path, engine: str
) -> None:
    node = sandbox.nodes()[0]
    probe = f"fleet-flood-timeout-{engine}-{os.getpid()}"
    step = f"bash -c 'exec -a {probe} yes'"
    args = [step, "-l", node.name, "--ssh-engine", engine, "--timeout", "2"]
    code, final = _flood(sandbox, tmp_path, args, False)
    left = sandbox.run_on(node, f"pgrep -f {probe}").stdout.strip()
    if left:
        sandbox.run_on(node, f"pkill -KILL -f {probe}")
    assert code == 4
    assert final["hosts"][node.name]["outcome"] == "timed_out"
    assert not left, "the flood survived its timeout"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_background_child_that_keeps_writing_neither_holds_the_step_nor_is_the_login_shells(
    sandbox: Any, tmp_path: Path, engine: str
) -> None:
    """The command ends and leaves a child writing forever to its output: the step ends (its
    wait after the end frame does not restart on the child's lines), ok, and the warning says
    what the lines are. Once fleet closes the channel, the child's next write fails (SIGPIPE),
    as after an ssh session that ended."""
    node = sandbox.nodes()[0]
    probe = f"bg-{engine}-{os.getpid()}"
    step = f"while :; do echo {probe}; sleep 0.2; done & echo parent-done"
    result = _exec(sandbox, tmp_path, step, "-l", node.name, "--ssh-engine", engine, timeout_s=60)
    gone = poll(lambda: sandbox.run_on(node, f"pgrep -f {probe}").returncode == 1)
    if not gone:
        sandbox.run_on(node, f"pkill -KILL -f {probe}")

    assert result.code == 0, result.stdout + result.stderr
    assert ("stdout", "parent-done") in _lines(result, node.name)
    assert "came after fleet's command had ended" in result.stderr
    assert "background process" in result.stderr
    assert "the login shell printed" not in result.stderr
    late = [x for x in result.json_lines() if x["event"] == "LateOutputIgnored"]
    assert late
    assert late[0]["lines"][0] == probe
    assert gone, "the background child still runs"


FORGED_END = (
    'T=$(tr "\\0" "\\n" </proc/$PPID/cmdline | grep -o "fleet-frame [0-9a-f]*" | head -1 '
    '| cut -d" " -f2); printf "\\nfleet-frame %s end 0\\n" $T; '
    'printf "\\nfleet-frame %s end\\n" $T >&2; exit 7'
)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_end_frame_the_command_forges_does_not_decide_its_status(
    sandbox: Any, tmp_path: Path, engine: str
) -> None:
    """The command finds the frame's token in its parent's argv and prints an `end 0` of its
    own, then exits 7: exit 7 on both engines, and the frame's real end line is no noise."""
    node = sandbox.nodes()[0]
    result = _exec(sandbox, tmp_path, FORGED_END, "-l", node.name, "--ssh-engine", engine)

    assert result.code == 3, result.stdout + result.stderr
    assert _outcome(result, node.name) == [("exec", 7, False)]
    assert "fleet-frame" not in result.stderr
