"""What runs on a node for a transfer: small sh commands built as bytes, every value quoted.

Names from node listings are bytes (any byte but NUL and `/` in a component), so commands are
bytes too and quoted here, never formatted raw. The node needs GNU coreutils and findutils
(`dd iflag=nofollow,skip_bytes conv=nocreat`, `find -printf`, `sha256sum`, `stat -c`, `mv -T`,
`sync DIR`, `sleep 0.2`).
It hashes with `openssl dgst -sha256` where openssl is installed: coreutils' sha256sum does not
use the CPU's SHA instructions and measured 366 MB/s here against openssl's 1.8 GB/s, which capped
every transfer below scp's throughput (docs/benchmark.md, "Push and pull").

Reading never follows a node's symlink: a file is read from inside its directory after `cd -P`,
only when `pwd -P` is still inside the tree's real path (a directory swapped for a symlink to
/etc after the listing is refused), and dd opens the file itself with O_NOFOLLOW.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from fleet.core.digits import is_digits

SHA_RE = re.compile(rb"sha256=([0-9a-f]{64})")
PART_PREFIX = ".fleet-part-"
# Exit statuses of the node commands (below 64: not a shell's, not a signal's).
NOT_FOUND = 3
READ_FAILED = 4
REFUSED = 5  # a symlink, not a regular file, or outside the tree
MISMATCH = 6
INCOMPLETE = 7
CHANGED = 8
NODE_EXITS = {
    NOT_FOUND: "not found on the node",
    READ_FAILED: "read or write failed on the node",
    REFUSED: "refused: a symlink, not a regular file, or outside the tree",
    MISMATCH: "sha256 mismatch on the node",
    INCOMPLETE: "incomplete on the node",
    CHANGED: "changed on the node while it was sent",
    127: "a tool is missing on the node (needs GNU coreutils and findutils)",
}


# sh: fleet_sha reads stdin and prints `HEX ...` (openssl's `-r` format is sha256sum's).
HASHER = (
    b"if command -v openssl >/dev/null 2>&1; then fleet_sha() { openssl dgst -sha256 -r; }; "
    b"else fleet_sha() { sha256sum; }; fi; "
)
# A file below this is small: its time is the node processes that move it, not its bytes. It is
# hashed with sha256sum (openssl starts in ~3 ms of CPU, sha256sum in ~1 ms: it only pays from
# a few MB on) and written without the background fsync loop (one fsync at the end is all).
SMALL_FILE_BYTES = 1 << 20
SMALL_HASHER = b"fleet_sha() { sha256sum; }; "


def _hasher(size: int | None) -> bytes:
    """sh: define fleet_sha for a file of `size` bytes (None: not known, any size)."""
    return SMALL_HASHER if size is not None and size < SMALL_FILE_BYTES else HASHER


def q(value: bytes | str) -> bytes:
    """One shell word, single-quoted: the node's sh reads it back byte for byte."""
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    return b"'" + raw.replace(b"'", b"'\\''") + b"'"


def _arg_path(path: bytes) -> bytes:
    """A path safe as a command argument: `-x` would read as an option."""
    return b"./" + path if path.startswith(b"-") else path


@dataclass(frozen=True)
class Entry:
    """One node-side listing record: kind (find's %y: f d l p s c b), size, name under the root
    (b"" for the root itself)."""

    kind: str
    size: int
    rel: bytes


def start_mark(token: bytes) -> bytes:
    """sh: print `token` on stdout before anything else, so what the login shell printed
    before the command (a ~/.bashrc banner) is told from the command's own bytes and skipped
    (files.after_mark); b"" without a token."""
    return b"printf '%s' " + q(token) + b"; " if token else b""


def list_command(root: bytes, token: bytes = b"") -> bytes:
    """List the tree at `root` (the root itself followed if it is a symlink, nothing below it):
    `KIND SIZE NAME\\0` per entry, after `token` (start_mark)."""
    return start_mark(token) + b"LC_ALL=C find -H " + q(_arg_path(root)) + b" -printf '%y %s %P\\0'"


