"""Gather what the hosts printed: identical outputs once, under their folded host set.

What `clush -b` and `dshbak -c` do for pdsh users. Each host's output (every step's stdout and
stderr, in order) is compared whole, by a digest of everything it printed, so hosts are grouped
only when their outputs are byte for byte the same. Memory stays bounded on a fleet that floods:
a host's text is kept up to KEEP_BYTES (the digest still covers all of it), and once a host
finishes, its text is kept once per distinct output, not once per host.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.core.events import (
    Event,
    HostFinished,
    Line,
    OutputGroup,
    OutputLine,
    RunStarted,
    StepStarted,
)

KEEP_BYTES = 16 * 1024  # of one host's output, shown in its group; the rest is in the run record
KEEP_LINES = 200


@dataclass
class _Pending:
    """A host's output while it runs."""

    digest: Any = field(default_factory=hashlib.sha256)
    lines: list[Line] = field(default_factory=list)
    kept_bytes: int = 0
    more_lines: int = 0


@dataclass
class _Group:
    hosts: list[str]
    lines: tuple[Line, ...]
    more_lines: int


class Gatherer:
    """A run handler: folds OutputLine events per host, groups hosts as they finish."""

    def __init__(self) -> None:
        self.order: dict[str, int] = {}
        self.pending: dict[str, _Pending] = {}
        self.groups: dict[bytes, _Group] = {}
        self.silent: list[str] = []

    def handle(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.order = {h: i for i, h in enumerate(event.hosts)}
        elif isinstance(event, OutputLine):
            self._add(event.host, Line(event.step, event.stream, event.line))
        elif isinstance(event, StepStarted):
            self.pending.setdefault(event.host, _Pending()).digest.update(
                b"\x00step\x00" + event.step.encode("utf-8", "surrogateescape")
            )
        elif isinstance(event, HostFinished):
            self._finish(event.host)

    def close(self) -> None:
        return None

    def _add(self, host: str, line: Line) -> None:
        p = self.pending.setdefault(host, _Pending())
        raw = line.text.encode("utf-8", "surrogateescape")
        p.digest.update(f"\x00{line.stream}\x00{len(raw)}\x00".encode() + raw)
        if p.kept_bytes + len(raw) <= KEEP_BYTES and len(p.lines) < KEEP_LINES:
            p.lines.append(line)
            p.kept_bytes += len(raw)
        else:
            p.more_lines += 1

    def _finish(self, host: str) -> None:
        p = self.pending.pop(host, None)
        if p is None or (not p.lines and not p.more_lines):
            self.silent.append(host)
            return
        key = p.digest.digest()
        group = self.groups.get(key)
        if group is None:
            self.groups[key] = _Group([host], tuple(p.lines), p.more_lines)
        else:
            group.hosts.append(host)

    def result(self) -> tuple[OutputGroup, ...]:
        """The groups, most hosts first; ties in inventory order of their first host."""
        for host in list(self.pending):  # a run cut short: what they printed so far
            self._finish(host)
        rank = self.order.get
        groups = [
            OutputGroup(
                hosts=tuple(sorted(g.hosts, key=lambda h: rank(h, len(self.order)))),
                lines=g.lines,
                more_lines=g.more_lines,
            )
            for g in self.groups.values()
        ]
        groups.sort(key=lambda g: (-len(g.hosts), rank(g.hosts[0], len(self.order))))
        return tuple(groups)

    def silent_hosts(self) -> tuple[str, ...]:
        """Hosts that printed nothing, in inventory order."""
        return tuple(sorted(self.silent, key=lambda h: self.order.get(h, len(self.order))))


def per_host(groups: Sequence[OutputGroup], hosts: Sequence[str]) -> list[tuple[str, OutputGroup]]:
    """`--no-gather`: one block per host, in the run's host order, each with its own output."""
    rank = {h: i for i, h in enumerate(hosts)}
    out = [(h, g) for g in groups for h in g.hosts]
    return sorted(out, key=lambda pair: rank.get(pair[0], len(rank)))
