"""Run a Plan: a bounded pool of worker threads, one host at a time each, emitting events.

Workers never print: they put events on a queue that the main thread drains into reporters.
A host's failure is a result (HostFinished), never an exception that hides the others.
"""

from __future__ import annotations

import dataclasses
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from fleet.core import defaults
from fleet.core.events import (
    Event,
    HostConnected,
    HostConnecting,
    HostFinished,
    LateOutputIgnored,
    Outcome,
    OutputLine,
    RunSummary,
    ShellNoiseIgnored,
    StepFinished,
    StepStarted,
)
from fleet.core.hosts import Host
from fleet.core.playbook import OnError
from fleet.core.redact import Redactor
from fleet.core.result import CleanupDone, CommandResult
from fleet.core.shell import Cmd
from fleet.engine.plan import HostPlan, Plan

# Node output queued for the main thread, at most (bytes of text plus an event's own overhead).
# Workers wait while it is spent: a node that floods is slowed down to what the reporters and the
# run record can take (its SSH channel's window fills and the node's writes block), instead of
# the queue growing with the node's output (`yes | head -c 10M` would hold about 1 GB).
OUTPUT_IN_FLIGHT_BYTES = 8 * 1024 * 1024
EVENT_OVERHEAD_BYTES = 400  # an OutputLine's object, dict and timestamp


