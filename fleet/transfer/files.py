"""Move one file or one tree between the bastion and a node, over a connection fleet holds,
verified by sha256 on both ends, atomic and resumable. The functions here are the API that other
code (checkpoints, consolidate) builds on; fleet.transfer.fanout runs them on many hosts.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import hashlib
import os
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fleet.core.digits import is_digits
from fleet.transfer import getmany, local, node, paths, putmany
from fleet.transfer.channel import Connection, Exec, run_small
from fleet.transfer.pipe import Bulk, Pipe
from fleet.transfer.ratelimit import Limiter

WINDOW_BYTES = 8 * 1024 * 1024  # a transfer's channel window at most: what the node may send ahead
MAX_ENTRIES = 100_000  # of a node's listing
MAX_LISTING_BYTES = 64 << 20  # of a node's listing: its names, kept until the host is done
SEND_BYTES = 1 << 20  # one read of a local file while pushing
PROGRESS_POLL_S = 0.1  # how often a push that ssh reads itself reports its progress
# A tree of small files is moved a few files at a time per host, not one after the other: each
# file costs three node commands (look, write, commit; a pull: look, read) whose round trips and
# node processes, not bytes, set its time. Larger files still go alone (their bytes set their
# time; several at once would only share the bandwidth), and files go together only while four
# of them fit the host's window (Options.together_below): memory stays what one file's is.
# sshd allows 10 sessions per connection (MaxSessions): 4 files in flight keep well below it.
FILES_IN_FLIGHT = 4
# Below this a file's bytes go on the held connection even when the host has an `ssh` route:
# starting an ssh process for it costs more than paramiko's copy of a megabyte.
SMALL_FILE_BYTES = node.SMALL_FILE_BYTES

OnBytes = Callable[[int], None]
_T = TypeVar("_T")


class Action(enum.StrEnum):
    """What happened to one file."""

    COPIED = "copied"
    RESUMED = "resumed"  # an earlier run's part was kept and finished
    SKIPPED = "skipped"  # already there, same sha256
    WOULD_COPY = "would copy"  # dry run
    WOULD_RESUME = "would resume"
    FAILED = "failed"
    REFUSED = "refused"  # a node name or kind fleet will not write (symlink, `..`, device)


@dataclass(frozen=True)
class FileResult:
    """One file's outcome. `rel` is shown text (node names decoded with replacement)."""

    rel: str
    action: Action
    size: int = 0
    moved_bytes: int = 0
    sha256: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.action not in (Action.FAILED,)


