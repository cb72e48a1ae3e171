"""One node command through the OpenSSH client binary (fleet.ssh.openssh's Route): the same
interface as fleet.transfer.channel.Exec (chunks, send, end_input, wait, stderr), on pipes.

The pipes are the only buffer between ssh and this process (1 MiB each where the kernel allows),
so memory per transfer stays bounded. ssh runs in a session of its own: Ctrl-C reaches fleet,
which cancels and then ends ssh itself; if fleet dies, ssh sees its pipes close and ends too.
ssh exits 255 for its own failures (connection, authentication, host key); any other status
is the node command's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import subprocess
import threading
import time
from collections.abc import Iterator

from fleet.ssh import openssh
from fleet.ssh.failure import ConnectFailed
from fleet.ssh.openssh import Route
from fleet.transfer.channel import EXIT_WAIT_S, POLL_S, STDERR_KEEP_BYTES, Cancelled, Connection

READ_BYTES = 1 << 20
PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Python 3.10+ on Linux; spelled out for mypy)
SSH_FAILED = 255


class Pipe:
    """A running node command via `ssh`. Use as a context manager: ssh always ends."""

    def __init__(
        self,
        argv: list[str | bytes],
        *,
        cancel: threading.Event | None = None,
        read_bytes: int = READ_BYTES,
        stdin: int | None = None,
    ) -> None:
        """`stdin`: a file descriptor ssh reads itself (a push with no rate cap: no copy
        through this process); else a pipe that `send` writes."""
        self.cancel = cancel or threading.Event()
        # One buffer, reused for every read: no allocation per chunk (64 hosts each allocating
        # and freeing 1 MiB chunks on their own threads peaked at 187 MiB RSS).
        self._buffer = bytearray(read_bytes)
        self.stderr = bytearray()
        self.input_closed = False  # the command stopped reading (its exit status says why)
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin is None else stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
            )
        except OSError as exc:
            raise ConnectFailed("connection lost", f"cannot start ssh: {exc}") from None
        assert self.proc.stdout is not None
        self._in = self.proc.stdin.fileno() if self.proc.stdin is not None else -1
        self._out = self.proc.stdout.fileno()
        for fd in (self._in, self._out) if self._in >= 0 else (self._out,):
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, F_SETPIPE_SZ, min(PIPE_BYTES, read_bytes))
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def __enter__(self) -> Pipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.proc.wait()
        self._reader.join(timeout=EXIT_WAIT_S)

    def _read_stderr(self) -> None:
        """Drain ssh's stderr (the node's and ssh's own), keeping only its last bytes."""
        assert self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        while data := os.read(fd, 65536):
            with self._lock:
                self.stderr += data
                del self.stderr[:-STDERR_KEEP_BYTES]

    def _ready(self, fd: int, write: bool) -> bool:
        if self.cancel.is_set():
            raise Cancelled
        readable, writable, _ = select.select(
            [] if write else [fd], [fd] if write else [], [], POLL_S
        )
        return bool(writable if write else readable)

    def chunks(self) -> Iterator[memoryview]:
        """stdout as it arrives, until EOF; Cancelled when cancelled. Each chunk is a view of
        the one buffer: valid until the next one is asked for."""
        view = memoryview(self._buffer)
        while True:
            if not self._ready(self._out, write=False):
                continue
            count = os.readv(self._out, [self._buffer])
            if not count:
                return
            yield view[:count]

    def send(self, data: bytes | memoryview) -> None:
        """Write to the command's stdin; once it stopped reading, the rest is dropped (its exit
        status, from wait, says why)."""
        view = memoryview(data)
        while view and not self.input_closed:
            if not self._ready(self._in, write=True):
                continue
            try:
                view = view[os.write(self._in, view) :]
            except BrokenPipeError:
                self.input_closed = True

    def end_input(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def running(self, wait_s: float) -> bool:
        """Whether ssh still runs after up to `wait_s`; Cancelled when cancelled."""
        if self.cancel.is_set():
            raise Cancelled
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=wait_s)
        return self.proc.poll() is None

    def wait(self, wait_s: float = EXIT_WAIT_S) -> int:
        """The node command's exit status; ConnectFailed when ssh itself failed or past the
        deadline."""
        deadline = time.monotonic() + wait_s
        while True:
            if self.cancel.is_set():
                raise Cancelled
            with contextlib.suppress(subprocess.TimeoutExpired):
                status = self.proc.wait(timeout=POLL_S)
                break
            if time.monotonic() > deadline:
                raise ConnectFailed("connection lost", f"no exit status within {wait_s:g}s")
        self._reader.join(timeout=POLL_S * 4)
        if status == SSH_FAILED or status < 0:
            said = self.stderr_text() or f"ssh exit {status}"
            raise ConnectFailed("connection lost", f"during a transfer (ssh): {said}")
        return status

    def stderr_text(self) -> str:
        """The last stderr line that is not a sha256 report (for messages)."""
        with self._lock:
            raw = bytes(self.stderr)
        lines = [x for x in raw.splitlines() if x.strip() and b"sha256=" not in x]
        return lines[-1].decode("utf-8", "replace")[:300] if lines else ""


