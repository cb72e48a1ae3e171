#!/usr/bin/env python3
"""Benchmark fleet against pdsh, Ansible ad-hoc and parallel-ssh on a local sandbox fleet.

    sudo python3 bench/run.py                       # sizes 8,32,64,128; 5 runs each
    sudo python3 bench/run.py --quick               # smoke test: sizes 8,32; 3 runs
    sudo python3 bench/run.py --sizes 8,32,64,128,256 --runs 5
    sudo python3 bench/run.py --client-cost         # fleet alone at 128 and 512 nodes
    sudo python3 bench/run.py --client-cost --sizes 128 --compare /tmp/fleet-before

Not a test: it measures. For every fleet size N it starts (or grows) a sandbox fleet of real sshd
nodes (fleet/sandbox/, its own state dir and subnet, default 10.250.0.0/16), then, on the same
nodes, times each tool on two workloads:

* exec:    run `true` on every node;
* cleanup: fleet's `cleanup --grace 1` vs the hand-written kill/rm/fuser one-liner operators run
           through pdsh/ansible/pssh; fresh ghosts (fleet/sandbox/ghosts.py) are planted on every
           node before each run (not timed) and every node is checked afterwards (not timed).

Per run it records wall time, user+sys CPU of the client process tree (RUSAGE_CHILDREN deltas),
the peak RSS of the largest client process (GNU time %M) and, when the cgroup-v1 memory controller
is available, the peak anonymous memory of the whole client tree plus its peak process and thread
counts (sampled from a cgroup the client runs in). Each measured command has a timeout; a peer that
fails or is missing is recorded as such. It also measures fleet's start-up (`--help`, importtime),
paramiko vs OpenSSH handshake cost, and profiles `fleet exec` at the largest size with py-spy.
`--client-cost` measures fleet alone instead (bench/client.py): its own peak RSS and CPU, the SSH
bytes per node, and the bytes of facts per node, optionally against another checkout.

Writes bench/results/latest.md, latest.json (raw samples, machine, versions, command line) and
latest.png (if matplotlib imports); --client-cost writes client.md and client.json. The sandbox is
always torn down and no process is left behind. Needs root (network/PID/mount namespaces). Peers:
apt-get install pdsh ansible-core time; pip install parallel-ssh py-spy (matplotlib optional).

The parts: common.py (paths, port, logging), measure.py (one measured run), tools.py (the tools'
command lines), ghosts.py (plant, check, reset), compare.py (the tool x size x workload cells and
targets), startup.py, profiles.py (handshake, py-spy, yappi, ssh_config A/B), report.py
(latest.md, plot), client.py (--client-cost).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))  # the checkout's fleet and bench, whether or not installed

from bench.client import client_cost, write_client_markdown  # noqa: E402
from bench.common import log, python_env  # noqa: E402
from bench.compare import Cell, run_size, summarize, targets  # noqa: E402
from bench.measure import Cgroup, NodeCpu, measure  # noqa: E402
from bench.profiles import cpu_profile, handshake_costs, lookup_ab, py_spy_profile  # noqa: E402
from bench.report import machine_info, scrub_paths, write_markdown, write_plot  # noqa: E402
from bench.startup import startup  # noqa: E402
from bench.tools import HAND_CLEANUP, MAX_RUNS, NO_BUDGET, TOOL_NOTES, TOOL_ORDER, TOOLS, Ctx  # noqa: E402
from fleet.sandbox import Sandbox  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="smoke test: sizes 8,32; 3 runs; no profile"
    )
    ap.add_argument(
        "--client-cost",
        action="store_true",
        help="measure fleet alone instead: its peak RSS, CPU and SSH bytes per node, and bytes "
        "of facts per node (bench/client.py); writes client.md/.json [sizes 128,512; 3 runs, "
        "1 at N >= 512]",
    )
    ap.add_argument(
        "--compare",
        type=Path,
        metavar="PATH",
        help="with --client-cost: also measure the fleet package in PATH (another checkout)",
    )
    ap.add_argument("--sizes", help="comma-separated fleet sizes [8,32,64,128]")
    ap.add_argument("--runs", type=int, help="runs per tool, size and workload [5; --quick 3]")
    ap.add_argument(
        "--min-runs", type=int, default=2, help="runs kept even past the cell budget [2]"
    )
    ap.add_argument(
        "--cell-budget",
        type=float,
        default=60,
        help="stop adding runs to one tool/size/workload "
        "once its runs would exceed this many seconds (slow peers at large N) [60]",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=300,
        help="seconds before one measured command is killed [300]",
    )
    ap.add_argument(
        "--max-forks", type=int, default=64, help="F = min(N, this) for every tool [64]"
    )
    ap.add_argument(
        "--tools", default=",".join(TOOL_ORDER), help=f"subset of {','.join(TOOL_ORDER)}"
    )
    ap.add_argument(
        "--large-runs",
        type=int,
        help="runs per cell at N >= --large-n, to keep the full run under ~25 min "
        "[3; --client-cost 1]",
    )
    ap.add_argument("--large-n", type=int, help="see --large-runs [128; --client-cost 512]")
    ap.add_argument("--workloads", default="exec,cleanup")
    ap.add_argument("--subnet", default="10.250.0.0/16", help="sandbox subnet [10.250.0.0/16]")
    ap.add_argument(
        "--state-dir",
        type=Path,
        default=BENCH / ".sandbox",
        help="sandbox state dir [bench/.sandbox]",
    )
    ap.add_argument(
        "--out", type=Path, default=BENCH / "results", help="results dir [bench/results]"
    )
    ap.add_argument("--help-runs", type=int, default=20, help="`fleet --help` repetitions [20]")
    ap.add_argument(
        "--no-profile", action="store_true", help="skip py-spy and the handshake micro-benchmark"
    )
    ap.add_argument(
        "--keep-sandbox", action="store_true", help="leave the sandbox running at the end"
    )
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite latest.md and latest.png (with --client-cost: client.md) from --out's "
        "JSON; measure nothing",
    )
    args = ap.parse_args(argv)
    if args.compare and not args.client_cost:
        ap.error("--compare goes with --client-cost")
    if args.compare and not (args.compare / "fleet" / "__init__.py").is_file():
        ap.error(f"--compare {args.compare}: no fleet package there (fleet/__init__.py)")
    default_sizes = "128,512" if args.client_cost else "8,32" if args.quick else "8,32,64,128"
    try:
        args.sizes = [int(x) for x in (args.sizes or default_sizes).split(",")]
    except ValueError:
        ap.error(f"--sizes {args.sizes}: write node counts separated by commas, e.g. 128,512")
    if any(n < 1 for n in args.sizes):
        ap.error(f"--sizes {args.sizes}: every size must be at least 1")
    args.runs = args.runs or (3 if args.quick or args.client_cost else 5)
    args.large_n = args.large_n or (512 if args.client_cost else 128)
    args.large_runs = args.large_runs or (1 if args.client_cost else 3)
    if args.quick:
        args.no_profile = True
        args.help_runs = min(args.help_runs, 10)
    args.tools = [t for t in args.tools.split(",") if t]
    args.workloads = [w for w in args.workloads.split(",") if w]
    bad = [t for t in args.tools if t not in TOOLS] + [
        w for w in args.workloads if w not in ("exec", "cleanup")
    ]
    if bad:
        ap.error(f"unknown tool or workload: {', '.join(bad)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only and args.client_cost:
        write_client_markdown(
            args.out / "client.md", json.loads((args.out / "client.json").read_text())
        )
        scrub_paths(args.out)
        log(f"rewrote {args.out / 'client.md'}")
        return 0
    if args.report_only:
        saved = json.loads((args.out / "latest.json").read_text())
        write_markdown(args.out / "latest.md", saved)
        plot_error = write_plot(args.out / "latest.png", saved["summary"])
        scrub_paths(args.out)
        log(
            f"rewrote {args.out / 'latest.md'}" + (f"; no plot: {plot_error}" if plot_error else "")
        )
        return 0
    if os.geteuid() != 0:
        print(
            "bench/run.py needs root (the sandbox uses network/PID/mount namespaces)",
            file=sys.stderr,
        )
        return 2
    command_line = (
        shlex.join([sys.executable, *sys.argv])
        if argv is None
        else shlex.join(["bench/run.py", *argv])
    )
    signal.signal(signal.SIGTERM, _sigterm)
    base_env = _base_env()
    if args.client_cost:
        return client_cost(args, base_env, command_line)
    if not os.access("/usr/bin/time", os.X_OK):
        print("bench/run.py needs GNU time: apt-get install time", file=sys.stderr)
        return 2
    t_start = time.monotonic()
    out_dir: Path = args.out
    raw_dir = out_dir / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    log_dir = args.state_dir / "runs"
    log_dir.mkdir(parents=True, exist_ok=True)
    py_env = python_env(base_env)
    fleet = [sys.executable, "-m", "fleet"]
    unavailable = {name: why for name in args.tools if (why := TOOLS[name].available())}
    for name, why in unavailable.items():
        log(f"peer {name} skipped: {why}")
    doc: dict[str, Any] = {
        "command_line": command_line,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "loadavg_start": os.getloadavg()[0],
        "config": {
            "sizes": args.sizes,
            "runs": args.runs,
            "min_runs": args.min_runs,
            "large_runs": args.large_runs,
            "large_n": args.large_n,
            "max_runs": MAX_RUNS,
            "no_budget": sorted(NO_BUDGET),
            "cell_budget_s": args.cell_budget,
            "timeout_s": args.timeout,
            "max_forks": args.max_forks,
            "tools": args.tools,
            "workloads": args.workloads,
            "subnet": args.subnet,
            "state_dir": str(args.state_dir),
            "fleet_command": fleet,
            "hand_cleanup": HAND_CLEANUP,
            "tool_notes": TOOL_NOTES,
        },
        "unavailable": unavailable,
        "machine": machine_info(),
    }
    cgroup = Cgroup()
    if not cgroup.path:
        log("no cgroup-v1 memory controller: tree memory/process counts not recorded")
    doc["config"]["cgroup"] = str(cgroup.path) if cgroup.path else None
    node_cpu = NodeCpu()
    if not node_cpu.path:
        log("no cgroup-v1 cpuacct controller: node-side CPU not recorded")
    box = Sandbox(args.state_dir, subnet=args.subnet)
    cells: list[Cell] = []
    profiles: list[dict[str, Any]] = []
    interrupted = False
    try:
        doc["startup"] = startup(fleet, base_env, py_env, args.help_runs)
        warmed = False
        for n in sorted(args.sizes):
            log(f"sandbox: up {n} nodes on {args.subnet}")
            t0 = time.monotonic()
            nodes = box.up(n)
            log(f"sandbox: {len(nodes)} nodes answering SSH ({time.monotonic() - t0:.1f}s)")
            node_cpu.attach([nd.pid1 for nd in nodes])
            names_file = args.state_dir / "hosts.names"
            addrs_file = args.state_dir / "hosts.addrs"
            names_file.write_text("".join(f"{nd.name}\n" for nd in nodes))
            addrs_file.write_text("".join(f"{nd.address}\n" for nd in nodes))
            ctx = Ctx(
                box=box,
                node_cpu=node_cpu,
                n=n,
                forks=min(n, args.max_forks),
                names_file=names_file,
                addrs_file=addrs_file,
                log_dir=log_dir,
                fleet_cmd=fleet,
                env=base_env,
                py_env=py_env,
            )
            if not warmed:  # page cache and bytecode for every tool, untimed
                for name in args.tools:
                    if name not in unavailable and (built := TOOLS[name].command(ctx, "exec")):
                        measure(built[0], built[1], args.timeout, cgroup, raw_dir, f"warmup-{name}")
                warmed = True
            cells += run_size(
                ctx,
                args.tools,
                args.workloads,
                min(args.runs, args.large_runs) if n >= args.large_n else args.runs,
                args.min_runs,
                args.cell_budget,
                args.timeout,
                cgroup,
                raw_dir,
                unavailable,
            )
            _write_partial(out_dir, doc, cells)
            if n == max(args.sizes) and not args.no_profile:
                log("handshake micro-benchmark")
                try:
                    doc["handshake"] = handshake_costs(box, nodes[0], node_cpu)
                except Exception as exc:  # a diagnostic, never fatal
                    doc["handshake"] = {"error": f"{type(exc).__name__}: {exc}"}
                for workload in args.workloads:
                    log(f"py-spy: fleet {workload} at N={n}")
                    prof = py_spy_profile(ctx, out_dir, workload, args.timeout)
                    prof["label"] = f"fleet {workload}, N={n}, -f {ctx.forks}"
                    profiles.append(prof)
                if "exec" in args.workloads:
                    log(f"yappi CPU profile: fleet exec at N={n}")
                    doc["cpu_profile"] = cpu_profile(ctx, out_dir, "exec", args.timeout)
                    doc["cpu_profile"]["label"] = f"fleet exec, N={n}, -f {ctx.forks}"
                    log(f"ssh_config lookup A/B: fleet exec at N={n}")
                    doc["lookup_ab"] = lookup_ab(ctx, cgroup, raw_dir, 3, args.timeout)
                    doc["lookup_ab_n"] = n
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: tearing down")
    except Exception as exc:  # record what was measured, then fail
        doc["error"] = traceback.format_exc()
        log(f"error: {type(exc).__name__}: {exc}")
    finally:
        cgroup.remove()
        if not args.keep_sandbox:
            log("sandbox: down")
            try:
                box.down()
            except Exception as exc:
                log(f"sandbox down failed: {exc}; run `fleet sandbox down --dir {args.state_dir}`")
        node_cpu.remove()
    doc["interrupted"] = interrupted
    doc["profiles"] = profiles
    doc["cells"] = [cell.__dict__ for cell in cells]
    doc["summary"] = [summarize(c) for c in cells]
    doc["targets"] = targets(doc["summary"], doc.get("startup") or {})
    doc["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    doc["loadavg_end"] = os.getloadavg()[0]
    doc["elapsed_min"] = (time.monotonic() - t_start) / 60
    (out_dir / "latest.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    write_markdown(out_dir / "latest.md", doc)
    plot_error = write_plot(out_dir / "latest.png", doc["summary"])
    if plot_error:
        log(f"no plot: {plot_error}")
    scrub_paths(out_dir)
    log(f"wrote {out_dir / 'latest.md'} and latest.json ({doc['elapsed_min']:.1f} min)")
    if interrupted:
        return 130
    return 1 if "error" in doc else 0


def _base_env() -> dict[str, str]:
    """This environment, without what would point the tools elsewhere than the sandbox."""
    base_env = dict(os.environ)
    for noisy in (
        "FLEET_INVENTORY",
        "FLEET_SSH_CONFIG",
        "FLEET_LOG_DIR",
        "PDSH_SSH_ARGS",
        "ANSIBLE_CONFIG",
    ):
        base_env.pop(noisy, None)
    base_env["FLEET_PERSIST"] = "0"  # cold runs; bench/warm.py measures warm connections
    return base_env


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # tear down like Ctrl-C


def _write_partial(out_dir: Path, doc: dict[str, Any], cells: list[Cell]) -> None:
    """Raw samples so far, so a crash or Ctrl-C late in a long run keeps what was measured."""
    partial = {**doc, "cells": [c.__dict__ for c in cells], "partial": True}
    (out_dir / "raw" / "partial.json").write_text(json.dumps(partial, indent=1, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
