"""The bastion side of a push: LOCAL is listed once, and each file is then opened only through
what was listed (fleet.transfer.local.open_listed), never by its full path. A directory, a file
or LOCAL itself swapped after the listing (for a symlink to a place another user cannot read, a
FIFO, another directory) fails that one file; nothing it names is read, and nothing blocks."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleet.transfer import files, local

HANG_DEADLINE_S = 20  # an open that blocks on a FIFO never returns: the test ends it instead


class NoSession:
    """A node connection that must not be used: a refused file is never probed or sent."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the node was asked ({name}) for a file that was not read")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """LOCAL: d/f (mine), top (mine); and a `secret` directory elsewhere with a file `f`."""
    root = tmp_path / "local"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("mine\n")
    (root / "top").write_text("top\n")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "f").write_text("root only\n")
    return root


def read_all(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def returns(call: Callable[[], Any], fifo: Path) -> Any:
    """call() on a thread; when it has not returned by the deadline (blocked opening `fifo`),
    open the FIFO's other end to let it go and fail."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(HANG_DEADLINE_S)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(HANG_DEADLINE_S)
        pytest.fail("opening the swapped-in FIFO blocked")
    return outcome[0]


def test_the_walk_lists_files_in_order_with_sizes_and_refuses_links_and_fifos(
    tree: Path, tmp_path: Path
) -> None:
    (tree / "d" / "e").mkdir()
    (tree / "d" / "e" / "g").write_bytes(b"123")
    (tree / "link_dir").symlink_to(tmp_path / "secret")
    (tree / "d" / "link_file").symlink_to(tmp_path / "secret" / "f")
    os.mkfifo(tree / "pipe")
    listed = files.walk_local(tree)
    assert listed.files == (("top", 4), ("d/f", 5), ("d/e/g", 3))
    assert listed.total_bytes == 12
    refused = {r.rel: r.action for r in listed.refused}
    assert refused == dict.fromkeys(("link_dir", "pipe", "d/link_file"), files.Action.REFUSED)
    assert read_all(listed.open("d/e/g")) == b"123"


def test_a_local_the_operator_named_as_a_symlink_is_what_it_points_to(
    tree: Path, tmp_path: Path
) -> None:
    """`fleet push latest /ckpt/`, `latest` a link to the step's directory (or a file): the
    tree it points to is sent, as scp and cp -r send a named link's; it was refused, and the
    push said ok with nothing sent. Links inside the tree are still refused."""
    (tmp_path / "latest").symlink_to(tree)
    (tree / "inner").symlink_to(tmp_path / "secret")
    listed = files.walk_local(tmp_path / "latest")
    assert listed.files == (("top", 4), ("d/f", 5))
    assert [r.rel for r in listed.refused] == ["inner"]
    assert read_all(listed.open("d/f")) == b"mine\n"
    (tmp_path / "one").symlink_to(tree / "top")
    single = files.walk_local(tmp_path / "one")
    assert single.files == (("", 4),)
    assert single.refused == ()
    assert read_all(single.open("")) == b"top\n"


@pytest.mark.root
def test_a_named_symlink_of_another_users_is_not_followed(tree: Path, tmp_path: Path) -> None:
    """A link another user made in a shared dir (`/tmp/latest` -> /etc) would point a push at
    what only root may read: one not the operator's or root's is refused, at any hop."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a link to another uid")
    (tmp_path / "theirs").symlink_to(tree)
    os.lchown(tmp_path / "theirs", 4242, 4242)
    with pytest.raises(files.NotOurs, match="uid 4242's"):
        files.walk_local(tmp_path / "theirs")
    (tmp_path / "mine").symlink_to(tmp_path / "theirs")  # ours, leading to theirs
    with pytest.raises(files.NotOurs, match="uid 4242's"):
        files.walk_local(tmp_path / "mine")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(files.NotOurs, match="too many levels"):
        files.follow_named(tmp_path / "loop")


def test_a_directory_swapped_for_a_symlink_after_the_walk_is_not_read_through(
    tree: Path, tmp_path: Path
) -> None:
    listed = files.walk_local(tree)
    assert ("d/f", 5) in listed.files
    (tree / "d").rename(tree / "d.old")  # what a user who owns the tree can do mid-push
    (tree / "d").symlink_to(tmp_path / "secret")
    with pytest.raises(local.Changed, match="symlink"):
        listed.open("d/f")
    only = dataclasses.replace(listed, files=(("d/f", 5),))  # `top` would go to the node
    [result] = files.push_tree(NoSession(), only, "/x", files.Options())  # type: ignore[arg-type]
    assert result.action is files.Action.FAILED
    assert result.error == "local: a directory on its path is a symlink now: not read"
    assert read_all(listed.open("top")) == b"top\n"  # what was not swapped still reads


def test_local_itself_swapped_after_the_walk_is_not_read(tree: Path, tmp_path: Path) -> None:
    listed = files.walk_local(tree)
    tree.rename(tmp_path / "was-local")
    tree.symlink_to(tmp_path / "secret")
    with pytest.raises(local.Changed, match="symlink"):
        listed.open("d/f")
    tree.unlink()
    (tmp_path / "secret").rename(tree)  # another directory, same name: not the one listed
    with pytest.raises(local.Changed, match="LOCAL was replaced"):
        listed.open("f")


def test_a_file_swapped_for_a_fifo_fails_and_never_blocks(tree: Path) -> None:
    listed = files.walk_local(tree)
    (tree / "d" / "f").unlink()
    os.mkfifo(tree / "d" / "f")
    outcome = returns(lambda: listed.open("d/f"), tree / "d" / "f")
    assert isinstance(outcome, local.Changed)
    assert "not a regular file" in str(outcome)


def test_a_single_file_local_swapped_for_a_fifo_or_a_link_is_not_read(
    tree: Path, tmp_path: Path
) -> None:
    one = tree / "top"
    listed = files.walk_local(one)
    assert listed.files == (("", 4),)
    one.unlink()
    os.mkfifo(one)
    result = returns(lambda: next(files.push_tree(NoSession(), listed, "/x", files.Options())), one)  # type: ignore[arg-type]
    assert result.action is files.Action.FAILED
    assert "not a regular file" in result.error
    one.unlink()
    one.symlink_to(tmp_path / "secret" / "f")
    with pytest.raises(local.Changed):
        listed.open("")


def test_push_file_opens_only_a_regular_file_and_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = returns(
        lambda: files.push_file(NoSession(), fifo, "/x", files.Options()),  # type: ignore[arg-type]
        fifo,
    )
    assert result.action is files.Action.FAILED
    assert "not a regular file" in result.error


def test_a_fifo_as_local_is_refused_by_the_walk_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    listed = returns(lambda: files.walk_local(fifo), fifo)
    assert listed.files == ()
    [refused] = listed.refused
    assert refused.error == "not a regular file or directory"