def parse_listing(
    chunks: Iterator[bytes], max_entries: int, max_bytes: int = 1 << 62
) -> Iterator[Entry]:
    """Records from list_command's output, as they arrive; a record that is not KIND SIZE NAME
    ends the listing with ValueError, and so do more than `max_entries` records or `max_bytes`
    in all (the caller keeps what it lists: 100,000 names of 8 KiB each would be 800 MB)."""
    buf = b""
    count = total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > max_bytes:
            raise ValueError(f"more than {max_bytes // (1 << 20)} MiB of names")
        buf += chunk
        *records, buf = buf.split(b"\0")
        for record in records:
            count += 1
            if count > max_entries:
                raise ValueError(f"more than {max_entries} entries")
            yield _entry(record)
        if len(buf) > 8192:
            raise ValueError("a listing record longer than 8 KiB")
    if buf:
        raise ValueError("the listing ended mid-record")


def _entry(record: bytes) -> Entry:
    kind, _, rest = record.partition(b" ")
    size, _, rel = rest.partition(b" ")
    if len(kind) != 1 or not is_digits(size):
        raise ValueError("a listing record that is not KIND SIZE NAME")
    return Entry(kind.decode("ascii"), int(size), rel)


def split(root: bytes, rel: bytes) -> tuple[bytes, bytes, bytes]:
    """(tree root, directory under it, file name) for `rel` in the tree at `root`; a file root
    (rel empty) is its own directory's file."""
    if rel:
        head, _, base = rel.rpartition(b"/")
        return root, head, base
    directory, base = posixpath.split(posixpath.normpath(root))
    return directory or b".", b"", base


def _enter(tree: bytes, sub: bytes, size: int | None = None) -> bytes:
    """sh: set r to the tree's real path, cd into tree/sub without trusting symlinks: after
    `cd -P` the working directory must still be under r (else exit REFUSED). `size`: the
    file's, which picks the hasher."""
    where = tree + b"/" + sub if sub else tree
    return (
        _hasher(size) + b"set -u; r=$(cd -P -- " + q(tree) + b" && pwd -P) || exit 3; "
        b"cd -P -- " + q(where) + b" || exit 3; "
        b'case "$(pwd -P)/" in "${r%/}"/*) ;; *) echo "fleet: left the tree" >&2; exit 5;; esac; '
    )


def _regular(base: bytes) -> bytes:
    """sh: exit NOT_FOUND when ./base is gone (deleted since it was listed), REFUSED unless
    it is a regular file and no symlink."""
    f = q(b"./" + base)
    return (
        b"[ -e " + f + b" ] || [ -L " + f + b" ] || "
        b'{ echo "fleet: gone from the node since it was listed" >&2; exit 3; }; '
        b"[ -f " + f + b" ] && [ ! -L " + f + b" ] || "
        b'{ echo "fleet: not a regular file" >&2; exit 5; }; '
    )


def _hash(base: bytes) -> bytes:
    """sh: h = sha256 of ./base, read with O_NOFOLLOW."""
    return (
        b"h=$(dd if=" + q(b"./" + base) + b" iflag=nofollow bs=1M status=none | fleet_sha) "
        b"|| exit 4; "
    )


def read_command(
    tree: bytes, sub: bytes, base: bytes, offset: int, size: int | None = None, token: bytes = b""
) -> bytes:
    """Send the file from `offset` on stdout, after `token` (start_mark), while a second reader
    hashes it whole (sha256 on stderr): overlapped, not a second pass after the stream. A file
    written to while it is sent changes its size, mtime or ctime: compared before and after,
    exit CHANGED. `size`: the listing's, which picks the hasher."""
    f = q(b"./" + base)
    stamp = b"stat -c '%s %.9Y %.9Z %i' -- " + f
    hashing = (
        b"{ dd if=" + f + b" iflag=nofollow bs=1M status=none | fleet_sha | "
        b"{ read -r h _; printf '\\nsha256=%s\\n' \"$h\" >&2; }; } & "
    )
    return (
        start_mark(token)
        + _enter(tree, sub, size)
        + _regular(base)
        + b"s1=$("
        + stamp
        + b") || exit 4; "
        + hashing
        + b"dd if="
        + f
        + b" iflag=nofollow,skip_bytes skip="
        + str(int(offset)).encode()
        + b" bs=1M status=none || exit 4; "
        + b"wait $!; "
        + b"s2=$("
        + stamp
        + b") || exit 4; "
        + b'[ "$s1" = "$s2" ] || { echo "fleet: changed on the node while it was sent" >&2; '
        + b"exit 8; }"
    )


def hash_command(tree: bytes, sub: bytes, base: bytes) -> bytes:
    """Print `sha256=HEX` for the file (no symlink followed)."""
    return _enter(tree, sub) + _regular(base) + _hash(base) + b"printf 'sha256=%s\\n' \"${h%% *}\""


