"""Client cost of `fleet status --watch`: CPU per refresh and memory, all nodes watched.

It starts `fleet status --watch INTERVAL --json` against the sandbox, waits until every node has
reported once (connections up, scripts sent), then reads the fleet process's CPU time (utime +
stime from /proc/PID/stat) at the start and the end of a WINDOW of seconds: CPU per refresh is
the difference over WINDOW / INTERVAL refreshes. Also its peak RSS (VmHWM) and how many nodes
were marked "no answer" or "lost" in the window (0 on a healthy sandbox).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def has_watch(env: dict[str, str], cwd: Path) -> bool:
    """Whether the fleet on env's PYTHONPATH has --watch; run in cwd, a directory with no fleet
    package of its own (`python -m` puts the working directory first on the path)."""
    out = subprocess.run(
        [sys.executable, "-m", "fleet", "status", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        check=False,
    )
    return "--watch" in out.stdout


def watch_cost(
    argv_common: list[str],
    env: dict[str, str],
    nodes: int,
    cwd: Path,
    interval_s: float = 1.0,
    window_s: float = 20.0,
    ready_timeout_s: float = 300.0,
) -> dict[str, Any]:
    """One measured watch at this size (see the module doc)."""
    argv = [sys.executable, "-m", "fleet", "status", "--watch", f"{interval_s:g}", "--json"]
    proc = subprocess.Popen(
        [*argv, *argv_common],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    reported: set[str] = set()
    trouble: list[str] = []
    ready = threading.Event()
    window = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("state") in ("no answer", "lost"):
                if window.is_set():
                    trouble.append(doc.get("host", "?"))
            else:
                reported.add(doc.get("host", "?"))
            if len(reported) >= nodes:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = time.monotonic()
    result: dict[str, Any] = {"interval_s": interval_s, "window_s": window_s}
    try:
        if not ready.wait(ready_timeout_s):
            result["failure"] = f"only {len(reported)} of {nodes} nodes reported"
            return result
        result["ready_s"] = round(time.monotonic() - started, 2)
        window.set()
        cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
        time.sleep(window_s)
        cpu1, t1 = _cpu_s(proc.pid), time.monotonic()
        refreshes = (t1 - t0) / interval_s
        result.update(
            cpu_s_per_refresh=round((cpu1 - cpu0) / refreshes, 4),
            cpu_pct=round(100 * (cpu1 - cpu0) / (t1 - t0), 1),
            peak_rss_mib=round(_hwm_mib(proc.pid), 1),
            nodes_in_trouble=len(set(trouble)),
        )
        return result
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        result["rc"] = proc.returncode
