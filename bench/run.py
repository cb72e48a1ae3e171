#!/usr/bin/env python3
"""Benchmark fleet against pdsh, Ansible ad-hoc and parallel-ssh on a local sandbox fleet.

    sudo python3 bench/run.py                       # sizes 8,32,64,128; 5 runs each
    sudo python3 bench/run.py --quick               # smoke test: sizes 8,32; 3 runs
    sudo python3 bench/run.py --sizes 8,32,64,128,256 --runs 5

Not a test: it measures. For every fleet size N it starts (or grows) a sandbox fleet of real sshd
nodes (fleet/sandbox.py, its own state dir and subnet, default 10.250.0.0/16), then, on the same
nodes, times each tool on two workloads:

* exec:    run `true` on every node;
* cleanup: fleet's `cleanup --grace 1` vs the hand-written kill/rm/fuser one-liner operators run
           through pdsh/ansible/pssh; fresh ghosts (fleet/ghosts.py) are planted on every node
           before each run (not timed) and every node is checked afterwards (not timed).

Per run it records wall time, user+sys CPU of the client process tree (RUSAGE_CHILDREN deltas),
the peak RSS of the largest client process (GNU time %M) and, when the cgroup-v1 memory controller
is available, the peak anonymous memory of the whole client tree plus its peak process and thread
counts (sampled from a cgroup the client runs in). Each measured command has a timeout; a peer that
fails or is missing is recorded as such. It also measures fleet's start-up (`--help`, importtime),
paramiko vs OpenSSH handshake cost, and profiles `fleet exec` at the largest size with py-spy.

Writes bench/results/latest.md, latest.json (raw samples, machine, versions, command line) and
latest.png (if matplotlib imports). The sandbox is always torn down and no process is left behind.
Needs root (network/PID/mount namespaces). Peers: apt-get install pdsh ansible-core time;
pip install parallel-ssh py-spy (matplotlib optional).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))  # the checkout's fleet, whether or not it is installed

from fleet.ghosts import plant_ghosts, read_ghosts  # noqa: E402
from fleet.sandbox import Sandbox, SandboxNode  # noqa: E402

MIB = 1024 * 1024
PORT = 39500
# What operators run through pdsh/ansible today (the README's seed), adapted to root without sudo:
# the bracket trick keeps `pkill -f` from matching its own shell, whose argv holds the pattern.
HAND_CLEANUP = (
    "pkill -9 -f '[t]orchrun'; pkill -9 -f '[t]rain.py'; "
    "rm -rf /tmp/.torch_distributed_* /dev/shm/torch_* /tmp/cuda_* ~/.nv/; "
    f"fuser -k {PORT}/tcp; exit 0"
)
# What a reset removes from every node between runs: planted processes (by command line) and
# files, reached from the host through /proc/<node init>/root, i.e. in the node's own mounts.
_GHOST_CMD = re.compile(
    rb"^(torchrun|python3 /tmp/train\.py|python3 /tmp/rdzv_store\.py|jupyter-lab)"
)
_GHOST_GLOBS = (
    "tmp/.torch_distributed_*",
    "dev/shm/torch_*",
    "tmp/cuda_*",
    "root/.nv",
    "tmp/train.py",
    "tmp/rdzv_store.py",
)
TOOL_ORDER = ("fleet", "fleet-default", "fleet-live", "fleet-oneliner", "pdsh", "pssh", "ansible")
# Variants, and Ansible (10x slower: its median only decides the 10x target), get fewer runs.
MAX_RUNS = {"fleet-default": 2, "fleet-live": 3, "ansible": 3}
NO_BUDGET = {"fleet"}  # the subject always gets its full runs, however long they take
TOOL_NOTES = {
    "fleet": "fleet -f F --plain (F = min(N, 64))",
    "fleet-default": "fleet with its default --forks 32 (only where it differs from -f F)",
    "fleet-live": "fleet -f F with the rich live table on a pty (`script`), exec only",
    "fleet-oneliner": "`fleet exec -f F --plain` running the peers' own cleanup one-liner, cleanup "
    "only: the same node work as the peers, so the engines compare like for like",
    "pdsh": "pdsh -R ssh -f F (OpenSSH client per host, strict host keys)",
    "pssh": "parallel-ssh ParallelSSHClient, pool_size F (libssh2; verifies NO host keys)",
    "ansible": "ansible ad-hoc -f F, pipelining on, ControlMaster off, host key checking on",
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- measurement


class Cgroup:
    """A cgroup-v1 memory group the measured client runs in: tree-wide peak anon memory, process
    and thread counts, and a reliable way to find (and kill) every process a tool left behind."""

    ROOT = Path("/sys/fs/cgroup/memory")

    def __init__(self) -> None:
        self.path: Path | None = None
        candidate = self.ROOT / f"fleet-bench-{os.getpid()}"
        try:
            if (self.ROOT / "cgroup.procs").exists():
                candidate.mkdir(exist_ok=True)
                self.path = candidate
        except OSError:
            self.path = None

    @property
    def procs_file(self) -> str | None:
        return str(self.path / "cgroup.procs") if self.path else None

    def pids(self) -> list[int]:
        if not self.path:
            return []
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def anon_bytes(self) -> int | None:
        if not self.path:
            return None
        try:
            for line in (self.path / "memory.stat").read_text().splitlines():
                if line.startswith("total_rss "):
                    return int(line.split()[1])
        except OSError:
            return None
        return None

    def max_usage(self) -> int | None:
        try:
            return int((self.path / "memory.max_usage_in_bytes").read_text()) if self.path else None
        except OSError:
            return None

    def reset_peak(self) -> None:
        if self.path:
            with contextlib.suppress(OSError):
                (self.path / "memory.max_usage_in_bytes").write_text("0\n")

    def kill_all(self) -> int:
        """SIGKILL whatever still runs in the group; returns how many there were."""
        left = self.pids()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(left)

    def remove(self) -> None:
        if self.path:
            self.kill_all()
            with contextlib.suppress(OSError):
                self.path.rmdir()
            self.path = None


class NodeCpu:
    """A cgroup-v1 cpuacct group holding every sandbox node's processes (init, sshd and all that
    sshd forks for a session): CPU spent on the "server" side of each run, which on this machine
    shares the same cores as the client."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self) -> None:
        self.path: Path | None = None
        candidate = self.ROOT / f"fleet-bench-nodes-{os.getpid()}"
        try:
            if (self.ROOT / "cpuacct.usage").exists():
                candidate.mkdir(exist_ok=True)
                self.path = candidate
        except OSError:
            self.path = None

    def attach(self, pid1s: Sequence[int]) -> int:
        """Move each node's init and its descendants in (children forked later follow)."""
        if not self.path:
            return 0
        kids: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
            kids.setdefault(ppid, []).append(int(entry))
        todo, moved = list(pid1s), 0
        while todo:
            pid = todo.pop()
            todo += kids.get(pid, [])
            try:
                (self.path / "cgroup.procs").write_text(f"{pid}\n")
                moved += 1
            except OSError:
                pass
        return moved

    def usage_s(self) -> float | None:
        try:
            return int((self.path / "cpuacct.usage").read_text()) / 1e9 if self.path else None
        except OSError:
            return None

    def remove(self) -> None:
        """Hand any process still inside back to the root group, then remove the group."""
        if not self.path:
            return
        with contextlib.suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.ROOT / "cgroup.procs").write_text(f"{pid}\n")
        with contextlib.suppress(OSError):
            self.path.rmdir()
        self.path = None


