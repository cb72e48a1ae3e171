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
from typing import Any

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


def test_a_part_is_readable_by_nobody_else_while_it_arrives(tmp_path: Path) -> None:
    """A 0600 file pushed must not sit 0644 on the node until its commit (or for good, when
    the push is cut short and the part is kept for resuming)."""
    status, said = sh(b"umask 022; " + node.write_command(os.fsencode(tmp_path), b"f", 0, 99), DATA)
    assert status == node.INCOMPLETE, said  # cut short: the part is kept
    assert oct(part(tmp_path).stat().st_mode & 0o777) == "0o600"


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
    """No such process, or only its zombie (a container's init may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _wait_for(check: Any, what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def dd_log(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A `dd` stand-in first on PATH that logs its caller's pid, its arguments and its exit
    status, around the real dd: (env, log)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    log = tmp_path / "dd.log"
    log.touch()
    real = shutil.which("dd")
    assert real
    (tools / "dd").write_text(
        f'#!/bin/sh\n{real} "$@"; rc=$?\necho "$PPID rc=$rc $*" >> {log}\nexit $rc\n'
    )
    (tools / "dd").chmod(0o755)
    return {"PATH": f"{tools}:{os.environ['PATH']}"}, log


def _syncs(log: Path) -> list[list[str]]:
    """The logged dd calls that were the flush loop's (count=0), as [pid, rc=N, args...]."""
    return [line.split() for line in log.read_text().splitlines() if "count=0" in line]


def _start_write(where: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    command = node.write_command(os.fsencode(where), b"f", 0, len(DATA))
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command], stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdin is not None
    proc.stdin.write(DATA[:1000])
    proc.stdin.flush()
    return proc


def test_the_part_is_synced_while_it_arrives_by_a_loop_that_holds_no_stream_and_ends(
    tmp_path: Path, dd_log: tuple[dict[str, str], Path]
) -> None:
    env, log = dd_log
    proc = _start_write(tmp_path / "dest", env)
    _wait_for(lambda: any(c[1] == "rc=0" for c in _syncs(log)), "a sync while the part arrived")
    call = next(c for c in _syncs(log) if c[1] == "rc=0")
    loop = int(call[0])
    assert f"of=./{part(tmp_path).name}" in call
    assert "oflag=append,nofollow,nonblock" in call
    if not _gone(loop):  # its streams: none of the command's (the channel would wait for it)
        fds = {os.readlink(f"/proc/{loop}/fd/{n}") for n in (0, 1, 2)}
        assert fds == {"/dev/null"}
    assert proc.stdin is not None
    proc.stdin.write(DATA[1000:])
    _, said = proc.communicate(timeout=20)
    assert proc.returncode == 0, said
    assert reported(said)[0] == WANT
    _wait_for(lambda: _gone(loop), "the loop to end with the command")


def test_the_sync_loop_never_follows_a_part_swapped_for_a_symlink(
    tmp_path: Path, dd_log: tuple[dict[str, str], Path]
) -> None:
    env, log = dd_log
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"not yours")
    proc = _start_write(tmp_path / "dest", env)
    _wait_for(lambda: part(tmp_path / "dest").exists(), "the part file")
    part(tmp_path / "dest").unlink()
    part(tmp_path / "dest").symlink_to(elsewhere)
    seen = len(_syncs(log))
    _wait_for(lambda: len(_syncs(log)) > seen + 1, "the loop's passes after the swap")
    assert all(c[1] != "rc=0" for c in _syncs(log)[seen + 1 :])  # ELOOP: never opened
    assert proc.stdin is not None
    proc.stdin.write(DATA[1000:])
    _, said = proc.communicate(timeout=20)
    assert proc.returncode != 0, said  # the part it wrote is not the file there now
    assert elsewhere.read_bytes() == b"not yours"


def test_setuid_and_setgid_are_never_given_to_a_committed_file(tmp_path: Path) -> None:
    _, stamp = reported(write(tmp_path, DATA)[1])
    assert sh(node.commit_command(os.fsencode(tmp_path), b"f", stamp, 0o6755))[0] == 0
    assert oct((tmp_path / "f").stat().st_mode & 0o7777) == "0o755"


def test_a_final_name_that_is_a_directory_fails_the_commit_and_removes_the_part(
    tmp_path: Path,
) -> None:
    _, stamp = reported(write(tmp_path, DATA)[1])
    (tmp_path / "f").mkdir()
    assert node.parse_probe(probe(tmp_path)).is_dir  # what a push looks at before sending
    status, said = sh(node.commit_command(os.fsencode(tmp_path), b"f", stamp, 0o644))
    assert status == node.REFUSED
    assert b"f is a directory on the node" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # no part, no commit dir


