"""Many small files in one node command: a Python program the node's python3 runs.

A small file pushed alone costs three node commands (probe, write, commit), each an sshd session
and a dozen short node processes: ~30 ms of node CPU per file. Here one command takes a batch
of small files on stdin and does for each, in-process, what those commands do: skip a final
file of the same size and sha256, write a fresh part file, check its sha256, commit it through
a directory of its own. The node needs python3 (3.6 or later); without it the command drains
stdin and exits NO_PYTHON, and the bastion moves the files one by one with the sh commands of
fleet.transfer.node instead.

stdin, per file: HEAD (magic b"FPUT", directory length, name length, size, mode, sha256 as 32
bytes), the directory, the name, then the file's bytes; after the last file b"FEND". Names are
bytes and never on a command line. stdout, once every file is done and its directory fsynced:
`INDEX OUTCOME TEXT` per file, INDEX its place in the stream, OUTCOME copied or skipped (TEXT
the sha256), isdir (the final name is a directory: nothing moved) or failed (TEXT why).
The node holds one file's bytes at a time (MAX_SIZE at most).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from typing import NamedTuple

from fleet.transfer import node

NO_PYTHON = 9  # no python3 on the node's PATH, or one that cannot run SCRIPT
BAD_STREAM = 4  # stdin was not the framing below: the files without a line failed
MAGIC = b"FPUT"
END = b"FEND"
HEAD = struct.Struct(">4sIIQI32s")
MAX_FILES = 64  # in one batch
MAX_BYTES = 4 << 20  # of content in one batch
MAX_SIZE = node.SMALL_FILE_BYTES  # one file's, at most (the node holds it whole)
MAX_DIRECTORY = 4096  # bytes of a directory path (PATH_MAX)
MAX_NAME = 255  # bytes of a file name (NAME_MAX)

# What both node programs (this one and fleet.transfer.getmany's) start with: a python3 older
# than 3.6 drains stdin and exits NO_PYTHON; the open flags; exactly N bytes of stdin; an
# error's words. Python 3.6+ (no f-strings, no walrus), stdlib only; run with -I -S so the
# node's site and user directories, and the working directory, add nothing to it.
PRELUDE = r"""
import os, sys
if sys.version_info < (3, 6):
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    sys.exit(@NO_PYTHON@)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | CLOEXEC


class Fail(Exception):
    pass


