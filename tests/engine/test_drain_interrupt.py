"""fleet.engine.runner._drain on Ctrl-C: the "cancelling" line is said above a live table, and a
second Ctrl-C, whenever it comes, aborts at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from fleet.engine import runner
from fleet.output import pipes


class FakeRun:
    """A run whose first drain is cut by Ctrl-C; the cancel drain then ends at once."""

    def __init__(self) -> None:
        self.cancel = threading.Event()
        self.drains = 0

    def drain(self, threads: Any, **kw: Any) -> Iterator[Any]:
        self.drains += 1
        if self.drains == 1:
            raise KeyboardInterrupt
        yield from ()


class LiveLike:
    """A reporter that draws on the terminal: lines said meanwhile must go through aside()."""

    def __init__(self) -> None:
        self.inside = False
        self.closed = False

    @contextmanager
    def aside(self) -> Iterator[None]:
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    def handle(self, event: Any) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_the_cancelling_line_is_said_aside_of_a_live_table() -> None:
    live = LiveLike()
    said: list[bool] = []

    interrupted = runner._drain(
        FakeRun(), [], lambda e: None, [pipes.Guarded(live)], lambda: said.append(live.inside)
    )

    assert interrupted
    assert said == [True]


def test_a_second_ctrl_c_while_cancelling_is_said_aborts_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It escaped the abort: the run's thread ended in `fleet: aborted`, the handlers closed by
    whoever caught it, not here at once with 130."""
    live = LiveLike()
    exits: list[int] = []

    def exit_now(code: int) -> None:
        exits.append(code)
        raise SystemExit(code)

    def second_ctrl_c() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner.os, "_exit", exit_now)
    with pytest.raises((SystemExit, KeyboardInterrupt)):  # it escaped as KeyboardInterrupt
        runner._drain(FakeRun(), [], lambda e: None, [pipes.Guarded(live)], second_ctrl_c)

    assert exits == [130]
    assert live.closed
