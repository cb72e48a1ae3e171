#!/usr/bin/env python3
"""fleet at scale against parallel-ssh and pdsh, in one run on the same sandbox nodes.

    sudo .venv/bin/python bench/scale.py                 # cold 8,128,512 x3; warm 128 x3, 1000 x1
    sudo .venv/bin/python bench/scale.py --quick         # cold 8,128 x1; warm 128 x1
    sudo .venv/bin/python bench/scale.py --cold-sizes 128 --warm-sizes 128,1000 --runs 3

Cold: `exec true` on every node for fleet, parallel-ssh and `pdsh -R ssh`, F = min(N, 64) hosts at
a time for each; per run the wall time, the CPU of the whole client tree (a cgroup: fleet's
workers and the keepers it starts included), the CPU per host, and each process's CPU, to give
the largest single process's share. fleet starts every cold run with no warm connection
(`fleet disconnect`, where it exists) and its own defaults otherwise.

Warm: with FLEET_PERSIST=--persist, a first `exec true` (no warm connection) and a second one
within the window, wall and CPU of each and their ratio; then `fleet connections --json` and
`fleet disconnect`, and how long the keepers took to go. A fleet without --workers, --persist,
`disconnect` or `connections` is measured as it is, and the report says what was not available.

Writes bench/results/scale.json (every sample) and scale.md. Needs root (the sandbox). The sandbox
is torn down at the end, also on Ctrl-C or an error. The host's ARP thresholds are left as
they are: the sandbox pins its nodes' addresses on its bridge, so 1,000 nodes fit the defaults.
Parts: scale_proc.py (one measured run, per-process CPU), scale_fleet.py (features, record,
keepers), scale_cells.py (cold and warm at one size), scale_report.py (scale.md).
"""

from __future__ import annotations

import argparse
import contextlib
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
sys.path.insert(0, str(BENCH.parent))

from bench.common import log, python_env  # noqa: E402
from bench.measure import NodeCpu  # noqa: E402
from bench.report import machine_info, scrub_paths  # noqa: E402
from bench.scale_cells import Setup, cold_size, fleet_argv, peer_run, warm_size  # noqa: E402
from bench.scale_fleet import disconnect, features  # noqa: E402
from bench.scale_proc import ClientGroup, run_client, settle  # noqa: E402
from bench.scale_report import write_scale_markdown  # noqa: E402
from bench.tools import TOOLS, Ctx  # noqa: E402
from fleet.sandbox import Sandbox  # noqa: E402

# fleet-persist0: fleet with FLEET_PERSIST=0, where warm connections exist (no keeper started).
COLD_TOOLS = ("fleet", "fleet-persist0", "pssh", "pdsh")


