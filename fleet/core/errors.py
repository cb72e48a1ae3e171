"""Errors that stop a run before it starts, and the exit codes operators script against."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """The documented process exit codes (docs/reference/output.md, "Exit codes")."""

    OK = 0
    FLEET_ERROR = 1  # bad inventory, playbook, template, config
    USAGE = 2  # bad command line (click's own code)
    STEP_FAILED = 3  # a step failed on at least one host
    UNREACHABLE = 4  # at least one host unreachable or timed out (wins over 3)
    INTERRUPTED = 130  # Ctrl-C
    READER_LEFT = 141  # 128 + SIGPIPE: the reader of fleet's output left (fleet/output/pipes.py)


class FleetError(Exception):
    """A user-facing error: one line saying what and where, plus a hint saying what next."""

    exit_code: ExitCode = ExitCode.FLEET_ERROR

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class InventoryError(FleetError):
    """The inventory file is missing, malformed or selects nothing."""


class PlaybookError(FleetError):
    """A playbook is missing, malformed, or a step cannot be rendered."""


class TemplateError(PlaybookError):
    """A `${var}` in a step names a variable that no layer defines."""


class ConfigError(FleetError):
    """An SSH config, option value or local file the run needs is unusable."""


class UsageError(FleetError):
    """The command line asks for something fleet cannot do (exit 2)."""

    exit_code = ExitCode.USAGE
