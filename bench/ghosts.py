"""Ghosts for the cleanup workload: planted on every node before a run, checked after, reset."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import PORT
from fleet.sandbox import Sandbox, SandboxNode
from fleet.sandbox.ghosts import plant_ghosts, read_ghosts

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
