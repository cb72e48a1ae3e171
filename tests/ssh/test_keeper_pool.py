"""The keeper's pool of held connections, on stand-in sessions (no network): what is reused,
what is closed when, and that a connection in use is never closed by its window. Also the
keeper's threads for requests (reused, one per request in flight) and how a request names a
host of its command's hello."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from fleetrun import poll

from fleet.ssh import keeper
from fleet.ssh.failure import ConnectFailed


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


def test_two_commands_taking_a_free_libssh2_connection_at_once_leave_it_to_the_first() -> None:
    """Two commands look at the same free libssh2 connection at once (the host key check runs
    outside the pool's lock): the one that gets it runs on it; the other makes a fresh one of
    its own, and neither closes the connection the first is using nor calls it stale."""
    pool = keeper.Pool()
    session, entry = _put(pool, shared=False)
    pool.release(entry, window_s=60)
    got: list[tuple[Any, bool]] = []

    def trusted_while_another_takes_it(_session: Any) -> bool:
        got.append(pool.take("k", _trusted))  # the other command, meanwhile
        return True

    second = pool.take("k", trusted_while_another_takes_it)
    assert got == [(entry, False)]
    assert second == (None, False)
    assert not session.closed
    assert entry.users == 1
    again, _ = pool.take("k", _trusted)  # the first command's connection is still held
    assert again is None
    pool.release(entry, window_s=60)
    again, _ = pool.take("k", _trusted)
    assert again is entry


def test_a_paramiko_connection_in_use_is_shared() -> None:
    pool = keeper.Pool()
    _, entry = _put(pool)
    again, _ = pool.take("k", _trusted)
    assert again is entry
    assert entry.users == 2


# The keeper's threads for the requests that wait on the network. Waits below are guards
# against a hang (they fail the test only by never ending), not timings.
GUARD_S = 10.0


def _until(check: Callable[[], bool]) -> None:
    assert poll(check, timeout_s=GUARD_S, step_s=0.005), "never happened"


def test_a_request_after_another_runs_on_the_thread_the_first_left_idle() -> None:
    threads = keeper.Threads()
    ran: list[int] = []
    for _ in range(3):
        done = threading.Event()
        threads.submit(lambda done=done: (ran.append(threading.get_ident()), done.set()))
        assert done.wait(GUARD_S)
        _until(lambda: threads.idle == 1)
    assert len(ran) == 3
    assert len(set(ran)) == 1


def test_requests_in_flight_together_each_get_a_thread() -> None:
    threads = keeper.Threads()
    together = threading.Barrier(4, timeout=GUARD_S)  # breaks (fails) if any one waited on another
    ends: list[str] = []
    for _ in range(4):
        threads.submit(lambda: ends.append("broken" if together.wait() < 0 else "ok"))
    _until(lambda: threads.idle == 4)
    assert ends == ["ok"] * 4


def test_a_failing_request_leaves_its_thread_serving() -> None:
    threads = keeper.Threads()
    idents: list[int] = []

    def fail() -> None:
        idents.append(threading.get_ident())
        raise RuntimeError("a request's own bug")

    threads.submit(fail)
    _until(lambda: threads.idle == 1)
    done = threading.Event()
    threads.submit(lambda: (idents.append(threading.get_ident()), done.set()))
    assert done.wait(GUARD_S)
    assert len(idents) == 2
    assert idents[0] == idents[1]


def test_a_thread_idle_past_its_time_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeper.Threads, "IDLE_S", 0.05)
    threads = keeper.Threads()
    served: list[threading.Thread] = []
    threads.submit(lambda: served.append(threading.current_thread()))
    _until(lambda: bool(served))
    served[0].join(GUARD_S)
    assert not served[0].is_alive()
    assert threads.idle == 0


def test_a_thread_left_idle_keeps_nothing_of_the_requests_it_served() -> None:
    """A run's request carries the sudo password of -K: once answered, it is not kept alive
    by the thread that served it, idle for up to IDLE_S (the first request's arguments by the
    Thread object, the last one's by the loop waiting for the next)."""
    import gc
    import weakref

    class _Request:
        pass

    threads = keeper.Threads()
    for _ in range(2):  # the thread's first request, then one it takes while idle
        request = _Request()
        gone = weakref.ref(request)
        done = threading.Event()
        threads.submit(lambda request, done=done: done.set(), request)
        assert done.wait(GUARD_S)
        _until(lambda: threads.idle == 1)
        del request
        gc.collect()
        assert gone() is None


def test_a_request_names_a_host_of_the_hello_by_its_place() -> None:
    client = keeper.Client.__new__(keeper.Client)
    client.transport = object()  # type: ignore[assignment]
    client.hosts = [("gpu01 as resolved", "key1"), ("gpu02 as resolved", "key2")]
    assert client._resolve({"op": "connect", "h": 1}) == ("gpu02 as resolved", "key2")
    for bad in (2, -1, "0", 1.0, True):
        with pytest.raises(ConnectFailed, match=r"no host .* in the hello"):
            client._resolve({"op": "connect", "h": bad})


class _SlowTransport:
    """Connects only when let: a node slow to answer."""

    def __init__(self) -> None:
        self.let = threading.Event()
        self.connecting = threading.Event()
        self.made: list[_Session] = []
        self._gateways: dict[Any, Any] = {}

    def connect(self, host: Any, on_attempt: Any = None) -> _Session:
        self.connecting.set()
        assert self.let.wait(GUARD_S)
        session = _Session(shared=False)
        session.engine = "libssh2"  # type: ignore[attr-defined]
        self.made.append(session)
        return session


def test_a_connection_made_after_its_command_went_away_is_released_not_held_forever(
    tmp_path: Any,
) -> None:
    """A command interrupted (or killed) while one of its connections is still being made: the
    connection, made after the command has gone, is idle for the window and then closed, and
    the keeper can exit; it is never left in use by nobody, holding the keeper up for good."""
    import socket

    kept = keeper.Keeper(tmp_path / "k.sock")
    ours, theirs = socket.socketpair()
    client = keeper.Client(kept, ours)
    transport = _SlowTransport()
    client.transport = transport  # type: ignore[assignment]
    client.hosts = [(keeper.Host(name="gpu01", address="10.0.0.1"), "key1")]
    client.window_s = 60.0
    connecting = threading.Thread(target=client._connect, args=(1, {"op": "connect", "h": 0}))
    connecting.start()
    try:
        assert transport.connecting.wait(GUARD_S)
        theirs.close()  # the command is gone
        client.serve()  # reads EOF: the command's connections released, its runs cancelled
        transport.let.set()
        connecting.join(GUARD_S)
        assert not connecting.is_alive()
        (entry,) = kept.pool.entries.values()
        assert entry.users == 0
        entry.until = time.monotonic() - 1  # its window is over
        kept.pool.reap()
        assert transport.made[0].closed
        assert kept.pool.empty()
    finally:
        transport.let.set()
        kept.listener.close()


def test_a_connection_made_again_for_a_run_after_its_command_went_away_is_released(
    tmp_path: Any,
) -> None:
    """A warm connection found dead as a run starts is made again; should the command go away
    meanwhile, the new connection is released (idle for the window), not left in use."""
    import socket

    from fleet.ssh.transport import CLOSED_BEFORE

    class _Dead(_Session):
        def run(self, *args: Any) -> Any:
            raise ConnectFailed("connection lost", CLOSED_BEFORE)

    kept = keeper.Keeper(tmp_path / "k.sock")
    ours, theirs = socket.socketpair()
    client = keeper.Client(kept, ours)
    transport = _SlowTransport()
    client.transport = transport  # type: ignore[assignment]
    client.window_s = 60.0
    host = (keeper.Host(name="gpu01", address="10.0.0.1"), "key1")
    dead = kept.pool.put("key1", _Dead(shared=False), "gpu01")  # type: ignore[arg-type]
    client.held[7] = keeper.Held(dead, host, "warm")
    client.runs[8] = threading.Event()
    message = {"op": "run", "id": 8, "session": 7, "cmd": {"command": "true", "display": "true"}}
    running = threading.Thread(target=client._run, args=(8, message))
    running.start()
    try:
        assert transport.connecting.wait(GUARD_S)
        theirs.close()  # the command is gone
        client.serve()
        transport.let.set()
        running.join(GUARD_S)
        assert not running.is_alive()
        (entry,) = kept.pool.entries.values()
        assert entry.session is transport.made[0]
        assert entry.users == 0
    finally:
        transport.let.set()
        kept.listener.close()
