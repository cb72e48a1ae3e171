#!/usr/bin/env python3
"""Peak memory of fleet under output floods, on a local sandbox fleet (a benchmark, not a test).

    sudo python3 bench/flood.py                  # the default scenarios, ~4 min on 2 cores
    sudo python3 bench/flood.py --quick          # 1/8 of the volume, ~30 s
    sudo python3 bench/flood.py --compare /tmp/fleet-old    # the same against another checkout

Scenarios (each one `fleet exec ... --plain` with stdout to /dev/null, as a script would run it):

* 1gb-lines:    8 hosts x 128 MiB of 1 KiB lines (1 GiB, ~1M lines);
* 1gb-oneline:  8 hosts x 128 MiB without a newline (one 128 MiB line per host);
* chatty-128:   128 hosts x 20,000 lines of 100 bytes (256 MB, 2.56M lines), 32 at a time
                (the default --forks);
* chatty-128-f128: the same with all 128 at once (-f 128).

For each it records the exit code, wall time, the peak RSS of the fleet process itself (wait4's
ru_maxrss: not a sampled value, the kernel's high-water mark) and the size of the run record it
wrote. Results go to bench/results/flood.md (and flood.json). The sandbox (its own state dir and
subnet, 10.249.0.0/16 by default; state in $TMPDIR/fleet-bench-flood) is started here and torn
down at the end, even on Ctrl-C.

`--compare PATH` runs every scenario a second time with the fleet package found at PATH (e.g. a
`git worktree` of an older commit), under an address-space limit (--compare-limit-mb, default
4096) so that a version whose memory grows with output fails instead of exhausting the machine.
Needs root (network/PID/mount namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
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
sys.path.insert(0, str(REPO))  # the checkout's fleet, whether or not it is installed

from fleet.core import nodeset  # noqa: E402
from fleet.sandbox import Sandbox  # noqa: E402

MIB = 1024 * 1024
TIMED_OUT = -9  # the exit code recorded for a run killed at --timeout


@dataclass(frozen=True)
class Scenario:
    name: str
    hosts: int
    forks: int
    command: str
    volume: str  # what the nodes print, in words


@dataclass
class Sample:
    scenario: str
    fleet: str  # "this checkout" or the --compare path
    code: int
    wall_s: float
    peak_rss_mib: float
    record_mib: float
    note: str = ""


def scenarios(scale: int) -> list[Scenario]:
    """The flood scenarios; `scale` divides every volume (--quick: 8)."""
    per_host = 128 * MIB // scale
    lines = 20_000 // scale
    kib_line = "yes \"$(head -c 1023 /dev/zero | tr '\\0' a)\""
    return [
        Scenario(
            "1gb-lines",
            8,
            8,
            f"{kib_line} | head -c {per_host}",
            f"8 hosts x {per_host // MIB} MiB of 1 KiB lines",
        ),
        Scenario(
            "1gb-oneline",
            8,
            8,
            f"head -c {per_host} /dev/zero | tr '\\0' x",
            f"8 hosts x one {per_host // MIB} MiB line",
        ),
        Scenario(
            "chatty-128",
            128,
            32,
            f"yes \"$(head -c 99 /dev/zero | tr '\\0' c)\" | head -n {lines}",
            f"128 hosts x {lines} lines of 100 bytes, 32 at a time",
        ),
        Scenario(
            "chatty-128-f128",
            128,
            128,
            f"yes \"$(head -c 99 /dev/zero | tr '\\0' c)\" | head -n {lines}",
            f"128 hosts x {lines} lines of 100 bytes, all at once",
        ),
    ]


def _du(path: Path) -> int:
    """Bytes under `path` (files only)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def run_fleet(
    box: Sandbox,
    scenario: Scenario,
    work: Path,
    pythonpath: Path | None,
    limit_mb: int | None,
    timeout_s: float,
) -> Sample:
    """One `fleet exec` flood; its own peak RSS from wait4, its record's size."""
    log_dir = work / f"runs-{scenario.name}-{'compare' if pythonpath else 'this'}"
    shutil.rmtree(log_dir, ignore_errors=True)
    env = dict(os.environ)
    env.update(
        FLEET_INVENTORY=str(box.inventory_path),
        FLEET_SSH_CONFIG=str(box.ssh_config_path),
        FLEET_LOG_DIR=str(log_dir),
        PYTHONPATH=str(pythonpath or REPO),
        FLEET_PERSIST="0",
    )
    argv = [
        sys.executable,
        "-m",
        "fleet",
        "exec",
        scenario.command,
        "--plain",
        "-f",
        str(scenario.forks),
        "-l",
        nodeset.fold(node.name for node in box.nodes()[: scenario.hosts]),
    ]

    if limit_mb:  # an older fleet may grow with the output: fail it, do not exhaust the machine
        argv = ["prlimit", f"--as={limit_mb * MIB}", "--", *argv]
    started = time.monotonic()
    with open(work / f"{scenario.name}.stderr", "w") as err:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd=str(pythonpath or REPO),
        )
        code, rusage = _wait(proc, started + timeout_s)
    wall = time.monotonic() - started
    tail = (work / f"{scenario.name}.stderr").read_text(errors="replace").strip().splitlines()
    return Sample(
        scenario=scenario.name,
        fleet=str(pythonpath) if pythonpath else "this checkout",
        code=code,
        wall_s=round(wall, 1),
        peak_rss_mib=round(rusage.ru_maxrss / 1024, 1),  # ru_maxrss is in KiB on Linux
        record_mib=round(_du(log_dir) / MIB, 1) if log_dir.exists() else 0.0,
        note=f"killed after {timeout_s:g}s"
        if code == TIMED_OUT
        else (tail[-1][:160] if tail and code else ""),
    )


