"""What the operator sees on a terminal: the live table of a run, the status and watch tables,
and a printer onto rich's console for the reports of fleet.output.plain.

The only module of the output that imports rich (fleet.output.plain's reports reach it through
ConsolePrinter); a run whose output is not a terminal never loads it. Reporters run on the main
thread; the engine knows nothing of the terminal.

Host names, step names, output lines, reasons and facts come from nodes, inventories and
playbooks: they are data. Every such string reaches rich as a `Text` (never parsed as markup) and
passes `safetext.clean` first (control characters shown escaped); StatusChanges, the one plain
writer here, cleans it too. JSON lines stay raw: JSON escapes control characters itself.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

from rich.cells import cell_len
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fleet.core import nodeset
from fleet.core.digits import is_digits
from fleet.core.events import Event, RunFinished
from fleet.core.safetext import clean
from fleet.node.runstate import NodeRun, RunState
from fleet.output.console import Console
from fleet.output.plain import (
    STYLE,
    HostView,
    RunView,
    Segment,
    cleaned,
    elapsed,
    print_summary,
)


def data(value: str, style: str = "") -> Text:
    """Foreign text for rich: a Text (rich never reads markup in one), controls escaped."""
    return Text(clean(value), style=style)


class ConsolePrinter:
    """fleet.output.plain's Printer onto a rich console: the same lines, styled."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def line(self, *segments: Segment, wrap: bool = False) -> None:
        self.console.print(Text.assemble(*cleaned(segments)), soft_wrap=not wrap)


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
                print_summary(ConsolePrinter(self.console), event.summary, self.view, self.output)

    @contextmanager
    def aside(self) -> Iterator[None]:
        """While the block runs, the lines it writes to stderr are printed above the table when
        stderr is the table's terminal (the first Ctrl-C's "cancelling" line). Written where the
        cursor is, below the table, the next refresh would erase them: it clears as many lines
        upwards as the table had, so the operator never read them and the table's top was left
        on screen twice."""
        live = self.live.is_started and self.console.is_interactive
        if not (live and _same_file(sys.stderr, self.console.file)):
            yield
            return
        stderr = sys.stderr
        above = _Above(self.console, stderr)
        sys.stderr = above
        try:
            yield
        finally:
            sys.stderr = stderr
            above.flush()

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
        # On a narrow terminal (a split pane) the host and its state are what the operator must
        # read: they keep their width, as in watch_table, and the other columns yield, each cell
        # one line cut with an ellipsis (rich shrinks only columns that may wrap; with none, it
        # cut every column alike, the host names to "nod…").
        keep(table, "host", [v.name for v in views])
        keep(table, "state", [v.state for v in views])
        table.add_column(one_line(Text("step")), max_width=max(10, width // 4))
        table.add_column(one_line(Text("elapsed")), justify="right")
        table.add_column(one_line(Text("last output")), max_width=max(10, width // 2))
        for v in views:
            step = f"{v.step_index}/{self.view.step_count} {v.step}" if v.step else ""
            table.add_row(
                data(v.name),
                Text(v.state, style=STYLE.get(v.state, "")),
                one_line(data(step)),
                one_line(Text(elapsed(v))),
                one_line(data(v.reason if v.state in {"unreachable"} else v.last_line)),
            )
        return table


def _same_file(one: IO[str], other: IO[str]) -> bool:
    """Whether two streams write to the same file (stdout and stderr on one terminal)."""
    if one is other:
        return True
    try:
        return os.path.samestat(os.fstat(one.fileno()), os.fstat(other.fileno()))
    except (AttributeError, OSError, ValueError):  # no file behind one of them
        return False


class _Above(io.TextIOBase):
    """stderr while a live table is drawn on the same terminal: each line written to it is
    printed through the table's console, which puts it above the table (as data: a Text)."""

    def __init__(self, console: Console, stream: IO[str]) -> None:
        self.console = console
        self.stream = stream
        self.pending = ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.console.print(data(line), soft_wrap=True)
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.console.print(data(self.pending), soft_wrap=True)
            self.pending = ""

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()


def _bytes(text: str | None) -> str:
    """12884901888 -> 12.0 GiB."""
    if not text or not is_digits(text):
        return "-"
    value = float(text)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return text


def _duration(text: str | None) -> str:
    """3725 -> 1:02:05."""
    if not text or not is_digits(text):
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
        if is_digits(gpus) and gpus != "0":
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
            # a step that did not end well (a hung `disk`) says so beside the run's own detail
            data("; ".join(d for d in (run.detail, "" if outcome == "ok" else reason) if d)),
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
    # On a narrow terminal the host and its state are what the operator must read: they never
    # shrink below their content. The other columns yield, the widest (the detail) first: rich
    # shrinks only columns that may wrap (else it cuts every column alike, the host's too), so
    # they are declared so, while each of their cells stays one line, cut with an ellipsis.
    keep(table, "host", [v.name for v in views])
    keep(table, "state", [v.state for v in views])
    for col in ("run", "pid", "uptime", "training", "gpus", "janitor", "free"):
        table.add_column(one_line(Text(col)))
    table.add_column(one_line(Text("last log line / detail")), max_width=60)
    counts: dict[str, int] = {}
    for v in views:
        counts[v.state] = counts.get(v.state, 0) + 1
        f = v.facts
        run = v.run
        gpus = f.get("gpus", "-")
        if is_digits(gpus) and gpus != "0":
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
            *(
                one_line(cell)
                for cell in (
                    data(run.run if run else ""),
                    data(run.pid if run else ""),
                    Text(_duration(run.uptime_s if run else "")),
                    data(f.get("training", "-")),
                    data(gpus),
                    data(
                        f.get("janitor", "-")
                        + (f" ({f['deleted']} deleted)" if "deleted" in f else "")
                    ),
                    Text(_bytes(f.get("free_bytes"))),
                    data(detail),
                )
            ),
        )
    header = Text.assemble(
        (clean(title), "bold"),
        "  ",
        *[(f"{s} {n}  ", WATCH_STATE_STYLE.get(s, "")) for s, n in sorted(counts.items())],
    )
    return Group(header, table)


def keep(table: Table, column: str, texts: Sequence[str]) -> None:
    """A column that never shrinks below its widest cell as shown (escapes included), one line
    each: what the operator must read on a narrow terminal (host names, states)."""
    widest = max(cell_len(clean(text)) for text in [column, *texts])
    table.add_column(column, no_wrap=True, min_width=widest)


def one_line(cell: Text) -> Text:
    """A cell that never wraps: cut at its column's width, with an ellipsis."""
    cell.no_wrap = True
    cell.overflow = "ellipsis"
    return cell


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
