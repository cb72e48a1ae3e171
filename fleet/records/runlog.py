"""The run record: for every run, a private directory with events.jsonl, hosts/<host>.log and
summary.json; the newest KEEP_RUNS records are kept.

A record is named by its record id (20261201-110355-exec-4d8d: the directory's name; `run_id`
in the events and summary.json). It is not a launch id (launch.py), the name of a training run
on the nodes: one `fleet launch` writes a record per playbook run it makes.

What it guarantees, whatever the nodes print:
- private: the directory is 0700 and every file 0600, whatever the umask (a record holds commands
  and output; environment values are redacted before they get here, see fleet/core/redact.py);
- safe to `cat`: node text in a host log is escaped as on the terminal (fleet/core/safetext.py),
  one line per line; events.jsonl keeps the exact text of its tails, JSON-escaped;
- bounded: output is streamed to hosts/<host>.log as it arrives, never held until the host ends;
  a host's log keeps its first HOST_LOG_MAX_BYTES of output, then only its last
  HOST_LOG_TAIL_BYTES, with a line saying how much was left out between them; events.jsonl has
  no output lines (its events carry only tails of a few cut lines) and summary.json none at all;
- pruning deletes only directories fleet marked as its own records (MARKER, written first), never
  anything else that happens to sit in --log-dir.

Any number of fleet processes may share one records directory (an operator's terminals, cron):
- a record's directory is made with mkdir, which fails when the name exists: two runs started in
  the same second with the same random suffix get two directories (the second one's name gets a
  counter), never one shared;
- the writer holds an exclusive flock on its record's MARKER from before the marker says "record"
  until the record is closed; pruning skips a record whose marker it cannot lock, so a record
  being written is never pruned, however old its name, and pruning never waits for anyone (the
  kernel drops the lock of a writer that died, and its record becomes prunable);
- a record is pruned by renaming it aside (one pruner wins, the others skip it) and then
  deleting it, its marker last: it leaves its name at once, never half-deleted, and a deletion
  cut short (Ctrl-C) is finished by the next prune;
- summary.json appears at once and complete (written aside, then renamed), as the record's last
  file; events.jsonl and the host logs grow by whole lines.

Lines are held back and written together (fleet/core/flushing.py): within FLUSH_S (0.05 s) of
their event, at once when more than HOLD_MAX_BYTES are held, and at the run's end or Ctrl-C. A
write per line cost the main thread a system call each (~10 a host for `exec true`), each one a
moment for the hosts' threads to take Python's lock from it. A host's log is created when its
first lines are written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fleet.core import userpath
from fleet.core.errors import ConfigError
from fleet.core.events import (
    Event,
    HostConnecting,
    HostFinished,
    OutputLine,
    RunFinished,
    RunStarted,
    StepFinished,
    StepStarted,
)
from fleet.core.result import size_text
from fleet.core.safetext import clean

KEEP_RUNS = 200
TREE_DEPTH_MAX = 16  # of a directory pruned (_remove_tree); a record's is 2
# Written first into every record directory: pruning deletes a directory only if it holds this
# file, with this text; a name that looks like a record id is not enough (a checkpoint directory
# like 00000123-step/ can sit in --log-dir too).
MARKER = ".fleet-run-record"
MARKER_TEXT = b"fleet run record: fleet may delete this directory when pruning old records\n"
RECORD_ID = re.compile(r"\d{8}-\d{6}-")
# A record being deleted is first renamed to this prefix + its name + a random suffix: hidden,
# and not a record id, so no other fleet lists it as a record.
PRUNING = ".fleet-pruning-"
NAME_TRIES = 100  # record names tried (ID, ID-2, ID-3, ...) before giving up
# Per host and run, this much output goes to the host's log in full (lines already cut to 16 KiB
# by the reader). Past it, only the last HOST_LOG_TAIL_BYTES are kept. Not unbounded: 200 records
# are kept in the operator's home, and a `yes`-style flood on 128 hosts would otherwise fill its
# disk. `--plain` and `--json` still stream every line, for those who want all of it.
HOST_LOG_MAX_BYTES = 64_000_000
HOST_LOG_TAIL_BYTES = 256_000
OPEN_LOGS_MAX = 128  # host logs open at once (the rest are reopened for append when needed)
HOLD_MAX_BYTES = 1 << 20  # lines held back before they are written (events.jsonl and host logs)
HINT = "pass --log-dir (or set FLEET_LOG_DIR to) a directory you can write"


# events.jsonl's separators: those of a worker's frames (fleet/engine/wire.py), which are written
# as they came, so that every line of the file is written alike.
_COMPACT = (",", ":")


@dataclass(frozen=True)
class RecordSettings:
    """Where this invocation's run records go and what they say of it: --log-dir, the verb
    (`cleanup`, `launch`; empty for `fleet hosts`), and one id for all the runs of this
    invocation, where `-l @failed` finds the last `fleet VERB` whole (a launch is several runs)."""

    log_dir: Path | None = None
    verb: str = ""
    invocation: str = field(default_factory=lambda: os.urandom(6).hex())

    def base(self) -> Path:
        """--log-dir / FLEET_LOG_DIR, else the default."""
        return userpath.expand(self.log_dir, "run record dir ") if self.log_dir else default_base()


def default_base() -> Path:
    """`$FLEET_LOG_DIR`, else `$XDG_STATE_HOME/fleet/runs`, else ~/.local/state/fleet/runs."""
    if env := os.environ.get("FLEET_LOG_DIR"):
        return userpath.expand(env, "run record dir ")
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "fleet" / "runs"


def new_record_id(playbook: str) -> str:
    """Sortable and unique: 20261130-041233-cleanup-3fa2."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in playbook)[:40]
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{os.urandom(2).hex()}"


