"""bench/scale.py's measurements at one fleet size: cold `exec true` for fleet and the peers, and
fleet's cold-then-warm pairs; each sample's per-process figures; the medians and ratios."""

from __future__ import annotations

import dataclasses
import signal
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import log
from bench.scale_fleet import (
    connections,
    disconnect,
    keeper_pids_in,
    label_roles,
    record_workers,
)
from bench.scale_proc import ClientGroup, run_client
from bench.tools import Ctx, pdsh_cmd, pssh_cmd


@dataclass(frozen=True)
class Setup:
    """What every run at one size needs."""

    ctx: Ctx
    group: ClientGroup
    raw_dir: Path
    timeout_s: float
    features: dict[str, bool]
    fleet_env: dict[str, str]  # py_env + a private HOME/XDG dirs: the bench's keepers are its own
    workers: int | None  # --workers W passed to fleet, or None for fleet's default
    min_free_mib: int


def fleet_argv(setup: Setup, log_dir: Path) -> list[str]:
    ctx = setup.ctx
    argv = [*ctx.fleet_cmd, "exec", "true", "-i", ctx.inventory, "-F", ctx.ssh_config]
    argv += ["--log-dir", str(log_dir), "--plain", "-f", str(ctx.forks)]
    if setup.workers is not None and setup.features["workers"]:
        argv += ["--workers", str(setup.workers)]
    return argv


def _log_dir(setup: Setup, label: str) -> Path:
    base = setup.ctx.log_dir / label
    k = 1
    while (base.parent / f"{base.name}-{k}").exists():
        k += 1
    path = base.parent / f"{base.name}-{k}"
    path.mkdir(parents=True, mode=0o700)
    return path


def _reset(setup: Setup) -> dict[str, Any]:
    """No warm connection and no process of an earlier run left: `fleet disconnect` where it
    exists, then whatever is still in the group is killed (and counted)."""
    if setup.features["disconnect"]:
        return disconnect(setup.ctx.fleet_cmd, setup.fleet_env, setup.group)
    return {"killed_left": setup.group.kill_all()}


def fleet_run(setup: Setup, label: str, env: dict[str, str]) -> dict[str, Any]:
    """One measured `fleet exec true`; then its workers (run record) and keepers named."""
    log_dir = _log_dir(setup, label)
    sample = run_client(
        fleet_argv(setup, log_dir),
        env,
        setup.group,
        setup.timeout_s,
        setup.raw_dir,
        label,
        setup.ctx.node_cpu,
        min_free_mib=setup.min_free_mib,
    )
    workers = record_workers(log_dir)
    keepers = keeper_pids_in(setup.group)
    if keepers and setup.features["connections"]:
        sample["connections"] = connections(setup.ctx.fleet_cmd, setup.fleet_env)
        keepers |= {k["pid"] for k in sample["connections"].get("keepers", [])}
    sample["keepers_alive_after"] = len(keepers)
    sample["workers_in_record"] = workers
    label_roles(sample["procs"], workers, keepers)
    _shares(sample, workers)
    return sample


def _shares(sample: dict[str, Any], workers: list[dict[str, Any]] | None) -> None:
    """The largest single process's share of the tree's CPU, and W (worker processes)."""
    procs = sample["procs"]
    total = sample.get("cpu_s") or 0
    w = len(workers) if workers else sum(1 for p in procs if p["role"] == "worker")
    k = sum(1 for p in procs if p["role"] == "keeper" and p["cpu_s"] > 0)
    sample["w"] = max(w, 1)
    sample["keepers_busy"] = k
    # The processes the hosts are spread over: workers, or the keepers that hold the connections.
    sample["spread_over"] = max(w, k, 1)
    by_role: dict[str, float] = {}
    for p in procs:
        by_role[p["role"]] = round(by_role.get(p["role"], 0) + p["cpu_s"], 4)
    sample["cpu_by_role"] = by_role
    if procs and total > 0:
        top = procs[0]
        sample["largest"] = {
            "role": top["role"],
            "comm": top["comm"],
            "cpu_s": top["cpu_s"],
            "share": round(top["cpu_s"] / total, 3),
            "source": top["source"],
        }
    sample["procs"] = procs[:12]  # the top ones; pdsh's 512 ssh processes need not all be kept
    sample["procs_seen"] = len(procs)


def peer_run(
    setup: Setup, tool: str, label: str, env_extra: dict[str, str] | None = None
) -> dict[str, Any]:
    argv, env = (pdsh_cmd if tool == "pdsh" else pssh_cmd)(setup.ctx, "exec")
    sample = run_client(
        argv,
        {**env, **(env_extra or {})},
        setup.group,
        setup.timeout_s,
        setup.raw_dir,
        label,
        setup.ctx.node_cpu,
        interval_s=0.1,
        min_free_mib=setup.min_free_mib,
    )
    label_roles(sample["procs"], None, set(), fleet=False)
    _shares(sample, None)
    return sample


