"""What a node reports about itself: fleet/remote/facts.sh's output, parsed into a Snapshot.

facts.sh only reads (but for --dir-check's probe file, created and removed at once); fleet
decides from the Snapshot in Python (fleet/node/decide.py) and acts with act.sh. Run it as
`sh -s -- ARGS < facts.sh` (`facts_args` builds ARGS), in a container too (`docker exec -i C
sh -s -- ARGS < facts.sh`), with its `# fleet:source lib.sh` line expanded
(fleet.core.playbook.shipped_script).

    --pattern ERE   (repeatable) full records for processes whose command line matches, and for
                    their descendants; grep -E against the whole command line with NULs and
                    newlines read as spaces, trailing spaces dropped (like pkill -f)
    --path GLOB     (repeatable) the glob's matches, their physical paths and their holders; a
                    leading ~ is the login user's home (SUDO_USER's under sudo, not root's)
    --port N        the TCP sockets listening on port N and their holders
    --gpus          holders of /dev/nvidia*; nvidia-smi's compute apps when it exists
    --mounts        the mount table
    --df DIR        (repeatable) df -Pk of DIR
    --dir-check DIR DIR (~ as for --path; a relative DIR is taken from the login directory): what is
                    there, a write probe (a file created and removed in it), and where it is

## The format (version 1)

One record per line, fields separated by one space, the record's kind first. Numbers are decimal.
Nothing the node holds is ever printed raw: text (command lines, names, paths, environment
values) travels hex-encoded, so a newline, tab, NUL, escape sequence or invalid UTF-8 in it can
neither break a line nor pass for a field, and every line stays short (a command line is cut to
4096 bytes, a text-block piece is 32 hex digits). Lines, in this order:

    facts 1                           format version: a parser refuses another one
    self PID                          facts.sh's own shell (its ancestors and session are fleet's)
    t PID PPID PGID SID START STATE   every process except kernel threads and zombies; START is its
                                      start time in clock ticks after boot (field 22 of stat),
                                      STATE its state letter (R S D T t ...)
    trust UID LOGIN                   facts.sh's uid and the login's (SUDO_UID when an ancestor
                                      runs with it as its real uid, as sudo does; "-" for none)
    m PID RUID EUID SUID FSUID        a process with FLEET_NODE_HELPER=... in its environment,
                                      and its uids: one of fleet's own helpers (of this run or
                                      another) when they are all UID or LOGIN (decide.py), else
                                      anyone's forgery; facts.sh leaves out of --pattern matching
                                      only the former (their argv holds the patterns)
    error grep                        the node's grep refused the --pattern set
    hit PID N                         a match whose command line is longer than its record's
                                      4096 bytes: N is the first --pattern (from 0) it matches
    listen PORT INODE                 a TCP socket (IPv4 or IPv6) listening on --port
    smi RC                            nvidia-smi exists; RC is its compute-apps query's exit status
    app PID                           a compute app that nvidia-smi listed
    p PID UID CUT CMDLINE             a full record: CMDLINE is the hex of the first 4096 bytes of
                                      /proc/PID/cmdline (arguments NUL-separated, "-" for none),
                                      CUT 1 when there was more
    x HEX                             a piece of the text block (below), in order
    end                               facts.sh finished: a report without it is incomplete

The text block, hex-encoded in the `x` lines, holds records that each end with a NUL byte; their
fields are separated by one space, and the last field is the rest of the record (any byte but NUL):

    boot ID                           the node's boot id
    comm PID COMM                     a full record's comm (15 bytes at most, may hold a newline)
    exe PID PATH                      the program a full record not root's runs (/proc/PID/exe),
                                      when it can be read
    parent PID RUID EUID SUID FSUID COMM
                                      the uids and comm of a process that is the parent of a full
                                      record not root's
    user UID NAME                     the name of a full record's uid
    home PATH                         the login user's home (empty when unknown); with --path
    henv PATH                         $HOME of facts.sh; with --path
    place KEY PHYS                    the physical path of a place where state may live (KEY: tmp,
                                      vartmp, shm, home, cache, nv, triton, henv), when it exists
    glob N PHYS                       --path number N (from 0), ~ expanded, its directories up to
                                      the first wildcard (or the last name) resolved physically
    path M N TYPE PATH                match M (from 0) of glob N; TYPE d directory, f file,
                                      l symlink, o other
    real M PHYS                       match M's physical path (a symlink's: its directory resolved)
    owner M UID                       match M's owner (the link's for a symlink; empty: unknown)
    fd PID TARGET                     an fd of PID whose link target contains a match's physical
                                      path, is a socket listed here or /dev/nvidia* (--gpus)
    cwd PID TARGET                    PID's working directory, when it contains a match
    unix LINE                         a /proc/net/unix line (bound socket) naming a match
    map PID/maps:LINE                 a line of PID's /proc/PID/maps naming a match
    env PID/environ:NAME=VALUE        a variable of PID's environment naming a match
    smiout TEXT                       nvidia-smi's compute-apps output (2000 bytes at most)
    mount LINE                        a /proc/self/mounts line (--mounts)
    df N LINE                         df -Pk's line for --df number N
    dir TYPE PATH                     --dir-check's DIR, ~ expanded; TYPE d directory, n nothing
                                      there, l a symlink to nothing, o something else
    dirw RC TEXT                      its write probe (TYPE d only): RC 0 a file was created and
                                      removed, 1 not created (TEXT: why), 2 not removed (TEXT: it)
    dirat PATH                        DIR, or its nearest existing parent (where it would be made)
    dirreal PHYS                      that directory's physical path
    dirdf LINE                        df -Pk's line for that directory

Compatibility: records may gain fields at the end of a line (plain records only: a text-block
record never gains fields, new information there comes as a new kind); new kinds may appear. A
parser ignores kinds it does not know and fields past the ones it knows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleet.core.digits import is_digits
from fleet.core.shell import quote

VERSION = 1
CMDLINE_MAX = 4096
MAX_LINES = 400_000  # a node with more processes than this is refused rather than read
_NUMBER = re.compile(r"0|[1-9][0-9]{0,18}")
_HEX = re.compile(r"(?:[0-9a-f]{2})+")


class FactsError(ValueError):
    """facts.sh's output is not a complete, well-formed report."""


