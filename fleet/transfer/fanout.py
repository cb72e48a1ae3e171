"""`fleet push` and `fleet pull` on every selected host: a bounded pool of workers, one host
each at a time, on fleet's SSH transport; workers emit events, the main thread reports them.

A host's failure is its result (HostFinished), never an exception that stops the others. The
exit code is fleet's usual one: 0 all ok, 3 a file failed on some host, 4 a host unreachable,
130 interrupted.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.core.events import (
    Event,
    HostConnected,
    HostConnecting,
    HostFinished,
    Outcome,
    OutputLine,
    RunFinished,
    RunStarted,
    RunSummary,
    VerbFinished,
)
from fleet.core.flushing import Flusher
from fleet.core.hosts import Host
from fleet.core.result import size_text
from fleet.engine.runner import RunSettings, Secrets, make_transport, malloc_trim
from fleet.output.aside import aside
from fleet.output.settings import OutputSettings
from fleet.ssh.failure import ConnectFailed
from fleet.transfer import files, paths, pipe
from fleet.transfer.channel import Cancelled
from fleet.transfer.events import FileMoved, TransferPlanned, TransferProgress
from fleet.transfer.ratelimit import Bucket, Limiter

PROGRESS_EVERY_S = 0.5
WINDOW_BUDGET_BYTES = 32 * 1024 * 1024  # all channel windows together
WINDOW_MIN_BYTES = 256 * 1024
CANCEL_WAIT_S = 10.0
Handler = Any


@dataclass(frozen=True)
class Request:
    """One push or pull, as the command line gave it."""

    verb: str  # "push" | "pull"
    local: Path  # push: LOCAL (file or tree); pull: LOCALDIR
    remote: str
    per_node_bps: float | None = None
    total_bps: float | None = None


def window_bytes(concurrent: int) -> int:
    """Each channel's window: the budget shared by the hosts moving at once (bounded memory)."""
    share = WINDOW_BUDGET_BYTES // max(1, concurrent)
    return max(WINDOW_MIN_BYTES, min(files.WINDOW_BYTES, share))


def push_target(local: Path, remote: str) -> str:
    """REMOTE as the destination path; `DIR/` means DIR/<name of LOCAL> (LOCAL `.`: DIR
    itself). A LOCAL ending in `..` is named by the directory it is (its absolute path's last
    component), never `..`, which would put its files beside DIR instead of in it."""
    if not remote.endswith("/"):
        return remote
    name = Path(os.path.abspath(local)).name if local.name == ".." else local.name
    return remote + name


class Meter:
    """Bytes moved on one host; turns them into TransferProgress events, rate limited."""

    def __init__(self, host: str, emit: Callable[[Event], None]) -> None:
        self.host = host
        self.emit = emit
        self.total = 0
        self.done = 0
        self.started = time.monotonic()
        self.last = 0.0
        self.lock = threading.Lock()  # a host's files move a few at once (files.in_flight)

    def add(self, count: int) -> None:
        with self.lock:
            self.done += count
            now = time.monotonic()
            if now - self.last < PROGRESS_EVERY_S:
                return
            self.last = now
        self.report(now)

    def report(self, now: float | None = None) -> None:
        now = now or time.monotonic()
        rate = self.done / max(now - self.started, 1e-6)
        left = max(0, self.total - self.done)
        eta = left / rate if rate > 0 else None
        self.emit(
            TransferProgress(
                host=self.host,
                done_bytes=self.done,
                total_bytes=self.total,
                rate_bps=rate,
                eta_s=eta,
            )
        )