def _threads(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine so far (all cores): sshd on the nodes included."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def measure(
    argv: Sequence[str],
    env: dict[str, str],
    timeout_s: float,
    cgroup: Cgroup,
    out_dir: Path,
    label: str,
    node_cpu: NodeCpu | None = None,
) -> dict[str, Any]:
    """Run argv once under GNU time inside the cgroup; everything one sample records."""
    time_file = out_dir / f"{label}.time"
    out_path, err_path = out_dir / f"{label}.out", out_dir / f"{label}.err"
    wrapped = ["/usr/bin/time", "-f", "%e %U %S %M", "-o", str(time_file), *argv]
    if cgroup.procs_file:
        wrapped = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', cgroup.procs_file, *wrapped]
    cgroup.reset_peak()
    peak = {"anon": 0, "procs": 0, "threads": 0}
    stop = threading.Event()

    def sample() -> None:
        tick = 0
        while not stop.is_set():
            anon = cgroup.anon_bytes()
            if anon is not None:
                peak["anon"] = max(peak["anon"], anon)
            if tick % 4 == 0:
                pids = cgroup.pids()
                peak["procs"] = max(peak["procs"], len(pids))
                peak["threads"] = max(peak["threads"], sum(_threads(p) for p in pids))
            tick += 1
            stop.wait(0.05)

    load_before = os.getloadavg()[0]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    m0 = _machine_cpu_s()
    n0 = node_cpu.usage_s() if node_cpu else None
    started = time.perf_counter()
    timed_out = False
    rc: int | None = None
    sampler = threading.Thread(target=sample, daemon=True)
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            list(wrapped),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            cwd=str(out_dir),
            start_new_session=True,
        )
        sampler.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            cgroup.kill_all()
            proc.wait()
    wall = time.perf_counter() - started
    stop.set()
    sampler.join()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    machine = _machine_cpu_s() - m0
    n1 = node_cpu.usage_s() if node_cpu else None
    leftovers = cgroup.kill_all()
    sample_: dict[str, Any] = {
        "wall_s": round(wall, 4),
        "user_s": round(ru1.ru_utime - ru0.ru_utime, 4),
        "sys_s": round(ru1.ru_stime - ru0.ru_stime, 4),
        "rc": rc,
        "timed_out": timed_out,
        "loadavg_1m_before": load_before,
        "machine_cpu_s": round(machine, 3),
        "left_processes": leftovers,
        "node_cpu_s": round(n1 - n0, 3) if n0 is not None and n1 is not None else None,
    }
    sample_["cpu_s"] = round(sample_["user_s"] + sample_["sys_s"], 4)
    try:
        e, u, s, m = time_file.read_text().strip().splitlines()[-1].split()
        sample_["gnu_time"] = {"e": float(e), "U": float(u), "S": float(s), "M_kib": int(m)}
        sample_["max_rss_mib"] = round(int(m) / 1024, 1)
    except (OSError, ValueError):
        sample_["max_rss_mib"] = None
    if cgroup.path:
        sample_["tree_anon_peak_mib"] = round(peak["anon"] / MIB, 1)
        max_usage = cgroup.max_usage()
        sample_["cgroup_max_usage_mib"] = round(max_usage / MIB, 1) if max_usage else None
        sample_["peak_procs"] = peak["procs"]
        sample_["peak_threads"] = peak["threads"]
    if timed_out or rc != 0:
        sample_["stdout_tail"] = _tail(out_path)
        sample_["stderr_tail"] = _tail(err_path)
    return sample_


