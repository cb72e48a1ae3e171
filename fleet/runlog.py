"""The run record: for every run, a private directory with events.jsonl, hosts/<host>.log and
summary.json; the newest KEEP_RUNS records are kept.

What it guarantees, whatever the nodes print:
- private: the directory is 0700 and every file 0600, whatever the umask (a record holds commands
  and output; environment values are redacted before they get here, see fleet/redact.py);
- bounded: output is streamed to hosts/<host>.log as it arrives, never held until the host ends;
  a host's log keeps its first HOST_LOG_MAX_BYTES of output, then only its last
  HOST_LOG_TAIL_BYTES, with a line saying how much was left out between them; events.jsonl has
  no output lines (its events carry only tails of a few cut lines) and summary.json none at all;
- pruning deletes only directories fleet marked as its own records (MARKER, written first), never
  anything else that happens to sit in --log-dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
import sys
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import IO, Any

from fleet.errors import ConfigError
from fleet.events import (
    Event,
    HostConnecting,
    HostFinished,
    OutputLine,
    RunFinished,
    RunStarted,
    StepFinished,
    StepStarted,
    size_text,
)

KEEP_RUNS = 200
# Written first into every record directory: pruning deletes a directory only if it holds this
# file, with this text. (Before, any directory whose name began with 8 digits counted as a record,
# and checkpoint directories like 00000123-step/ were deleted.)
MARKER = ".fleet-run-record"
MARKER_TEXT = b"fleet run record: fleet may delete this directory when pruning old records\n"
RUN_NAME = re.compile(r"\d{8}-\d{6}-")
# Per host and run, this much output goes to the host's log in full (lines already cut to 16 KiB
# by the reader). Past it, only the last HOST_LOG_TAIL_BYTES are kept. Not unbounded: 200 records
# are kept in the operator's home, and a `yes`-style flood on 128 hosts would otherwise fill its
# disk. `--plain` and `--json` still stream every line, for those who want all of it.
HOST_LOG_MAX_BYTES = 64_000_000
HOST_LOG_TAIL_BYTES = 256_000
OPEN_LOGS_MAX = 128  # host logs open at once (the rest are reopened for append when needed)
HINT = "pass --log-dir (or set FLEET_LOG_DIR to) a directory you can write"


def default_base() -> Path:
    """`$FLEET_LOG_DIR`, else `$XDG_STATE_HOME/fleet/runs`, else ~/.local/state/fleet/runs."""
    if env := os.environ.get("FLEET_LOG_DIR"):
        return Path(env).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "fleet" / "runs"


def new_run_id(playbook: str) -> str:
    """Sortable and unique: 20261130-041233-cleanup-3fa2."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in playbook)[:40]
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{secrets.token_hex(2)}"


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


