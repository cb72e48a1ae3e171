"""A first command's worker becoming its shard's keeper (fleet/ssh/handoff.py): when it must not.

Each case is a worker's last step, run here in-process: the connections it held are stand-ins
(a seam: what is checked is whether they were closed or kept), the sockets and lock files real.
That a worker does become the keeper, and what a later command finds there, is tested end to
end in tests/e2e/test_warm.py."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.core.hosts import Host
from fleet.ssh.handoff import HandoffTransport
from fleet.ssh.settings import SshSettings


class Held:
    """A connection a run held for its keeper."""

    def __init__(self) -> None:
        self.closed = False

    def alive(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def directory() -> Iterator[Path]:
    """Short: a unix socket's path is at most 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="fleet-h-") as path:
        yield Path(path)


def _holding(directory: Path, count: int = 2) -> tuple[HandoffTransport, list[Held]]:
    transport = HandoffTransport(
        SshSettings(ssh_config=Path("/dev/null"), persist_s=30),
        [directory / "keeper-0.sock"],
        1,
    )
    held = [Held() for _ in range(count)]
    for i, session in enumerate(held):
        transport.hold(Host(name=f"gpu{i}", address=f"gpu{i}.invalid"), session)  # type: ignore[arg-type]
    return transport, held


def test_a_cancelled_run_keeps_nothing(directory: Path) -> None:
    transport, held = _holding(directory)
    assert transport.stay(0, whole=False) is None
    assert all(s.closed for s in held)
    assert not (directory / "keeper-0.sock").exists()


def test_a_shard_whose_keeper_already_listens_is_left_to_it(directory: Path) -> None:
    """Another command started this shard's keeper meanwhile: it serves the shard, and this
    worker's connections are closed (never a second keeper on one socket)."""
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(directory / "keeper-0.sock"))
    other.listen(1)
    try:
        transport, held = _holding(directory)
        assert transport.stay(0, whole=True) is None
        assert all(s.closed for s in held)
    finally:
        other.close()


def test_a_shard_whose_keeper_is_being_started_is_left_to_it(directory: Path) -> None:
    """Another command holds the shard's start lock: it is starting the keeper."""
    import fcntl

    with open(directory / "keeper-0.sock.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        transport, held = _holding(directory)
        assert transport.stay(0, whole=True) is None
    assert all(s.closed for s in held)
    assert not (directory / "keeper-0.sock").exists()


def test_a_run_that_held_nothing_starts_no_keeper(directory: Path) -> None:
    transport, _ = _holding(directory, count=0)
    assert transport.stay(0, whole=True) is None
    assert not (directory / "keeper-0.sock").exists()


def test_close_lets_every_held_connection_go(directory: Path) -> None:
    """A run that could not fork (it ran in the command): nothing outlives it."""
    transport, held = _holding(directory)
    transport.close()
    assert all(s.closed for s in held)