@dataclass(frozen=True)
class Proc:
    """A `t` line: one process of the node's table."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    start: int  # clock ticks after boot: with the pid, a process's identity
    state: str


@dataclass(frozen=True)
class Record:
    """A full record: who runs a process and its command line."""

    pid: int
    uid: int
    cmdline: bytes  # raw, arguments NUL-separated, at most CMDLINE_MAX bytes
    cut: bool = False
    comm: bytes = b""
    user: str | None = None
    exe: bytes | None = None  # /proc/PID/exe, for a process not root's (None: not known)
    # its parent's uids (real, effective, saved, fs) and comm, for a process not root's (None:
    # not known, or gone)
    parent: tuple[tuple[int, ...], bytes] | None = None

    @property
    def text(self) -> bytes:
        """What patterns match: NULs and newlines as spaces, no trailing spaces (as pkill -f)."""
        return self.cmdline.replace(b"\0", b" ").replace(b"\n", b" ").rstrip(b" ")

    def shown(self, limit: int = 120) -> str:
        """The command line for people, cut to `limit` characters ("..." when cut); `[comm]`
        when the process has none."""
        shown = decode(self.text or b"[" + self.comm + b"]")
        if len(shown) > limit:
            return shown[:limit] + "..."
        return shown + "..." if self.cut else shown


@dataclass(frozen=True)
class PathMatch:
    """One existing match of a --path glob."""

    index: int
    glob: int
    kind: str  # d f l o
    path: bytes
    real: bytes  # physical path (for a symlink: its directory resolved, the link itself kept)
    owner: int | None = None  # its uid (None: not known)


@dataclass(frozen=True)
class Link:
    """A process's hold on something: an fd's target, its cwd, a mapping, an environment value."""

    pid: int
    kind: str  # fd cwd map env
    target: bytes


@dataclass(frozen=True)
class Mount:
    """A /proc/self/mounts line."""

    device: bytes
    point: bytes
    fstype: str
    options: str


@dataclass(frozen=True)
class DiskFree:
    """df -Pk's line for one --df directory, in bytes."""

    total: int
    available: int
    point: bytes


@dataclass(frozen=True)
class DirCheck:
    """--dir-check's report on one directory."""

    path: bytes  # as asked, ~ expanded
    kind: str  # d n l o
    write: int | None = None  # the probe: 0 done, 1 not created, 2 not removed; None: not tried
    text: bytes = b""  # why the probe file was not created, or the file left behind
    near: bytes = b""  # path, or its nearest existing parent
    real: bytes = b""  # near's physical path
    df: DiskFree | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything one facts.sh run reported."""

    self_pid: int
    procs: Mapping[int, Proc]
    helpers: frozenset[int] = frozenset()  # marked as helpers, by anyone: see decide.trusted
    helper_uids: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # real, eff, ...
    fleet_uid: int | None = None  # facts.sh's own uid
    login_uid: int | None = None  # the SSH login's, under sudo
    hits: Mapping[int, int] = field(default_factory=dict)  # long command line -> pattern index
    records: Mapping[int, Record] = field(default_factory=dict)
    boot_id: str = ""
    grep_failed: bool = False
    home: bytes | None = None  # the login user's home
    home_env: bytes | None = None
    places: Mapping[str, bytes] = field(default_factory=dict)
    globs: Mapping[int, bytes] = field(default_factory=dict)
    matches: tuple[PathMatch, ...] = ()
    links: tuple[Link, ...] = ()
    unix: Mapping[int, bytes] = field(default_factory=dict)  # socket inode -> bound path
    listens: tuple[tuple[int, int], ...] = ()  # (port, inode)
    smi_rc: int | None = None  # None: no nvidia-smi
    apps: frozenset[int] = frozenset()
    smi_output: bytes = b""
    mounts: tuple[Mount, ...] = ()
    df: Mapping[int, DiskFree] = field(default_factory=dict)
    dir_check: DirCheck | None = None

    def record(self, pid: int) -> Record:
        """The full record of `pid`, or a bare one when facts.sh sent none."""
        return self.records.get(pid) or Record(pid=pid, uid=-1, cmdline=b"")

    def holders(self, kinds: Iterable[str] = ("fd", "cwd", "map", "env")) -> tuple[Link, ...]:
        """Links of the given kinds; `fd` links to a socket are resolved to its bound path."""
        wanted = set(kinds)
        out = []
        for link in self.links:
            if link.kind not in wanted:
                continue
            socket = _SOCKET.fullmatch(link.target)
            if socket and link.kind == "fd":
                bound = self.unix.get(int(socket.group(1)))
                if bound is not None:
                    out.append(Link(link.pid, "unix", bound))
                    continue
            out.append(link)
        return tuple(out)


_SOCKET = re.compile(rb"socket:\[([0-9]+)\]")
_TextHandler = Callable[["_Builder", bytes], None]


def decode(raw: bytes) -> str:
    """Node bytes as text for people: invalid UTF-8 shown as \\xNN escapes, never lost."""
    return raw.decode("utf-8", "backslashreplace")


def facts_args(
    patterns: Sequence[str] = (),
    paths: Sequence[str] = (),
    port: int | None = None,
    *,
    gpus: bool = False,
    mounts: bool = False,
    df: Sequence[str] = (),
    dir_check: str | None = None,
) -> list[str]:
    """facts.sh's arguments for these sections (unquoted words)."""
    args: list[str] = []
    for pattern in patterns:
        args += ["--pattern", pattern]
    for path in paths:
        args += ["--path", path]
    if port is not None:
        args += ["--port", str(port)]
    if gpus:
        args.append("--gpus")
    if mounts:
        args.append("--mounts")
    for directory in df:
        args += ["--df", directory]
    if dir_check is not None:
        args += ["--dir-check", dir_check]
    return args


def facts_command(args: Sequence[str]) -> str:
    """The argument text of `sh -s -- ARGS`, every word quoted."""
    return " ".join(quote(a) for a in args)


def _int(text: str, what: str) -> int:
    if not _NUMBER.fullmatch(text):
        raise FactsError(f"{what}: expected a number, got {text[:20]!r}")
    return int(text)


def _hex(text: str, what: str) -> bytes:
    if text == "-":
        return b""
    if not _HEX.fullmatch(text):
        raise FactsError(f"{what}: expected hex")
    return bytes.fromhex(text)


def _fields(line: str, count: int) -> list[str]:
    parts = line.split(" ")
    if len(parts) < count:
        raise FactsError(f"'{parts[0][:10]}' line: expected {count} fields, got {len(parts)}")
    return parts


