"""The audit on a terminal: per node, per tag, per adapter, then the failure lines.

Every name came from a node: it goes into rich `Text` (never markup) after safetext.clean.
"""

from __future__ import annotations

import re
from collections import defaultdict

from rich.table import Table
from rich.text import Text

from fleet.checkpoints.analysis import TAG_DIR, Audit, missing_line, size_text
from fleet.checkpoints.node import NodeScan
from fleet.core.safetext import clean
from fleet.output.console import Console

HF_DIR = re.compile(r"(^|/)checkpoint-\d+$")


def _t(text: str) -> Text:
    return Text(clean(text))


def print_audit(result: Audit, console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    console.print(_nodes_table(result.scans))
    if result.tags:
        console.print(_tags_table(result))
    if result.adapters:
        console.print(_adapters_table(result))
    for line in failure_lines(result):
        console.print(_t(line), style="red")
    console.print(_t(f"checkpoints: {verdict(result)}"))


def verdict(result: Audit) -> str:
    """The last line: whole, the problems, or that there was nothing to look at."""
    unreached = sum(1 for s in result.scans if s.error)
    if not result.read:
        dirs = sorted({s.directory for s in result.missing})
        nodes = "no node read" if unreached else "no node"
        what = dirs[0] if len(dirs) == 1 else "its output dir"
        said = f"nothing audited: {nodes} has {what}" if dirs else "nothing audited"
    elif result.failures:
        said = f"{result.failures} problem(s)"
    else:
        said = "every tag complete"
    if unreached:
        said += f"; {unreached} node(s) not read"
    return said


def _nodes_table(scans: tuple[NodeScan, ...]) -> Table:
    table = Table(box=None, pad_edge=False, title="nodes", title_justify="left")
    for col in ("host", "dir", "free", "checkpoint dirs", "files", "bytes", "being written"):
        table.add_column(col, overflow="fold")
    for s in scans:
        if s.error or not s.exists:
            table.add_row(_t(s.host), _t(s.directory), "-", _t(s.error or s.missing or "-"))
            continue
        files = [e for e in s.entries if e.kind == "file"]
        table.add_row(
            _t(s.host),
            _t(s.directory),
            size_text(s.free_bytes),
            _t(", ".join(checkpoint_dirs(s)) or "-"),
            str(len(files)),
            size_text(sum(e.size for e in files)),
            _t(", ".join(s.writing) or "-"),
        )
    return table


def checkpoint_dirs(s: NodeScan) -> list[str]:
    """DeepSpeed tags, HF Trainer checkpoint-N and Lightning .ckpt directories on the node."""
    tags = {f.tag for f in s.rank_files}
    found = set()
    for e in s.entries:
        if e.kind != "dir":
            continue
        name = e.path.rsplit("/", 1)[-1]
        if HF_DIR.search(e.path) or name.endswith(".ckpt") or e.path in tags or TAG_DIR.match(name):
            found.add(e.path)
    return sorted(found)


def _tags_table(result: Audit) -> Table:
    table = Table(box=None, pad_edge=False, title="tags", title_justify="left")
    for col in ("tag", "status", "world", "ranks per node", "problems"):
        table.add_column(col, overflow="fold")
    for t in result.tags:
        holders = "; ".join(f"{h}: {_ranks(r)}" for h, r in t.holders) or "-"
        problems = len(t.missing) + len(t.extra) + len(t.truncated) + len(t.corrupt)
        style = "green" if t.status == "complete" else "yellow" if t.ok else "red"
        table.add_row(
            _t(t.tag),
            Text(t.status, style=style),
            str(t.world_size or "?"),
            _t(holders),
            str(problems) if problems else "-",
        )
    return table


def _ranks(ranks: tuple[int, ...]) -> str:
    return ",".join(str(r) for r in ranks)


def _adapters_table(result: Audit) -> Table:
    table = Table(box=None, pad_edge=False, title="adapters", title_justify="left")
    for col in ("adapter", "nodes", "tensors", "dtypes", "bytes", "target_modules"):
        table.add_column(col, overflow="fold")
    for a in result.adapters:
        table.add_row(
            _t(a.path),
            _t(",".join(a.hosts)),
            str(a.tensors),
            _t(",".join(a.dtypes) or "-"),
            size_text(a.data_bytes),
            _t(",".join(a.target_modules) or "-"),
        )
    return table


def failure_lines(result: Audit) -> list[str]:
    """One line per problem, each naming what, where (host:path) and why."""
    lines = [missing_line(s) for s in result.missing]
    unread = ", ".join(s.host for s in result.scans if s.error)
    for t in result.tags:
        by: dict[str, list[str]] = defaultdict(list)
        by[f"not on the nodes read ({unread} not read)" if unread else "missing"] = list(t.missing)
        by["extra"] = list(t.extra)
        by["truncated"] = list(t.truncated)
        by["corrupt"] = list(t.corrupt)
        by["being written"] = list(t.writing)
        for what, names in by.items():
            lines.extend(f"{t.tag}: {what}: {n}" for n in names)
        if t.status == "incomplete" and t.world_size is None and not t.truncated:
            lines.append(f"{t.tag}: no readable model file states the world size")
    lines.extend(lt.problem for lt in result.latest if lt.problem)
    for a in result.adapters:
        lines.extend(a.problems)
    for s in result.scans:
        if s.truncated_listing:
            lines.append(f"{s.host}: listing cut at the entry limit under {s.directory}")
    return lines
