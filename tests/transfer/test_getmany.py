"""fleet.transfer.getmany's node program run by a local sh and /usr/bin/python3 against tmp
directories, as a node runs it: each file read as read_command reads it (no symlink followed,
no FIFO waited on, no directory that left the tree), sent framed with its sha256; a failure of
one file never stops the others. Then the bastion's side: a hostile answer fails the files it
touches and lands nothing partial."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from fleet.transfer import files, getmany, local, node

PYTHON_PATH = "/usr/bin:/bin"
TOKEN = b"t" * getmany.TOKEN_BYTES


def answers(out: bytes, sizes: list[int]) -> list[getmany.Answer]:
    return getmany.Reader(sizes, TOKEN).feed(out)


def run(
    tree: Path | bytes,
    wanted: list[tuple[bytes, bytes, int]],
    *,
    stdin: bytes | None = None,
    path: str = PYTHON_PATH,
    cwd: Path | None = None,
    user: int | None = None,
) -> tuple[int, list[getmany.Answer], bytes]:
    tree_b = tree if isinstance(tree, bytes) else os.fsencode(tree)
    done = subprocess.run(
        ["/bin/sh", "-c", getmany.command()],
        input=getmany.request(tree_b, wanted, TOKEN) if stdin is None else stdin,
        cwd=cwd or "/",
        env={"PATH": path},
        capture_output=True,
        check=False,
        timeout=30,
        user=user,
        group=user,
        extra_groups=[] if user is not None else None,
    )
    sizes = [size for _, _, size in wanted]
    return done.returncode, answers(done.stdout, sizes) if done.stdout else [], done.stdout


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_whole_files_come_back_with_their_sha256_in_order(tmp_path: Path) -> None:
    (tmp_path / "a/b").mkdir(parents=True)
    data = {b"f": os.urandom(70_000), b"a/b/g": os.urandom(3), b"a/e": b""}
    for rel, content in data.items():
        (tmp_path / os.fsdecode(rel)).write_bytes(content)
    wanted = [(*node.split(b"t", rel)[1:], len(content)) for rel, content in data.items()]
    status, said, _ = run(tmp_path, wanted)
    assert status == 0
    assert [(a.number, a.data, a.sha256, a.error) for a in said] == [
        (n, content, sha(content), "") for n, content in enumerate(data.values())
    ]


def test_a_relative_tree_is_the_login_directory_s_for_every_file(tmp_path: Path) -> None:
    (tmp_path / "t/d").mkdir(parents=True)
    (tmp_path / "t/d/f").write_bytes(b"one")
    (tmp_path / "t/g").write_bytes(b"two")
    status, said, _ = run(b"t", [(b"d", b"f", 3), (b"", b"g", 3)], cwd=tmp_path)
    assert status == 0
    assert [a.data for a in said] == [b"one", b"two"]


def test_a_symlink_to_a_file_outside_is_refused_and_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"secret")
    secret.chmod(0o000)  # root reads it anyway: the refusal is the open's, not permissions
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "link").symlink_to(secret)
    (tree / "ok").write_bytes(b"ok")
    before = secret.stat().st_atime_ns
    status, said, out = run(tree, [(b"", b"link", 6), (b"", b"ok", 2)])
    assert status == 0
    assert said[0].data is None
    assert said[0].error == getmany.NOT_REGULAR
    assert said[1].data == b"ok"
    assert b"secret" not in out
    assert secret.stat().st_atime_ns == before


def test_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "after").write_bytes(b"after")
    status, said, _ = run(tmp_path, [(b"", b"fifo", 10), (b"", b"after", 5)])
    assert status == 0
    assert said[0].error == getmany.NOT_REGULAR
    assert said[1].data == b"after"


def test_a_directory_swapped_for_a_symlink_outside_the_tree_left_the_tree(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_bytes(b"outside")
    tree = tmp_path / "tree"
    (tree / "inner").mkdir(parents=True)
    (tree / "inner/g").write_bytes(b"inside")
    (tree / "sub").symlink_to(outside)  # was a directory when listed
    (tree / "in").symlink_to(tree / "inner")  # a link that stays inside is followed (cd -P)
    status, said, out = run(tree, [(b"sub", b"f", 7), (b"in", b"g", 6)])
    assert status == 0
    assert said[0].data is None
    assert said[0].error == getmany.LEFT
    assert b"outside" not in out
    assert said[1].data == b"inside"


def test_a_tree_reached_through_a_symlink_is_its_real_path(tmp_path: Path) -> None:
    (tmp_path / "real/d").mkdir(parents=True)
    (tmp_path / "real/d/f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    status, said, _ = run(tmp_path / "link", [(b"d", b"f", 1)])
    assert (status, said[0].data) == (0, b"x")


def test_a_file_larger_than_listed_fails_as_grown_and_is_not_sent(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 100)
    status, said, out = run(tmp_path, [(b"", b"f", 10)])
    assert status == 0
    assert (said[0].data, said[0].error) == (None, getmany.GREW)
    assert b"x" * 11 not in out


def test_a_batch_of_exactly_max_files_is_answered_whole(tmp_path: Path) -> None:
    for n in range(getmany.MAX_FILES):
        (tmp_path / f"f{n}").write_bytes(b"x" * n)
    wanted = [(b"", b"f%d" % n, n) for n in range(getmany.MAX_FILES)]
    status, said, _ = run(tmp_path, wanted)
    assert status == 0
    assert [a.data for a in said] == [b"x" * n for n in range(getmany.MAX_FILES)]


def test_names_with_newlines_and_bytes_that_are_not_utf8_and_empty_files(tmp_path: Path) -> None:
    sub, base = b"new\nline/\xff\xfe dir", b"x\ny\x80 'q\"$(z)"
    where = os.fsencode(tmp_path) + b"/" + sub
    os.makedirs(where)
    Path(os.fsdecode(where + b"/" + base)).write_bytes(b"")
    Path(os.fsdecode(where + b"/-n")).write_bytes(b"1")
    status, said, _ = run(tmp_path, [(sub, base, 0), (sub, b"-n", 1)])
    assert status == 0
    assert [a.data for a in said] == [b"", b"1"]
    assert said[0].sha256 == sha(b"")


def test_one_unreadable_or_missing_file_fails_alone(tmp_path: Path) -> None:
    for name in ("a", "c"):
        (tmp_path / name).write_bytes(name.encode())
    (tmp_path / "dir").mkdir()
    status, said, _ = run(
        tmp_path, [(b"", b"a", 1), (b"", b"gone", 1), (b"", b"dir", 1), (b"", b"c", 1)]
    )
    assert status == 0
    assert [a.data for a in said] == [b"a", None, None, b"c"]
    assert said[1].error.startswith("not found on the node")
    assert said[2].error == getmany.NOT_REGULAR


def test_a_file_the_login_cannot_read_fails_alone() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as name:
        where = Path(name)
        where.chmod(0o755)
        (where / "locked").write_bytes(b"no")
        (where / "locked").chmod(0)
        (where / "ok").write_bytes(b"ok")
        (where / "ok").chmod(0o644)
        user = 65534 if os.geteuid() == 0 else None  # root reads every file: run as nobody
        status, said, _ = run(where, [(b"", b"locked", 2), (b"", b"ok", 2)], user=user)
    assert status == 0
    assert [a.data for a in said] == [None, b"ok"]
    assert said[0].error.startswith("not found on the node: Permission denied")


@pytest.mark.parametrize(
    "stdin",
    [
        b"",
        b"XXXX" + b"\0" * 24,
        getmany.START.pack(getmany.MAGIC_START, 4, TOKEN) + b"/tmp",  # no FEND
        getmany.START.pack(getmany.MAGIC_START, 4, TOKEN)
        + b"/tmp"
        + getmany.FILE.pack(getmany.MAGIC_FILE, 0, 1, getmany.MAX_SIZE + 1)
        + b"f"
        + getmany.END,  # a cap above what a node holds
        getmany.START.pack(getmany.MAGIC_START, 4, TOKEN)
        + b"/tmp"
        + getmany.FILE.pack(b"NOPE", 0, 1, 1)
        + b"f"
        + getmany.END,
    ],
)
def test_a_request_that_is_not_the_framing_answers_nothing(stdin: bytes) -> None:
    status, said, out = run(b"/tmp", [(b"", b"f", 1)], stdin=stdin)
    assert (status, said, out) == (getmany.BAD_STREAM, [], b"")


def test_without_python3_on_path_it_drains_stdin_and_says_so(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "cat").symlink_to("/bin/cat")
    status, said, _ = run(tmp_path, [(b"", b"f", 1)], path=str(tools))
    assert (status, said) == (getmany.NO_PYTHON, [])


def script_namespace() -> dict[str, Any]:
    """The node program's functions, loaded here without running main()."""
    namespace: dict[str, Any] = {"__name__": "fleet_test"}
    exec(compile(getmany.SCRIPT, "getmany-node", "exec"), namespace)
    return namespace


