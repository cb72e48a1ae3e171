"""The bastion side of a transfer: a pull's files written under one directory and nowhere else,
a push's files read from inside the tree it listed and nowhere else.

Every path is opened one component at a time from a directory descriptor, with O_NOFOLLOW: a
symlink found locally (planted, or left by anything) is never followed, so nothing a node names
can make fleet write outside LOCALDIR/HOST, and a directory of LOCAL swapped for a symlink after
the push listed it cannot make fleet send what the link names. A file is written under a part
name beside its final name, fsynced, renamed, and its directory fsynced: an interrupted pull
never leaves a file that looks whole.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from fleet.transfer.node import part_name

HASH_READ_BYTES = 1 << 20
# Every FLUSH_BYTES written, a thread of the part file's own fdatasyncs it while more arrives. The
# page cache otherwise held a whole 1 GiB pull dirty (below the kernel's background threshold)
# and the final fsync wrote all of it after the transfer: 0.6 s here. fadvise DONTNEED and
# sync_file_range start the writeback but leave the disk's own cache to the final fsync (0.43 s
# still); syncing as it goes leaves it almost nothing (docs/benchmark.md, "Push and pull").
FLUSH_BYTES = 32 << 20
STOP_WAIT_S = 10.0
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# A file of LOCAL is opened non-blocking: a FIFO swapped in after the listing would otherwise
# block the open until something writes to it. (A socket fails ENXIO; a device node a user
# could name only by a symlink, which O_NOFOLLOW refuses, or a hard link, which cannot cross
# into /dev's file system.)
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# What an open under a listed LOCAL fails with when a component is no longer what was listed.
SWAPPED_ERRNOS = (errno.ELOOP, errno.ENOTDIR, errno.ENXIO)


class Changed(OSError):
    """A file or directory of LOCAL is no longer what the push listed: a symlink, a FIFO, a
    device, another directory. Its message is the per-file error."""


def open_base(path: Path, *, create: bool = True) -> int | None:
    """A descriptor of LOCALDIR/HOST (created, parents too: the operator named LOCALDIR).
    create=False (a dry run): the existing directory, or None when there is none yet."""
    if create:
        path.mkdir(parents=True, exist_ok=True)
    try:
        return os.open(path, DIR_FLAGS)
    except FileNotFoundError:
        if create:
            raise
        return None


def open_dir(base_fd: int, parts: Sequence[str], *, create: bool = True) -> int:
    """The directory base/parts[0]/parts[1]/..., created as needed (create=False: only one
    that exists, else FileNotFoundError), never through a symlink (OSError ELOOP/ENOTDIR when a
    component is one)."""
    fd = os.dup(base_fd)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(name: str | Path, dir_fd: int | None = None) -> int:
    """A read descriptor of the regular file `name` (in `dir_fd`), its last component never
    followed; Changed when it is a symlink, a FIFO, a device or a socket. Opened non-blocking
    so a FIFO cannot hang the open; the flag is cleared once it is known to be a file."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in SWAPPED_ERRNOS:
            raise Changed(exc.errno, "a symlink or not a regular file: not read") from None
        raise
    return _regular(
        fd, Changed(errno.EINVAL, "not a regular file (a FIFO, device or socket): not read")
    )


