"""One measured client run for bench/scale.py: wall, the CPU of the whole client tree, and the CPU
of each process in it.

The client runs in its own cgroup-v1 groups (cpuacct, memory, pids). Everything it forks stays
there, daemons included: fleet's keepers (warm connections) detach from the client's session but
not from its cgroup, so `cpuacct.usage` is the CPU of the client, its workers and its keepers
together, which RUSAGE_CHILDREN (only waited-for children) would miss.

Per process: a sampler reads /proc/PID/stat of every process in the group every `interval_s`
(the last value seen is a lower bound for a process that exits between two samples); the client
itself is left a zombie (waitid WNOWAIT) so its own utime+stime and its reaped children's are read
exactly before it is reaped. Processes alive before the run (keepers of an earlier command) count
only what they spent during it. Guards: a memory limit on the group and, on the machine,
MemAvailable under `min_free_mib` kills the client (a 1,000-node run must not take the machine).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import machine_busy_s
from bench.measure import NodeCpu

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpuacct", "memory", "pids")
TICK = os.sysconf("SC_CLK_TCK")
# Joins every group named after "--" is reached, then execs the client: same pid, so the
# client's own figures are the pid's.
_JOIN = 'for f do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; shift; exec "$@"'


@dataclass(frozen=True)
class ProcStat:
    """One /proc/PID/stat reading: who it is and the CPU it has used so far."""

    pid: int
    ppid: int
    comm: str
    cpu_s: float  # utime + stime of the process itself (all its threads)
    children_cpu_s: float  # cutime + cstime: its children that it has waited for
    threads: int


def read_stat(pid: int) -> ProcStat | None:
    """The process's stat line, parsed; None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    close = raw.rfind(b")")
    comm = raw[raw.find(b"(") + 1 : close].decode(errors="replace")
    f = raw[close + 2 :].split()
    return ProcStat(
        pid=pid,
        ppid=int(f[1]),
        comm=comm,
        cpu_s=(int(f[11]) + int(f[12])) / TICK,
        children_cpu_s=(int(f[13]) + int(f[14])) / TICK,
        threads=int(f[17]),
    )


