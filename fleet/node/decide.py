"""Decisions on a node's facts: which processes cleanup kills, which paths it removes, which port
holder it stops, whether it may reset the GPUs, and when it refuses. Pure functions of a Snapshot
(fleet/node/facts.py) and what the operator asked for; no I/O.

Never killed, whatever the patterns say: pid 1; fleet's own processes (the facts.sh shell, its
ancestors: sudo, timeout, the SSH session, sshd; its descendants; its session when the session is
fleet's own, i.e. led by it or an ancestor and not pid 1: in a PID namespace the leader may be
invisible, sid 0, or init, and such a "session" holds the training job too); and every process
marked as fleet's own helper (FLEET_NODE_HELPER in its environment: another operator's cleanup
or status on the same node) with its descendants. Those carry the patterns in their argv. Any
user can put that variable in their own environment, so a mark counts only on a process whose
uids are all fleet's own (`trusted`).

Refused before anything is killed (the node is left alone and says what the patterns matched):
a pattern set that matches pid 1, an ancestor of fleet's own connection (the SSH daemon, the
container's init), sshd, systemd, init, dockerd, containerd or a supervisor (tini, dumb-init,
supervisord, s6, runit, conmon), or that would kill more than `max_kill_share` of the node's
processes (and more than SHARE_FLOOR of them).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleet.core import defaults
from fleet.node.deletion import STATE_PLACES_TEXT
from fleet.node.ere import Pattern
from fleet.node.facts import Link, PathMatch, Snapshot, decode

SHARE_FLOOR = 16  # a kill set this small is never "too broad" by share alone
PROTECTED_NAMES = frozenset({
    "sshd", "sshd-session", "sshd-auth", "systemd", "init", "dockerd", "containerd", "tini",
    "docker-init", "dumb-init", "supervisord", "s6-svscan", "s6-supervise", "runsvdir", "runsv",
    "catatonit", "conmon",
})  # fmt: skip
PROTECTED_PREFIXES = ("systemd-", "containerd-")
CONTAINER_INITS = frozenset({"tini", "docker-init", "dumb-init", "catatonit", "conmon"})
# System services that hold the GPU on purpose: killing them does not help a relaunch, and
# systemd would restart them anyway.
GPU_DAEMONS = frozenset({
    "nvidia-persistenced", "nv-hostengine", "nv-fabricmanager", "nvidia-fabricmanager",
    "dcgm-exporter", "Xorg", "X",
})  # fmt: skip
_GPU_DEVICE = re.compile(rb"/dev/nvidia(ctl|[0-9]+)")


@dataclass(frozen=True)
class CleanupSpec:
    """What the operator asked cleanup to do on every node."""

    patterns: tuple[Pattern, ...]
    grace_s: float = defaults.GRACE_S
    port: int | None = None
    kill_gpu_holders: bool = False
    state_paths: tuple[str, ...] = ()
    allow_any_path: bool = False
    max_kill_share: float = 0.5


# ------------------------------------------------------------------------ who is fleet's own


@dataclass(frozen=True)
class Who:
    """Fleet's own processes on the node (never matched), and its connection's ancestry (never
    killed; a pattern that matches one is refused)."""

    own: frozenset[int]
    ancestry: frozenset[int]


def children(snap: Snapshot) -> dict[int, list[int]]:
    """ppid -> pids."""
    out: dict[int, list[int]] = {}
    for proc in snap.procs.values():
        out.setdefault(proc.ppid, []).append(proc.pid)
    return out


def descendants(snap: Snapshot, roots: Iterable[int]) -> set[int]:
    """`roots` (those in the table) and every process below them."""
    kids = children(snap)
    found = {pid for pid in roots if pid in snap.procs}
    queue = deque(found)
    while queue:
        for child in kids.get(queue.popleft(), ()):
            if child not in found:
                found.add(child)
                queue.append(child)
    return found


def ancestors(snap: Snapshot, pid: int) -> list[int]:
    """`pid`'s parent, its parent, ... up to (not including) pid 1; a cycle cannot loop."""
    out: list[int] = []
    seen = {pid}
    proc = snap.procs.get(pid)
    while proc is not None and proc.ppid not in (0, 1) and proc.ppid not in seen:
        out.append(proc.ppid)
        seen.add(proc.ppid)
        proc = snap.procs.get(proc.ppid)
    return out


def fleet_uids(snap: Snapshot) -> frozenset[int]:
    """The uids fleet runs as on this node: facts.sh's own (root under sudo) and the SSH login's."""
    return frozenset(uid for uid in (snap.fleet_uid, snap.login_uid) if uid is not None)


def trusted(snap: Snapshot) -> frozenset[int]:
    """The marked helpers that are fleet's: those whose uids (real, effective, saved, fs) are all
    fleet's, and the marked processes above one of those (another login's sudo, whose real uid
    is that operator's; no other user can start a root process under their own). Without the
    uid check, any user's trainer could wear the mark and be spared."""
    uids = fleet_uids(snap)
    found = {
        pid
        for pid in snap.helpers
        if (ids := snap.helper_uids.get(pid)) is not None and set(ids) <= uids
    }
    for pid in list(found):
        for parent in ancestors(snap, pid):
            if parent not in snap.helpers:
                break
            found.add(parent)
    return frozenset(found)


def who(snap: Snapshot) -> Who:
    """See the module docstring."""
    me = snap.self_pid
    line = ancestors(snap, me)
    own = descendants(snap, [me]) | {me}
    proc = snap.procs.get(me)
    if proc is not None and proc.sid > 1 and proc.sid in {me, *line}:
        own |= {p.pid for p in snap.procs.values() if p.sid == proc.sid}
    helpers = trusted(snap)
    own |= descendants(snap, helpers) | set(helpers)
    return Who(own=frozenset(own), ancestry=frozenset(set(line) - own))


# ----------------------------------------------------------------------------------- names


def argv0(snap: Snapshot, pid: int) -> str:
    """The base name of a process's argv[0] (`sshd:` for an sshd session: `sshd`)."""
    first = snap.record(pid).cmdline.split(b"\0", 1)[0].split(b" ", 1)[0]
    return decode(first.rsplit(b"/", 1)[-1]).rstrip(":")


def _names(snap: Snapshot, pid: int) -> set[str]:
    return {decode(snap.record(pid).comm), argv0(snap, pid)} - {""}


def _protected_name(name: str) -> bool:
    return name in PROTECTED_NAMES or name.startswith(PROTECTED_PREFIXES)


def _claim_believed(
    snap: Snapshot, pid: int, named: Callable[[str], bool], *, daemon: bool = False
) -> bool:
    """A daemon's name (comm, argv[0]) is the process's own to choose (`exec -a sshd`): it is
    believed from root's processes (only root starts those), and from another user's only when
    the program it runs has such a name too (a user's `sshd: alice@pts/0` runs sshd) and, with
    `daemon` (the names cleanup never kills), a daemon of root's other than pid 1 started it:
    sshd's privileged half starts a user's `sshd: bob@pts/0`, while any user can run a daemon's
    program themselves (`tini -- python train.py`), and pid 1 adopts every orphan. Else a
    stranger could make any cleanup refuse the node by naming a match of its patterns `sshd`,
    or by running tini around one. Believed when the program is not known (not readable): the
    cautious side."""
    record = snap.records.get(pid)
    if record is None or record.uid == 0 or record.exe is None:
        return True
    program = record.exe.removesuffix(b" (deleted)").rsplit(b"/", 1)[-1]
    if not named(decode(program)):
        return False
    if not daemon:
        return True
    proc = snap.procs.get(pid)
    if proc is None or proc.ppid <= 1 or record.parent is None:
        return False
    uids, comm = record.parent
    return set(uids) == {0} and _protected_name(decode(comm))


def protected(snap: Snapshot, pid: int, whom: Who) -> str | None:
    """Why cleanup must never touch `pid`, or None."""
    if pid == 1:
        return "pid 1"
    for name in sorted(_names(snap, pid)):
        if _protected_name(name) and _claim_believed(snap, pid, _protected_name, daemon=True):
            return name
    if pid in whom.ancestry:
        return "fleet's own connection"
    return None


def is_gpu_daemon(snap: Snapshot, pid: int) -> bool:
    return argv0(snap, pid) in GPU_DAEMONS and _claim_believed(snap, pid, GPU_DAEMONS.__contains__)


def gpu_holders(snap: Snapshot) -> tuple[int, ...]:
    """Processes with an fd open on /dev/nvidiactl or /dev/nvidia<N> (what orphaned, possibly
    renamed workers still hold), sorted."""
    return tuple(
        sorted(
            {
                link.pid
                for link in snap.links
                if link.kind == "fd" and _GPU_DEVICE.fullmatch(link.target)
            }
        )
    )