class OutputBudget:
    """Bytes of output in flight between workers and the main thread (backpressure).

    `take` (workers) blocks while the budget is spent; a single line always fits when nothing is
    queued. `give` (the main thread only) returns bytes as events leave the queue, in batches of
    at most an eighth of the budget: one lock per batch rather than per line, and a batch held
    back never keeps a worker waiting once the queue is empty.
    """

    def __init__(self, limit: int = OUTPUT_IN_FLIGHT_BYTES) -> None:
        self.limit = limit
        self.used = 0
        self._batch = max(1, min(256 * 1024, limit // 8))
        self._pending = 0  # given back by the main thread, not yet returned to `used`
        self._cond = threading.Condition(threading.Lock())

    def take(self, size: int) -> None:
        with self._cond:
            while self.used and self.used + size > self.limit:
                self._cond.wait()
            self.used += size

    def give(self, size: int) -> None:
        self._pending += size
        if self._pending >= self._batch:
            self.flush()

    def flush(self) -> None:
        """Return what was given; wake the waiting workers once half the budget is free."""
        with self._cond:
            self.used -= self._pending
            self._pending = 0
            if self.used <= self.limit // 2:
                self._cond.notify_all()


def output_cost(event: OutputLine) -> int:
    """What one output event counts against the budget."""
    return len(event.line) + EVENT_OVERHEAD_BYTES


class Session(Protocol):
    """A connected host (SSHSession in production)."""

    def run(
        self,
        cmd: Cmd,
        on_line: Callable[[str, str], None],
        cancel: threading.Event,
        sudo_password: str | None = None,
    ) -> CommandResult: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """Something that connects to hosts (SSHTransport in production)."""

    def connect(self, host: Host, on_attempt: Callable[[int], None] | None = None) -> Session: ...

    def close(self) -> None: ...


@dataclass
class Run:
    """A run in flight: the plan, the event queue and the cancel switch."""

    plan: Plan
    transport: Transport
    forks: int = defaults.FORKS
    sudo_password: str | None = field(default=None, repr=False)
    connect_errors: tuple[type[BaseException], ...] = ()
    # SimpleQueue: every event of every host passes here, and queue.Queue's get with a timeout
    # (a Condition, a new lock per wait) cost the main thread ~20 us an event.
    events: queue.SimpleQueue[Event | None] = field(default_factory=queue.SimpleQueue)
    cancel: threading.Event = field(default_factory=threading.Event)
    results: dict[str, HostFinished] = field(default_factory=dict)
    # Environment variables whose values are shown (FLEET_RECORD_ENV); all others are redacted.
    show_env: frozenset[str] = frozenset()
    budget: OutputBudget = field(default_factory=OutputBudget)
    # Worker threads that have said they ended (each puts a None last): when all have, drain
    # returns at once instead of noticing on its next poll (0.1 s on every run's end).
    ended: int = 0

    def start(self) -> list[threading.Thread]:
        """Start min(forks, hosts) daemon workers pulling hosts from a shared queue."""
        work: queue.SimpleQueue[HostPlan] = queue.SimpleQueue()
        for hp in self.plan.hosts:
            work.put(hp)
        count = max(1, min(self.forks, len(self.plan.hosts)))
        threads = [
            threading.Thread(
                target=self._worker, args=(work,), name=f"fleet-worker-{i}", daemon=True
            )
            for i in range(count)
        ]
        for t in threads:
            t.start()
        return threads

    def drain(
        self,
        threads: list[threading.Thread],
        poll_s: float = 0.1,
        deadline: float | None = None,
        deadline_of: Callable[[], float | None] | None = None,
        wait_s: Callable[[float], float] | None = None,
    ) -> Iterator[Event]:
        """Yield events until every worker has finished, or until `deadline` (monotonic) passes
        even while no event arrives (the caller handles Ctrl-C around this); `deadline_of`:
        a deadline that may appear later (a worker process's, once it is cancelled); `wait_s`:
        how long to wait for an event instead of `poll_s` (fleet/core/flushing.py), asked only
        when none is waiting."""
        while True:
            if deadline_of is not None:
                deadline = deadline_of()
            if deadline is not None and time.monotonic() > deadline:
                return
            try:
                if wait_s is None:
                    event = self.events.get(timeout=poll_s)
                else:
                    try:
                        event = self.events.get(block=False)
                    except queue.Empty:
                        event = self.events.get(timeout=wait_s(poll_s))
            except queue.Empty:
                self.budget.flush()
                if not any(t.is_alive() for t in threads) and self.events.empty():
                    return
                continue
            if event is None:
                self.ended += 1
                if self.ended >= len(threads) and self.events.empty():
                    self.budget.flush()
                    return
                continue
            if isinstance(event, OutputLine):
                self.budget.give(output_cost(event))
            if event is not None:
                if isinstance(event, HostFinished):
                    self.results[event.host] = event
                yield event

    def summary(
        self, record_id: str, started: float, interrupted: bool, run_dir: str | None
    ) -> RunSummary:
        """Final results in plan order; hosts never reached (interrupted) count as cancelled."""
        return summarize(self.plan, self.results, record_id, started, interrupted, run_dir)

    def _emit(self, event: Event) -> None:
        self.events.put(event)

    def _line_emitter(self, host: str, step: str, redact: Redactor) -> Callable[[str, str], None]:
        """The session's on_line for one step: each line redacted, then queued within the budget
        (blocking this worker while the main thread catches up)."""

        def on_line(stream: str, line: str) -> None:
            event = OutputLine(host=host, step=step, stream=stream, line=redact(line))
            self.budget.take(output_cost(event))
            self.events.put(event)

        return on_line

    def _worker(self, work: queue.SimpleQueue[HostPlan]) -> None:
        try:
            self._take_hosts(work)
        finally:
            self.events.put(None)  # this thread's last word: drain counts them

    def _take_hosts(self, work: queue.SimpleQueue[HostPlan]) -> None:
        while True:
            try:
                hp = work.get_nowait()
            except queue.Empty:
                return
            try:
                self._emit(self._run_host(hp))
            except Exception as exc:
                self._emit(
                    HostFinished(
                        host=hp.host.name,
                        outcome=Outcome.FAILED,
                        duration_s=0.0,
                        reason=f"internal error: {type(exc).__name__}: {exc}",
                    )
                )

    def _run_host(self, hp: HostPlan) -> HostFinished:
        """Connect, run each step in order, stop at the first failure unless on_error: continue."""
        name = hp.host.name
        started = time.monotonic()
        if self.cancel.is_set():
            return HostFinished(
                host=name,
                outcome=Outcome.CANCELLED,
                duration_s=0.0,
                reason="cancelled before start",
            )
        try:
            session = self.transport.connect(
                hp.host, on_attempt=lambda n: self._emit(HostConnecting(host=name, attempt=n))
            )
        except self.connect_errors as exc:
            return HostFinished(
                host=name,
                outcome=Outcome.UNREACHABLE,
                duration_s=time.monotonic() - started,
                reason=str(getattr(exc, "reason", exc)),
                last_line=str(getattr(exc, "detail", "")) or None,
            )
        self._emit(self._connected(name, session, started))
        try:
            return self._run_steps(hp, session, started, Redactor(hp.env, self.show_env))
        finally:
            session.close()

    @staticmethod
    def _connected(name: str, session: Session, started: float) -> HostConnected:
        """How the host's connection was had (warm connections say; fleet/ssh/warm.py), and
        with which SSH library."""
        return HostConnected(
            host=name,
            duration_s=time.monotonic() - started,
            connection=getattr(session, "connection", None),
            ssh=getattr(session, "engine", None),
        )

    def _made_again(
        self, name: str, session: Session, started: float, said: str | None
    ) -> str | None:
        """A warm connection found dead at a step's start is made again under it (nothing had
        run: fleet/ssh/keeper.py): the record says so with a second HostConnected."""
        now = getattr(session, "connection", None)
        if now != said:
            self._emit(self._connected(name, session, started))
        return now

    def _run_steps(
        self, hp: HostPlan, session: Session, started: float, redact: Redactor
    ) -> HostFinished:
        name = hp.host.name
        first_failure: HostFinished | None = None
        last_line: str | None = None
        done: CleanupDone | None = None  # what its last `op: cleanup` step did
        noise = _NoiseOnce(name, redact, self._emit)
        connection = getattr(session, "connection", None)  # as HostConnected said it
        for index, ps in enumerate(hp.steps):
            if self.cancel.is_set():
                return HostFinished(
                    host=name,
                    outcome=Outcome.CANCELLED,
                    duration_s=time.monotonic() - started,
                    reason=f"cancelled before step '{ps.step.name}'",
                )
            self._emit(
                StepStarted(
                    host=name, step=ps.step.name, index=index, command=redact(ps.cmd.display)
                )
            )
            on_line = self._line_emitter(name, ps.step.name, redact)
            try:
                heard = noise.listener(ps.step.name)
                if ps.op is not None:
                    io = _HostIO(session, on_line, self.cancel, self.sudo_password, heard)
                    result = _redacted(ps.op.run(io), redact)
                else:
                    ran = session.run(ps.cmd, on_line, self.cancel, self.sudo_password)
                    heard(ran)
                    result = _redacted(ran, redact)
            except self.connect_errors as exc:
                return HostFinished(
                    host=name,
                    outcome=Outcome.UNREACHABLE,
                    duration_s=time.monotonic() - started,
                    failed_step=ps.step.name,
                    reason=str(getattr(exc, "reason", exc)),
                    last_line=str(getattr(exc, "detail", "")) or None,
                )
            connection = self._made_again(name, session, started, connection)
            self._emit(
                StepFinished(
                    host=name,
                    step=ps.step.name,
                    index=index,
                    exit_code=result.exit_code,
                    duration_s=result.duration_s,
                    timed_out=result.timed_out,
                    cancelled=result.cancelled,
                    stderr_tail=result.stderr_tail,
                )
            )
            tail = result.stdout_tail or result.stderr_tail
            last_line = tail[-1] if tail else last_line
            done = result.done if result.done is not None else done
            outcome = _step_outcome(result)
            if outcome is Outcome.OK:
                continue
            finished = HostFinished(
                host=name,
                outcome=outcome,
                duration_s=time.monotonic() - started,
                failed_step=ps.step.name,
                exit_code=result.exit_code,
                reason=_reason(result, ps.cmd),
                # The failing step's own line: shown under it, an earlier step's would pass
                # for what this one printed.
                last_line=tail[-1] if tail else None,
                stderr_tail=result.stderr_tail[-5:],
                done=done,
            )
            if outcome is not Outcome.FAILED or ps.step.on_error is OnError.STOP:
                return finished
            first_failure = first_failure or finished
        if first_failure is not None:
            return first_failure
        return HostFinished(
            host=name,
            outcome=Outcome.OK,
            duration_s=time.monotonic() - started,
            last_line=last_line,
            done=done,
        )


def summarize(
    plan: Plan,
    results: dict[str, HostFinished],
    record_id: str,
    started: float,
    interrupted: bool,
    run_dir: str | None,
) -> RunSummary:
    """A run's summary from its hosts' final events, in plan order; a host without one was
    never reached (the run was interrupted) and counts as cancelled."""
    ordered = []
    for hp in plan.hosts:
        name = hp.host.name
        ordered.append(
            results.get(name)
            or HostFinished(
                host=name, outcome=Outcome.CANCELLED, duration_s=0.0, reason="run interrupted"
            )
        )
    return RunSummary(
        run_id=record_id,
        playbook=plan.playbook.name,
        results=tuple(ordered),
        duration_s=time.monotonic() - started,
        interrupted=interrupted,
        run_dir=run_dir,
    )


@dataclass(frozen=True)
class _HostIO:
    """What an op step (fleet/node/ops.py) gets of its host: commands on the host's session
    (one SSH connection, a channel each), and the step's output stream."""

    session: Session
    emit_line: Callable[[str, str], None]
    cancel: threading.Event
    sudo_password: str | None = field(default=None, repr=False)
    heard: Callable[[CommandResult], None] = lambda result: None

    def run(self, cmd: Cmd, on_line: Callable[[str, str], None]) -> CommandResult:
        result = self.session.run(cmd, on_line, self.cancel, self.sudo_password)
        self.heard(result)
        return result

    def emit(self, stream: str, line: str) -> None:
        self.emit_line(stream, line)


class _NoiseOnce:
    """One host's ShellNoiseIgnored: emitted for the first command around which its login shell
    printed anything (it prints the same around every command), redacted like its output; and
    its LateOutputIgnored, for the first command whose background leftovers wrote after it."""

    def __init__(self, host: str, redact: Redactor, emit: Callable[[Event], None]) -> None:
        self.host = host
        self.redact = redact
        self.emit = emit
        self.said: set[type[Event]] = set()

    def listener(self, step: str) -> Callable[[CommandResult], None]:
        """What to call with each result of `step`."""

        def heard(result: CommandResult) -> None:
            noise = result.noise
            for kind, lines, count in (
                (ShellNoiseIgnored, noise.lines, noise.count),
                (LateOutputIgnored, noise.late_lines, noise.late_count),
            ):
                if count and kind not in self.said:
                    self.said.add(kind)
                    shown = tuple(self.redact(line) for line in lines)
                    self.emit(kind(host=self.host, step=step, lines=shown, count=count))

        return heard


def _redacted(result: CommandResult, redact: Redactor) -> CommandResult:
    """The result with its tails redacted (they become the summary's last line and stderr)."""
    if not redact:
        return result
    return dataclasses.replace(
        result,
        stdout_tail=tuple(map(redact, result.stdout_tail)),
        stderr_tail=tuple(map(redact, result.stderr_tail)),
    )


def _step_outcome(result: CommandResult) -> Outcome:
    """A step's result as a host outcome. A command that died of a signal (kill -9, the OOM
    killer, an abort) is a failed step, like any non-zero exit: the node itself answered."""
    if result.cancelled:
        return Outcome.CANCELLED
    if result.timed_out:
        return Outcome.TIMED_OUT
    return Outcome.OK if result.exit_code == 0 else Outcome.FAILED


def _reason(result: CommandResult, cmd: Cmd) -> str:
    """A short phrase for the summary: why this step is not ok. Says when fleet could not stop
    what it was asked to stop, rather than claiming it did."""
    if result.broken:
        return result.broken
    if result.cancelled:
        if result.stop_failed:
            return f"cancelled; the remote command may still run: {result.stop_failed}"
        return "cancelled; remote command stopped"
    if result.timed_out:
        if result.stop_failed:
            return (
                f"step timed out after {cmd.timeout_s:g}s; the remote command may still run: "
                f"{result.stop_failed}"
            )
        return f"step timed out after {cmd.timeout_s:g}s; remote command killed"
    if result.signal:
        core = " (core dumped)" if result.core_dumped else ""
        return f"killed by SIG{result.signal}{core}"
    # sudo's own lines only ("sudo: ..."): the step's program may say such words itself
    said = [line for line in result.stderr_tail if line.startswith("sudo: ")] if cmd.sudo else []
    if any("password is required" in line for line in said):
        return "sudo needs a password (pass -K/--ask-become-pass)"
    if any("incorrect password attempt" in line for line in said):
        return "sudo refused the password given with -K"
    return f"exit code {result.exit_code}{_shell_signal(result.exit_code)}"


def _shell_signal(code: int | None) -> str:
    """A shell reports a command that died of signal N as 128+N: say which one it was."""
    if code is None or not 128 < code < 160:
        return ""
    try:
        name = signal.Signals(code - 128).name
    except ValueError:
        return ""
    return f" (a command it ran died of {name})"
