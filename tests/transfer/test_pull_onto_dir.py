"""A pulled file whose local name is a directory fails before anything is fetched, as a push
onto a node directory does: before, the whole file came (a checkpoint shard: gigabytes), the
rename failed with `Is a directory`, and it stayed whole as a part file that every rerun
"resumed" to fail the same way."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.transfer import files, getmany


class NoSession:
    """A node connection that must not be used: nothing is fetched for such a file."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the node was asked ({name}) for a file that cannot land")


@pytest.fixture
def where(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "shard" / "inside").mkdir(parents=True)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)
    assert sorted(os.listdir(tmp_path)) == ["shard"]  # no part file left
    assert os.listdir(tmp_path / "shard") == ["inside"]


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_file_onto_a_local_directory_fails_before_it_is_fetched(
    where: int, dry_run: bool
) -> None:
    opts = files.Options(dry_run=dry_run)
    result = files.pull_file(NoSession(), b"/data/run", b"shard", 5 << 30, where, "shard", opts)
    assert result.action is files.Action.FAILED
    assert "directory" in result.error
    assert result.moved_bytes == 0


def test_a_batched_file_onto_a_local_directory_fails_and_leaves_no_part(where: int) -> None:
    answer = getmany.Answer(0, b"abc", hashlib.sha256(b"abc").hexdigest(), "")
    result = files._land(answer, 3, where, ("shard",), files.Options())
    assert result.action is files.Action.FAILED
    assert "directory" in result.error
