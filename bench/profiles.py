"""Where fleet's client time goes at the largest size: handshake, py-spy, yappi, ssh_config A/B."""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import BENCH, REPO
from bench.ghosts import plant_all, reset_nodes
from bench.measure import Cgroup, NodeCpu, measure
from bench.tools import Ctx, fleet_cmd
from fleet.sandbox import Sandbox, SandboxNode


def handshake_costs(
    box: Sandbox, node: SandboxNode, node_cpu: NodeCpu, count: int = 15
) -> dict[str, Any]:
    """Client CPU per connection, fleet's transport (paramiko) vs OpenSSH `ssh`: 1 node, serial."""
    import paramiko

    from fleet.core.hosts import Host
    from fleet.ssh.settings import SshSettings
    from fleet.ssh.transport import SSHTransport

    out: dict[str, Any] = {}
    transport = SSHTransport(SshSettings(ssh_config=box.ssh_config_path, debug=True))
    records: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    grab = Grab(level=logging.DEBUG)
    plog = logging.getLogger("paramiko")
    plog.setLevel(logging.DEBUG)
    plog.addHandler(grab)
    host = Host(name=node.name, address=node.name)
    try:
        session = transport.connect(host)
    finally:
        plog.removeHandler(grab)
        plog.setLevel(logging.CRITICAL + 1)
    t = session.client.get_transport()
    agreed = [m for m in records if m.startswith(("Kex:", "HostKey:", "Cipher:", "MAC:"))]
    out["paramiko_negotiated"] = {
        "log": " ".join(" ".join(m.split()) for m in agreed)
        or "; ".join(r for r in records if "agreed" in r.lower())[:300],
        "server": t.remote_version if t is not None else None,
    }
    session.close()
    cpu, wall = [], []
    s0 = node_cpu.usage_s()
    for _ in range(count):
        c0, w0 = time.process_time(), time.perf_counter()
        transport.connect(host).close()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    s1 = node_cpu.usage_s()
    if s0 is not None and s1 is not None:
        out["paramiko_connect_server_cpu_ms"] = round((s1 - s0) / count * 1000, 2)
    out["paramiko_connect_cpu_ms"] = round(statistics.median(cpu) * 1000, 2)
    out["paramiko_connect_wall_ms"] = round(statistics.median(wall) * 1000, 2)
    out["paramiko_version"] = paramiko.__version__
    cpu, wall = [], []
    s0 = node_cpu.usage_s()
    for _ in range(count):
        r0, w0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(
            ["ssh", "-F", str(box.ssh_config_path), node.name, "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
            timeout=30,
        )
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        wall.append(time.perf_counter() - w0)
    s1 = node_cpu.usage_s()
    if s0 is not None and s1 is not None:
        out["openssh_exec_true_server_cpu_ms"] = round((s1 - s0) / count * 1000, 2)
    out["openssh_exec_true_cpu_ms"] = round(statistics.median(cpu) * 1000, 2)
    out["openssh_exec_true_wall_ms"] = round(statistics.median(wall) * 1000, 2)
    verbose = subprocess.run(
        ["ssh", "-v", "-F", str(box.ssh_config_path), node.name, "true"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    ).stderr
    kex = re.search(r"kex: algorithm: (\S+)", verbose)
    hk = re.search(r"kex: host key algorithm: (\S+)", verbose)
    out["openssh_negotiated"] = {"kex": kex and kex.group(1), "host_key_type": hk and hk.group(1)}
    return out


def py_spy_profile(ctx: Ctx, out_dir: Path, workload: str, timeout_s: float) -> dict[str, Any]:
    """py-spy record at 250 Hz with --gil (only the thread holding the GIL): a flame graph and the
    collapsed stacks. Wall-clock sampling: on a saturated machine a GIL holder that is not scheduled
    is still sampled, so read it with the CPU profile (yappi) below."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {"error": "py-spy not installed"}
    argv, env = fleet_cmd(ctx, workload)
    tag = f"{workload}-{ctx.n}"
    result: dict[str, Any] = {"command": argv}
    svg = out_dir / f"profile-{tag}.svg"
    raw_gil = out_dir / "raw" / f"profile-{tag}-gil.txt"
    for key, fmt, path, gil in (
        ("svg", "flamegraph", svg, True),
        ("gil", "raw", raw_gil, True),
    ):
        if workload == "cleanup":
            plant_all(ctx.box, ctx.box.nodes())
        spy_argv = [spy, "record", "-r", "250", "--format", fmt, "-o", str(path)]
        spy_argv += ["--gil"] if gil else []
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [*spy_argv, "--", *argv],
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            result[f"{key}_error"] = "timed out"
            continue
        result[f"{key}_wall_s"] = round(time.perf_counter() - t0, 3)
        if proc.returncode != 0:
            result[f"{key}_error"] = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    if workload == "cleanup":
        reset_nodes(ctx.box, ctx.box.nodes())
    if svg.exists():
        result["flamegraph"] = os.path.relpath(svg, REPO)
    if raw_gil.exists():
        result["gil"] = _collapse(raw_gil)
        wall = result.get("gil_wall_s")
        if wall:
            # Share of the run's wall time during which some fleet thread held the GIL.
            result["gil_busy_pct"] = round(100 * result["gil"]["samples"] / (wall * 250), 1)
    return result


def cpu_profile(ctx: Ctx, out_dir: Path, workload: str, timeout_s: float) -> dict[str, Any]:
    """bench/profile_cpu.py: fleet in-process under yappi's CPU clock, every thread."""
    probe = subprocess.run([sys.executable, "-c", "import yappi"], capture_output=True, check=False)
    if probe.returncode != 0:
        return {"error": "yappi not installed (pip install yappi)"}
    argv, env = fleet_cmd(ctx, workload)
    out = out_dir / "raw" / f"cpu-{workload}-{ctx.n}.json"
    if workload == "cleanup":
        plant_all(ctx.box, ctx.box.nodes())
    try:
        proc = subprocess.run(
            [sys.executable, str(BENCH / "profile_cpu.py"), "--out", str(out), "--", *argv[3:]],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    finally:
        if workload == "cleanup":
            reset_nodes(ctx.box, ctx.box.nodes())
    if not out.exists():
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-3:]}
    result: dict[str, Any] = json.loads(out.read_text())
    result["file"] = os.path.relpath(out, REPO)
    return result


def lookup_ab(
    ctx: Ctx, cgroup: Cgroup, raw_dir: Path, runs: int, timeout_s: float
) -> dict[str, Any]:
    """fleet exec at this size three ways, to size the ssh_config lookup cost (paramiko scans every
    Host block per host, calling getpass.getuser() per block: pwd lookups when USER is unset):
    the sandbox's ssh_config (a Host block per node) with USER unset, the same with USER set, and
    an equivalent one-block config (`Host <subnet prefix>*`)."""
    text = ctx.box.ssh_config_path.read_text()
    shared = text[text.rindex("\nHost ") + 1 :].split("\n", 1)[1]
    prefix = ".".join(ctx.box.nodes()[0].address.split(".")[:2]) + ".*"
    compact = ctx.box.state_dir / "ssh_config.one-block"
    compact.write_text(f"Host {prefix}\n{shared}")
    argv, env = fleet_cmd(ctx, "exec")
    unset = {k: v for k, v in env.items() if k not in ("USER", "LOGNAME", "LNAME", "USERNAME")}
    variants = {
        "per-node Host blocks, USER unset": (argv, unset),
        "per-node Host blocks, USER=root": (argv, {**unset, "USER": "root"}),
        f"one `Host {prefix}` block, USER unset": (
            [str(compact) if a == ctx.ssh_config else a for a in argv],
            unset,
        ),
    }
    out: dict[str, Any] = {}
    for _ in range(runs):
        for label, (v_argv, v_env) in variants.items():
            sample = measure(v_argv, v_env, timeout_s, cgroup, raw_dir, "lookup-ab", ctx.node_cpu)
            out.setdefault(label, []).append(sample)
    return {
        label: {
            "runs": len(samples),
            "ok": all(s["rc"] == 0 for s in samples),
            "median_wall_s": round(statistics.median(s["wall_s"] for s in samples), 3),
            "median_cpu_s": round(statistics.median(s["cpu_s"] for s in samples), 3),
        }
        for label, samples in out.items()
    }


def _collapse(raw: Path) -> dict[str, Any]:
    """Top frames by self and inclusive samples from py-spy's collapsed-stack output."""
    self_count: dict[str, int] = {}
    incl: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        total += count
        names = [_frame(f) for f in stack.split(";")]
        kind = _thread_kind(names)
        threads[kind] = threads.get(kind, 0) + count
        if names:
            self_count[names[-1]] = self_count.get(names[-1], 0) + count
        for name in set(names):
            incl[name] = incl.get(name, 0) + count

    def top(d: dict[str, int], k: int = 20) -> list[dict[str, Any]]:
        return [
            {"frame": name, "samples": c, "pct": round(100 * c / max(total, 1), 1)}
            for name, c in sorted(d.items(), key=lambda kv: -kv[1])[:k]
        ]

    return {
        "samples": total,
        "top_self": top(self_count),
        "top_inclusive": top(incl, 40),
        "by_thread": top(threads, 10),
    }


def _frame(frame: str) -> str:
    """`connect (paramiko/client.py:123)` -> `connect (paramiko/client.py)`."""
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    path = m.group(2)
    for marker in ("site-packages/", "lib/python3.11/", str(REPO) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{m.group(1)} ({path})"


def _thread_kind(names: list[str]) -> str:
    """Which of fleet's threads a stack belongs to, from its frames."""
    joined = ";".join(names)
    if "Transport.run (paramiko/transport.py)" in joined:
        return "paramiko Transport threads"
    if "Run._worker (fleet/engine/executor.py)" in joined:
        return "fleet worker threads"
    return "main thread"  # fleet starts no other threads
