"""The ProxyCommand process, as paramiko's socket: imported only when a host connects through a
ProxyCommand (which is paramiko's path; importing this module loads paramiko)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Mapping

from fleet.ssh.failure import ConnectFailed
from fleet.ssh.library import paramiko

STDERR_LINES = 5


class ProxyCommandSocket(paramiko.ProxyCommand):
    """A ProxyCommand run the way OpenSSH runs it, as paramiko's socket.

    paramiko's own ProxyCommand splits the line itself and runs it without a shell (OpenSSH runs
    `exec COMMAND` with the user's shell, so quotes, pipes and $VARS work), never reads the
    command's stderr (a chatty proxy blocks on a full pipe, and its reason for failing is lost),
    spins on EOF until the timeout, and leaves the process to the Ctrl-C that fleet's cancel
    needs the connections to survive. Here the command runs in its own session (a Ctrl-C at
    the terminal does not reach it; close() ends it), stderr is kept (the last lines) for the
    error message, and EOF is an empty read, as on a socket.

    It runs in `cwd`, the directory the fleet command was started in (as ssh runs it in its
    own), also from a keeper, which has left that directory (fleet/ssh/workdir.py); None: this
    process's own. The command keeps that directory as its own for as long as it runs.
    """

    def __init__(
        self, command: str, cwd: str | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        """`environ`: the fleet command's environment, which the command runs in (None: this
        process's; a keeper's is the one of the command that started it)."""
        shell = (os.environ if environ is None else environ).get("SHELL") or "/bin/sh"
        self.cmd = [shell, "-c", f"exec {command}"]
        self.timeout: float | None = None
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_LINES)
        try:
            self.process = subprocess.Popen(
                self.cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
                cwd=cwd,
                env=environ,
            )
        except OSError as exc:  # no such shell, or `cwd` removed since it was looked at
            where = f" in {cwd}" if cwd is not None else ""
            raise ConnectFailed(
                "proxy command failed", f"cannot start it{where}: {exc.strerror or exc}"
            ) from None
        self._stderr_reader = threading.Thread(
            target=self._read_stderr, name="fleet-proxy-stderr", daemon=True
        )
        self._stderr_reader.start()

    def _read_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").strip()
            if line:
                self.stderr_tail.append(line[:300])

    def send(self, content: bytes) -> int:  # type: ignore[override]
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(content)
        except OSError:
            raise EOFError("the proxy command is gone") from None
        return len(content)

    def recv(self, size: int) -> bytes:
        """Up to `size` bytes; b"" at EOF; socket.timeout when nothing came within the timeout."""
        stdout = self.process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], self.timeout)
        if not ready:
            raise TimeoutError()
        try:
            return os.read(stdout.fileno(), size)
        except OSError:
            return b""

    def close(self) -> None:
        """Stop the command (its whole session) and reap it."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()

    def exit_status(self, wait_s: float = 1.0) -> int | None:
        """The command's exit status once it has ended (waiting a little for it), else None."""
        try:
            status = self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None
        self._stderr_reader.join(timeout=wait_s)  # its last words, for why()
        return status

    def why(self) -> str:
        """The command's last stderr line, for the error message."""
        return self.stderr_tail[-1] if self.stderr_tail else "no message on stderr"
