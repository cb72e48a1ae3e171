"""The keeper's pool of held connections, on stand-in sessions (no network): what is reused,
what is closed when, and that a connection in use is never closed by its window."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleet.ssh import keeper


class _Transport:
    def __init__(self) -> None:
        self.active = True

    def is_active(self) -> bool:
        return self.active


class _Client:
    def __init__(self) -> None:
        self.transport = _Transport()

    def get_transport(self) -> _Transport:
        return self.transport


class _Session:
    """What the pool uses of an SSHSession: its liveness, close, target, gateway, and whether
    several commands may use it at once (paramiko's: yes; libssh2's: no)."""

    def __init__(self, shared: bool = True) -> None:
        self.client = _Client()
        self.closed = False
        self.gateway = None
        self.target: Any = None
        self.shared = shared

    def alive(self) -> bool:
        return self.client.transport.is_active()

    def close(self) -> None:
        self.closed = True
        self.client.transport.active = False


def _trusted(session: Any) -> bool:
    return True


def _put(
    pool: keeper.Pool, key: str = "k", host: str = "gpu01", shared: bool = True
) -> tuple[Any, keeper.Entry]:
    session = _Session(shared)
    return session, pool.put(key, session, host)  # type: ignore[arg-type]


def test_a_released_connection_is_reused_within_its_window_then_closed() -> None:
    pool = keeper.Pool()
    session, entry = _put(pool)
    pool.release(entry, window_s=60)
    again, stale = pool.take("k", _trusted)
    assert again is entry
    assert not stale
    pool.release(entry, window_s=0)
    pool.reap()  # the longest window asked for wins: still held
    assert not session.closed
    entry.until = time.monotonic() - 1
    pool.reap()
    assert session.closed
    assert pool.empty()


def test_a_connection_in_use_outlives_its_window() -> None:
    pool = keeper.Pool()
    session, entry = _put(pool)
    entry.until = time.monotonic() - 1
    pool.reap()
    assert not session.closed


def test_a_dead_or_distrusted_connection_is_not_reused() -> None:
    pool = keeper.Pool()
    session, entry = _put(pool)
    pool.release(entry, window_s=60)
    assert pool.take("k", lambda s: False) == (None, True)
    assert session.closed
    second, entry = _put(pool)
    pool.release(entry, window_s=60)
    second.client.transport.active = False
    assert pool.take("k", _trusted) == (None, True)


@pytest.mark.parametrize("names", [{"gpu01"}, None])
def test_disconnect_closes_the_chosen_ones_in_use_or_not(names: set[str] | None) -> None:
    pool = keeper.Pool()
    first, _ = _put(pool, "a", "gpu01")
    second, entry = _put(pool, "b", "gpu02")
    pool.release(entry, window_s=60)
    assert pool.disconnect(names) == (["gpu01"] if names else ["gpu01", "gpu02"])
    assert first.closed
    assert second.closed is (names is None)


def test_a_duplicate_made_by_a_concurrent_command_closes_when_released() -> None:
    pool = keeper.Pool()
    held, _ = _put(pool)
    duplicate, entry = _put(pool)
    assert not entry.pooled
    pool.release(entry, window_s=60)
    assert duplicate.closed
    assert not held.closed


def test_a_libssh2_connection_in_use_is_not_handed_to_a_second_command() -> None:
    """libssh2 sessions are not thread-safe: a second command meanwhile gets a fresh connection
    of its own, which is closed when it is done; the held one is reused once it is free."""
    pool = keeper.Pool()
    session, entry = _put(pool, shared=False)
    assert pool.take("k", _trusted) == (None, False)  # in use: no, and not dropped either
    duplicate, extra = _put(pool, shared=False)
    assert not extra.pooled
    pool.release(extra, window_s=60)
    assert duplicate.closed
    assert not session.closed
    pool.release(entry, window_s=60)
    again, _ = pool.take("k", _trusted)
    assert again is entry


def test_a_paramiko_connection_in_use_is_shared() -> None:
    pool = keeper.Pool()
    _, entry = _put(pool)
    again, _ = pool.take("k", _trusted)
    assert again is entry
    assert entry.users == 2