MASTER = b"echo fleet-bulk-ok; exec cat >/dev/null"  # lives until fleet closes its stdin
MARKER = b"fleet-bulk-ok"
MARKER_KEEP_BYTES = 65536  # of what the node's shell prints before it (a login banner, rc files)
KEY_REFUSED = "Host key verification failed"
MASTER_EXIT_S = 5.0


class Bulk:
    """The `ssh` route to one host with its master connection running: `argv` for each file's
    ssh; `close` ends the master (its node command reads stdin until fleet closes it, so a
    fleet that dies takes the master with it) and removes the pinned known_hosts."""

    def __init__(self, route: Route, master: Pipe) -> None:
        self.route = route
        self.master = master

    def argv(self, command: bytes) -> list[str | bytes]:
        return self.route.argv(command)

    def close(self) -> None:
        self.master.end_input()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.master.proc.wait(timeout=MASTER_EXIT_S)
        self.master.close()
        self.route.close()


def open_route(session: Connection, cancel: threading.Event) -> tuple[Bulk | None, str]:
    """(the `ssh` route to a connected host, "ssh"), or (None, "paramiko (why)") when ssh cannot
    carry its bytes with fleet's settings. Its master connection proves the route before any
    file uses it; a host that offers ssh another host key than the one fleet verified is
    ConnectFailed, as on fleet's own connection: never a quiet fallback."""
    found = openssh.route(session)  # type: ignore[arg-type]
    if isinstance(found, str):
        return None, f"paramiko ({found})"
    master = Pipe(found.master_argv(MASTER), cancel=cancel)
    try:
        seen = _marker(master)
        if not seen:
            status = master.wait()
            return _no_route(master, found, f"ssh ran no command (exit {status})")
    except ConnectFailed as exc:
        if KEY_REFUSED in exc.detail:
            _no_route(master, found, "")
            raise ConnectFailed(
                "host key changed",
                "ssh was offered another host key than the one fleet verified on its own "
                "connection: possible man-in-the-middle",
            ) from None
        return _no_route(master, found, f"ssh failed: {exc.detail[-200:]}")
    except BaseException:
        _no_route(master, found, "")
        raise
    return Bulk(found, master), "ssh"


def _marker(master: Pipe) -> bool:
    """Read the master's stdout until the node's shell printed the marker (True) or ended."""
    out = bytearray()
    for chunk in master.chunks():
        out += chunk[: max(0, MARKER_KEEP_BYTES - len(out))]
        if MARKER in out:
            return True
    return False


def _no_route(master: Pipe, route: Route, why: str) -> tuple[None, str]:
    master.close()
    route.close()
    return None, f"paramiko ({why})"
