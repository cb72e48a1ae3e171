"""Which Printer a report written to a stream gets, styled on a terminal and plain text off one;
and which reporters a run gets off a terminal."""

from __future__ import annotations

import os
import sys
from typing import IO

from fleet.output.plain import JsonReporter, PlainReporter, Printer, Reporter, TextPrinter
from fleet.output.settings import OutputSettings


def styled(out: IO[str]) -> bool:
    """Whether `out` shows styles, by rich's own rule: TTY_COMPATIBLE=1 or 0 says so, else
    FORCE_COLOR set (not empty) says yes, else whether `out` is a terminal."""
    said = os.environ.get("TTY_COMPATIBLE", "")
    if said in ("0", "1"):
        return said == "1"
    if os.environ.get("FORCE_COLOR"):
        return True
    try:
        return out.isatty()
    except ValueError:  # a closed stream
        return False


def printer_for(out: IO[str]) -> Printer:
    """rich's console onto `out` where styles show; else plain text, and rich is never loaded."""
    if not styled(out):
        return TextPrinter(out)
    from fleet.output.console import Console
    from fleet.output.reporters import ConsolePrinter

    return ConsolePrinter(Console(file=out, highlight=False))


def off_terminal(out: OutputSettings, *, summary: bool, output: str) -> list[Reporter] | None:
    """A run's reporters unless it gets a live table: JSON lines with --json; plain lines with
    --plain or off a terminal, through printer_for (rich loaded only where styles show). None:
    stdout is a terminal, and the caller makes its live table."""
    if out.json:
        return [JsonReporter(sys.stdout)]
    if out.plain or not sys.stdout.isatty():
        return [PlainReporter(sys.stdout, printer_for(sys.stdout), summary=summary, output=output)]
    return None