def _wait(proc: subprocess.Popen[bytes], deadline: float) -> tuple[int, resource.struct_rusage]:
    """wait4 the child (its own rusage, not the sum of every child); kill it past the deadline."""
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, rusage
        if time.monotonic() > deadline:
            proc.kill()
            _, status, rusage = os.wait4(proc.pid, 0)
            proc.returncode = TIMED_OUT
            return TIMED_OUT, rusage
        time.sleep(0.1)


def write_results(out: Path, doc: dict[str, object], samples: Sequence[Sample]) -> None:
    """flood.md (a table) and flood.json (the same samples, raw)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "flood.json").write_text(
        json.dumps({**doc, "samples": [asdict(s) for s in samples]}, indent=2) + "\n"
    )
    volumes = {s["name"]: s["volume"] for s in doc["scenarios"]}  # type: ignore[attr-defined]
    lines = [
        "# fleet under output floods",
        "",
        f"Generated {doc['when']} by `{doc['command']}` ({doc['minutes']:.1f} min). "
        f"Machine: {doc['machine']}.",
        "",
        "Each scenario is one `fleet exec CMD --plain` (stdout to /dev/null) against sandbox "
        "nodes on the same machine. Peak RSS is the fleet process's own high-water mark "
        "(wait4 ru_maxrss); record is the size of the run record it wrote.",
        "",
        "| scenario | what the nodes print | fleet | exit | wall s | peak RSS MiB | record MiB |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for s in samples:
        exit_text = str(s.code) + (f" ({s.note})" if s.note else "")
        lines.append(
            f"| {s.scenario} | {volumes[s.scenario]} | {s.fleet} | {exit_text} | "
            f"{s.wall_s} | {s.peak_rss_mib} | {s.record_mib} |"
        )
    lines += [
        "",
        "Reading it: fleet's peak is the idle process (~50 MiB) plus the output in flight to "
        "the main thread (at most 8 MiB), plus up to one SSH channel window (256 KiB) per step "
        "running at once (`-f`), per-host tails and the allocator's slack for that many "
        "threads; it does not grow with the volume of output. A line longer than 16 KiB is "
        "counted, not held. The "
        "record keeps each host's first 64 MB of output and its last 256 kB. Wall times are "
        "those of 2 cores shared by fleet, 128 sshd nodes and whatever else runs on the machine.",
    ]
    if any(s.fleet != "this checkout" for s in samples):
        lines += [
            "",
            f"Rows naming another checkout ran it under an address-space limit "
            f"({doc.get('compare_limit_mb')} MiB, prlimit --as) and a {doc.get('timeout_s')} s "
            "timeout: exit -9 is a run killed at the timeout (there, a single 128 MiB line is "
            "rebuilt by concatenation chunk after chunk, quadratic in its length).",
        ]
    (out / "flood.md").write_text("\n".join(lines) + "\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1/8 of the volume")
    p.add_argument("--only", help="comma-separated scenario names")
    p.add_argument(
        "--state-dir", type=Path, default=Path(tempfile.gettempdir()) / "fleet-bench-flood"
    )
    p.add_argument("--subnet", default="10.249.0.0/16")
    p.add_argument("--out", type=Path, default=BENCH / "results")
    p.add_argument("--compare", type=Path, help="another checkout (its fleet package) to compare")
    p.add_argument("--compare-limit-mb", type=int, default=4096)
    p.add_argument("--timeout", type=float, default=300, help="seconds per fleet run")
    p.add_argument("--keep-sandbox", action="store_true")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench/flood.py needs root (network/PID/mount namespaces)", file=sys.stderr)
        return 2
    chosen = scenarios(8 if args.quick else 1)
    if args.only:
        wanted = set(args.only.split(","))
        chosen = [s for s in chosen if s.name in wanted]
    begun = time.monotonic()
    work = args.state_dir / "work"
    box = Sandbox(args.state_dir, subnet=args.subnet)
    samples: list[Sample] = []
    try:
        print(f"sandbox: {max(s.hosts for s in chosen)} nodes on {args.subnet}", flush=True)
        box.up(max(s.hosts for s in chosen))
        work.mkdir(parents=True, exist_ok=True)
        for scenario in chosen:
            runs = [(None, None)] + (
                [(args.compare, args.compare_limit_mb)] if args.compare else []
            )
            for path, limit in runs:
                sample = run_fleet(box, scenario, work, path, limit, args.timeout)
                print(json.dumps(asdict(sample)), flush=True)
                samples.append(sample)
    finally:
        if not args.keep_sandbox:
            box.down()
        shutil.rmtree(work, ignore_errors=True)
    doc: dict[str, object] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python3 bench/flood.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "minutes": (time.monotonic() - begun) / 60,
        "machine": f"{os.cpu_count()} cores, Linux {platform.release()}, "
        f"Python {platform.python_version()}",
        "scenarios": [asdict(s) for s in chosen],
        "compare_limit_mb": args.compare_limit_mb,
        "timeout_s": args.timeout,
    }
    write_results(args.out, doc, samples)
    print(f"wrote {args.out / 'flood.md'}")
    return 0 if all(s.code == 0 for s in samples if s.fleet == "this checkout") else 1


if __name__ == "__main__":
    sys.exit(main())