@dataclass(frozen=True)
class Options:
    """How one host's transfer behaves."""

    limiter: Limiter = field(default_factory=Limiter)
    cancel: threading.Event = field(default_factory=threading.Event)
    window_bytes: int = WINDOW_BYTES
    dry_run: bool = False
    on_bytes: OnBytes = lambda count: None  # bytes moved, as they move (progress)
    route: Bulk | None = None  # file bytes through `ssh` (pipe.open_route); None: paramiko

    @property
    def via(self) -> str:
        """Which path carries the host's file bytes (events and the run record say it)."""
        return "ssh" if self.route is not None else "paramiko"

    def route_for(self, size: int) -> Bulk | None:
        """The `ssh` route a file of `size` bytes goes through (a small one never: None)."""
        return self.route if size >= SMALL_FILE_BYTES else None

    def via_for(self, size: int) -> str:
        """Which path carries a file of `size` bytes."""
        return "ssh" if self.route_for(size) is not None else "paramiko"

    @property
    def together_below(self) -> int:
        """Files smaller than this move FILES_IN_FLIGHT at once: small, and that many fit the
        host's window (its buffer and its channel's share of the memory budget)."""
        return min(SMALL_FILE_BYTES, self.window_bytes // FILES_IN_FLIGHT)


class TransferError(Exception):
    """One file could not be moved; the message says why (a result, caught per file)."""


def _stream(session: Connection, command: bytes, opts: Options, size: int) -> Exec | Pipe:
    """A bulk node command for `size` bytes: through `ssh` when the host has a route and the
    file is not small, else on the session."""
    route = opts.route_for(size)
    if route is not None:
        return Pipe(route.argv(command), cancel=opts.cancel, read_bytes=_buffer_bytes(opts))
    return Exec(session, command, window_bytes=opts.window_bytes, cancel=opts.cancel)


def _buffer_bytes(opts: Options) -> int:
    """One read or send per host: 1 MiB, less when many hosts share the window budget."""
    return min(SEND_BYTES, opts.window_bytes)


def _fail_text(status: int, ex: Exec | Pipe) -> str:
    said = ex.stderr_text()
    base = node.NODE_EXITS.get(status, f"node command exit {status}")
    return f"{base}: {said}" if said and said not in base else base


# ------------------------------------------------------------------ node side facts


def remote_sha256(session: Connection, path: str) -> str:
    """The sha256 of one regular file on the node (TransferError if it is not one)."""
    tree, sub, base = node.split(os.fsencode(path), b"")
    return _node_hash(session, tree, sub, base)


def _node_hash(session: Connection, tree: bytes, sub: bytes, base: bytes) -> str:
    status, out, err = run_small(session, node.hash_command(tree, sub, base))
    found = node.SHA_RE.search(out)
    if status != 0 or found is None:
        reason = node.NODE_EXITS.get(status, f"exit {status}")
        raise TransferError(f"cannot hash on the node: {reason}" + (f": {err}" if err else ""))
    return found.group(1).decode()


def _alongside(here: Callable[[], str], there: Callable[[], str]) -> tuple[str, str]:
    """(here(), there()): a local hash on a thread of its own while the node hashes the same
    file, at once rather than one after the other (a 1 GiB file found already in place: both
    ends' 0.55 s overlapped). hashlib and the wait for the node both release the GIL."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-hash") as pool:
        mine = pool.submit(here)
        theirs = there()
        return mine.result(), theirs


MARK_WITHIN_BYTES = 64 * 1024  # what a login shell may print before a command's start mark


def new_token() -> bytes:
    """A start mark for one node command (node.start_mark)."""
    return b"fleet-start-" + os.urandom(16).hex().encode()


def after_mark(
    chunks: Iterable[bytes] | Iterable[memoryview], token: bytes
) -> Iterator[bytes | memoryview]:
    """A node command's stdout after its start mark (node.start_mark): what the login shell
    printed before it (a ~/.bashrc banner, `conda activate`) is dropped, as fleet does for
    steps. No mark at all: nothing (the command did not run; its status says why); none
    within MARK_WITHIN_BYTES: TransferError."""
    head: bytearray | None = bytearray()
    for chunk in chunks:
        if head is None:
            yield chunk
            continue
        head += chunk
        at = head.find(token)
        if at >= 0:
            rest = bytes(head[at + len(token) :])
            head = None
            if rest:
                yield rest
        elif len(head) > MARK_WITHIN_BYTES + len(token):
            raise TransferError(
                f"the login shell printed more than {MARK_WITHIN_BYTES // 1024} KiB before"
                " fleet's command, or it never started"
            )


def list_remote(
    session: Connection, remote: str, cancel: threading.Event | None = None
) -> list[node.Entry]:
    """Every entry of the tree (or the one file) at `remote` on the node, symlinks not followed
    (the root itself is, when the operator names a symlink). TransferError when it is missing."""
    token = new_token()
    command = node.list_command(os.fsencode(remote), token)
    with Exec(session, command, window_bytes=1 << 20, cancel=cancel) as ex:
        try:
            listing = (bytes(chunk) for chunk in after_mark(ex.chunks(), token))
            entries = list(node.parse_listing(listing, MAX_ENTRIES, MAX_LISTING_BYTES))
        except ValueError as exc:
            raise TransferError(f"bad listing from the node: {exc}") from None
        status = ex.wait()
        if status != 0 or not entries:
            raise TransferError(f"cannot list {remote}: {ex.stderr_text() or f'exit {status}'}")
    return entries


# ------------------------------------------------------------------ pull


def pull_file(
    session: Connection,
    tree: bytes,
    rel: bytes,
    size: int,
    dir_fd: int,
    name: str,
    opts: Options,
) -> FileResult:
    """Fetch node file `rel` of the tree at `tree` (rel b"": `tree` is the file) into `name` in
    the local directory `dir_fd`: skipped when the local file's sha256 matches the node's,
    resumed from a part an earlier run left, else copied; verified before it is renamed."""
    shown = paths.shown(rel) or paths.shown(tree)
    try:
        return _pull_file(session, node.split(tree, rel), size, dir_fd, name, opts, shown)
    except TransferError as exc:
        return FileResult(shown, Action.FAILED, size, error=str(exc))
    except OSError as exc:
        return FileResult(shown, Action.FAILED, size, error=f"local: {exc.strerror or exc}")


def _pull_file(
    session: Connection,
    where: tuple[bytes, bytes, bytes],
    size: int,
    dir_fd: int,
    name: str,
    opts: Options,
    shown: str,
) -> FileResult:
    _no_directory_at(dir_fd, name)  # before a byte comes: the rename over it could only fail
    have = local.regular_size(dir_fd, name)
    if have == size:
        mine, theirs = _alongside(
            lambda: local.sha256_of(dir_fd, name)[0], lambda: _node_hash(session, *where)
        )
        if mine == theirs:
            return FileResult(shown, Action.SKIPPED, size, 0, mine)
    part = os.fsdecode(node.part_name(os.fsencode(name)))
    offset = local.regular_size(dir_fd, part) or 0
    offset = offset if offset <= size else 0
    if opts.dry_run:
        action = Action.WOULD_RESUME if offset else Action.WOULD_COPY
        return FileResult(shown, action, size, size - offset)
    return _retrying(
        lambda start: _pull_once(session, where, size, dir_fd, name, start, opts), offset
    )


def _no_directory_at(dir_fd: int, name: str) -> None:
    """TransferError when the local final name is a directory (not a symlink to one): a file
    cannot replace it, so nothing is fetched (a pull would move it all, then fail the rename
    and leave it whole as a part file)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise TransferError("local: a directory is in the way: nothing replaced")


def _retrying(attempt: Callable[[int], FileResult], offset: int) -> FileResult:
    """One attempt from `offset`; a mismatch after resuming means the part was from another
    version of the file (it is removed by then): start again from 0, once."""
    try:
        return attempt(offset)
    except TransferError as exc:
        if not offset or "mismatch" not in str(exc):
            raise
    return attempt(0)


def _pull_once(
    session: Connection,
    where: tuple[bytes, bytes, bytes],
    size: int,
    dir_fd: int,
    name: str,
    offset: int,
    opts: Options,
) -> FileResult:
    shown = paths.shown(where[1] + b"/" + where[2] if where[1] else where[2])
    part_of = os.fsdecode(node.part_name(os.fsencode(name)))
    hasher = local.sha256_of(dir_fd, part_of, offset)[1] if offset else hashlib.sha256()
    part = local.PartFile(dir_fd, name, fresh=offset == 0)
    try:
        token = new_token()
        command = node.read_command(*where, offset, size, token)
        moved, theirs = _receive(session, (command, token), size - offset, part, hasher, opts)
    except BaseException:
        if offset == 0 and part.written == 0:
            part.discard()  # nothing came: leave no empty part behind
        else:
            part.close()  # kept: the next run resumes from it
        raise
    _verify(part, hasher.hexdigest(), theirs, offset + moved, size)
    action = Action.RESUMED if offset else Action.COPIED
    return FileResult(shown, action, size, moved, hasher.hexdigest())


def _verify(part: local.PartFile, ours: str, theirs: str | None, got: int, size: int) -> None:
    """Rename the part into place when it is whole and its sha256 is the node's; else remove
    it and raise."""
    if got != size or theirs != ours:
        part.discard()
        raise TransferError(
            f"sha256 mismatch: node {(theirs or '-')[:12]}, received {ours[:12]} "
            f"({got} of {size} bytes; changed while sent?)"
        )
    part.commit()


def _receive(
    session: Connection,
    run: tuple[bytes, bytes],
    expected: int,
    part: local.PartFile,
    hasher: Any,
    opts: Options,
) -> tuple[int, str]:
    """Run a read command (`run`: it and its start mark) into the part file: (bytes received,
    the node's sha256). (Hashing and writing on a thread of their own, overlapped with
    receiving, measured no faster here.)"""
    command, token = run
    moved = 0
    with _stream(session, command, opts, expected) as ex:
        for chunk in after_mark(ex.chunks(), token):
            if moved + len(chunk) > expected:
                raise TransferError("the file grew on the node while it was sent")
            opts.limiter.take(len(chunk))
            hasher.update(chunk)
            part.write(chunk)
            moved += len(chunk)
            opts.on_bytes(len(chunk))
        status = ex.wait()
        if status != 0:
            raise TransferError(_fail_text(status, ex))
        found = node.SHA_RE.search(bytes(ex.stderr))
    if found is None:
        raise TransferError("the node sent no sha256")
    return moved, found.group(1).decode()


@dataclass(frozen=True)
class TreePlan:
    """What a pull of one REMOTE will do on one host, from the node's listing."""

    files: tuple[node.Entry, ...]
    dirs: tuple[node.Entry, ...]
    refused: tuple[FileResult, ...]

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files)