class Fanout:
    """The workers of one push or pull."""

    def __init__(
        self,
        request: Request,
        run: RunSettings,
        hosts: Sequence[Host],
        transport: Any,
        *,
        dry_run: bool = False,
    ) -> None:
        self.request = request
        self.run = run
        self.dry_run = dry_run
        self.hosts = list(hosts)
        self.transport = transport
        self.events: queue.Queue[Event] = queue.Queue()
        self.cancel = threading.Event()
        self.results: dict[str, HostFinished] = {}
        self.total = Bucket(request.total_bps) if request.total_bps else None
        concurrent = min(run.forks, len(self.hosts))
        self.window = window_bytes(concurrent)
        self.local_tree = files.walk_local(request.local) if request.verb == "push" else None

    def start(self) -> list[threading.Thread]:
        work: queue.Queue[Host] = queue.Queue()
        for host in self.hosts:
            work.put(host)
        count = max(1, min(self.run.forks, len(self.hosts)))
        threads = [
            threading.Thread(target=self._worker, args=(work,), name=f"fleet-xfer-{i}", daemon=True)
            for i in range(count)
        ]
        for t in threads:
            t.start()
        return threads

    def _worker(self, work: queue.Queue[Host]) -> None:
        while True:
            try:
                host = work.get_nowait()
            except queue.Empty:
                return
            started = time.monotonic()
            try:
                finished = self._host(host, started)
            except Exception as exc:  # a bug must not hide the other hosts
                finished = HostFinished(
                    host=host.name,
                    outcome=Outcome.FAILED,
                    duration_s=time.monotonic() - started,
                    reason=f"internal error: {type(exc).__name__}: {exc}",
                )
            self.events.put(finished)

    def _host(self, host: Host, started: float) -> HostFinished:
        name = host.name
        if self.cancel.is_set():
            return HostFinished(host=name, outcome=Outcome.CANCELLED, duration_s=0.0)
        try:
            session = self.transport.connect(
                host, on_attempt=lambda n: self.events.put(HostConnecting(host=name, attempt=n))
            )
        except ConnectFailed as exc:
            return HostFinished(
                host=name,
                outcome=Outcome.UNREACHABLE,
                duration_s=time.monotonic() - started,
                reason=exc.reason,
                last_line=exc.detail or None,
            )
        self.events.put(HostConnected(host=name, duration_s=time.monotonic() - started))
        try:
            return self._move(host, session, started)
        except ConnectFailed as exc:
            return HostFinished(
                host=name,
                outcome=Outcome.UNREACHABLE,
                duration_s=time.monotonic() - started,
                reason=exc.reason,
                last_line=exc.detail or None,
            )
        except Cancelled:
            return HostFinished(
                host=name,
                outcome=Outcome.CANCELLED,
                duration_s=time.monotonic() - started,
                failed_step=self.request.verb,
                reason="cancelled; part files kept for the next run to resume",
            )
        finally:
            session.close()

    def _limiter(self) -> Limiter:
        buckets = [Bucket(self.request.per_node_bps)] if self.request.per_node_bps else []
        if self.total is not None:
            buckets.append(self.total)
        return Limiter(buckets, self.cancel)

    def _move(self, host: Host, session: Any, started: float) -> HostFinished:
        """Prove the `ssh` route first (a dry run moves nothing: paramiko lists and hashes),
        then move every file; the route's pinned known_hosts goes with it."""
        route, via = (None, "paramiko") if self.dry_run else pipe.open_route(session, self.cancel)
        try:
            return self._move_via(host, session, started, route, via)
        finally:
            if route is not None:
                route.close()

    def _move_via(
        self, host: Host, session: Any, started: float, route: Any, via: str
    ) -> HostFinished:
        meter = Meter(host.name, self.events.put)
        options = files.Options(
            limiter=self._limiter(),
            cancel=self.cancel,
            window_bytes=self.window,
            dry_run=self.dry_run,
            on_bytes=meter.add,
            route=route,
        )
        if self.request.verb == "pull":
            results = self._pull(host, session, options, meter, via)
        else:
            results = self._push(host, session, options, meter, via)
        tally: dict[str, int] = {}
        failed: list[files.FileResult] = []
        for result in results:
            tally[result.action.value] = tally.get(result.action.value, 0) + 1
            if result.action is files.Action.FAILED:
                failed.append(result)
            self._file_event(host.name, result, options.via_for(result.size))
        if self.cancel.is_set():
            raise Cancelled
        meter.report()
        words = ", ".join(f"{n} {action}" for action, n in sorted(tally.items())) or "no files"
        took = time.monotonic() - started
        line = f"{words}; {size_text(meter.done)} moved in {took:.1f}s via {via}"
        if failed:
            first = failed[0]
            return HostFinished(
                host=host.name,
                outcome=Outcome.FAILED,
                duration_s=time.monotonic() - started,
                failed_step=self.request.verb,
                reason=f"{len(failed)} file(s) failed: {first.rel}: {first.error}",
                last_line=line,
                stderr_tail=tuple(f"{r.rel}: {r.error}" for r in failed[:5]),
            )
        return HostFinished(
            host=host.name,
            outcome=Outcome.OK,
            duration_s=time.monotonic() - started,
            last_line=line,
        )

    def _pull(
        self, host: Host, session: Any, options: files.Options, meter: Meter, via: str
    ) -> list[files.FileResult] | Any:
        dest = self.request.local / paths.check_host_dir(host.name)
        try:
            plan = files.plan_pull(files.list_remote(session, self.request.remote, self.cancel))
        except files.TransferError as exc:
            return [files.FileResult(self.request.remote, files.Action.FAILED, error=str(exc))]
        meter.total = plan.total_bytes
        self.events.put(
            TransferPlanned(
                host=host.name, files=len(plan.files), total_bytes=plan.total_bytes, via=via
            )
        )
        return files.pull_tree(session, self.request.remote, dest, options, plan)

    def _push(
        self, host: Host, session: Any, options: files.Options, meter: Meter, via: str
    ) -> list[files.FileResult] | Any:
        tree = self.local_tree
        assert tree is not None
        meter.total = tree.total_bytes
        self.events.put(
            TransferPlanned(host=host.name, files=len(tree.files), total_bytes=meter.total, via=via)
        )
        target = push_target(self.request.local, self.request.remote)
        return files.push_tree(session, tree, target, options)

    def _file_event(self, host: str, result: files.FileResult, via: str) -> None:
        self.events.put(
            FileMoved(
                host=host,
                path=result.rel,
                action=result.action.value,
                size=result.size,
                moved_bytes=result.moved_bytes,
                sha256=result.sha256,
                error=result.error,
                via=via,
            )
        )
        bad = result.action in (files.Action.FAILED, files.Action.REFUSED)
        text = f"{result.action.value} {result.rel} ({size_text(result.size)})"
        self.events.put(
            OutputLine(
                host=host,
                step=self.request.verb,
                stream="stderr" if bad else "stdout",
                line=text + (f": {result.error}" if result.error else ""),
            )
        )

    def summary(
        self, record_id: str, started: float, interrupted: bool, run_dir: str
    ) -> RunSummary:
        ordered = [
            self.results.get(h.name)
            or HostFinished(
                host=h.name, outcome=Outcome.CANCELLED, duration_s=0.0, reason="run interrupted"
            )
            for h in self.hosts
        ]
        return RunSummary(
            run_id=record_id,
            playbook=self.request.verb,
            results=tuple(ordered),
            duration_s=time.monotonic() - started,
            interrupted=interrupted,
            run_dir=run_dir,
        )

    def drain(
        self,
        threads: list[threading.Thread],
        deadline: float | None = None,
        wait_s: Callable[[float], float] | None = None,
    ) -> Any:
        """Events until every host finished (its HostFinished is its worker's last event for
        it) or every worker ended; no poll interval is waited out after the last one.
        `wait_s`: how long to wait for an event instead of 0.1 s (fleet/core/flushing.py)."""
        while len(self.results) < len(self.hosts):
            if deadline is not None and time.monotonic() > deadline:
                return
            try:
                event = self.events.get(timeout=0.1 if wait_s is None else wait_s(0.1))
            except queue.Empty:
                if not any(t.is_alive() for t in threads) and self.events.empty():
                    return
                continue
            if isinstance(event, HostFinished):
                self.results[event.host] = event
            yield event