def _private_file(path: Path, *, append: bool = False) -> IO[bytes]:
    """A file only its owner can read, opened for writing; never through a symlink."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_APPEND if append else os.O_EXCL
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, "ab" if append else "wb")
    except BaseException:
        os.close(fd)
        raise


class _HostLog:
    """One host's log: lines streamed to hosts/<host>.log, output capped at HOST_LOG_MAX_BYTES
    (then a bounded tail is kept and written, after a note of what was left out, at the next
    step boundary or at the end)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: IO[bytes] | None = None
        self.created = False
        self.output_bytes = 0
        self.tail: deque[bytes] = deque()
        self.tail_bytes = 0
        self.cut_lines = 0
        self.cut_bytes = 0

    def open(self) -> IO[bytes]:
        if self.file is None:
            self.file = _private_file(self.path, append=self.created)
            self.created = True
        return self.file

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class RunRecord:
    """Writes one run's record as events arrive (a handler, called on the main thread)."""

    def __init__(self, base: Path, run_id: str) -> None:
        self.dir = base / run_id
        try:
            base.mkdir(parents=True, exist_ok=True, mode=0o700)
            _private_dir(self.dir)
            with _private_file(self.dir / MARKER) as marker:
                marker.write(MARKER_TEXT)
            _private_dir(self.dir / "hosts")
            self.events: IO[bytes] = _private_file(self.dir / "events.jsonl")
        except OSError as exc:
            raise ConfigError(
                f"run record dir {base}: cannot write a record in it: {exc.strerror or exc}",
                hint=HINT,
            ) from None
        self.logs: dict[str, _HostLog] = {}
        self._open: OrderedDict[str, _HostLog] = OrderedDict()
        self._stamp_second = -1
        self._stamp = ""
        self._failed = False
        _prune(base)

    def handle(self, event: Event) -> None:
        """Record one event. A write that fails (disk full) stops the record, not the run."""
        if self._failed:
            return
        try:
            self._record(event)
        except OSError as exc:
            self._failed = True
            sys.stderr.write(f"fleet: warning: run record {self.dir} stopped: {exc}\n")
            self.close()

    def _record(self, event: Event) -> None:
        if isinstance(event, OutputLine):  # the hot path: one per line of output
            self._output(event)
            return
        self.events.write(json.dumps(event.to_dict(), default=str).encode() + b"\n")
        if isinstance(event, RunFinished):
            self._finish(event)
            return
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
            why = f" ({event.reason})" if event.reason else ""
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
        data = f"{self._stamp} {tag}| {event.line}\n".encode("utf-8", "replace")
        if not log.tail and log.output_bytes + len(data) <= HOST_LOG_MAX_BYTES:
            log.output_bytes += len(data)
            if log.file is not None:
                self._open.move_to_end(host)
                log.file.write(data)
            else:
                self._file(host, log).write(data)
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
        out = self._file(host, log)
        self._flush_tail(log, out)
        out.write(line.encode("utf-8", "replace") + b"\n")

    def _flush_tail(self, log: _HostLog, out: IO[bytes]) -> None:
        """Past the cap: a note of what was left out, then the tail that was kept."""
        if not log.tail:
            return
        if log.cut_lines:
            out.write(
                f"{self._stamp} [record cut: {log.cut_lines} lines ({size_text(log.cut_bytes)})"
                f" of output left out here: over {size_text(HOST_LOG_MAX_BYTES)} for this host;"
                " --plain or --json shows every line]\n".encode()
            )
        out.writelines(log.tail)
        log.tail.clear()
        log.tail_bytes = log.cut_lines = log.cut_bytes = 0

    def _log(self, host: str) -> _HostLog:
        log = self.logs.get(host)
        if log is None:
            log = self.logs[host] = _HostLog(self.dir / "hosts" / f"{host}.log")
        return log

    def _file(self, host: str, log: _HostLog) -> IO[bytes]:
        """The host's open log file; at most OPEN_LOGS_MAX are open (least recently used closed)."""
        if host in self._open:
            self._open.move_to_end(host)
        else:
            self._open[host] = log
            if len(self._open) > OPEN_LOGS_MAX:
                _, oldest = self._open.popitem(last=False)
                oldest.close()
        return log.open()

    def _close_host(self, host: str) -> None:
        """The host is done: write what it still holds and forget it (bounded by live hosts)."""
        log = self.logs.pop(host, None)
        if log is None:
            return
        if log.tail:
            self._flush_tail(log, self._file(host, log))
        self._open.pop(host, None)
        log.close()

    def _finish(self, event: RunFinished) -> None:
        """summary.json: counts, exit code and each host's outcome, never its output."""
        for host in list(self.logs):
            self._close_host(host)
        summary = event.to_dict()
        for result in summary["hosts"].values():
            result.pop("last_line", None)
            result.pop("stderr_tail", None)
        with _private_file(self.dir / "summary.json") as out:
            out.write(json.dumps(summary, indent=2, default=str).encode() + b"\n")
        self.close()

    def close(self) -> None:
        """Write what is held and close every file (also on interrupt); safe to call twice."""
        for host in list(self.logs):
            try:
                self._close_host(host)
            except OSError:
                self.logs.pop(host, None)
        if not self.events.closed:
            with contextlib.suppress(OSError):
                self.events.close()


def is_record(path: Path) -> bool:
    """A real directory (not a symlink) holding fleet's marker file with fleet's text."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        fd = os.open(path / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            return os.read(fd, len(MARKER_TEXT) + 1) == MARKER_TEXT
        finally:
            os.close(fd)
    except OSError:
        return False


def _prune(base: Path) -> None:
    """Keep the newest KEEP_RUNS records fleet made; never touch anything else. Best effort: a
    record that vanishes meanwhile (another fleet pruning too) or cannot be removed is skipped."""
    try:
        names = [e.name for e in os.scandir(base) if RUN_NAME.match(e.name)]
    except OSError:
        return
    records = sorted(name for name in names if is_record(base / name))
    for name in records[:-KEEP_RUNS]:
        shutil.rmtree(base / name, onerror=_ignore)


def _ignore(func: Any, path: str, exc_info: Any) -> None:
    """rmtree's error handler: pruning is housekeeping, it never fails a run."""