def cmdline(pid: int) -> str:
    """The process's command line, spaces between arguments ('' if gone); cut to 300 chars."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
    except OSError:
        return ""


def settle(max_s: float, busy_below: float) -> dict[str, float]:
    """Wait (up to max_s) until the machine's cores are busy less than busy_below (0-1) over a
    2 s window: a sandbox that just started hundreds of sshd must not bill its start to a run."""
    t0 = time.monotonic()
    cores = os.cpu_count() or 1
    while True:
        b0 = machine_busy_s()
        time.sleep(2)
        busy = (machine_busy_s() - b0) / 2 / cores
        if busy < busy_below or time.monotonic() - t0 > max_s:
            return {"waited_s": round(time.monotonic() - t0, 1), "busy": round(busy, 2)}


def mem_available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 1 << 30


class ClientGroup:
    """The cgroups one client (and all it starts) runs in."""

    def __init__(self, name: str, mem_limit_mib: int, pids_max: int) -> None:
        self.dirs: dict[str, Path] = {}
        for ctl in CONTROLLERS:
            root = CGROUP_ROOT / ctl
            if (root / "cgroup.procs").exists():
                path = root / name
                path.mkdir(exist_ok=True)
                self.dirs[ctl] = path
        with contextlib.suppress(OSError, KeyError):
            (self.dirs["memory"] / "memory.limit_in_bytes").write_text(f"{mem_limit_mib}M\n")
        with contextlib.suppress(OSError, KeyError):
            (self.dirs["pids"] / "pids.max").write_text(f"{pids_max}\n")

    def missing(self) -> list[str]:
        return [c for c in CONTROLLERS if c not in self.dirs]

    def wrap(self, argv: Sequence[str]) -> list[str]:
        procs = [str(d / "cgroup.procs") for d in self.dirs.values()]
        return ["sh", "-c", _JOIN, "sh", *procs, "--", *argv]

    def pids(self) -> list[int]:
        path = next(iter(self.dirs.values()), None)
        if path is None:
            return []
        try:
            return [int(x) for x in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def _read(self, ctl: str, name: str) -> int | None:
        try:
            return int((self.dirs[ctl] / name).read_text())
        except (OSError, KeyError, ValueError):
            return None

    def cpu(self) -> tuple[float, float, float] | None:
        """(total, user, sys) CPU seconds of everything that ever ran in the group."""
        total = self._read("cpuacct", "cpuacct.usage")
        user = self._read("cpuacct", "cpuacct.usage_user")
        sys_ = self._read("cpuacct", "cpuacct.usage_sys")
        if total is None:
            return None
        return total / 1e9, (user or 0) / 1e9, (sys_ or 0) / 1e9

    def mem_peak_mib(self) -> float | None:
        peak = self._read("memory", "memory.max_usage_in_bytes")
        return round(peak / 2**20, 1) if peak is not None else None

    def oom_kills(self) -> int:
        with contextlib.suppress(OSError, KeyError):
            for line in (self.dirs["memory"] / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        return 0

    def reset_peak(self) -> None:
        with contextlib.suppress(OSError, KeyError):
            (self.dirs["memory"] / "memory.max_usage_in_bytes").write_text("0\n")

    def kill_all(self, sig: int = signal.SIGKILL, wait_s: float = 5) -> int:
        """Signal whatever runs in the group; wait for it to go; how many there were."""
        left = self.pids()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(left)

    def wait_empty(self, timeout_s: float) -> float | None:
        """Seconds until no process is left in the group, None if some still are at timeout."""
        t0 = time.monotonic()
        while self.pids():
            if time.monotonic() - t0 > timeout_s:
                return None
            time.sleep(0.05)
        return round(time.monotonic() - t0, 2)

    def remove(self) -> None:
        self.kill_all()
        for path in self.dirs.values():
            with contextlib.suppress(OSError):
                path.rmdir()
        self.dirs = {}


@dataclass
class _Seen:
    """What the sampler learnt about one process of the group during a run."""

    first: ProcStat
    last: ProcStat
    cmd: str


@dataclass
class _Sampler:
    group: ClientGroup
    interval_s: float
    min_free_mib: int
    seen: dict[int, _Seen] = field(default_factory=dict)
    peak_procs: int = 0
    peak_threads: int = 0
    killed_low_memory: bool = False
    stop: threading.Event = field(default_factory=threading.Event)

    def snapshot(self) -> None:
        pids = self.group.pids()
        self.peak_procs = max(self.peak_procs, len(pids))
        threads = 0
        for pid in pids:
            st = read_stat(pid)
            if st is None:
                continue
            threads += st.threads
            if pid in self.seen:
                self.seen[pid].last = st
            else:
                self.seen[pid] = _Seen(st, st, cmdline(pid))
        self.peak_threads = max(self.peak_threads, threads)

    def loop(self) -> None:
        tick = 0
        while not self.stop.wait(self.interval_s):
            self.snapshot()
            tick += 1
            if tick % 5 == 0 and mem_available_mib() < self.min_free_mib:
                self.killed_low_memory = True
                self.group.kill_all()


def run_client(
    argv: Sequence[str],
    env: dict[str, str],
    group: ClientGroup,
    timeout_s: float,
    out_dir: Path,
    label: str,
    node_cpu: NodeCpu | None = None,
    interval_s: float = 0.05,
    min_free_mib: int = 1536,
) -> dict[str, Any]:
    """Run argv once in the group; wall, tree CPU, per-process CPU, memory, node CPU."""
    before = {p: st for p in group.pids() if (st := read_stat(p)) is not None}
    sampler = _Sampler(group, interval_s, min_free_mib)
    group.reset_peak()
    oom0 = group.oom_kills()
    c0, n0 = group.cpu(), node_cpu.usage_s() if node_cpu else None
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    m0 = machine_busy_s()
    out_path, err_path = out_dir / f"{label}.out", out_dir / f"{label}.err"
    fired = threading.Event()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(
            group.wrap(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            cwd=str(out_dir),
            start_new_session=True,
        )
        timer = threading.Timer(timeout_s, _kill, (proc.pid, group, fired))
        timer.start()
        thread = threading.Thread(target=sampler.loop, daemon=True)
        thread.start()
        try:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            wall = time.perf_counter() - started
            sampler.stop.set()
            thread.join()
            sampler.snapshot()  # the keepers, and the client itself as a zombie: exact figures
            zombie = read_stat(proc.pid)
            _, status, _ = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            sampler.stop.set()
        proc.returncode = os.waitstatus_to_exitcode(status)
    c1, n1 = group.cpu(), node_cpu.usage_s() if node_cpu else None
    machine = machine_busy_s() - m0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    sample: dict[str, Any] = {
        "wall_s": round(wall, 4),
        "rc": proc.returncode,
        "timed_out": fired.is_set(),
        "killed_low_memory": sampler.killed_low_memory,
        "oom_kills": group.oom_kills() - oom0,
        "loadavg_1m_before": load,
        "rusage_children_cpu_s": round(
            ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime, 3
        ),
        "node_cpu_s": round(n1 - n0, 3) if n0 is not None and n1 is not None else None,
        "tree_mem_peak_mib": group.mem_peak_mib(),
        "peak_procs": sampler.peak_procs,
        "peak_threads": sampler.peak_threads,
    }
    if c0 is not None and c1 is not None:
        sample["cpu_s"] = round(c1[0] - c0[0], 4)
        sample["user_s"] = round(c1[1] - c0[1], 4)
        sample["sys_s"] = round(c1[2] - c0[2], 4)
    else:  # no cpuacct group: the waited-for tree only
        sample["cpu_s"] = sample["rusage_children_cpu_s"]
    # What else kept the cores busy meanwhile (other users of the machine), in cores.
    others = machine - sample["cpu_s"] - (sample["node_cpu_s"] or 0)
    sample["machine_cpu_s"] = round(machine, 3)
    sample["other_cores_busy"] = round(max(others, 0) / wall, 2) if wall > 0 else None
    sample["procs"] = _per_process(proc.pid, zombie, sampler.seen, before)
    if proc.returncode != 0 or fired.is_set():
        sample["stderr_tail"] = _tail(err_path)
        sample["stdout_tail"] = _tail(out_path)
    return sample


def _kill(pid: int, group: ClientGroup, fired: threading.Event) -> None:
    fired.set()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    group.kill_all()


def _per_process(
    client: int, zombie: ProcStat | None, seen: dict[int, _Seen], before: dict[int, ProcStat]
) -> list[dict[str, Any]]:
    """Each process's CPU during the run, largest first. The client's own figure is exact (its
    zombie); its reaped children's (workers) are sampled, then scaled so that together they are
    exactly what the kernel says the client's waited-for children used."""
    rows: list[dict[str, Any]] = []
    for pid, s in seen.items():
        start = before[pid].cpu_s if pid in before else 0.0
        rows.append(
            {
                "pid": pid,
                "ppid": s.first.ppid,
                "comm": s.last.comm,
                "cmd": s.cmd,
                "cpu_s": round(s.last.cpu_s - start, 4),
                "alive_before": pid in before,
                "source": "sampled",
            }
        )
    by_pid = {r["pid"]: r for r in rows}
    if zombie is not None:
        own = by_pid.setdefault(client, {"pid": client, "ppid": os.getpid(), "cmd": "", "comm": ""})
        own.update(comm=zombie.comm, cpu_s=round(zombie.cpu_s, 4), source="exact (zombie stat)")
        own["alive_before"] = False
        reaped = [
            r
            for r in rows
            if r["ppid"] == client and r["pid"] != client and read_stat(r["pid"]) is None
        ]
        sampled = sum(r["cpu_s"] for r in reaped)
        if reaped and sampled > 0 and zombie.children_cpu_s >= sampled:
            scale = zombie.children_cpu_s / sampled
            for r in reaped:
                r["cpu_s"] = round(r["cpu_s"] * scale, 4)
                r["source"] = "sampled, scaled to the parent's cutime+cstime"
    out = sorted(by_pid.values(), key=lambda r: -r["cpu_s"])
    for r in out:
        r["role"] = "client" if r["pid"] == client else "other"
    return out


def _tail(path: Path, lines: int = 8) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []
