"""Keepers forked at the end of a run in the command (fleet/engine/keepafter.py): when it must
not fork, it closes the connections instead, and a fork that fails leaves nothing half-given.
What a forked keeper does is tested against real nodes (tests/e2e/test_warm.py)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from fleet.engine import keepafter, workers


class FakeTransport:
    """What keep_after_run asks of a HandoffTransport, recorded."""

    def __init__(self) -> None:
        self.held: dict[int, list[Any]] = {0: [("node01", object())], 1: [("node02", object())]}
        self.unhandable = False
        self.let_go_calls = 0
        self.given: set[int] | None = None

    def held_by_shard(self) -> dict[int, list[Any]]:
        return self.held

    def fds_of(self, held: list[Any]) -> set[int] | None:
        return None if self.unhandable else set()

    def let_go(self) -> None:
        self.let_go_calls += 1

    def give_away(self, shards: set[int]) -> None:
        self.given = shards


def _no_fork() -> int:
    raise AssertionError("forked")


@pytest.mark.parametrize(
    ("why", "whole", "handable", "single_threaded"),
    [
        ("a cancelled run", False, True, True),
        # a paramiko connection: no socket of its own to hand over
        ("a connection that cannot be handed over", True, False, True),
        ("another thread running", True, True, False),
    ],
)
def test_when_it_must_not_fork_it_closes_every_connection(
    monkeypatch: pytest.MonkeyPatch, why: str, whole: bool, handable: bool, single_threaded: bool
) -> None:
    monkeypatch.setattr(os, "fork", _no_fork)
    monkeypatch.setattr(workers, "fork_safe", lambda: single_threaded)
    transport = FakeTransport()
    transport.unhandable = not handable
    assert keepafter.keep_after_run(transport, whole=whole) == 0, why
    assert (transport.let_go_calls, transport.given) == (1, None), why


def test_a_fork_that_fails_gives_nothing_away_and_leaks_no_descriptor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fails() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", fails)
    monkeypatch.setattr(workers, "fork_safe", lambda: True)
    before = workers.open_fds()
    transport = FakeTransport()
    assert keepafter.keep_after_run(transport, whole=True) == 0
    assert transport.given == set()  # every connection stays held: close() closes them
    assert transport.let_go_calls == 0
    assert workers.open_fds() == before
