"""When the reader of fleet's output leaves: `fleet exec 'seq 1 100000' --plain | head -2`.

A well-behaved Unix tool ends then, quietly, as SIGPIPE would end it; the shell reports 141
(128 + SIGPIPE). Python ignores SIGPIPE and raises BrokenPipeError instead, at whatever write or
flush meets the closed pipe: left alone, that ended fleet with exit 1, its remote commands cut
off mid-run and its run record without a summary. So:

- a reporter's BrokenPipeError (handle or flush, in the engine's loop) becomes ReaderLeft, a
  KeyboardInterrupt: the run is cancelled as by Ctrl-C (no new steps, in-flight remote commands
  stopped, hosts cancelled) and its record completed with summary.json;
- the broken stream is pointed at /dev/null, so what fleet still writes (a verb's last lines, the
  final flush) goes nowhere instead of failing again;
- fleet exits ExitCode.READER_LEFT (141) with no message: there is no one to read one on stdout, and
  stderr is the operator's terminal, where `| head` leaving early is no news.
"""

from __future__ import annotations

import os
import select
import sys
from typing import Any

from fleet.core.events import RunFinished

_left = [False]


class ReaderLeft(KeyboardInterrupt):
    """The reader of fleet's output left: cancel the run as Ctrl-C does, then exit quietly."""


def reader_left() -> bool:
    """Whether fleet's stdout or stderr lost its reader during this command."""
    return _left[0]


def _broken(fd: int) -> bool:
    """A pipe whose reader is gone: poll says POLLERR for its write end."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in poller.poll(0))


def silence_broken() -> bool:
    """Point stdout and/or stderr at /dev/null where their reader left; True if one had."""
    found = False
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue
        if _broken(fd):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
            found = True
    if found:
        _left[0] = True
    return found


class Guarded:
    """A reporter whose writes meet a closed pipe: from then on it is left out, and the run is
    cancelled (ReaderLeft) unless it is over already. A BrokenPipeError that is not its stdout
    or stderr's (a pipe of its own) is raised as it is."""

    def __init__(self, reporter: Any) -> None:
        self.reporter = reporter
        self.gone = False

    def handle(self, event: Any) -> None:
        if not self.gone:
            # RunFinished: the run is over, nothing is left to cancel.
            self._call(self.reporter.handle, event, cancel=not isinstance(event, RunFinished))

    def flush(self) -> None:
        flush = getattr(self.reporter, "flush", None)
        if flush is not None and not self.gone:
            self._call(flush, cancel=True)

    def close(self) -> None:
        self._call(self.reporter.close, cancel=False)

    def _call(self, method: Any, *args: Any, cancel: bool) -> None:
        try:
            method(*args)
        except BrokenPipeError:
            if not silence_broken():
                raise
            self.gone = True
            if cancel:
                raise ReaderLeft from None