# ------------------------------------------------------------------------------- the kill


@dataclass(frozen=True)
class Kill:
    """The processes to signal, and what was left alone."""

    targets: tuple[int, ...]  # sorted
    why: Mapping[int, str] = field(default_factory=dict)  # pid -> "matches 'P'", "child of N"...
    spared_gpu: tuple[int, ...] = ()  # GPU holders left alone (kill_gpu_holders is off)
    gpu_daemons: tuple[int, ...] = ()  # GPU holders left alone with kill_gpu_holders on
    refusal: tuple[str, ...] = ()  # lines saying why nothing may be killed here


def matched(snap: Snapshot, patterns: Sequence[Pattern], whom: Who) -> dict[int, str]:
    """pid -> the first pattern its command line matches, for every process but fleet's own. A
    record holds only the first CMDLINE_MAX bytes: for a longer command line the node's own
    match of the whole of it (its `hit`) counts too."""
    out: dict[int, str] = {}
    for pid, record in snap.records.items():
        if pid not in snap.procs or pid in whom.own:
            continue
        for pattern in patterns:
            if pattern.search(record.text):
                out[pid] = pattern.source
                break
        else:
            index = snap.hits.get(pid)
            if record.cut and index is not None and index < len(patterns):
                out[pid] = patterns[index].source
    return out


def decide_kill(snap: Snapshot, spec: CleanupSpec, whom: Who) -> Kill:
    """Pattern matches and their descendants (plus, when asked, GPU holders), or a refusal."""
    hits = matched(snap, spec.patterns, whom)
    why: dict[int, str] = {pid: f"matches '{source}'" for pid, source in hits.items()}
    for pid in sorted(descendants(snap, hits) - set(hits)):
        parent = snap.procs[pid].ppid
        why[pid] = f"child of {parent}"
    never = whom.own | whom.ancestry | {1}
    targets = set(why) - never
    guarded = sorted(
        (pid, reason)
        for pid in set(hits) | targets
        if (reason := protected(snap, pid, whom)) is not None
    )
    if guarded:
        return Kill((), refusal=_refusal(snap, guarded, hits))
    population = len(set(snap.procs) - whom.own)
    if len(targets) > SHARE_FLOOR and len(targets) > spec.max_kill_share * population:
        return Kill(
            (),
            refusal=(
                f"refused: the patterns would kill {len(targets)} of this node's {population} "
                f"processes (more than {spec.max_kill_share:.0%}); did nothing on this node "
                "(--var max_kill_share=1 allows it)",
            ),
        )
    holders = [pid for pid in gpu_holders(snap) if pid not in never and pid not in targets]
    daemons = tuple(pid for pid in holders if is_gpu_daemon(snap, pid))
    others = tuple(pid for pid in holders if pid not in daemons)
    if spec.kill_gpu_holders:
        for pid in others:
            why[pid] = "holds a GPU"
        targets |= set(others)
        return Kill(tuple(sorted(targets)), why, gpu_daemons=daemons)
    return Kill(tuple(sorted(targets)), why, spared_gpu=others)


def _refusal(
    snap: Snapshot, guarded: Sequence[tuple[int, str]], hits: Mapping[int, str]
) -> tuple[str, ...]:
    lines = []
    for pid, reason in guarded[:10]:
        source = hits.get(pid)
        how = f"--pattern '{source}'" if source else "a match's descendant"
        lines.append(f"refused: {how} matches {pid} ({reason}): {snap.record(pid).shown()}")
    if len(guarded) > 10:
        lines.append(f"refused: ... and {len(guarded) - 10} more")
    kinds = ", ".join(dict.fromkeys(reason for _, reason in guarded))
    if any(_container_init(reason) for _, reason in guarded):
        lines.append(
            "refused: a container's init runs the training command: end the run inside its "
            "containers with `fleet kill-docker`, then clean the host"
        )
    lines.append(
        f"refused: the patterns match what cleanup never kills ({kinds}); did nothing on this node"
    )
    return tuple(lines)


def _container_init(name: str) -> bool:
    """A container's pid 1 or its runtime's shim: a match means the run is in a container."""
    return name in CONTAINER_INITS or name.startswith("containerd-")


# ---------------------------------------------------------------------------------- the port