class HeapTrim:
    """Hands freed heap back to the OS once a second while bytes move. Received chunks are
    allocated by paramiko's transport threads and freed by the workers, one glibc arena each:
    without this, 64 hosts at once held ~240 MiB of freed chunks (runner.HeapTrim, by time)."""

    def __init__(self) -> None:
        self.last = 0.0
        self._trim = malloc_trim()

    def handle(self, event: Event) -> None:
        if self._trim is not None and isinstance(event, TransferProgress):
            now = time.monotonic()
            if now - self.last >= 1.0:
                self.last = now
                self._trim(0)

    def close(self) -> None:
        return None


def reporters(out: OutputSettings, count: int) -> list[Handler]:
    """Live table with bytes, rate and time left on a terminal; plain lines off one; JSON."""
    from fleet.output.printer import off_terminal

    plain = off_terminal(out, summary=True, output="last")
    if plain is not None:
        return plain
    from fleet.output.console import Console
    from fleet.transfer.live import TransferLiveReporter

    console = Console(highlight=False)
    return [TransferLiveReporter(console, step_count=1, summary=True, output="last")]


def run(
    request: Request,
    settings: RunSettings,
    hosts: Sequence[Host],
    secrets: Secrets | None,
    *,
    dry_run: bool = False,
) -> RunSummary:
    """Move the files on every host; Ctrl-C (or SIGTERM) cancels once (part files are kept, so
    a rerun resumes), twice exits at once."""
    from fleet.records import runlog

    transport = make_transport(settings.ssh, secrets, hosts)
    recording = settings.record
    record = runlog.RunRecord(
        recording.base(),
        runlog.new_record_id(request.verb),
        verb=recording.verb,
        invocation=recording.invocation,
    )
    fan = Fanout(request, settings, hosts, transport, dry_run=dry_run)
    handlers: list[Handler] = [record, *reporters(settings.output, len(hosts)), HeapTrim()]
    flusher = Flusher(handlers)  # the record's and reporters' lines, written together

    def dispatch(event: Event) -> None:
        for h in handlers:
            h.handle(event)
        flusher.handled()

    started = time.monotonic()
    dispatch(
        RunStarted(
            run_id=record.record_id,
            playbook=request.verb,
            hosts=tuple(h.name for h in hosts),
            forks=settings.forks,
            run_dir=str(record.dir),
        )
    )
    previous = signal.signal(signal.SIGTERM, _as_interrupt)
    interrupted = False
    try:
        threads = fan.start()
        try:
            for event in fan.drain(threads, wait_s=flusher.wait_s):
                dispatch(event)
        except KeyboardInterrupt:
            interrupted = True
            fan.cancel.set()
            with aside(handlers):  # above the live table, which would erase it
                print("\nfleet: cancelling: part files are kept; rerun to resume", file=sys.stderr)
            cancel_by = time.monotonic() + CANCEL_WAIT_S
            for event in fan.drain(threads, deadline=cancel_by, wait_s=flusher.wait_s):
                dispatch(event)
        summary = fan.summary(record.record_id, started, interrupted, str(record.dir))
        dispatch(RunFinished(summary=summary))
        if settings.output.json:  # the verb's last line, as fleet.ops.jobs writes it
            done = VerbFinished(verb=recording.verb, exit_code=summary.exit_code, runs=(summary,))
            for h in handlers[1:-1]:
                h.handle(done)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for h in handlers:
            h.close()
        transport.close()
    return summary


def _as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