def part_name(base: bytes) -> bytes:
    """The temporary name a file is written under beside its final name, fixed for a given
    name (so a rerun finds it and resumes) and never mistaken for a whole file."""
    import hashlib

    return PART_PREFIX.encode() + hashlib.sha256(base).hexdigest()[:16].encode()


def is_part(name: bytes) -> bool:
    """True for a file name of fleet's own part files (part_name): an unfinished transfer's
    bytes, never a whole file of a tree. A tree's part file moved as a file would also land
    on the very name the part of its whole file is written under, and be taken for it."""
    return name.startswith(PART_PREFIX.encode())


def _enter_dest(directory: bytes, size: int) -> bytes:
    """sh: create and enter the destination directory (the operator's own path); fleet_sha for
    a file of `size` bytes."""
    there = q(_arg_path(directory))
    return (
        _hasher(size)
        + b"set -u; [ -d "
        + there
        + b" ] || mkdir -p -- "
        + there
        + b" || exit 4; "
        + b"cd -P -- "
        + there
        + b" || exit 4; "
    )


def probe_command(directory: bytes, base: bytes, size: int, *, hash_final: bool = True) -> bytes:
    """What a push would find: `final=SIZE|dir|blocked|- sha=HEX|- part=SIZE|-` (the final
    file's hash only when its size matches and `hash_final`; `dir`: a directory is there,
    which a file cannot replace; `blocked`: the directory is not there and cannot be made,
    its nearest existing ancestor not a writable directory (a file in the way); the part
    left by an interrupted push)."""
    f, p = q(b"./" + base), q(b"./" + part_name(base))
    regular = b"if [ -f " + f + b" ] && [ ! -L " + f + b" ]; then fs=$(stat -c %s -- " + f + b"); "
    hashing = (
        b'if [ "$fs" = ' + str(int(size)).encode() + b" ]; then "
        b"sh=$(dd if=" + f + b" iflag=nofollow bs=1M status=none | fleet_sha); "
        b"sh=${sh%% *}; fi; "
    )
    there = q(_arg_path(directory))
    # Up to the nearest existing ancestor by parameter expansion (a name may end in newlines,
    # which $(dirname) would drop): "/" and "." always exist.
    nearest = (
        b"d=" + there + b'; while [ ! -e "$d" ] && [ ! -L "$d" ]; do '
        b'case "$d" in */*) d=${d%/*}; d=${d:-/};; *) d=.;; esac; done; '
    )
    return (
        HASHER
        + b"set -u; cd -P -- "
        + there
        + b" 2>/dev/null || { "
        + nearest
        + b'if [ -d "$d" ] && [ -w "$d" ]; then echo \'final=- sha=- part=-\'; '
        b"else echo 'final=blocked sha=- part=-'; fi; exit 0; }; "
        b"fs=-; sh=-; ps=-; " + regular + (hashing if hash_final else b"") + b"fi; "
        b"if [ -d " + f + b" ] && [ ! -L " + f + b" ]; then fs=dir; fi; "
        b"if [ -f " + p + b" ] && [ ! -L " + p + b" ]; then ps=$(stat -c %s -- " + p + b"); fi; "
        b'echo "final=$fs sha=$sh part=$ps"'
    )


def write_command(directory: bytes, base: bytes, offset: int, size: int) -> bytes:
    """Append stdin to the part file (from scratch when offset is 0), check its size, fsync it,
    and report its sha256 and stamp on stderr (`sha256=HEX`, `stamp=SIZE MTIME CTIME INODE`):
    the bastion compares the hash with its own, hashed as it sent, then renames with
    commit_command (or removes with discard_command). A short part is kept (exit INCOMPLETE) for
    the next run to resume. From scratch, the node hashes the bytes as they go to disk (tee);
    resuming, it reads the whole part back, as the earlier bytes came in another run. Unless
    the file is small, a background loop fsyncs the part while it arrives and until the
    command ends (_flusher), so the fsync has little left.
    (One reader of stdin: a pipeline that also cut the bastion's digest off the end of the
    stream cost the node a quarter more CPU.)"""
    p = q(b"./" + part_name(base))
    # umask 077 in dd's own subshell: a new part is 0600 while it arrives, not the node's
    # default 0644, so a file that lands 0600 was never readable by others on the way (nor
    # its part kept after a cut-short push); the commit gives the final mode.
    append = (
        b"(umask 077; exec dd of=" + p + b" oflag=append,nofollow conv=notrunc bs=1M status=none)"
    )
    if offset == 0:
        receive = (
            b"{ [ ! -e "
            + p
            + b" ] && [ ! -L "
            + p
            + b" ]; } || rm -f -- "
            + p
            + b" || exit 4; "
            + _no_link(p)
            + b"h=$( { { tee /dev/fd/3 | fleet_sha >&4; } 3>&1 | "
            + append
            + b" || exit 4; } 4>&1 ) || exit 4; "
        )
        check = b""
    else:
        receive = _no_link(p) + append + b" || exit 4; "
        check = _hash(part_name(base))
    return (
        _enter_dest(directory, size)
        + (_flusher(p) if size >= SMALL_FILE_BYTES else b"")
        + receive
        # One stat for the size check and the stamp (fsync and the hash below change neither).
        + b"t=$("
        + STAMP
        + p
        + b") || exit 4; s=${t%% *}; "
        + b'[ "$s" = '
        + str(int(size)).encode()
        + b" ] || "
        + b'{ echo "fleet: part holds $s bytes" >&2; exit 7; }; '
        + _fsync(p)
        + b" || exit 4; "
        + check
        + b'printf \'\\nsha256=%s\\nstamp=%s\\n\' "${h%% *}" "$t" >&2'
    )


