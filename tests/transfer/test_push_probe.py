"""A push's probe says when REMOTE's directory cannot be made (a file in the way): a dry run
said `would copy` and exit 0 for a push that then failed every file."""

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


def probe(directory: Path | str) -> node.Probe:
    status, out, err = run_here(None, node.probe_command(os.fsencode(directory), b"f", 3))
    assert status == 0, err
    return node.parse_probe(out.strip())


def test_a_directory_that_mkdir_would_make_is_not_blocked(tmp_path: Path) -> None:
    assert not probe(tmp_path / "new" / "deeper").blocked
    assert not probe(tmp_path / "end\n" / "x\n").blocked
    assert not probe(tmp_path).blocked


def test_a_file_in_the_way_blocks_at_any_depth(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert probe(tmp_path / "file").blocked
    assert probe(tmp_path / "file" / "a" / "b").blocked
    assert probe(tmp_path / "dangling" / "a").blocked


def test_a_relative_directory_is_looked_up_from_the_login_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-file").write_text("x\n")
    assert probe("-file/a").blocked
    assert not probe("-new/a").blocked


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_push_under_a_file_fails_before_anything_is_sent_and_a_dry_run_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dry_run: bool
) -> None:
    monkeypatch.setattr(files, "run_small", run_here)
    (tmp_path / "f").write_text("mine\n")
    (tmp_path / "node-file").write_text("a file on the node\n")
    remote = os.fspath(tmp_path / "node-file" / "sub" / "f")
    result = files.push_file(object(), tmp_path / "f", remote, files.Options(dry_run=dry_run))
    assert result.action is files.Action.FAILED
    assert "a file is in the way" in result.error
