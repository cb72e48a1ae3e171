"""Many small files pulled in one node command: a Python program the node's python3 runs.

A small file pulled alone costs a node command (an sshd session and a few short processes:
cd, stat twice, two dd, a hasher). Here one command takes a batch of requests on stdin and
does for each, in-process, what fleet.transfer.node.read_command does: the tree's real path
resolved once; the file's directory entered following symlinks (as `cd -P`) and refused when
its real path has left the tree's; the file opened there with O_NOFOLLOW|O_NONBLOCK (a symlink
never followed, a FIFO never waited on), required to be a regular file, read and hashed in one
pass, its size, mtime, ctime and inode the same before and after. The node needs python3 (3.6
or later); without it the command drains stdin and exits NO_PYTHON (the wrapper is putmany's),
and the bastion pulls the files one by one with the sh commands instead.

stdin: START (magic b"FGET", tree length, 16 random bytes: the batch's token) and the tree's
path; per file FILE (magic b"FGTF", directory length, name length, the listed size) then the
directory under the tree and the name; after the last file b"FEND". Names are bytes and never
on a command line. The whole request is read first (it is small: MAX_FILES names), so the node
never waits on stdin while the bastion waits on its answers.

stdout: the token (what a login shell prints before it is skipped, MAX_BANNER at most), then
per file in the request's order ANSWER (magic b"FGOT", index, outcome OK or FAILED, size,
sha256 as 32 bytes, error length) and the file's `size` bytes (OK) or the error text (FAILED).
The node holds one file's bytes at a time: at most its listed size (a file larger than that
when opened fails as grown), and never more than MAX_SIZE.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from fleet.transfer import node, putmany

NO_PYTHON = putmany.NO_PYTHON
BAD_STREAM = 4  # stdin was not the framing below: nothing was answered
START = struct.Struct(">4sI16s")  # magic, tree length, the batch's token
FILE = struct.Struct(">4sIIQ")
ANSWER = struct.Struct(">4sIBQ32sI")
MAGIC_START, MAGIC_FILE, MAGIC_ANSWER, END = b"FGET", b"FGTF", b"FGOT", b"FEND"
OK, FAILED = 0, 1
MAX_FILES = putmany.MAX_FILES  # in one batch
MAX_BYTES = putmany.MAX_BYTES  # of listed size in one batch
MAX_SIZE = node.SMALL_FILE_BYTES  # one file's, at most (the node holds it whole)
MAX_PATH = 4096  # bytes of the tree's path or a directory under it (PATH_MAX)
MAX_NAME = 255  # bytes of a file name (NAME_MAX)
MAX_ERROR = 1024  # bytes of one error text
TOKEN_BYTES = 16
MAX_BANNER = 65536  # bytes a login shell may print before the node's answers
GREW = "the file grew on the node while it was sent"
CHANGED = "changed on the node while it was sent"
LEFT = "refused: the directory left the tree"
NOT_REGULAR = "refused: a symlink, not a regular file, or outside the tree"

# The node program: putmany's PRELUDE (the python3 version check, the open flags, exact, why,
# Fail), then this.
SCRIPT = (
    putmany.PRELUDE
    + r"""
import errno, hashlib, stat, struct
START = struct.Struct(@START@)
FILE = struct.Struct(@FILE@)
ANSWER = struct.Struct(@ANSWER@)
MAX_SIZE = @MAX_SIZE@
NOT_REGULAR = @NOT_REGULAR@



def request():
    magic, tlen, token = START.unpack(exact(START.size))
    if magic != b"FGET" or not 0 < tlen <= @MAX_PATH@:
        raise ValueError("bad start")
    tree = exact(tlen)
    wanted = []
    while True:
        magic = exact(4)
        if magic == b"FEND":
            return token, tree, wanted
        magic, dlen, blen, cap = FILE.unpack(magic + exact(FILE.size - 4))
        if magic != b"FGTF" or dlen > @MAX_PATH@ or blen > @MAX_NAME@ or cap > MAX_SIZE:
            raise ValueError("bad file header")
        if len(wanted) >= @MAX_FILES@:
            raise ValueError("too many files")
        wanted.append((exact(dlen), exact(blen), cap))


