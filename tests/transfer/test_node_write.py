"""fleet.transfer.node's write command run by a local sh: the bytes, then the bastion's sha256
as one line; renamed only on a match; a short part kept to resume; the hasher falls back to
sha256sum where openssl is missing."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fleet.transfer import node

DATA = os.urandom(3 * 1024 * 1024 + 17)
GOOD = hashlib.sha256(DATA).hexdigest().encode() + b"\n"


def write(tmp_path: Path, stdin: bytes, offset: int = 0, env: dict[str, str] | None = None) -> int:
    command = node.write_command(os.fsencode(tmp_path), b"f", offset, len(DATA), 0o640)
    done = subprocess.run(["/bin/sh", "-c", command], input=stdin, env=env, check=False)
    return done.returncode


def part(tmp_path: Path) -> Path:
    return tmp_path / os.fsdecode(node.part_name(b"f"))


def test_the_bytes_then_their_sha256_land_renamed(tmp_path: Path) -> None:
    assert write(tmp_path, DATA + GOOD) == 0
    assert (tmp_path / "f").read_bytes() == DATA
    assert oct((tmp_path / "f").stat().st_mode & 0o777) == "0o640"
    assert not part(tmp_path).exists()


def test_another_sha256_removes_the_part_and_leaves_no_file(tmp_path: Path) -> None:
    assert write(tmp_path, DATA + b"changed\n") == node.MISMATCH
    assert not (tmp_path / "f").exists()
    assert not part(tmp_path).exists()


def test_a_short_stream_keeps_its_part_and_a_second_run_finishes_it(tmp_path: Path) -> None:
    assert write(tmp_path, DATA[:1000]) == node.INCOMPLETE
    assert not (tmp_path / "f").exists()
    assert part(tmp_path).read_bytes() == DATA[:1000]
    assert write(tmp_path, DATA[1000:] + GOOD, offset=1000) == 0
    assert (tmp_path / "f").read_bytes() == DATA


def test_without_openssl_the_node_hashes_with_sha256sum(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("dd", "tee", "sha256sum", "stat", "sync", "mkdir", "rm", "chmod", "mv"):
        found = shutil.which(tool)
        assert found, tool
        (tools / tool).symlink_to(found)
    dest = tmp_path / "dest"
    env = {"PATH": str(tools)}
    assert write(dest, DATA + GOOD, env=env) == 0
    assert (dest / "f").read_bytes() == DATA
    assert write(tmp_path / "other", DATA + b"0" * 64 + b"\n", env=env) == node.MISMATCH


@pytest.mark.parametrize("offset", [0, 5])
def test_the_reader_hashes_the_whole_file_with_openssl_where_it_is(
    tmp_path: Path, offset: int
) -> None:
    (tmp_path / "f").write_bytes(DATA)
    command = node.read_command(os.fsencode(tmp_path), b"", b"f", offset)
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == DATA[offset:]
    assert node.SHA_RE.search(done.stderr).group(1).decode() == hashlib.sha256(DATA).hexdigest()
