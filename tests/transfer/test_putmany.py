"""fleet.transfer.putmany's node program run by a local sh and /usr/bin/python3 against tmp
directories, as a node runs it: each file skipped, or written under its part name, verified and
committed; a failure of one file never stops the others; nothing left behind."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.transfer import files, local, node, putmany

PYTHON_PATH = "/usr/bin:/bin"


def frame(
    directory: bytes, base: bytes, data: bytes, mode: int = 0o644, digest: bytes = b""
) -> bytes:
    digest = digest or hashlib.sha256(data).digest()
    return putmany.frame(directory, base, len(data), mode, digest) + data


def run(
    where: Path, *frames: bytes, end: bytes = putmany.END, path: str = PYTHON_PATH
) -> tuple[int, dict[int, putmany.Outcome]]:
    done = subprocess.run(
        ["/bin/sh", "-c", putmany.command()],
        input=b"".join(frames) + end,
        cwd=where,
        env={"PATH": path},
        capture_output=True,
        check=False,
    )
    return done.returncode, putmany.parse(done.stdout)


def leftovers(where: Path) -> list[Path]:
    return [p for p in where.rglob("*") if p.name.startswith(node.PART_PREFIX)]


def test_files_land_in_new_nested_directories_verified_with_nothing_left(tmp_path: Path) -> None:
    data = os.urandom(70_000)
    status, said = run(tmp_path, frame(b"a/b/c", b"f", data), frame(b"a", b"g", b"x"))
    assert status == 0
    assert said[0] == putmany.Outcome(0, "copied", hashlib.sha256(data).hexdigest())
    assert said[1].outcome == "copied"
    assert (tmp_path / "a/b/c/f").read_bytes() == data
    assert (tmp_path / "a/g").read_bytes() == b"x"
    assert leftovers(tmp_path) == []


def test_an_absolute_destination_and_a_symlinked_one_are_entered(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")  # the operator's own path: followed
    status, said = run(tmp_path, frame(os.fsencode(tmp_path / "link"), b"f", b"data"))
    assert (status, said[0].outcome) == (0, "copied")
    assert (tmp_path / "real" / "f").read_bytes() == b"data"


def test_the_same_file_again_is_skipped_not_rewritten(tmp_path: Path) -> None:
    data = os.urandom(5000)
    run(tmp_path, frame(b"d", b"f", data))
    before = (tmp_path / "d/f").stat().st_ino
    status, said = run(tmp_path, frame(b"d", b"f", data))
    assert status == 0
    assert said[0] == putmany.Outcome(0, "skipped", hashlib.sha256(data).hexdigest())
    assert (tmp_path / "d/f").stat().st_ino == before
    # same size, other bytes: written
    other = os.urandom(5000)
    status, said = run(tmp_path, frame(b"d", b"f", other))
    assert status == 0
    assert said[0].outcome == "copied"
    assert (tmp_path / "d/f").read_bytes() == other


def test_a_final_symlink_of_the_same_bytes_is_replaced_not_skipped(tmp_path: Path) -> None:
    (tmp_path / "outside").write_bytes(b"same")
    (tmp_path / "d").mkdir()
    (tmp_path / "d/f").symlink_to(tmp_path / "outside")
    status, said = run(tmp_path, frame(b"d", b"f", b"same"))
    assert status == 0
    assert said[0].outcome == "copied"
    assert not (tmp_path / "d/f").is_symlink()
    assert (tmp_path / "outside").read_bytes() == b"same"


def test_a_final_name_that_is_a_directory_is_refused_and_nothing_moves(tmp_path: Path) -> None:
    (tmp_path / "d/f/inside").mkdir(parents=True)
    before = (tmp_path / "d").stat().st_mtime_ns
    status, said = run(tmp_path, frame(b"d", b"f", b"data"))
    assert status == 0
    assert said[0].outcome == "isdir"
    assert os.listdir(tmp_path / "d") == ["f"]
    assert os.listdir(tmp_path / "d/f") == ["inside"]
    assert (tmp_path / "d").stat().st_mtime_ns == before  # no part was ever written there


def test_a_leftover_part_that_is_a_symlink_is_unlinked_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    (tmp_path / "d").mkdir()
    part = tmp_path / "d" / os.fsdecode(node.part_name(b"f"))
    part.symlink_to(outside)
    status, said = run(tmp_path, frame(b"d", b"f", b"new bytes"))
    assert status == 0
    assert said[0].outcome == "copied", said
    assert outside.read_bytes() == b"precious"
    assert (tmp_path / "d/f").read_bytes() == b"new bytes"
    assert not part.is_symlink()
    assert leftovers(tmp_path) == []


def test_a_wrong_digest_fails_and_leaves_no_part(tmp_path: Path) -> None:
    status, said = run(tmp_path, frame(b"d", b"f", b"data", digest=b"\0" * 32))
    assert status == 0
    assert said[0].outcome == "failed"
    assert "sha256 mismatch on the node" in said[0].text
    assert os.listdir(tmp_path / "d") == []


def test_setuid_and_setgid_are_never_given_and_the_mode_is_set(tmp_path: Path) -> None:
    run(
        tmp_path,
        frame(b"d", b"tool", b"#!/bin/sh\n", mode=0o6755),
        frame(b"d", b"key", b"k", 0o600),
    )
    assert stat.S_IMODE((tmp_path / "d/tool").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "d/key").stat().st_mode) == 0o600


def test_names_with_newlines_and_bytes_that_are_not_utf8_and_empty_files(tmp_path: Path) -> None:
    directory, base = b"new\nline/\xff\xfe dir", b"x\ny\x80 'q\"$(z)"
    status, said = run(tmp_path, frame(directory, base, b""), frame(directory, b"-n", b"1"))
    assert status == 0
    assert [said[0].outcome, said[1].outcome] == ["copied", "copied"]
    landed = Path(os.fsdecode(os.fsencode(tmp_path) + b"/" + directory + b"/" + base))
    assert landed.read_bytes() == b""
    assert landed.with_name("-n").read_bytes() == b"1"
    assert leftovers(tmp_path) == []


def test_one_failure_in_a_batch_does_not_stop_the_others(tmp_path: Path) -> None:
    (tmp_path / "d/dir").mkdir(parents=True)
    frames = [frame(b"d", b"f%d" % i, os.urandom(i * 100)) for i in range(5)]
    frames[1] = frame(b"d", b"f1", b"data", digest=b"\1" * 32)
    frames[3] = frame(b"d", b"dir", b"data")
    status, said = run(tmp_path, *frames)
    assert status == 0
    assert [said[i].outcome for i in range(5)] == ["copied", "failed", "copied", "isdir", "copied"]
    assert sorted(os.listdir(tmp_path / "d")) == ["dir", "f0", "f2", "f4"]


def test_an_unsafe_name_from_a_confused_bastion_is_refused(tmp_path: Path) -> None:
    status, said = run(tmp_path, frame(b"d", b"..", b"x"), frame(b"d", b"a/b", b"x"))
    assert status == 0
    assert [said[0].outcome, said[1].outcome] == ["failed", "failed"]
    assert not (tmp_path / "d").exists() or os.listdir(tmp_path / "d") == []


def test_a_cut_stream_reports_the_files_before_it_and_fails(tmp_path: Path) -> None:
    whole = frame(b"d", b"f", b"data")
    status, said = run(tmp_path, whole, frame(b"d", b"g", b"more")[:-2], end=b"")
    assert status == putmany.BAD_STREAM
    assert list(said) == [0]
    assert (tmp_path / "d/f").read_bytes() == b"data"
    assert not (tmp_path / "d/g").exists()


def test_without_python3_on_path_it_drains_stdin_and_says_so(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "cat").symlink_to("/bin/cat")
    big = frame(b"d", b"f", os.urandom(900_000)) * 4  # more than a pipe holds: drained
    status, said = run(tmp_path, big, path=str(tools))
    assert (status, said) == (putmany.NO_PYTHON, {})
    assert not (tmp_path / "d").exists()


def test_a_python3_that_cannot_run_the_program_counts_as_none(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "cat").symlink_to("/bin/cat")
    (tools / "python3").write_text('#!/bin/sh\necho "Unknown option: -I" >&2\nexit 2\n')
    (tools / "python3").chmod(0o755)
    big = frame(b"d", b"f", os.urandom(900_000)) * 4  # unread by it: drained after it
    status, said = run(tmp_path, big, path=str(tools))
    assert (status, said) == (putmany.NO_PYTHON, {})
    assert not (tmp_path / "d").exists()


def test_a_program_cut_short_drains_stdin_and_keeps_its_status(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    drained = tmp_path / "drained"
    (tools / "cat").write_text(f"#!/bin/sh\n/bin/cat > {drained}\n")
    (tools / "python3").write_text("#!/bin/sh\n/usr/bin/head -c 10 >/dev/null\nexit 1\n")
    for tool in ("cat", "python3"):
        (tools / tool).chmod(0o755)
    stream = frame(b"d", b"f", os.urandom(900_000)) * 4
    status, said = run(tmp_path, stream, path=str(tools))
    assert (status, said) == (1, {})
    assert drained.stat().st_size == len(stream) + len(putmany.END) - 10  # all the rest read


def small(path: Path, target: str = "/x/f") -> files._Small:
    def alone() -> files.FileResult:
        raise AssertionError("not here")

    return files._Small("f", target, lambda: local.open_regular(path), alone)


def test_the_bastion_frames_a_small_file_hashed_before_it_is_sent(tmp_path: Path) -> None:
    source = tmp_path / "f"
    source.write_bytes(b"bytes")
    source.chmod(0o4750)
    read = files._read_small(small(source), 1 << 20)
    assert isinstance(read, tuple)
    head, data, digest = read
    assert data == b"bytes"
    assert digest == hashlib.sha256(b"bytes").hexdigest()  # what the node's answer must carry
    fields = putmany.HEAD.unpack(head[: putmany.HEAD.size])
    assert fields == (putmany.MAGIC, 2, 1, 5, 0o4750, hashlib.sha256(b"bytes").digest())
    assert head[putmany.HEAD.size :] == b"/xf"


def test_a_file_that_grew_past_small_goes_alone_and_a_long_name_fails(tmp_path: Path) -> None:
    source = tmp_path / "f"
    source.write_bytes(b"x" * 100)
    assert files._read_small(small(source), 100) is None  # no longer small: not in a batch
    failed = files._read_small(small(source, "/x/" + "n" * 256), 1 << 20)
    assert isinstance(failed, files.FileResult)
    assert (failed.action, failed.error) == (files.Action.FAILED, "name too long")


class AnsweringExec:
    """files.Exec's part _push_batch uses: takes the batch, answers a fixed stdout."""

    stdout = b""
    status = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.stderr = bytearray()

    def __enter__(self) -> AnsweringExec:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def send(self, data: bytes) -> None:
        pass

    def end_input(self) -> None:
        pass

    def chunks(self) -> Iterator[bytes]:
        yield self.stdout

    def wait(self) -> int:
        return self.status

    def stderr_text(self) -> str:
        return ""