def _flusher(p: bytes) -> bytes:
    """sh: a background loop that fsyncs the part every FLUSH_S while it arrives, so the fsync
    after it has almost nothing left (the page cache held a 1 GiB push dirty, and its final
    fsync took 0.6 s after the last byte; syncing as it goes took that to 0.03 s).

    It syncs with dd, which opens the part itself as the receiving dd does: O_NOFOLLOW (a part
    swapped for a symlink is never followed to what it names), O_NONBLOCK (a FIFO fails, never
    hangs), never created (nocreat), nothing written (count=0). It ends only once the command's
    shell is gone, within FLUSH_S: nothing kills it by a pid that could by then be another
    process's. It holds none of the command's streams, so the channel never waits for it."""
    return (
        b"( while :; do sleep " + FLUSH_S + b" 2>/dev/null || sleep 1 || exit 0; "
        b"kill -0 $$ 2>/dev/null || exit 0; [ -f " + p + b" ] && " + _fsync(p) + b"; "
        b"done ) </dev/null >/dev/null 2>&1 & "
    )


def _fsync(p: bytes) -> bytes:
    """sh: fsync the part file `p` (quoted), opened as the receiving dd opens it: no symlink
    followed, a FIFO failing instead of hanging, nothing created or written. (`sync FILE`
    follows a symlink to whatever it names.)"""
    return (
        b"dd of=" + p + b" oflag=append,nofollow,nonblock conv=notrunc,nocreat,fsync count=0 "
        b"status=none </dev/null"
    )


FLUSH_S = b"0.2"
STAMP = b"stat -c '%s %.9Y %.9Z %i' -- "
STAMP_RE = re.compile(rb"stamp=([0-9. ]{1,100})\n")


# The mode a pushed file gets: its permission bits only. Set-user-ID and set-group-ID are never
# sent: a setuid binary in a tree another user can write would otherwise become setuid root on
# every node (the sticky bit means nothing on a file). rsync does the same unless told to keep
# permissions ("special permission bits disabled"), and Ansible's copy gives a new file the
# node's default mode unless `mode:` says otherwise.
MODE_BITS = 0o777


def commit_command(directory: bytes, base: bytes, stamp: bytes, mode: int) -> bytes:
    """Rename the part over the final name and fsync the directory, only when the part is still
    the file write_command hashed (its stamp unchanged; else exit CHANGED).

    The part sits in REMOTE's directory, which a node user may be able to write: anything done
    to it by name could be done to a symlink swapped in a moment before (`chmod` follows one).
    So it is first renamed (rename never follows a symlink) into a directory of the commit's
    own (mktemp -d: 0700, entered with `cd -P`, checked to be ours and empty), checked there to
    be the very file that was hashed (size, mtime, inode: the rename changed its ctime), and
    only there given its mode and renamed over the final name: no name another user can change
    is chmod-ed or renamed into place. A final name that is a directory fails before anything
    moves, the part removed."""
    p, final = q(b"./" + part_name(base)), q(b"./" + base)
    return (
        b"set -u; cd -P -- " + q(_arg_path(directory)) + b" || exit 4; R=$(pwd -P) || exit 4; "
        + _not_a_directory(final, p, base)
        + _regular(part_name(base))
        + b'[ "$(' + STAMP + p + b')" = ' + q(stamp) + b" ] || " + _CHANGED_AFTER_HASH
        + _own_directory(p)
        + b'mv -T -- "$R"/' + p + b" " + p + b" || { fleet_undo; exit 4; }; "
        + b"[ -f " + p + b" ] && [ ! -L " + p + b" ] && "
        + b'[ "$(' + MOVED_STAMP + p + b')" = ' + q(_moved_stamp(stamp)) + b" ] || "
        + b"{ fleet_undo; " + _SAY_CHANGED + b" }; "
        + b"chmod " + f"{mode & MODE_BITS:o}".encode() + b" -- " + p
        + b" || { fleet_undo; exit 4; }; "
        + b'mv -fT -- ' + p + b' "$R"/' + final + b" || { fleet_undo; exit 4; }; "
        + b'cd -P -- "$R" || exit 4; rmdir -- "$d"; sync -- . || exit 4'
    )  # fmt: skip


