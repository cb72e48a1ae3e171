"""The engine end to end: real CLI, real sshd nodes, real failures."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, fleet_env, poll, run_fleet

pytestmark = pytest.mark.root


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _outcomes(result: Any) -> dict[str, str]:
    return {h: r["outcome"] for h, r in result.final()["hosts"].items()}


def test_exec_streams_each_nodes_own_output(sandbox: Any, tmp_path: Path) -> None:
    result = run_fleet(sandbox, "exec", "hostname", "--plain", log_dir=tmp_path)

    assert result.code == 0, result.stderr
    for node in sandbox.nodes():
        assert f"{node.name} |   {node.name}" in result.stdout.replace("  |", " |")
    runs = list(tmp_path.iterdir())
    assert len(runs) == 1
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["exit_code"] == 0
    assert (runs[0] / "hosts" / f"{sandbox.nodes()[0].name}.log").read_text().count("exit 0") == 1


def test_node_without_sshd_exits_4_while_others_finish(sandbox: Any, tmp_path: Path) -> None:
    down = sandbox.nodes()[3]
    sandbox.stop_sshd(down)
    try:
        result = run_fleet(sandbox, "exec", "true", "--json", log_dir=tmp_path)
    finally:
        sandbox.start_sshd(down)

    assert result.code == 4, result.stdout + result.stderr
    outcomes = _outcomes(result)
    assert outcomes.pop(down.name) == "unreachable"
    assert set(outcomes.values()) == {"ok"}
    assert result.final()["hosts"][down.name]["reason"] == "connection refused"


def test_failing_step_exits_3_and_stops_that_host_only(sandbox: Any, tmp_path: Path) -> None:
    bad = sandbox.nodes()[1]
    playbook = _write(
        tmp_path / "pb.yaml",
        f"""
name: two-steps
steps:
  - name: fail on one node
    run: '[ "$(hostname)" != {bad.name} ] || {{ echo boom >&2; exit 7; }}'
  - name: mark
    run: touch /tmp/second-step-ran