def hexsha(data: bytes) -> bytes:
    return hashlib.sha256(data).hexdigest().encode()


@pytest.mark.parametrize(
    ("stdout", "status"),
    [
        # a login shell's lines shaped like answers, and a program that never answered
        (b"0 copied\n1 skipped done\n", 1),
        # each digest answered for the other file
        (b"\n0 copied " + hexsha(b"one") + b"\n1 skipped " + hexsha(b"zero") + b"\n", 0),
    ],
)
def test_an_answer_without_the_sha256_sent_is_not_a_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stdout: bytes, status: int
) -> None:
    monkeypatch.setattr(AnsweringExec, "stdout", stdout + b"2 copied " + hexsha(b"two") + b"\n")
    monkeypatch.setattr(AnsweringExec, "status", status)
    monkeypatch.setattr(files, "Exec", AnsweringExec)
    items = []
    for n, data in enumerate((b"zero", b"one", b"two")):
        (tmp_path / f"f{n}").write_bytes(data)
        items.append(small(tmp_path / f"f{n}", f"/x/f{n}"))
    session: Any = object()
    results = files._push_batch(session, items, files.Options())
    assert results is not None
    assert [r.action for r in results] == [files.Action.FAILED] * 2 + [files.Action.COPIED]
    assert "sha256 mismatch on the node" in results[0].error
    assert results[2].sha256 == hexsha(b"two").decode()