PART = "an unfinished transfer's part file (not moved)"


def plan_pull(entries: list[node.Entry]) -> TreePlan:
    """Split a listing into files to fetch, directories to make, and what is refused (node
    symlinks, devices, names that are not safe to write, fleet's part files in the tree)."""
    files, dirs, refused = [], [], []
    for i, e in enumerate(entries):
        # An empty name is the root itself, listed first; anywhere else it is no name at all.
        if (e.rel or i > 0) and not paths.is_safe(e.rel):
            refused.append(FileResult(paths.shown(e.rel), Action.REFUSED, error="unsafe name"))
        elif e.kind == "f" and e.rel and node.is_part(e.rel.rpartition(b"/")[2]):
            refused.append(FileResult(paths.shown(e.rel), Action.REFUSED, e.size, error=PART))
        elif e.kind == "f":
            files.append(e)
        elif e.kind == "d":
            dirs.append(e)
        else:
            what = "symlink (not followed)" if e.kind == "l" else f"not a regular file ({e.kind})"
            refused.append(FileResult(paths.shown(e.rel), Action.REFUSED, e.size, error=what))
    if dirs and not dirs[0].rel:
        dirs = dirs[1:]  # the root itself
    return TreePlan(tuple(files), tuple(dirs), tuple(refused))


def pull_tree(
    session: Connection, remote: str, dest: Path, opts: Options, plan: TreePlan | None = None
) -> Iterator[FileResult]:
    """Pull REMOTE (a file or a tree) to dest/<name of REMOTE>: one result per file, in listing
    order. `dest` is LOCALDIR/HOST; nothing is written outside it."""
    top = paths.remote_name(remote)
    plan = plan or plan_pull(list_remote(session, remote, opts.cancel))
    yield from plan.refused
    try:
        base_fd = local.open_base(dest, create=not opts.dry_run)  # a dry run makes no directory
    except OSError as exc:  # it cannot be made, or it is a symlink (never followed)
        link = exc.errno in (errno.ELOOP, errno.ENOTDIR) and dest.is_symlink()
        why = "a symlink (not followed)" if link else exc.strerror or exc
        yield FileResult(remote, Action.FAILED, error=f"local: {dest}: {why}")
        return
    if base_fd is None:  # nothing there yet: every file would be copied
        for entry in plan.files:
            yield FileResult(
                paths.shown(entry.rel) or remote, Action.WOULD_COPY, entry.size, entry.size
            )
        return
    try:
        tree = os.fsencode(remote)
        is_file = len(plan.files) == 1 and not plan.files[0].rel
        for entry in plan.dirs:
            if not opts.dry_run:
                try:
                    os.close(local.open_dir(base_fd, (top, *paths.local_parts(entry.rel))))
                except OSError as exc:  # its files fail on their own, each saying why
                    error = f"local: {exc.strerror or exc}"
                    yield FileResult(paths.shown(entry.rel), Action.FAILED, error=error)

        def job(entry: node.Entry) -> tuple[int, Callable[[], FileResult]]:
            parts = (top,) if is_file else (top, *paths.local_parts(entry.rel))
            return entry.size, functools.partial(
                _pull_into, session, tree, entry, base_fd, parts, opts
            )

        if opts.dry_run or is_file:  # each file looked at on its own, nothing written
            yield from in_flight(map(job, plan.files), opts.cancel, opts.together_below)
            return

        def alone(entry: node.Entry) -> Callable[[], FileResult]:
            return job(entry)[1]

        def batch(entries: list[node.Entry]) -> list[FileResult] | None:
            return _pull_batch(session, tree, entries, (base_fd, top), opts, alone)

        listed = [(entry, entry.size) for entry in plan.files]
        limits = (getmany.MAX_FILES, getmany.MAX_BYTES)
        yield from _by_batch(listed, opts, alone, batch, limits)
    finally:
        os.close(base_fd)


def _by_batch(
    files: Iterable[tuple[_T, int]],
    opts: Options,
    alone: Callable[[_T], Callable[[], FileResult]],
    batch: Callable[[list[_T]], list[FileResult] | None],
    limits: tuple[int, int],
) -> Iterator[FileResult]:
    """Each file's result, in order, for a push or a pull of a tree: a file from
    opts.together_below on moved `alone`; smaller consecutive ones by `batch` (at most `limits`:
    files, bytes), which returns None when the node has no python3, after which this host's
    small files move alone, FILES_IN_FLIGHT at once. Cancel ends a batch in flight too."""
    batched = True  # until the node turns out to have no python3
    for group in _batches(files, opts.together_below, *limits):
        if opts.cancel.is_set():
            return
        items = [item for item, _ in group]
        if len(group) == 1 and group[0][1] >= opts.together_below:
            yield alone(items[0])()  # a larger file: alone, as before
            continue
        results = batch(items) if batched else None
        batched = results is not None
        if results is None:  # no python3 on the node: the per-file path
            jobs = ((size, alone(item)) for item, size in group)
            results = list(in_flight(jobs, opts.cancel, opts.together_below))
        yield from results


