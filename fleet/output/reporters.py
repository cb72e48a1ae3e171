"""Turn events into what the operator sees: a live table, plain lines, or JSON lines.

The only module that imports rich. Reporters run on the main thread; the engine knows nothing of
the terminal.

Host names, step names, output lines, reasons and facts come from nodes, inventories and
playbooks: they are data. Every such string reaches rich as a `Text` (never parsed as markup) and
passes `safetext.clean` first (control characters shown escaped), in every reporter; the plain
writers clean it too. JSON lines stay raw: JSON escapes control characters itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fleet.core import nodeset
from fleet.core.events import (
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
from fleet.core.result import TAIL_LINE_MAX_BYTES
from fleet.core.safetext import clean
from fleet.node.runstate import NodeRun, RunState

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


def data(value: str, style: str = "") -> Text:
    """Foreign text for rich: a Text (rich never reads markup in one), controls escaped."""
    return Text(clean(value), style=style)


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
            view.state = "running"
        elif isinstance(event, StepStarted):
            view.state = "running"
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


class LiveReporter:
    """A rich live table, one row per host; beyond the screen height, counts plus the hosts that
    need attention (rich truncates a table taller than the terminal, PITFALLS 15)."""

    def __init__(
        self,
        console: Console,
        step_count: int,
        summary: bool = True,
        transient: bool = False,
        output: str = "last",
    ) -> None:
        self.console = console
        self.summary = summary
        self.output = output
        self.view = RunView(step_count=step_count)
        self.live = Live(
            console=console,
            refresh_per_second=4,
            transient=transient,
            get_renderable=self._render,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._shown = False  # started at the first event (the run's RunStarted), not here

    def handle(self, event: Event) -> None:
        if not self._shown:
            # Not when made: its refresh thread must not exist yet when a run forks its workers.
            self._shown = True
            self.live.start()
        self.view.apply(event)
        if isinstance(event, RunFinished):
            self.close()
            if self.summary:
                print_summary(self.console, event.summary, self.view, self.output)

    def close(self) -> None:
        """Leave the final table on screen: every node's row says how it ended."""
        if self.live.is_started:
            self.live.refresh()
            self.live.stop()

    def _render(self) -> Group:
        height = self.console.size.height
        views = list(self.view.hosts.values())
        counts = self.view.counts()
        header = Text.assemble(
            (clean(self.view.title), "bold"),
            "  ",
            *[(f"{state} {n}  ", STYLE.get(state, "")) for state, n in sorted(counts.items())],
        )
        room = max(3, height - 6)
        if len(views) > room:
            order = {
                "failed": 0,
                "timed_out": 0,
                "unreachable": 1,
                "cancelled": 2,
                "running": 3,
                "connecting": 4,
            }
            chosen = sorted((v for v in views if v.state in order), key=lambda v: order[v.state])
            shown = chosen[:room]
            more = len(views) - len(shown)
            table = self._table(shown)
            return Group(header, table, Text(f"... {more} more hosts not shown", style="dim"))
        return Group(header, self._table(views))

    def _table(self, views: Sequence[HostView]) -> Table:
        width = self.console.size.width
        table = Table(box=None, pad_edge=False, expand=False, show_edge=False)
        table.add_column("host", no_wrap=True)
        table.add_column("state", no_wrap=True)
        table.add_column("step", no_wrap=True, max_width=max(10, width // 4))
        table.add_column("elapsed", justify="right", no_wrap=True)
        table.add_column(
            "last output", no_wrap=True, overflow="ellipsis", max_width=max(10, width // 2)
        )
        for v in views:
            step = f"{v.step_index}/{self.view.step_count} {v.step}" if v.step else ""
            table.add_row(
                data(v.name),
                Text(v.state, style=STYLE.get(v.state, "")),
                data(step),
                Text(elapsed(v)),
                data(v.reason if v.state in {"unreachable"} else v.last_line),
            )
        return table


class PlainReporter:
    """One line per event, prefixed with the host: for logs, pipes and CI."""

    def __init__(
        self,
        out: IO[str],
        console: Console,
        verbose: bool = True,
        summary: bool = True,
        output: str = "last",
    ) -> None:
        self.out = out
        self.summary = summary
        # Every line is printed as it comes, host by host: only gathering adds to that.
        self.output = output if output in ("gather", "last") else "none"
        self.console = console
        self.verbose = verbose
        self.view = RunView()
        self.width = 0

    def _line(self, host: str, text: str) -> None:
        """`host | text`, both cleaned: one event is one line, with no terminal control."""
        self.out.write(f"{clean(host).ljust(self.width)} | {clean(text)}\n")
        self.out.flush()

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
            print_summary(self.console, event.summary, self.view, self.output)

    def close(self) -> None:
        self.out.flush()


class LinesReporter:
    """Only the hosts' output, `host | line`, then the hosts that failed (for `fleet logs`)."""

    def __init__(self, out: IO[str], console: Console) -> None:
        self.out = out
        self.console = console
        self.width = 0

    def handle(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.width = _name_width(event.hosts)
        elif isinstance(event, OutputLine):
            self.out.write(f"{clean(event.host).ljust(self.width)} | {clean(event.line)}\n")
            self.out.flush()
        elif isinstance(event, RunFinished):
            bad = [r for r in event.summary.results if r.outcome in ATTENTION]
            for r in bad:
                self.console.print(
                    data(f"{r.host}: {r.outcome.value}: {r.reason or ''}", style=STYLE[r.outcome])
                )

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
        self.out.flush()

    def close(self) -> None:
        self.out.flush()


LAST_LINE_GROUPS = 12  # distinct last lines listed under "last" before the rest are counted


def print_output(console: Console, summary: RunSummary, mode: str) -> None:
    """What the hosts printed: "gather" groups identical outputs under their folded host set
    (most hosts first), "per-host" prints each host's own; then the hosts that printed nothing."""
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
        console.print()
        for text in (rule, f"{title}{count}", rule):
            console.print(data(text, style="bold"), soft_wrap=True)
        multi_step = len({line.step for line in group.lines}) > 1
        step = None
        for line in group.lines:
            if multi_step and line.step != step:
                step = line.step
                console.print(data(f"[{step}]", style="dim"), soft_wrap=True)
            if line.stream == "stderr":
                console.print(data(f"! {line.text}", style="red"), soft_wrap=True)
            else:
                console.print(data(line.text), soft_wrap=True)
        if group.more_lines:
            where = f" (all of it: {summary.run_dir})" if summary.run_dir else ""
            console.print(data(f"... {group.more_lines} more lines{where}", style="dim"))
    if summary.silent and blocks:
        console.print()
        console.print(data(f"no output: {nodeset.fold(summary.silent)}", style="dim"))


def _print_last_lines(console: Console, summary: RunSummary, view: RunView) -> None:
    """The ok hosts folded by their last line: what each node reported it did (a cleanup's
    result line names no pid or path, so nodes that did the same fold into one host set).
    Never wrapped by rich: one line stays one line in a log or a pipe."""
    groups: dict[str, list[str]] = {}
    for name in summary.hosts_with(Outcome.OK):
        if name in view.hosts and view.hosts[name].last_line:
            groups.setdefault(view.hosts[name].last_line, []).append(name)
    if len(groups) == 1 and len(next(iter(groups.values()))) == len(summary.hosts_with(Outcome.OK)):
        only = next(iter(groups))
        console.print(
            data(f"{'':>11}        last line everywhere: {only}", style="dim"), soft_wrap=True
        )
        return
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    for line, names in ranked[:LAST_LINE_GROUPS]:
        console.print(
            data(f"{'':>11}  {len(names):>4}  {nodeset.fold(names)}: {line}", style="dim"),
            soft_wrap=True,
        )
    if len(ranked) > LAST_LINE_GROUPS:
        rest = sum(len(names) for _, names in ranked[LAST_LINE_GROUPS:])
        console.print(
            data(f"{'':>11}        ... {rest} more hosts with other last lines", style="dim")
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
    console: Console, summary: RunSummary, view: RunView | None = None, output: str = "last"
) -> None:
    """The hosts' output (print_output), then outcome per state with folded host sets (in "last"
    mode, the ok hosts folded by last line), then the failed hosts' step, code and stderr (or
    last line), hosts with the same failure folded."""
    print_output(console, summary, output)
    console.print()
    for outcome in Outcome:
        names = summary.hosts_with(outcome)
        if names:
            console.print(
                Text.assemble(
                    (f"{outcome.value:>11}", STYLE[outcome.value]),
                    f"  {len(names):>4}  {clean(nodeset.fold(names))}",
                )
            )
    if output == "last" and view is not None:
        _print_last_lines(console, summary, view)
    for (where, reason, lines), hosts in _failures(summary).items():
        console.print(
            Text.assemble(
                ("\n" + clean(nodeset.fold(hosts)), "bold"), clean(f": {where}: {reason}")
            ),
            soft_wrap=True,
        )
        for line in lines:
            console.print(data(f"    | {line}", style="dim"), soft_wrap=True)
    console.print(
        Text.assemble(
            ("\nexit ", "dim"),
            (str(int(summary.exit_code)), "bold"),
            (f"  ({summary.duration_s:.1f}s)", "dim"),
            (clean(f"  run record: {summary.run_dir}") if summary.run_dir else "", "dim"),
        )
    )


def _bytes(text: str | None) -> str:
    """12884901888 -> 12.0 GiB."""
    if not text or not text.isdigit():
        return "-"
    value = float(text)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return text


def _duration(text: str | None) -> str:
    """3725 -> 1:02:05."""
    if not text or not text.isdigit():
        return ""
    s = int(text)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


RUN_STYLE = {
    RunState.RUNNING: "green",
    RunState.FINISHED: "green",
    RunState.FAILED: "bold red",
    RunState.ORPHANED: "bold red",
    RunState.STOPPED: "yellow",
    RunState.NOT_STARTED: "dim",
    RunState.UNKNOWN: "bold magenta",
}
SHOW_LOG_TAIL = (RunState.FAILED, RunState.ORPHANED)  # a stop or a clean finish needs no reading
StatusRow = tuple[str, str, str, dict[str, str], NodeRun | None]


def print_status_table(console: Console, rows: Sequence[StatusRow]) -> None:
    """`fleet status`: one row per host (the run's state and the status playbook's facts), then
    the last log lines of every run that failed or left orphans, then one line per state."""
    runs = {r.run for *_, r in rows if r is not None and r.run}
    shared = runs.pop() if len(runs) == 1 else None
    if shared:
        console.print(Text.assemble(("run ", "dim"), (clean(shared), "bold")))
    table = Table(box=None, pad_edge=False)
    columns = ["host", "run"] + ([] if shared else ["id"])
    columns += ["pid", "uptime", "training", "gpus", "janitor", "free", "detail"]
    for col in columns:
        table.add_column(col, no_wrap=col != "detail")
    for host, outcome, reason, f, run in rows:
        if run is None:
            table.add_row(data(host), data(outcome, style=STYLE.get(outcome, "")), data(reason))
            continue
        gpus = f.get("gpus", "-")
        if gpus.isdigit() and gpus != "0":
            gpus = (
                f"{gpus} x {f.get('util_avg_pct', '?')}% "
                f"{f.get('mem_used_mib', '?')}/{f.get('mem_total_mib', '?')} MiB"
            )
        training = f.get("training", "-")
        cells: list[Text] = [data(host), Text(run.state.value, style=RUN_STYLE[run.state])]
        if not shared:
            cells.append(data(run.run or "-"))
        cells += [
            data(run.pid),
            Text(_duration(run.uptime_s)),
            data(training, style="yellow" if training not in ("0", "-") else ""),
            data(gpus),
            data(f.get("janitor", "-")),
            Text(_bytes(f.get("free_bytes"))),
            data(run.detail),
        ]
        table.add_row(*cells)
    console.print(table)
    for host, *_, run in rows:
        if run is not None and run.log_tail and run.state in SHOW_LOG_TAIL:
            console.print(
                Text.assemble((clean(host), "bold"), (f": {run.state.value}, last log lines:", ""))
            )
            for line in run.log_tail:
                console.print(data("    " + line), soft_wrap=True)
    by_state: dict[str, list[str]] = {}
    for host, outcome, _, _, run in rows:
        by_state.setdefault(run.state.value if run else outcome, []).append(host)
    for state, hosts in sorted(by_state.items(), key=lambda kv: -len(kv[1])):
        console.print(data(f"{state:>12}  {len(hosts):>4}  {nodeset.fold(hosts)}"))


WATCH_STATE_STYLE = {
    **{state.value: style for state, style in RUN_STYLE.items()},
    "connecting": "cyan",
    "no answer": "bold magenta",
    "lost": "bold magenta",
}
CHANGED_FOR_ROUNDS = 2  # a row stays highlighted this many refresh intervals after a change


def watch_table(views: Sequence[Any], title: str, now: float, interval_s: float) -> Group:
    """`fleet status --watch`: one row per node; a row whose state just changed is highlighted;
    beyond the screen, the nodes that need attention first."""
    table = Table(box=None, pad_edge=False)
    for col in ("host", "state", "run", "pid", "uptime", "training", "gpus", "janitor", "free"):
        table.add_column(col, no_wrap=True)
    table.add_column("last log line / detail", no_wrap=True, overflow="ellipsis", max_width=60)
    counts: dict[str, int] = {}
    for v in views:
        counts[v.state] = counts.get(v.state, 0) + 1
        f = v.facts
        run = v.run
        gpus = f.get("gpus", "-")
        if gpus.isdigit() and gpus != "0":
            gpus = (
                f"{gpus} x {f.get('util_avg_pct', '?')}% "
                f"{f.get('mem_used_mib', '?')}/{f.get('mem_total_mib', '?')} MiB"
            )
        changed = v.changed_at is not None and now - v.changed_at < CHANGED_FOR_ROUNDS * max(
            interval_s, 1.0
        )
        detail = v.reason or (run.detail if run and run.detail else "") or v.last_log
        table.add_row(
            data(v.name, style="reverse" if changed else ""),
            data(
                v.state, style=WATCH_STATE_STYLE.get(v.state, "") + (" reverse" if changed else "")
            ),
            data(run.run if run else ""),
            data(run.pid if run else ""),
            Text(_duration(run.uptime_s if run else "")),
            data(f.get("training", "-")),
            data(gpus),
            data(f.get("janitor", "-") + (f" ({f['deleted']} deleted)" if "deleted" in f else "")),
            Text(_bytes(f.get("free_bytes"))),
            data(detail),
        )
    header = Text.assemble(
        (clean(title), "bold"),
        "  ",
        *[(f"{s} {n}  ", WATCH_STATE_STYLE.get(s, "")) for s, n in sorted(counts.items())],
    )
    return Group(header, table)


class WatchScreen:
    """The watch table, redrawn in place on the terminal (rich Live)."""

    def __init__(self, title: str, interval_s: float) -> None:
        self.console = Console(highlight=False)
        self.title = title
        self.interval_s = interval_s
        self.live = Live(console=self.console, auto_refresh=False, transient=False)

    def __enter__(self) -> WatchScreen:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()

    def update(self, views: Sequence[Any]) -> None:
        height = self.console.size.height
        room = max(3, height - 4)
        if len(views) > room:  # the nodes that need attention first, then the rest in order
            calm = ("running", "finished")
            views = sorted(views, key=lambda v: v.state in calm)[:room]
        self.live.update(
            watch_table(views, self.title, time.monotonic(), self.interval_s), refresh=True
        )


class StatusChanges:
    """Off a terminal (or --plain/--json): one line per node whose state changed."""

    def __init__(self, out: IO[str], as_json: bool = False) -> None:
        self.out = out
        self.as_json = as_json
        self.seen: dict[str, tuple[str, str]] = {}

    def handle(self, views: Sequence[Any]) -> None:
        for v in views:
            key = (v.state, v.reason)
            if self.seen.get(v.name) == key or v.state == "connecting":
                continue
            self.seen[v.name] = key
            detail = v.reason or (v.run.detail if v.run else "")
            if self.as_json:
                doc = {"event": "NodeState", "ts": time.time(), "host": v.name, "state": v.state}
                doc.update(detail=detail, run=v.run.to_dict() if v.run else None, facts=v.facts)
                self.out.write(json.dumps(doc) + "\n")
            else:
                stamp = time.strftime("%H:%M:%S")
                line = f"{stamp} {v.name} {v.state}" + (f": {detail}" if detail else "")
                self.out.write(clean(line) + "\n")
        self.out.flush()
