"""Reports that need no terminal library: the per-host view of a run, the plain, lines and JSON
reporters, and the run's summary, written line by line through a `Printer`.

Off a terminal (a pipe, a log, CI) fleet writes these as plain text (`TextPrinter`) and never
loads rich (~20 ms of every such command's start); on a terminal, fleet.output.reporters hands
them a printer onto rich's console, for styles. Either way every piece of text passes
`safetext.clean` (control characters shown escaped) and nothing is read as markup: host names,
steps, reasons and output lines come from nodes, inventories and playbooks, and are data.

The reporters write into their stream's buffer and flush it when the engine says (flush(), within
0.05 s of an event: fleet/core/flushing.py) and at close, not once per line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Protocol

from fleet.core import nodeset
from fleet.core.events import (
    GAP,
    Event,
    HostConnected,
    HostConnecting,
    HostFinished,
    Outcome,
    OutputLine,
    RunFinished,
    RunStarted,
    RunSummary,
    StepFinished,
    StepStarted,
)
from fleet.core.result import LINE_MAX_BYTES, TAIL_LINE_MAX_BYTES
from fleet.core.safetext import clean

Segment = str | tuple[str, str]  # text, or (text, style): a style is rich's ("bold red")


class Printer(Protocol):
    """Where a report's lines go."""

    def line(self, *segments: Segment, wrap: bool = False) -> None:
        """One line made of `segments`, each cleaned, styled where styles can show; `wrap`: it
        may be wrapped at a terminal's width (else it stays one line however long)."""


def cleaned(segments: Sequence[Segment]) -> list[tuple[str, str]]:
    """Each segment as (text, style), its text cleaned (controls shown escaped)."""
    return [(clean(s), "") if isinstance(s, str) else (clean(s[0]), s[1]) for s in segments]