@dataclass(frozen=True)
class Port:
    """Who holds the rendezvous port, and which of them cleanup stops."""

    port: int
    inodes: tuple[int, ...]
    holders: tuple[int, ...]
    stop: tuple[int, ...] = ()
    own: tuple[int, ...] = ()  # fleet's own caller (an SSH forward on that port)
    protected: tuple[tuple[int, str], ...] = ()
    # another user's (not fleet's uids): a stranger's program on the port is not the run's, and
    # is stopped only as a match of the patterns
    strangers: tuple[int, ...] = ()

    @property
    def held(self) -> bool:
        return bool(self.inodes)


def decide_port(snap: Snapshot, port: int, whom: Who) -> Port:
    inodes = tuple(sorted({inode for p, inode in snap.listens if p == port}))
    sockets = {f"socket:[{inode}]".encode() for inode in inodes}
    holders = tuple(
        sorted({link.pid for link in snap.links if link.kind == "fd" and link.target in sockets})
    )
    own = tuple(pid for pid in holders if pid in whom.own)
    guarded = tuple(
        (pid, reason)
        for pid in holders
        if pid not in own and (reason := protected(snap, pid, whom)) is not None
    )
    uids = fleet_uids(snap) | {0}  # root's: the node's own, not a stranger's
    left = {*own, *dict(guarded)}
    strangers = tuple(
        pid for pid in holders if pid not in left and snap.record(pid).uid not in uids
    )
    stop = tuple(pid for pid in holders if pid not in left and pid not in strangers)
    return Port(port, inodes, holders, stop, own, guarded, strangers)


# --------------------------------------------------------------------------------- the paths


def normalise(path: bytes) -> bytes:
    """`//`, `.` and `..` resolved as text (`/..` is `/`)."""
    parts: list[bytes] = []
    for part in path.split(b"/"):
        if part in (b"", b"."):
            continue
        if part == b"..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return b"/" + b"/".join(parts)


def only_wildcards(name: bytes) -> bool:
    """Nothing but wildcards, [...] sets and dots: as the first name below /tmp it would match
    everything there, other users' files too."""
    return not re.sub(rb"\[[^]]*\]|[*?.\\]", b"", name)


@dataclass(frozen=True)
class Places:
    """Where training state may be removed on one node, each as written and as resolved."""

    below: tuple[bytes, ...]  # strictly below /tmp, /var/tmp, /dev/shm (not inside the home)
    home: tuple[bytes, ...]  # the login home
    cache: tuple[bytes, ...]  # strictly below ~/.cache
    at: tuple[bytes, ...]  # ~/.nv, ~/.triton and all below


def places(snap: Snapshot) -> Places:
    """The node's places, from the login home and the physical paths facts.sh resolved."""

    def both(written: bytes, key: str) -> tuple[bytes, ...]:
        real = snap.places.get(key)
        return (written,) if real is None or real in (written, b"/") else (written, real)

    home = snap.home or b""
    below = both(b"/tmp", "tmp") + both(b"/var/tmp", "vartmp") + both(b"/dev/shm", "shm")
    if not home:
        return Places(below, (), (), ())
    return Places(
        below,
        both(home, "home") if home != b"/" else (),
        both(home + b"/.cache", "cache"),
        both(home + b"/.nv", "nv") + both(home + b"/.triton", "triton"),
    )


def outside(where: Places, path: bytes, glob: bool = False) -> str | None:
    """Why absolute, normalised `path` is not where training state lives, or None. Inside the
    login home only its own places count, even when the home is below /tmp; a glob is also
    refused when its first name below a place is only wildcards."""
    if any(path == d or path.startswith(d + b"/") for d in where.at):
        return None
    in_home = any(path == h or path.startswith(h + b"/") for h in where.home)
    for place in (*where.cache, *(() if in_home else where.below)):
        if not path.startswith(place + b"/"):
            continue
        first = path[len(place) + 1 :].split(b"/", 1)[0]
        if glob and only_wildcards(first):
            return f"'{decode(first)}' matches everything in {decode(place)}"
        return None
    return f"not where training state lives ({STATE_PLACES_TEXT})"


@dataclass(frozen=True)
class Paths:
    """What the state part does with each match."""

    refused_globs: tuple[tuple[str, str], ...] = ()  # (glob, why): the node is left alone
    outside: tuple[PathMatch, ...] = ()  # resolve outside the places: the state part refuses
    refused: tuple[PathMatch, ...] = ()  # resolve to /, the home or the login home
    remove: tuple[PathMatch, ...] = ()
    after_kill: tuple[PathMatch, ...] = ()  # held only by processes being killed
    kept: tuple[tuple[PathMatch, tuple[int, ...]], ...] = ()
    no_home: tuple[str, ...] = ()  # ~ globs skipped: the login home is unknown


def holders_of(snap: Snapshot, match: PathMatch, links: Sequence[Link]) -> tuple[int, ...]:
    """Processes using the match or anything below it: an fd, cwd, mapping, bound unix socket
    or environment value. A symlink has none: removing it pulls nothing from under anyone."""
    if match.kind == "l":
        return ()
    real = match.real
    return tuple(
        sorted(
            {
                link.pid
                for link in links
                if link.pid in snap.procs
                and (link.target == real or link.target.startswith(real + b"/"))
            }
        )
    )


def holds(snap: Snapshot, pid: int, match: PathMatch) -> bool:
    """Whether `pid`'s use of `match` keeps it: a use by root, by fleet's own uids or by the
    match's owner. Any user can name a path in their environment, or open or enter a directory
    anyone may read: a stranger's sleep with HOLD=/tmp/cuda_x kept the run's ghost state on
    the node for good. Counted when the owner or the user is not known: the cautious side."""
    uid = snap.record(pid).uid
    return match.owner is None or uid < 0 or uid in {0, match.owner, *fleet_uids(snap)}


def decide_paths(
    snap: Snapshot, spec: CleanupSpec, whom: Who, killing: Iterable[int] = ()
) -> Paths:
    where = places(snap)
    home = snap.home or b""
    refused_globs: list[tuple[str, str]] = []
    no_home = []
    for index, glob in enumerate(spec.state_paths):
        if glob == "~" or glob.startswith("~/"):
            if not home:
                no_home.append(glob)
                continue
            written = home + glob[1:].encode("utf-8", "surrogateescape")
        elif not glob.startswith("/"):
            refused_globs.append((glob, "relative: give an absolute path or ~/..."))
            continue
        else:
            written = glob.encode("utf-8", "surrogateescape")
        if spec.allow_any_path:
            continue
        norm = normalise(written)
        why = outside(where, norm, glob=True)
        if why is None and (phys := normalise(snap.globs.get(index, norm))) != norm:
            why = outside(where, phys, glob=True)
            why = why and f"resolves to {decode(phys)}: {why}"
        elif why is not None and norm != glob.encode("utf-8", "surrogateescape"):
            why = f"{decode(norm)}: {why}"
        if why is not None:
            refused_globs.append((glob, why))
    if refused_globs:
        return Paths(refused_globs=tuple(refused_globs))
    matches = tuple({(m.path): m for m in snap.matches}.values())
    if not spec.allow_any_path:
        out = tuple(m for m in matches if outside(where, normalise(m.real)) is not None)
        if out:
            return Paths(outside=out, no_home=tuple(no_home))
    homes = {b"/", *(snap.places[k] for k in ("home", "henv") if k in snap.places)}
    killing = set(killing)
    links = snap.holders()
    refused, remove, after, kept = [], [], [], []
    for match in matches:
        if match.kind != "l" and match.real in homes:
            refused.append(match)
            continue
        users = tuple(
            pid
            for pid in holders_of(snap, match, links)
            if pid not in whom.own and holds(snap, pid, match)
        )
        if not users:
            remove.append(match)
        elif set(users) <= killing:
            after.append(match)
        else:
            kept.append((match, users))
    return Paths(
        refused=tuple(refused),
        remove=tuple(remove),
        after_kill=tuple(after),
        kept=tuple(kept),
        no_home=tuple(no_home),
    )


# ----------------------------------------------------------------------------------- the GPUs


@dataclass(frozen=True)
class Gpus:
    """Whether the GPUs may be reset now: `absent` (no nvidia-smi), `failed` (its query failed),
    `busy` (pids use a GPU), `reset`."""

    status: str
    busy: tuple[int, ...] = ()
    rc: int | None = None


def decide_gpus(snap: Snapshot) -> Gpus:
    if snap.smi_rc is None:
        return Gpus("absent")
    if snap.smi_rc != 0:
        return Gpus("failed", rc=snap.smi_rc)
    busy = tuple(sorted(set(snap.apps) | set(gpu_holders(snap))))
    return Gpus("busy", busy) if busy else Gpus("reset")