def _say(n: int, what: str, s: dict[str, Any]) -> None:
    big = s.get("largest") or {}
    status = "TIMEOUT" if s["timed_out"] else f"rc={s['rc']}"
    log(
        f"  N={n:<5} {what:<22} {s['wall_s']:7.2f}s wall {s['cpu_s']:7.2f}s cpu "
        f"(largest: {big.get('role')} {big.get('share')}) node cpu {s['node_cpu_s']} "
        f"other load {s['other_cores_busy']} {status}"
    )


def cold_size(setup: Setup, tools: list[str], runs: int) -> dict[str, Any]:
    """Cold `exec true`, each tool `runs` times, interleaved; fleet starts with no warm
    connection (disconnect before each run) and its own defaults otherwise."""
    n = setup.ctx.n
    samples: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
    for rep in range(runs):
        for tool in tools[rep % len(tools) :] + tools[: rep % len(tools)]:
            label = f"scale-{tool}-{n}-cold"
            if tool.startswith("fleet"):
                before = _reset(setup)
                env = setup.fleet_env
                if tool == "fleet-persist0":  # no keeper at all: the connections in-process
                    env = {**env, "FLEET_PERSIST": "0"}
                s = fleet_run(setup, label, env)
                s["reset_before"] = before
                s["reset_after"] = _reset(setup)
            else:
                s = peer_run(setup, tool, label)
                s["left_processes"] = setup.group.kill_all()
            samples[tool].append(s)
            _say(n, f"{tool} cold", s)
    summary = {t: summarize(ss, n) for t, ss in samples.items()}
    return {
        "forks": setup.ctx.forks,
        "samples": samples,
        "summary": summary,
        "ratios": ratios(summary),
    }


def warm_size(setup: Setup, runs: int, persist: float, peers: bool) -> dict[str, Any]:
    """fleet with FLEET_PERSIST: `exec true` with no warm connection, then again within the
    window; the keepers it left; `fleet disconnect` and how fast they went. With `peers`, the
    same pair for pdsh over OpenSSH ControlPersist (its own warm connections)."""
    n = setup.ctx.n
    out: dict[str, Any] = {"persist_s": persist, "pairs": [], "peer_pairs": []}
    if not setup.features["persist"]:
        out["not_available"] = "this fleet has no --persist (warm connections)"
        log(f"  N={n:<5} warm: not available; the first (cold) runs only")
        for _ in range(runs):
            first = fleet_run(setup, f"scale-fleet-{n}-first", setup.fleet_env)
            _say(n, "fleet first (cold)", first)
            out["pairs"].append({"first": first, "disconnect": _reset(setup)})
        out["summary"] = {"fleet": {"first": summarize([p["first"] for p in out["pairs"]], n)}}
        return out
    env = {**setup.fleet_env, "FLEET_PERSIST": f"{persist:g}"}
    out["pairs"] = _fleet_pairs(setup, env, runs, "fleet")
    if setup.features["workers"]:  # the same with the hosts in one process (no fork)
        one = dataclasses.replace(setup, workers=1)
        out["pairs_workers1"] = _fleet_pairs(one, env, runs, "fleet-w1")
    if peers:
        cm_dir = setup.ctx.log_dir / "cm"
        cm_dir.mkdir(mode=0o700, exist_ok=True)
        extra = {
            "PDSH_SSH_ARGS": f"-F {setup.ctx.ssh_config} -a -x -o ControlMaster=auto "
            f"-o ControlPath={cm_dir}/%C -o ControlPersist={persist:g} -l%u %h"
        }
        for _ in range(runs):
            cold = peer_run(setup, "pdsh", f"scale-pdshcm-{n}-first", extra)
            _say(n, "pdsh+ControlPersist 1st", cold)
            warm = peer_run(setup, "pdsh", f"scale-pdshcm-{n}-second", extra)
            _say(n, "pdsh+ControlPersist 2nd", warm)
            left = setup.group.kill_all(signal.SIGTERM)  # the ssh masters
            out["peer_pairs"].append({"first": cold, "second": warm, "masters_ended": left})
    out["summary"] = warm_summary(out, n)
    return out