def _tail(path: Path, lines: int = 8) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


# --------------------------------------------------------------------------- tools


@dataclass
class Ctx:
    """What every tool's command line needs for one fleet size."""

    box: Sandbox
    node_cpu: NodeCpu
    n: int
    forks: int
    names_file: Path
    addrs_file: Path
    log_dir: Path
    fleet_cmd: list[str]
    env: dict[str, str]  # base environment for every tool
    py_env: dict[str, str]  # for tools on this interpreter (fleet, pssh): warm bytecode cache

    @property
    def inventory(self) -> str:
        return str(self.box.inventory_path)

    @property
    def ssh_config(self) -> str:
        return str(self.box.ssh_config_path)

    @property
    def key(self) -> str:
        return str(self.box.key_path)


@dataclass
class Tool:
    name: str
    available: Callable[[], str | None]  # None if usable, else why not
    command: Callable[[Ctx, str], tuple[list[str], dict[str, str]] | None]  # None: not measured


def _fleet_common(ctx: Ctx) -> list[str]:
    return ["-i", ctx.inventory, "-F", ctx.ssh_config, "--log-dir", str(ctx.log_dir)]


def _fleet_args(ctx: Ctx, workload: str) -> list[str]:
    if workload == "exec":
        return ["exec", "true", *_fleet_common(ctx)]
    return ["cleanup", "--yes", "--grace", "1", *_fleet_common(ctx)]


def fleet_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]]:
    argv = [*ctx.fleet_cmd, *_fleet_args(ctx, workload), "--plain", "-f", str(ctx.forks)]
    return argv, ctx.py_env


def fleet_default_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]] | None:
    if min(ctx.n, 32) == min(ctx.n, ctx.forks):
        return None  # identical to `fleet -f F` at this size
    return [*ctx.fleet_cmd, *_fleet_args(ctx, workload), "--plain"], ctx.py_env