def _regular(fd: int, refusal: OSError) -> int:
    """`fd`, opened non-blocking (a FIFO cannot hang the open), made blocking once it is known
    to be a regular file; else closed and `refusal` raised."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise refusal
    os.set_blocking(fd, True)
    return fd


def open_listed(root: Path, identity: tuple[int, int], parts: Sequence[str]) -> int:
    """A read descriptor of the file LOCAL/parts[0]/.../parts[-1] of a push's listing (no
    parts: LOCAL is the file), reached only through what was listed: LOCAL opened again
    without following it and required to be the same file or directory (`identity`: its
    st_dev, st_ino when listed), then each directory below it from the last one's descriptor
    with O_NOFOLLOW. Changed when anything on the way was swapped since the listing."""
    if not parts:
        fd = open_regular(root)
        return _same(fd, identity)
    try:
        top = _same(os.open(root, DIR_FLAGS), identity)
        try:
            where = open_dir(top, parts[:-1], create=False)
        finally:
            os.close(top)
    except OSError as exc:
        if exc.errno in SWAPPED_ERRNOS:
            raise Changed(exc.errno, "a directory on its path is a symlink now: not read") from None
        raise
    try:
        return open_regular(parts[-1], where)
    finally:
        os.close(where)


def _same(fd: int, identity: tuple[int, int]) -> int:
    """`fd` when it is the file or directory that was listed as LOCAL, else closed and Changed."""
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != identity:
        os.close(fd)
        raise Changed(errno.ESTALE, "LOCAL was replaced since it was listed: not read")
    return fd


def regular_size(dir_fd: int, name: str) -> int | None:
    """The size of a regular file `name` in the directory (not a symlink), else None."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def sha256_of(dir_fd: int, name: str, limit: int | None = None) -> tuple[str, hashlib._Hash]:
    """(hex digest, hasher) of a regular file's first `limit` bytes (all: None), no symlink."""
    hasher = hashlib.sha256()
    fd = open_regular(name, dir_fd)  # one swapped for a FIFO since it was looked at: Changed
    try:
        left = limit
        while left is None or left > 0:
            chunk = os.read(fd, HASH_READ_BYTES if left is None else min(left, HASH_READ_BYTES))
            if not chunk:
                break
            hasher.update(chunk)
            if left is not None:
                left -= len(chunk)
    finally:
        os.close(fd)
    return hasher.hexdigest(), hasher


class Flusher:
    """fdatasync one open file on a thread of its own each time `wrote` has added FLUSH_BYTES
    since the last sync, overlapped with the writes; `stop` before the file is closed (the
    thread never touches a closed, possibly reused, descriptor)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._due = threading.Event()
        self._stopping = False
        self._pending = 0
        self._thread: threading.Thread | None = None

    def wrote(self, count: int) -> None:
        self._pending += count
        if self._pending < FLUSH_BYTES:
            return
        self._pending = 0
        if self._thread is None:  # started by the first FLUSH_BYTES: small files need none
            self._thread = threading.Thread(target=self._run, name="fleet-flush", daemon=True)
            self._thread.start()
        self._due.set()

    def _run(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            if self._stopping:
                return
            with contextlib.suppress(OSError):  # early writeback only: commit's fsync counts
                os.fdatasync(self._fd)

    def stop(self) -> None:
        """End the thread. Bounded: a sync stuck on a dead network file system must not hold
        a cancelled pull; a thread left in its sync never syncs again (it sees _stopping)."""
        if self._thread is not None:
            self._stopping = True
            self._due.set()
            self._thread.join(timeout=STOP_WAIT_S)
            self._thread = None


class PartFile:
    """The part file of one pull: opened for append (resume) or from scratch."""

    def __init__(self, dir_fd: int, final: str, fresh: bool) -> None:
        self.dir_fd = dir_fd
        self.final = final
        self.name = os.fsdecode(part_name(os.fsencode(final)))
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        flags |= os.O_TRUNC if fresh else os.O_APPEND
        # Non-blocking: a FIFO another local user put at the part name fails (ENXIO) or is
        # refused below, where a blocking open would wait for a reader forever.
        fd = os.open(self.name, flags, 0o600, dir_fd=dir_fd)
        self.fd = _regular(fd, OSError(errno.EINVAL, "the part file is not a regular file"))
        self.written = 0
        self._flusher = Flusher(self.fd)

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            count = os.write(self.fd, view)
            self.written += count
            view = view[count:]
        self._flusher.wrote(len(data))

    def close(self) -> None:
        if self.fd >= 0:
            self._flusher.stop()
            os.close(self.fd)
            self.fd = -1

    def commit(self, mode: int = 0o644) -> None:
        """fsync, rename over the final name, fsync the directory."""
        os.fchmod(self.fd, mode)
        os.fsync(self.fd)
        self.close()
        os.rename(self.name, self.final, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        os.fsync(self.dir_fd)

    def discard(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.name, dir_fd=self.dir_fd)
