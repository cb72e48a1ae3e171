"""The in-step liveness check (fleet.ssh.transport.Liveness), with a stand-in transport.

The real thing runs against real sshd nodes in tests/e2e/test_faults.py (a node that vanishes
mid-step); here only the state machine: when a keepalive goes out, and when silence means dead.
Time is passed in explicitly; the stand-in transport answers (or not) on command.
"""

from __future__ import annotations

import threading
import time

from fleet.ssh.transport import DEAD_PEER_S, KEEPALIVE_S, Liveness


class StandInTransport:
    """Counts requests; answers them when `answer` is set, or never (a node that went silent)."""

    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.requests: list[str] = []
        self.active = True
        self.sent = threading.Event()

    def global_request(self, kind: str, wait: bool = True) -> None:
        self.requests.append(kind)
        self.sent.set()
        while not self.answers and self.active:
            time.sleep(0.01)

    def is_active(self) -> bool:
        return self.active


def _settle(t: StandInTransport, live: Liveness) -> None:
    assert t.sent.wait(5), "no keepalive went out"
    if t.answers:
        assert live.answered.wait(5), "the answer was not seen"


def test_no_keepalive_while_output_keeps_coming() -> None:
    t = StandInTransport(answers=True)
    live = Liveness(t)  # type: ignore[arg-type]
    start = live.heard
    for i in range(1, 100):
        now = start + i  # 99 s of a step that prints every second
        live.heard_from(now)
        assert live.alive(now)
    assert t.requests == []


def test_answered_keepalive_keeps_a_quiet_node_alive() -> None:
    t = StandInTransport(answers=True)
    live = Liveness(t)  # type: ignore[arg-type]
    start = live.heard
    assert live.alive(start + KEEPALIVE_S - 1)
    assert t.requests == []
    assert live.alive(start + KEEPALIVE_S)
    _settle(t, live)
    assert t.requests == ["keepalive@openssh.com"]
    # Long after: still alive, because the answer came.
    assert live.alive(start + KEEPALIVE_S + DEAD_PEER_S + 5)
    assert live.alive(start + KEEPALIVE_S + DEAD_PEER_S + 6)


def test_unanswered_keepalive_means_dead_after_dead_peer_s() -> None:
    t = StandInTransport(answers=False)
    live = Liveness(t)  # type: ignore[arg-type]
    start = live.heard
    assert live.alive(start + KEEPALIVE_S)
    _settle(t, live)
    assert live.alive(start + KEEPALIVE_S + DEAD_PEER_S)
    assert not live.alive(start + KEEPALIVE_S + DEAD_PEER_S + 0.5)
    assert t.requests == ["keepalive@openssh.com"]  # one request, not one per poll
    t.active = False  # the caller closes the connection; the asking thread ends


def test_answer_from_a_dying_transport_does_not_count() -> None:
    t = StandInTransport(answers=False)
    live = Liveness(t)  # type: ignore[arg-type]
    start = live.heard
    live.alive(start + KEEPALIVE_S)
    assert t.sent.wait(5)
    t.active = False  # global_request returns None when the transport dies
    for thread in threading.enumerate():  # wait for the asking thread to end, not a guessed time
        if thread.name == "fleet-keepalive":
            thread.join(5)
            assert not thread.is_alive()
    assert not live.answered.is_set()
    assert not live.alive(start + KEEPALIVE_S + DEAD_PEER_S + 1)