def fleet_oneliner_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]] | None:
    if workload != "cleanup":
        return None
    argv = [
        *ctx.fleet_cmd,
        "exec",
        HAND_CLEANUP,
        *_fleet_common(ctx),
        "--plain",
        "-f",
        str(ctx.forks),
    ]
    return argv, ctx.py_env


def fleet_live_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]] | None:
    if workload != "exec":
        return None
    inner = shlex.join([*ctx.fleet_cmd, *_fleet_args(ctx, workload), "-f", str(ctx.forks)])
    env = {**ctx.py_env, "COLUMNS": "160", "LINES": "50", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    return ["script", "-qfec", inner, "/dev/null"], env


def pdsh_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]]:
    env = {**ctx.env, "PDSH_SSH_ARGS": f"-F {ctx.ssh_config} -a -x -l%u %h"}
    command = "true" if workload == "exec" else HAND_CLEANUP
    argv = ["pdsh", "-R", "ssh", "-S", "-f", str(ctx.forks), "-w", f"^{ctx.names_file}", command]
    return argv, env


def ansible_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]]:
    env = {
        **ctx.env,
        "ANSIBLE_SSH_ARGS": f"-F {ctx.ssh_config} -o ControlMaster=no",
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(ctx.log_dir / "ansible-tmp"),
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
    }
    module = (
        ["-m", "command", "-a", "true"]
        if workload == "exec"
        else ["-m", "shell", "-a", HAND_CLEANUP]
    )
    argv = ["ansible", "all", "-i", ctx.inventory, "-f", str(ctx.forks), "-o", *module]
    return argv, env


def pssh_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]]:
    command = "true" if workload == "exec" else HAND_CLEANUP
    argv = [
        sys.executable,
        str(BENCH / "peers" / "pssh_run.py"),
        "--hosts-file",
        str(ctx.addrs_file),
    ]
    argv += ["--key", ctx.key, "--pool", str(ctx.forks), command]
    return argv, ctx.py_env


def _need_exe(*names: str) -> Callable[[], str | None]:
    def check() -> str | None:
        missing = [n for n in names if shutil.which(n) is None]
        return f"not installed: {', '.join(missing)}" if missing else None

    return check


def _need_module(module: str) -> Callable[[], str | None]:
    def check() -> str | None:
        probe = subprocess.run(
            [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, check=False
        )
        return None if probe.returncode == 0 else f"cannot import {module}"

    return check


TOOLS = {
    "fleet": Tool("fleet", lambda: None, fleet_cmd),
    "fleet-default": Tool("fleet-default", lambda: None, fleet_default_cmd),
    "fleet-live": Tool("fleet-live", _need_exe("script"), fleet_live_cmd),
    "fleet-oneliner": Tool("fleet-oneliner", lambda: None, fleet_oneliner_cmd),
    "pdsh": Tool("pdsh", _need_exe("pdsh", "ssh"), pdsh_cmd),
    "pssh": Tool("pssh", _need_module("pssh.clients"), pssh_cmd),
    "ansible": Tool("ansible", _need_exe("ansible"), ansible_cmd),
}


# --------------------------------------------------------------------------- ghosts


def _pmap(
    fn: Callable[[SandboxNode], Any], nodes: Sequence[SandboxNode], workers: int = 12
) -> list[Any]:
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(nodes)))) as pool:
        return list(pool.map(fn, nodes))


