"""Gather what the hosts printed: identical outputs once, under their folded host set.

What `clush -b` and `dshbak -c` do for pdsh users. Each host's output (every step's stdout and
stderr, in order) is compared whole, by a digest of everything it printed, so hosts are grouped
only when their outputs are byte for byte the same. Memory stays bounded on a fleet that floods:
a host's text is kept up to KEEP_BYTES (the digest still covers all of it), and once a host
finishes, its text is kept once per distinct output, not once per host.

A line that does not fit (a 16 KiB line once others were kept) is never dropped silently: the
lines left out between kept ones become one gap marker where they were (a Line on stream GAP),
so what is shown never reads as if two lines were adjacent when they were not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.core.events import (
    GAP,
    Event,
    HostFinished,
    Line,
    OutputGroup,
    OutputLine,
    RunStarted,
    StepStarted,
)
from fleet.core.result import size_text

KEEP_BYTES = 16 * 1024  # of one host's output, shown in its group; the rest is in the run record
KEEP_LINES = 200  # lines and gap markers


@dataclass
class _Gap:
    """Lines left out between kept ones, while the host runs."""

    step: str
    lines: int = 0
    bytes: int = 0

    def line(self) -> Line:
        return Line(self.step, GAP, gap_text(self.lines, self.bytes))


def gap_text(lines: int, size: int) -> str:
    """What a gap marker says: `1 line not shown: 16.4 kB`."""
    return f"{lines} line{'' if lines == 1 else 's'} not shown: {size_text(size)}"


@dataclass
class _Pending:
    """A host's output while it runs."""

    digest: Any = field(default_factory=hashlib.sha256)
    lines: list[Line | _Gap] = field(default_factory=list)
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
        if len(p.lines) >= KEEP_LINES:
            p.more_lines += 1  # the rest, counted at the end
        elif p.kept_bytes + len(raw) <= KEEP_BYTES:
            p.lines.append(line)
            p.kept_bytes += len(raw)
        else:  # left out here: said here (a later, shorter line may still fit)
            gap = p.lines[-1] if p.lines and isinstance(p.lines[-1], _Gap) else None
            if gap is None:
                gap = _Gap(line.step)
                p.lines.append(gap)
            gap.lines += 1
            gap.bytes += len(raw)

    def _finish(self, host: str) -> None:
        p = self.pending.pop(host, None)
        if p is None or (not p.lines and not p.more_lines):
            self.silent.append(host)
            return
        key = p.digest.digest()
        group = self.groups.get(key)
        if group is None:
            lines, more = p.lines, p.more_lines
            last = lines[-1] if lines else None
            if isinstance(last, _Gap):  # nothing shown after it: counted with the rest
                lines.pop()
                more += last.lines
            kept = tuple(ln.line() if isinstance(ln, _Gap) else ln for ln in lines)
            self.groups[key] = _Group([host], kept, more)
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