def stamp(st):
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def read_all(fd, cap):
    # at most cap + 1 bytes: one more than the file held when opened says it grew
    parts = []
    left = cap + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def enter(real, where):
    # cd -P and pwd -P: symlinks followed, then the real path must still be under the tree's
    try:
        dfd = os.open(where, DIR_FLAGS)
    except OSError as exc:
        raise Fail(why("not found on the node", exc))
    try:
        os.fchdir(dfd)
        here = os.getcwdb()
    except OSError as exc:
        os.close(dfd)
        raise Fail(why("not found on the node", exc))
    if not (here + b"/").startswith(real.rstrip(b"/") + b"/"):
        os.close(dfd)
        raise Fail(@LEFT@)
    return dfd


def fetch(real, tree, sub, base, cap):
    bad = not base or base in (b".", b"..") or b"/" in base or b"\0" in base
    if bad or b"\0" in sub:
        raise Fail("refused: an unsafe name")
    if real is None:
        raise Fail("not found on the node: the tree")
    dfd = enter(real, tree + b"/" + sub if sub else tree)
    try:
        try:
            fd = os.open(base, READ_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise Fail(NOT_REGULAR)
            raise Fail(why("not found on the node", exc))
    finally:
        os.close(dfd)
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise Fail(NOT_REGULAR)
        if before.st_size > cap:
            raise Fail(@GREW@)
        try:
            data = read_all(fd, cap)
            after = os.fstat(fd)
        except OSError as exc:
            raise Fail(why("read or write failed on the node", exc))
        if len(data) != before.st_size or stamp(after) != stamp(before):
            raise Fail(@CHANGED@)
        return data
    finally:
        os.close(fd)


def send(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def main():
    try:
        token, tree, wanted = request()
    except (EOFError, ValueError, struct.error):
        sys.stderr.write("fleet: a batch that is not fleet's framing\n")
        sys.exit(@BAD_STREAM@)
    tree = os.path.join(os.getcwdb(), tree)  # as the login's cd would; before any fchdir
    try:
        real = os.path.realpath(tree)  # cd -P TREE && pwd -P, once
        os.stat(real)
    except OSError:
        real = None
    send(token)  # the answers start after it: a login shell's banner before it is skipped
    for index, (sub, base, cap) in enumerate(wanted):
        try:
            data = fetch(real, tree, sub, base, cap)
        except Fail as exc:
            data, text = None, str(exc)
        except Exception as exc:
            data, text = None, why("on the node", exc)
        if data is None:
            error = text.encode("utf-8", "backslashreplace")[:@MAX_ERROR@]
            send(ANSWER.pack(b"FGOT", index, @FAILED@, 0, b"\0" * 32, len(error)) + error)
        else:
            digest = hashlib.sha256(data).digest()
            send(ANSWER.pack(b"FGOT", index, @OK@, len(data), digest, 0))
            send(data)


if __name__ == "__main__":
    main()
"""
)
SCRIPT = putmany.filled(
    SCRIPT,
    {
        "@START@": repr(START.format),
        "@FILE@": repr(FILE.format),
        "@ANSWER@": repr(ANSWER.format),
        "@MAX_SIZE@": str(MAX_SIZE),
        "@MAX_PATH@": str(MAX_PATH),
        "@MAX_NAME@": str(MAX_NAME),
        "@MAX_FILES@": str(MAX_FILES),
        "@MAX_ERROR@": str(MAX_ERROR),
        "@BAD_STREAM@": str(BAD_STREAM),
        "@OK@": str(OK),
        "@FAILED@": str(FAILED),
        "@GREW@": repr(GREW),
        "@CHANGED@": repr(CHANGED),
        "@LEFT@": repr(LEFT),
        "@NOT_REGULAR@": repr(NOT_REGULAR),
    },
)


def command() -> bytes:
    """The batch's node command: python3 runs SCRIPT (putmany.python_command's wrapper)."""
    return putmany.python_command(SCRIPT)


def request(tree: bytes, files: list[tuple[bytes, bytes, int]], token: bytes) -> bytes:
    """The batch's stdin: the tree and the batch's token (16 random bytes the node's answers
    start after), then (directory under the tree, name, listed size) per file. ValueError
    when a name is too long to frame."""
    if not 0 < len(tree) <= MAX_PATH or len(files) > MAX_FILES or len(token) != TOKEN_BYTES:
        raise ValueError("too long to frame")
    out = [START.pack(MAGIC_START, len(tree), token), tree]
    for sub, base, size in files:
        if len(sub) > MAX_PATH or len(base) > MAX_NAME or size > MAX_SIZE:
            raise ValueError("too long to frame")
        out += [FILE.pack(MAGIC_FILE, len(sub), len(base), size), sub, base]
    out.append(END)
    return b"".join(out)


class Answer(NamedTuple):
    """One file's answer: its bytes and the node's sha256 of them, or why it failed."""

    number: int  # its place in the request
    data: bytes | None  # None: failed
    sha256: str  # hex, of the bytes the node read
    error: str


class BadStream(Exception):
    """The node's answer is not the framing: the files not yet answered fail."""


class Reader:
    """Answers parsed from the node's stdout as it arrives, bounded: a file's bytes at most
    its listed size, an error text at most MAX_ERROR, answers in the request's order."""

    def __init__(self, sizes: list[int], token: bytes) -> None:
        self.sizes = sizes  # listed size per requested file
        self.token: bytes | None = token  # None once found
        self.buf = bytearray()
        self.head: tuple[int, int, int, bytes, int] | None = None
        self.next = 0
        self.broken: BadStream | None = None  # set once the stream is not the framing

    def feed(self, chunk: bytes) -> list[Answer]:
        """The answers `chunk` completes. Once the stream is not the framing, `broken` says
        why (Grew: a file claiming more than its listed size) and nothing more is read: the
        answers before it stand, the files after it have none."""
        if self.broken is not None:
            return []
        done: list[Answer] = []
        try:
            self._parse(chunk, done)
        except BadStream as exc:
            self.broken = exc
            self.buf.clear()
        return done

    def _parse(self, chunk: bytes, done: list[Answer]) -> None:
        self.buf += chunk
        if self.token is not None:
            at = self.buf.find(self.token)
            if at < 0:
                if len(self.buf) > MAX_BANNER + TOKEN_BYTES:
                    raise BadStream("the node's answer is not fleet's framing")
                return
            del self.buf[: at + TOKEN_BYTES]
            self.token = None
        while True:
            if self.head is None:
                if self.next >= len(self.sizes) and self.buf:
                    raise BadStream("the node sent more than was asked")
                if len(self.buf) < ANSWER.size:
                    return
                magic, index, outcome, size, digest, elen = ANSWER.unpack_from(self.buf)
                if magic != MAGIC_ANSWER or index != self.next or outcome not in (OK, FAILED):
                    raise BadStream("the node's answer is not fleet's framing")
                if outcome == OK and size > self.sizes[index]:
                    raise Grew(index)
                if outcome == FAILED and (size or elen > MAX_ERROR):
                    raise BadStream("the node's answer is not fleet's framing")
                del self.buf[: ANSWER.size]
                self.head = (index, outcome, size, digest, elen)
            index, outcome, size, digest, elen = self.head
            body = size if outcome == OK else elen
            if len(self.buf) < body:
                return
            data = bytes(self.buf[:body])
            del self.buf[:body]
            self.head = None
            self.next += 1
            if outcome == OK:
                done.append(Answer(index, data, digest.hex(), ""))
            else:
                done.append(Answer(index, None, "", data.decode("utf-8", "replace")))


class Grew(BadStream):
    """A file's answer claims more bytes than its listed size."""

    def __init__(self, index: int) -> None:
        super().__init__(GREW)
        self.index = index