MOVED_STAMP = b"stat -c '%s %.9Y %i' -- "
_SAY_CHANGED = b'echo "fleet: the part changed after it was hashed" >&2; exit 8;'
_CHANGED_AFTER_HASH = b"{ " + _SAY_CHANGED + b" }; "


def _moved_stamp(stamp: bytes) -> bytes:
    """The part's stamp (SIZE MTIME CTIME INODE) as MOVED_STAMP prints it once renamed."""
    fields = stamp.split()
    return b" ".join((fields[0], fields[1], fields[3])) if len(fields) == 4 else b"-"


def _not_a_directory(final: bytes, p: bytes, base: bytes) -> bytes:
    """sh: when the final name is a directory (a file cannot replace one), remove the part and
    exit REFUSED saying so."""
    said = q(b"fleet: " + base + b" is a directory on the node: nothing replaced")
    return (
        b"if [ -d " + final + b" ] && [ ! -L " + final + b" ]; then "
        b"rm -f -- " + p + b"; echo " + said + b" >&2; exit 5; fi; "
    )


def _own_directory(p: bytes) -> bytes:
    """sh: make a directory only this user can write (d, under R), enter it, check it is ours,
    0700 and empty (not a link swapped in for it), and define fleet_undo: remove the part from
    it and the directory."""
    return (
        b"d=$(mktemp -d ./" + PART_PREFIX.encode() + b"commit-XXXXXXXXXX) || exit 4; "
        b'cd -P -- "$d" && [ "$(stat -c \'%u %a\' .)" = "$(id -u) 700" ] && '
        b'[ -z "$(ls -A .)" ] || { echo "fleet: the commit directory changed" >&2; exit 5; }; '
        b"fleet_undo() { rm -f -- " + p + b'; cd -P -- "$R" && rmdir -- "$d"; }; '
    )


def mkdir_command(directories: list[bytes]) -> bytes:
    """Make each directory and its parents (the operator's own paths, as _enter_dest does)."""
    return b"mkdir -p -- " + b" ".join(q(_arg_path(d)) for d in directories)


def discard_command(directory: bytes, base: bytes) -> bytes:
    """Remove the part file (it did not hash to what the bastion sent)."""
    return b"cd -P -- " + q(_arg_path(directory)) + b" && rm -f -- " + q(b"./" + part_name(base))


def _no_link(p: bytes) -> bytes:
    """sh: refuse a part file that is a symlink (dd's O_NOFOLLOW refuses it too)."""
    return b"[ -L " + p + b" ] && { echo 'fleet: part file is a symlink' >&2; exit 5; }; "


class Probe(NamedTuple):
    """probe_command's findings; None for `-`."""

    final_size: int | None
    final_sha: str | None
    part_size: int | None
    is_dir: bool  # the final name is a directory (not a symlink to one)
    blocked: bool = False  # its directory cannot be made (a file in the way, not writable)


def parse_probe(line: bytes) -> Probe:
    """probe_command's line as a Probe."""
    fields = dict(w.split(b"=", 1) for w in line.split() if b"=" in w)

    def number(key: bytes) -> int | None:
        value = fields.get(key, b"-")
        return int(value) if is_digits(value) else None

    sha = fields.get(b"sha", b"-")
    ok = re.fullmatch(rb"[0-9a-f]{64}", sha)
    return Probe(
        number(b"final"),
        sha.decode() if ok else None,
        number(b"part"),
        fields.get(b"final") == b"dir",
        fields.get(b"final") == b"blocked",
    )
