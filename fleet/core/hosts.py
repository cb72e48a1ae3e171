"""The hosts a run is about, as values every layer shares: where each is defined, how to reach it,
its variables, and what fleet refuses in its settings. Built by fleet.inventory.loader; read by the
plan, the executor, the SSH transport and the node-side decisions, none of which needs the
loader."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Origin:
    """Where something was defined: a file and, when known, a line (for `fleet hosts`)."""

    path: Path
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line else str(self.path)


@dataclass(frozen=True)
class Refusal:
    """A setting fleet will not act on, said when a run selects a host that has it."""

    where: str  # `FILE:LINE: place`, the place ending with the variable's name
    reason: str
    hint: str


def _nowhere(name: str) -> str | None:
    return None


@dataclass(frozen=True, eq=False)
class Host:
    """One node: how to reach it, which groups it is in, and its merged variables."""

    name: str
    address: str
    port: int | None = None
    user: str | None = None
    key_file: str | None = None
    groups: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict)
    # Where the host was first defined (file and line), for `fleet hosts` and messages.
    origin: Origin | None = None
    # ssh options from ansible_ssh_*_args, in order, as (lowercase keyword, value): they win
    # over the ssh config's, as ssh's -o does.
    ssh_options: tuple[tuple[str, str], ...] = ()
    # Settings fleet will not act on (passwords, other connection types, ...): a run that
    # selects this host stops before connecting, naming where each was set.
    refusals: tuple[Refusal, ...] = ()
    # Where the value a var has for this host was written, `FILE:LINE: place` (never the
    # value), for an error about it; None when unknown (not from an inventory file). Looked up
    # only when an error needs it.
    var_origin: Callable[[str], str | None] = field(default=_nowhere, repr=False)

    @property
    def target(self) -> str:
        """`user@address:port` as an operator would type it, for messages."""
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        address = f"[{self.address}]" if port and ":" in self.address else self.address
        return f"{user}{address}{port}"
