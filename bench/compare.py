"""The comparison: every tool x size x workload cell, its runs, its summary, the targets."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import log
from bench.ghosts import plant_all, reset_nodes, verify_clean
from bench.measure import Cgroup, measure
from bench.tools import MAX_RUNS, NO_BUDGET, TOOLS, Ctx


@dataclass
class Cell:
    tool: str
    n: int
    workload: str
    forks: int
    argv: list[str] = field(default_factory=list)
    env_extra: dict[str, str] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None
    done: bool = False

    def ok_samples(self) -> list[dict[str, Any]]:
        return [s for s in self.samples if s["rc"] == 0 and not s["timed_out"]]


def run_size(
    ctx: Ctx,
    tools: list[str],
    workloads: list[str],
    runs: int,
    min_runs: int,
    cell_budget_s: float,
    timeout_s: float,
    cgroup: Cgroup,
    raw_dir: Path,
    unavailable: dict[str, str],
) -> list[Cell]:
    cells: list[Cell] = []
    nodes = ctx.box.nodes()
    for workload in workloads:
        active: list[tuple[Cell, list[str], dict[str, str]]] = []
        for name in tools:
            cell = Cell(tool=name, n=ctx.n, workload=workload, forks=ctx.forks)
            cells.append(cell)
            if name in unavailable:
                cell.skipped, cell.done = unavailable[name], True
                continue
            built = TOOLS[name].command(ctx, workload)
            if built is None:
                cells.pop()
                continue
            argv, env = built
            cell.argv = argv
            cell.env_extra = {k: v for k, v in env.items() if ctx.env.get(k) != v}
            active.append((cell, argv, env))
        for rep in range(runs):
            order = active[rep % len(active) :] + active[: rep % len(active)] if active else []
            for cell, argv, env in order:
                if cell.done:
                    continue
                if workload == "cleanup":
                    plant_all(ctx.box, nodes)
                label = f"{cell.tool}-{ctx.n}-{workload}"
                sample = measure(argv, env, timeout_s, cgroup, raw_dir, label, ctx.node_cpu)
                if workload == "cleanup":
                    sample["verify"] = verify_clean(ctx.box, nodes)
                cell.samples.append(sample)
                status = "ok" if sample["rc"] == 0 else f"rc={sample['rc']}"
                if sample["timed_out"]:
                    status = "TIMEOUT"
                extra = ""
                if "verify" in sample:
                    extra = f" clean {sample['verify']['clean_nodes']}/{ctx.n}"
                log(
                    f"  N={ctx.n:<4} {workload:<7} {cell.tool:<13} run {len(cell.samples)}: "
                    f"{sample['wall_s']:7.2f}s wall {sample['cpu_s']:6.2f}s cpu "
                    f"{sample['node_cpu_s']}s node cpu "
                    f"{sample.get('max_rss_mib')} MiB {status}{extra}"
                )
                walls = [s["wall_s"] for s in cell.samples]
                failures = len(cell.samples) - len(cell.ok_samples())
                if (
                    len(cell.samples) >= min(runs, MAX_RUNS.get(cell.tool, runs))
                    or failures >= 2
                    or sample["timed_out"]
                    or (
                        cell.tool not in NO_BUDGET
                        and len(cell.samples) >= min_runs
                        and sum(walls) + statistics.mean(walls) > cell_budget_s
                    )
                ):
                    cell.done = True
        if workload == "cleanup":
            reset_nodes(ctx.box, nodes)
    return cells


def summarize(cell: Cell) -> dict[str, Any]:
    ok = cell.ok_samples()
    use = ok or cell.samples

    def med(key: str) -> float | None:
        vals = [s[key] for s in use if s.get(key) is not None]
        return round(statistics.median(vals), 3) if vals else None

    def peak(key: str) -> float | None:
        vals = [s[key] for s in use if s.get(key) is not None]
        return max(vals) if vals else None

    out: dict[str, Any] = {
        "tool": cell.tool,
        "n": cell.n,
        "workload": cell.workload,
        "forks": cell.forks,
        "runs": len(cell.samples),
        "ok_runs": len(ok),
        "median_wall_s": med("wall_s"),
        "min_wall_s": min((s["wall_s"] for s in use), default=None),
        "max_wall_s": max((s["wall_s"] for s in use), default=None),
        "median_cpu_s": med("cpu_s"),
        "peak_rss_mib": peak("max_rss_mib"),
        "tree_anon_peak_mib": peak("tree_anon_peak_mib"),
        "peak_procs": peak("peak_procs"),
        "peak_threads": peak("peak_threads"),
        "median_machine_cpu_s": med("machine_cpu_s"),
        "median_node_cpu_s": med("node_cpu_s"),
        "skipped": cell.skipped,
    }
    verifies = [s["verify"] for s in cell.samples if "verify" in s]
    if verifies:
        out["clean_runs"] = sum(v["clean_nodes"] == cell.n for v in verifies)
        out["bystander_killed_runs"] = sum(v["bystander_killed_nodes"] > 0 for v in verifies)
    if not ok and cell.samples:
        out["failure"] = cell.samples[-1].get("stderr_tail") or cell.samples[-1].get("stdout_tail")
    return out


def targets(rows: list[dict[str, Any]], start: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, evaluated on the medians."""
    by = {(r["tool"], r["n"], r["workload"]): r for r in rows}
    out = []
    for n in sorted({r["n"] for r in rows if r["n"] >= 64}):
        for workload in ("exec", "cleanup"):
            f = by.get(("fleet", n, workload))
            if not f or f["median_wall_s"] is None:
                continue
            peers = [
                by[(p, n, workload)]
                for p in ("pdsh", "pssh", "ansible")
                if (p, n, workload) in by and by[(p, n, workload)]["ok_runs"]
            ]
            if peers:
                fastest = min(peers, key=lambda r: r["median_wall_s"])
                out.append(
                    {
                        "target": f"N={n} {workload}: fleet no slower than the fastest peer",
                        "met": f["median_wall_s"] <= fastest["median_wall_s"],
                        "detail": f"fleet {f['median_wall_s']:.2f}s vs {fastest['tool']} "
                        f"{fastest['median_wall_s']:.2f}s",
                    }
                )
                same = by.get(("fleet-oneliner", n, workload))
                if same and same["median_wall_s"] is not None:
                    out.append(
                        {
                            "target": f"N={n} {workload}, same one-liner on the nodes: fleet exec "
                            "no slower than the fastest peer",
                            "met": same["median_wall_s"] <= fastest["median_wall_s"],
                            "detail": f"fleet {same['median_wall_s']:.2f}s vs {fastest['tool']} "
                            f"{fastest['median_wall_s']:.2f}s",
                        }
                    )
            ans = by.get(("ansible", n, workload))
            if ans and ans["ok_runs"]:
                ratio = ans["median_wall_s"] / f["median_wall_s"]
                out.append(
                    {
                        "target": f"N={n} {workload}: fleet >= 10x faster than Ansible",
                        "met": ratio >= 10,
                        "detail": f"{ratio:.1f}x (ansible {ans['median_wall_s']:.2f}s)",
                    }
                )
    for n in (128,):
        rss = [
            r["peak_rss_mib"]
            for r in rows
            if r["tool"] == "fleet" and r["n"] == n and r["peak_rss_mib"]
        ]
        if rss:
            out.append(
                {
                    "target": f"fleet peak RSS at N={n} < 100 MiB",
                    "met": max(rss) < 100,
                    "detail": f"{max(rss):.1f} MiB (worst workload)",
                }
            )
    if start.get("help_warm_s"):
        help_s = statistics.median(start["help_warm_s"])
        out.append(
            {
                "target": "`fleet --help` <= 0.10 s",
                "met": help_s <= 0.10,
                "detail": f"median {help_s:.3f}s (bytecode cached); "
                f"{statistics.median(start['help_as_this_env_s']):.3f}s without .pyc",
            }
        )
    return out
