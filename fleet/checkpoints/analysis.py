"""Decisions on what the nodes hold: per tag, across nodes, is the checkpoint whole? Pure.

A ZeRO tag is whole when every (dp rank, mp rank) of the world its own shards state has a
readable model file and optim file, none truncated or corrupt, none from another run. The world
size is read, never guessed: rank 0's model file says it (else the files' common answer), and a
file whose world or step disagrees with it is stale, from another (older) save of the same tag.
A tag directory that no node holds any rank file of is pruned (the janitor's adapter-only runs
delete every shard as it appears): shown, not failed.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.checkpoints.node import Adapter, NodeScan, RankFile

TAG_DIR = re.compile(r"^global_step\d+$")
HF_DIR = re.compile(r"^checkpoint-\d+$")


@dataclass(frozen=True)
class TagReport:
    tag: str
    # "complete", "pruned", "incomplete", "writing"; "unknown": files missing from the nodes
    # read while a selected node was not read (they may be there), nothing else wrong
    status: str
    world_size: int | None
    holders: tuple[tuple[str, tuple[int, ...]], ...]  # host -> dp ranks it holds
    missing: tuple[str, ...]  # file names
    extra: tuple[str, ...]  # "host:path (why)"
    truncated: tuple[str, ...]
    corrupt: tuple[str, ...]
    unchecked: tuple[str, ...]  # host:path whose CRC was not checked
    writing: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.status in ("complete", "pruned")

    @property
    def missing_ranks(self) -> tuple[int, ...]:
        ranks = set()
        for name in self.missing:
            m = re.search(r"zero_pp_rank_(\d+)_", name)
            if m:
                ranks.add(int(m.group(1)))
        return tuple(sorted(ranks))


@dataclass(frozen=True)
class LatestReport:
    base: str  # the directory holding `latest`
    values: tuple[tuple[str, str], ...]  # host -> tag named
    problem: str | None


@dataclass(frozen=True)
class AdapterReport:
    path: str
    hosts: tuple[str, ...]
    tensors: int
    dtypes: tuple[str, ...]
    data_bytes: int
    target_modules: tuple[str, ...]
    problems: tuple[str, ...]  # each names its host and path


@dataclass(frozen=True)
class Audit:
    tags: tuple[TagReport, ...]
    latest: tuple[LatestReport, ...]
    adapters: tuple[AdapterReport, ...]
    scans: tuple[NodeScan, ...]

    @property
    def failures(self) -> int:
        return (
            sum(not t.ok for t in self.tags)
            + sum(lt.problem is not None for lt in self.latest)
            + sum(bool(a.problems) for a in self.adapters)
            + len(self.missing)
        )

    @property
    def missing(self) -> tuple[NodeScan, ...]:
        """The nodes that were read and had no output dir there: a per-host failure (a wrong
        --dir or host), never a whole checkpoint."""
        return tuple(s for s in self.scans if s.error is None and not s.exists)

    @property
    def read(self) -> tuple[NodeScan, ...]:
        """The nodes whose output dir was read: none, and the audit looked at nothing."""
        return tuple(s for s in self.scans if s.error is None and s.exists)


def missing_line(s: NodeScan) -> str:
    """One node without its output dir, as the janitor says it."""
    return f"{s.host}: {s.missing or 'no such directory'}: {s.directory} (wrong host or typo?)"


def audit(scans: Sequence[NodeScan]) -> Audit:
    readable = [s for s in scans if s.error is None and s.exists]
    unread = tuple(s.host for s in scans if s.error is not None)
    tags = sorted(_tag_dirs(readable))
    return Audit(
        tags=tuple(tag_report(tag, readable, unread) for tag in tags),
        latest=tuple(latest_reports(readable, unread)),
        adapters=tuple(adapter_reports(readable)),
        scans=tuple(scans),
    )


def _tag_dirs(scans: Sequence[NodeScan]) -> set[str]:
    """Directories holding rank files, named by a `latest`, or named like a DeepSpeed tag."""
    tags = {f.tag for s in scans for f in s.rank_files}
    for s in scans:
        dirs = {e.path for e in s.entries if e.kind == "dir"}
        tags |= {d for d in dirs if TAG_DIR.match(d.rsplit("/", 1)[-1])}
        tags |= {_join(base, value) for base, value in s.latest if _join(base, value) in dirs}
    return tags


def _join(base: str, name: str) -> str:
    return f"{base}/{name}" if base else name


def tag_report(tag: str, scans: Sequence[NodeScan], unread: Sequence[str] = ()) -> TagReport:
    files = [(s.host, f) for s in scans for f in s.rank_files if f.tag == tag]
    writing = tuple(f"{s.host}:{p}" for s in scans for p in s.writing if p.startswith(tag + "/"))
    if not files:
        return TagReport(tag, "pruned", None, (), (), (), (), (), (), writing)
    truncated = tuple(f"{h}:{f.path}" for h, f in files if _fault(f, "truncated"))
    corrupt = tuple(
        f"{h}:{f.path} ({f.fault})" for h, f in files if f.fault and not _fault(f, "truncated")
    )
    healthy = [(h, f) for h, f in files if f.fault is None and f.meta is not None]
    ref = _reference(healthy)
    world = ref.meta.dp_world_size if ref and ref.meta else None
    mp_world = (ref.meta.mp_world_size if ref and ref.meta else None) or 1
    extra: list[str] = []
    good: dict[tuple[int | None, int, str], tuple[str, RankFile]] = {}
    for host, f in healthy:
        why = _stale(f, ref, world, mp_world)
        key = (f.rank, f.mp_rank, f.kind)
        if why is None and key in good:
            if same_file(f, good[key][1]):
                continue  # one file every node sees: a shared output dir (NFS, Lustre)
            why = f"a second copy (also on {good[key][0]})"
        if why:
            extra.append(f"{host}:{f.path} ({why})")
        else:
            good[key] = (host, f)
    missing = _missing(tag, good, world, mp_world, files, _optim_files_expected(ref, files))
    holders: dict[str, set[int]] = {}
    for host, f in files:
        if f.rank is not None:
            holders.setdefault(host, set()).add(f.rank)
    unchecked = tuple(f"{h}:{f.path}" for h, f in files if f.crc != "ok" and f.fault is None)
    bad = missing or extra or truncated or corrupt or world is None
    status = "writing" if writing else "incomplete" if bad else "complete"
    if status == "incomplete" and missing and unread and not (extra or truncated or corrupt):
        status = "unknown"  # the missing files may be on a node that was not read
    return TagReport(
        tag,
        status,
        world,
        tuple((h, tuple(sorted(r))) for h, r in sorted(holders.items())),
        missing,
        tuple(extra),
        truncated,
        corrupt,
        unchecked,
        writing,
    )


def same_file(a: RankFile, b: RankFile) -> bool:
    """The same rank file seen by two nodes (a shared output dir), or an exact copy: same
    path, size and mtime. A copy that differs in any is a second copy, which one is right
    being unknown."""
    return (a.path, a.size, a.mtime) == (b.path, b.size, b.mtime)


def _fault(f: RankFile, kind: str) -> bool:
    return bool(f.fault and f.fault.startswith(kind))


def _reference(healthy: Sequence[tuple[str, RankFile]]) -> RankFile | None:
    """Rank 0's model file, else the model file whose world size most files share."""
    models = [f for _h, f in healthy if f.kind == "model" and f.meta and f.meta.dp_world_size]
    for f in models:
        if f.rank in (0, None) and f.mp_rank == 0:
            return f
    if not models:
        return None
    common = Counter(f.meta.dp_world_size for f in models if f.meta).most_common(1)[0][0]
    return next(f for f in models if f.meta and f.meta.dp_world_size == common)


