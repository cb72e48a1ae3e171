"""fleet.transfer.local's part file: synced to disk while it is written (so the fsync at the end
has little left), its syncing thread gone once the file is committed or closed."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.transfer import local

CHUNK = os.urandom(1 << 20)


def flushers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fleet-flush" and t.is_alive()]


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The descriptors os.fdatasync was called on (a spy: the real call still runs)."""
    calls: list[int] = []
    real = os.fdatasync

    def spy(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(local.os, "fdatasync", spy)
    return calls


@pytest.fixture
def dir_fd(tmp_path: Path) -> Iterator[int]:
    """The pull's local directory (tmp_path), as PartFile takes it."""
    fd = local.open_base(tmp_path)
    yield fd
    os.close(fd)


def test_a_large_part_is_synced_as_it_is_written_and_committed_whole(
    tmp_path: Path, dir_fd: int, synced: list[int]
) -> None:
    part = local.PartFile(dir_fd, "f", fresh=True)
    for _ in range(2 * local.FLUSH_BYTES // len(CHUNK)):
        part.write(CHUNK)
    fd = part.fd
    deadline = time.monotonic() + 20
    while not synced and time.monotonic() < deadline:  # the thread's turn: not the writer's
        time.sleep(0.01)
    assert synced  # before the commit and its own fsync
    part.commit()
    assert set(synced) == {fd}
    assert not flushers()
    assert (tmp_path / "f").stat().st_size == 2 * local.FLUSH_BYTES


def test_a_small_part_starts_no_thread_and_a_closed_one_leaves_none(
    dir_fd: int, synced: list[int]
) -> None:
    small = local.PartFile(dir_fd, "small", fresh=True)
    small.write(CHUNK)
    assert not flushers()
    small.commit()
    assert synced == []
    big = local.PartFile(dir_fd, "big", fresh=True)
    for _ in range(local.FLUSH_BYTES // len(CHUNK)):
        big.write(CHUNK)
    big.close()  # an interrupted pull keeps its part
    assert not flushers()