class _Builder:
    """Accumulates one report's records (a mutable scratchpad; parse() returns the frozen view)."""

    def __init__(self) -> None:
        self.self_pid: int | None = None
        self.procs: dict[int, Proc] = {}
        self.helpers: set[int] = set()
        self.helper_uids: dict[int, tuple[int, ...]] = {}
        self.trust: tuple[int | None, int | None] = (None, None)
        self.hits: dict[int, int] = {}
        self.raw_records: dict[int, tuple[int, bool, bytes]] = {}
        self.comms: dict[int, bytes] = {}
        self.exes: dict[int, bytes] = {}
        self.parents: dict[int, tuple[tuple[int, ...], bytes]] = {}
        self.users: dict[int, str] = {}
        self.boot = ""
        self.grep_failed = False
        self.home: bytes | None = None
        self.home_env: bytes | None = None
        self.places: dict[str, bytes] = {}
        self.globs: dict[int, bytes] = {}
        self.paths: dict[int, tuple[int, str, bytes]] = {}
        self.reals: dict[int, bytes] = {}
        self.owners: dict[int, int] = {}
        self.links: list[Link] = []
        self.unix: dict[int, bytes] = {}
        self.listens: list[tuple[int, int]] = []
        self.smi_rc: int | None = None
        self.apps: set[int] = set()
        self.smi_output = b""
        self.mounts: list[Mount] = []
        self.df: dict[int, DiskFree] = {}
        self.dir: dict[bytes, bytes] = {}  # --dir-check's records, by kind

    def line(self, line: str) -> None:
        kind = line.split(" ", 1)[0]
        if kind == "t":
            f = _fields(line, 7)
            pid = _int(f[1], "t pid")
            self.procs[pid] = Proc(
                pid, _int(f[2], "ppid"), _int(f[3], "pgid"), _int(f[4], "sid"),
                _int(f[5], "start"), f[6][:1],
            )  # fmt: skip
        elif kind == "p":
            f = _fields(line, 5)
            raw = _hex(f[4], "p cmdline")
            if len(raw) > CMDLINE_MAX:
                raise FactsError("p cmdline: longer than its cap")
            self.raw_records[_int(f[1], "p pid")] = (_int(f[2], "uid"), f[3] == "1", raw)
        elif kind == "m":
            f = line.split(" ")
            pid = _int(_fields(line, 2)[1], "m pid")
            self.helpers.add(pid)
            if len(f) >= 6:
                self.helper_uids[pid] = tuple(_int(u, "m uid") for u in f[2:6])
        elif kind == "trust":
            f = _fields(line, 3)
            login = None if f[2] == "-" else _int(f[2], "trust login")
            self.trust = (_int(f[1], "trust uid"), login)
        elif kind == "hit":
            f = _fields(line, 3)
            self.hits.setdefault(_int(f[1], "hit pid"), _int(f[2], "hit pattern"))
        elif kind == "self":
            self.self_pid = _int(_fields(line, 2)[1], "self pid")
        elif kind == "listen":
            f = _fields(line, 3)
            self.listens.append((_int(f[1], "listen port"), _int(f[2], "listen inode")))
        elif kind == "smi":
            self.smi_rc = _int(_fields(line, 2)[1], "smi rc")
        elif kind == "app":
            self.apps.add(_int(_fields(line, 2)[1], "app pid"))
        elif kind == "error":
            self.grep_failed = self.grep_failed or line.split(" ")[1:2] == ["grep"]

    def text(self, record: bytes) -> None:
        kind, _, rest = record.partition(b" ")
        if kind in _TEXT_KINDS:
            _TEXT_KINDS[kind](self, rest)


def _pid_and_text(rest: bytes, what: str) -> tuple[int, bytes]:
    pid, _, text = rest.partition(b" ")
    return _int(pid.decode("ascii", "replace"), what), text


def _grep_line(rest: bytes, what: str) -> tuple[int, bytes]:
    """`PID/FILE:TEXT` (a grep -H line) -> (PID, TEXT)."""
    head, sep, text = rest.partition(b":")
    if not sep or b"/" not in head:
        raise FactsError(f"{what}: expected PID/FILE:TEXT")
    return _int(head.split(b"/", 1)[0].decode("ascii", "replace"), what), text


def _t_comm(b: _Builder, rest: bytes) -> None:
    pid, text = _pid_and_text(rest, "comm pid")
    b.comms[pid] = text[:64]


def _t_exe(b: _Builder, rest: bytes) -> None:
    pid, text = _pid_and_text(rest, "exe pid")
    b.exes[pid] = text[:4096]


