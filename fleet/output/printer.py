"""Which Printer a report written to a stream gets: styled on a terminal, plain text off one."""

from __future__ import annotations

import os
from typing import IO

from fleet.output.plain import Printer, TextPrinter


def styled(out: IO[str]) -> bool:
    """Whether `out` shows styles: a terminal, or FORCE_COLOR set (rich's own rule for a pipe)."""
    return bool(os.environ.get("FORCE_COLOR")) or out.isatty()


def printer_for(out: IO[str]) -> Printer:
    """rich's console onto `out` where styles show; else plain text, and rich is never loaded."""
    if not styled(out):
        return TextPrinter(out)
    from rich.console import Console

    from fleet.output.reporters import ConsolePrinter

    return ConsolePrinter(Console(file=out, highlight=False))
