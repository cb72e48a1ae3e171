"""push_target: where LOCAL lands on the node when REMOTE ends in `/`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleet.transfer.fanout import push_target


def test_remote_is_what_local_becomes_unless_it_ends_in_a_slash() -> None:
    assert push_target(Path("./adapter"), "/mnt/run1/adapter") == "/mnt/run1/adapter"
    assert push_target(Path("./adapter"), "/mnt/run1/") == "/mnt/run1/adapter"
    assert push_target(Path("ds.json"), "run1/") == "run1/ds.json"


def test_local_dot_is_pushed_into_remote_itself() -> None:
    assert push_target(Path("."), "/mnt/run1/") == "/mnt/run1/"


@pytest.mark.parametrize("local", ["..", "sub/..", "../.."])
def test_a_local_ending_in_dotdot_lands_under_remote_by_its_real_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local: str
) -> None:
    """`fleet push .. /data/run/` put the parent's files in /data/ (REMOTE/..), beside the
    directory the operator named, overwriting what was there."""
    (tmp_path / "outer" / "inner" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "outer" / "inner")
    name = Path(os.path.abspath(local)).name
    assert name not in ("", ".", "..")
    assert push_target(Path(local), "/data/run/") == f"/data/run/{name}"