def _t_parent(b: _Builder, rest: bytes) -> None:
    fields = rest.split(b" ", 5)
    if len(fields) < 6:
        raise FactsError("parent: expected PID, four uids and a comm")
    pid, *uids = (_int(f.decode("ascii", "replace"), "parent") for f in fields[:5])
    b.parents[pid] = (tuple(uids), fields[5][:64])


def _t_user(b: _Builder, rest: bytes) -> None:
    uid, text = _pid_and_text(rest, "user uid")
    b.users.setdefault(uid, decode(text[:64]))


def _t_boot(b: _Builder, rest: bytes) -> None:
    b.boot = decode(rest[:64]).strip()


def _t_home(b: _Builder, rest: bytes) -> None:
    b.home = rest or None


def _t_henv(b: _Builder, rest: bytes) -> None:
    b.home_env = rest or None


def _t_place(b: _Builder, rest: bytes) -> None:
    key, _, phys = rest.partition(b" ")
    b.places[key.decode("ascii", "replace")] = phys


def _t_glob(b: _Builder, rest: bytes) -> None:
    index, phys = _pid_and_text(rest, "glob index")
    b.globs[index] = phys


def _t_path(b: _Builder, rest: bytes) -> None:
    parts = rest.split(b" ", 3)
    if len(parts) < 4 or parts[2] not in (b"d", b"f", b"l", b"o"):
        raise FactsError("path: expected M N TYPE PATH")
    index = _int(parts[0].decode("ascii", "replace"), "path index")
    b.paths[index] = (
        _int(parts[1].decode("ascii", "replace"), "path glob"),
        parts[2].decode(),
        parts[3],
    )


def _t_real(b: _Builder, rest: bytes) -> None:
    index, real = _pid_and_text(rest, "real index")
    b.reals[index] = real


def _t_owner(b: _Builder, rest: bytes) -> None:
    index, uid = _pid_and_text(rest, "owner index")
    if uid:
        b.owners[index] = _int(uid.decode("ascii", "replace"), "owner uid")


def _t_link(kind: str) -> _TextHandler:
    def handle(b: _Builder, rest: bytes) -> None:
        pid, target = _pid_and_text(rest, f"{kind} pid")
        b.links.append(Link(pid, kind, target))

    return handle


def _t_grep(kind: str) -> _TextHandler:
    def handle(b: _Builder, rest: bytes) -> None:
        try:
            pid, text = _grep_line(rest, kind)
        except FactsError:
            return  # not a grep -H line: nothing of it can be trusted as a holder
        if kind == "map":
            # address perms offset device inode PATH: the path is all after the fifth field
            fields = text.split(None, 5)
            if len(fields) == 6:
                b.links.append(Link(pid, "map", fields[5].removesuffix(b" (deleted)")))
        else:
            _, sep, value = text.partition(b"=")
            if sep:
                b.links.append(Link(pid, "env", value))

    return handle


def _t_unix(b: _Builder, rest: bytes) -> None:
    # Num RefCount Protocol Flags Type St Inode Path
    fields = rest.split(None, 7)
    if len(fields) == 8 and is_digits(fields[6]) and fields[7].startswith(b"/"):
        b.unix[int(fields[6])] = fields[7]


def _t_smiout(b: _Builder, rest: bytes) -> None:
    b.smi_output = rest[:2000]


def _t_mount(b: _Builder, rest: bytes) -> None:
    fields = rest.split(b" ")
    if len(fields) >= 4:
        b.mounts.append(
            Mount(_unescape(fields[0]), _unescape(fields[1]), decode(fields[2]), decode(fields[3]))
        )


def _disk_free(text: bytes) -> DiskFree | None:
    m = re.fullmatch(rb"(.*?)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+)%\s+(.*)", text.strip())
    return DiskFree(int(m.group(2)) * 1024, int(m.group(4)) * 1024, m.group(6)) if m else None


def _t_df(b: _Builder, rest: bytes) -> None:
    index, text = _pid_and_text(rest, "df index")
    if (free := _disk_free(text)) is not None:
        b.df[index] = free


def _t_dir(kind: bytes) -> _TextHandler:
    def handle(b: _Builder, rest: bytes) -> None:
        b.dir[kind] = rest

    return handle


