"""`fleet preflight`: the checks before a launch, decided from one look at each node.

`op: preflight` (playbooks/preflight.yaml) runs facts.sh once per node (fleet/node/facts.py: the
output dir with a write probe, the mount table, /dev/shm's size, the leftover patterns and state
paths and, on rank 0 only, the master port's listeners) and decides every check here, from that
report alone. Each check is one line, `VERDICT  CHECK: reason` (the verdict padded to four
characters, then two spaces): ok and warn on stdout, fail on stderr only (fleet's summary shows a
failed host's stderr tail; a line on both streams would show twice). The last stdout line is
`preflight: N ok, N warn, N fail`; the step fails (exit 1) when any check failed.

    dir        the output dir exists, is a directory and is writable: a file is really created
               and removed (permission bits say nothing of a read-only mount; root passes them)
    fs         its filesystem, from the mount that holds it: network filesystems and container
               overlays fail (PITFALLS 18), tmpfs/ramfs and unknown FUSE filesystems warn, local
               disk filesystems are ok
    free       free space on that filesystem >= min_free_gb
    port       rank 0 only: nothing listens on the master port (PITFALLS 17), its holder named
    leftovers  processes matching the patterns (fleet's own aside) or state paths left: warn
    shm        /dev/shm is at least min_shm_gb (Docker's default is 64 MB)

When the dir does not exist, fs and free look at its nearest existing parent (where it would be
created) and say so. Sizes: 1 GB = 1024^3 bytes, as df -h counts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.core import defaults
from fleet.core.digits import is_digits
from fleet.core.result import CommandResult
from fleet.core.shell import Cmd, UndefinedVariable, to_text
from fleet.node.cleanup import plural
from fleet.node.commands import exit_text, script_cmd
from fleet.node.decide import decide_port, descendants, matched, who
from fleet.node.ere import BadPattern, Pattern, compile_ere
from fleet.node.facts import (
    DirCheck,
    FactsError,
    Mount,
    Snapshot,
    decode,
    facts_args,
    parse,
)
from fleet.node.step import HostIO, OpVarError

GIB = 1024**3
MIB = 1024**2
SHM = "/dev/shm"
CHECKS = ("dir", "fs", "free", "port", "leftovers", "shm")
NETWORK_FS = frozenset({
    "nfs", "nfs3", "nfs4", "cifs", "smb", "smbfs", "smb2", "smb3", "lustre", "gpfs", "beegfs",
    "fhgfs", "glusterfs", "ceph", "afs", "k-afs", "kafs", "coda", "9p", "v9fs", "novell", "ncpfs",
    "ocfs2", "gfs", "gfs2", "gfs/gfs2", "panfs", "ibrix", "acfs", "snfs", "wekafs", "orangefs",
    "pvfs2", "sshfs", "s3fs", "davfs", "fuse.sshfs", "fuse.glusterfs", "fuse.ceph",
    "fuse.ceph-fuse", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone", "fuse.juicefs", "fuse.goofys",
    "fuse.blobfuse", "fuse.blobfuse2", "fuse.mfs", "fuse.moosefs", "fuse.lizardfs",
    "fuse.quobyte", "fuse.cvmfs2", "fuse.beegfs", "fuse.davfs", "fuse.weka",
})  # fmt: skip
OVERLAY_FS = frozenset({"overlay", "overlayfs", "aufs", "fuse-overlayfs", "fuse.fuse-overlayfs"})
LOCAL_FS = frozenset({
    "ext2/ext3", "ext2", "ext3", "ext4", "ext4dev", "xfs", "btrfs", "zfs", "f2fs", "jfs",
    "reiserfs", "bcachefs",
})  # fmt: skip


@dataclass(frozen=True)
class Check:
    """One check's verdict (ok, warn, fail) and why."""

    verdict: str
    name: str
    reason: str

    def line(self) -> str:
        return f"{self.verdict:<4}  {self.name}: {self.reason}"


@dataclass(frozen=True)
class PreflightSpec:
    """What the operator asked preflight to check on one node."""

    directory: str
    rank: int = 0
    port: int | None = None
    min_free_gb: float = 0.0
    min_shm_gb: float = 0.0
    patterns: tuple[Pattern, ...] = ()
    state_paths: tuple[str, ...] = ()


# ------------------------------------------------------------------------------- the checks


