"""latest.md, latest.png and the machine description, from the results document."""

from __future__ import annotations

import os
import platform
import shlex
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.common import REPO
from bench.tools import HAND_CLEANUP, TOOL_NOTES, TOOL_ORDER


def machine_info() -> dict[str, Any]:
    def cmd(*argv: str) -> str:
        try:
            p = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"unavailable ({exc})"
        return (
            (p.stdout or p.stderr).strip().splitlines()[0] if (p.stdout or p.stderr).strip() else ""
        )

    def dist(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    git = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "fleet"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": cmd("sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "env_USER_set": "USER" in os.environ or "LOGNAME" in os.environ,
        "versions": {
            "fleet": f"{dist('fleet')} (git {git.stdout.strip()}"
            + (", fleet/ has uncommitted changes)" if dirty.stdout.strip() else ")"),
            "paramiko": dist("paramiko"),
            "cryptography": dist("cryptography"),
            "rich": dist("rich"),
            "parallel-ssh": dist("parallel-ssh"),
            "ssh2-python": dist("ssh2-python"),
            "pdsh": cmd("pdsh", "-V"),
            "ansible": cmd("ansible", "--version"),
            "openssh": cmd("ssh", "-V"),
            "openssh_server": cmd("sh", "-c", "/usr/sbin/sshd -V 2>&1 || true"),
            "py-spy": cmd("py-spy", "--version"),
            "gnu_time": cmd("/usr/bin/time", "--version"),
        },
    }


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


RESULTS_LEGEND = """\
Median wall time over the runs (min-max in brackets); CPU = user+sys of the client process tree
(RUSAGE_CHILDREN deltas); peak RSS = largest single client process (GNU time %M); tree anon = peak
anonymous memory of all client processes together (cgroup, sampled at 20 Hz); procs/threads = peak
counts in the client tree; node CPU = CPU of every process on the sandbox nodes (sshd, its session
processes, the remote commands: the server side, which here shares the client's 2 cores; on a real
cluster each node pays its share on its own CPU); machine CPU = busy CPU of the whole machine during
the run (client + nodes + any other load on the machine)."""

CLEANUP_NOTE = """\
Workload `cleanup`: fleet runs `fleet cleanup --yes --grace 1` (one SSH session per node running
cleanup.sh's `all`: TERM, 1 s grace, KILL of training processes and their descendants, GPU reset
check, in-use-aware state removal, port freeing, verification, a per-node report and a run record);
the peers run the hand-written one-liner `{cmd}` (SIGKILL at once, no verification, no report):
fleet does more work per node by design. `fleet-oneliner` runs the peers' one-liner through
`fleet exec`, to compare the engines on identical node work.
Fresh ghosts are planted on every node before every cleanup run (untimed) and every node is
inspected afterwards (untimed): "all nodes clean" counts runs after which no training process, state
path or port listener was left anywhere; the bystander (a `jupyter-lab` process) must survive."""


def row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _unwrap(text: str) -> str:
    return " ".join(text.split("\n"))


def scrub_paths(out_dir: Path) -> None:
    """Results are committed: the repo's path and the interpreter's bin dir are this machine's,
    so the text files say `bench/...` and `python3` / `fleet` instead."""
    bin_dir = str(Path(sys.executable).parent) + "/"
    texts = [
        out_dir / f"{name}.{ext}"
        for name in ("latest", "client", "scale")
        for ext in ("md", "json")
    ]
    for path in [*texts, *out_dir.glob("*.svg")]:
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="surrogateescape")
            text = text.replace(str(REPO) + "/", "").replace(str(REPO), ".")
            text = text.replace(bin_dir, "")
            path.write_text(text, encoding="utf-8", errors="surrogateescape")


