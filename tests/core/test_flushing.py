"""The Flusher: what the handlers hold is written within FLUSH_S of the first event held, whether
more events come (a flood) or none (a quiet run); the wait before the next event is cut to that.
The clock is a seam (a list of times), so no test sleeps."""

from __future__ import annotations

import threading

import pytest

from fleet.core.flushing import FLUSH_S, Flusher
from fleet.engine.executor import Run


class Held:
    def __init__(self) -> None:
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_nothing_held_means_no_flush_and_the_full_wait() -> None:
    held, clock = Held(), Clock()
    flusher = Flusher([held, object()], clock=clock)  # a handler without flush() is skipped
    clock.now += 10
    assert flusher.wait_s(0.1) == 0.1
    assert held.flushes == 0


def test_a_flood_of_events_is_written_every_flush_interval_not_only_at_the_end() -> None:
    held, clock = Held(), Clock()
    flusher = Flusher([held], clock=clock)
    for _ in range(100):  # 100 events 1 ms apart: 0.1 s, two intervals of 0.05 s
        flusher.handled()
        clock.now += 0.001
    assert held.flushes == 1  # at the 51st event, 0.05 s after the first one held
    flusher.handled()
    assert held.flushes == 1  # the next one is due 0.05 s after the 52nd event


def test_a_quiet_run_waits_only_until_the_held_lines_are_due_then_writes_them() -> None:
    held, clock = Held(), Clock()
    flusher = Flusher([held], clock=clock)
    flusher.handled()
    clock.now += 0.02
    assert flusher.wait_s(0.1) == pytest.approx(FLUSH_S - 0.02)
    assert held.flushes == 0
    clock.now += FLUSH_S  # the wait ended: due now, written before the next wait
    assert flusher.wait_s(0.1) == 0.1
    assert held.flushes == 1
    assert flusher.wait_s(0.1) == 0.1  # nothing held any more
    assert held.flushes == 1


def test_the_handlers_added_after_the_flusher_was_made_are_flushed_too() -> None:
    first, later = Held(), Held()
    handlers = [first]
    flusher = Flusher(handlers)
    handlers.append(later)  # as run_plan adds its reporters
    flusher.flush()
    assert (first.flushes, later.flushes) == (1, 1)


def test_the_engine_waits_for_an_event_no_longer_than_the_flusher_allows() -> None:
    """Run.drain asks wait_s only when no event is waiting, and waits that long at most."""
    run = Run(plan=None, transport=None)  # type: ignore[arg-type]  # drain uses neither
    asked: list[float] = []
    answered = threading.Event()

    def wait_s(poll_s: float) -> float:
        asked.append(poll_s)
        answered.set()
        return 0.001

    run.events.put(None)  # one worker, which ended at once
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    assert list(run.drain([thread], wait_s=wait_s)) == []
    assert asked == []  # an event was waiting: no wait was asked for
    run.ended = 0
    assert list(run.drain([thread], poll_s=5.0, wait_s=wait_s)) == []
    assert asked == [5.0]  # nothing waiting: asked once; the wait of 1 ms ended the drain