def check_base(base: Path) -> None:
    """Before a run (and before any question): the records' directory is a directory fleet can
    write in, or can be created; else one error naming it (exit 1), instead of an internal error
    once the run has started. Creates nothing: a refused run leaves no trace."""
    probe = base
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent  # where `mkdir -p` would start
    if not probe.is_dir():
        what = (
            "not a directory" if probe == base else f"cannot create it: {probe} is not a directory"
        )
        raise ConfigError(f"run record dir {base}: {what}", hint=HINT)
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "not writable" if probe == base else f"cannot create it: {probe} is not writable"
        raise ConfigError(f"run record dir {base}: {what}", hint=HINT)


def _private_dir(path: Path) -> None:
    """A new directory only its owner can enter (chmod too: mkdir's mode is cut by the umask)."""
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)


def _new_record_dir(base: Path, record_id: str) -> tuple[Path, str]:
    """A new record directory for `record_id`, or `record_id-N` when that name is taken (by a run
    started in the same second with the same suffix, or by anything else: never written
    through, never shared). mkdir is the claim: it fails when the name exists."""
    for n in range(1, NAME_TRIES + 1):
        name = record_id if n == 1 else f"{record_id}-{n}"
        try:
            _private_dir(base / name)
        except FileExistsError:
            continue
        return base / name, name
    raise FileExistsError(errno.EEXIST, f"{NAME_TRIES} record names for {record_id} are taken")