def _sizes(text: str, ap: argparse.ArgumentParser, what: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x]
    except ValueError:
        ap.error(f"{what} {text}: node counts separated by commas, e.g. 8,128")
    if any(n < 1 or n > 1024 for n in sizes):
        ap.error(f"{what} {text}: each size between 1 and 1024 (the sandbox's limit)")
    return sizes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="cold 8,128 and warm 128, 1 run each")
    ap.add_argument("--cold-sizes", help="sizes for the cold comparison [8,128,512]")
    ap.add_argument("--warm-sizes", help="sizes for fleet's cold/warm pairs [128,1000]")
    ap.add_argument("--runs", type=int, help="runs per tool and size (medians) [3; --quick 1]")
    ap.add_argument("--warm-runs-large", type=int, default=1, help="warm pairs at N >= 512 [1]")
    ap.add_argument(
        "--tools", default=",".join(COLD_TOOLS), help="cold tools [fleet,fleet-persist0,pssh,pdsh]"
    )
    ap.add_argument("--max-forks", type=int, default=64, help="F = min(N, this) for all [64]")
    ap.add_argument("--workers", type=int, help="pass --workers W to fleet [fleet's default]")
    ap.add_argument("--persist", type=float, default=120, help="FLEET_PERSIST, warm runs [120]")
    ap.add_argument(
        "--warm-peers-max",
        type=int,
        default=128,
        help="also pair pdsh over OpenSSH ControlPersist at warm sizes up to this [128]",
    )
    ap.add_argument(
        "--settle-s",
        type=float,
        default=60,
        help="after the sandbox grows, wait up to this long for the machine to calm down [60]",
    )
    ap.add_argument("--timeout", type=float, default=300, help="seconds per command [300]")
    ap.add_argument("--mem-limit-mib", type=int, default=6144, help="client cgroup limit [6144]")
    ap.add_argument("--pids-max", type=int, default=8192, help="client cgroup tasks [8192]")
    ap.add_argument(
        "--min-free-mib",
        type=int,
        default=1536,
        help="kill the client if the machine's MemAvailable drops under this [1536]",
    )
    ap.add_argument("--subnet", default="10.250.0.0/16", help="sandbox subnet [10.250.0.0/16]")
    ap.add_argument("--state-dir", type=Path, default=BENCH / ".sandbox", help="[bench/.sandbox]")
    ap.add_argument("--out", type=Path, default=BENCH / "results", help="[bench/results]")
    ap.add_argument("--keep-sandbox", action="store_true", help="leave the sandbox running")
    ap.add_argument("--report-only", action="store_true", help="rewrite scale.md from scale.json")
    args = ap.parse_args(argv)
    args.cold_sizes = _sizes(
        args.cold_sizes
        if args.cold_sizes is not None
        else ("8,128" if args.quick else "8,128,512"),
        ap,
        "--cold-sizes",
    )
    args.warm_sizes = _sizes(
        args.warm_sizes if args.warm_sizes is not None else ("128" if args.quick else "128,1000"),
        ap,
        "--warm-sizes",
    )
    args.runs = args.runs or (1 if args.quick else 3)
    args.tools = [t for t in args.tools.split(",") if t]
    if bad := [t for t in args.tools if t not in COLD_TOOLS]:
        ap.error(f"unknown tool: {', '.join(bad)} (fleet, pssh, pdsh)")
    return args