def reset_nodes(box: Sandbox, nodes: Sequence[SandboxNode]) -> None:
    """Back to "nothing planted", from the host side (no process started per node): SIGKILL the
    planted processes among the nodes' descendants, delete their files via /proc/<init>/root."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            kids.setdefault(int(stat[stat.rfind(b")") + 2 :].split()[1]), []).append(int(entry))
    todo = [n.pid1 for n in nodes]
    victims: list[int] = []
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if _GHOST_CMD.match(cmd):
            victims.append(pid)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for node in nodes:
        root = Path(f"/proc/{node.pid1}/root")
        for pattern in _GHOST_GLOBS:
            for path in root.glob(pattern):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(pid) for pid in victims):
        time.sleep(0.02)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def plant_all(box: Sandbox, nodes: Sequence[SandboxNode]) -> None:
    reset_nodes(box, nodes)
    _pmap(lambda node: plant_ghosts(box, node, PORT), nodes)


def verify_clean(box: Sandbox, nodes: Sequence[SandboxNode]) -> dict[str, Any]:
    """After a cleanup run: how many nodes are clean, and whether the bystander survived."""
    ghosts = _pmap(lambda node: read_ghosts(box, node, PORT), nodes)
    dirty = [
        n.name for n, g in zip(nodes, ghosts, strict=True) if g.training or g.paths or g.listening
    ]
    lost = [n.name for n, g in zip(nodes, ghosts, strict=True) if not g.bystander]
    left: dict[str, int] = {"training": 0, "paths": 0, "listening": 0}
    for g in ghosts:
        left["training"] += len(g.training)
        left["paths"] += len(g.paths)
        left["listening"] += int(g.listening)
    return {
        "clean_nodes": len(nodes) - len(dirty),
        "dirty_nodes": dirty[:10],
        "bystander_killed_nodes": len(lost),
        "left": left,
    }


# --------------------------------------------------------------------------- phases


def _py_env(base: dict[str, str]) -> dict[str, str]:
    """Python tools on this interpreter get a writable bytecode cache under bench/ (the machine may
    set PYTHONDONTWRITEBYTECODE, and an editable checkout has no .pyc otherwise): a normal
    `pip install` has compiled bytecode, and that is what users run."""
    env = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(BENCH / ".pycache")
    env["PYTHONPATH"] = str(REPO)
    return env


def _time_runs(argv: list[str], env: dict[str, str], count: int) -> list[float]:
    walls = []
    for _ in range(count):
        t0 = time.perf_counter()
        subprocess.run(
            argv,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=60,
        )
        walls.append(round(time.perf_counter() - t0, 4))
    return walls


def _importtime(env: dict[str, str], code: str, repeats: int = 3) -> dict[str, Any]:
    """python -X importtime: per-module median self/cumulative µs over a few runs."""
    per: dict[str, dict[str, list[int]]] = {}
    depth: dict[str, int] = {}
    for _ in range(repeats):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        for line in proc.stderr.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
            if not m:
                continue
            name = m.group(4)
            rec = per.setdefault(name, {"self": [], "cum": []})
            rec["self"].append(int(m.group(1)))
            rec["cum"].append(int(m.group(2)))
            depth[name] = (len(m.group(3)) - 1) // 2
    rows: list[dict[str, Any]] = [
        {
            "module": name,
            "self_ms": round(statistics.median(v["self"]) / 1000, 1),
            "cumulative_ms": round(statistics.median(v["cum"]) / 1000, 1),
            "depth": depth[name],
        }
        for name, v in per.items()
    ]
    top_level = sorted((r for r in rows if r["depth"] <= 1), key=lambda r: -r["cumulative_ms"])
    return {
        "code": code,
        "top_cumulative": top_level[:15],
        "top_self": sorted(rows, key=lambda r: -r["self_ms"])[:15],
        "total_ms": round(sum(r["cumulative_ms"] for r in rows if r["depth"] == 0), 1),
    }


def startup(
    fleet: list[str], env: dict[str, str], py_env: dict[str, str], count: int
) -> dict[str, Any]:
    log(f"start-up: fleet --help x{count}, python -X importtime")
    _time_runs([*fleet, "--help"], py_env, 2)  # fill the bytecode cache
    out: dict[str, Any] = {}
    out["help_warm_s"] = _time_runs([*fleet, "--help"], py_env, count)
    cold = {**env, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)}
    cold.pop("PYTHONPYCACHEPREFIX", None)
    out["help_as_this_env_s"] = _time_runs([*fleet, "--help"], cold, max(5, count // 2))
    out["python_bare_s"] = _time_runs([sys.executable, "-c", "pass"], py_env, max(5, count // 2))
    script = Path(sys.executable).parent / "fleet"
    if script.exists():
        out["help_console_script"] = str(script)
        out["help_console_script_warm_s"] = _time_runs(
            [str(script), "--help"], py_env, max(5, count // 2)
        )
    out["importtime_help"] = _importtime(py_env, "import fleet.cli")
    out["importtime_run"] = _importtime(
        py_env,
        "import fleet.cli, fleet.runner, fleet.executor, fleet.transport, fleet.reporters,"
        " fleet.runlog",
    )
    return out


def handshake_costs(
    box: Sandbox, node: SandboxNode, node_cpu: NodeCpu, count: int = 15
) -> dict[str, Any]:
    """Client CPU per connection, fleet's transport (paramiko) vs OpenSSH `ssh`: 1 node, serial."""
    import paramiko

    from fleet.inventory import Host
    from fleet.transport import SSHOptions, SSHTransport

    out: dict[str, Any] = {}
    transport = SSHTransport(SSHOptions(ssh_config=box.ssh_config_path), debug=True)
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
    if "Run._worker (fleet/executor.py)" in joined:
        return "fleet worker threads"
    return "main thread"  # fleet starts no other threads