""",
    )
    logs = tmp_path / "logs"

    result = run_fleet(sandbox, "run", str(playbook), "--json", log_dir=logs)

    assert result.code == 3, result.stdout + result.stderr
    final = result.final()["hosts"]
    assert final[bad.name]["outcome"] == "failed"
    assert final[bad.name]["exit_code"] == 7
    assert final[bad.name]["failed_step"] == "fail on one node"
    assert final[bad.name]["stderr_tail"] == ["boom"]
    for node in sandbox.nodes():
        ran = sandbox.run_on(
            node, "test -e /tmp/second-step-ran && rm /tmp/second-step-ran"
        ).returncode
        assert (ran == 0) == (node.name != bad.name), node.name


def test_unknown_host_key_rejected_by_default_then_accepted_with_accept_new(
    sandbox: Any, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    config = _write(
        tmp_path / "ssh_config",
        sandbox.ssh_config_path.read_text().replace(str(sandbox.known_hosts_path), str(known)),
    )
    node = sandbox.nodes()[0]
    args = ("exec", "true", "--limit", node.name, "--json")

    strict = run_fleet(sandbox, *args, ssh_config=config, log_dir=tmp_path / "a")
    assert strict.code == 4
    assert strict.final()["hosts"][node.name]["reason"] == "host key unknown"
    assert known.read_text() == ""

    tofu = run_fleet(
        sandbox, *args, "--host-keys", "accept-new", ssh_config=config, log_dir=tmp_path / "b"
    )
    assert tofu.code == 0, tofu.stdout
    assert node.address in known.read_text()

    again = run_fleet(sandbox, *args, ssh_config=config, log_dir=tmp_path / "c")
    assert again.code == 0


def test_changed_host_key_is_rejected(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[0]
    other = sandbox.nodes()[1]
    # Claim node's address has other's key: what a man-in-the-middle (or a reinstall) looks like.
    lines = sandbox.known_hosts_path.read_text().splitlines()
    other_key = next(x.split(" ", 1)[1] for x in lines if x.split()[0] == other.address)
    known = _write(tmp_path / "known_hosts", f"{node.address} {other_key}\n")
    config = _write(
        tmp_path / "ssh_config",
        sandbox.ssh_config_path.read_text().replace(str(sandbox.known_hosts_path), str(known)),
    )

    result = run_fleet(
        sandbox,
        "exec",
        "true",
        "--limit",
        node.name,
        "--json",
        "--host-keys",
        "accept-new",
        ssh_config=config,
        log_dir=tmp_path,
    )

    assert result.code == 4
    assert result.final()["hosts"][node.name]["reason"] == "host key changed"


def test_inventory_values_never_execute(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[0]
    payloads = [
        "x; touch /tmp/pwned",
        "$(touch /tmp/pwned)",
        "`touch /tmp/pwned`",
        "a\ntouch /tmp/pwned",
        "'; touch /tmp/pwned; '",
    ]
    inventory = _write(
        tmp_path / "inv.yaml",
        "all:\n  hosts:\n"
        + "".join(
            f"    {node.name}-{i}: {{ansible_host: {node.address}, evil: {json.dumps(p)}}}\n"
            for i, p in enumerate(payloads)
        ),
    )
    playbook = _write(
        tmp_path / "pb.yaml",
        "name: echo\nsteps:\n  - name: echo\n    run: printf '%s\\n' ${evil}\n",
    )

    result = run_fleet(
        sandbox,
        "run",
        str(playbook),
        "--json",
        "--var",
        "unused=$(touch /tmp/pwned)",
        inventory=inventory,
        log_dir=tmp_path / "logs",
    )

    assert result.code == 0, result.stdout + result.stderr
    printed = [e["line"] for e in result.json_lines() if e["event"] == "OutputLine"]
    for p in payloads:
        for part in p.split("\n"):
            assert part in printed
    assert sandbox.run_on(node, "test -e /tmp/pwned").returncode != 0, "an inventory value ran"


def test_step_timeout_kills_the_remote_process(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[0]
    result = run_fleet(
        sandbox,
        "exec",
        "bash -c 'exec -a fleet-timeout-probe sleep 300'",
        "--timeout",
        "1",
        "--limit",
        node.name,
        "--json",
        log_dir=tmp_path,
    )

    assert result.code == 4, result.stdout
    assert result.final()["hosts"][node.name]["outcome"] == "timed_out"
    assert _gone(sandbox, node, "fleet-timeout-probe"), "the timed-out command survived on the node"


def test_ctrl_c_cancels_stops_remote_commands_and_exits_130(sandbox: Any, tmp_path: Path) -> None:
    env = fleet_env(sandbox, tmp_path)
    proc = subprocess.Popen(
        [
            *FLEET,
            "exec",
            "bash -c 'exec -a fleet-cancel-probe sleep 300'",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    started: set[str] = set()
    deadline = time.monotonic() + 60
    while len(started) < len(sandbox.nodes()) and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        event = json.loads(line)
        if event["event"] == "StepStarted":
            started.add(event["host"])
    assert len(started) == len(sandbox.nodes())
    for node in sandbox.nodes():  # the remote commands really run before we interrupt
        assert _running(sandbox, node, "fleet-cancel-probe"), node.name
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)

    assert proc.returncode == 130
    final = next(json.loads(x) for x in rest.splitlines() if '"RunFinished"' in x)
    assert {r["outcome"] for r in final["hosts"].values()} == {"cancelled"}
    assert (Path(final["run_dir"]) / "summary.json").is_file()
    for node in sandbox.nodes():
        assert _gone(sandbox, node, "fleet-cancel-probe"), f"{node.name}: remote command survived"


def _probe_pids(sandbox: Any, node: Any, probe: str) -> str:
    script = (
        f"for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $d/cmdline 2>/dev/null);"
        f' case "$c" in {probe}*) echo $d;; esac; done'
    )
    return str(sandbox.run_on(node, script).stdout.strip())


def _gone(sandbox: Any, node: Any, probe: str) -> bool:
    return poll(lambda: not _probe_pids(sandbox, node, probe))


def _running(sandbox: Any, node: Any, probe: str) -> bool:
    return poll(lambda: bool(_probe_pids(sandbox, node, probe)))


@pytest.mark.parametrize(("engine", "size"), [("auto", 40_000), ("paramiko", 140_000)])
def test_a_command_too_long_to_send_fails_saying_so_not_as_a_lost_connection(
    sandbox: Any, tmp_path: Path, engine: str, size: int
) -> None:
    """libssh2 sends no request over ~34 kB (it failed the step as `connection lost`, exit 4,
    the hosts @unreachable) and Linux takes no argument over 128 KiB (the login shell ran
    nothing: blamed on an rc file). Either way the step fails, naming the size and a way out."""
    node = sandbox.nodes()[0]
    playbook = _write(
        tmp_path / "long.yaml",
        f"name: long\nvars:\n  x: {'A' * size}\nsteps:\n  - name: show\n    run: echo ${{x}}\n",
    )
    result = run_fleet(
        sandbox, "run", str(playbook), "-l", node.name, "--json", "--ssh-engine", engine,
        log_dir=tmp_path / "logs",
    )  # fmt: skip

    host = result.final()["hosts"][node.name]
    assert result.code == 3, (host, result.stderr)
    assert host["outcome"] == "failed", host
    assert "bytes as sent" in host["reason"], host
    assert "script:" in host["reason"], host
    then = run_fleet(sandbox, "exec", "echo fine", "-l", node.name, log_dir=tmp_path / "logs")
    assert then.code == 0, then.stdout + then.stderr
