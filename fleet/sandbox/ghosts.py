"""Plant what a dead training run leaves behind on a sandbox node, and read it back.

Used by `fleet sandbox up --ghosts` (so the demo's `fleet cleanup` has real work) and by the
integration tests (which then assert that cleanup removed exactly this and nothing else).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleet.sandbox.defaults import GHOST_PORT
from fleet.sandbox.errors import SandboxError

if TYPE_CHECKING:
    from fleet.sandbox.box import Sandbox
    from fleet.sandbox.state import SandboxNode


# A trainer that ignores SIGTERM (as a wedged NCCL job does) and holds a torch shm file open.
_TRAINER = """\
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
shm = open("/dev/shm/torch_ghost_" + sys.argv[-1], "w")
time.sleep(3600)
"""

# A rendezvous store left listening on the master port by nothing that matches the patterns.
_LISTENER = """\
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(8)
time.sleep(3600)
"""

STATE_PATHS = (
    "/tmp/.torch_distributed_ghost",
    "/tmp/cuda_ghost",
    "/root/.nv/ComputeCache",
)
BYSTANDER = "jupyter-lab --no-browser --port 8888"


@dataclass(frozen=True)
class Ghosts:
    """What is left on one node: training pids, bystander pid, state paths, port listener."""

    training: tuple[int, ...]
    bystander: tuple[int, ...]
    paths: tuple[str, ...]
    listening: bool


def plant_ghosts(box: Sandbox, node: SandboxNode | str, port: int = GHOST_PORT) -> None:
    """Start a torchrun, a TERM-ignoring train.py, a port holder and a bystander; write state."""
    detach = "</dev/null >/dev/null 2>&1 &"
    script = f"""
set -e
mkdir -p /tmp/.torch_distributed_ghost /tmp/cuda_ghost /root/.nv/ComputeCache
echo store > /tmp/.torch_distributed_ghost/store
echo kernel > /tmp/cuda_ghost/cache.bin
echo cache > /root/.nv/ComputeCache/index
printf %s {shlex.quote(_TRAINER)} > /tmp/train.py
printf %s {shlex.quote(_LISTENER)} > /tmp/rdzv_store.py
setsid bash -c 'exec -a torchrun sleep 3600' {detach}
setsid python3 /tmp/train.py --deepspeed ds_config.json 0 {detach}
setsid python3 /tmp/rdzv_store.py {port} {detach}
setsid bash -c {shlex.quote(f"exec -a '{BYSTANDER}' sleep 3600")} {detach}
"""
    result = box.run_on(node, script)
    if result.returncode != 0:
        name = node if isinstance(node, str) else node.name
        raise SandboxError(
            f"planting ghosts on {name} failed (exit {result.returncode}): "
            f"{result.stderr.strip()[-200:] or 'no output'}"
        )
    if not box_poll(box, node, port):
        name = node if isinstance(node, str) else node.name
        raise SandboxError(
            f"the ghosts planted on {name} did not come up within 15 s",
            hint=f"is port {port} already taken on the node?",
        )


def box_poll(box: Sandbox, node: SandboxNode | str, port: int, timeout_s: float = 15) -> bool:
    """Wait until the planted processes and listener are all visible (no blind sleeps). The
    trainer counts once its shm file exists: it opens it after it set SIGTERM to ignored, so a
    cleanup that comes sooner cannot end it with TERM instead of KILL."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        g = read_ghosts(box, node, port)
        trainer_ready = any(p.startswith("/dev/shm/torch_ghost_") for p in g.paths)
        if len(g.training) >= 2 and trainer_ready and g.bystander and g.listening:
            return True
        time.sleep(0.1)
    return False


def read_ghosts(box: Sandbox, node: SandboxNode | str, port: int = GHOST_PORT) -> Ghosts:
    """Inspect a node through /proc: which planted things are still there.

    Patterns are anchored at the start of the command line so this script's own shell, whose
    argv contains the words, never counts itself.
    """
    script = f"""
for d in /proc/[0-9]*; do
  cmd=$(tr '\\0' ' ' < "$d/cmdline" 2>/dev/null) || continue
  state=$(sed -n 's/^State:[[:space:]]*\\([A-Z]\\).*/\\1/p' "$d/status" 2>/dev/null)
  [ "$state" = Z ] && continue
  case "$cmd" in
    torchrun*|"python3 /tmp/train.py"*) echo "training ${{d#/proc/}}" ;;
    "{BYSTANDER}"*) echo "bystander ${{d#/proc/}}" ;;
  esac
done
for p in {" ".join(STATE_PATHS)} /dev/shm/torch_*; do [ -e "$p" ] && echo "path $p"; done
port_hex=$(printf '%04X' {port})
awk -v p=":$port_hex" '$2 ~ p"$" && $4 == "0A" {{found=1}} END {{ if (found) print "listening" }}' \
  /proc/net/tcp /proc/net/tcp6 2>/dev/null
"""
    out = box.run_on(node, script).stdout.splitlines()
    training = tuple(int(x.split()[1]) for x in out if x.startswith("training "))
    bystander = tuple(int(x.split()[1]) for x in out if x.startswith("bystander "))
    paths = tuple(x.split(" ", 1)[1] for x in out if x.startswith("path "))
    return Ghosts(training, bystander, paths, "listening" in out)
