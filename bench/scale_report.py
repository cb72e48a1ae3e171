"""scale.md: bench/scale.py's tables (cold per size, ratios, warm pairs) and the issue's targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import fmt, row

LEGEND = """\
Wall: median over the runs (min-max). Client CPU: user+sys of every process of the client's
cgroup during the run (fleet's workers and keepers included; pdsh's ssh processes included).
CPU/host: client CPU / N. Largest process: the single process of the tree that used the most CPU,
as a share of the tree's (fleet's own process exact, from its zombie's stat; workers from the
run record's getrusage where present, else sampled at 20 Hz and scaled to the parent's
cutime+cstime; keepers from /proc). W / K: fleet's worker processes (1 = no workers) / keepers
that worked during the run (warm connections: hosts are spread over them). Node CPU: the
sandbox nodes' sshd and commands, which share this machine's cores with the client. Other load:
cores kept busy during the run by neither the client nor the nodes (other users of the machine:
machine busy CPU - client - nodes, / wall). Load avg: the 1-minute load average before the run."""


def _f(x: float | None, digits: int = 2) -> str:
    return fmt(x, digits)


def _cold_table(n: str, size: dict[str, Any]) -> list[str]:
    lines = [
        f"### N = {n} (F = {size['forks']})",
        "",
        row(
            "tool",
            "runs ok",
            "wall s",
            "client CPU s",
            "CPU/host ms",
            "largest process",
            "W / K",
            "node CPU s",
            "other load",
            "load avg",
        ),
        row("---", "---:", "---:", "---:", "---:", "---", "---:", "---:", "---:", "---:"),
    ]
    for tool, r in size["summary"].items():
        share = r["median_largest_share"]
        lines.append(
            row(
                tool,
                f"{r['ok_runs']}/{r['runs']}",
                f"**{_f(r['median_wall_s'])}** ({_f(r['min_wall_s'])}-{_f(r['max_wall_s'])})",
                _f(r["median_cpu_s"]),
                f"**{_f(r['cpu_ms_per_host'], 1)}**",
                f"{r['largest_role']} {share:.0%}" if share is not None else "-",
                f"{r['w']} / {r.get('keepers_busy', 0)}" if tool.startswith("fleet") else "-",
                _f(r["median_node_cpu_s"]),
                _f(r.get("median_other_cores_busy")),
                _f(r["median_load"], 1),
            )
        )
        if r.get("failure"):
            lines.append(f"\n{tool} failed: `{' / '.join(r['failure'])[-200:]}`\n")
    rat = size.get("ratios") or {}
    if rat:
        lines += [
            "",
            "Ratios (fleet / peer; below 1: fleet is faster or spends less): "
            + "; ".join(
                f"{k}: wall **{_f(v['wall'])}**, CPU per host **{_f(v['cpu'])}**"
                for k, v in rat.items()
            ),
        ]
    return [*lines, ""]


def _share(r: dict[str, Any]) -> str:
    share = r.get("median_largest_share")
    return f"{r.get('largest_role')} {share:.0%}" if share is not None else "-"


def _warm_rows(n: str, warm: dict[str, Any]) -> list[str]:
    if warm.get("not_available"):
        first = ((warm.get("summary") or {}).get("fleet") or {}).get("first") or {}
        return [
            row(
                n,
                "fleet",
                f"{first.get('ok_runs', 0)}/{first.get('runs', 0)} first runs",
                _f(first.get("median_wall_s")),
                _f(first.get("median_cpu_s")),
                "not available",
                "-",
                "-",
                "-",
                "-",
                warm["not_available"],
            )
        ]
    out = []
    for tool, s in (warm.get("summary") or {}).items():
        if not s:
            continue
        note = ""
        if tool.startswith("fleet"):
            note = (
                f"keepers after 2nd: {s.get('keepers_after_second')}; gone after disconnect "
                f"(s): {s.get('keepers_gone_after_disconnect_s')}; killed by the bench: "
                f"{s.get('keepers_killed_by_bench')}"
            )
        out.append(
            row(
                n,
                tool,
                f"{s['ok_pairs']}/{s['pairs']}",
                _f(s["first"]["median_wall_s"]),
                _f(s["first"]["median_cpu_s"]),
                f"**{_f(s['second']['median_wall_s'])}**",
                _f(s["second"]["median_cpu_s"]),
                _f(s["second"]["cpu_ms_per_host"], 1),
                _share(s["second"]),
                f"**{_f(s['median_wall_speedup'], 1)}x**",
                note,
            )
        )
    return out


def _cold_targets(n: str, name: str, s: dict[str, Any]) -> list[str]:
    """Per host CPU against parallel-ssh's, and 1/W per process, for one fleet row."""
    out: list[str] = []
    f, p = s.get(name), s.get("pssh")
    if f and p and p["ok_runs"]:
        met = f["cpu_ms_per_host"] <= p["cpu_ms_per_host"]
        out.append(
            f"- N={n}: {name}'s client CPU per host <= parallel-ssh's: "
            f"**{'met' if met else 'not met'}** "
            f"({_f(f['cpu_ms_per_host'], 1)} vs {_f(p['cpu_ms_per_host'], 1)} ms)"
        )
    if f:
        w, share = f.get("spread_over", f["w"]), f["median_largest_share"]
        kind = f"{f['w']} workers, {f.get('keepers_busy', 0)} busy keepers"
        if w > 1 and share is not None:
            met = share <= 1 / w
            out.append(
                f"- N={n}: no {name} process over 1/W of its CPU (W={w}: {kind}): "
                f"**{'met' if met else 'not met'}** (largest: {f['largest_role']} {share:.0%})"
            )
        else:
            out.append(f"- N={n}: {name}, 1/W per process: n/a (one process: {kind})")
    return out