def gb(value: float) -> str:
    """A threshold as the operator wrote it: 50, 0.5, 0.005."""
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}".rstrip("0")


def human(size: int) -> str:
    """Bytes for people: `64 MB` below 1 GB, else `12.3 GB` (powers of 1024, as df -h)."""
    if size < GIB:
        return f"{size // MIB} MB"
    tenths = (size * 10 + GIB // 2) // GIB
    return f"{tenths // 10}.{tenths % 10} GB"


def classify_fs(fstype: str) -> tuple[str, str]:
    """(verdict, why) for a filesystem type, as the mount table names it (ext4, nfs4, overlay,
    fuse.sshfs) or as GNU `stat -f -c %T` does (ext2/ext3, smb2, fuseblk, UNKNOWN (0x...))."""
    kind = fstype.lower()
    if kind in NETWORK_FS:
        return "fail", (
            "network filesystem: checkpoint storms on network storage stall the node; "
            "use node-local disk"
        )
    if kind in OVERLAY_FS:
        return "fail", (
            "container overlay: checkpoints fill the root disk; "
            "mount node-local storage into the container"
        )
    if kind in ("tmpfs", "ramfs"):
        return "warn", "node-local but RAM: checkpoints use memory and are gone after a reboot"
    if kind in ("fuse", "fuseblk") or kind.startswith("fuse."):
        return "warn", "unknown FUSE filesystem: make sure it is node-local"
    if kind in LOCAL_FS:
        return "ok", "node-local disk"
    return "warn", "unrecognised filesystem type: make sure it is node-local disk"


def holding_mount(mounts: Sequence[Mount], path: bytes) -> Mount | None:
    """The mount that holds physical `path`: the longest mount point that is it or one of its
    parents; of equal ones, the last listed (it is mounted over the others)."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.point.rstrip(b"/")
        if path != mount.point and not path.startswith(point + b"/"):
            continue
        if best is None or len(mount.point) >= len(best.point):
            best = mount
    return best


def where(dir_check: DirCheck) -> str:
    """Where fs and free look: the dir, or its nearest existing parent, said so."""
    if dir_check.near == dir_check.path:
        return decode(dir_check.path)
    return f"{decode(dir_check.near)} (nearest existing parent of {decode(dir_check.path)})"


def check_dir(dir_check: DirCheck) -> Check:
    path = decode(dir_check.path)
    if dir_check.kind == "n":
        return Check("fail", "dir", f"{path} does not exist on this node")
    if dir_check.kind == "l":
        return Check("fail", "dir", f"{path} is a symlink to nothing on this node")
    if dir_check.kind == "o":
        return Check("fail", "dir", f"{path} exists but is not a directory")
    if dir_check.write == 0:
        return Check("ok", "dir", f"{path} is a writable directory")
    text = decode(dir_check.text).strip().splitlines() or [""]
    if dir_check.write == 2:
        return Check("fail", "dir", f"{path}: created {text[0]} but could not remove it")
    why = text[-1][:200] or "cannot create a file"
    return Check("fail", "dir", f"{path} is not writable ({why})")


def check_fs(snap: Snapshot, dir_check: DirCheck) -> Check:
    mount = holding_mount(snap.mounts, dir_check.real) if dir_check.real else None
    if mount is None:
        return Check(
            "warn",
            "fs",
            f"cannot tell the filesystem type of {where(dir_check)} (no mount holds it)",
        )
    verdict, why = classify_fs(mount.fstype)
    on = f"{mount.fstype} ({decode(mount.device)} mounted at {decode(mount.point)})"
    return Check(verdict, "fs", f"{where(dir_check)} is on {on}: {why}")


def check_free(dir_check: DirCheck, min_free_gb: float) -> Check:
    df = dir_check.df
    if df is None:
        return Check("warn", "free", f"df -Pk cannot tell the free space of {where(dir_check)}")
    have = human(df.available)
    if df.available >= min_free_gb * GIB:
        return Check("ok", "free", f"{have} free on {where(dir_check)} (>= {gb(min_free_gb)} GB)")
    return Check(
        "fail",
        "free",
        f"only {have} free on {where(dir_check)}, {gb(min_free_gb)} GB required "
        f"({df.available // 1024} KB available)",
    )


def check_port(snap: Snapshot, spec: PreflightSpec) -> Check:
    if spec.rank != 0:
        return Check("ok", "port", f"not checked (rank {spec.rank})")
    if spec.port is None:
        return Check("ok", "port", "not checked (no --port)")
    port = decide_port(snap, spec.port, who(snap))
    if not port.held:
        return Check("ok", "port", f"port {spec.port} is free")
    if port.holders:
        by = "by " + ", ".join(f"{pid} ({snap.record(pid).shown()})" for pid in port.holders)
    else:
        by = "by a socket no visible process owns (another user's or another container's?)"
    # held only by what cleanup leaves (another user's program, a daemon): it would not free it
    if port.holders and not port.stop:
        fix = "cleanup leaves it (not fleet's): have it stopped or pick another port"
    else:
        fix = "free it (fleet cleanup) or pick another port"
    return Check(
        "fail",
        "port",
        f"port {spec.port} is already in use {by}: the rendezvous would collide; {fix}",
    )


def leftover_processes(snap: Snapshot, patterns: Sequence[Pattern]) -> set[int]:
    """What a cleanup with these patterns would kill: matches and their descendants, never
    fleet's own processes, their ancestors or pid 1 (the guards aside)."""
    whom = who(snap)
    return descendants(snap, matched(snap, patterns, whom)) - whom.own - whom.ancestry - {1}


def check_leftovers(snap: Snapshot, spec: PreflightSpec) -> Check:
    if not spec.patterns and not spec.state_paths:
        return Check("ok", "leftovers", "not checked (no --pattern or --path)")
    if snap.grep_failed:
        return Check("fail", "leftovers", "the node's grep -E rejects the patterns")
    procs = len(leftover_processes(snap, spec.patterns)) if spec.patterns else 0
    paths = len({match.path for match in snap.matches})
    if not procs and not paths:
        return Check("ok", "leftovers", "no training process or torch/CUDA state left")
    return Check(
        "warn",
        "leftovers",
        f"leftover training processes or torch state ({plural(procs, 'process')}, "
        f"{plural(paths, 'path')}): run fleet cleanup",
    )


def check_shm(snap: Snapshot, min_shm_gb: float) -> Check:
    df = snap.df.get(0)
    if df is None:
        if any(mount.point == SHM.encode() for mount in snap.mounts):
            return Check("warn", "shm", f"df -Pk cannot tell the size of {SHM}")
        return Check(
            "warn", "shm", f"{SHM} does not exist: NCCL and DataLoader workers need shared memory"
        )
    size = human(df.total)
    if df.total < min_shm_gb * GIB:
        return Check(
            "warn",
            "shm",
            f"{SHM} is only {size} (< {gb(min_shm_gb)} GB): Docker's default 64 MB breaks NCCL "
            "and DataLoader workers; give the container --shm-size or --ipc=host",
        )
    return Check("ok", "shm", f"{SHM} is {size} (>= {gb(min_shm_gb)} GB)")


def decide(snap: Snapshot, spec: PreflightSpec) -> tuple[Check, ...]:
    """Every check, in CHECKS order, from one snapshot taken with `args(spec)`."""
    dir_check = snap.dir_check
    if dir_check is None:
        raise FactsError("no --dir-check report")
    return (
        check_dir(dir_check),
        check_fs(snap, dir_check),
        check_free(dir_check, spec.min_free_gb),
        check_port(snap, spec),
        check_leftovers(snap, spec),
        check_shm(snap, spec.min_shm_gb),
    )


def summary(checks: Sequence[Check]) -> str:
    counts = [sum(1 for c in checks if c.verdict == v) for v in ("ok", "warn", "fail")]
    return "preflight: {} ok, {} warn, {} fail".format(*counts)


def args(spec: PreflightSpec) -> list[str]:
    """facts.sh's arguments for these checks (the port only on rank 0)."""
    return facts_args(
        [p.source for p in spec.patterns],
        spec.state_paths,
        spec.port if spec.rank == 0 else None,
        mounts=True,
        df=[SHM],
        dir_check=spec.directory,
    )


# ------------------------------------------------------------------------------ the vars


def _gb(var: str, value: Any) -> float:
    text = to_text(value).strip()
    try:
        number = float(text)
    except ValueError:
        number = -1.0
    if not 0 <= number <= 1e9:
        raise OpVarError(var, f"{var}: '{text}' is not a number of GB", f"--var {var}=50 (or 0.5)")
    return number


def spec_of(variables: Mapping[str, Any]) -> PreflightSpec:
    """The preflight vars, checked; UndefinedVariable without an output dir, OpVarError for the
    first value it cannot use."""
    if "output_dir" not in variables:
        raise UndefinedVariable("output_dir")
    directory = to_text(variables["output_dir"])
    if not directory.strip() or "\n" in directory or "\0" in directory:
        raise OpVarError(
            "output_dir",
            f"output_dir: '{directory}' is not a directory name",
            "pass --dir /path/on/the/nodes, or set output_dir in the inventory",
        )
    port_text = to_text(variables.get("master_port", "")).strip()
    port = None
    if port_text:
        if not is_digits(port_text) or not 1 <= int(port_text) <= 65535:
            raise OpVarError(
                "master_port",
                f"master_port: '{port_text}' is not a port number",
                f"--port {defaults.PORT}",
            )
        port = int(port_text)
    patterns = []
    raw = variables.get("patterns") or []
    for item in raw if isinstance(raw, (list, tuple)) else [raw]:
        try:
            patterns.append(compile_ere(to_text(item)))
        except BadPattern as exc:
            raise OpVarError("patterns", f"--pattern '{to_text(item)}': {exc}", exc.hint) from None
    raw = variables.get("state_paths") or []
    paths = tuple(to_text(p) for p in (raw if isinstance(raw, (list, tuple)) else [raw]) if p)
    if any("\n" in p for p in paths):
        raise OpVarError("state_paths", "state path holds a newline", "one path per item")
    index = to_text(variables.get("host_index", 0))
    return PreflightSpec(
        directory=directory,
        rank=int(index) if is_digits(index) else 0,
        port=port,
        min_free_gb=_gb("min_free_gb", variables.get("min_free_gb", 0)),
        min_shm_gb=_gb("min_shm_gb", variables.get("min_shm_gb", 0)),
        patterns=tuple(patterns),
        state_paths=paths,
    )


# --------------------------------------------------------------------------------- the op

FACTS_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class PreflightOp:
    """`op: preflight` for one host: facts.sh once, then every check decided here."""

    spec: PreflightSpec
    cmd: Cmd
    stdin_name: str = "facts.sh"

    def describe(self) -> str:
        return (
            "then every check (dir, fs, free, port, leftovers, shm) decided from that one look; "
            "nothing changes on the node (the dir check creates and removes one probe file)"
        )

    def run(self, io: HostIO) -> CommandResult:
        started = time.monotonic()
        report: list[str] = []

        def on_line(stream: str, line: str) -> None:
            if stream == "stdout":
                report.append(line)
            else:
                io.emit(stream, line)

        result = io.run(self.cmd, on_line)
        if result.cancelled or result.timed_out:
            return result
        problem = f"facts.sh failed on this node ({exit_text(result)})"
        try:
            checks = decide(parse(report), self.spec) if result.exit_code == 0 else None
        except FactsError as exc:
            checks, problem = None, f"facts.sh said something fleet cannot read: {exc}"
        if checks is None:
            line = f"fail  preflight: {problem}"
            io.emit("stderr", line)
            return CommandResult(1, (), (line,), time.monotonic() - started)
        out: list[str] = []
        failed: list[str] = []
        for check in checks:
            (failed if check.verdict == "fail" else out).append(check.line())
            io.emit("stderr" if check.verdict == "fail" else "stdout", check.line())
        out.append(summary(checks))
        io.emit("stdout", out[-1])
        return CommandResult(
            1 if failed else 0, tuple(out), tuple(failed), time.monotonic() - started
        )


def build(
    variables: Mapping[str, Any],
    *,
    sudo: bool,
    timeout_s: float | None,
    password_on_stdin: bool,
) -> PreflightOp:
    """The planned op for one host; UndefinedVariable / OpVarError for a var it cannot use."""
    spec = spec_of(variables)
    cap = min(FACTS_TIMEOUT_S, timeout_s) if timeout_s else FACTS_TIMEOUT_S
    cmd = script_cmd(
        "facts.sh", args(spec), sudo=sudo, timeout_s=cap, password_on_stdin=password_on_stdin
    )
    return PreflightOp(spec, cmd)