def _pull_batch(
    session: Connection,
    tree: bytes,
    entries: list[node.Entry],
    where: tuple[int, str],
    opts: Options,
    alone: Callable[[node.Entry], Callable[[], FileResult]],
) -> list[FileResult] | None:
    """Pull small files of the tree with one node command (fleet.transfer.getmany): the node's
    python3 reads each as read_command would and sends it framed; each is then skipped when
    the local file already has its sha256, else written to a fresh part, verified and renamed
    as _pull_once does. One result per entry, in order; None when the node has no python3
    (nothing read: the caller pulls them one by one). `where`: LOCALDIR/HOST's descriptor and
    the name REMOTE gets under it; `alone`: an entry's per-file pull."""
    base_fd, top = where
    results: list[FileResult | None] = [None] * len(entries)
    # (entry, its local path under LOCALDIR/HOST) per request. Each directory is made and
    # checked now, and opened again only to land its file: a batch of 64 files on each of 64
    # hosts holds no 4,096 descriptors at once.
    asked: list[tuple[int, tuple[str, ...]]] = []
    wanted: list[tuple[bytes, bytes, int]] = []
    for i, entry in enumerate(entries):
        shown = paths.shown(entry.rel)
        parts = (top, *paths.local_parts(entry.rel))
        try:
            os.close(local.open_dir(base_fd, parts[:-1]))
        except OSError as exc:
            error = f"local: {exc.strerror or exc}"
            results[i] = FileResult(shown, Action.FAILED, entry.size, error=error)
            continue
        asked.append((i, parts))
        _, sub, base = node.split(tree, entry.rel)
        wanted.append((sub, base, entry.size))
    if asked:
        token = os.urandom(getmany.TOKEN_BYTES)
        try:
            stdin = getmany.request(tree, wanted, token)
        except ValueError:  # a name too long to frame: these go one by one
            jobs = ((entry.size, alone(entry)) for entry in entries)
            return list(in_flight(jobs, opts.cancel, opts.together_below))
        sizes = [size for _, _, size in wanted]
        reader = getmany.Reader(sizes, token)
        done = _fetch_batch(session, stdin, reader, (base_fd, [p for _, p in asked]), opts)
        if done is None:
            return None
        for n, (i, _) in enumerate(asked):
            results[i] = _named(done[n], paths.shown(entries[i].rel))
    return [r for r in results if r is not None]


def _named(result: FileResult, shown: str) -> FileResult:
    return FileResult(
        shown, result.action, result.size, result.moved_bytes, result.sha256, result.error
    )


def _fetch_batch(
    session: Connection,
    stdin: bytes,
    reader: getmany.Reader,
    where: tuple[int, list[tuple[str, ...]]],
    opts: Options,
) -> list[FileResult] | None:
    """Run one getmany batch and land each answer as it completes: a result per request, in
    order (names filled in by the caller); None when the node has no python3. `where`: the
    base directory's descriptor and each request's local path under it."""
    base_fd, asked = where
    done: list[FileResult] = []
    broken = ""
    # Cancel ends a batch in flight too (a node that hangs mid-batch never answers): what it
    # landed here is whole (each answer lands only once it is complete), the rest is not there.
    with Exec(session, getmany.command(), window_bytes=256 * 1024, cancel=opts.cancel) as ex:
        opts.limiter.take(len(stdin))
        ex.send(stdin)
        ex.end_input()
        for chunk in ex.chunks():
            for answer in reader.feed(chunk):  # none once the stream broke: drained, not read
                size = reader.sizes[answer.number]
                done.append(_land(answer, size, base_fd, asked[answer.number], opts))
        status = ex.wait()
    if isinstance(reader.broken, getmany.Grew):
        size = reader.sizes[reader.broken.index]
        done.append(FileResult("", Action.FAILED, size, error=str(reader.broken)))
        broken = "no result from the node: its answer stopped at a file that grew"
    elif reader.broken is not None:
        broken = f"no result from the node: {reader.broken}"
    if status == getmany.NO_PYTHON and not done:
        return None
    if len(done) < len(asked):
        why = broken or "no result from the node: " + _fail_text(status, ex)
        for n in range(len(done), len(asked)):
            done.append(FileResult("", Action.FAILED, reader.sizes[n], error=why))
    return done


def _land(
    answer: getmany.Answer, size: int, base_fd: int, parts: tuple[str, ...], opts: Options
) -> FileResult:
    """One answered file on the bastion, by _pull_file's rules: skipped when the local file
    is a regular file with the node's sha256 (never rewritten), else written to a fresh part,
    hashed as written, verified (size and sha256) and renamed; else failed. `parts`: its path
    under `base_fd`, each directory opened without following a symlink."""
    if answer.data is None:
        return FileResult("", Action.FAILED, size, error=answer.error)
    try:
        dir_fd = local.open_dir(base_fd, parts[:-1])
    except OSError as exc:
        return FileResult("", Action.FAILED, size, error=f"local: {exc.strerror or exc}")
    try:
        return _land_in(answer.data, answer.sha256, size, dir_fd, parts[-1], opts)
    finally:
        os.close(dir_fd)


def _land_in(
    data: bytes, theirs: str, size: int, dir_fd: int, name: str, opts: Options
) -> FileResult:
    """_land in the file's own directory."""
    try:
        _no_directory_at(dir_fd, name)
        have = local.regular_size(dir_fd, name)
        if have == size and local.sha256_of(dir_fd, name)[0] == theirs:
            return FileResult("", Action.SKIPPED, size, 0, theirs)
        part = local.PartFile(dir_fd, name, fresh=True)
        try:
            hasher = hashlib.sha256()
            opts.limiter.take(len(data))
            hasher.update(data)
            part.write(data)
            opts.on_bytes(len(data))
        except BaseException:
            part.discard()
            raise
        _verify(part, hasher.hexdigest(), theirs, len(data), size)
    except TransferError as exc:
        return FileResult("", Action.FAILED, size, error=str(exc))
    except OSError as exc:
        return FileResult("", Action.FAILED, size, error=f"local: {exc.strerror or exc}")
    return FileResult("", Action.COPIED, size, len(data), hasher.hexdigest())


def _pull_into(
    session: Connection,
    tree: bytes,
    entry: node.Entry,
    base_fd: int,
    parts: tuple[str, ...],
    opts: Options,
) -> FileResult:
    shown = paths.shown(entry.rel) or paths.shown(tree)
    try:
        dir_fd = (
            local.open_dir(base_fd, parts[:-1]) if not opts.dry_run else _peek(base_fd, parts[:-1])
        )
    except OSError as exc:
        return FileResult(shown, Action.FAILED, entry.size, error=f"local: {exc.strerror or exc}")
    if dir_fd is None:
        return FileResult(shown, Action.WOULD_COPY, entry.size, entry.size)
    try:
        return pull_file(session, tree, entry.rel, entry.size, dir_fd, parts[-1], opts)
    finally:
        os.close(dir_fd)


def _peek(base_fd: int, parts: tuple[str, ...]) -> int | None:
    """For a dry run: the existing directory, or None when it does not exist yet."""
    try:
        return local.open_dir(base_fd, parts, create=False)
    except FileNotFoundError:
        return None


# ------------------------------------------------------------------ push


