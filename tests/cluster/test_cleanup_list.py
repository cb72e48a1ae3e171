"""cleanup.sh's `list` action, through the real `fleet status --json` on sandbox nodes.

`fleet status` runs `cleanup.sh list --pattern torchrun --pattern 'train\\.py'` as its
`processes` step (playbooks/status.yaml). The shell fleet starts for it carries those patterns
in its own argv, so "the caller is never listed" is tested the way it happens in production.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, run_fleet

from fleet.runner import parse_facts

pytestmark = pytest.mark.cluster

CLEANUP = Path(__file__).resolve().parents[2] / "fleet" / "remote" / "cleanup.sh"


def _poll(check: Callable[[], Any], what: str, timeout_s: float = 15) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def _gone(sandbox: Any, node: Any, pid: int) -> bool:
    return bool(sandbox.run_on(node, f"test -d /proc/{pid}").returncode != 0)


def _cmdline(sandbox: Any, node: Any, pid: int) -> str:
    return str(sandbox.run_on(node, f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout).strip()


def _child_with_cmdline(sandbox: Any, node: Any, parent: int, cmdline: str) -> int | None:
    script = f"""
for d in /proc/[0-9]*; do
    s=$(cat "$d/stat" 2>/dev/null) || continue
    set -- ${{s##*) }}
    [ "$2" = {parent} ] || continue
    [ "$(tr '\\0' ' ' < "$d/cmdline")" = '{cmdline} ' ] && echo "${{d#/proc/}}"
done
"""
    out = str(sandbox.run_on(node, script).stdout).split()
    return int(out[0]) if out else None


@pytest.fixture
def planted(sandbox: Any) -> Iterator[list[tuple[Any, int]]]:
    """(node, pid) of every process a test starts; all killed (and awaited) afterwards."""
    pids: list[tuple[Any, int]] = []
    yield pids
    for node, pid in pids:
        sandbox.run_on(node, f"kill -KILL {pid} 2>/dev/null")
        _poll(partial(_gone, sandbox, node, pid), f"pid {pid} on {node.name} to end")


def _plant(sandbox: Any, node: Any, command: str, planted: list[tuple[Any, int]]) -> int:
    """Start `command` detached in its own session, as a job sshd left behind would be."""
    result = sandbox.run_on(node, f"setsid {command} </dev/null >/dev/null 2>&1 & echo $!")
    assert result.returncode == 0, result.stderr
    pid = int(result.stdout)  # setsid does not fork here (not a process group leader)
    planted.append((node, pid))
    return pid


def processes_step(result: FleetResult, host: str) -> tuple[list[str], int]:
    """The `processes` step's stdout lines and exit code on `host`."""
    events = [e for e in result.json_lines() if e.get("host") == host]
    lines = [
        e["line"]
        for e in events
        if e["event"] == "OutputLine" and e["step"] == "processes" and e["stream"] == "stdout"
    ]
    codes = [
        e["exit_code"] for e in events if e["event"] == "StepFinished" and e["step"] == "processes"
    ]
    assert len(codes) == 1, result.stdout
    return lines, codes[0]


def test_list_names_a_planted_torchrun_and_its_renamed_worker_but_not_its_caller(
    sandbox: Any, planted: list[tuple[Any, int]], tmp_path: Path
) -> None:
    node = sandbox.nodes()[0]
    # a torchrun whose worker renamed itself (matched as a descendant, as kill does), and a
    # bystander that matches nothing
    launcher = _plant(
        sandbox, node, "bash -c '(exec -a worker sleep 601) & exec -a torchrun sleep 602'", planted
    )
    worker = _poll(lambda: _child_with_cmdline(sandbox, node, launcher, "worker 601"), "the worker")
    planted.append((node, worker))
    _poll(lambda: _cmdline(sandbox, node, launcher) == "torchrun 602", "torchrun to exec")
    _plant(sandbox, node, "sleep 603", planted)

    result = run_fleet(sandbox, "status", "--json", "-l", node.name, log_dir=tmp_path)

    lines, code = processes_step(result, node.name)
    cmd = {launcher: "torchrun 602", worker: "worker 601"}
    pids = ",".join(str(pid) for pid in sorted(cmd))
    assert lines == [*(f"proc {pid} {cmd[pid]}" for pid in sorted(cmd)), f"training=2 pids={pids}"]
    assert code == 0
    assert parse_facts(lines[-1]) == {"training": "2", "pids": pids}
    assert _cmdline(sandbox, node, launcher) == "torchrun 602", "list must not kill anything"


def test_list_on_a_clean_node_prints_training_0_and_no_pids(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[1]

    result = run_fleet(sandbox, "status", "--json", "-l", node.name, log_dir=tmp_path)

    lines, code = processes_step(result, node.name)
    assert (lines, code) == (["training=0 pids="], 0)
    assert parse_facts(lines[-1]) == {"training": "0", "pids": ""}


def test_list_without_a_pattern_is_a_usage_error(sandbox: Any) -> None:
    node = sandbox.nodes()[1]
    (node.node_dir / "cleanup.sh").write_text(CLEANUP.read_text())
    try:
        result = sandbox.run_on(node, "sh -s -- list < /run/fleet/cleanup.sh")
    finally:
        (node.node_dir / "cleanup.sh").unlink()

    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("cleanup.sh: list needs at least one --pattern")
