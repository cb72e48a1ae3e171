"""What every part of the benchmark shares: where it lives, the port, logging, child envs."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from fleet.sandbox.defaults import GHOST_PORT

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
MIB = 1024 * 1024
PORT = GHOST_PORT  # where ghosts listen, and what the peers' one-liner frees


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far, all cores (the client, the nodes' sshd and
    tools, and any other work on the machine); guest time is in user already."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def python_env(base: dict[str, str]) -> dict[str, str]:
    """Python tools on this interpreter get a writable bytecode cache under bench/ (the machine may
    set PYTHONDONTWRITEBYTECODE, and an editable checkout has no .pyc otherwise): a normal
    `pip install` has compiled bytecode, and that is what users run."""
    env = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(BENCH / ".pycache")
    env["PYTHONPATH"] = str(REPO)
    # Every run connects afresh, as the figures say (cold); bench/warm.py measures warm ones.
    env["FLEET_PERSIST"] = "0"
    return env