def node_functions() -> dict[str, Any]:
    """The node program's functions, loaded here without running main()."""
    namespace: dict[str, Any] = {"__name__": "fleet_test"}
    body, _, _ = putmany.SCRIPT.rpartition("main()")
    exec(compile(body, "putmany-node", "exec"), namespace)
    return namespace


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to write as another user")
def test_no_one_else_can_write_the_part_before_it_is_checked_in_the_commit_directory() -> None:
    """A group-writable file pushed where the group shares REMOTE: the part gets its mode only
    once it is checked to be the file written, in the commit's own directory. Given it before,
    a member could rewrite it after it was hashed, and the rewrite landed as verified."""
    ns = node_functions()
    own_directory = ns["own_directory"]
    tried: list[int] = []
    with tempfile.TemporaryDirectory(dir="/tmp") as name:
        where = Path(name)
        where.chmod(0o777)

        def another_user_writes_the_part_first(dfd: int) -> Any:
            done = subprocess.run(
                ["/bin/sh", "-c", 'printf EVIL 1<>"$0"', os.fsdecode(node.part_name(b"f"))],
                cwd=where, user=65534, group=65534, extra_groups=[], capture_output=True,
                check=False,
            )  # fmt: skip
            tried.append(done.returncode)
            return own_directory(dfd)

        ns["own_directory"] = another_user_writes_the_part_first
        data = b"data"
        said = ns["put"](os.fsencode(where), b"f", 0o666, hashlib.sha256(data).digest(), data, {})
        assert said == ("copied", hashlib.sha256(data).hexdigest())
        assert (where / "f").read_bytes() == data
        assert len(tried) == 1
        assert tried[0] != 0  # refused: the part was still 0600
        assert stat.S_IMODE((where / "f").stat().st_mode) == 0o666
        assert leftovers(where) == []