def targets(doc: dict[str, Any]) -> list[str]:
    """The issue's "done when", evaluated on this run's medians."""
    out = []
    for n in ("128", "512"):
        size = doc["cold"].get(n)
        if not size:
            continue
        for name in ("fleet", "fleet-persist0"):
            out += _cold_targets(n, name, size["summary"])
    w128 = (doc["warm"].get("128") or {}).get("summary", {}).get("fleet")
    if w128 and "second" in w128:
        sp = w128["median_wall_speedup"]
        out.append(
            f"- N=128: second `exec true` within the window >= 10x faster than the first: "
            f"**{'met' if sp and sp >= 10 else 'not met'}** ({_f(sp, 1)}x)"
        )
    big = max((int(k) for k in doc["warm"]), default=0)
    wbig = (doc["warm"].get(str(big)) or {}).get("summary", {}).get("fleet") if big >= 512 else None
    if wbig and "second" in wbig:
        wall = wbig["second"]["median_wall_s"]
        out.append(
            f"- N={big}: warm `exec true` under 2 s: **{'met' if wall < 2 else 'not met'}** "
            f"({_f(wall)} s)"
        )
    eight = (doc["cold"].get("8") or {}).get("summary", {})
    if eight.get("fleet") and eight.get("pssh") and eight["pssh"]["ok_runs"]:
        fw, pw = eight["fleet"]["median_wall_s"], eight["pssh"]["median_wall_s"]
        out.append(
            f"- N=8: fleet's wall <= parallel-ssh's: **{'met' if fw <= pw else 'not met'}** "
            f"({_f(fw)} vs {_f(pw)} s)"
        )
    return out


def write_scale_markdown(path: Path, doc: dict[str, Any]) -> None:
    m = doc["machine"]
    la0, la1 = doc["loadavg_start"], doc.get("loadavg_end") or [0, 0, 0]
    feats = doc["features"]
    lines = [
        "# fleet at scale: cold and warm `exec true` against parallel-ssh and pdsh",
        "",
        f"Generated {doc.get('finished')} by `{doc['command_line']}` "
        f"({doc.get('elapsed_min')} min).",
        f"Machine: {m['nproc']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, Linux "
        f"{m['kernel']}; fleet {m['versions']['fleet']}. Load average (1/5/15 min) at start "
        f"{la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, at end {la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f}. "
        "The sandbox nodes (real sshd in namespaces) share the client's cores, and other "
        "work on this machine shares them too: the per-run load is in the tables.",
        "",
        "fleet features: "
        + ", ".join(f"{k} {'yes' if v else '**not available**'}" for k, v in feats.items())
        + ". Peers not available: "
        + (", ".join(f"{k} ({v})" for k, v in doc["unavailable"].items()) or "none")
        + ".",
        "",
        "`fleet` runs with its defaults (warm connections on where it has them), each cold run "
        "after `fleet disconnect`; `fleet-persist0` with FLEET_PERSIST=0 (no keeper). "
        "F = min(N, 64) hosts at a time for every tool (`fleet -f F`, `pdsh -f F`, "
        "parallel-ssh `pool_size=F`), the same pool for all rather than each tool's own default "
        "(fleet 32, pdsh 32, parallel-ssh 100), so the engines compare at equal concurrency. "
        "parallel-ssh verifies no host keys; fleet and pdsh (OpenSSH) check them.",
        "",
        "## Targets (issue 20)",
        "",
        *(targets(doc) or ["- nothing to evaluate"]),
        "",
        "## Cold `exec true`",
        "",
        LEGEND,
        "",
    ]
    for n, size in doc["cold"].items():
        lines += _cold_table(n, size)
    lines += [
        "## Warm: a second `exec true` within the window",
        "",
        f"fleet with FLEET_PERSIST={doc['config']['persist']:g}: the first run after "
        "`fleet disconnect` (no warm connection), then the second; medians over the pairs. "
        "`pdsh+ControlPersist` is the same pair through pdsh with OpenSSH's ControlMaster/"
        "ControlPersist (its masters are ended by SIGTERM after each pair). "
        "`fleet --workers 1`: the same pairs with the hosts in one process (the keepers "
        "still spread them over cores), where fleet has --workers.",
        "",
        row(
            "N",
            "tool",
            "pairs ok",
            "1st wall s",
            "1st CPU s",
            "2nd wall s",
            "2nd CPU s",
            "2nd CPU/host ms",
            "2nd largest process",
            "1st/2nd wall",
            "keepers",
        ),
        row("---:", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---", "---:", "---"),
    ]
    for n, warm in doc["warm"].items():
        lines += _warm_rows(n, warm)
    if doc.get("error"):
        lines += ["", "The run ended with an error:", "", "```", doc["error"][-1500:], "```"]
    path.write_text("\n".join(lines) + "\n")
