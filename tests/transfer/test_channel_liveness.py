"""A transfer's node command on fleet's own connection gives up on a node that stopped
answering (frozen, cut off without a reset), as a step does: before, a pull or push over the
paramiko path (a batch of small files, or a host without the `ssh` route) waited forever on
it. A node that is only slow still answers sshd's keepalive and is waited for."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from fleet.ssh import transport
from fleet.ssh.failure import ConnectFailed
from fleet.transfer.channel import Exec


class StandInTransport:
    """Answers keepalives, or never (a node that froze)."""

    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.active = True
        NODES.append(self)

    def global_request(self, kind: str, wait: bool = True) -> None:
        while not self.answers and self.active:
            time.sleep(0.01)

    def is_active(self) -> bool:
        return self.active


class QuietChannel:
    """A channel whose node sends nothing for `quiet_s`, then `data` and EOF (never: None)."""

    def __init__(self, quiet_s: float | None, data: bytes = b"") -> None:
        self.until = None if quiet_s is None else time.monotonic() + quiet_s
        self.data = [data, b""]

    def recv(self, size: int) -> bytes:
        if self.until is None or time.monotonic() < self.until:
            time.sleep(0.01)
            raise TimeoutError
        return self.data.pop(0)

    def send(self, data: memoryview) -> int:
        time.sleep(0.01)
        raise TimeoutError

    def recv_stderr_ready(self) -> bool:
        return False


def stand_in(channel: QuietChannel, node: StandInTransport) -> Exec:
    ex = Exec.__new__(Exec)
    ex.channel = channel
    ex.cancel = threading.Event()
    ex.stderr = bytearray()
    ex.liveness = transport.Liveness(node)  # type: ignore[arg-type]
    return ex


NODES: list[StandInTransport] = []


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(transport, "KEEPALIVE_S", 0.2)
    monkeypatch.setattr(transport, "DEAD_PEER_S", 0.5)
    yield
    for node in NODES:  # their asking threads end (no thread left for other tests to meet)
        node.active = False
    NODES.clear()


def raised_within(call: Callable[[], object], seconds: float) -> BaseException | None:
    """What call() raised, on a thread of its own; fails when it is still running after
    `seconds` (it waits forever: the thread is left, a daemon)."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)
        else:
            raised.append(None)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert raised, f"still waiting on a silent node after {seconds}s"
    return raised[0]


def test_a_node_that_stopped_answering_is_connection_lost_not_waited_on_forever() -> None:
    ex = stand_in(QuietChannel(None), StandInTransport(answers=False))
    raised = raised_within(lambda: list(ex.chunks()), 10)
    assert isinstance(raised, ConnectFailed)
    assert raised.reason == "connection lost"
    assert "keepalive" in raised.detail


def test_a_node_that_stopped_reading_what_is_sent_is_connection_lost() -> None:
    ex = stand_in(QuietChannel(None), StandInTransport(answers=False))
    raised = raised_within(lambda: ex.send(b"x" * 10), 10)
    assert isinstance(raised, ConnectFailed)


def test_a_slow_node_that_answers_keepalives_is_waited_for() -> None:
    ex = stand_in(QuietChannel(2.0, b"late"), StandInTransport(answers=True))
    assert list(ex.chunks()) == [b"late"]