def _marker(path: Path) -> int:
    """Create the record's MARKER and lock it before it says what it is (pruning reads the text,
    then must get the lock): returns the fd, which holds the lock until the record is closed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.fchmod(fd, 0o600)
        _write_all(fd, MARKER_TEXT)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: bytes) -> None:
    """One write for data this small, looping only if the kernel takes less."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _private_fd(path: Path) -> int:
    """A new file only its owner can read, for unbuffered writes; never through a symlink."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _private_file(path: Path) -> IO[bytes]:
    """A new file only its owner can read, opened for writing; never through a symlink."""
    fd = _private_fd(path)
    try:
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


def _log_fd(path: Path, *, append: bool) -> int:
    """A host log's descriptor: new (as _private_fd), or reopened to append, never through a
    symlink."""
    if not append:
        return _private_fd(path)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)


class _HostLog:
    """One host's log: lines streamed to hosts/<host>.log, output capped at HOST_LOG_MAX_BYTES
    (then a bounded tail is kept and written, after a note of what was left out, at the next
    step boundary or at the end)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1
        self.created = False
        self.held: list[bytes] = []  # lines not yet written (RunRecord.flush)
        self.done = False  # the host finished: closed once its held lines are written
        self.output_bytes = 0
        self.tail: deque[bytes] = deque()
        self.tail_bytes = 0
        self.cut_lines = 0
        self.cut_bytes = 0

    def open(self) -> int:
        if self.fd < 0:
            self.fd = _log_fd(self.path, append=self.created)
            self.created = True
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class RunRecord:
    """Writes one run's record as events arrive (a handler, called on the main thread)."""

    def __init__(self, base: Path, record_id: str, *, verb: str = "", invocation: str = "") -> None:
        self._lock_fd = -1
        self.verb = verb  # in summary.json, for -l @failed (fleet.records.retry)
        self.invocation = invocation
        try:
            base.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.dir, self.record_id = _new_record_dir(base, record_id)
            self._lock_fd = _marker(self.dir / MARKER)
            _private_dir(self.dir / "hosts")
            self.events_fd = _private_fd(self.dir / "events.jsonl")
        except OSError as exc:
            self._unlock()
            raise ConfigError(
                f"run record dir {base}: cannot write a record in it: {exc.strerror or exc}",
                hint=HINT,
            ) from None
        self.logs: dict[str, _HostLog] = {}
        self._open: OrderedDict[int, _HostLog] = OrderedDict()  # by id: logs with an open fd
        self._events: list[bytes] = []  # events.jsonl's lines not yet written
        self._held: dict[int, _HostLog] = {}  # by id: logs with lines held, or done
        self._held_bytes = 0
        self._stamp_second = -1
        self._stamp = ""
        self._failed = False
        self.workers: list[dict[str, Any]] = []
        _prune(base)

    def note_workers(self, figures: list[dict[str, Any]]) -> None:
        """What each worker process of the run cost (fleet/engine/workers.py): summary.json's
        `workers`, for the benchmark's CPU per process. Not said of a run in one process."""
        self.workers = figures

    def handle(self, event: Event, line: bytes | None = None) -> None:
        """Record one event. `line`: the event as a JSON object already (a worker's frame,
        fleet/engine/wire.py: the same fields), written to events.jsonl as it is. A write
        that fails (disk full) stops the record, not the run."""
        if self._failed:
            return
        try:
            self._record(event, line)
        except OSError as exc:
            self._stop(exc)

    def flush(self) -> None:
        """Write the lines held back (fleet/core/flushing.py says when)."""
        if self._failed:
            return
        try:
            self._flush()
        except OSError as exc:
            self._stop(exc)

    def _stop(self, exc: OSError) -> None:
        """A write failed (disk full): the record stops, the run goes on."""
        self._failed = True
        sys.stderr.write(f"fleet: warning: run record {self.dir} stopped: {exc}\n")
        self.close()

    def _flush(self) -> None:
        """events.jsonl's held lines in one write, then each host log's in one."""
        self._held_bytes = 0
        if self._events:
            data = b"".join(self._events)
            self._events.clear()
            _write_all(self.events_fd, data)
        for key, log in list(self._held.items()):  # each one forgotten once written
            if log.held:
                data = b"".join(log.held)
                log.held.clear()
                _write_all(self._fd(key, log), data)
            if log.done:
                self._open.pop(key, None)
                log.close()
            del self._held[key]

    def _fd(self, key: int, log: _HostLog) -> int:
        """The host's open log; at most OPEN_LOGS_MAX are open (least recently used closed)."""
        if log.fd >= 0:
            self._open.move_to_end(key)
            return log.fd
        self._open[key] = log
        if len(self._open) > OPEN_LOGS_MAX:
            _, oldest = self._open.popitem(last=False)
            oldest.close()
        return log.open()

    def _hold(self, log: _HostLog, data: bytes) -> None:
        log.held.append(data)
        self._held[id(log)] = log
        self._held_bytes += len(data)
        if self._held_bytes > HOLD_MAX_BYTES:
            self._flush()

    def _record(self, event: Event, line: bytes | None) -> None:
        if isinstance(event, OutputLine):  # the hot path: one per line of output
            self._output(event)
            return
        if isinstance(event, RunFinished):
            self._finish(event)
            return
        if line is None:
            line = json.dumps(event.to_dict(), separators=_COMPACT, default=str).encode()
        self._events.append(line + b"\n")
        self._held_bytes += len(line) + 1
        host = getattr(event, "host", None)
        if isinstance(event, RunStarted) or not isinstance(host, str):
            return
        stamp = self._stamp_of(event.ts)
        if isinstance(event, HostConnecting):
            self._write(host, f"{stamp} connecting (attempt {event.attempt})")
        elif isinstance(event, StepStarted):
            self._write(host, f"{stamp} step {event.index + 1} '{event.step}': $ {event.command}")
        elif isinstance(event, StepFinished):
            status = "timed out" if event.timed_out else f"exit {event.exit_code}"
            self._write(
                host, f"{stamp} step '{event.step}' finished: {status} in {event.duration_s:.2f}s"
            )
        elif isinstance(event, HostFinished):
            why = f" ({clean(event.reason)})" if event.reason else ""  # may quote a node
            self._write(host, f"{stamp} outcome: {event.outcome.value}{why}")
            self._close_host(host)

    def _stamp_of(self, ts: float) -> str:
        """HH:MM:SS, formatted once per second (strftime per line showed up in floods)."""
        second = int(ts)
        if second != self._stamp_second:
            self._stamp_second = second
            self._stamp = time.strftime("%H:%M:%S", time.localtime(ts))
        return self._stamp

    def _output(self, event: OutputLine) -> None:
        """One output line: into the host's log while under its cap, else into the kept tail.
        (The hot path, once per line of every host: kept lean.)"""
        host = event.host
        log = self.logs.get(host) or self._log(host)
        if int(event.ts) != self._stamp_second:
            self._stamp_of(event.ts)
        tag = "out" if event.stream == "stdout" else "err"
        # Escaped as on the terminal: `cat` or `tail -f` of a host log must not obey a node's
        # escape sequences, and one line stays one line. clean()'s own fast test, inlined: a
        # printable line (the common case) costs no call.
        text = event.line
        if not text.isprintable():
            text = clean(text)
        data = f"{self._stamp} {tag}| {text}\n".encode("utf-8", "replace")
        if not log.tail and log.output_bytes + len(data) <= HOST_LOG_MAX_BYTES:
            log.output_bytes += len(data)
            self._hold(log, data)
            return
        log.tail.append(data)
        log.tail_bytes += len(data)
        while log.tail_bytes > HOST_LOG_TAIL_BYTES and len(log.tail) > 1:
            dropped = log.tail.popleft()
            log.tail_bytes -= len(dropped)
            log.cut_lines += 1
            log.cut_bytes += len(dropped)

    def _write(self, host: str, line: str) -> None:
        """A line of fleet's own (connecting, step start and end, outcome), after any kept tail."""
        log = self._log(host)
        self._flush_tail(log)
        self._hold(log, line.encode("utf-8", "replace") + b"\n")

    def _flush_tail(self, log: _HostLog) -> None:
        """Past the cap: a note of what was left out, then the tail that was kept."""
        if not log.tail:
            return
        if log.cut_lines:
            self._hold(
                log,
                f"{self._stamp} [record cut: {log.cut_lines} lines ({size_text(log.cut_bytes)})"
                f" of output left out here: over {size_text(HOST_LOG_MAX_BYTES)} for this host;"
                " --plain or --json shows every line]\n".encode(),
            )
        tail = b"".join(log.tail)
        log.tail.clear()
        log.tail_bytes = log.cut_lines = log.cut_bytes = 0
        self._hold(log, tail)

    def _log(self, host: str) -> _HostLog:
        log = self.logs.get(host)
        if log is None:
            log = self.logs[host] = _HostLog(self.dir / "hosts" / f"{host}.log")
        return log

    def _close_host(self, host: str) -> None:
        """The host is done: what it still holds is written (its tail too) and its log closed
        at the next flush; forgotten here (bounded by live hosts)."""
        log = self.logs.pop(host, None)
        if log is None:
            return
        self._flush_tail(log)
        log.done = True
        self._held[id(log)] = log

    def _finish(self, event: RunFinished) -> None:
        """summary.json: counts, exit code and each host's outcome, never its output."""
        for host in list(self.logs):
            self._close_host(host)
        self._flush()
        summary = event.to_dict()
        if self.verb:
            summary.update(verb=self.verb, invocation=self.invocation)
        if self.workers:
            summary["workers"] = self.workers
        # The gathered output is the hosts' text: it is in hosts/*.log, not here.
        summary.pop("output", None)
        summary.pop("no_output", None)
        _write_all(
            self.events_fd, json.dumps(summary, separators=_COMPACT, default=str).encode() + b"\n"
        )
        for result in summary["hosts"].values():
            result.pop("last_line", None)
            result.pop("stderr_tail", None)
        aside = self.dir / ".summary.json.tmp"
        with _private_file(aside) as out:
            out.write(json.dumps(summary, indent=2, default=str).encode() + b"\n")
        os.rename(aside, self.dir / "summary.json")
        self.close()

    def close(self) -> None:
        """Write what is held and close every file (also on interrupt); safe to call twice."""
        try:
            for host in list(self.logs):
                self._close_host(host)
            if not self._failed:
                self._flush()
        except OSError as exc:
            if not self._failed:
                self._failed = True
                sys.stderr.write(f"fleet: warning: run record {self.dir} stopped: {exc}\n")
        for log in [*self._open.values(), *self._held.values(), *self.logs.values()]:
            with contextlib.suppress(OSError):
                log.close()
        self._open.clear()
        self._held.clear()
        self._events.clear()
        self.logs.clear()
        if self.events_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.events_fd)
            self.events_fd = -1
        self._unlock()

    def _unlock(self) -> None:
        """Release the record (its marker's lock): from now on pruning may take it."""
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = -1


