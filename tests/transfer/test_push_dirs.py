"""A push makes LOCAL's empty directories on the node too: a run directory's empty `logs/`
or `checkpoints/` a training script expects, or an empty LOCAL itself. (Before, a push made
only the directories its files were in, and said `ok, no files` for an empty tree.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fleet.transfer import files, node


def run_here(session: Any, command: bytes, max_bytes: int = 65536) -> tuple[int, bytes, str]:
    """files.run_small on a local sh: the node is this machine."""
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, check=False)
    return done.returncode, done.stdout, done.stderr.decode(errors="replace").strip()


def push(monkeypatch: pytest.MonkeyPatch, local: Path, remote: Path) -> list[files.FileResult]:
    monkeypatch.setattr(files, "run_small", run_here)
    tree = files.walk_local(local)
    return list(files.push_tree(object(), tree, os.fspath(remote), files.Options()))


def test_the_walk_lists_the_directories_with_nothing_to_send(tmp_path: Path) -> None:
    local = tmp_path / "run"
    for d in ("logs", "ckpt/a/b", "src", "only-link"):
        (local / d).mkdir(parents=True)
    (local / "src" / "train.py").write_text("x\n")
    (local / "only-link" / "l").symlink_to("/etc")
    tree = files.walk_local(local)
    assert sorted(tree.dirs) == ["ckpt/a/b", "logs", "only-link"]
    assert files.walk_local(local / "logs").dirs == ("",)
    assert files.walk_local(local / "src" / "train.py").dirs == ()


def test_empty_directories_are_made_on_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "run"
    for d in ("logs", "ckpt/a/b", "-dash", "new\nline"):
        (local / d).mkdir(parents=True)
    remote = tmp_path / "node" / "run"
    assert push(monkeypatch, local, remote) == []
    for d in ("logs", "ckpt/a/b", "-dash", "new\nline"):
        assert (remote / d).is_dir(), d


def test_an_empty_local_is_made_and_a_file_in_the_way_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").mkdir()
    remote = tmp_path / "node" / "empty"
    assert push(monkeypatch, tmp_path / "empty", remote) == []
    assert remote.is_dir()
    (tmp_path / "two" / "a").mkdir(parents=True)
    (tmp_path / "two" / "b").mkdir()
    (tmp_path / "there").mkdir()
    (tmp_path / "there" / "a").write_text("a file\n")
    results = push(monkeypatch, tmp_path / "two", tmp_path / "there")
    assert [(r.rel, r.action) for r in results] == [("a", files.Action.FAILED)]
    assert "cannot make the directory on the node" in results[0].error
    assert (tmp_path / "there" / "b").is_dir()


def test_a_part_file_left_by_a_cut_short_pull_is_refused_not_pushed(tmp_path: Path) -> None:
    """LOCALDIR/HOST of a pull cut short holds `.fleet-part-<hash of model.bin>`: pushed on
    to other nodes as a file, it landed on the name model.bin's part is written under there."""
    local = tmp_path / "ckpt"
    local.mkdir()
    part = os.fsdecode(node.part_name(b"model.bin"))
    (local / part).write_bytes(b"half")
    (local / "model.bin").write_bytes(b"whole")
    tree = files.walk_local(local)
    assert tree.files == (("model.bin", 5),)
    assert [(r.rel, r.action) for r in tree.refused] == [(part, files.Action.REFUSED)]
    assert files.walk_local(local / part).files == (("", 4),)  # named itself: pushed