def _dir_check(b: _Builder) -> DirCheck | None:
    kind, _, path = b.dir.get(b"dir", b"").partition(b" ")
    if kind not in (b"d", b"n", b"l", b"o"):
        return None
    code, _, text = b.dir[b"dirw"].partition(b" ") if b"dirw" in b.dir else (b"", b"", b"")
    return DirCheck(
        path=path,
        kind=kind.decode(),
        write=int(code) if code in (b"0", b"1", b"2") else None,
        text=text[:512],
        near=b.dir.get(b"dirat", b""),
        real=b.dir.get(b"dirreal", b""),
        df=_disk_free(b.dir.get(b"dirdf", b"")),
    )


def _unescape(raw: bytes) -> bytes:
    """The kernel's octal escapes in /proc/self/mounts (\\040 for a space)."""
    return re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8) & 0xFF]), raw)


_TEXT_KINDS: dict[bytes, _TextHandler] = {
    b"comm": _t_comm,
    b"exe": _t_exe,
    b"parent": _t_parent,
    b"user": _t_user,
    b"boot": _t_boot,
    b"home": _t_home,
    b"henv": _t_henv,
    b"place": _t_place,
    b"glob": _t_glob,
    b"path": _t_path,
    b"real": _t_real,
    b"owner": _t_owner,
    b"fd": _t_link("fd"),
    b"cwd": _t_link("cwd"),
    b"map": _t_grep("map"),
    b"env": _t_grep("env"),
    b"unix": _t_unix,
    b"smiout": _t_smiout,
    b"mount": _t_mount,
    b"df": _t_df,
    **{kind: _t_dir(kind) for kind in (b"dir", b"dirw", b"dirat", b"dirreal", b"dirdf")},
}


def parse(lines: Iterable[str]) -> Snapshot:
    """A Snapshot from facts.sh's output lines; FactsError when it is not a complete report."""
    builder = _Builder()
    pieces: list[str] = []
    seen_header = ended = False
    for count, line in enumerate(lines):
        if count >= MAX_LINES:
            raise FactsError(f"more than {MAX_LINES} lines")
        if not seen_header:
            if line.split(" ")[:1] != ["facts"]:
                raise FactsError("not facts.sh output (no 'facts' header)")
            version = line.split(" ")[1:2]
            if version != [str(VERSION)]:
                raise FactsError(
                    f"format version {version[0][:8] if version else '?'}, not {VERSION}"
                )
            seen_header = True
        elif ended:
            continue
        elif line.startswith("x "):
            piece = line[2:]
            if not _HEX.fullmatch(piece):
                raise FactsError("x: expected hex")
            pieces.append(piece)
        elif line == "end":
            ended = True
        else:
            builder.line(line)
    if not seen_header:
        raise FactsError("no output")
    if not ended:
        raise FactsError("incomplete: no 'end' line")
    if builder.self_pid is None:
        raise FactsError("no 'self' line")
    for record in bytes.fromhex("".join(pieces)).split(b"\0")[:-1]:
        builder.text(record)
    return _snapshot(builder, builder.self_pid)


def _snapshot(b: _Builder, self_pid: int) -> Snapshot:
    def parent(pid: int, uid: int) -> tuple[tuple[int, ...], bytes] | None:
        proc = b.procs.get(pid)
        return b.parents.get(proc.ppid) if uid != 0 and proc is not None else None

    records = {
        pid: Record(
            pid,
            uid,
            raw,
            cut,
            b.comms.get(pid, b""),
            b.users.get(uid),
            b.exes.get(pid),
            parent(pid, uid),
        )
        for pid, (uid, cut, raw) in b.raw_records.items()
    }
    matches = tuple(
        PathMatch(index, glob, kind, path, b.reals.get(index, path), b.owners.get(index))
        for index, (glob, kind, path) in sorted(b.paths.items())
    )
    return Snapshot(
        self_pid=self_pid,
        procs=b.procs,
        helpers=frozenset(b.helpers),
        helper_uids=b.helper_uids,
        fleet_uid=b.trust[0],
        login_uid=b.trust[1],
        hits=b.hits,
        records=records,
        boot_id=b.boot,
        grep_failed=b.grep_failed,
        home=b.home,
        home_env=b.home_env,
        places=b.places,
        globs=b.globs,
        matches=matches,
        links=tuple(b.links),
        unix=b.unix,
        listens=tuple(b.listens),
        smi_rc=b.smi_rc,
        apps=frozenset(b.apps),
        smi_output=b.smi_output,
        mounts=tuple(b.mounts),
        df=b.df,
        dir_check=_dir_check(b),
    )
