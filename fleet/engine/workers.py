"""A run's hosts split over worker processes, so that a big run uses every core of the bastion:
one Python process is held to one core by the GIL, and paramiko's key exchange and packet
handling cost milliseconds of CPU per host.

The parent forks W children before any thread of the run starts. Each child gets every W-th host
of the plan (round-robin in plan order) and its share of --forks, runs them with the same
executor as an in-process run (fleet/engine/executor.py's Run, over the transport it inherited:
SSHTransport holds no connection before connect), and writes its events to its own pipe as
frames (fleet/engine/wire.py). The parent reads every pipe and hands the events to the same
handlers as an in-process run: the live table, the gathered output, the run record and the exit
code are the same. A full pipe blocks its child, whose own output budget then blocks its
threads: memory stays bounded however fast the nodes print and however slow the terminal is.

Secrets (the sudo password, a key's passphrase) reach the children in fork memory, never
through a pipe, argv or the environment.

Ctrl-C reaches the whole foreground process group: children ignore SIGINT and cancel when the
parent says so on their control pipe (or when they get SIGTERM, as a scheduler's `timeout`
sends to the group). A child dies with its parent (PR_SET_PDEATHSIG), and cancels when its
control pipe ends. A child that dies on its own: each of its hosts without an outcome is reported
failed, with the reason, never lost and never waited for.

A worker may live on after its run (`Stay`: with warm connections, it becomes the keeper of the
connections it made, fleet/ssh/handoff.py). It says so in its last frame, then leaves the
parent's world: its own session, no death signal tied to the parent, and every descriptor it
inherited from the parent on /dev/null, stdio included (a worker holding the command's stdout
would keep `fleet ... | tee` waiting). The parent neither waits for it nor ends it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import selectors
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

from fleet.core import defaults
from fleet.core.events import Event, HostFinished, Outcome, RunSummary
from fleet.core.flushing import Flusher
from fleet.engine.executor import Run, summarize
from fleet.engine.plan import Plan
from fleet.engine.wire import WireError, WorkerFigures, decode, encode
from fleet.ssh.keeperfork import threads_now

PR_SET_PDEATHSIG = 1
READ_BYTES = 256 * 1024  # read from a child's pipe at once
BATCH_BYTES = 64 * 1024  # frames a child writes at once (fewer system calls in a flood)
THREADS_SETTLE_S = (
    1.0  # how long a thread of an earlier run (a live table's refresh) may take to end
)
REAP_WAIT_S = 5.0  # for a child whose pipe ended to exit, before it is killed

MakeRun = Callable[[Plan, int], Run]  # a child's Run over its share: (share, forks)
# What a worker does once its run is over, given its index and whether the run ended on its own
# (not cancelled): what it then lives on as, a function that returns when that life ends; or
# None, and it exits.
Stay = Callable[[int, bool], Callable[[], None] | None]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, as taskset or a cgroup set it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def worker_count(
    setting: int | None, hosts: int, forks: int, cores: int, paramiko_hosts: int = 0
) -> int:
    """How many processes run this plan: `setting` (--workers) when given, else one per core
    but only as many as leave each at least defaults.WORKER_MIN_HOSTS hosts' worth of work (of
    which `paramiko_hosts`, connecting through paramiko, each count as a quarter of a worker's
    WORKER_MIN_HOSTS_PARAMIKO); never more than the hosts or --forks. 1: the run stays in this
    process."""
    through_paramiko = min(max(0, paramiko_hosts), hosts)
    work = (hosts - through_paramiko) / defaults.WORKER_MIN_HOSTS
    work += through_paramiko / defaults.WORKER_MIN_HOSTS_PARAMIKO
    wanted = setting if setting else min(cores, int(work))
    return max(1, min(wanted, hosts, forks))


def split_hosts(plan: Plan, count: int) -> list[Plan]:
    """`count` plans of every count-th host, round-robin in plan order (so a fleet whose slow
    nodes are grouped by name does not give them all to one worker)."""
    return [replace(plan, hosts=plan.hosts[i::count]) for i in range(count)]


def split_forks(forks: int, count: int) -> list[int]:
    """--forks shared over `count` workers (the first ones get one more): the total number of
    hosts worked on at once stays --forks."""
    return [forks // count + (1 if i < forks % count else 0) for i in range(count)]


def split_forks_by(forks: int, sizes: Sequence[int]) -> list[int]:
    """--forks over shares of these host counts, unequal ones (by keeper shard): each share gets
    one at least, none more than its hosts, and each next one goes to the share with the most
    hosts per fork, so that no share waits rounds longer than it must (an even split of 8 forks
    over shares of 5 and 3 hosts would leave a host of the first waiting for a whole round).
    The total is min(forks, hosts), or one per share when forks are fewer."""
    given = [1 if size else 0 for size in sizes]
    for _ in range(min(forks, sum(sizes)) - sum(given)):
        open_shares = [i for i, size in enumerate(sizes) if given[i] < size]
        if not open_shares:
            break
        most = max(open_shares, key=lambda i: (sizes[i] / given[i], -i))
        given[most] += 1
    return given


def fork_safe(settle_s: float = THREADS_SETTLE_S) -> bool:
    """True when this process runs one thread, waiting up to `settle_s` for threads that are
    ending (an earlier run's live table stops its refresh thread without joining it): fork
    copies only the calling thread, and a lock another thread held would never be released."""
    deadline = time.monotonic() + settle_s
    while threads_now() > 1:  # the kernel's count: a thread is gone only once it has exited
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@dataclass(frozen=True)
class _Spec:
    """What every worker is given at fork: how to build its Run, its share of --forks, the
    parent's pid (to die with it) and how long a cancelled run waits for its hosts."""

    make_run: MakeRun
    forks: tuple[int, ...]
    parent: int
    cancel_wait_s: float
    stay: Stay | None = None


@dataclass
class _Child:
    """The parent's view of one worker."""

    index: int
    pid: int
    hosts: tuple[str, ...]
    out_fd: int
    ctl_fd: int
    pending: bytes = b""
    figures: WorkerFigures | None = None
    status: int | None = None  # its wait status once reaped
    broken: str | None = None  # why its frames were refused
    stays: bool = False  # it lives on after the run (Stay): never waited for, never ended


@dataclass
class _Cancel:
    """Run.cancel's counterpart: tells every worker to cancel (a byte on its control pipe)."""

    children: list[_Child]
    flag: threading.Event = field(default_factory=threading.Event)

    def set(self) -> None:
        self.flag.set()
        for child in self.children:
            with contextlib.suppress(OSError):
                os.write(child.ctl_fd, b"c")

    def is_set(self) -> bool:
        return self.flag.is_set()


class Workers:
    """A run in flight over worker processes, with Run's interface (start, drain, cancel,
    summary) so fleet.engine.runner drives both alike; close() ends what is left."""

    def __init__(
        self,
        plan: Plan,
        count: int,
        forks: int,
        make_run: MakeRun,
        cancel_wait_s: float,
        *,
        shares: list[Plan] | None = None,
        stay: Stay | None = None,
    ) -> None:
        """`shares`: the hosts of each worker, when not every count-th host of the plan (count
        is then their number); `stay`: what a worker does after its run (Stay)."""
        self.plan = plan
        if shares is None:
            self.shares = split_hosts(plan, count)
            each = split_forks(forks, count)
        else:
            self.shares = shares
            each = split_forks_by(forks, [len(share.hosts) for share in shares])
        self.spec = _Spec(make_run, tuple(each), os.getpid(), cancel_wait_s, stay)
        self.children: list[_Child] = []
        self.results: dict[str, HostFinished] = {}
        self.cancel = _Cancel(self.children)
        self.ready: deque[tuple[Event, bytes | None]] = deque()
        # The frame of the event drain() yielded last: its JSON line, which the run record
        # writes as it is instead of encoding the event again (None: made here, not sent).
        self.frame: bytes | None = None
        self._selector = selectors.DefaultSelector()
        self._scratch = bytearray(READ_BYTES)  # what _read reads into
        self._closed = False

    def start(self) -> list[Any]:
        """Fork every worker (call with this process single-threaded: fork_safe)."""
        import ctypes  # noqa: F401 - for _detach; loaded here, once, only by a run that forks

        flush_std_streams()
        # The collector would visit (and so write to, copying every page of) what the children
        # inherit: out of its sight until the workers exist.
        gc.freeze()
        try:
            for index, share in enumerate(self.shares):
                self._fork(index, share)
        finally:
            gc.unfreeze()
        return []

    def _fork(self, index: int, share: Plan) -> None:
        out_r, out_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(out_r)
                os.close(ctl_w)
                for other in self.children:  # the fds of the workers forked before this one
                    os.close(other.out_fd)
                    os.close(other.ctl_fd)
                _child_main(index, share, self.spec, out_w, ctl_r)
            finally:
                os._exit(1)  # never back into the parent's code
        os.close(out_w)
        os.close(ctl_r)
        os.set_blocking(ctl_w, False)
        child = _Child(index, pid, tuple(share.host_names), out_r, ctl_w)
        self.children.append(child)
        self._selector.register(out_r, selectors.EVENT_READ, child)

    def drain(
        self,
        threads: Sequence[Any] = (),
        poll_s: float = 0.1,
        deadline: float | None = None,
        wait_s: Callable[[float], float] | None = None,
    ) -> Iterator[Event]:
        """Yield the workers' events until every pipe has ended, or until `deadline`
        (monotonic) passes; a worker that ended without its hosts' outcomes yields them.
        Events read but not yet yielded wait in `ready`: a Ctrl-C between two of them loses
        none (the next drain goes on from there). `wait_s`: how long to wait for the pipes
        instead of `poll_s` (fleet/core/flushing.py)."""
        while True:
            while self.ready:
                event, self.frame = self.ready.popleft()
                yield event
            if not self._selector.get_map():
                return
            if deadline is not None and time.monotonic() > deadline:
                return
            timeout = poll_s if wait_s is None else wait_s(poll_s)
            for key, _ in self._selector.select(timeout):
                self._read(key.data)

    def _read(self, child: _Child) -> None:
        try:
            # Into one buffer, reused: os.read(fd, READ_BYTES) allocates READ_BYTES for every
            # read, a fresh mmap (and its page faults) each time, past malloc's mmap threshold.
            size = os.readv(child.out_fd, [self._scratch])
        except OSError:
            size = 0
        chunk = bytes(memoryview(self._scratch)[:size])
        if not chunk:
            self._ended(child)
            return
        child.pending += chunk
        *frames, rest = child.pending.split(b"\n")
        items: list[tuple[Event, bytes | None]] = []
        for frame in frames:
            try:
                item = decode(frame)
            except WireError as exc:
                child.broken = f"sent a frame fleet refused ({exc})"
                _kill(child.pid)
                break
            if isinstance(item, WorkerFigures):
                child.figures = item
            else:
                items.append((item, frame))
        self.ready.extend(items)
        child.pending = rest
        for item, _ in items:
            if isinstance(item, HostFinished):
                self.results[item.host] = item
        if child.broken:
            self._ended(child)

    def _ended(self, child: _Child) -> None:
        """The child's pipe ended: reap it; if it did not finish its hosts on its own, each
        one left without an outcome fails, saying why (cancelled runs: their children were
        told to stop, and a host they did not get to is cancelled in the summary)."""
        self._selector.unregister(child.out_fd)
        os.close(child.out_fd)
        if child.figures is not None and child.figures.stays and child.broken is None:
            child.stays = True  # it lives on (a keeper now): reaped by whoever outlives us
            return
        child.status = _reap(child.pid, REAP_WAIT_S)
        clean = child.figures is not None and child.status == 0 and child.broken is None
        if clean or self.cancel.is_set():
            return
        why = child.broken or _how_it_ended(child.status)
        for host in child.hosts:
            if host not in self.results:
                event = HostFinished(
                    host=host,
                    outcome=Outcome.FAILED,
                    duration_s=0.0,
                    reason=f"fleet's worker process {child.pid} {why} before this host finished",
                )
                self.results[host] = event
                self.ready.append((event, None))

    def summary(
        self, record_id: str, started: float, interrupted: bool, run_dir: str | None
    ) -> RunSummary:
        """As Run.summary: results in plan order; hosts never reached count as cancelled."""
        return summarize(self.plan, self.results, record_id, started, interrupted, run_dir)

    def figures(self) -> list[WorkerFigures]:
        """What each worker said it cost, in worker order (those that said it)."""
        return [c.figures for c in self.children if c.figures is not None]

    def close(self) -> None:
        """Kill and reap every worker still running (after the cancel deadline, or an error in
        the parent), and close the pipes: no worker outlives its run. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for child in self.children:
            if child.status is None and not child.stays:
                _kill(child.pid)
                child.status = _reap(child.pid, REAP_WAIT_S)
            with contextlib.suppress(OSError):
                os.close(child.ctl_fd)
        for key in list(self._selector.get_map().values()):
            self._selector.unregister(key.fd)
            with contextlib.suppress(OSError):
                os.close(key.fd)
        self._selector.close()


def flush_std_streams() -> None:
    """Before a fork: else a child's exit could write the parent's buffered text again."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _reap(pid: int, wait_s: float) -> int:
    """The child's wait status, killing it if it has not exited within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return 0
        if done:
            return status
        if time.monotonic() > deadline:
            _kill(pid)
            deadline = float("inf")  # SIGKILL cannot be refused: wait for it
        time.sleep(0.005)


def _how_it_ended(status: int | None) -> str:
    """`was killed by SIGKILL`, `exited with code 1`: for a reason line."""
    if status is None:
        return "ended"
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    code = os.waitstatus_to_exitcode(status)
    return f"exited with code {code}" if code else "ended without its last report"


def _child_main(index: int, share: Plan, spec: _Spec, out_fd: int, ctl_fd: int) -> NoReturn:
    """A worker's whole life: run its share, send every event, then its figures; exit without
    running the parent's cleanup (atexit, buffered streams: they are the parent's)."""
    code = 1
    try:
        # The parent's descriptors, as the fork copied them: a worker that lives on closes them.
        inherited = open_fds() if spec.stay is not None else None
        _detach(spec.parent)
        run = spec.make_run(share, spec.forks[index])
        _listen(run, ctl_fd)
        _work(run, out_fd, spec.cancel_wait_s)
        # Without its list of the parent's descriptors it could not leave: it exits.
        after = _after(spec.stay, index, not run.cancel.is_set() and inherited is not None)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        figures = WorkerFigures(
            index=index,
            pid=os.getpid(),
            hosts=len(share.hosts),
            user_s=round(usage.ru_utime, 4),
            sys_s=round(usage.ru_stime, 4),
            maxrss_kb=usage.ru_maxrss,
            stays=after is not None,
        )
        _write_all(out_fd, encode(figures))
        code = 0
        if after is not None and inherited is not None:
            leave(inherited | {ctl_fd}, out_fd)
            after()
    finally:
        os._exit(code)  # whatever happened: the parent reports the hosts this one did not finish


def _after(stay: Stay | None, index: int, whole: bool) -> Callable[[], None] | None:
    """What the worker lives on as after its run (None: it exits); a failure to set that up
    only means it exits (its run is over and reported)."""
    if stay is None:
        return None
    try:
        return stay(index, whole)
    except Exception:
        return None


def open_fds() -> set[int] | None:
    """This process's open descriptors (not the one the listing itself used: closed again, its
    number is free for the next descriptor made); None when they cannot be listed."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    found = set()
    for name in names:
        try:
            os.fstat(int(name))
        except OSError:
            continue
        found.add(int(name))
    return found