def push_file(session: Connection, source: Path, remote: str, opts: Options) -> FileResult:
    """Send local file `source` to `remote` on the node: skipped when the node's file has its
    sha256, resumed from a part an earlier push left, else copied; written under a part name,
    fsynced, verified on the node, then renamed. `source` must be a regular file (its last
    component is not followed; a FIFO or device fails, never blocks)."""
    return _push_opened(session, lambda: local.open_regular(source), remote, opts, str(source))


def _push_opened(
    session: Connection, opener: Callable[[], int], remote: str, opts: Options, shown: str
) -> FileResult:
    """push_file for the file `opener` opens (OSError, a per-file failure, when it cannot)."""
    try:
        fd = opener()
    except OSError as exc:
        return FileResult(shown, Action.FAILED, error=f"local: {exc.strerror or exc}")
    try:
        st = os.fstat(fd)
        try:
            return _push_file(session, fd, st, remote, opts, shown)
        except TransferError as exc:
            return FileResult(shown, Action.FAILED, st.st_size, error=str(exc))
        except OSError as exc:
            return FileResult(
                shown, Action.FAILED, st.st_size, error=f"local: {exc.strerror or exc}"
            )
    finally:
        os.close(fd)


def _push_file(
    session: Connection, fd: int, st: os.stat_result, remote: str, opts: Options, shown: str
) -> FileResult:
    directory, base = os.path.split(os.fsencode(remote))
    directory = directory or b"."
    probe = node.probe_command(directory, base, st.st_size, hash_final=False)
    status, out, err = run_small(session, probe)
    if status != 0:
        raise TransferError(f"cannot look at {remote} on the node: {err or f'exit {status}'}")
    found = node.parse_probe(out.strip())
    if found.is_dir:  # before a byte is sent: the rename over it could only fail
        raise TransferError(
            f"{remote} is a directory on the node (to push into it, end REMOTE with /)"
        )
    if found.blocked:  # and a dry run says so, as the write's mkdir would
        raise TransferError(
            f"cannot make {os.fsdecode(directory)} on the node: a file is in the way, or its"
            " parent is not writable"
        )
    if found.final_size == st.st_size:  # only now: a file to copy is hashed as it is sent
        try:
            digest, theirs = _alongside(
                lambda: _hash_fd(fd, st.st_size)[0],
                lambda: _node_hash(session, directory, b"", base),
            )
        except TransferError:
            pass  # the node's file cannot be read (or is no longer a file): it is replaced
        else:
            if theirs == digest:
                return FileResult(shown, Action.SKIPPED, st.st_size, 0, digest)
    part_size = found.part_size
    offset = part_size if part_size is not None and 0 < part_size <= st.st_size else 0
    if opts.dry_run:
        action = Action.WOULD_RESUME if offset else Action.WOULD_COPY
        return FileResult(shown, action, st.st_size, st.st_size - offset)
    where = (directory, base, st.st_size, stat.S_IMODE(st.st_mode))
    return _retrying(lambda start: _push_once(session, fd, where, start, opts, shown), offset)


def _hash_fd(fd: int, limit: int) -> tuple[str, Any]:
    """(hex digest, hasher) of the file's first `limit` bytes."""
    hasher = hashlib.sha256()
    offset = 0
    while offset < limit and (
        chunk := os.pread(fd, min(local.HASH_READ_BYTES, limit - offset), offset)
    ):
        hasher.update(chunk)
        offset += len(chunk)
    return hasher.hexdigest(), hasher


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _push_once(
    session: Connection,
    fd: int,
    where: tuple[bytes, bytes, int, int],
    offset: int,
    opts: Options,
    shown: str,
) -> FileResult:
    """Send the file from `offset`, hashing it whole as it goes (the part before `offset` is
    read here, not sent); the node writes and hashes the part, and it is renamed only when the
    node's sha256 is ours and neither file changed meanwhile."""
    directory, base, size, mode = where
    stamp = _stamp(os.fstat(fd))
    if opts.route_for(size) is not None and not opts.limiter.buckets:
        theirs, part_stamp, moved, digest = _push_direct(fd, (directory, base, size), offset, opts)
    else:
        theirs, part_stamp, moved, digest = _push_stream(session, fd, where, offset, opts)
    if _stamp(os.fstat(fd)) != stamp:
        _discard(session, directory, base)
        raise TransferError("the local file changed while it was sent")
    _commit(session, (directory, base, mode), digest, theirs, part_stamp)
    action = Action.RESUMED if offset else Action.COPIED
    return FileResult(shown, action, size, moved, digest)


def _push_direct(
    fd: int, where: tuple[bytes, bytes, int], offset: int, opts: Options
) -> tuple[str, bytes, int, str]:
    """ssh reads the file itself from `offset` (no copy through this process; no cap to pace)
    while this process hashes it whole; progress is ssh's offset in the shared open file.
    Returns (node's sha256, part stamp, bytes moved, our sha256)."""
    assert opts.route is not None
    directory, base, size = where
    os.lseek(fd, offset, os.SEEK_SET)
    command = node.write_command(directory, base, offset, size)
    with Pipe(opts.route.argv(command), cancel=opts.cancel, read_bytes=4096, stdin=fd) as ex:
        digest = _hash_fd(fd, size)[0]
        reported = offset
        while ex.running(PROGRESS_POLL_S):
            position = min(size, os.lseek(fd, 0, os.SEEK_CUR))
            opts.on_bytes(position - reported)
            reported = position
        for _ in ex.chunks():
            pass
        theirs, part_stamp = _written(ex)
        opts.on_bytes(size - reported)
    return theirs, part_stamp, size - offset, digest


def _push_stream(
    session: Connection,
    fd: int,
    where: tuple[bytes, bytes, int, int],
    offset: int,
    opts: Options,
) -> tuple[str, bytes, int, str]:
    """Send the file from `offset` through this process (paced by the caps), hashing it whole
    as it goes. Returns (node's sha256, part stamp, bytes moved, our sha256)."""
    directory, base, size, _mode = where
    hasher = _hash_fd(fd, offset)[1]
    moved = 0
    buffer = bytearray(min(_buffer_bytes(opts), max(1, size - offset)))  # reused per chunk
    command = node.write_command(directory, base, offset, size)
    with _stream(session, command, opts, size - offset) as ex:
        position = offset
        while position < size and not ex.input_closed:
            count = os.preadv(fd, [buffer], position)
            if not count:
                raise TransferError("the local file shrank while it was sent")
            chunk = memoryview(buffer)[: min(count, size - position)]
            opts.limiter.take(len(chunk))
            hasher.update(chunk)
            ex.send(chunk)
            position += len(chunk)
            moved += len(chunk)
            opts.on_bytes(len(chunk))
        ex.end_input()
        for _ in ex.chunks():
            pass
        theirs, part_stamp = _written(ex)
    return theirs, part_stamp, moved, hasher.hexdigest()


