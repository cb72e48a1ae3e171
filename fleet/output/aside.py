"""Lines fleet says on stderr while a run's live table is on the terminal (the first Ctrl-C's
"cancelling ..."): said through the table, above it, so that its next refresh does not erase them
(fleet.output.reporters.LiveReporter.aside). Light: loads no rich."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any


@contextmanager
def aside(handlers: Iterable[Any]) -> Iterator[None]:
    """While the block runs, what it writes to stderr goes above any live table among `handlers`
    (each a reporter, or a reporter guarded by fleet.output.pipes.Guarded)."""
    with ExitStack() as stack:
        for handler in handlers:
            reporter = getattr(handler, "reporter", handler)
            step_aside = getattr(reporter, "aside", None)
            if callable(step_aside):
                stack.enter_context(step_aside())
        yield