def _stale(f: RankFile, ref: RankFile | None, world: int | None, mp_world: int) -> str | None:
    """Why a readable rank file is not part of the tag's run, or None."""
    if world is None or ref is None or ref.meta is None or f.meta is None:
        return None
    if f.rank is not None and f.rank >= world:
        return f"stale: rank {f.rank} of a {_run_of(f)} run; this tag's run has {world} ranks"
    if f.mp_rank >= mp_world:
        return f"stale: mp rank {f.mp_rank}; this tag's run has {mp_world}"
    size = f.meta.dp_world_size if f.kind == "model" else f.meta.partition_count
    if size is not None and size != world:
        return f"stale: from a run of {size} ranks; this tag's run has {world}"
    step, want = f.meta.global_steps, ref.meta.global_steps
    if f.kind == "model" and step is not None and want is not None and step != want:
        return f"stale: global_steps {step}, rank 0 has {want}"
    return None


def _optim_files_expected(ref: RankFile | None, files: Sequence[tuple[str, RankFile]]) -> bool:
    """ZeRO's per-rank optimizer files are part of the tag unless its model file carries the
    optimizer state itself (DeepSpeed without ZeRO) and no node holds any of them."""
    holds = bool(ref and ref.meta and ref.meta.holds_optimizer)
    return not holds or any(f.kind == "optim" for _h, f in files)