def _fleet_env(base: dict[str, str], state_dir: Path) -> dict[str, str]:
    """fleet's environment: the bench's bytecode cache, and a private HOME and XDG dirs, so its
    warm connections, config and `fleet disconnect` are the bench's alone, never the operator's
    or another fleet's on this machine."""
    home = state_dir / "home"
    env = python_env(base)
    env.pop("FLEET_PERSIST", None)  # fleet's own default; the warm pairs and fleet-persist0 set it
    for key, sub in (
        ("HOME", ""),
        ("XDG_RUNTIME_DIR", "run"),
        ("XDG_STATE_HOME", "state"),
        ("XDG_CACHE_HOME", "cache"),
        ("XDG_CONFIG_HOME", "config"),
    ):
        path = home / sub if sub else home
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.chmod(0o700)
        env[key] = str(path)
    return env


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("FLEET_") or key in ("PDSH_SSH_ARGS", "SSH_AUTH_SOCK"):
            env.pop(key)
    return env


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only:
        write_scale_markdown(
            args.out / "scale.md", json.loads((args.out / "scale.json").read_text())
        )
        scrub_paths(args.out)
        return 0
    if os.geteuid() != 0:
        print("bench/scale.py needs root (the sandbox uses namespaces)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _sigterm)
    raw_dir = args.out / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    runs_dir = args.state_dir / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    base_env = _base_env()
    py_env = python_env(base_env)
    fleet_env = _fleet_env(base_env, args.state_dir)
    fleet = [sys.executable, "-m", "fleet"]
    feats = features(fleet, fleet_env)
    unavailable = {
        t: why for t in args.tools if t in TOOLS and t != "fleet" and (why := TOOLS[t].available())
    }
    if "fleet-persist0" in args.tools and not feats["persist"]:
        unavailable["fleet-persist0"] = "no --persist: the same as fleet"
    tools = [t for t in args.tools if t not in unavailable]
    cmd = (
        shlex.join([sys.executable, *sys.argv])
        if argv is None
        else shlex.join(["bench/scale.py", *argv])
    )
    doc: dict[str, Any] = {
        "command_line": cmd,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "loadavg_start": os.getloadavg(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "features": feats,
        "unavailable": unavailable,
        "machine": machine_info(),
        "cold": {},
        "warm": {},
    }
    log(f"fleet features: {feats}; peers not available: {unavailable or 'none'}")
    group = ClientGroup(f"fleet-bench-scale-{os.getpid()}", args.mem_limit_mib, args.pids_max)
    if group.missing():
        log(f"cgroup-v1 controllers missing: {group.missing()} (their figures are not recorded)")
    node_cpu = NodeCpu()
    box = Sandbox(args.state_dir, subnet=args.subnet)
    sizes = sorted(set(args.cold_sizes) | set(args.warm_sizes))
    t_start = time.monotonic()
    interrupted = False
    try:
        for n in sizes:
            log(f"sandbox: up {n} nodes on {args.subnet}")
            t0 = time.monotonic()
            nodes = box.up(n)
            log(f"sandbox: {len(nodes)} nodes answering ({time.monotonic() - t0:.0f}s)")
            node_cpu.attach([nd.pid1 for nd in nodes])
            doc.setdefault("settle", {})[str(n)] = calm = settle(args.settle_s, 0.35)
            log(f"settled: {calm}")
            names, addrs = args.state_dir / "hosts.names", args.state_dir / "hosts.addrs"
            names.write_text("".join(f"{nd.name}\n" for nd in nodes))
            addrs.write_text("".join(f"{nd.address}\n" for nd in nodes))
            ctx = Ctx(
                box,
                node_cpu,
                n,
                min(n, args.max_forks),
                names,
                addrs,
                runs_dir,
                fleet,
                base_env,
                py_env,
            )
            setup = Setup(
                ctx, group, raw_dir, args.timeout, feats, fleet_env, args.workers, args.min_free_mib
            )
            if n == sizes[0]:
                _warm_caches(setup, tools)
            if n in args.cold_sizes:
                doc["cold"][str(n)] = cold_size(setup, tools, args.runs)
            if n in args.warm_sizes:
                runs = args.warm_runs_large if n >= 512 else args.runs
                peers = "pdsh" in tools and n <= args.warm_peers_max
                doc["warm"][str(n)] = warm_size(setup, runs, args.persist, peers)
            (raw_dir / "scale-partial.json").write_text(json.dumps(doc, indent=1) + "\n")
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: tearing down")
    except Exception as exc:  # keep what was measured
        doc["error"] = traceback.format_exc()
        log(f"error: {type(exc).__name__}: {exc}")
    finally:
        if feats["disconnect"]:
            with contextlib.suppress(Exception):
                doc["final_disconnect"] = disconnect(fleet, fleet_env, group)
        group.remove()
        if not args.keep_sandbox:
            log("sandbox: down")
            try:
                box.down()
            except Exception as exc:
                log(f"sandbox down failed: {exc}; run `fleet sandbox down --dir {args.state_dir}`")
        node_cpu.remove()
    doc["interrupted"] = interrupted
    doc["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    doc["loadavg_end"] = os.getloadavg()
    doc["elapsed_min"] = round((time.monotonic() - t_start) / 60, 1)
    (args.out / "scale.json").write_text(json.dumps(doc, indent=1) + "\n")
    write_scale_markdown(args.out / "scale.md", doc)
    scrub_paths(args.out)
    log(f"wrote {args.out / 'scale.md'} and scale.json ({doc['elapsed_min']} min)")
    if interrupted:
        return 130
    return 1 if "error" in doc else 0


def _warm_caches(setup: Setup, tools: list[str]) -> None:
    """Page cache and bytecode for every tool, untimed, before the first measured run."""
    log_dir = setup.ctx.log_dir / "warmup"
    log_dir.mkdir(exist_ok=True)
    run_client(
        fleet_argv(setup, log_dir),
        setup.fleet_env,
        setup.group,
        setup.timeout_s,
        setup.raw_dir,
        "scale-warmup-fleet",
    )
    if setup.features["disconnect"]:
        disconnect(setup.ctx.fleet_cmd, setup.fleet_env, setup.group)
    setup.group.kill_all()
    for tool in tools:
        if tool != "fleet":
            peer_run(setup, tool, f"scale-warmup-{tool}")
            setup.group.kill_all()


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