def test_a_file_written_to_while_it_is_read_fails_as_changed(tmp_path: Path) -> None:
    ns = script_namespace()
    target = tmp_path / "f"
    target.write_bytes(b"a" * 1000)
    read_all = ns["read_all"]

    def read_then_touch(fd: int, cap: int) -> bytes:
        data: bytes = read_all(fd, cap)
        with open(target, "r+b") as f:  # the same bytes, same size: only mtime and ctime move
            os.pwrite(f.fileno(), b"a", 0)
        return data

    ns["read_all"] = read_then_touch
    real = os.fsencode(os.path.realpath(tmp_path))
    here = os.getcwd()
    try:
        with pytest.raises(ns["Fail"], match=getmany.CHANGED):
            ns["fetch"](real, real, b"", b"f", 1000)
        ns["read_all"] = read_all
        assert ns["fetch"](real, real, b"", b"f", 1000) == b"a" * 1000
    finally:
        os.chdir(here)


def test_a_file_that_grows_while_it_is_read_fails_as_changed(tmp_path: Path) -> None:
    ns = script_namespace()
    target = tmp_path / "f"
    target.write_bytes(b"a" * 1000)
    read_all = ns["read_all"]

    def read_then_grow(fd: int, cap: int) -> bytes:
        with open(target, "ab") as f:
            f.write(b"more")
        data: bytes = read_all(fd, cap)
        return data

    ns["read_all"] = read_then_grow
    real = os.fsencode(os.path.realpath(tmp_path))
    here = os.getcwd()
    try:
        with pytest.raises(ns["Fail"], match=getmany.CHANGED):
            ns["fetch"](real, real, b"", b"f", 2000)
    finally:
        os.chdir(here)


