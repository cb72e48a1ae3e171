"""One measured run of a client command: wall, CPU, memory, process counts, node-side CPU."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import MIB, machine_busy_s


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
    m0 = machine_busy_s()
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
    machine = machine_busy_s() - m0
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