# --------------------------------------------------------------------------- the run


@dataclass
class Cell:
    tool: str
    n: int
    workload: str
    forks: int
    argv: list[str] = field(default_factory=list)
    env_extra: dict[str, str] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None
    done: bool = False

    def ok_samples(self) -> list[dict[str, Any]]:
        return [s for s in self.samples if s["rc"] == 0 and not s["timed_out"]]


def run_size(
    ctx: Ctx,
    tools: list[str],
    workloads: list[str],
    runs: int,
    min_runs: int,
    cell_budget_s: float,
    timeout_s: float,
    cgroup: Cgroup,
    raw_dir: Path,
    unavailable: dict[str, str],
) -> list[Cell]:
    cells: list[Cell] = []
    nodes = ctx.box.nodes()
    for workload in workloads:
        active: list[tuple[Cell, list[str], dict[str, str]]] = []
        for name in tools:
            cell = Cell(tool=name, n=ctx.n, workload=workload, forks=ctx.forks)
            cells.append(cell)
            if name in unavailable:
                cell.skipped, cell.done = unavailable[name], True
                continue
            built = TOOLS[name].command(ctx, workload)
            if built is None:
                cells.pop()
                continue
            argv, env = built
            cell.argv = argv
            cell.env_extra = {k: v for k, v in env.items() if ctx.env.get(k) != v}
            active.append((cell, argv, env))
        for rep in range(runs):
            order = active[rep % len(active) :] + active[: rep % len(active)] if active else []
            for cell, argv, env in order:
                if cell.done:
                    continue
                if workload == "cleanup":
                    plant_all(ctx.box, nodes)
                label = f"{cell.tool}-{ctx.n}-{workload}"
                sample = measure(argv, env, timeout_s, cgroup, raw_dir, label, ctx.node_cpu)
                if workload == "cleanup":
                    sample["verify"] = verify_clean(ctx.box, nodes)
                cell.samples.append(sample)
                status = "ok" if sample["rc"] == 0 else f"rc={sample['rc']}"
                if sample["timed_out"]:
                    status = "TIMEOUT"
                extra = ""
                if "verify" in sample:
                    extra = f" clean {sample['verify']['clean_nodes']}/{ctx.n}"
                log(
                    f"  N={ctx.n:<4} {workload:<7} {cell.tool:<13} run {len(cell.samples)}: "
                    f"{sample['wall_s']:7.2f}s wall {sample['cpu_s']:6.2f}s cpu "
                    f"{sample['node_cpu_s']}s node cpu "
                    f"{sample.get('max_rss_mib')} MiB {status}{extra}"
                )
                walls = [s["wall_s"] for s in cell.samples]
                failures = len(cell.samples) - len(cell.ok_samples())
                if (
                    len(cell.samples) >= min(runs, MAX_RUNS.get(cell.tool, runs))
                    or failures >= 2
                    or sample["timed_out"]
                    or (
                        cell.tool not in NO_BUDGET
                        and len(cell.samples) >= min_runs
                        and sum(walls) + statistics.mean(walls) > cell_budget_s
                    )
                ):
                    cell.done = True
        if workload == "cleanup":
            reset_nodes(ctx.box, nodes)
    return cells


