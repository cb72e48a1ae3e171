"""Warm connections (--persist): `fleet exec true` cold, then again within the window.

    sudo python3 bench/warm.py --nodes 128 [--runs 3] [--forks 64] [--dir bench/.sandbox-warm]
        [--subnet 10.249.0.0/16] [--keep]

Brings a sandbox up to N nodes (kept with --keep, else torn down at the end), then per run: a
cold `fleet exec true --persist 0`, and a warm one (the keepers started and the connections made
by one untimed command before the warm runs). It records the wall time and the client's CPU
(user + sys of the fleet process, from wait4: the keepers are not its waited-for children, so
their CPU is not in it), and from `fleet connections --json`, the CPU seconds each keeper process
spent in each warm run. Prints a Markdown table and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FLEET = [sys.executable, "-m", "fleet"]


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall s, client CPU s, exit code) of one fleet command."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [*FLEET, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def keeper_cpu(env: dict[str, str]) -> dict[int, float]:
    out = subprocess.run(
        [*FLEET, "connections", "--json"], env=env, capture_output=True, text=True, check=True
    ).stdout
    return {k["pid"]: k["cpu_s"] for k in json.loads(out)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--forks", type=int, default=64)
    parser.add_argument("--dir", type=Path, default=ROOT / "bench" / ".sandbox-warm")
    parser.add_argument("--subnet", default="10.249.0.0/16")
    parser.add_argument("--keep", action="store_true", help="leave the sandbox up")
    opts = parser.parse_args()
    subprocess.run(
        [*FLEET, "sandbox", "up", "-n", str(opts.nodes), "--dir", str(opts.dir),
         "--subnet", opts.subnet],
        check=True, stdout=subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
    runtime = Path(tempfile.mkdtemp(prefix="fwb-", dir="/tmp"))
    env = dict(os.environ)
    env.update(
        FLEET_INVENTORY=str(opts.dir / "inventory.yaml"),
        FLEET_SSH_CONFIG=str(opts.dir / "ssh_config"),
        FLEET_LOG_DIR=str(runtime / "runs"),
        XDG_RUNTIME_DIR=str(runtime),
        FLEET_PERSIST="600",
    )
    args = ["exec", "true", "--plain", "-f", str(opts.forks)]
    rows: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    per_keeper: list[list[float]] = []
    try:
        timed([*args, "--persist", "0"], env)  # untimed: caches warm
        timed(args, env)  # untimed: keepers started, connections made
        for _ in range(opts.runs):
            wall, cpu, code = timed([*args, "--persist", "0"], env)
            assert code == 0, code
            rows["cold"].append((wall, cpu))
            before = keeper_cpu(env)
            wall, cpu, code = timed(args, env)
            assert code == 0, code
            after = keeper_cpu(env)
            rows["warm"].append((wall, cpu))
            per_keeper.append([round(after[p] - before.get(p, 0.0), 3) for p in sorted(after)])
    finally:
        subprocess.run([*FLEET, "disconnect"], env=env, stdout=subprocess.DEVNULL, check=False)
        if not opts.keep:
            subprocess.run([*FLEET, "sandbox", "down", "--dir", str(opts.dir)], check=False)
        shutil.rmtree(runtime, ignore_errors=True)
    report(opts.nodes, rows, per_keeper)
    return 0


def report(nodes: int, rows: dict[str, list[tuple[float, float]]], keepers: Any) -> None:
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
           for k, v in rows.items()}  # fmt: skip
    print(f"| {nodes} nodes, exec true | wall s (median) | client CPU s | client CPU per host |")
    print("| --- | ---: | ---: | ---: |")
    for kind, (wall, cpu) in med.items():
        print(f"| {kind} | {wall:.2f} | {cpu:.2f} | {cpu / nodes * 1000:.1f} ms |")
    print(f"\nwarm/cold wall: 1/{med['cold'][0] / med['warm'][0]:.1f}; "
          f"client CPU: 1/{med['cold'][1] / med['warm'][1]:.1f}")  # fmt: skip
    print(f"keeper CPU s per warm run, per process: {keepers}")
    print(f"raw: {json.dumps(rows)}")


if __name__ == "__main__":
    raise SystemExit(main())
