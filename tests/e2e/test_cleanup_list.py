"""`fleet status`'s training process count, through the real `fleet status --json` on sandbox nodes.

`fleet status` runs `status.sh processes --pattern torchrun --pattern 'train\\.py'` as its
`processes` step (playbooks/status.yaml): facts.sh's full records, counted on the node. The
processes fleet starts for it carry those patterns in their argv (and FLEET_NODE_HELPER in their
environment), so "the caller is never counted" is tested the way it happens in production.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, run_fleet

from fleet.engine.runner import parse_facts

pytestmark = pytest.mark.root


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


def test_status_counts_a_planted_torchrun_and_its_renamed_worker_but_not_its_caller(
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
    pids = ",".join(str(pid) for pid in sorted((launcher, worker)))
    assert lines == [f"training=2 pids={pids}"]
    assert code == 0
    assert parse_facts(lines[-1]) == {"training": "2", "pids": pids}
    assert _cmdline(sandbox, node, launcher) == "torchrun 602", "status must not kill anything"


def test_status_on_a_clean_node_prints_training_0_and_no_pids(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[1]

    result = run_fleet(sandbox, "status", "--json", "-l", node.name, log_dir=tmp_path)

    lines, code = processes_step(result, node.name)
    assert (lines, code) == (["training=0 pids="], 0)
    assert parse_facts(lines[-1]) == {"training": "0", "pids": ""}


def test_patterns_the_node_s_grep_rejects_fail_the_processes_step(
    sandbox: Any, tmp_path: Path
) -> None:
    """`fleet status` refuses such a pattern before connecting (tests/cli); the playbook run as
    such does not read it first, so the node's own defence is what says it."""
    node = sandbox.nodes()[1]

    result = run_fleet(
        sandbox,
        "run",
        "status",
        "--json",
        "-l",
        node.name,
        "--var",
        "patterns=[(]",
        log_dir=tmp_path,
    )

    lines, code = processes_step(result, node.name)
    assert (lines, code) == ([], 1)
    errors = [
        e["line"]
        for e in result.json_lines()
        if e["event"] == "OutputLine" and e.get("step") == "processes" and e["stream"] == "stderr"
    ]
    # grep's own reason first (its wording is the node's), then the step's verdict
    assert errors[-1] == "status.sh: the node's grep -E rejects the patterns", errors
    assert len(errors) == 2, errors