def _written(ex: Exec | Pipe) -> tuple[str, bytes]:
    """A write command's outcome: (the node's sha256 of the part, the part's stamp)."""
    status = ex.wait()
    if status != 0:
        raise TransferError(_fail_text(status, ex))
    said = bytes(ex.stderr)
    found, stamp = node.SHA_RE.search(said), node.STAMP_RE.search(said)
    if found is None or stamp is None:
        raise TransferError("the node sent no sha256 for what it wrote")
    return found.group(1).decode(), stamp.group(1)


def _commit(
    session: Connection,
    where: tuple[bytes, bytes, int],
    ours: str,
    theirs: str,
    stamp: bytes,
) -> None:
    """Rename the node's part into place when its sha256 is ours; else remove it and raise."""
    directory, base, mode = where
    if theirs != ours:
        _discard(session, directory, base)
        raise TransferError(f"sha256 mismatch on the node: {theirs[:12]}, sent {ours[:12]}")
    status, _out, err = run_small(session, node.commit_command(directory, base, stamp, mode))
    if status != 0:
        reason = node.NODE_EXITS.get(status, f"exit {status}")
        raise TransferError(f"cannot rename on the node: {reason}" + (f": {err}" if err else ""))


def _discard(session: Connection, directory: bytes, base: bytes) -> None:
    run_small(session, node.discard_command(directory, base))


@dataclass(frozen=True)
class LocalTree:
    """What a push of LOCAL sends: (path under LOCAL, size) per file ("" when LOCAL is the
    file), the refused, and LOCAL's identity when listed (st_dev, st_ino): each file is opened
    again through it and what was listed only (local.open_listed), never by its full path.
    `dirs`: the directories with nothing below them to send (no file, no directory; "" is
    LOCAL itself), made on the node as they are (a file's directories come with it)."""

    root: Path
    identity: tuple[int, int]
    files: tuple[tuple[str, int], ...]
    refused: tuple[FileResult, ...]
    dirs: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)

    def open(self, rel: str) -> int:
        """A read descriptor of the listed file `rel` (local.Changed: swapped since)."""
        return local.open_listed(self.root, self.identity, rel.split("/") if rel else ())


class NotOurs(ValueError):
    """LOCAL is a symlink fleet will not follow: another user's, or a loop."""


def follow_named(source: Path) -> Path:
    """LOCAL as the operator named it, or, when that is a symlink (`latest`), what it points
    to: followed one link at a time, each only when it is the operator's own or root's, as
    the kernel's fs.protected_symlinks follows a link in /tmp (which a bastion may not turn
    on, and readlink does not ask): another user's link there could point a push at /etc."""
    for _ in range(40):  # the kernel's own limit on links followed in one lookup
        if not os.path.islink(source):
            return Path(os.path.realpath(source))
        owner = os.lstat(source).st_uid
        if owner not in (0, os.geteuid()):
            raise NotOurs(
                f"{source}: a symlink of uid {owner}'s, not yours or root's: not followed"
            )
        source = Path(os.path.dirname(source) or ".") / os.readlink(source)
    raise NotOurs(f"{source}: too many levels of symbolic links")


def walk_local(source: Path) -> LocalTree:
    """The regular files of LOCAL (itself, or under it), symlinks, FIFOs and devices refused.
    Every directory is opened from LOCAL's descriptor one component at a time with O_NOFOLLOW
    and listed through its own descriptor, so the walk never lists through a symlink either.
    LOCAL itself, when the operator named a symlink (`latest`), is what it points to: the tree
    is walked and read at that real path (its name on the node is still the one given)."""
    source = follow_named(source)
    st = os.lstat(source)
    identity = (st.st_dev, st.st_ino)
    if stat.S_ISREG(st.st_mode):
        return LocalTree(source, identity, (("", st.st_size),), ())
    try:
        root_fd = os.open(source, local.DIR_FLAGS)
    except OSError:
        what = "symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file or directory"
        refused = FileResult(str(source), Action.REFUSED, error=what)
        return LocalTree(source, identity, (), (refused,))
    try:
        st = os.fstat(root_fd)
        files, refused_files, empty = _walk_from(root_fd)
    finally:
        os.close(root_fd)
    identity = (st.st_dev, st.st_ino)
    return LocalTree(source, identity, tuple(files), tuple(refused_files), tuple(empty))


def _walk_from(root_fd: int) -> tuple[list[tuple[str, int]], list[FileResult], list[str]]:
    """(files, refused, empty directories) of the tree at `root_fd`, depth first in name
    order, as os.walk listed them; a directory that vanishes meanwhile is skipped, one swapped
    is refused. An empty directory is one with no file to send and no directory in it."""
    files: list[tuple[str, int]] = []
    refused: list[FileResult] = []
    empty: list[str] = []
    pending: list[tuple[str, ...]] = [()]
    while pending:
        parts = pending.pop()
        try:
            fd = local.open_dir(root_fd, parts, create=False)
        except FileNotFoundError:
            continue
        except OSError as exc:
            refused.append(FileResult("/".join(parts), Action.REFUSED, error=_why(exc)))
            continue
        try:
            with os.scandir(fd) as listing:
                entries = sorted(listing, key=lambda e: e.name)
            subdirs = []
            listed = len(files)
            for entry in entries:
                rel = "/".join((*parts, entry.name))
                try:
                    found = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(found.st_mode) and node.is_part(os.fsencode(entry.name)):
                    refused.append(FileResult(rel, Action.REFUSED, found.st_size, error=PART))
                elif stat.S_ISREG(found.st_mode):
                    files.append((rel, found.st_size))
                elif stat.S_ISDIR(found.st_mode):
                    subdirs.append((*parts, entry.name))
                else:
                    refused.append(
                        FileResult(rel, Action.REFUSED, error="symlink or not a regular file")
                    )
            if not subdirs and len(files) == listed:
                empty.append("/".join(parts))
        finally:
            os.close(fd)
        pending.extend(reversed(subdirs))
    return files, refused, empty


def _why(exc: OSError) -> str:
    if exc.errno in local.SWAPPED_ERRNOS:
        return "symlink or not a regular file"
    return f"cannot list: {exc.strerror or exc}"