# ------------------------------------------------------------------ the bastion's side


def answer(number: int, data: bytes, digest: str = "", size: int | None = None) -> bytes:
    raw = bytes.fromhex(digest or sha(data))
    head = getmany.ANSWER.pack(
        getmany.MAGIC_ANSWER, number, getmany.OK, len(data) if size is None else size, raw, 0
    )
    return head + data


def test_the_reader_skips_a_banner_and_takes_answers_in_any_chunks() -> None:
    stream = b"Welcome!" + TOKEN + answer(0, b"abc") + answer(1, b"")
    reader = getmany.Reader([3, 0], TOKEN)
    got = [a for i in range(len(stream)) for a in reader.feed(stream[i : i + 1])]
    assert [(a.number, a.data, a.sha256) for a in got] == [
        (0, b"abc", sha(b"abc")),
        (1, b"", sha(b"")),
    ]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (answer(1, b"x" * 11), getmany.Grew),  # more than listed
        (answer(2, b"x"), getmany.BadStream),  # an index not asked next
        (answer(0, b"x"), getmany.BadStream),  # one answered again
        (answer(1, b"x") + b"extra", getmany.BadStream),  # more than asked
        (b"FGOX" + bytes(getmany.ANSWER.size), getmany.BadStream),
        (
            getmany.ANSWER.pack(getmany.MAGIC_ANSWER, 1, getmany.FAILED, 0, bytes(32), 1 << 20),
            getmany.BadStream,
        ),  # an error text above the cap
        (getmany.ANSWER.pack(getmany.MAGIC_ANSWER, 1, 7, 0, bytes(32), 0), getmany.BadStream),
    ],
)
def test_the_reader_refuses_a_hostile_stream(bad: bytes, error: type[Exception]) -> None:
    reader = getmany.Reader([4, 10], TOKEN)
    got = reader.feed(TOKEN + answer(0, b"fine") + bad)
    assert got[0].data == b"fine"  # the answer before the break stands
    assert isinstance(reader.broken, error)
    assert reader.feed(answer(1, b"x")) == []  # nothing more is read


