"""What an op step is to the executor (HostIO lent per host, NodeOp planned per host) and how
an op reads its variables: the base that every op (cleanup in fleet/node/ops.py, kill-docker,
preflight) builds on, so that none of them imports another."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from fleet.core import defaults
from fleet.core.result import CommandResult
from fleet.core.shell import Cmd, to_text
from fleet.node.ere import BadPattern, Pattern, compile_ere

FACTS_TIMEOUT_S = 120.0  # one facts.sh run at most (nvidia-smi's query has 60 s of it)
OnLine = Callable[[str, str], None]


class OpVarError(ValueError):
    """A variable an op reads has a value it cannot use."""

    def __init__(self, var: str, message: str, hint: str) -> None:
        super().__init__(message)
        self.var = var
        self.message = message
        self.hint = hint


class HostIO(Protocol):
    """What the executor lends an op for one host."""

    def run(self, cmd: Cmd, on_line: OnLine) -> CommandResult:
        """Run one command on the host's connection (a channel of its session)."""
        ...

    def emit(self, stream: str, line: str) -> None:
        """One line of the step's output, as a script step's would be."""
        ...


class NodeOp(Protocol):
    """A planned op step for one host."""

    @property
    def cmd(self) -> Cmd:
        """The first command it sends; shown by dry runs and the step's start event."""
        ...

    @property
    def stdin_name(self) -> str:
        """The script that command feeds on stdin."""
        ...

    def run(self, io: HostIO) -> CommandResult: ...

    def describe(self) -> str:
        """What may follow the first command, for dry runs."""
        ...


# ---------------------------------------------------------------------------- reading vars


def truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"true", "yes", "1", "on", "y"}
    return bool(value)


def text_items(value: Any) -> list[str]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [to_text(v) for v in items if v is not None and v != ""]


def number_var(var: str, value: Any, low: float, high: float, hint: str) -> float:
    try:
        number = float(to_text(value))
    except ValueError:
        raise OpVarError(var, f"{var}: '{to_text(value)}' is not a number", hint) from None
    if not low <= number <= high:
        raise OpVarError(var, f"{var}: {number:g} is not between {low:g} and {high:g}", hint)
    return number


def patterns(value: Any) -> tuple[Pattern, ...]:
    """The kill patterns, each a POSIX extended regex that matches some, not all, text."""
    out = []
    for item in value if isinstance(value, (list, tuple)) else [value]:
        text = to_text(item)
        try:
            out.append(compile_ere(text))
        except BadPattern as exc:
            raise OpVarError("patterns", f"--pattern '{text}': {exc}", exc.hint) from None
    if not out:
        raise OpVarError(
            "patterns",
            "no --pattern: cleanup needs at least one to know what to kill",
            f"e.g. --pattern torchrun (the defaults: {', '.join(defaults.PATTERNS)})",
        )
    return tuple(out)
