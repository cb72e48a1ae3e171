"""One node command on an exec channel of a session fleet already holds (fleet.ssh.transport's
SSHSession): its stdout as a byte stream, its stderr kept short, its exit status to a deadline.

No second SSH stack: the channel is opened on the session's own paramiko transport, with the
host keys, ssh config and jump hosts fleet.ssh.transport already applied. The channel window is the
only buffer between the node and this process, so memory per transfer is bounded by it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from fleet.ssh.failure import ConnectFailed

POLL_S = 0.5
READ_BYTES = 256 * 1024  # one recv at most (paramiko returns what it has buffered)
STDERR_KEEP_BYTES = 4096
EXIT_WAIT_S = 60.0  # after the stream ended: the node's last work is a hash or an fsync
# paramiko rekeys its side of a connection every 512 MiB; measured here against OpenSSH 9, one
# such client-initiated rekey in a 1 GiB stream hung the channel for paramiko's 30 s and failed
# it. OpenSSH's own default for AES (RFC 4344: 2^(L/4) blocks) is 64 GiB: fleet uses that for
# connections that move files; the server still rekeys when its RekeyLimit says so.
REKEY_BYTES = 1 << 36
REKEY_PACKETS = 1 << 31


class Connection(Protocol):
    """What a transfer needs of a connected host: fleet.ssh.transport.SSHSession."""

    @property
    def client(self) -> Any: ...


class Cancelled(Exception):
    """The transfer was cancelled (Ctrl-C, SIGTERM) while it ran."""


def prepare(session: Connection) -> Any:
    """The session's paramiko transport, set up for bulk data (see REKEY_BYTES)."""
    transport = session.client.get_transport()
    if transport is None or not transport.is_active():
        raise ConnectFailed("connection lost", "the SSH connection closed")
    packetizer = transport.packetizer
    packetizer.REKEY_BYTES = max(packetizer.REKEY_BYTES, REKEY_BYTES)
    packetizer.REKEY_PACKETS = max(packetizer.REKEY_PACKETS, REKEY_PACKETS)
    return transport


class Exec:
    """A running node command. Use as a context manager: the channel always closes.

    A node that stops answering altogether (frozen, cut off without a reset) is given up as a
    step's is (fleet.ssh.transport.KEEPALIVE_S): after that long without a byte, a keepalive
    asks sshd for a reply, and none within DEAD_PEER_S is "connection lost". A node that is
    only slow (hashing, syncing) still answers it and is waited for."""

    input_closed = False  # as fleet.transfer.pipe.Pipe's (a closed channel raises instead)
    liveness: Any = None  # fleet.ssh.transport's check of the node; None: not checked

    def __init__(
        self,
        session: Connection,
        command: bytes,
        *,
        window_bytes: int,
        cancel: threading.Event | None = None,
    ) -> None:
        self.cancel = cancel or threading.Event()
        self.stderr = bytearray()
        try:
            transport = prepare(session)
            self.channel = transport.open_session(window_size=window_bytes, timeout=30)
            self.channel.settimeout(POLL_S)
            self.channel.exec_command(command)
        except ConnectFailed:
            raise
        except Exception as exc:  # paramiko's errors, EOFError, OSError: the connection failed
            raise ConnectFailed("connection lost", f"cannot start a transfer: {exc}") from None
        from fleet.ssh.transport import Liveness

        self.liveness = Liveness(transport)

    def _still_there(self, heard: bool) -> None:
        """Note that the node sent something (`heard`), or check that it still answers."""
        if self.liveness is None:
            return
        now = time.monotonic()
        if heard:
            self.liveness.heard_from(now)
        elif not self.liveness.alive(now):
            from fleet.ssh.transport import DEAD_PEER_S, KEEPALIVE_S

            raise ConnectFailed(
                "connection lost",
                f"the node went away during a transfer: silent for {KEEPALIVE_S}s, then no "
                f"answer to a keepalive for {DEAD_PEER_S}s",
            )

    def __enter__(self) -> Exec:
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()

    def _keep_stderr(self) -> bool:
        """Drain stderr (it shares the window with stdout), keeping only its last bytes; True
        when there was some."""
        got = False
        while self.channel.recv_stderr_ready():
            self.stderr += self.channel.recv_stderr(65536)
            del self.stderr[:-STDERR_KEEP_BYTES]
            got = True
        return got

    def chunks(self) -> Iterator[bytes]:
        """stdout as it arrives, until EOF; Cancelled when cancelled."""
        while True:
            if self.cancel.is_set():
                raise Cancelled
            try:
                data = self.channel.recv(READ_BYTES)
            except TimeoutError:
                # Nothing yet. Never end here on `channel.closed`: the node's data, EOF and close
                # may all have arrived since the timeout, and recv still holds the data (it
                # returns b"" only once that is read). A dead connection closes the channel too.
                self._still_there(self._keep_stderr())
                continue
            except Exception as exc:
                raise ConnectFailed("connection lost", f"during a transfer: {exc}") from None
            self._keep_stderr()
            if not data:
                return
            self._still_there(heard=True)
            yield data

    def send(self, data: bytes | memoryview) -> None:
        """Write to the command's stdin (blocks while the node's window is full)."""
        view = memoryview(data)
        while view:
            if self.cancel.is_set():
                raise Cancelled
            try:
                sent = self.channel.send(view[:65536])
            except TimeoutError:  # the node's window is full: it has not read for a while
                self._still_there(self._keep_stderr())
                continue
            except Exception as exc:
                raise ConnectFailed("connection lost", f"during a transfer: {exc}") from None
            if sent == 0:
                raise ConnectFailed("connection lost", "the node closed the stream")
            view = view[sent:]
            self._still_there(heard=True)  # it took bytes: its window moved
            self._keep_stderr()

    def end_input(self) -> None:
        self.channel.shutdown_write()

    def wait(self, wait_s: float = EXIT_WAIT_S) -> int:
        """The exit status (drains what is left); ConnectFailed past the deadline."""
        deadline = time.monotonic() + wait_s
        while not self.channel.exit_status_ready():
            if self.cancel.is_set():
                raise Cancelled
            if time.monotonic() > deadline:
                raise ConnectFailed("connection lost", f"no exit status within {wait_s:g}s")
            self._drain_all()
        self._drain_all()
        status: int = self.channel.recv_exit_status()
        return status

    def _drain_all(self) -> None:
        try:
            while self.channel.recv_ready():
                self.channel.recv(READ_BYTES)
        except TimeoutError:
            pass
        self._keep_stderr()
        if not self.channel.exit_status_ready():
            time.sleep(0.02)

    def stderr_text(self) -> str:
        """The last stderr line that is not a sha256 report (for messages)."""
        lines = [x for x in bytes(self.stderr).splitlines() if x.strip() and b"sha256=" not in x]
        return lines[-1].decode("utf-8", "replace")[:300] if lines else ""


def run_small(
    session: Connection, command: bytes, max_bytes: int = 65536
) -> tuple[int, bytes, str]:
    """A short node command: (exit status, stdout up to max_bytes, last stderr line)."""
    out = bytearray()
    with Exec(session, command, window_bytes=256 * 1024) as ex:
        for chunk in ex.chunks():
            out += chunk[: max(0, max_bytes - len(out))]
        status = ex.wait()
        return status, bytes(out), ex.stderr_text()


OnBytes = Callable[[int], None]
