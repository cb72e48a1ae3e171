"""The live table of a push or pull: fleet's own (fleet.output.reporters.LiveReporter) with bytes,
rate and time left per host, and a line for all hosts together."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from fleet.core.events import Event
from fleet.core.result import size_text
from fleet.output.plain import STYLE, HostView, elapsed
from fleet.output.reporters import LiveReporter, data, keep, one_line
from fleet.transfer.events import TransferPlanned, TransferProgress


def eta_text(seconds: float | None) -> str:
    """12 -> 0:12, 3725 -> 1:02:05; unknown: -."""
    if seconds is None:
        return "-"
    s = int(seconds)
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


def rate_text(bps: float) -> str:
    return f"{size_text(int(bps))}/s"


class TransferLiveReporter(LiveReporter):
    """LiveReporter, plus TransferPlanned/TransferProgress folded into per-host byte counts."""

    def handle(self, event: Event) -> None:
        if isinstance(event, (TransferPlanned, TransferProgress)):
            self._progress(event)
        super().handle(event)

    def _progress(self, event: TransferPlanned | TransferProgress) -> None:
        if not hasattr(self, "moved"):
            self.moved: dict[str, TransferProgress] = {}
            self.planned: dict[str, int] = {}
        if isinstance(event, TransferPlanned):
            self.planned[event.host] = event.total_bytes
        else:
            self.moved[event.host] = event

    def _render(self) -> Group:
        group = super()._render()
        moved = getattr(self, "moved", {})
        total = sum(getattr(self, "planned", {}).values())
        done = sum(p.done_bytes for p in moved.values())
        # hosts still moving: a finished host's average would inflate the rate
        rate = sum(p.rate_bps for p in moved.values() if p.done_bytes < p.total_bytes)
        eta = (total - done) / rate if rate > 0 else None
        line = Text(
            f"all hosts: {size_text(done)} of {size_text(total)}  {rate_text(rate)}  "
            f"left {eta_text(eta)}",
            style="bold",
        )
        return Group(line, *group.renderables)

    def _table(self, views: Sequence[HostView]) -> Table:
        moved = getattr(self, "moved", {})
        table = Table(box=None, pad_edge=False, expand=False, show_edge=False)
        # The host and its state keep their width on a narrow terminal; the rest yield, cut.
        keep(table, "host", [v.name for v in views])
        keep(table, "state", [v.state for v in views])
        table.columns[-1].justify = "right"
        for col in ("moved", "rate", "left", "elapsed"):
            table.add_column(one_line(Text(col)), justify="right")
        width = self.console.size.width
        table.add_column(one_line(Text("last file")), max_width=max(10, width // 2))
        for v in views:
            p = moved.get(v.name)
            table.add_row(
                data(v.name),
                Text(v.state, style=STYLE.get(v.state, "")),
                *map(
                    one_line,
                    (
                        Text(f"{size_text(p.done_bytes)}/{size_text(p.total_bytes)}" if p else ""),
                        Text(rate_text(p.rate_bps) if p else ""),
                        Text(eta_text(p.eta_s) if p and v.state == "running" else ""),
                        Text(elapsed(v)),
                        data(v.reason if v.state == "unreachable" else v.last_line),
                    ),
                ),
            )
        return table
