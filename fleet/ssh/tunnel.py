"""A ProxyJump hop's direct-tcpip channel as the socket of the connection made through it."""

from __future__ import annotations

import threading
from typing import Any


class TunnelSocket:
    """paramiko's Channel as a socket for the Transport of a host behind a jump host, with its
    sends and its close in one order.

    paramiko's Channel builds a data packet under its lock but writes it to the jump host's
    connection after releasing the lock, and close() does the same with its EOF and CLOSE. So
    when one thread sends through the tunnel (the tunnelled connection's own thread answering
    the node, or a step's thread) while another closes it, the CLOSE can reach the jump host's
    sshd before the data. sshd then ends the whole connection ("data packet referred to
    nonexistent channel"), and with it every other host reached through that jump host, in the
    middle of their steps. Here a send that has begun is written before close begins, and a
    send after close fails as on a closed socket (the Channel's own "Socket is closed")."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self._order = threading.Lock()

    def send(self, data: bytes) -> int:
        with self._order:
            sent: int = self._channel.send(data)
            return sent

    def sendall(self, data: bytes) -> None:
        with self._order:
            self._channel.sendall(data)

    def recv(self, size: int) -> bytes:
        got: bytes = self._channel.recv(size)
        return got

    def close(self) -> None:
        with self._order:
            self._channel.close()

    def __getattr__(self, name: str) -> Any:
        """Everything else is the Channel's (settimeout, _closed, getpeername, ...)."""
        return getattr(self._channel, name)