def test_the_reader_refuses_a_stream_that_never_shows_the_token() -> None:
    reader = getmany.Reader([4], TOKEN)
    assert reader.feed(b"x" * (getmany.MAX_BANNER + 100)) == []  # not kept growing
    assert isinstance(reader.broken, getmany.BadStream)
    assert reader.feed(TOKEN + answer(0, b"fine")) == []


class FakeExec:
    """files.Exec's part _fetch_batch uses, answering with a fixed stream."""

    stream = b""
    status = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.sent = b""
        self.stderr = bytearray()

    def __enter__(self) -> FakeExec:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def send(self, data: bytes) -> None:
        self.sent += data

    def end_input(self) -> None:
        pass

    def chunks(self) -> Any:
        yield from (self.stream[i : i + 7] for i in range(0, len(self.stream), 7))

    def wait(self) -> int:
        return self.status

    def stderr_text(self) -> str:
        return ""


def fetch(
    monkeypatch: pytest.MonkeyPatch, where: Path, stream: bytes, sizes: list[int], status: int = 0
) -> list[files.FileResult] | None:
    monkeypatch.setattr(FakeExec, "stream", stream)
    monkeypatch.setattr(FakeExec, "status", status)
    monkeypatch.setattr(files, "Exec", FakeExec)
    dir_fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    try:
        asked: list[tuple[str, ...]] = [(f"f{n}",) for n in range(len(sizes))]
        session: Any = object()
        return files._fetch_batch(
            session, b"", getmany.Reader(sizes, TOKEN), (dir_fd, asked), files.Options()
        )
    finally:
        os.close(dir_fd)


def landed(where: Path) -> list[str]:
    return sorted(os.listdir(where))


def test_answers_land_verified_and_a_grown_file_fails_with_those_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = TOKEN + answer(0, b"one") + answer(1, b"x" * 50) + answer(2, b"two")
    results = fetch(monkeypatch, tmp_path, stream, [3, 10, 3])
    assert results is not None
    assert [r.action for r in results] == [
        files.Action.COPIED,
        files.Action.FAILED,
        files.Action.FAILED,
    ]
    assert results[1].error == getmany.GREW
    assert results[2].error.startswith("no result from the node")
    assert landed(tmp_path) == ["f0"]  # nothing of a part left
    assert (tmp_path / "f0").read_bytes() == b"one"


def test_a_truncated_stream_fails_the_file_cut_and_leaves_no_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = TOKEN + answer(0, b"one") + answer(1, b"twelve bytes")[:-3]
    results = fetch(monkeypatch, tmp_path, stream, [3, 12], status=1)
    assert results is not None
    assert [r.action for r in results] == [files.Action.COPIED, files.Action.FAILED]
    assert landed(tmp_path) == ["f0"]


def test_a_stream_cut_at_any_byte_lands_exactly_the_answers_before_the_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    datas = [b"one", b"", b"three"]
    pieces = [TOKEN] + [answer(n, data) for n, data in enumerate(datas)]
    stream = b"".join(pieces)
    ends = [len(b"".join(pieces[: n + 2])) for n in range(len(datas))]  # each answer's end
    for cut in range(len(stream) + 1):
        where = tmp_path / str(cut)
        where.mkdir()
        results = fetch(monkeypatch, where, stream[:cut], [len(d) for d in datas], status=1)
        assert results is not None
        whole = [cut >= end for end in ends]
        assert [r.action is files.Action.COPIED for r in results] == whole, cut
        assert landed(where) == [f"f{n}" for n in range(len(datas)) if whole[n]], cut


def test_bytes_that_are_not_the_node_s_sha256_are_not_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = TOKEN + answer(0, b"one", digest=sha(b"two")) + answer(1, b"ab")
    results = fetch(monkeypatch, tmp_path, stream, [3, 3])
    assert results is not None
    assert [r.action for r in results] == [files.Action.FAILED, files.Action.FAILED]
    assert "sha256 mismatch" in results[0].error
    assert "2 of 3 bytes" in results[1].error  # it shrank on the node
    assert landed(tmp_path) == []