def push_tree(
    session: Connection, tree: LocalTree, remote: str, opts: Options
) -> Iterator[FileResult]:
    """Push every file of a LocalTree under REMOTE (a file: REMOTE is its path). A file is
    read only through what the walk listed: one swapped since (a directory for a symlink, a
    file for a FIFO) fails on its own, as a file that cannot be read does."""
    yield from tree.refused
    if not opts.dry_run:
        yield from _make_dirs(session, [(rel, _under(remote, rel)) for rel in tree.dirs])

    def small(rel: str) -> _Small:
        target = _under(remote, rel)
        shown, opener = rel or str(tree.root), functools.partial(tree.open, rel)
        alone = functools.partial(_push_opened, session, opener, target, opts, shown)
        return _Small(shown, target, opener, alone)

    def alone(rel: str) -> Callable[[], FileResult]:
        return small(rel).alone

    if opts.dry_run:  # each file probed on its own, nothing written
        jobs = ((size, alone(rel)) for rel, size in tree.files)
        yield from in_flight(jobs, opts.cancel, opts.together_below)
        return

    def batch(rels: list[str]) -> list[FileResult] | None:
        return _push_batch(session, [small(rel) for rel in rels], opts)

    limits = (putmany.MAX_FILES, putmany.MAX_BYTES)
    yield from _by_batch(tree.files, opts, alone, batch, limits)


def _under(remote: str, rel: str) -> str:
    """The node path of `rel` under REMOTE ("": REMOTE itself)."""
    return remote if not rel else remote.rstrip("/") + "/" + rel


MKDIR_BYTES = 32 * 1024  # of names in one node command (sh -c's one argument: at most 128 KiB)


def _make_dirs(session: Connection, dirs: list[tuple[str, str]]) -> Iterator[FileResult]:
    """Make LOCAL's empty directories on the node ((shown, node path) each), several per node
    command; a failure for each that cannot be made (a file in the way), each tried alone."""
    group: list[tuple[str, str]] = []
    size = 0
    for i, (shown, target) in enumerate(dirs):
        group.append((shown, target))
        size += len(os.fsencode(target))
        if i + 1 < len(dirs) and len(group) < putmany.MAX_FILES and size < MKDIR_BYTES:
            continue
        command = node.mkdir_command([os.fsencode(t) for _, t in group])
        if run_small(session, command)[0] != 0:
            for alone_shown, alone in group:
                status, _out, err = run_small(session, node.mkdir_command([os.fsencode(alone)]))
                if status != 0:
                    why = f"cannot make the directory on the node: {err or f'exit {status}'}"
                    yield FileResult(alone_shown or alone, Action.FAILED, error=why)
        group, size = [], 0


def _batches(
    files: Iterable[tuple[_T, int]], small_below: int, max_files: int, max_bytes: int
) -> Iterator[list[tuple[_T, int]]]:
    """Consecutive files below `small_below` in groups of at most `max_files` files and
    `max_bytes` of content; each larger file a group of its own."""
    group: list[tuple[_T, int]] = []
    content = 0
    for rel, size in files:
        if size >= small_below:
            if group:
                yield group
            group, content = [], 0
            yield [(rel, size)]
            continue
        if group and (len(group) >= max_files or content + size > max_bytes):
            yield group
            group, content = [], 0
        group.append((rel, size))
        content += size
    if group:
        yield group


@dataclass(frozen=True)
class _Small:
    """A small file of a batch: shown name, its path on the node, how to open it here."""

    shown: str
    target: str
    opener: Callable[[], int]
    alone: Callable[[], FileResult]  # the per-file path, for one that is no longer small


def _push_batch(session: Connection, items: list[_Small], opts: Options) -> list[FileResult] | None:
    """Push small files with one node command (fleet.transfer.putmany): each hashed here
    first, sent with its digest, then skipped, or written, verified and committed by the
    node's python3 as the sh commands would. One result per item, in order; None when the
    node has no python3 (nothing written: the caller moves them one by one)."""
    results: list[FileResult | None] = [None] * len(items)
    sent: list[tuple[int, str, int, str]] = []  # (item, node path, size, sha256) per file sent
    grown: list[int] = []  # items no longer small: moved alone after the batch
    with contextlib.ExitStack() as stack:
        ex: Exec | None = None  # started with the first file that could be read here
        for i, item in enumerate(items):
            read = _read_small(item, opts.together_below)
            if read is None:
                grown.append(i)
                continue
            if isinstance(read, FileResult):
                results[i] = read
                continue
            if ex is None:
                # Cancel ends a batch in flight too (a node that hangs mid-batch never
                # answers): the node commits a file only once its digest checked, and a cut
                # stream commits nothing more.
                ex = stack.enter_context(
                    Exec(session, putmany.command(), window_bytes=256 * 1024, cancel=opts.cancel)
                )
            head, data, digest = read
            opts.limiter.take(len(head) + len(data))
            ex.send(head)
            ex.send(data)
            sent.append((i, item.target, len(data), digest))
        if ex is None:
            return [r if r is not None else items[i].alone() for i, r in enumerate(results)]
        ex.send(putmany.END)
        ex.end_input()
        out = bytearray()
        for chunk in ex.chunks():
            out += chunk[: max(0, 65536 - len(out))]
        status = ex.wait()
    if status == putmany.NO_PYTHON:
        return None
    found = putmany.parse(bytes(out))
    for n, (i, target, size, ours) in enumerate(sent):
        shown = items[i].shown
        said = found.get(n)
        if said is None:
            results[i] = FileResult(
                shown,
                Action.FAILED,
                size,
                error="no result from the node: " + _fail_text(status, ex),
            )
        elif said.outcome in ("copied", "skipped") and said.text != ours:
            # the node's program says copied or skipped only with the digest it was sent: any
            # other is not its answer (a login shell's line, a lie), so not a success
            error = f"sha256 mismatch on the node: {said.text[:12] or '-'}, sent {ours[:12]}"
            results[i] = FileResult(shown, Action.FAILED, size, error=error)
        elif said.outcome == "copied":
            opts.on_bytes(size)
            results[i] = FileResult(shown, Action.COPIED, size, size, said.text)
        elif said.outcome == "skipped":
            results[i] = FileResult(shown, Action.SKIPPED, size, 0, said.text)
        elif said.outcome == "isdir":
            error = f"{target} is a directory on the node (to push into it, end REMOTE with /)"
            results[i] = FileResult(shown, Action.FAILED, size, error=error)
        else:
            results[i] = FileResult(shown, Action.FAILED, size, error=said.text)
    for i in grown:
        results[i] = items[i].alone()
    return [r for r in results if r is not None]


