"""A command that ends before reading its stdin (a login shell's rc that exits, a step that never
reads) makes sshd close the channel while fleet still writes: that is the command's outcome, not a
lost connection. Only a dead transport is. The race is timing-dependent end to end
(tests/e2e/test_login_shell.py), so the decision is pinned here on a stand-in channel."""

from __future__ import annotations

import pytest

from fleet.ssh.transport import SSHSession


class _Transport:
    def __init__(self, active: bool) -> None:
        self.active = active

    def is_active(self) -> bool:
        return self.active


class _Channel:
    """Accepts `accept` writes, then fails as paramiko does on a closed channel."""

    def __init__(self, accept: int, transport_active: bool) -> None:
        self.accept = accept
        self.closed = False
        self.sent: list[bytes] = []
        self.transport = _Transport(transport_active)
        self.shut = False

    def get_transport(self) -> _Transport:
        return self.transport

    def sendall(self, data: bytes) -> None:
        if len(self.sent) >= self.accept:
            self.closed = True
            raise OSError("Socket is closed")
        self.sent.append(data)

    def shutdown_write(self) -> None:
        self.shut = True


@pytest.mark.parametrize("accept", [0, 1, 2])
def test_a_channel_the_command_closed_is_not_a_lost_connection(accept: int) -> None:
    channel = _Channel(accept, transport_active=True)
    SSHSession._send_stdin(channel, False, None, "payload", "tok")  # type: ignore[arg-type]
    assert len(channel.sent) == min(accept, 2)


def test_a_send_failing_on_a_dead_transport_is_still_a_lost_connection() -> None:
    channel = _Channel(1, transport_active=False)
    with pytest.raises(OSError, match="Socket is closed"):
        SSHSession._send_stdin(channel, False, None, "payload", "tok")  # type: ignore[arg-type]


def test_a_send_failing_on_an_open_channel_is_not_swallowed() -> None:
    channel = _Channel(0, transport_active=True)

    def fail(data: bytes) -> None:
        raise OSError("broken pipe")

    channel.sendall = fail  # type: ignore[method-assign]
    with pytest.raises(OSError, match="broken pipe"):
        SSHSession._send_stdin(channel, False, None, "payload", "tok")  # type: ignore[arg-type]
