"""Client cost: what fleet itself costs where it runs, at large fleet sizes (`--client-cost`).

For each size N (default 128 and 512 nodes) it runs `fleet exec true` and `fleet cleanup --yes
--grace 1` (ghosts planted on every node before each cleanup, untimed; every node checked after,
untimed), F = min(N, --max-forks) hosts at a time, and records per run:

* wall time;
* the fleet process's own peak RSS and CPU time (user + sys), from wait4: the kernel's totals for
  that child, not sampled values;
* the bytes each node's SSH connection carried, both ways: sshd on a sandbox node logs
  `Transferred: sent S, received R bytes` (LogLevel VERBOSE) when a connection ends, so S is
  what the client received from that node and R what it sent (encrypted, with SSH framing).

Bytes of facts per node: when the measured checkout has fleet/remote/facts.sh and `fleet cleanup
--preview` (gather the cleanup's facts, change nothing), one preview run with ghosts planted;
per node, what the node sent beyond what it sends for `exec true` (banner, key exchange, auth,
exit status) is the facts, plus SSH framing. Otherwise the report says "n/a" and why.

`--compare PATH` measures the fleet package at PATH as well (another checkout, e.g. a `git
clone` at the commit before a change), each run right after the same run of this checkout, so
both see the same machine. Results: client.md and client.json in --out.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import REPO, log, python_env
from bench.ghosts import plant_all, reset_nodes, verify_clean
from bench.report import fmt, machine_info, row, scrub_paths
from bench.watch import has_watch, watch_cost
from fleet.sandbox import Sandbox, SandboxNode

TRANSFERRED = re.compile(rb"Transferred: sent (\d+), received (\d+) bytes")
ACCEPTED = b"Accepted publickey for "
RESET = b"Read error from remote host "
WORKLOADS = ("exec", "cleanup")


@dataclass(frozen=True)
class Fleet:
    """One fleet checkout to measure: how the report names it and where its package is."""

    label: str
    src: Path

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """The environment its `python -m fleet` runs in: its own package first on the path."""
        return {**python_env(base), "PYTHONPATH": str(self.src)}

    def revision(self) -> str:
        """`git describe`-like id of the checkout, or 'not a git checkout'."""
        git = subprocess.run(
            ["git", "-C", str(self.src), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        )
        if git.returncode != 0:
            return "not a git checkout"
        dirty = subprocess.run(
            ["git", "-C", str(self.src), "status", "--porcelain", "fleet"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return git.stdout.strip() + (" + uncommitted changes in fleet/" if dirty else "")

    def preview_missing(self, env: dict[str, str]) -> str | None:
        """Why this checkout cannot report bytes of facts (None if it can)."""
        if not (self.src / "fleet" / "remote" / "facts.sh").is_file():
            return "no fleet/remote/facts.sh in this checkout"
        helptext = subprocess.run(
            [sys.executable, "-m", "fleet", "cleanup", "--help"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=60,
        ).stdout
        if "--preview" not in helptext:
            return "this checkout's `fleet cleanup` has no --preview"
        return None


# --------------------------------------------------------------------------- one run


def run_child(
    argv: Sequence[str], env: dict[str, str], timeout_s: float, out_dir: Path, label: str
) -> dict[str, Any]:
    """Run argv (stdin /dev/null, output to files) and reap it with wait4: wall, rc, and the
    child's own peak RSS and user/sys CPU. Past timeout_s its process group is killed."""
    out_path, err_path = out_dir / f"{label}.out", out_dir / f"{label}.err"
    fired = threading.Event()

    def kill(pid: int) -> None:
        fired.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    with out_path.open("wb") as out, err_path.open("wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            cwd=str(out_dir),
            start_new_session=True,
        )
        timer = threading.Timer(timeout_s, kill, (proc.pid,))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    sample: dict[str, Any] = {
        "wall_s": round(wall, 3),
        "rc": proc.returncode,
        "timed_out": fired.is_set(),
        "max_rss_mib": round(usage.ru_maxrss / 1024, 1),  # ru_maxrss is in KiB on Linux
        "user_s": round(usage.ru_utime, 3),
        "sys_s": round(usage.ru_stime, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
    }
    if proc.returncode != 0 or fired.is_set():
        sample["stderr_tail"] = err_path.read_text(errors="replace").splitlines()[-5:]
    return sample


class SshdLogs:
    """The SSH bytes of each node's connections since `mark()`, from the nodes' sshd logs."""

    def __init__(self, nodes: Sequence[SandboxNode]) -> None:
        self.paths = {n.name: n.node_dir / "sshd.log" for n in nodes}
        self.offsets: dict[str, int] = {}

    def mark(self) -> None:
        """Remember where each log ends now: later connections are counted from here."""
        self.offsets = {name: _size(path) for name, path in self.paths.items()}

    def collect(self, timeout_s: float = 5) -> dict[str, tuple[int, int] | None]:
        """Per node: (bytes sent to the client, bytes received from it) over its connections
        since mark(), or None where a connection ended without its total. sshd logs the total
        when the connection's process ends, just after the client is gone; a connection the
        client reset (`Read error from remote host`) ends without one. Waits (up to timeout_s)
        until every accepted connection has ended one way or the other."""
        deadline = time.monotonic() + timeout_s
        pending = dict(self.paths)
        totals: dict[str, tuple[int, int] | None] = {}
        while pending:
            for name, path in list(pending.items()):
                with path.open("rb") as fh:
                    fh.seek(self.offsets.get(name, 0))
                    text = fh.read()
                counts = TRANSFERRED.findall(text)
                accepted, reset = text.count(ACCEPTED), text.count(RESET)
                if len(counts) + reset >= accepted or time.monotonic() > deadline:
                    complete = len(counts) == accepted
                    sent = sum(int(s) for s, _ in counts)
                    totals[name] = (sent, sum(int(r) for _, r in counts)) if complete else None
                    del pending[name]
            if pending:
                time.sleep(0.05)
        return totals


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _spread(values: Sequence[int]) -> dict[str, int] | None:
    """Median, min and max of per-node values (None if there are none)."""
    if not values:
        return None
    return {"median": int(statistics.median(values)), "min": min(values), "max": max(values)}


# --------------------------------------------------------------------------- one size


@dataclass
class Setup:
    """What every run at one size needs."""

    box: Sandbox
    nodes: list[SandboxNode]
    forks: int
    log_dir: Path
    raw_dir: Path
    timeout_s: float
    base_env: dict[str, str]


def common_args(setup: Setup) -> list[str]:
    """The sandbox's inventory and ssh config, the run-record dir, F hosts at a time."""
    common = ["-i", str(setup.box.inventory_path), "-F", str(setup.box.ssh_config_path)]
    return [*common, "--log-dir", str(setup.log_dir), "-f", str(setup.forks)]


def fleet_argv(setup: Setup, workload: str) -> list[str]:
    """`python -m fleet ...` for one workload, against the sandbox, F hosts at a time."""
    common = common_args(setup)
    verb = {
        "exec": ["exec", "true", "--plain"],
        "cleanup": ["cleanup", "--yes", "--grace", "1", "--plain"],
        "preview": ["cleanup", "--preview"],
    }[workload]
    return [sys.executable, "-m", "fleet", *verb, *common]


def one_run(setup: Setup, fleet: Fleet, workload: str, logs: SshdLogs) -> dict[str, Any]:
    """One measured run; ghosts planted first (and checked after) for the cleanup workloads."""
    if workload != "exec":
        plant_all(setup.box, setup.nodes)
    logs.mark()
    label = f"client-{fleet.label}-{len(setup.nodes)}-{workload}"
    sample = run_child(
        fleet_argv(setup, workload),
        fleet.env(setup.base_env),
        setup.timeout_s,
        setup.raw_dir,
        label,
    )
    known = [t for t in (logs.collect().get(n.name) for n in setup.nodes) if t is not None]
    sample["per_node_sent"] = [sent for sent, _ in known]
    sample["ssh_sent_per_node"] = _spread(sample["per_node_sent"])
    sample["ssh_received_per_node"] = _spread([received for _, received in known])
    sample["ssh_nodes_without_total"] = len(setup.nodes) - len(known)
    if workload == "cleanup":
        sample["verify"] = verify_clean(setup.box, setup.nodes)
    log(
        f"  N={len(setup.nodes):<4} {workload:<7} {fleet.label:<8} {sample['wall_s']:7.2f}s wall "
        f"{sample['cpu_s']:6.2f}s cpu {sample['max_rss_mib']:6.1f} MiB rss "
        f"{(sample['ssh_sent_per_node'] or {}).get('median')} B/node from nodes rc={sample['rc']}"
        + (f" clean {sample['verify']['clean_nodes']}" if "verify" in sample else "")
    )
    return sample


def measure_size(
    setup: Setup, fleets: Sequence[Fleet], runs: int, preview: dict[str, str | None]
) -> dict[str, Any]:
    """Every fleet's runs at one size, interleaved; then facts bytes where a preview exists."""
    logs = SshdLogs(setup.nodes)
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {
        f.label: {w: [] for w in WORKLOADS} for f in fleets
    }
    for workload in WORKLOADS:
        for _ in range(runs):
            for fleet in fleets:
                samples[fleet.label][workload].append(one_run(setup, fleet, workload, logs))
    facts: dict[str, Any] = {}
    for fleet in fleets:
        missing = preview[fleet.label]
        if missing is not None:
            facts[fleet.label] = {"bytes_per_node": None, "why": missing}
            continue
        run = one_run(setup, fleet, "preview", logs)
        # What `exec true` makes a node send is the same on every node (same keys, banner).
        exec_sent = _median_of(samples[fleet.label]["exec"], "ssh_sent_per_node")
        beyond = [sent - exec_sent for sent in run["per_node_sent"]] if exec_sent else []
        why = None
        if run["rc"] != 0:
            why = f"cleanup --preview exited {run['rc']}"
        elif not beyond:
            why = "no node logged the bytes of its connection"
        facts[fleet.label] = {
            "bytes_per_node": None if why else _spread(beyond),
            "why": why,
            "preview": _public(run),
        }
    watches: dict[str, Any] = {}
    for fleet in fleets:
        env = fleet.env(setup.base_env)
        if not has_watch(env, setup.raw_dir):
            watches[fleet.label] = {"failure": "no `fleet status --watch` in this checkout"}
            continue
        watches[fleet.label] = watch_cost(common_args(setup), env, len(setup.nodes), setup.raw_dir)
        log(f"  N={len(setup.nodes):<4} watch   {fleet.label:<8} {watches[fleet.label]}")
    reset_nodes(setup.box, setup.nodes)
    return {
        "watch": watches,
        "forks": setup.forks,
        "samples": {
            label: {w: [_public(s) for s in ss] for w, ss in by.items()}
            for label, by in samples.items()
        },
        "summary": {
            label: {w: summarize(ss, by["exec"], len(setup.nodes)) for w, ss in by.items()}
            for label, by in samples.items()
        },
        "facts": facts,
    }


def _median_of(samples: list[dict[str, Any]], key: str) -> int | None:
    """The median over runs of a per-node spread's median (None if no run has one)."""
    values = [s[key]["median"] for s in samples if s.get(key)]
    return int(statistics.median(values)) if values else None


def _public(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample without its per-node lists (512 numbers each: the spreads summarise them)."""
    return {k: v for k, v in sample.items() if not k.startswith("per_node_")}


def summarize(
    samples: list[dict[str, Any]], exec_samples: list[dict[str, Any]], n: int
) -> dict[str, Any]:
    """Medians over the runs of one fleet, size and workload (peak RSS: the worst run)."""
    ok = [s for s in samples if s["rc"] == 0 and not s["timed_out"]] or samples

    def med(key: str) -> float:
        return round(statistics.median(s[key] for s in ok), 3)

    exec_sent = _median_of(exec_samples, "ssh_sent_per_node")
    sent = _median_of(ok, "ssh_sent_per_node")
    out: dict[str, Any] = {
        "runs": len(samples),
        "ok_runs": sum(s["rc"] == 0 and not s["timed_out"] for s in samples),
        "median_wall_s": med("wall_s"),
        "min_wall_s": min(s["wall_s"] for s in ok),
        "max_wall_s": max(s["wall_s"] for s in ok),
        "peak_rss_mib": max(s["max_rss_mib"] for s in ok),
        "median_cpu_s": med("cpu_s"),
        "median_user_s": med("user_s"),
        "median_sys_s": med("sys_s"),
        "ssh_sent_per_node": sent,
        "ssh_sent_beyond_exec_per_node": None
        if sent is None or exec_sent is None
        else sent - exec_sent,
        "ssh_received_per_node": _median_of(ok, "ssh_received_per_node"),
        "ssh_nodes_without_total": max(s["ssh_nodes_without_total"] for s in samples),
    }
    verifies = [s["verify"] for s in samples if "verify" in s]
    if verifies:
        out["clean_runs"] = sum(v["clean_nodes"] == n for v in verifies)
        out["bystander_killed_runs"] = sum(v["bystander_killed_nodes"] > 0 for v in verifies)
    if not out["ok_runs"]:
        out["failure"] = samples[-1].get("stderr_tail")
    return out


# --------------------------------------------------------------------------- the mode


def client_cost(args: Any, base_env: dict[str, str], command_line: str) -> int:
    """`bench/run.py --client-cost`: bring the sandbox to each size, measure, write the report."""
    out_dir: Path = args.out
    raw_dir = out_dir / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    log_dir = args.state_dir / "runs"
    log_dir.mkdir(parents=True, exist_ok=True)
    fleets = [Fleet("this", REPO)]
    if args.compare:
        fleets.append(Fleet("compare", Path(args.compare).resolve()))
        log(f"compare: the fleet package in {fleets[-1].src} ({fleets[-1].revision()})")
    preview = {f.label: f.preview_missing(f.env(base_env)) for f in fleets}
    doc: dict[str, Any] = {
        "command_line": command_line,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "loadavg_start": os.getloadavg()[0],
        "config": {
            "sizes": args.sizes,
            "runs": args.runs,
            "large_n": args.large_n,
            "large_runs": args.large_runs,
            "max_forks": args.max_forks,
            "timeout_s": args.timeout,
            "subnet": args.subnet,
        },
        "fleets": {f.label: f.revision() for f in fleets},
        "machine": machine_info(),
        "sizes": {},
    }
    box = Sandbox(args.state_dir, subnet=args.subnet)
    interrupted = False
    try:
        for n in sorted(args.sizes):
            log(f"sandbox: up {n} nodes on {args.subnet}")
            nodes = box.up(n)
            setup = Setup(
                box, nodes, min(n, args.max_forks), log_dir, raw_dir, args.timeout, base_env
            )
            runs = min(args.runs, args.large_runs) if n >= args.large_n else args.runs
            if not doc["sizes"]:  # page cache and bytecode for each fleet, untimed
                for fleet in fleets:
                    run_child(
                        fleet_argv(setup, "exec"),
                        fleet.env(base_env),
                        args.timeout,
                        raw_dir,
                        f"client-warmup-{fleet.label}",
                    )
            doc["sizes"][str(n)] = measure_size(setup, fleets, runs, preview)
            (raw_dir / "client-partial.json").write_text(json.dumps(doc, indent=1) + "\n")
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: tearing down")
    finally:
        if not args.keep_sandbox:
            log("sandbox: down")
            box.down()
    doc["interrupted"] = interrupted
    doc["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    doc["loadavg_end"] = os.getloadavg()[0]
    (out_dir / "client.json").write_text(json.dumps(doc, indent=1) + "\n")
    write_client_markdown(out_dir / "client.md", doc)
    scrub_paths(out_dir)
    log(f"wrote {out_dir / 'client.md'} and client.json")
    return 130 if interrupted else 0


def write_client_markdown(path: Path, doc: dict[str, Any]) -> None:
    """client.md: one row per fleet, size and workload; facts bytes per node; the versions."""
    m = doc["machine"]
    lines = [
        "# fleet client cost",
        "",
        f"Generated {doc['finished']} by `{doc['command_line']}`.",
        f"Machine: {m['nproc']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, Linux "
        f"{m['kernel']}. Load average at start {doc['loadavg_start']:.2f}, at end "
        f"{doc['loadavg_end']:.2f}. The sandbox nodes share the client's cores.",
        "",
        "Fleets measured: "
        + "; ".join(f"**{k}** = {rev}" for k, rev in doc["fleets"].items())
        + " (this: the checkout bench/ is in; compare: --compare PATH)",
        "",
        "Peak RSS and CPU are the fleet process's own (wait4: ru_maxrss, ru_utime + ru_stime); "
        "SSH bytes per node are the median over nodes of what each node's SSH connection "
        'carried (sshd\'s `Transferred:` log line, encrypted, with framing); "beyond exec" '
        "subtracts what `exec true` costs (banner, key exchange, auth, exit status).",
        "",
        row(
            "fleet",
            "N",
            "F",
            "workload",
            "runs",
            "median wall s",
            "peak RSS MiB",
            "CPU s (user+sys)",
            "from nodes B/node",
            "beyond exec B/node",
            "to nodes B/node",
            "result",
        ),
        row(
            "---",
            "---:",
            "---:",
            "---",
            "---:",
            "---:",
            "---:",
            "---:",
            "---:",
            "---:",
            "---:",
            "---",
        ),
    ]
    for n, size in doc["sizes"].items():
        for label, by in size["summary"].items():
            for workload, r in by.items():
                result = f"{r['ok_runs']}/{r['runs']} ok"
                if "clean_runs" in r:
                    result += f"; all nodes clean in {r['clean_runs']}/{r['runs']}"
                if r.get("bystander_killed_runs"):
                    result += f"; bystander killed in {r['bystander_killed_runs']}"
                if r.get("ssh_nodes_without_total"):
                    result += (
                        f"; bytes of up to {r['ssh_nodes_without_total']} nodes not logged "
                        "(connection reset by the client)"
                    )
                if r.get("failure"):
                    result += f"; last error: {' / '.join(r['failure'])[-160:]}"
                lines.append(
                    row(
                        label,
                        n,
                        size["forks"],
                        workload,
                        r["runs"],
                        f"**{fmt(r['median_wall_s'])}** ({fmt(r['min_wall_s'])}-"
                        f"{fmt(r['max_wall_s'])})",
                        fmt(r["peak_rss_mib"], 1),
                        f"{fmt(r['median_cpu_s'])} ({fmt(r['median_user_s'])}+"
                        f"{fmt(r['median_sys_s'])})",
                        _or_dash(r["ssh_sent_per_node"]),
                        _or_dash(
                            r["ssh_sent_beyond_exec_per_node"] if workload != "exec" else None
                        ),
                        _or_dash(r["ssh_received_per_node"]),
                        result,
                    )
                )
    lines += ["", "## Bytes of facts per node", ""]
    for n, size in doc["sizes"].items():
        for label, facts in size["facts"].items():
            spread = facts["bytes_per_node"]
            if spread is None:
                lines.append(f"- {label}, N={n}: n/a ({facts['why']})")
            else:
                lines.append(
                    f"- {label}, N={n}: median {spread['median']} B, min {spread['min']} B, "
                    f"max {spread['max']} B (`fleet cleanup --preview` with ghosts planted, "
                    "beyond `exec true`)"
                )
    lines += ["", "## `fleet status --watch`: client cost per refresh", ""]
    for n, size in doc["sizes"].items():
        for label, w in size.get("watch", {}).items():
            if "cpu_s_per_refresh" not in w:
                lines.append(f"- {label}, N={n}: n/a ({w.get('failure', 'not measured')})")
                continue
            lines.append(
                f"- {label}, N={n}: {w['cpu_s_per_refresh']} s CPU per refresh "
                f"({w['cpu_pct']}% of a core at one refresh every {w['interval_s']:g} s, over "
                f"{w['window_s']:g} s), peak RSS {w['peak_rss_mib']} MiB, all nodes reporting "
                f"after {w['ready_s']} s, nodes marked no answer/lost in the window: "
                f"{w['nodes_in_trouble']}"
            )
    path.write_text("\n".join(lines) + "\n")


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)