def _run_of(f: RankFile) -> str:
    size = f.meta.dp_world_size if f.meta and f.kind == "model" else None
    size = size or (f.meta.partition_count if f.meta else None)
    return f"{size}-rank" if size else "bigger"


def _missing(
    tag: str,
    good: dict[tuple[int | None, int, str], tuple[str, RankFile]],
    world: int | None,
    mp_world: int,
    files: Sequence[tuple[str, RankFile]],
    optim: bool = True,
) -> tuple[str, ...]:
    if world is None:
        return ()
    zero3 = any(f.rank is not None and f.kind == "model" for _h, f in files)
    prefix = "bf16_" if any(f.name.startswith("bf16_") for _h, f in files) else ""
    out = []
    for mp in range(mp_world):
        if not zero3 and (None, mp, "model") not in good:
            out.append(f"mp_rank_{mp:02d}_model_states.pt")
        for rank in range(world):
            if zero3 and (rank, mp, "model") not in good:
                out.append(f"zero_pp_rank_{rank}_mp_rank_{mp:02d}_model_states.pt")
            if optim and (rank, mp, "optim") not in good:
                out.append(f"{prefix}zero_pp_rank_{rank}_mp_rank_{mp:02d}_optim_states.pt")
    return tuple(out)


def latest_reports(scans: Sequence[NodeScan], unread: Sequence[str] = ()) -> list[LatestReport]:
    """Every `latest` must name the same tag on every node that has one, and that tag must be
    a directory on some node."""
    not_read = f" ({', '.join(unread)} not read)" if unread else ""
    by_base: dict[str, list[tuple[str, str]]] = {}
    dirs = {(e.path) for s in scans for e in s.entries if e.kind == "dir"}
    for s in scans:
        for base, value in s.latest:
            by_base.setdefault(base, []).append((s.host, value))
    out = []
    for base, values in sorted(by_base.items()):
        named = sorted({v for _h, v in values})
        problem = None
        if len(named) > 1:
            problem = "latest disagrees: " + ", ".join(f"{h} says {v!r}" for h, v in values)
        elif named and _join(base, named[0]) not in dirs:
            problem = f"latest names {named[0]!r}, which no node has under {base or '.'}{not_read}"
        out.append(LatestReport(base, tuple(values), problem))
    return out


def adapter_reports(scans: Sequence[NodeScan]) -> list[AdapterReport]:
    """One report per adapter path; a copy on several nodes must be the same bytes."""
    by_path: dict[str, list[tuple[str, Adapter]]] = {}
    for s in scans:
        for a in s.adapters:
            by_path.setdefault(a.path, []).append((s.host, a))
    out = []
    for path, copies in sorted(by_path.items()):
        problems = []
        for host, a in copies:
            if a.fault:
                problems.append(f"{host}:{path}: unreadable adapter: {a.fault}")
            elif a.header is not None and not a.header.tensors:
                problems.append(f"{host}:{path}: empty adapter: no tensors ({a.size} bytes)")
            elif a.header is not None and a.header.empty:
                problems.append(
                    f"{host}:{path}: empty adapter: all {len(a.header.tensors)} tensors have "
                    "zero elements (saved under ZeRO-3 without gathering?)"
                )
        digests = {a.sha256 for _h, a in copies}
        if len(digests) > 1:
            shown = ", ".join(f"{h} {a.sha256[:12]}" for h, a in copies)
            problems.append(f"{path}: copies differ across nodes: {shown}")
        first = next((a for _h, a in copies if a.header is not None), copies[0][1])
        header = first.header
        out.append(
            AdapterReport(
                path,
                tuple(h for h, _a in copies),
                len(header.tensors) if header else 0,
                header.dtypes if header else (),
                header.data_bytes if header else 0,
                first.target_modules,
                tuple(problems),
            )
        )
    return out


def size_text(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
