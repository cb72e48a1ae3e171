"""What happens during a run, as frozen values. Workers emit them; reporters and the run record
consume them on the main thread. Each has `to_dict()` for JSON lines."""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.core import nodeset
from fleet.core.errors import ExitCode
from fleet.core.result import CleanupDone


class Outcome(enum.StrEnum):
    """How a host's run ended."""

    OK = "ok"
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    TIMED_OUT = "timed_out"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class State(enum.StrEnum):
    """A host's state while the run is in flight (the live table's column)."""

    PENDING = "pending"
    CONNECTING = "connecting"
    RUNNING = "running"


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of all events: the wall-clock time it happened."""

    ts: float = field(default_factory=time.time)

    @property
    def kind(self) -> str:
        """The event's name, as JSON consumers see it (`StepFinished`)."""
        return type(self).__name__

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: {"event": "StepFinished", "ts": ..., ...}."""
        # vars() rather than dataclasses.fields(): this runs for every event of every host (the
        # run record writes them all), and field introspection showed up in the profile.
        out: dict[str, Any] = {"event": self.kind}
        for name, value in vars(self).items():
            out[name] = value if isinstance(value, (str, int, float, type(None))) else _plain(value)
        return out


def _is_scalar(value: Any) -> bool:
    return type(value) in (str, int, float, bool, type(None))


def _plain(value: Any) -> Any:
    """Enums to their values, tuples to lists, dataclasses to dicts."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # vars(), not dataclasses.fields(): the same names in the same order for these plain
        # dataclasses, at a fraction of the cost (a RunFinished of 1,000 hosts is turned into
        # a dict three times: the JSON line, events.jsonl, summary.json).
        attrs = getattr(value, "__dict__", None)
        if attrs is None:  # a slotted dataclass
            attrs = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {k: v if _is_scalar(v) else _plain(v) for k, v in attrs.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class RunStarted(Event):
    run_id: str
    playbook: str
    hosts: tuple[str, ...]
    forks: int
    run_dir: str | None


@dataclass(frozen=True, kw_only=True)
class HostConnecting(Event):
    host: str
    attempt: int


@dataclass(frozen=True, kw_only=True)
class HostConnected(Event):
    host: str
    duration_s: float
    # Warm connections (--persist): "warm" reused, "fresh" made now, "stale" made now because
    # the held one had died or was no longer trusted; None when connections are not kept.
    connection: str | None = None
    # The SSH library the connection was made with: "libssh2" (fleet/ssh/native.py) or
    # "paramiko"; None when it is not known here (a warm connection is the keeper's).
    ssh: str | None = None


@dataclass(frozen=True, kw_only=True)
class StepStarted(Event):
    host: str
    step: str
    index: int
    command: str


@dataclass(frozen=True, kw_only=True)
class OutputLine(Event):
    host: str
    step: str
    stream: str  # "stdout" or "stderr"
    line: str


@dataclass(frozen=True, kw_only=True)
class ShellNoiseIgnored(Event):
    """The host's login shell printed lines around fleet's command (fleet/core/frame.py), first seen
    in `step`; said once per host and run. `lines`: a few of them, cut; `count`: how many."""

    host: str
    step: str
    lines: tuple[str, ...]
    count: int


@dataclass(frozen=True, kw_only=True)
class LateOutputIgnored(Event):
    """Output came after fleet's command on the host had ended (fleet/core/frame.py): something it
    left running in the background still wrote to it. First seen in `step`; said once per host
    and run, like ShellNoiseIgnored. `lines`: a few of them, cut; `count`: how many."""

    host: str
    step: str
    lines: tuple[str, ...]
    count: int


@dataclass(frozen=True, kw_only=True)
class StepFinished(Event):
    host: str
    step: str
    index: int
    exit_code: int | None
    duration_s: float
    timed_out: bool
    cancelled: bool
    stderr_tail: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class HostFinished(Event):
    host: str
    outcome: Outcome
    duration_s: float
    failed_step: str | None = None
    exit_code: int | None = None
    reason: str | None = None  # why it is not ok: "connection refused", "step timed out after 5s"
    last_line: str | None = None
    stderr_tail: tuple[str, ...] = ()
    done: CleanupDone | None = None  # what its last `op: cleanup` step did, in numbers


@dataclass(frozen=True)
class Line:
    """One line of output: which step printed it, on which stream."""

    step: str
    stream: str  # "stdout" or "stderr"; GAP: fleet's marker of lines left out there
    text: str


GAP = "gap"  # a gathered Line's stream when it stands for lines not shown (fleet.output.gather)


@dataclass(frozen=True)
class OutputGroup:
    """Hosts whose whole output was the same, and that output, cut (fleet.output.gather)."""

    hosts: tuple[str, ...]
    lines: tuple[Line, ...]
    more_lines: int = 0  # lines printed beyond what is kept

    @property
    def folded(self) -> str:
        return nodeset.fold(self.hosts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "hosts": self.folded,
            "count": len(self.hosts),
            "lines": [{"step": ln.step, "stream": ln.stream, "text": ln.text} for ln in self.lines],
            "more_lines": self.more_lines,
        }


@dataclass(frozen=True)
class RunSummary:
    """Every host's final event, and the exit code they add up to."""

    run_id: str
    playbook: str
    results: tuple[HostFinished, ...]
    duration_s: float
    interrupted: bool = False
    run_dir: str | None = None
    # What the hosts printed, identical outputs grouped (fleet/output/gather.py), and who printed
    # nothing.
    output: tuple[OutputGroup, ...] = ()
    silent: tuple[str, ...] = ()

    def hosts_with(self, *outcomes: Outcome) -> list[str]:
        """Names of the hosts that ended in any of `outcomes`."""
        return [r.host for r in self.results if r.outcome in outcomes]

    @property
    def succeeded(self) -> list[str]:
        return self.hosts_with(Outcome.OK)

    @property
    def failed(self) -> list[str]:
        return [r.host for r in self.results if r.outcome not in (Outcome.OK, Outcome.SKIPPED)]

    @property
    def exit_code(self) -> ExitCode:
        """130 interrupted; 4 if any unreachable or timed out; 3 if any step failed; else 0."""
        if self.interrupted:
            return ExitCode.INTERRUPTED
        outcomes = {r.outcome for r in self.results}
        if outcomes & {Outcome.UNREACHABLE, Outcome.TIMED_OUT}:
            return ExitCode.UNREACHABLE
        if outcomes & {Outcome.FAILED, Outcome.CANCELLED}:
            return ExitCode.STEP_FAILED
        return ExitCode.OK

    def counts(self) -> dict[str, int]:
        """How many hosts ended in each outcome."""
        out: dict[str, int] = {}
        for r in self.results:
            out[r.outcome.value] = out.get(r.outcome.value, 0) + 1
        return out


@dataclass(frozen=True, kw_only=True)
class RunFinished(Event):
    summary: RunSummary

    def to_dict(self) -> dict[str, Any]:
        """The final JSON line: counts, exit code and every host's outcome."""
        s = self.summary
        return {
            "event": self.kind,
            "ts": self.ts,
            "run_id": s.run_id,
            "playbook": s.playbook,
            "exit_code": int(s.exit_code),
            "duration_s": round(s.duration_s, 3),
            "interrupted": s.interrupted,
            "run_dir": s.run_dir,
            "counts": s.counts(),
            "hosts": {r.host: _plain(r) for r in s.results},
            "output": [g.to_dict() for g in s.output],
            "no_output": nodeset.fold(s.silent) if s.silent else "",
        }


def by_host(results: Sequence[HostFinished]) -> dict[str, HostFinished]:
    """Index final results by host name."""
    return {r.host: r for r in results}


@dataclass(frozen=True, kw_only=True)
class VerbFinished(Event):
    """The last JSON line of a verb (`--json`): the exit code fleet exits with, and each run it
    chained. A verb is one or more runs (launch: preflight, start, roll back) and may judge
    their results itself (status: a node whose training failed), so the last RunFinished's
    exit code is not fleet's; scripts read this line instead."""

    verb: str
    exit_code: ExitCode
    runs: tuple[RunSummary, ...] = ()
    error: str | None = None  # the error that stopped the verb between runs (exit 1 or 2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.kind,
            "ts": self.ts,
            "verb": self.verb,
            "exit_code": int(self.exit_code),
            "error": self.error,
            "runs": [
                {
                    "run_id": s.run_id,
                    "playbook": s.playbook,
                    "exit_code": int(s.exit_code),
                    "interrupted": s.interrupted,
                    "counts": s.counts(),
                }
                for s in self.runs
            ],
        }
