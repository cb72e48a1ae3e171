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
from fleet.core.frame import Noise

# How much node output one event may carry. A line longer than LINE_MAX_BYTES (as received, before
# decoding) is cut there and says so: `... [cut: 18.2 MB more]`. Docker's log drivers split lines
# at the same 16 KiB. Without a cap, one 20 MB line was held several times over (the reader's
# buffer, the event, every tail) and copied into every record file.
LINE_MAX_BYTES = 16 * 1024
# Lines kept after their step ended (stdout/stderr tails, a host's last line, the summary's stderr
# tail) are cut shorter: they live until the run ends, one set per host.
TAIL_LINE_MAX_BYTES = 1024
CUT_MARK = " ... [cut: "


def size_text(count: int) -> str:
    """A byte count for people: 512 bytes, 16.4 kB, 18.2 MB, 1.1 GB (powers of 1000, like df -H)."""
    if count < 1000:
        return f"{count} byte{'' if count == 1 else 's'}"
    value = float(count)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        if value < 999.95 or unit == "TB":
            break
    return f"{value:.1f} {unit}"


def cut_note(more_bytes: int) -> str:
    """What a cut line ends with: how much of it was left out."""
    return f"{CUT_MARK}{size_text(more_bytes)} more]"


def char_boundary(raw: bytes, limit: int) -> int:
    """The largest cut point <= limit that does not split a UTF-8 character."""
    if len(raw) <= limit:
        return len(raw)
    cut = limit
    # Step back over continuation bytes (0b10xxxxxx), at most 3: a character has at most 4 bytes.
    while cut > 0 and limit - cut < 3 and raw[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut


def cut_bytes(raw: bytes, limit: int, more: int = 0) -> str:
    """Decode `raw` (of which `more` further bytes were already dropped), cut to `limit` bytes on a
    character boundary; a cut line ends with a note saying how many bytes it lost."""
    cut = char_boundary(raw, limit)
    more += len(raw) - cut
    text = raw[:cut].decode("utf-8", "replace")
    return text + cut_note(more) if more else text


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


@dataclass(frozen=True)
class CleanupDone:
    """What `op: cleanup` did on one node (fleet/node/cleanup.py), as numbers: the same as the
    node's last output line says in words. Only fleet's own words and numbers, never node text, so
    it may go where output does not (summary.json, events.jsonl)."""

    killed: int = 0  # processes this cleanup ended, port holders and GPU holders included
    by_term: int = 0  # of them, ended by TERM within the grace period
    by_kill: int = 0  # ended by KILL after it
    removed: int = 0  # state paths removed
    remove_failed: int = 0  # state paths rm could not remove
    port_freed: int | None = None  # the port, when this cleanup freed it by ending its holders
    port_holders: tuple[int, ...] = ()  # their pids
    gpu_reset: bool = False  # nvidia-smi --gpu-reset ran and succeeded
    gpus: int | None = None  # how many GPUs it said it reset (None: it did not say)
    clean: bool = False  # nothing left behind, no part failed
    failed: tuple[str, ...] = ()  # the parts that failed: kill, state, port, gpu-reset, facts
    refused: bool = False  # the node was left alone (see its last line)


@dataclass(frozen=True)
class CommandResult:
    """What one remote command did."""

    exit_code: int | None
    stdout_tail: tuple[str, ...] = ()
    stderr_tail: tuple[str, ...] = ()
    duration_s: float = 0.0
    timed_out: bool = False
    cancelled: bool = False
    signal: str | None = None  # the signal it died of ("KILL"), when sshd said so (exit-signal)
    core_dumped: bool = False
    stop_failed: str | None = None  # a cancelled or timed-out command that may still run: why
    done: CleanupDone | None = None  # an `op: cleanup` step's account of what it did
    # Its output was not framed from start to end (fleet/core/frame.py): why, and it failed.
    broken: str | None = None
    noise: Noise = field(default_factory=Noise)  # what the login shell printed around it


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
    stream: str  # "stdout" or "stderr"
    text: str


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
