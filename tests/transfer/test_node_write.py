"""fleet.transfer.node's write, commit and discard commands run by a local sh: the part is
written, fsynced and reported (sha256 and stamp); renamed only by commit, and only while it is
the file that was hashed; a short part kept to resume; sha256sum where openssl is missing."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fleet.transfer import node

DATA = os.urandom(3 * 1024 * 1024 + 17)
WANT = hashlib.sha256(DATA).hexdigest()


def sh(command: bytes, stdin: bytes = b"", env: dict[str, str] | None = None) -> tuple[int, bytes]:
    done = subprocess.run(
        ["/bin/sh", "-c", command], input=stdin, env=env, capture_output=True, check=False
    )
    return done.returncode, done.stderr


def write(
    where: Path, stdin: bytes, offset: int = 0, env: dict[str, str] | None = None
) -> tuple[int, bytes]:
    return sh(node.write_command(os.fsencode(where), b"f", offset, len(DATA)), stdin, env)


def reported(stderr: bytes) -> tuple[str, bytes]:
    found, stamp = node.SHA_RE.search(stderr), node.STAMP_RE.search(stderr)
    assert found is not None, stderr
    assert stamp is not None, stderr
    return found.group(1).decode(), stamp.group(1)


def part(where: Path) -> Path:
    return where / os.fsdecode(node.part_name(b"f"))


def commit(where: Path, stamp: bytes) -> int:
    return sh(node.commit_command(os.fsencode(where), b"f", stamp, 0o640))[0]


def test_the_part_is_reported_then_committed_in_place(tmp_path: Path) -> None:
    status, said = write(tmp_path, DATA)
    assert status == 0, said
    digest, stamp = reported(said)
    assert digest == WANT
    assert not (tmp_path / "f").exists()  # nothing looks whole before the bastion agreed
    assert part(tmp_path).read_bytes() == DATA
    assert commit(tmp_path, stamp) == 0
    assert (tmp_path / "f").read_bytes() == DATA
    assert oct((tmp_path / "f").stat().st_mode & 0o777) == "0o640"
    assert not part(tmp_path).exists()


def test_a_part_changed_after_it_was_hashed_is_not_committed(tmp_path: Path) -> None:
    said = write(tmp_path, DATA)[1]
    _, stamp = reported(said)
    with part(tmp_path).open("r+b") as f:
        f.write(b"X")
    assert commit(tmp_path, stamp) == node.CHANGED
    assert not (tmp_path / "f").exists()
    assert sh(node.discard_command(os.fsencode(tmp_path), b"f"))[0] == 0
    assert not part(tmp_path).exists()


def test_a_short_stream_keeps_its_part_and_a_second_run_finishes_it(tmp_path: Path) -> None:
    assert write(tmp_path, DATA[:1000])[0] == node.INCOMPLETE
    assert not (tmp_path / "f").exists()
    assert part(tmp_path).read_bytes() == DATA[:1000]
    status, said = write(tmp_path, DATA[1000:], offset=1000)
    assert status == 0, said
    digest, stamp = reported(said)
    assert digest == WANT  # the whole part read back, not only the bytes of this run
    assert commit(tmp_path, stamp) == 0
    assert (tmp_path / "f").read_bytes() == DATA


def test_without_openssl_the_node_hashes_with_sha256sum(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("dd", "tee", "sha256sum", "stat", "sync", "mkdir", "rm"):
        found = shutil.which(tool)
        assert found, tool
        (tools / tool).symlink_to(found)
    status, said = write(tmp_path / "dest", DATA, env={"PATH": str(tools)})
    assert status == 0, said
    assert reported(said)[0] == WANT


@pytest.mark.parametrize("offset", [0, 5])
def test_the_reader_sends_from_offset_and_hashes_the_whole_file(
    tmp_path: Path, offset: int
) -> None:
    (tmp_path / "f").write_bytes(DATA)
    command = node.read_command(os.fsencode(tmp_path), b"", b"f", offset)
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == DATA[offset:]
    found = node.SHA_RE.search(done.stderr)
    assert found is not None
    assert found.group(1).decode() == WANT


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_part_is_synced_while_it_arrives_and_the_syncing_ends_with_the_command(
    tmp_path: Path,
) -> None:
    """A `sync` stand-in on PATH logs the pid of its caller (the flusher loop) and runs the
    real one: it is called before the stream ended, and the loop is gone once the command is."""
    tools = tmp_path / "bin"
    tools.mkdir()
    log = tmp_path / "sync.log"
    real = shutil.which("sync")
    assert real
    (tools / "sync").write_text(f'#!/bin/sh\necho "$PPID" >> {log}\nexec {real} "$@"\n')
    (tools / "sync").chmod(0o755)
    env = {"PATH": f"{tools}:{os.environ['PATH']}"}
    command = node.write_command(os.fsencode(tmp_path / "dest"), b"f", 0, len(DATA))
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command], stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdin is not None
    proc.stdin.write(DATA[:1000])
    proc.stdin.flush()
    deadline = time.monotonic() + 20
    while not (log.exists() and log.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.exists(), "no sync while the part was arriving"
    assert log.read_text().strip()
    flusher = int(log.read_text().split()[0])
    proc.stdin.write(DATA[1000:])
    _, said = proc.communicate(timeout=20)
    assert proc.returncode == 0, said
    assert reported(said)[0] == WANT
    deadline = time.monotonic() + 10
    while not _gone(flusher) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(flusher)
