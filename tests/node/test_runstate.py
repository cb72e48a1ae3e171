"""Deciding a node's run state from the facts `launch.sh status` prints (pure, no node)."""

from __future__ import annotations

import pytest

from fleet.core.errors import ExitCode
from fleet.core.events import HostFinished, Outcome, RunSummary
from fleet.engine.runner import parse_facts
from fleet.node.runstate import NodeRun, RunState, decide, describe_exit
from fleet.ops.status import answered, status_exit_code


def facts(line: str) -> dict[str, str]:
    return parse_facts(line)


ALIVE = "run=r1 wrapper=alive launcher=alive launcher_pid=41 exit=none procs=6 uptime_s=75"


@pytest.mark.parametrize(
    ("line", "state", "detail"),
    [
        ("run=none", RunState.NOT_STARTED, ""),
        ("", RunState.UNKNOWN, "no facts from the node"),
        (ALIVE + " stopped=0", RunState.RUNNING, ""),
        # the wrapper has started, the command's pid is not written yet
        (
            "run=r1 wrapper=alive launcher=none launcher_pid=none exit=none procs=0",
            RunState.RUNNING,
            "",
        ),
        (
            "run=r1 wrapper=gone launcher=gone launcher_pid=41 exit=0 procs=0 stopped=0",
            RunState.FINISHED,
            "exit 0",
        ),
        (
            "run=r1 wrapper=gone launcher=gone launcher_pid=41 exit=1 procs=0 stopped=0",
            RunState.FAILED,
            "exit 1",
        ),
        (
            "run=r1 wrapper=gone launcher=gone launcher_pid=41 exit=137 procs=0 stopped=0",
            RunState.FAILED,
            "killed by SIGKILL",
        ),
        # the wrapper itself was killed: no exit status was recorded
        (
            "run=r1 wrapper=gone launcher=gone launcher_pid=41 exit=none procs=0 stopped=0",
            RunState.FAILED,
            "exit status unknown",
        ),
        (
            "run=r1 wrapper=gone launcher=gone launcher_pid=41 exit=137 procs=4 stopped=0",
            RunState.ORPHANED,
            "launcher killed by SIGKILL; 4 of its processes still running",
        ),
        (
            "run=r1 wrapper=gone launcher=gone launcher_pid=41 exit=none procs=2 stopped=0",
            RunState.ORPHANED,
            "launcher gone; 2 of its processes still running",
        ),
        # orphans win over "stopped": a stop that left processes did not stop the run
        (
            "run=r1 wrapper=gone launcher=gone launcher_pid=41 exit=143 procs=1 stopped=1",
            RunState.ORPHANED,
            "launcher killed by SIGTERM; 1 of its processes still running",
        ),
        (
            "run=r1 wrapper=gone launcher=gone launcher_pid=41 exit=143 procs=0 stopped=1",
            RunState.STOPPED,
            "stopped by fleet stop",
        ),
        (
            "run=r1 wrapper=gone launcher=gone launcher_pid=none exit=none procs=0 uptime_s=0 "
            "container=gone stopped=0",
            RunState.FAILED,
            "its container is gone or not running",
        ),
    ],
)
def test_decide(line: str, state: RunState, detail: str) -> None:
    run = decide(facts(line), ["last line"])
    assert run.state is state
    assert run.detail == detail
    assert run.healthy == (state in (RunState.RUNNING, RunState.FINISHED))


def test_a_running_run_carries_pid_and_uptime_and_no_log_tail() -> None:
    run = decide(facts(ALIVE), ["an old line"])
    assert (run.run, run.pid, run.uptime_s, run.procs) == ("r1", "41", "75", 6)
    assert run.log_tail == ()


def test_a_failed_run_carries_its_log_tail() -> None:
    line = "run=r1 wrapper=gone launcher=gone launcher_pid=41 exit=2 procs=0 stopped=0"
    run = decide(facts(line), ["Traceback (most recent call last):", "ValueError: bad"])
    assert run.log_tail == ("Traceback (most recent call last):", "ValueError: bad")
    assert run.to_dict()["log_tail"] == ["Traceback (most recent call last):", "ValueError: bad"]


@pytest.mark.parametrize(
    ("status", "words"),
    [
        ("0", "exit 0"),
        ("3", "exit 3"),
        ("128", "exit 128"),
        ("130", "killed by SIGINT"),
        ("134", "killed by SIGABRT"),
        ("137", "killed by SIGKILL"),
        ("143", "killed by SIGTERM"),
        ("250", "exit 250"),  # 128 + 122 is no signal
        ("none", "exit status unknown"),
        ("", "exit status unknown"),
    ],
)
def test_describe_exit(status: str, words: str) -> None:
    assert describe_exit(status) == words


def _summary(*outcomes: Outcome) -> RunSummary:
    results = tuple(
        HostFinished(host=f"n{i}", outcome=o, duration_s=0.1) for i, o in enumerate(outcomes)
    )
    return RunSummary(run_id="x", playbook="status", results=results, duration_s=0.1)


def test_status_exit_code_is_0_only_when_every_run_is_healthy() -> None:
    running = NodeRun(RunState.RUNNING, run="r1")
    finished = NodeRun(RunState.FINISHED, run="r1")
    ok = _summary(Outcome.OK, Outcome.OK)
    assert status_exit_code(ok, {"n0": running, "n1": finished}) is ExitCode.OK
    for bad in RunState:
        if bad in (RunState.RUNNING, RunState.FINISHED):
            continue
        runs = {"n0": running, "n1": NodeRun(bad, run="r1")}
        assert status_exit_code(ok, runs) is ExitCode.STEP_FAILED, bad
    unreachable = _summary(Outcome.OK, Outcome.UNREACHABLE)
    assert status_exit_code(unreachable, {"n0": running}) is ExitCode.UNREACHABLE


def test_a_host_that_timed_out_after_its_run_step_still_has_its_run_read() -> None:
    """`disk` hung on a stale NFS mount: the node's row said only `timed_out`, its run's state
    (which the first step had answered) dropped. The run step itself timing out: unknown."""
    later, first = (
        HostFinished(host=h, outcome=Outcome.TIMED_OUT, duration_s=30, failed_step=s)
        for h, s in (("n0", "disk"), ("n1", "run"))
    )
    gone = HostFinished(host="n2", outcome=Outcome.UNREACHABLE, duration_s=1)
    ok = HostFinished(host="n3", outcome=Outcome.OK, duration_s=1)
    summary = RunSummary(
        run_id="x", playbook="status", results=(later, first, gone, ok), duration_s=30
    )
    assert answered(summary) == ["n0", "n3"]