def test_a_local_file_with_the_node_s_sha256_is_skipped_and_not_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "f0").write_bytes(b"same")
    (tmp_path / "f1").write_bytes(b"diff")
    before = (tmp_path / "f0").stat()
    stream = TOKEN + answer(0, b"same") + answer(1, b"new!")
    results = fetch(monkeypatch, tmp_path, stream, [4, 4])
    assert results is not None
    assert [r.action for r in results] == [files.Action.SKIPPED, files.Action.COPIED]
    after = (tmp_path / "f0").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert (tmp_path / "f1").read_bytes() == b"new!"
    assert landed(tmp_path) == ["f0", "f1"]


def test_a_node_without_python3_hands_the_batch_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert fetch(monkeypatch, tmp_path, b"", [3], status=getmany.NO_PYTHON) is None


def test_a_local_symlink_where_the_part_goes_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    where = tmp_path / "d"
    where.mkdir()
    (where / os.fsdecode(node.part_name(b"f0"))).symlink_to(outside)
    results = fetch(monkeypatch, where, TOKEN + answer(0, b"new"), [3])
    assert results is not None
    assert results[0].action is files.Action.FAILED
    assert outside.read_bytes() == b"precious"


def within_deadline(call: Callable[[], Any], fifos: list[Path]) -> Any:
    """call() on a thread; when it has not returned in 20 s (blocked opening one of `fifos`),
    open their other ends until it goes, and fail."""
    outcome: list[Any] = []
    worker = threading.Thread(target=lambda: outcome.append(call()), daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():
        for _ in range(20):
            for fifo in fifos:
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
            worker.join(1)
        pytest.fail("opening a local FIFO blocked the pull")
    return outcome[0]


def test_a_local_fifo_where_the_part_or_the_final_file_is_never_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another local user who can write in LOCALDIR/HOST plants a FIFO at f0's part name, and
    swaps f1 for one after its size was looked at: each fails, f2 still lands."""
    part = tmp_path / os.fsdecode(node.part_name(b"f0"))
    os.mkfifo(part)
    os.mkfifo(tmp_path / "f1")
    looked = local.regular_size
    monkeypatch.setattr(
        local, "regular_size", lambda d, name: 3 if name == "f1" else looked(d, name)
    )
    stream = TOKEN + answer(0, b"one") + answer(1, b"two") + answer(2, b"six")
    results = within_deadline(
        lambda: fetch(monkeypatch, tmp_path, stream, [3, 3, 3]), [part, tmp_path / "f1"]
    )
    assert [r.action for r in results] == [files.Action.FAILED] * 2 + [files.Action.COPIED]
    assert (tmp_path / "f2").read_bytes() == b"six"
    assert landed(tmp_path) == sorted([part.name, "f1", "f2"])  # the FIFOs left as they were


class CountingExec(FakeExec):
    """Answers every request of the batch it was sent (with the batch's own token) and notes
    how many descriptors this process holds while the answers arrive."""

    held: ClassVar[list[int]] = []

    def chunks(self) -> Any:
        start = getmany.START.unpack(self.sent[: getmany.START.size])
        stream = start[2] + b"".join(answer(n, b"x%d" % n) for n in range(64))
        for i in range(0, len(stream), 64):
            CountingExec.held.append(len(os.listdir("/proc/self/fd")))
            yield stream[i : i + 64]


def never(entry: node.Entry) -> Any:
    raise AssertionError(f"{entry.rel!r} was pulled alone: the batch framed every name")


def test_a_batch_holds_no_descriptor_per_file_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 files in 64 directories: each directory is opened only to land its file, so 64 hosts
    pulling at once stay far from the 1,024 descriptors a process may hold by default."""
    monkeypatch.setattr(files, "Exec", CountingExec)
    monkeypatch.setattr(CountingExec, "held", [])
    entries = [node.Entry("f", len(b"x%d" % n), b"d%d/f" % n) for n in range(64)]
    base_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        before = len(os.listdir("/proc/self/fd"))
        session: Any = object()
        where = (base_fd, "top")
        results = files._pull_batch(session, b"/tree", entries, where, files.Options(), never)
    finally:
        os.close(base_fd)
    assert results is not None
    assert [r.action for r in results] == [files.Action.COPIED] * 64
    assert (tmp_path / "top" / "d63" / "f").read_bytes() == b"x63"
    assert max(CountingExec.held) - before < 8, CountingExec.held
