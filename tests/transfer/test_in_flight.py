"""fleet.transfer.files.in_flight, the order a host's files are moved in: small files a few at
once, a large one alone, results in the files' order, nothing new started once cancelled.
(Pure scheduling: the jobs are functions that record what ran beside them.)"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from fleet.transfer import putmany
from fleet.transfer.files import (
    FILES_IN_FLIGHT,
    SMALL_FILE_BYTES,
    Action,
    FileResult,
    _batches,
    in_flight,
)

LARGE = SMALL_FILE_BYTES


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.beside: dict[str, set[str]] = {}  # name -> what else was running at its start
        self.most = 0
        self.started: list[str] = []

    def job(self, name: str, wait: Callable[[], object] = lambda: None) -> Callable[[], FileResult]:
        def move() -> FileResult:
            with self.lock:
                self.beside[name] = set(self.running)
                self.running.add(name)
                self.most = max(self.most, len(self.running))
                self.started.append(name)
            try:
                wait()
            finally:
                with self.lock:
                    self.running.discard(name)
            return FileResult(name, Action.COPIED)

        return move


def test_small_files_move_several_at_once_and_come_back_in_order() -> None:
    seen = Recorder()
    together = threading.Barrier(FILES_IN_FLIGHT, timeout=20)  # broken unless all run at once
    jobs = [(10, seen.job(f"s{i}", together.wait)) for i in range(FILES_IN_FLIGHT * 3)]
    results = [r.rel for r in in_flight(jobs, threading.Event())]
    assert results == [f"s{i}" for i in range(FILES_IN_FLIGHT * 3)]
    assert seen.most == FILES_IN_FLIGHT


def test_a_large_file_moves_alone_after_the_files_before_it() -> None:
    seen = Recorder()
    jobs = [(10, seen.job("a")), (10, seen.job("b")), (LARGE, seen.job("big"))]
    jobs += [(10, seen.job("c")), (LARGE + 1, seen.job("huge")), (10, seen.job("d"))]
    results = [r.rel for r in in_flight(jobs, threading.Event())]
    assert results == ["a", "b", "big", "c", "huge", "d"]
    assert seen.beside["big"] == set()
    assert seen.beside["huge"] == set()
    assert seen.started.index("c") > seen.started.index("big")
    assert seen.started.index("d") > seen.started.index("huge")


def test_once_cancelled_no_further_file_starts() -> None:
    seen = Recorder()
    cancel = threading.Event()
    jobs = [(10, seen.job(f"s{i}")) for i in range(50)]
    taken = []
    for result in in_flight(jobs, cancel):
        taken.append(result.rel)
        cancel.set()
    # at most the files already in flight when the first result came back finish
    assert len(seen.started) <= FILES_IN_FLIGHT + 1
    assert taken == seen.started[: len(taken)]


def test_an_error_in_a_file_reaches_the_caller() -> None:
    def broken() -> FileResult:
        raise ConnectionError("connection lost")

    jobs = [(10, Recorder().job("a")), (10, broken)]
    results = in_flight(jobs, threading.Event())
    assert next(results).rel == "a"
    with pytest.raises(ConnectionError, match="connection lost"):
        next(results)


def test_files_go_together_only_while_four_fit_the_hosts_window() -> None:
    """At 64 hosts a host's window is 512 KiB: files from 128 KiB on move alone, so the files
    in flight never hold more than one window's worth."""
    from fleet.transfer.files import Options

    opts = Options(window_bytes=512 * 1024)
    assert opts.together_below * FILES_IN_FLIGHT <= opts.window_bytes
    seen = Recorder()
    below, at = opts.together_below - 1, opts.together_below
    jobs = [(below, seen.job("a")), (below, seen.job("b")), (at, seen.job("c"))]
    jobs.append((below, seen.job("d")))
    assert [r.rel for r in in_flight(jobs, threading.Event(), opts.together_below)] == list("abcd")
    assert seen.beside["c"] == set()
    assert seen.started.index("d") > seen.started.index("c")


@pytest.mark.parametrize(
    ("sizes", "groups"),
    [
        ([1] * 130, [64, 64, 2]),
        ([1 << 20] * 9, [4, 4, 1]),  # 4 MiB of content at most
        ([10, 10, 2 << 20, 10], [2, 1, 1]),  # a large file alone, in its place
    ],
)
def test_small_files_are_cut_into_batches_in_order(sizes: list[int], groups: list[int]) -> None:
    files = [(f"f{i}", size) for i, size in enumerate(sizes)]
    cut = list(_batches(files, 2 << 20, putmany.MAX_FILES, putmany.MAX_BYTES))
    assert [len(g) for g in cut] == groups
    assert [f for g in cut for f in g] == files