def summarize(cell: Cell) -> dict[str, Any]:
    ok = cell.ok_samples()
    use = ok or cell.samples

    def med(key: str) -> float | None:
        vals = [s[key] for s in use if s.get(key) is not None]
        return round(statistics.median(vals), 3) if vals else None

    def peak(key: str) -> float | None:
        vals = [s[key] for s in use if s.get(key) is not None]
        return max(vals) if vals else None

    out: dict[str, Any] = {
        "tool": cell.tool,
        "n": cell.n,
        "workload": cell.workload,
        "forks": cell.forks,
        "runs": len(cell.samples),
        "ok_runs": len(ok),
        "median_wall_s": med("wall_s"),
        "min_wall_s": min((s["wall_s"] for s in use), default=None),
        "max_wall_s": max((s["wall_s"] for s in use), default=None),
        "median_cpu_s": med("cpu_s"),
        "peak_rss_mib": peak("max_rss_mib"),
        "tree_anon_peak_mib": peak("tree_anon_peak_mib"),
        "peak_procs": peak("peak_procs"),
        "peak_threads": peak("peak_threads"),
        "median_machine_cpu_s": med("machine_cpu_s"),
        "median_node_cpu_s": med("node_cpu_s"),
        "skipped": cell.skipped,
    }
    verifies = [s["verify"] for s in cell.samples if "verify" in s]
    if verifies:
        out["clean_runs"] = sum(v["clean_nodes"] == cell.n for v in verifies)
        out["bystander_killed_runs"] = sum(v["bystander_killed_nodes"] > 0 for v in verifies)
    if not ok and cell.samples:
        out["failure"] = cell.samples[-1].get("stderr_tail") or cell.samples[-1].get("stdout_tail")
    return out


