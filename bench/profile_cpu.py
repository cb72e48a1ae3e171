"""Where fleet's client CPU goes: the fleet CLI run in-process under yappi (CPU clock, all threads).

    python bench/profile_cpu.py --out bench/results/raw/cpu-exec.json -- exec true -i INV -F CFG

py-spy samples wall-clock stacks: on a saturated 2-core machine a thread that holds the GIL but is
not scheduled still shows up. yappi's CPU clock counts only time actually spent on a CPU, per
function, across all threads (paramiko's Transport threads included), so its totals add up to the
process's CPU time. Profiling overhead inflates Python-heavy functions (roughly 1.5-2x); compare
shares, not absolute numbers. Used by bench/run.py when yappi is installed (pip install yappi).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Functions whose inclusive CPU answers a question from the issue.
GROUPS = {
    "imports (all modules loaded during the run)": ("_find_and_load",),
    "ssh handshake + auth (SSHClient.connect)": ("SSHClient.connect",),
    "ssh_config lookup per host (SSHConfig.lookup)": ("SSHConfig.lookup",),
    "host key store (HostKeyStore.known)": ("HostKeyStore.known",),
    "running steps (SSHSession.run)": ("SSHSession.run",),
    "session close (SSHSession.close)": ("SSHSession.close",),
    "paramiko Transport threads (Transport.run)": ("Transport.run",),
    "event dispatch on the main thread (run_plan.<locals>.dispatch)": ("dispatch",),
    "  of which run record (RunRecord.handle)": ("RunRecord.handle",),
    "  of which plain output (PlainReporter.handle)": ("PlainReporter.handle",),
    "  of which live table (LiveReporter.handle)": ("LiveReporter.handle",),
    "live table rendering (Live refresh thread: LiveReporter._render)": ("LiveReporter._render",),
    "starting worker threads (Thread.start)": ("Thread.start",),
    "plan building (build_plan)": ("build_plan",),
    "inventory loading (load_inventory)": ("load_inventory",),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="JSON summary to write")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("fleet_args", nargs=argparse.REMAINDER, help="-- then fleet's arguments")
    args = ap.parse_args()
    fleet_args = args.fleet_args[1:] if args.fleet_args[:1] == ["--"] else args.fleet_args

    import yappi  # type: ignore[import-untyped]

    yappi.set_clock_type("cpu")
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    yappi.start(builtins=True, profile_threads=True)
    code = 0
    try:
        from fleet.cli import main as fleet_main

        fleet_main(fleet_args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    finally:
        yappi.stop()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    stats = yappi.get_func_stats()
    rows: list[dict[str, Any]] = []
    for s in stats:
        module = s.module
        for marker in ("site-packages/", "lib/python3.11/", str(REPO) + "/"):
            if marker in module:
                module = module.split(marker, 1)[1]
        rows.append(
            {"name": s.name, "module": module, "ncall": s.ncall, "ttot": s.ttot, "tsub": s.tsub}
        )
    total = sum(r["tsub"] for r in rows) or 1.0
    threads = [
        {"name": t.name, "cpu_s": round(t.ttot, 3)}
        for t in sorted(yappi.get_thread_stats(), key=lambda t: -t.ttot)
    ]
    by_kind: dict[str, float] = {}
    for t in threads:
        kind = (
            "main"
            if t["name"] == "_MainThread"
            else "worker"
            if "fleet-worker" in str(t["name"]) or t["name"] == "Thread"
            else str(t["name"])
        )
        by_kind[kind] = by_kind.get(kind, 0.0) + t["cpu_s"]

    def inclusive(names: tuple[str, ...]) -> float:
        # ttot of recursive functions double counts; these entry points do not recurse.
        return float(sum(r["ttot"] for r in rows if r["name"].endswith(names)))

    groups = {
        label: {
            "cpu_s": round(inclusive(names), 3),
            "pct": round(100 * inclusive(names) / total, 1),
        }
        for label, names in GROUPS.items()
    }
    out = {
        "argv": fleet_args,
        "exit_code": code,
        "wall_s": round(wall, 3),
        "process_cpu_s": round(
            ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime, 3
        ),  # with profiling overhead
        "profiled_cpu_s": round(total, 3),
        "threads_cpu_s": {k: round(v, 3) for k, v in by_kind.items()},
        "groups": groups,
        "top_self": [
            {**r, "pct": round(100 * r["tsub"] / total, 1)}
            for r in sorted(rows, key=lambda r: -r["tsub"])[: args.top]
        ],
        "top_inclusive": [
            {**r, "pct": round(100 * r["ttot"] / total, 1)}
            for r in sorted(rows, key=lambda r: -r["ttot"])[: args.top]
        ],
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
