"""rich's Console as fleet uses it: a reader that left (`fleet hosts | head -1`) is a
BrokenPipeError, which fleet ends quietly with exit 141 (fleet/output/pipes.py). rich's own
handling points stdout at /dev/null and raises SystemExit(1): exit 1, a fleet error, for a
reader that only stopped reading."""

from __future__ import annotations

import errno

from rich.console import Console as _RichConsole


class Console(_RichConsole):
    """rich.console.Console, but a broken pipe is raised for fleet to handle."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more is written: the reader is gone
        raise BrokenPipeError(errno.EPIPE, "the reader of fleet's output left")