def targets(rows: list[dict[str, Any]], start: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, evaluated on the medians."""
    by = {(r["tool"], r["n"], r["workload"]): r for r in rows}
    out = []
    for n in sorted({r["n"] for r in rows if r["n"] >= 64}):
        for workload in ("exec", "cleanup"):
            f = by.get(("fleet", n, workload))
            if not f or f["median_wall_s"] is None:
                continue
            peers = [
                by[(p, n, workload)]
                for p in ("pdsh", "pssh", "ansible")
                if (p, n, workload) in by and by[(p, n, workload)]["ok_runs"]
            ]
            if peers:
                fastest = min(peers, key=lambda r: r["median_wall_s"])
                out.append(
                    {
                        "target": f"N={n} {workload}: fleet no slower than the fastest peer",
                        "met": f["median_wall_s"] <= fastest["median_wall_s"],
                        "detail": f"fleet {f['median_wall_s']:.2f}s vs {fastest['tool']} "
                        f"{fastest['median_wall_s']:.2f}s",
                    }
                )
                same = by.get(("fleet-oneliner", n, workload))
                if same and same["median_wall_s"] is not None:
                    out.append(
                        {
                            "target": f"N={n} {workload}, same one-liner on the nodes: fleet exec "
                            "no slower than the fastest peer",
                            "met": same["median_wall_s"] <= fastest["median_wall_s"],
                            "detail": f"fleet {same['median_wall_s']:.2f}s vs {fastest['tool']} "
                            f"{fastest['median_wall_s']:.2f}s",
                        }
                    )
            ans = by.get(("ansible", n, workload))
            if ans and ans["ok_runs"]:
                ratio = ans["median_wall_s"] / f["median_wall_s"]
                out.append(
                    {
                        "target": f"N={n} {workload}: fleet >= 10x faster than Ansible",
                        "met": ratio >= 10,
                        "detail": f"{ratio:.1f}x (ansible {ans['median_wall_s']:.2f}s)",
                    }
                )
    for n in (128,):
        rss = [
            r["peak_rss_mib"]
            for r in rows
            if r["tool"] == "fleet" and r["n"] == n and r["peak_rss_mib"]
        ]
        if rss:
            out.append(
                {
                    "target": f"fleet peak RSS at N={n} < 100 MiB",
                    "met": max(rss) < 100,
                    "detail": f"{max(rss):.1f} MiB (worst workload)",
                }
            )
    if start.get("help_warm_s"):
        help_s = statistics.median(start["help_warm_s"])
        out.append(
            {
                "target": "`fleet --help` well under 0.5 s",
                "met": help_s < 0.5,
                "detail": f"median {help_s:.3f}s (bytecode cached); "
                f"{statistics.median(start['help_as_this_env_s']):.3f}s without .pyc",
            }
        )
    return out


# --------------------------------------------------------------------------- report


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


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _unwrap(text: str) -> str:
    return " ".join(text.split("\n"))


def scrub_paths(out_dir: Path) -> None:
    """Results are committed: the repo's path and the interpreter's bin dir are this machine's,
    so the text files say `bench/...` and `python3` / `fleet` instead."""
    bin_dir = str(Path(sys.executable).parent) + "/"
    for path in [out_dir / "latest.md", out_dir / "latest.json", *out_dir.glob("*.svg")]:
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
        _row(
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
        _row(
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
            lines.append(_row(*head, 0, *["-"] * 7, f"skipped: {r['skipped']}"))
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
            _row(
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
    lines += ["", "## Targets", "", _row("target", "met", "detail"), _row("---", "---", "---")]
    for t in doc["targets"]:
        lines.append(_row(t["target"], "yes" if t["met"] else "**no**", t["detail"]))
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
            ("importtime_help", "`import fleet.cli` (what --help loads)"),
            ("importtime_run", "the run path (+ executor, transport, reporters, runlog)"),
        ):
            it = st[key]
            lines += [
                "",
                f"`python -X importtime` for {title}: {it['total_ms']:.0f} ms in all. "
                "Top cumulative:",
                "",
                _row("module", "cumulative ms", "self ms"),
                _row("---", "---:", "---:"),
            ]
            lines += [
                _row(r["module"], r["cumulative_ms"], r["self_ms"])
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
            _row("inclusive CPU of", "s", "%"),
            _row("---", "---:", "---:"),
        ]
        lines += [_row(k, v["cpu_s"], v["pct"]) for k, v in cpu["groups"].items() if v["cpu_s"]]
        lines += ["", _row("top self CPU", "calls", "s", "%"), _row("---", "---:", "---:", "---:")]
        lines += [
            _row(f"`{r['name']}` ({r['module']})", r["ncall"], round(r["tsub"], 3), r["pct"])
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
            _row("variant", "median wall s", "median CPU s", "ok"),
            _row("---", "---:", "---:", "---"),
        ]
        lines += [
            _row(k, v["median_wall_s"], v["median_cpu_s"], "yes" if v["ok"] else "no")
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


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="smoke test: sizes 8,32; 3 runs; no profile"
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
        default=3,
        help="runs per cell at N >= --large-n, to keep the full run under ~25 min [3]",
    )
    ap.add_argument("--large-n", type=int, default=128, help="see --large-runs [128]")
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
        help="rewrite latest.md and latest.png from --out's latest.json; measure nothing",
    )
    args = ap.parse_args(argv)
    args.sizes = [
        int(x) for x in (args.sizes or ("8,32" if args.quick else "8,32,64,128")).split(",")
    ]
    args.runs = args.runs or (3 if args.quick else 5)
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
    if not os.access("/usr/bin/time", os.X_OK):
        print("bench/run.py needs GNU time: apt-get install time", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _sigterm)
    t_start = time.monotonic()
    out_dir: Path = args.out
    raw_dir = out_dir / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    log_dir = args.state_dir / "runs"
    log_dir.mkdir(parents=True, exist_ok=True)
    base_env = dict(os.environ)
    for noisy in (
        "FLEET_INVENTORY",
        "FLEET_SSH_CONFIG",
        "FLEET_LOG_DIR",
        "PDSH_SSH_ARGS",
        "ANSIBLE_CONFIG",
    ):
        base_env.pop(noisy, None)
    py_env = _py_env(base_env)
    fleet = [sys.executable, "-m", "fleet"]
    unavailable = {name: why for name in args.tools if (why := TOOLS[name].available())}
    for name, why in unavailable.items():
        log(f"peer {name} skipped: {why}")
    doc: dict[str, Any] = {
        "command_line": shlex.join([sys.executable, *sys.argv])
        if argv is None
        else shlex.join(["bench/run.py", *argv]),
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


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # tear down like Ctrl-C


def _write_partial(out_dir: Path, doc: dict[str, Any], cells: list[Cell]) -> None:
    """Raw samples so far, so a crash or Ctrl-C late in a long run keeps what was measured."""
    partial = {**doc, "cells": [c.__dict__ for c in cells], "partial": True}
    (out_dir / "raw" / "partial.json").write_text(json.dumps(partial, indent=1, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