def is_record(path: Path) -> bool:
    """A real directory (not a symlink) holding fleet's marker file with fleet's text."""
    fd = _open_marker(path)
    if fd is None:
        return False
    os.close(fd)
    return True


def _open_marker(path: Path) -> int | None:
    """The fd of `path`'s marker when `path` is a record (see is_record), else None."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
        fd = os.open(path / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(MARKER_TEXT) + 1) == MARKER_TEXT:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _prune(base: Path) -> None:
    """Keep the newest KEEP_RUNS records; never touch anything else, never wait. Records are
    known by their names here, and each one past the newest KEEP_RUNS is checked for fleet's
    marker as it is removed (_remove): a directory that only looks like a record is counted
    among the kept ones and never touched, and a command no longer opens the marker of every
    kept record (KEEP_RUNS of them, on every command once the directory is full). Best effort: a
    record being written (its marker locked), one that vanishes meanwhile (another fleet
    pruning too) or one that cannot be removed is skipped."""
    try:
        names = [e.name for e in os.scandir(base)]
    except OSError:
        return
    records = sorted(n for n in names if RECORD_ID.match(n))
    for name in records[:-KEEP_RUNS]:
        _remove(base, name)
    for name in names:
        if name.startswith(PRUNING):
            _finish_removal(base / name)


def _remove(base: Path, name: str) -> None:
    """Take one record out of the list at once (rename aside), then delete it; skip it when it
    is being written or when another fleet took it first."""
    fd = _open_marker(base / name)
    if fd is None:
        return  # gone meanwhile
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # its writer (or another pruner) holds it
        aside = base / f"{PRUNING}{name}-{os.urandom(4).hex()}"
        try:
            os.rename(base / name, aside)
        except OSError:
            return  # another fleet took it
        _delete(aside)
    finally:
        os.close(fd)


def _finish_removal(path: Path) -> None:
    """A record renamed aside and not fully deleted (its pruner was interrupted): delete the rest
    if it still holds fleet's marker and no one holds the marker's lock; an empty one (only the
    final rmdir was missing) is removed. Anything else is left alone."""
    fd = _open_marker(path)
    if fd is None:
        with contextlib.suppress(OSError):
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                os.rmdir(path)  # only ever removes an empty directory
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # its pruner is still at it
        _delete(path)
    finally:
        os.close(fd)


def _delete(path: Path) -> None:
    """Delete a record's directory, its marker last: until the end it stays recognisably ours."""
    _remove_tree(str(path), last=MARKER)


def _remove_tree(
    path: str, dir_fd: int | None = None, depth: int = 0, last: str | None = None
) -> None:
    """Remove a directory and all it holds, the way shutil.rmtree does where it can: each
    directory opened with O_NOFOLLOW and its entries removed relative to it, so a symlink
    anywhere inside (or one swapped in meanwhile) is removed, never followed. Not shutil itself:
    it loads bz2 and lzma, ~2.5 ms of every command once the record dir holds KEEP_RUNS records.
    `last`: an entry of this directory removed only after all the others. Best effort (pruning
    is housekeeping): what cannot be removed stays; nesting deeper than TREE_DEPTH_MAX (a record
    is two levels deep) is left too."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return
    try:
        with os.scandir(fd) as scan:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in scan]
        for name, is_dir in entries:
            if name == last:
                continue
            if is_dir:
                if depth < TREE_DEPTH_MAX:
                    _remove_tree(name, fd, depth + 1)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fd)
        if last is not None:
            os.unlink(last, dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(path, dir_fd=dir_fd)