class TextPrinter:
    """Lines as plain text: no styles, no terminal control, never wrapped (a pipe or a log keeps
    one line as one line)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def line(self, *segments: Segment, wrap: bool = False) -> None:
        self.out.write("".join(text for text, _style in cleaned(segments)) + "\n")


STYLE = {
    "pending": "dim",
    "connecting": "cyan",
    "running": "yellow",
    "ok": "green",
    "failed": "bold red",
    "unreachable": "bold magenta",
    "timed_out": "bold red",
    "skipped": "dim",
    "cancelled": "yellow",
}
ATTENTION = (Outcome.FAILED, Outcome.UNREACHABLE, Outcome.TIMED_OUT, Outcome.CANCELLED)


class Reporter(Protocol):
    """Receives every event on the main thread."""

    def handle(self, event: Event) -> None: ...

    def close(self) -> None: ...


@dataclass
class HostView:
    """What the table shows for one host."""

    name: str
    state: str = "pending"
    step: str = ""
    step_index: int = 0
    started: float | None = None
    ended: float | None = None
    last_line: str = ""
    reason: str = ""


@dataclass
class RunView:
    """Per-host state rebuilt from events; shared by the live table and the final summary."""

    hosts: dict[str, HostView] = field(default_factory=dict)
    step_count: int = 0
    title: str = ""

    def apply(self, event: Event) -> None:
        """Fold one event into the view."""
        if isinstance(event, RunStarted):
            self.hosts = {h: HostView(h) for h in event.hosts}
            self.title = f"{event.playbook} on {len(event.hosts)} hosts"
            return
        name = getattr(event, "host", None)
        view = self.hosts.get(name) if isinstance(name, str) else None
        if view is None:
            return
        now = time.monotonic()
        if isinstance(event, HostConnecting):
            view.state = "connecting"
            view.started = view.started or now
            view.last_line = f"attempt {event.attempt}" if event.attempt > 1 else ""
        elif isinstance(event, HostConnected):
            # A warm connection is said without HostConnecting first: its time starts here.
            view.state = "running"
            view.started = view.started or now
        elif isinstance(event, StepStarted):
            view.state = "running"
            view.started = view.started or now
            view.step = event.step
            view.step_index = event.index + 1
        elif isinstance(event, OutputLine) and event.line.strip():
            # Kept per host until the run ends: cut like the tails (a line may be 16 KiB).
            view.last_line = event.line.strip()[:TAIL_LINE_MAX_BYTES]
        elif isinstance(event, HostFinished):
            view.state = event.outcome.value
            view.ended = now
            view.reason = event.reason or ""
            if event.outcome is Outcome.OK:
                view.step = ""
            view.last_line = event.last_line or view.last_line

    def counts(self) -> dict[str, int]:
        """Hosts per state, for the compact view."""
        out: dict[str, int] = {}
        for v in self.hosts.values():
            out[v.state] = out.get(v.state, 0) + 1
        return out


def elapsed(view: HostView) -> str:
    if view.started is None:
        return ""
    end = view.ended or time.monotonic()
    return f"{end - view.started:5.1f}s"


class PlainReporter:
    """One line per event, prefixed with the host: for logs, pipes and CI."""

    def __init__(
        self,
        out: IO[str],
        printer: Printer,
        verbose: bool = True,
        summary: bool = True,
        output: str = "last",
    ) -> None:
        self.out = out
        self.summary = summary
        # Every line is printed as it comes, host by host: only gathering adds to that.
        self.output = output if output in ("gather", "last") else "none"
        self.printer = printer
        self.verbose = verbose
        self.view = RunView()
        self.width = 0

    def _line(self, host: str, text: str) -> None:
        """`host | text`, both cleaned: one event is one line, with no terminal control."""
        self.out.write(f"{clean(host).ljust(self.width)} | {clean(text)}\n")

    def handle(self, event: Event) -> None:
        self.view.apply(event)
        if isinstance(event, RunStarted):
            self.width = _name_width(event.hosts)
            header = (
                f"fleet: {event.playbook} on {nodeset.fold(event.hosts)} "
                f"({len(event.hosts)} host{'' if len(event.hosts) == 1 else 's'}, "
                f"{event.forks} at a time)"
            )
            self.out.write(clean(header) + "\n")
        elif isinstance(event, HostConnecting) and event.attempt > 1:
            self._line(event.host, f"connecting (attempt {event.attempt})")
        elif isinstance(event, StepStarted):
            self._line(event.host, f"> {event.step}")
        elif isinstance(event, OutputLine) and self.verbose:
            self._line(
                event.host, f"  {event.line}" if event.stream == "stdout" else f"! {event.line}"
            )
        elif isinstance(event, StepFinished):
            status = (
                "timed out"
                if event.timed_out
                else "cancelled"
                if event.cancelled
                else f"exit {event.exit_code}"
            )
            self._line(event.host, f"< {event.step}: {status} ({event.duration_s:.1f}s)")
        elif isinstance(event, HostFinished):
            why = f": {event.reason}" if event.reason else ""
            self._line(event.host, f"= {event.outcome.value}{why}")
        elif isinstance(event, RunFinished) and self.summary:
            print_summary(self.printer, event.summary, self.view, self.output)

    def flush(self) -> None:
        """Lines are written together, within FLUSH_S of their event (fleet/core/flushing.py)."""
        self.out.flush()

    def close(self) -> None:
        self.out.flush()


class LinesReporter:
    """Only the hosts' output, `host | line`, then the hosts that failed (for `fleet logs`)."""

    def __init__(self, out: IO[str], printer: Printer) -> None:
        self.out = out
        self.printer = printer
        self.width = 0

    def handle(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.width = _name_width(event.hosts)
        elif isinstance(event, OutputLine):
            self.out.write(f"{clean(event.host).ljust(self.width)} | {clean(event.line)}\n")
        elif isinstance(event, RunFinished):
            bad = [r for r in event.summary.results if r.outcome in ATTENTION]
            for r in bad:
                self.printer.line(
                    (f"{r.host}: {r.outcome.value}: {r.reason or ''}", STYLE[r.outcome]), wrap=True
                )

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        self.out.flush()


def _name_width(hosts: Sequence[str]) -> int:
    """Width of the host column: the longest name as printed (escapes included)."""
    return max((len(clean(h)) for h in hosts), default=0)


class JsonReporter:
    """JSON lines: one object per event, then the summary (for `jq`)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def handle(self, event: Event) -> None:
        self.out.write(json.dumps(event.to_dict(), default=str) + "\n")

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        self.out.flush()


LAST_LINE_GROUPS = 12  # distinct last lines listed under "last" before the rest are counted


# Every line a node printed is shown after a gutter, so that no node line can pose as fleet's
# own (a block's rule and title, a step, a gap, "no output"): those start at the margin.
STDOUT_GUTTER = "  | "
STDERR_GUTTER = "  ! "


def print_output(printer: Printer, summary: RunSummary, mode: str) -> None:
    """What the hosts printed: "gather" groups identical outputs under their folded host set
    (most hosts first), "per-host" prints each host's own; then the hosts that printed nothing.
    Node lines behind a gutter (`  | `, stderr `  ! `); fleet's own lines at the margin."""
    from fleet.output.gather import per_host

    if mode == "gather":
        blocks = [(g.folded, g) for g in summary.output]
    elif mode == "per-host":
        blocks = per_host(summary.output, [r.host for r in summary.results])
    else:
        return
    for title, group in blocks:
        count = f" ({len(group.hosts)})" if mode == "gather" else ""
        rule = "-" * min(max(len(clean(title)) + len(count), 15), 78)
        printer.line()
        for text in (rule, f"{title}{count}", rule):
            printer.line((text, "bold"))
        multi_step = len({line.step for line in group.lines}) > 1
        step = None
        for line in group.lines:
            if multi_step and line.step != step:
                step = line.step
                printer.line((f"[{step}]", "dim"))
            if line.stream == GAP:
                printer.line((f"  [... {line.text} ...]", "dim"))
            elif line.stream == "stderr":
                printer.line((f"{STDERR_GUTTER}{line.text}", "red"))
            else:
                printer.line(STDOUT_GUTTER + line.text)
        if group.more_lines:
            printer.line((more_lines_text(group.more_lines, summary.run_dir), "dim"), wrap=True)
    if summary.silent and blocks:
        printer.line()
        printer.line((f"no output: {nodeset.fold(summary.silent)}", "dim"), wrap=True)


def more_lines_text(count: int, run_dir: str | None) -> str:
    """The note under a group cut short, true to what the run record holds: every line, but
    each cut at 16 KiB (and a host's log past 64 MB keeps only its end)."""
    lines = f"{count} more line{'' if count == 1 else 's'}"
    if not run_dir:
        return f"... {lines}"
    cut = f"each line cut at {LINE_MAX_BYTES // 1024} KiB"
    return f"... {lines} in the run record ({cut}): {run_dir}"


def _print_last_lines(printer: Printer, summary: RunSummary, view: RunView) -> None:
    """The ok hosts folded by their last line: what each node reported it did (a cleanup's
    result line names no pid or path, so nodes that did the same fold into one host set).
    Never wrapped by rich: one line stays one line in a log or a pipe."""
    groups: dict[str, list[str]] = {}
    for name in summary.hosts_with(Outcome.OK):
        if name in view.hosts and view.hosts[name].last_line:
            groups.setdefault(view.hosts[name].last_line, []).append(name)
    if len(groups) == 1 and len(next(iter(groups.values()))) == len(summary.hosts_with(Outcome.OK)):
        only = next(iter(groups))
        printer.line((f"{'':>11}        last line everywhere: {only}", "dim"))
        return
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    for line, names in ranked[:LAST_LINE_GROUPS]:
        printer.line((f"{'':>11}  {len(names):>4}  {nodeset.fold(names)}: {line}", "dim"))
    if len(ranked) > LAST_LINE_GROUPS:
        rest = sum(len(names) for _, names in ranked[LAST_LINE_GROUPS:])
        printer.line(
            (f"{'':>11}        ... {rest} more hosts with other last lines", "dim"), wrap=True
        )


def _failures(summary: RunSummary) -> dict[tuple[str, str, tuple[str, ...]], list[str]]:
    """The hosts that need attention, folded: those that failed in the same step, for the same
    reason, with the same last lines (stderr, else the last output line: a cleanup's result)
    share one block. In the run's host order."""
    out: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for result in summary.results:
        if result.outcome not in ATTENTION:
            continue
        where = f"step '{result.failed_step}'" if result.failed_step else "connect"
        lines = list(result.stderr_tail) or ([result.last_line] if result.last_line else [])
        out.setdefault((where, result.reason or "", tuple(lines[-5:])), []).append(result.host)
    return out


def print_summary(
    printer: Printer, summary: RunSummary, view: RunView | None = None, output: str = "last"
) -> None:
    """The hosts' output (print_output), then outcome per state with folded host sets (in "last"
    mode, the ok hosts folded by last line), then the failed hosts' step, code and stderr (or
    last line), hosts with the same failure folded."""
    print_output(printer, summary, output)
    printer.line()
    for outcome in Outcome:
        names = summary.hosts_with(outcome)
        if names:
            printer.line(
                (f"{outcome.value:>11}", STYLE[outcome.value]),
                f"  {len(names):>4}  {nodeset.fold(names)}",
                wrap=True,
            )
    if output == "last" and view is not None:
        _print_last_lines(printer, summary, view)
    for (where, reason, lines), hosts in _failures(summary).items():
        printer.line()
        printer.line((nodeset.fold(hosts), "bold"), f": {where}: {reason}")
        for line in lines:
            printer.line((f"    | {line}", "dim"))
    printer.line()
    printer.line(
        ("exit ", "dim"),
        (str(int(summary.exit_code)), "bold"),
        (f"  ({summary.duration_s:.1f}s)", "dim"),
        (f"  run record: {summary.run_dir}" if summary.run_dir else "", "dim"),
        wrap=True,
    )
