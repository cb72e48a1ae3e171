"""paramiko's log records under --debug, shown as data.

A record may quote what an SSH server sent (`Incompatible version (ESC]0;title BEL ESC[2J...)`):
printed raw, a server could retitle or clear the operator's terminal, which fleet never lets a
node do anywhere else (fleet/core/safetext.py). Imported only with --debug, where logging is
loaded anyway.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from fleet.core.safetext import clean


class CleanFormatter(logging.Formatter):
    """A record's message with controls escaped, one line; a traceback or stack keeps its line
    breaks, everything else in it escaped alike."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return clean(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return clean(super().formatException(ei), keep_newlines=True)

    def formatStack(self, stack_info: str) -> str:
        return clean(super().formatStack(stack_info), keep_newlines=True)


class CleanStderr(logging.Handler):
    """What logging's last resort prints (warnings and up, the message alone, to sys.stderr as
    it is at each record), through CleanFormatter."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(CleanFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


def install(logger: logging.Logger) -> None:
    """`logger`'s records (paramiko's) through CleanStderr, not the raw last resort; once."""
    if not any(isinstance(h, CleanStderr) for h in logger.handlers):
        logger.addHandler(CleanStderr())
