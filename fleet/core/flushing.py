"""When the main thread writes what its handlers held back: at most FLUSH_S after it came.

The handlers of a run's events (the run record, the plain and JSON reporters) write to files and
pipes. Written as each event comes, that is a system call or more per event on the main thread:
~10 a host for `exec true`, and while the hosts' threads run, each call lets one of them take
Python's lock and the main thread waits to get it back (~15 us a call at 128 hosts). So they hold
their lines back, bounded in bytes, and a Flusher has them written together:

- after an event, once FLUSH_S has passed since the first line held (a flood of events is
  written every FLUSH_S, never only at the end);
- before the engine waits for the next event: it waits no longer than until then (a quiet run's
  last lines are not left waiting for the next event).

So a line reaches its file or pipe within FLUSH_S of its event, as a person watching or a
`tail -f` sees it. A handler also writes when what it holds passes its own byte bound, and at
close (every run's end, Ctrl-C included).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

FLUSH_S = 0.05


class Flusher:
    """Calls flush() of every handler that has one: after an event when due, and before a wait
    (wait_s shortens the wait to when it is due)."""

    def __init__(
        self,
        handlers: Sequence[Any],
        every_s: float = FLUSH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.handlers = handlers  # read at each flush: a run adds its reporters after this
        self.every_s = every_s
        self.clock = clock
        self.due: float | None = None  # when what is held must be written; None: nothing held

    def handled(self) -> None:
        """An event went to the handlers: what they hold is due FLUSH_S after the first one."""
        now = self.clock()
        if self.due is None:
            self.due = now + self.every_s
        elif now >= self.due:
            self.flush()

    def wait_s(self, poll_s: float) -> float:
        """How long the engine may wait for the next event: `poll_s`, or less when something is
        due sooner (written now when it is due already)."""
        if self.due is None:
            return poll_s
        left = self.due - self.clock()
        if left <= 0:
            self.flush()
            return poll_s
        return min(poll_s, left)

    def flush(self) -> None:
        self.due = None
        for handler in self.handlers:
            flush = getattr(handler, "flush", None)
            if flush is not None:
                flush()
