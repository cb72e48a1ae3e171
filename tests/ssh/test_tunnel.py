"""fleet/ssh/tunnel.py: a host's connection through a jump host never lets its CLOSE overtake a
send. The channel here is a stand-in that keeps paramiko's order of work (channel.py: a packet
is built under the channel's lock and written after it is released), so that the race the real
one has can be played out step by step; the real one, through a real jump host, is in
tests/e2e/test_sudo_and_jump.py."""

from __future__ import annotations

import threading

import pytest

from fleet.ssh.tunnel import TunnelSocket


class PacedChannel:
    """Writes what is sent or closed to `wire`, as paramiko's Channel does: built under the
    lock, written after it. A send waits between the two until `go` is set."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.closed = False
        self.wire: list[tuple[str, bytes]] = []
        self.built = threading.Event()
        self.go = threading.Event()
        self.timeout: float | None = None

    def send(self, data: bytes) -> int:
        with self.lock:
            if self.closed:
                raise OSError("Socket is closed")
        self.built.set()
        assert self.go.wait(5)
        self.wire.append(("data", data))
        return len(data)

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self.wire.append(("close", b""))

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout


def _send_then_close(
    sock: PacedChannel | TunnelSocket, channel: PacedChannel, patience_s: float
) -> bool:
    """A send caught between building and writing its packet, and a close meanwhile; True if
    the close was still waiting, `patience_s` after it began, when the send was let go."""
    sender = threading.Thread(target=sock.send, args=(b"reply",))
    sender.start()
    assert channel.built.wait(5)
    closer = threading.Thread(target=sock.close)
    closer.start()
    closer.join(patience_s)
    waited = closer.is_alive()
    channel.go.set()
    sender.join(5)
    closer.join(5)
    return waited


def test_the_stand_in_has_paramikos_race() -> None:
    """Without the wrapper the close goes out first: the data then names a channel the jump
    host's sshd has freed, and it ends the whole connection."""
    channel = PacedChannel()
    assert not _send_then_close(channel, channel, patience_s=5)  # nothing holds it back
    assert channel.wire == [("close", b""), ("data", b"reply")]


def test_a_close_waits_for_the_send_in_flight() -> None:
    channel = PacedChannel()
    assert _send_then_close(TunnelSocket(channel), channel, patience_s=0.3)
    assert channel.wire == [("data", b"reply"), ("close", b"")]


def test_a_send_after_close_fails_as_on_a_closed_socket() -> None:
    channel = PacedChannel()
    sock = TunnelSocket(channel)
    sock.close()
    with pytest.raises(OSError, match="closed"):
        sock.send(b"late")
    assert channel.wire == [("close", b"")]


def test_everything_else_is_the_channels() -> None:
    channel = PacedChannel()
    sock = TunnelSocket(channel)
    sock.settimeout(1.0)
    assert channel.timeout == 1.0
    assert sock.closed is False