def _fleet_pairs(setup: Setup, env: dict[str, str], runs: int, name: str) -> list[dict[str, Any]]:
    """`runs` first/second pairs, each from no warm connection, then `fleet disconnect`."""
    n = setup.ctx.n
    pairs = []
    for rep in range(runs):
        before = _reset(setup)
        cold = fleet_run(setup, f"scale-{name}-{n}-first", env)
        _say(n, f"{name} first (cold)", cold)
        warm = fleet_run(setup, f"scale-{name}-{n}-second", env)
        _say(n, f"{name} second (warm)", warm)
        after = _reset(setup)
        log(f"  N={n:<5} disconnect: {after}")
        pairs.append(
            {"rep": rep, "reset_before": before, "first": cold, "second": warm, "disconnect": after}
        )
    return pairs


def _med(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 4) if vals else None


def summarize(samples: list[dict[str, Any]], n: int) -> dict[str, Any]:
    ok = [s for s in samples if s["rc"] == 0 and not s["timed_out"]]
    use = ok or samples
    cpu = _med([s.get("cpu_s") for s in use])
    out: dict[str, Any] = {
        "runs": len(samples),
        "ok_runs": len(ok),
        "median_wall_s": _med([s["wall_s"] for s in use]),
        "min_wall_s": min(s["wall_s"] for s in use),
        "max_wall_s": max(s["wall_s"] for s in use),
        "median_cpu_s": cpu,
        "cpu_ms_per_host": round(cpu * 1000 / n, 2) if cpu is not None else None,
        "median_largest_share": _med([(s.get("largest") or {}).get("share") for s in use]),
        "largest_role": (use[-1].get("largest") or {}).get("role"),
        "w": max(s.get("w", 1) for s in use),
        "keepers_busy": max(s.get("keepers_busy", 0) for s in use),
        "spread_over": max(s.get("spread_over", 1) for s in use),
        "median_node_cpu_s": _med([s.get("node_cpu_s") for s in use]),
        "peak_tree_mem_mib": max((s.get("tree_mem_peak_mib") or 0) for s in use),
        "peak_procs": max(s.get("peak_procs", 0) for s in use),
        "median_load": _med([s["loadavg_1m_before"] for s in use]),
        "median_other_cores_busy": _med([s.get("other_cores_busy") for s in use]),
        "cpu_by_role": use[len(use) // 2].get("cpu_by_role"),
    }
    if not ok:
        out["failure"] = samples[-1].get("stderr_tail") or samples[-1].get("stdout_tail")
    return out


def ratios(summary: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """fleet / peer, for wall and for CPU per host (below 1: fleet spends less)."""
    out: dict[str, Any] = {}
    for name in ("fleet", "fleet-persist0"):
        f = summary.get(name)
        for peer in ("pssh", "pdsh"):
            p = summary.get(peer)
            if not f or not p or not p["ok_runs"] or not f["ok_runs"]:
                continue
            cpu = f["median_cpu_s"] / p["median_cpu_s"] if p["median_cpu_s"] else None
            out[f"{name}/{peer}"] = {
                "wall": round(f["median_wall_s"] / p["median_wall_s"], 3),
                "cpu": round(cpu, 3) if cpu is not None else None,
            }
    return out


def warm_summary(out: dict[str, Any], n: int) -> dict[str, Any]:
    def pair_summary(pairs: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not pairs:
            return None
        ok = [p for p in pairs if p["first"]["rc"] == 0 and p["second"]["rc"] == 0] or pairs
        first = summarize([p["first"] for p in ok], n)
        second = summarize([p["second"] for p in ok], n)
        speedups = [
            p["first"]["wall_s"] / p["second"]["wall_s"] for p in ok if p["second"]["wall_s"]
        ]
        cpu_ratios = [
            p["first"]["cpu_s"] / p["second"]["cpu_s"] for p in ok if p["second"].get("cpu_s")
        ]
        return {
            "first": first,
            "second": second,
            "median_wall_speedup": _med(speedups),
            "median_cpu_ratio": _med(cpu_ratios),
            "ok_pairs": sum(p["first"]["rc"] == 0 and p["second"]["rc"] == 0 for p in pairs),
            "pairs": len(pairs),
        }

    summary: dict[str, Any] = {}
    for name, key in (("fleet", "pairs"), ("fleet --workers 1", "pairs_workers1")):
        pairs = out.get(key) or []
        if not pairs:
            continue
        row = pair_summary(pairs)
        assert row is not None  # pairs is not empty
        summary[name] = row
        row["keepers_after_second"] = max(p["second"].get("keepers_alive_after", 0) for p in pairs)
        row["keepers_gone_after_disconnect_s"] = [
            p["disconnect"].get("exited_after_s") for p in pairs
        ]
        row["keepers_killed_by_bench"] = sum(p["disconnect"].get("killed_left", 0) for p in pairs)
    if out["peer_pairs"]:
        summary["pdsh+ControlPersist"] = pair_summary(out["peer_pairs"])
    return summary