def exact(count):
    parts = []
    while count:
        chunk = os.read(0, min(count, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        count -= len(chunk)
    return b"".join(parts)


def why(what, exc):
    return "%s: %s" % (what, getattr(exc, "strerror", None) or exc)
""".replace("@NO_PYTHON@", str(NO_PYTHON))

# The node program: PRELUDE, then this.
SCRIPT = (
    PRELUDE
    + r"""
import hashlib, random, stat, struct
HEAD = struct.Struct(@HEAD@)
PREFIX = b".fleet-part-"
MAX_SIZE = @MAX_SIZE@
MODE_BITS = 0o777
NEW_PART = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | CLOEXEC
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
RANDOM = random.SystemRandom()



def part_name(base):
    return PREFIX + hashlib.sha256(base).hexdigest()[:16].encode()


def lstat(name, dfd):
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def enter(directory, dirs):
    # mkdir -p and cd -P: the destination is the operator's own path, symlinks followed
    if directory not in dirs:
        try:
            if not os.path.isdir(directory):
                os.makedirs(directory, exist_ok=True)
            dirs[directory] = os.open(directory, DIR_FLAGS)
        except OSError as exc:
            raise Fail(why("cannot enter the directory on the node", exc))
    return dirs[directory]


def sha_of(dfd, name):
    fd = os.open(name, READ_FLAGS, dir_fd=dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        hasher = hashlib.sha256()
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return hasher.digest()
            hasher.update(chunk)
    finally:
        os.close(fd)


def unlink_ours(name, dfd, mine):
    found = lstat(name, dfd)
    if found is not None and (found.st_dev, found.st_ino) == (mine.st_dev, mine.st_ino):
        os.unlink(name, dir_fd=dfd)


def own_directory(dfd):
    for _ in range(100):
        tail = "".join(RANDOM.choice(LETTERS) for _ in range(10))
        name = PREFIX + b"commit-" + tail.encode()
        try:
            os.mkdir(name, 0o700, dir_fd=dfd)
        except FileExistsError:
            continue
        cfd = os.open(name, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=dfd)
        try:
            if os.fstat(cfd).st_uid != os.geteuid() or os.listdir(cfd):
                raise Fail("refused: the commit directory changed")
            os.fchmod(cfd, 0o700)  # as mktemp -d makes it, whatever the umask
        except BaseException:
            os.close(cfd)
            raise
        return name, cfd
    raise Fail("cannot make a commit directory on the node")


def commit(dfd, part, base, fd, mode):
    # the part is renamed into a directory of our own, checked there to be the inode written,
    # given its mode (0600 until then: no one else wrote it after it was hashed), then renamed
    # over the final name: no name another user can swap is renamed unchecked
    mine = os.fstat(fd)
    name, cfd = own_directory(dfd)
    try:
        os.rename(part, part, src_dir_fd=dfd, dst_dir_fd=cfd)
        try:
            st = os.stat(part, dir_fd=cfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino, st.st_size) != (
                    mine.st_dev, mine.st_ino, mine.st_size):
                raise Fail("changed on the node: the part changed after it was hashed")
            os.fchmod(fd, mode & MODE_BITS)  # our own descriptor: never setuid or setgid
            os.rename(part, base, src_dir_fd=cfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(part, dir_fd=cfd)
            except OSError:
                pass
            raise
    finally:
        mine_dir = os.fstat(cfd)
        os.close(cfd)
        found = lstat(name, dfd)
        if found is not None and (found.st_dev, found.st_ino) == (
                mine_dir.st_dev, mine_dir.st_ino):
            os.rmdir(name, dir_fd=dfd)


def put(directory, base, mode, digest, data, dirs):
    bad = not base or base in (b".", b"..") or b"/" in base or b"\0" in base
    if bad or b"\0" in directory:
        raise Fail("refused: an unsafe name")
    dfd = enter(directory, dirs)
    final = lstat(base, dfd)
    if final is not None and stat.S_ISDIR(final.st_mode):
        return "isdir", ""
    if final is not None and stat.S_ISREG(final.st_mode) and final.st_size == len(data):
        try:
            same = sha_of(dfd, base) == digest
        except OSError:
            same = False  # cannot be read: it is replaced
        if same:
            return "skipped", digest.hex()
    part = part_name(base)
    try:
        os.unlink(part, dir_fd=dfd)  # a leftover part (unlink never follows a symlink)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise Fail(why("cannot remove the old part on the node", exc))
    try:
        fd = os.open(part, NEW_PART, 0o600, dir_fd=dfd)
    except OSError as exc:
        raise Fail(why("cannot write on the node", exc))
    try:
        mine = os.fstat(fd)
        try:
            hasher = hashlib.sha256()
            view = memoryview(data)
            while view:
                count = os.write(fd, view[:1 << 20])
                hasher.update(view[:count])
                view = view[count:]
            if hasher.digest() != digest:
                unlink_ours(part, dfd, mine)
                raise Fail("sha256 mismatch on the node: %s, sent %s" % (
                    hasher.hexdigest()[:12], digest.hex()[:12]))
            os.fsync(fd)
        except OSError as exc:
            unlink_ours(part, dfd, mine)
            raise Fail(why("read or write failed on the node", exc))
        final = lstat(base, dfd)
        if final is not None and stat.S_ISDIR(final.st_mode):
            unlink_ours(part, dfd, mine)
            return "isdir", ""
        try:
            commit(dfd, part, base, fd, mode)
        except OSError as exc:
            unlink_ours(part, dfd, mine)
            raise Fail(why("cannot rename on the node", exc))
    finally:
        os.close(fd)
    return "copied", hasher.hexdigest()


def main():
    dirs = {}
    done = []  # (index, directory, outcome, text)
    index = 0
    status = 0
    try:
        while True:
            magic = exact(4)
            if magic == b"FEND":
                break
            magic, dlen, blen, size, mode, digest = HEAD.unpack(magic + exact(HEAD.size - 4))
            if magic != b"FPUT" or dlen > @MAX_DIRECTORY@ or blen > @MAX_NAME@ or size > MAX_SIZE:
                raise ValueError("bad header")
            directory, base = exact(dlen), exact(blen)
            data = exact(size)
            try:
                outcome, text = put(directory, base, mode, digest, data, dirs)
            except Fail as exc:
                outcome, text = "failed", str(exc)
            except Exception as exc:
                outcome, text = "failed", why("on the node", exc)
            done.append((index, directory, outcome, text))
            index += 1
    except (EOFError, ValueError, struct.error):
        sys.stderr.write("fleet: a batch that is not fleet's framing\n")
        status = @BAD_STREAM@
    synced = {}
    lines = []
    for index, directory, outcome, text in done:
        if outcome == "copied":
            if directory not in synced:
                try:
                    os.fsync(dirs[directory])
                    synced[directory] = ""
                except OSError as exc:
                    synced[directory] = why("cannot sync the directory on the node", exc)
            if synced[directory]:
                outcome, text = "failed", synced[directory]
        text = text.replace("\n", " ").encode("ascii", "backslashreplace")
        lines.append(b"%d %s %s\n" % (index, outcome.encode(), text))
    for fd in dirs.values():
        os.close(fd)
    out = b"\n" + b"".join(lines)  # a line of its own even after a banner with no newline
    while out:
        out = out[os.write(1, out):]
    sys.exit(status)


main()
"""
)


def filled(script: str, values: Mapping[str, str]) -> str:
    """A node program's text with each `@NAME@` placeholder replaced by its value (the
    bastion's own constants, so both ends frame alike). Also fleet.transfer.getmany's."""
    for name, value in values.items():
        script = script.replace(name, value)
    return script


SCRIPT = filled(
    SCRIPT,
    {
        "@HEAD@": repr(HEAD.format),
        "@MAX_SIZE@": str(MAX_SIZE),
        "@BAD_STREAM@": str(BAD_STREAM),
        "@MAX_DIRECTORY@": str(MAX_DIRECTORY),
        "@MAX_NAME@": str(MAX_NAME),
    },
)


def command() -> bytes:
    """The batch's node command: python3 runs SCRIPT (python_command)."""
    return python_command(SCRIPT)


def python_command(script: str) -> bytes:
    """A node command in which python3 runs `script` with -I -S. Without python3 on PATH, or
    with one that cannot run it (older than 3.6; 2: no -I, before 3.4), stdin is drained and
    the exit status is NO_PYTHON: nothing was done. A program cut short leaves stdin drained
    too, so the bastion's sending never fails on it. (Also fleet.transfer.getmany's.)"""
    no = str(NO_PYTHON).encode()
    return (
        b"command -v python3 >/dev/null 2>&1 || { cat >/dev/null; exit " + no + b"; }; "
        b"python3 -I -S -c " + node.q(script) + b"; s=$?; "
        b'[ "$s" = 0 ] || cat >/dev/null; '
        b'case "$s" in 2|126|127) exit ' + no + b";; esac; exit $s"
    )


def frame(directory: bytes, base: bytes, size: int, mode: int, digest: bytes) -> bytes:
    """One file's header on the batch's stdin: its `size` bytes follow it."""
    head = HEAD.pack(MAGIC, len(directory), len(base), size, mode, digest)
    return head + directory + base


class Outcome(NamedTuple):
    """One line of the node's answer."""

    number: int
    outcome: str  # copied, skipped, isdir, failed
    text: str  # sha256 (copied, skipped) or why (failed)


LINE_RE = re.compile(rb"(\d{1,6}) (copied|skipped|isdir|failed) ?([^\n]*)")


def parse(out: bytes) -> dict[int, Outcome]:
    """The node's lines by index (a line that is not one is ignored: its file has no result)."""
    found: dict[int, Outcome] = {}
    for line in out.split(b"\n"):
        match = LINE_RE.fullmatch(line)
        if match is not None:
            index = int(match.group(1))
            text = match.group(3).decode("ascii", "replace")
            found[index] = Outcome(index, match.group(2).decode(), text)
    return found