def probe(where: Path) -> bytes:
    done = subprocess.run(
        ["/bin/sh", "-c", node.probe_command(os.fsencode(where), b"f", len(DATA))],
        capture_output=True,
        check=True,
    )
    return done.stdout.strip()


def test_a_part_swapped_for_a_symlink_after_its_stamp_check_is_never_chmod_ed(
    tmp_path: Path,
) -> None:
    """The window a node user with write access to REMOTE's directory has: after the commit
    checked the part, before it is given its mode. A `stat` first on PATH does the swap right
    after the check's own stat: the part becomes a symlink to a file of root's."""
    _, stamp = reported(write(tmp_path, DATA)[1])
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    victim.chmod(0o600)
    tools = tmp_path / "bin"
    tools.mkdir()
    real = shutil.which("stat")
    assert real
    done = tools / "swapped"
    swap = f"rm -f {part(tmp_path)}; ln -s {victim} {part(tmp_path)}; touch {done}"
    (tools / "stat").write_text(
        f'#!/bin/sh\n{real} "$@"; rc=$?\n'
        f'case "$*" in *%.9Z*) [ -e {done} ] || {{ {swap}; }};; esac\n'
        "exit $rc\n"
    )
    (tools / "stat").chmod(0o755)
    command = node.commit_command(os.fsencode(tmp_path), b"f", stamp, 0o666)
    status, said = sh(command, env={"PATH": f"{tools}:{os.environ['PATH']}"})
    assert done.exists()  # the swap happened inside the window
    assert oct(victim.stat().st_mode & 0o777) == "0o600", said
    assert status == node.CHANGED, said
    assert not (tmp_path / "f").exists()
    assert not list(tmp_path.glob(".fleet-part-commit-*"))


SMALL = os.urandom(1500)


def _running_with(text: bytes) -> list[int]:
    """The live processes whose command line holds `text` (zombies left out)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            alive = not _gone(int(entry))
        except OSError:
            continue
        if text in cmdline and alive:
            found.append(int(entry))
    return found


def _write_small(where: Path, env: dict[str, str] | None = None) -> tuple[int, bytes]:
    return sh(node.write_command(os.fsencode(where), b"f", 0, len(SMALL)), SMALL, env)


def test_a_small_file_is_hashed_by_sha256sum_and_synced_once_without_the_loop(
    tmp_path: Path, dd_log: tuple[dict[str, str], Path]
) -> None:
    """Below SMALL_FILE_BYTES a file's time is its node processes: no openssl (a stand-in that
    lies is never asked) and no background sync loop, only the one fsync before the report."""
    env, log = dd_log
    liar = Path(env["PATH"].split(":")[0]) / "openssl"
    liar.write_text("#!/bin/sh\ncat >/dev/null; echo " + "0" * 64 + " -\n")
    liar.chmod(0o755)
    status, said = _write_small(tmp_path / "dest", env)
    assert status == 0, said
    digest, stamp = reported(said)
    assert digest == hashlib.sha256(SMALL).hexdigest()
    # A loop outlives the command by FLUSH_S at least (it sleeps first), as a copy of the
    # command's shell: had one started, it would be running now.
    assert _running_with(os.fsencode(tmp_path / "dest")) == []
    syncs = _syncs(log)
    assert [call[1] for call in syncs] == ["rc=0"], syncs  # the command's own fsync only
    assert commit(tmp_path / "dest", stamp) == 0
    assert (tmp_path / "dest" / "f").read_bytes() == SMALL


def test_a_leftover_part_that_is_a_symlink_is_removed_never_followed(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"not yours")
    part(dest).symlink_to(elsewhere)
    status, said = _write_small(dest)
    assert status == 0, said
    assert elsewhere.read_bytes() == b"not yours"
    assert not part(dest).is_symlink()
    assert part(dest).read_bytes() == SMALL


def test_a_small_write_makes_missing_directories_and_keeps_existing_ones(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b"
    assert _write_small(deep)[0] == 0
    assert part(deep).read_bytes() == SMALL
    (deep / "keep").write_bytes(b"x")
    assert _write_small(deep)[0] == 0  # an existing directory: entered as it is
    assert (deep / "keep").read_bytes() == b"x"


def test_a_file_gone_since_the_listing_is_not_found_not_refused(tmp_path: Path) -> None:
    """A file deleted on the node mid-pull (a rotated log, a shard the janitor took) was
    reported `refused: a symlink, not a regular file, or outside the tree`."""
    tree = os.fsencode(tmp_path)
    status, said = sh(node.read_command(tree, b"", b"gone", 0))
    assert (status, node.NODE_EXITS[status]) == (node.NOT_FOUND, "not found on the node"), said
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")  # a dangling link is still refused
    assert sh(node.read_command(tree, b"", b"link", 0))[0] == node.REFUSED
    assert sh(node.hash_command(tree, b"", b"gone"))[0] == node.NOT_FOUND
