"""What a node's launched run is doing, decided from the facts `launch.sh status` prints.

The node reports facts only (is the wrapper alive, the launcher, how many other processes carry the
run's marker, the launcher's exit status, whether fleet stopped it); the state is decided here, so
every rule is a pure function with unit tests.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fleet.core.digits import is_digits


class RunState(enum.StrEnum):
    """A node's launched run, as `fleet status` reports it."""

    RUNNING = "running"  # the launcher is alive
    FINISHED = "finished"  # the launcher exited 0 and nothing of the run is left
    FAILED = "failed"  # it exited non-zero, by a signal, or was lost without an exit status
    ORPHANED = "orphaned"  # the launcher is gone but processes of the run still run
    STOPPED = "stopped"  # `fleet stop` ended it
    NOT_STARTED = "not started"  # no run was ever launched on this node
    UNKNOWN = "unknown"  # the node gave no facts (its status step failed)


HEALTHY = frozenset({RunState.RUNNING, RunState.FINISHED})


@dataclass(frozen=True)
class NodeRun:
    """One node's run: its state, and what an operator needs to act on it."""

    state: RunState
    run: str = ""
    detail: str = ""  # "exit 1", "killed by SIGKILL", "launcher killed by SIGKILL; 3 left", ...
    pid: str = ""  # the launcher's pid while it runs
    uptime_s: str = ""
    procs: int = 0  # processes of the run besides its wrapper and launcher
    log_tail: tuple[str, ...] = ()  # the log's last lines, once the launcher is gone

    @property
    def healthy(self) -> bool:
        return self.state in HEALTHY

    def to_dict(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "run": self.run or None,
            "detail": self.detail,
            "pid": self.pid or None,
            "processes": self.procs,
            "log_tail": list(self.log_tail),
        }


def describe_exit(status: str) -> str:
    """A shell exit status as words: "0" -> "exit 0", "137" -> "killed by SIGKILL"."""
    if not is_digits(status):
        return "exit status unknown"
    code = int(status)
    if code > 128:
        try:
            return f"killed by {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"exit {code}"


def decide(facts: Mapping[str, str], log_tail: Sequence[str] = (), said: str = "") -> NodeRun:
    """The run's state from one node's facts (`run=... launcher=... exit=... procs=...`);
    `said`, the step's last line, is why when it gave none (`launch.sh: refused: ...`)."""
    run = facts.get("run", "")
    if not run:
        why = f": {said[:200]}" if said.strip() else ""
        return NodeRun(RunState.UNKNOWN, detail=f"no facts from the node{why}")
    if run == "none":
        return NodeRun(RunState.NOT_STARTED)
    try:
        procs = int(facts.get("procs", "0"))
    except ValueError:
        procs = 0
    exit_status = facts.get("exit", "none")
    base = NodeRun(RunState.FAILED, run=run, procs=procs, log_tail=tuple(log_tail))
    if facts.get("container") == "gone":
        return replace(base, detail="its container is gone or not running")
    launcher = facts.get("launcher")
    if launcher == "alive" or (launcher == "none" and facts.get("wrapper") == "alive"):
        pid, uptime = facts.get("launcher_pid", ""), facts.get("uptime_s", "")
        return replace(base, state=RunState.RUNNING, pid=pid, uptime_s=uptime, log_tail=())
    if procs > 0:
        how = describe_exit(exit_status) if exit_status != "none" else "gone"
        detail = f"launcher {how}; {procs} of its processes still running"
        return replace(base, state=RunState.ORPHANED, detail=detail)
    if facts.get("stopped") == "1":
        return replace(base, state=RunState.STOPPED, detail="stopped by fleet stop")
    if exit_status == "0":
        return replace(base, state=RunState.FINISHED, detail="exit 0")
    return replace(base, detail=describe_exit(exit_status))
