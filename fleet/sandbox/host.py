"""What the sandbox needs from the host: root and tools (preflight), host tools run with a clean
environment, /proc scans, and telling the sandbox's own processes from anyone else's.

Every process the sandbox starts carries FLEET_SANDBOX (the state dir) and FLEET_SANDBOX_NODE
(the node name) in its environment: that marker, read back from /proc/<pid>/environ, is what is
checked before anything is killed by pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from fleet.sandbox.errors import SandboxError

SSHD = "/usr/sbin/sshd"
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENV_SANDBOX = "FLEET_SANDBOX"
ENV_NODE = "FLEET_SANDBOX_NODE"
_TOOLS = ("ip", "unshare", "nsenter", "tini", "ssh-keygen", "mount", "umount", "hostname", "pkill")
_T = TypeVar("_T")
_R = TypeVar("_R")


def preflight() -> None:
    """Fail early with one clear line when this machine cannot host a sandbox."""
    if os.geteuid() != 0:
        raise SandboxError(
            "fleet sandbox needs root (network, PID and mount namespaces)",
            hint="run it as root, e.g. with sudo",
        )
    missing = [tool for tool in _TOOLS if shutil.which(tool, path=NODE_PATH) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    if missing:
        raise SandboxError(
            f"fleet sandbox needs {', '.join(missing)}, not found",
            hint="apt-get install openssh-server openssh-client tini iproute2 util-linux procps",
        )


def run(
    cmd: Sequence[str], *, stdin: str | None = None, timeout_s: float = 60, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a host tool with a clean env; turn failure into a SandboxError naming the tool."""
    try:
        proc = subprocess.run(
            list(cmd),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=node_env(),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"{cmd[0]} failed: {exc}") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise SandboxError(
            f"`{' '.join(cmd[:4])}` failed (exit {proc.returncode}): "
            f"{detail[-1] if detail else 'no output'}"
        )
    return proc


def node_env(**extra: str) -> dict[str, str]:
    """A minimal login-like environment, so the host's env does not leak into nodes."""
    env = {"PATH": NODE_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root"}
    env["LANG"] = "C.UTF-8"
    env.update(extra)
    return env


def parallel(fn: Callable[[_T], _R], items: Iterable[_T], workers: int = 16) -> list[_R]:
    """Map over a thread pool: per-node tool runs are process-bound, not Python-bound."""
    todo = list(items)
    if len(todo) <= 1:
        return [fn(item) for item in todo]
    with ThreadPoolExecutor(max_workers=min(workers, len(todo))) as pool:
        return list(pool.map(fn, todo))


def wait_captured(cmd: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
    """Run cmd with output to files, so background children cannot hold a pipe open."""
    # On timeout the process group is killed and TimeoutExpired carries the output so far.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=node_env(),
            cwd="/",
            start_new_session=True,
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    if timed_out:
        raise subprocess.TimeoutExpired(list(cmd), timeout_s, stdout, stderr)
    return proc.returncode, stdout, stderr


def keygen(path: Path, comment: str) -> None:
    """A fresh ed25519 keypair with no passphrase (the sandbox is unattended)."""
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def poll(
    done: Callable[[], bool], timeout_s: float, what: str | Callable[[], str], hint: str = ""
) -> None:
    """Poll `done` until it holds; SandboxError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while not done():
        if time.monotonic() > deadline:
            said = what if isinstance(what, str) else what()
            raise SandboxError(f"timed out after {timeout_s:.0f}s waiting for {said}", hint=hint)
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def tail(path: Path, lines: int = 5) -> str:
    """Last lines of a log file, joined for a one-line message."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


# --------------------------------------------------------------------------- /proc


def proc_read(pid: int, what: str) -> bytes | None:
    """A /proc/<pid>/<what> file, or None if the process is gone."""
    try:
        return Path(f"/proc/{pid}/{what}").read_bytes()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """True if the pid exists and is not a zombie waiting to be reaped."""
    if pid <= 0:
        return False
    stat = proc_read(pid, "stat")
    if stat is None:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def argv0(pid: int) -> str:
    """Basename of a process's argv[0] ('' if gone)."""
    raw = proc_read(pid, "cmdline") or b""
    return os.path.basename(raw.split(b"\0", 1)[0].decode(errors="replace"))


def marker(pid: int) -> tuple[str, str] | None:
    """The (state dir, node name) a process was started for, from its environment."""
    raw = proc_read(pid, "environ")
    if not raw:
        return None
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    sandbox, node = env.get(ENV_SANDBOX.encode()), env.get(ENV_NODE.encode())
    if sandbox is None or node is None:
        return None
    return sandbox.decode(errors="replace"), node.decode(errors="replace")


def is_ours(pid: int, state_dir: Path, name: str, argv0_: str) -> bool:
    """True if pid is alive, runs `argv0_` and was started by the sandbox at `state_dir` for
    node `name`."""
    return alive(pid) and argv0(pid) == argv0_ and marker(pid) == (str(state_dir), name)


def marked(state_dir: Path, names: set[str] | None) -> list[int]:
    """Live processes started by the sandbox at `state_dir` (for the named nodes, or all)."""
    found = []
    for pid in all_pids():
        mark = marker(pid)
        if mark and mark[0] == str(state_dir) and (names is None or mark[1] in names):
            found.append(pid)
    return [pid for pid in found if alive(pid)]


def kill(pids: Iterable[int]) -> None:
    """SIGKILL each pid, ignoring those already gone."""
    for pid in dict.fromkeys(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def all_pids() -> list[int]:
    """Every pid on the host."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from one scan of /proc (no /proc/<pid>/task/*/children here)."""
    kids: dict[int, list[int]] = {}
    for pid in all_pids():
        stat = proc_read(pid, "stat")
        if stat is None:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        kids.setdefault(int(fields[1]), []).append(pid)
    return kids
