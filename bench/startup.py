"""fleet's start-up: `fleet --help` wall time and `python -X importtime` per module."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, log


def _time_runs(argv: list[str], env: dict[str, str], count: int) -> list[float]:
    walls = []
    for _ in range(count):
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
    return walls


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
    }


def startup(
    fleet: list[str], env: dict[str, str], py_env: dict[str, str], count: int
) -> dict[str, Any]:
    log(f"start-up: fleet --help x{count}, python -X importtime")
    _time_runs([*fleet, "--help"], py_env, 2)  # fill the bytecode cache
    out: dict[str, Any] = {}
    out["help_warm_s"] = _time_runs([*fleet, "--help"], py_env, count)
    cold = {**env, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)}
    cold.pop("PYTHONPYCACHEPREFIX", None)
    out["help_as_this_env_s"] = _time_runs([*fleet, "--help"], cold, max(5, count // 2))
    out["python_bare_s"] = _time_runs([sys.executable, "-c", "pass"], py_env, max(5, count // 2))
    script = Path(sys.executable).parent / "fleet"
    if script.exists():
        out["help_console_script"] = str(script)
        out["help_console_script_warm_s"] = _time_runs(
            [str(script), "--help"], py_env, max(5, count // 2)
        )
    out["importtime_help"] = _importtime(py_env, "import fleet.cli")
    out["importtime_run"] = _importtime(
        py_env,
        "import fleet.cli, fleet.engine.runner, fleet.engine.executor, fleet.ssh.transport,"
        " fleet.output.reporters, fleet.records.runlog",
    )
    return out
