#!/usr/bin/env python3
"""fleet's start-up: `fleet --help` and `fleet exec --help`, wall and CPU time over repeated
runs (hyperfine-style: warm-up runs, then N timed ones, median), and `python -X importtime`
per module for both and for the run path.

    python3 bench/startup.py [--runs 30] [--json]   # on its own (no root, no sandbox)

bench/run.py calls `startup()` at the start of every comparison run. Target: `fleet --help`
<= 0.10 s with bytecode cached. tests/cli/test_startup.py checks which modules --help loads
(no paramiko, rich, yaml, inventory, plan or engine); the time is measured here, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, log, python_env

HELP_TARGET_S = 0.10


def _time_runs(argv: list[str], env: dict[str, str], count: int) -> dict[str, list[float]]:
    """Wall time and client CPU (user+sys of the child, from RUSAGE_CHILDREN) of each run."""
    walls, cpus = [], []
    for _ in range(count):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(
            argv,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=60,
        )
        walls.append(round(time.perf_counter() - t0, 4))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        cpus.append(round(cpu, 4))
    return {"wall_s": walls, "cpu_s": cpus}


def _importtime(env: dict[str, str], code: str, repeats: int = 3) -> dict[str, Any]:
    """python -X importtime: per-module median self/cumulative µs over a few runs."""
    per: dict[str, dict[str, list[int]]] = {}
    depth: dict[str, int] = {}
    for _ in range(repeats):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        for line in proc.stderr.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
            if not m:
                continue
            name = m.group(4)
            rec = per.setdefault(name, {"self": [], "cum": []})
            rec["self"].append(int(m.group(1)))
            rec["cum"].append(int(m.group(2)))
            depth[name] = (len(m.group(3)) - 1) // 2
    rows: list[dict[str, Any]] = [
        {
            "module": name,
            "self_ms": round(statistics.median(v["self"]) / 1000, 1),
            "cumulative_ms": round(statistics.median(v["cum"]) / 1000, 1),
            "depth": depth[name],
        }
        for name, v in per.items()
    ]
    top_level = sorted((r for r in rows if r["depth"] <= 1), key=lambda r: -r["cumulative_ms"])
    return {
        "code": code,
        "top_cumulative": top_level[:15],
        "top_self": sorted(rows, key=lambda r: -r["self_ms"])[:15],
        "total_ms": round(sum(r["cumulative_ms"] for r in rows if r["depth"] == 0), 1),
        "modules": len(rows),
    }


def _main_code(*args: str) -> str:
    """`fleet ARGS` as the console script runs it (main, then its exit)."""
    return f"from fleet.cli import main; main({list(args)!r})"


def startup(
    fleet: list[str], env: dict[str, str], py_env: dict[str, str], count: int
) -> dict[str, Any]:
    log(f"start-up: fleet --help and fleet exec --help x{count}, python -X importtime")
    _time_runs([*fleet, "--help"], py_env, 2)  # fill the bytecode cache
    _time_runs([*fleet, "exec", "--help"], py_env, 2)
    out: dict[str, Any] = {}
    help_runs = _time_runs([*fleet, "--help"], py_env, count)
    out["help_warm_s"], out["help_warm_cpu_s"] = help_runs["wall_s"], help_runs["cpu_s"]
    exec_runs = _time_runs([*fleet, "exec", "--help"], py_env, count)
    out["exec_help_warm_s"], out["exec_help_warm_cpu_s"] = exec_runs["wall_s"], exec_runs["cpu_s"]
    cold = {**env, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)}
    cold.pop("PYTHONPYCACHEPREFIX", None)
    out["help_as_this_env_s"] = _time_runs([*fleet, "--help"], cold, max(5, count // 2))["wall_s"]
    out["python_bare_s"] = _time_runs([sys.executable, "-c", "pass"], py_env, max(5, count // 2))[
        "wall_s"
    ]
    script = Path(sys.executable).parent / "fleet"
    if script.exists():
        out["help_console_script"] = str(script)
        out["help_console_script_warm_s"] = _time_runs(
            [str(script), "--help"], py_env, max(5, count // 2)
        )["wall_s"]
    out["importtime_help"] = _importtime(py_env, _main_code("--help"))
    out["importtime_exec_help"] = _importtime(py_env, _main_code("exec", "--help"))
    out["importtime_run"] = _importtime(
        py_env,
        "import fleet.cli, fleet.engine.runner, fleet.engine.executor, fleet.ssh.transport,"
        " fleet.output.plain, fleet.records.runlog",
    )
    return out


def summary_lines(st: dict[str, Any]) -> list[str]:
    """The figures in a few lines: medians of wall and CPU, the target, the biggest imports."""
    med = statistics.median
    help_s = med(st["help_warm_s"])
    lines = [
        f"fleet --help:        median {help_s:.3f}s wall, {med(st['help_warm_cpu_s']):.3f}s CPU "
        f"over {len(st['help_warm_s'])} runs (min {min(st['help_warm_s']):.3f}s); target "
        f"<= {HELP_TARGET_S:.2f}s: {'met' if help_s <= HELP_TARGET_S else 'NOT met'}",
        f"fleet exec --help:   median {med(st['exec_help_warm_s']):.3f}s wall, "
        f"{med(st['exec_help_warm_cpu_s']):.3f}s CPU",
        f"without .pyc:        median {med(st['help_as_this_env_s']):.3f}s; "
        f"python -c pass: {med(st['python_bare_s']):.3f}s",
    ]
    for key in ("importtime_help", "importtime_exec_help", "importtime_run"):
        it = st[key]
        top = ", ".join(f"{r['module']} {r['cumulative_ms']}" for r in it["top_cumulative"][:6])
        name = key.removeprefix("importtime_")
        lines.append(f"importtime {name}: {it['total_ms']:.0f} ms, {it['modules']} modules; {top}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each command")
    parser.add_argument("--json", action="store_true", help="print every sample as JSON")
    args = parser.parse_args()
    env = dict(os.environ)
    st = startup([sys.executable, "-m", "fleet"], env, python_env(env), args.runs)
    print(json.dumps(st, indent=2) if args.json else "\n".join(summary_lines(st)))


if __name__ == "__main__":
    main()