def write_markdown(path: Path, doc: dict[str, Any]) -> None:
    m = doc["machine"]
    lines = [
        "# fleet benchmark",
        "",
        f"Generated {doc['finished']} by `{doc['command_line']}` ({doc['elapsed_min']:.1f} min).",
        f"Machine: {m['nproc']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, "
        f"Linux {m['kernel']}, {m['os']}, Python {m['python']}. Load average at start "
        f"{doc['loadavg_start']:.2f}, at end {doc['loadavg_end']:.2f} "
        "(other work on the machine inflates wall times).",
        "",
        "Versions: " + "; ".join(f"{k} {v}" for k, v in m["versions"].items() if v),
        "",
        "## Results",
        "",
        _unwrap(RESULTS_LEGEND),
        "",
        row(
            "tool",
            "N",
            "workload",
            "F",
            "runs",
            "median wall s",
            "CPU s",
            "peak RSS MiB",
            "tree anon MiB",
            "procs/threads",
            "node CPU s",
            "machine CPU s",
            "result",
        ),
        row(
            "---",
            "---:",
            "---",
            "---:",
            "---:",
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
    for r in doc["summary"]:
        head = (r["tool"], r["n"], r["workload"], r["forks"])
        if r["skipped"]:
            lines.append(row(*head, 0, *["-"] * 7, f"skipped: {r['skipped']}"))
            continue
        result = f"{r['ok_runs']}/{r['runs']} ok"
        if "clean_runs" in r:
            result += f"; all nodes clean in {r['clean_runs']}/{r['runs']}"
            if r.get("bystander_killed_runs"):
                result += f"; bystander killed in {r['bystander_killed_runs']}"
        if r.get("failure"):
            result += f"; last error: {' / '.join(r['failure'])[-160:]}"
        wall = f"**{fmt(r['median_wall_s'])}** ({fmt(r['min_wall_s'])}-{fmt(r['max_wall_s'])})"
        pt = f"{r['peak_procs']}/{r['peak_threads']}" if r.get("peak_procs") is not None else "-"
        lines.append(
            row(
                *head,
                r["runs"],
                wall,
                fmt(r["median_cpu_s"]),
                fmt(r["peak_rss_mib"], 1),
                fmt(r["tree_anon_peak_mib"], 1),
                pt,
                fmt(r["median_node_cpu_s"], 1),
                fmt(r["median_machine_cpu_s"], 1),
                result,
            )
        )
    lines += ["", "Tools:", ""]
    lines += [f"- **{k}**: {v}" for k, v in TOOL_NOTES.items()]
    lines += ["", _unwrap(CLEANUP_NOTE.format(cmd=HAND_CLEANUP))]
    lines += ["", "## Targets", "", row("target", "met", "detail"), row("---", "---", "---")]
    for t in doc["targets"]:
        lines.append(row(t["target"], "yes" if t["met"] else "**no**", t["detail"]))
    st = doc.get("startup") or {}
    if st:
        warm, cold = st["help_warm_s"], st["help_as_this_env_s"]
        lines += [
            "",
            "## Start-up",
            "",
            f"- `fleet --help` (`python -m fleet`, bytecode cached): median "
            f"{statistics.median(warm):.3f}s over {len(warm)} runs (min {min(warm):.3f}s).",
        ]
        if st.get("exec_help_warm_s"):
            lines.append(
                f"- `fleet exec --help`: median {statistics.median(st['exec_help_warm_s']):.3f}s; "
                f"client CPU (user+sys) {statistics.median(st['help_warm_cpu_s']):.3f}s for "
                f"--help, {statistics.median(st['exec_help_warm_cpu_s']):.3f}s for exec --help."
            )
        if st.get("help_console_script_warm_s"):
            lines.append(
                f"- `{st['help_console_script']} --help` (console script): median "
                f"{statistics.median(st['help_console_script_warm_s']):.3f}s."
            )
        lines.append(
            f"- Without .pyc (PYTHONDONTWRITEBYTECODE=1, as this machine's environment sets it): "
            f"median {statistics.median(cold):.3f}s; bare `python -c pass`: "
            f"{statistics.median(st['python_bare_s']):.3f}s."
        )
        for key, title in (
            ("importtime_help", "`fleet --help` (what it loads)"),
            ("importtime_exec_help", "`fleet exec --help`"),
            ("importtime_run", "the run path (+ executor, transport, reporters, runlog)"),
        ):
            it = st.get(key)
            if not it:
                continue
            lines += [
                "",
                f"`python -X importtime` for {title}: {it['total_ms']:.0f} ms in all. "
                "Top cumulative:",
                "",
                row("module", "cumulative ms", "self ms"),
                row("---", "---:", "---:"),
            ]
            lines += [
                row(r["module"], r["cumulative_ms"], r["self_ms"])
                for r in it["top_cumulative"][:10]
            ]
            top_self = ", ".join(f"{r['module']} {r['self_ms']} ms" for r in it["top_self"][:10])
            lines += ["", f"Top self: {top_self}"]
    hs = doc.get("handshake")
    if hs and "error" not in hs:
        lines += [
            "",
            "## Handshake cost (one node, sequential)",
            "",
            f"- fleet's transport (paramiko {hs.get('paramiko_version')}): connect+auth+close "
            f"{hs['paramiko_connect_cpu_ms']} ms client CPU, "
            f"{hs.get('paramiko_connect_server_cpu_ms')} ms node (sshd) CPU, "
            f"{hs['paramiko_connect_wall_ms']} ms wall; "
            f"negotiated {hs.get('paramiko_negotiated')}.",
            "- OpenSSH `ssh node true` (process start, handshake, command): "
            f"{hs['openssh_exec_true_cpu_ms']} ms client CPU, "
            f"{hs.get('openssh_exec_true_server_cpu_ms')} ms node (sshd) CPU, "
            f"{hs['openssh_exec_true_wall_ms']} ms wall; "
            f"negotiated {hs.get('openssh_negotiated')}.",
        ]
    elif hs:
        lines += ["", f"Handshake micro-benchmark failed: {hs['error']}"]
    for prof in doc.get("profiles", []):
        lines += ["", f"## py-spy profile: {prof.get('label')}", ""]
        gil = prof.get("gil")
        if not gil:
            lines.append(f"failed: {prof}")
            continue
        lines.append(
            f"`{shlex.join(prof['command'])}`, py-spy at 250 Hz. Flame graph (--gil): "
            f"`{prof.get('flamegraph')}`. With --gil, {gil['samples']} samples in "
            f"{prof.get('gil_wall_s')} s: a fleet thread held the GIL "
            f"{prof.get('gil_busy_pct')}% of the wall time. Wall-clock sampling: when the "
            "machine's cores are saturated (see machine CPU above), a thread preempted while "
            "holding the GIL keeps being sampled where it stopped (often in C code such as json "
            "encoding), so "
            "rank CPU costs with the yappi profile and the A/B below."
        )
        lines += [
            "",
            "GIL samples by thread: "
            + ", ".join(f"{t['frame']} {t['pct']}%" for t in gil["by_thread"]),
        ]
        lines += ["", "| top self (GIL held) | % |", "| --- | ---: |"]
        lines += [f"| `{t['frame']}` | {t['pct']} |" for t in gil["top_self"][:15]]
        lines += ["", "| top inclusive (GIL held) | % |", "| --- | ---: |"]
        lines += [f"| `{t['frame']}` | {t['pct']} |" for t in gil["top_inclusive"][:30]]
    cpu = doc.get("cpu_profile")
    if cpu and "groups" in cpu:
        lines += [
            "",
            f"## CPU profile (yappi, CPU clock, all threads): {cpu.get('label')}",
            "",
            f"`bench/profile_cpu.py`, raw data `{cpu.get('file')}`. Profiled CPU "
            f"{cpu['profiled_cpu_s']} s (profiling inflates pure-Python code 2-10x against C code "
            "such as crypto and syscalls: read the shares as a ranking, and the A/B below and the "
            f"start-up section for real costs). By thread: {cpu['threads_cpu_s']}.",
            "",
            row("inclusive CPU of", "s", "%"),
            row("---", "---:", "---:"),
        ]
        lines += [row(k, v["cpu_s"], v["pct"]) for k, v in cpu["groups"].items() if v["cpu_s"]]
        lines += ["", row("top self CPU", "calls", "s", "%"), row("---", "---:", "---:", "---:")]
        lines += [
            row(f"`{r['name']}` ({r['module']})", r["ncall"], round(r["tsub"], 3), r["pct"])
            for r in cpu["top_self"][:15]
        ]
    elif cpu:
        lines += ["", f"CPU profile failed: {cpu.get('error')}"]
    ab = doc.get("lookup_ab")
    if ab:
        lines += [
            "",
            f"## ssh_config lookup A/B (fleet exec, N={doc.get('lookup_ab_n')}, 3 runs each)",
            "",
            "paramiko's `SSHConfig.lookup` walks every Host block for every host (twice) and calls "
            "`getpass.getuser()` for each block that does not match, which falls back to a pwd "
            "lookup when USER/LOGNAME are unset (as in this environment); the sandbox's ssh_config "
            "has one Host block per node, so the cost grows with N squared.",
            "",
            row("variant", "median wall s", "median CPU s", "ok"),
            row("---", "---:", "---:", "---"),
        ]
        lines += [
            row(k, v["median_wall_s"], v["median_cpu_s"], "yes" if v["ok"] else "no")
            for k, v in ab.items()
        ]
    path.write_text("\n".join(lines) + "\n")


def write_plot(path: Path, rows: list[dict[str, Any]]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed"
    workloads = sorted({r["workload"] for r in rows}, key=["exec", "cleanup"].index)
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.5), squeeze=False)
    colors = {tool: f"C{i}" for i, tool in enumerate(TOOL_ORDER)}  # same tool, same colour
    for ax, workload in zip(axes[0], workloads, strict=True):
        for tool in TOOL_ORDER:
            pts = sorted(
                (r["n"], r["median_wall_s"])
                for r in rows
                if r["tool"] == tool and r["workload"] == workload and r["ok_runs"]
            )
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=tool, color=colors[tool])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("nodes")
        ax.set_ylabel("median wall time (s)")
        ax.set_title(workload)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
