"""A keeper started by forking the command that needs it, rather than a fresh interpreter.

A fresh `python -m fleet.ssh.keeper` pays Python's start and every import again (~58 ms of CPU,
measured); a child forked from a fleet command already has Python, the standard library and
half of fleet loaded. The rest, the keeper's own code, the command loads once before it forks
(not each keeper after it), so a first command with warm connections, which starts one keeper per
core (up to eight), pays that import once however many keepers it starts.

Forking is done only from a single-threaded process (WarmTransport.check, before its threads
start): a fork copies the calling thread only, and a lock another thread held would stay held
in the child. The child is made what the spawned keeper is: a session
of its own (no terminal, no Ctrl-C of the operator's), stdin, stdout and stderr on /dev/null, and
no other file descriptor of the command (a keeper holding the command's stdout open would keep
`fleet ... | tee` waiting for the window to end). It never returns into the command's code.
No keeper is forked once the operator has typed a secret for the command (the sudo password of
-K, a key's passphrase: warm.typed_secrets): a forked keeper's memory, a copy of the command's,
would hold it for the window. It is spawned then, and holds only what a command sends it.

Its process title is set (setproctitle) to `fleet-keeper SOCKET`, as OpenSSH names its
ControlPersist master: a forked child would otherwise show the command's own arguments in `ps`
for as long as it lives, looking like a command still running (and keeping an argument on show
past the command's end). Without setproctitle a keeper is never forked: it is spawned.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import threading
from pathlib import Path

TITLE = "fleet-keeper"


class Forked:
    """The forked keeper, as the start code watches it (what subprocess.Popen offers)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The keeper's exit status once it has exited (reaped then), else None."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None  # reaped elsewhere: the caller's socket check decides
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def threads_now() -> int:
    """The threads this process runs, as the kernel counts them (/proc/self/task). Python's
    count drops when a thread's Python code ends, before the thread has exited: OpenSSL's
    thread-exit handler, run after that, takes its global lock, and a fork at that moment
    leaves the lock held forever in the child (a keeper forked so hung on its first random
    bytes). Python's count where /proc cannot tell."""
    try:
        return max(len(os.listdir("/proc/self/task")), threading.active_count())
    except OSError:
        return threading.active_count()


def can_fork() -> bool:
    """This process is single-threaded (a fork copies no lock another thread holds), and a
    forked keeper can name itself."""
    return threads_now() == 1 and importlib.util.find_spec("setproctitle") is not None


def fork_keeper(path: Path) -> Forked:
    """Fork a keeper serving the socket `path` (call only when can_fork())."""
    # The keeper's code (libssh2, the transports, the ssh config) is loaded here, once, before
    # the fork, not by each keeper after it: a command that starts several keepers pays
    # its import once instead of once per keeper, and the keepers share its pages.
    from fleet.ssh import keeper

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; its behaviour is tested from outside
        code = 1
        try:
            _detach()
            from setproctitle import setproctitle

            setproctitle(f"{TITLE} {path}")
            # What the command had allocated is never freed here: out of the collector's
            # sight, its pages stay shared with the command instead of being copied.
            gc.freeze()
            code = keeper.main([TITLE, str(path)])
        finally:
            os._exit(code)
    return Forked(pid)


def _detach() -> None:
    """Own session, stdio on /dev/null, every other descriptor closed."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