def _read_small(item: _Small, small_below: int) -> tuple[bytes, bytes, str] | FileResult | None:
    """(header, bytes, their sha256 in hex) of one small file, read and hashed through the
    descriptor the walk listed; a FileResult (failed) when it cannot be read, changed while it
    was read, or its name cannot be framed; None when it is no longer below `small_below` (it
    grew)."""
    try:
        fd = item.opener()
    except OSError as exc:
        return FileResult(item.shown, Action.FAILED, error=f"local: {exc.strerror or exc}")
    try:
        st = os.fstat(fd)
        if st.st_size >= small_below:
            return None
        stamp = _stamp(st)
        data = _read_all(fd, st.st_size)
        digest = hashlib.sha256(data).digest()
        if len(data) != st.st_size or _stamp(os.fstat(fd)) != stamp:
            return FileResult(
                item.shown, Action.FAILED, st.st_size,
                error="the local file changed while it was sent",
            )  # fmt: skip
    except OSError as exc:
        return FileResult(item.shown, Action.FAILED, error=f"local: {exc.strerror or exc}")
    finally:
        os.close(fd)
    directory, base = os.path.split(os.fsencode(item.target))
    if len(directory) > putmany.MAX_DIRECTORY or len(base) > putmany.MAX_NAME:
        return FileResult(item.shown, Action.FAILED, st.st_size, error="name too long")
    head = putmany.frame(directory or b".", base, len(data), stat.S_IMODE(st.st_mode), digest)
    return head, data, digest.hex()


def _read_all(fd: int, size: int) -> bytes:
    """The file's first `size` bytes and one more if it grew (a short read: it shrank)."""
    parts = []
    offset = 0
    while offset <= size:
        chunk = os.pread(fd, size + 1 - offset, offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
    return b"".join(parts)


def in_flight(
    jobs: Iterable[tuple[int, Callable[[], FileResult]]],
    cancel: threading.Event,
    together_below: int = SMALL_FILE_BYTES,
) -> Iterator[FileResult]:
    """Each job's result, in the jobs' order: (size, move one file) pairs, files under
    `together_below` up to FILES_IN_FLIGHT at once, each larger one alone, once those before it
    are done. Stops taking jobs once `cancel` is set (those running see it too)."""
    running: deque[Future[FileResult]] = deque()
    with ThreadPoolExecutor(FILES_IN_FLIGHT, thread_name_prefix="fleet-file") as pool:
        for size, move in jobs:
            if cancel.is_set():
                break
            if size >= together_below:
                while running:
                    yield running.popleft().result()
                yield move()
                continue
            if len(running) >= FILES_IN_FLIGHT:
                yield running.popleft().result()
            running.append(pool.submit(move))
        while running:
            yield running.popleft().result()


# ------------------------------------------------------------------ node to node


def relay_file(
    source: Connection, source_path: str, target: Connection, target_path: str, opts: Options
) -> FileResult:
    """Stream one file node -> bastion -> node without touching the bastion's disk: the source's
    sha256 first, then the bytes, hashed in passing and verified again on the target before
    the target renames its part file. A target file already there with the source's sha256 is
    skipped (a rerun resumes file by file); a dry run reads both ends and moves nothing.
    (For consolidating checkpoint shards.)"""
    token = new_token()
    size_status, out, err = run_small(
        source, node.start_mark(token) + b"stat -L -c %s -- " + node.q(os.fsencode(source_path))
    )
    size = stat_size(out, token) if size_status == 0 else None
    if size is None:
        return FileResult(source_path, Action.FAILED, error=f"cannot stat on the source: {err}")
    try:
        return _relay(source, source_path, target, target_path, size, opts)
    except TransferError as exc:
        return FileResult(source_path, Action.FAILED, size, error=str(exc))


def stat_size(out: bytes, token: bytes) -> int | None:
    """The size `stat -c %s` printed after the start mark `token` (a login shell that talks
    prints first); None when there is none."""
    _, found, after = out.rpartition(token)
    return int(after.strip()) if found and is_digits(after.strip()) else None


def _relay(
    source: Connection,
    source_path: str,
    target: Connection,
    target_path: str,
    size: int,
    opts: Options,
) -> FileResult:
    digest = remote_sha256(source, source_path)
    tree, sub, base = node.split(os.fsencode(source_path), b"")
    directory, tbase = os.path.split(os.fsencode(target_path))
    status, out, _err = run_small(target, node.probe_command(directory or b".", tbase, size))
    found = node.parse_probe(out.strip() if status == 0 else b"")
    if found.final_size == size and found.final_sha == digest:
        return FileResult(source_path, Action.SKIPPED, size, 0, digest)
    if found.is_dir:
        return FileResult(
            source_path, Action.FAILED, size, error=f"{target_path} is a directory on the target"
        )
    if opts.dry_run:
        return FileResult(source_path, Action.WOULD_COPY, size, 0, digest)
    target_dir = directory or b"."
    hasher = hashlib.sha256()
    moved = 0
    write = node.write_command(target_dir, tbase, 0, size)  # fleet's own sessions: two hosts
    with Exec(target, write, window_bytes=opts.window_bytes, cancel=opts.cancel) as sink:
        token = new_token()
        read = node.read_command(tree, sub, base, 0, token=token)
        with Exec(source, read, window_bytes=opts.window_bytes, cancel=opts.cancel) as src:
            for chunk in after_mark(src.chunks(), token):
                if moved + len(chunk) > size:
                    raise TransferError("the source file grew while it was sent")
                opts.limiter.take(len(chunk))
                hasher.update(chunk)
                sink.send(chunk)
                moved += len(chunk)
                opts.on_bytes(len(chunk))
            status = src.wait()
            if status != 0:
                raise TransferError("source: " + _fail_text(status, src))
        sink.end_input()
        for _ in sink.chunks():
            pass
        try:
            theirs, stamp = _written(sink)
        except TransferError as exc:
            raise TransferError(f"target: {exc}") from None
    if hasher.hexdigest() != digest:
        _discard(target, target_dir, tbase)
        raise TransferError("sha256 mismatch between the source's hash and its bytes")
    _commit(target, (target_dir, tbase, 0o644), digest, theirs, stamp)
    return FileResult(source_path, Action.COPIED, size, moved, digest)