def leave(theirs: set[int], last_fd: int, *, death_signal: bool = True) -> None:
    """Leave the parent's world, to live on after the run: a session of its own (no terminal,
    no Ctrl-C or hang-up of the operator's), no death signal tied to the parent (`death_signal`:
    a worker has one, _detach; a keeper forked at a run's end never had one), and every
    descriptor it had from the parent (`theirs`: stdio, what the fork copied, the control pipe)
    made /dev/null in place; `last_fd` (the events pipe) closed last, so that when the parent
    sees it end, nothing of the command's is held here any more. In place rather than closed:
    objects of the parent's copied here (a file of the run record, the thread blocked reading
    the control pipe) still name those numbers, and a number closed now could be given to a
    socket later and then be closed or read through them."""
    if death_signal:
        with contextlib.suppress(AttributeError, OSError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 0)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (theirs | {0, 1, 2}) - {null, last_fd}:
        with contextlib.suppress(OSError):
            os.dup2(null, fd)
    os.close(null)
    os.close(last_fd)


def _detach(parent: int) -> None:
    """Ignore the terminal's Ctrl-C (the parent decides what it means) and die with the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(AttributeError, OSError):
        import ctypes  # loaded by start() before the fork: found, never loaded, in a child

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


def _listen(run: Run, ctl_fd: int) -> None:
    """Cancel on SIGTERM (sent to the whole group), and when the parent says so or goes away."""
    signal.signal(signal.SIGTERM, lambda signum, frame: run.cancel.set())

    def watch() -> None:
        with contextlib.suppress(OSError):
            os.read(ctl_fd, 1)  # a byte: cancel; nothing (EOF): the parent is gone
        run.cancel.set()

    threading.Thread(target=watch, name="fleet-worker-control", daemon=True).start()


def _work(run: Run, out_fd: int, cancel_wait_s: float) -> None:
    """Run the share and write its events, batched: within FLUSH_S of the first one held (or
    at BATCH_BYTES), as the parent writes its own (fleet/core/flushing.py); once cancelled,
    wait for the hosts no longer than the parent does."""
    threads = run.start()
    deadline = _CancelDeadline(run.cancel, cancel_wait_s)
    batch = _Batch(out_fd)
    flusher = Flusher([batch])
    for event in run.drain(threads, deadline_of=deadline, wait_s=flusher.wait_s):
        batch.data += encode(event)
        if len(batch.data) >= BATCH_BYTES:
            flusher.flush()
        else:
            flusher.handled()
    batch.flush()


class _Batch:
    """A worker's frames not yet written to its pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = bytearray()

    def flush(self) -> None:
        _write_all(self.fd, self.data)
        self.data.clear()


class _CancelDeadline:
    """`wait_s` after the cancel was first seen (monotonic), else None."""

    def __init__(self, cancel: threading.Event, wait_s: float) -> None:
        self.cancel = cancel
        self.wait_s = wait_s
        self.at: float | None = None

    def __call__(self) -> float | None:
        if self.at is None and self.cancel.is_set():
            self.at = time.monotonic() + self.wait_s
        return self.at


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
