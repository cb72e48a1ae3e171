"""fleet/node/preflight.py on synthetic snapshots: every check's verdict and wording, the lines
and exit code of the op, the vars it refuses before anything connects. No root, no sshd.

The same checks against real mounts, listeners and leftovers on sandbox nodes are in
tests/e2e/test_preflight.py; facts.sh's --dir-check on real directories in
tests/node/test_preflight_facts.py.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.core.result import CommandResult
from fleet.core.shell import Cmd, UndefinedVariable
from fleet.node.ere import compile_ere
from fleet.node.facts import (
    DirCheck,
    DiskFree,
    Link,
    Mount,
    PathMatch,
    Proc,
    Record,
    Snapshot,
)
from fleet.node.preflight import (
    CHECKS,
    GIB,
    PreflightOp,
    PreflightSpec,
    build,
    check_dir,
    check_free,
    check_fs,
    check_leftovers,
    check_port,
    check_shm,
    classify_fs,
    decide,
    holding_mount,
    human,
    spec_of,
    summary,
)
from fleet.node.step import OpVarError

CKPT = b"/mnt/nvme/ckpt"
MOUNTS = (
    Mount(b"/dev/vda1", b"/", "ext4", "rw"),
    Mount(b"tmpfs", b"/dev/shm", "tmpfs", "rw,size=65536k"),
    Mount(b"/dev/nvme0n1p1", b"/mnt/nvme", "xfs", "rw"),
    Mount(b"server:/export", b"/mnt/nfs", "nfs4", "rw"),
)
# init, our session (sshd -> sh -> facts.sh, all fleet's own), a dead run (torchrun and its
# renamed worker), a bystander
NODE = [
    (1, 0, 1, b"/sbin/init"),
    (60, 1, 60, b"sshd: root@notty"),
    (61, 60, 60, b"sh -s -- --pattern torchrun"),
    (62, 61, 60, b"sh -s -- --pattern torchrun"),
    (100, 1, 100, b"torchrun --nproc-per-node 2 train.py"),
    (101, 100, 100, b"pt_data_worker"),
    (200, 1, 200, b"jupyter-lab --port 8888"),
]


def dir_check(path: bytes = CKPT, **kw: Any) -> DirCheck:
    fields: dict[str, Any] = {
        "kind": "d",
        "write": 0,
        "near": path,
        "real": path,
        "df": DiskFree(900 * GIB, 600 * GIB, b"/mnt/nvme"),
    }
    fields.update(kw)
    return DirCheck(path=path, **fields)


def snapshot(
    rows: Iterable[tuple[int, int, int, bytes]] = NODE, self_pid: int = 62, **kw: Any
) -> Snapshot:
    """Every process gets a full record, as if each had matched."""
    rows = list(rows)
    fields: dict[str, Any] = {
        "mounts": MOUNTS,
        "df": {0: DiskFree(8 * GIB, 8 * GIB, b"/dev/shm")},
        "dir_check": dir_check(),
    }
    fields.update(kw)
    fields.setdefault("helper_uids", dict.fromkeys(kw.get("helpers", ()), (0, 0, 0, 0)))
    return Snapshot(
        self_pid=self_pid,
        fleet_uid=0,
        procs={pid: Proc(pid, ppid, pid, sid, 1000 + pid, "S") for pid, ppid, sid, _ in rows},
        records={pid: Record(pid, 0, cmd.replace(b" ", b"\0")) for pid, _, _, cmd in rows},
        **fields,
    )


def spec(**kw: Any) -> PreflightSpec:
    return PreflightSpec(directory=CKPT.decode(), **kw)


# ------------------------------------------------------------------------------ filesystems


@pytest.mark.parametrize(
    ("fstype", "verdict"),
    [
        ("nfs", "fail"),
        ("nfs4", "fail"),
        ("cifs", "fail"),
        ("smb3", "fail"),
        ("smb2", "fail"),  # GNU stat's name for SMB2/3 mounts
        ("lustre", "fail"),
        ("gpfs", "fail"),
        ("fuse.sshfs", "fail"),
        ("fuse.glusterfs", "fail"),
        ("fuse", "warn"),
        ("fuseblk", "warn"),  # every FUSE mount, as GNU stat names it
        ("fuse.something-new", "warn"),
        ("overlay", "fail"),  # the mount table
        ("overlayfs", "fail"),  # GNU stat
        ("aufs", "fail"),
        ("tmpfs", "warn"),
        ("ramfs", "warn"),
        ("ext2/ext3", "ok"),
        ("ext4", "ok"),
        ("EXT4", "ok"),
        ("xfs", "ok"),
        ("btrfs", "ok"),
        ("zfs", "ok"),
        ("UNKNOWN (0x1234abcd)", "warn"),
        ("squashfs", "warn"),
    ],
)
def test_each_filesystem_type_gets_its_verdict(fstype: str, verdict: str) -> None:
    assert classify_fs(fstype)[0] == verdict


def test_the_reasons_name_the_risk() -> None:
    assert "checkpoint storms on network storage" in classify_fs("nfs4")[1]
    assert "container overlay" in classify_fs("overlay")[1]
    assert "RAM" in classify_fs("tmpfs")[1]
    assert "FUSE" in classify_fs("fuse")[1]


def test_the_longest_mount_point_holding_the_path_wins_and_the_last_of_equal_ones() -> None:
    over = Mount(b"other", b"/mnt/nvme", "tmpfs", "rw")  # mounted over /mnt/nvme later
    mounts = (*MOUNTS, Mount(b"x", b"/mnt/nvme2", "ext4", "rw"), over)

    assert holding_mount(mounts, b"/mnt/nvme/ckpt") == over
    assert holding_mount(mounts, b"/mnt/nvme2/a") == mounts[-2]  # not /mnt/nvme's
    assert holding_mount(mounts, b"/mnt/nvme") == over
    assert holding_mount(mounts, b"/home/a") == MOUNTS[0]
    assert holding_mount((), b"/x") is None


@given(st.lists(st.sampled_from([b"/", b"/a", b"/a/b", b"/ab", b"/a/b/c"]), max_size=6))
def test_the_holding_mount_is_always_a_parent_and_none_is_longer(points: list[bytes]) -> None:
    mounts = [Mount(b"d", p, "ext4", "rw") for p in points]
    path = b"/a/b/c/d"
    found = holding_mount(mounts, path)
    parents = [p for p in points if path.startswith(p.rstrip(b"/") + b"/")]
    if not parents:
        assert found is None
    else:
        assert found is not None
        assert len(found.point) == max(len(p) for p in parents)


def test_fs_names_the_mount_with_its_escaped_blanks_shown_plain() -> None:
    ram = b"/tmp/ram disk"  # facts.py turns /proc/self/mounts' \040 back into a blank
    snap = snapshot(mounts=(*MOUNTS, Mount(b"fleet-ram", ram, "tmpfs", "rw")))

    check = check_fs(snap, dir_check(ram))

    assert check.verdict == "warn"
    assert check.reason.startswith(
        "/tmp/ram disk is on tmpfs (fleet-ram mounted at /tmp/ram disk): "
    )


def test_fs_of_a_missing_dir_looks_at_its_nearest_parent_and_says_so() -> None:
    missing = dir_check(b"/mnt/nfs/run1/ckpt", kind="n", write=None, near=b"/mnt/nfs")
    check = check_fs(snapshot(), missing)

    assert check.verdict == "fail"
    assert check.reason.startswith(
        "/mnt/nfs (nearest existing parent of /mnt/nfs/run1/ckpt) is on nfs4 "
        "(server:/export mounted at /mnt/nfs): network filesystem"
    )


def test_fs_goes_by_the_physical_path_of_a_symlinked_dir() -> None:
    linked = dir_check(b"/data/ckpt", real=b"/mnt/nfs/ckpt")
    assert check_fs(snapshot(), linked).reason.startswith("/data/ckpt is on nfs4 (server:/export")


def test_fs_without_a_mount_warns() -> None:
    check = check_fs(snapshot(mounts=()), dir_check())
    assert (check.verdict, check.reason) == (
        "warn",
        "cannot tell the filesystem type of /mnt/nvme/ckpt (no mount holds it)",
    )


# ------------------------------------------------------------------------------- dir, free


@pytest.mark.parametrize(
    ("fields", "verdict", "reason"),
    [
        ({}, "ok", "/mnt/nvme/ckpt is a writable directory"),
        ({"kind": "n", "write": None}, "fail", "/mnt/nvme/ckpt does not exist on this node"),
        (
            {"kind": "l", "write": None},
            "fail",
            "/mnt/nvme/ckpt is a symlink to nothing on this node",
        ),
        ({"kind": "o", "write": None}, "fail", "/mnt/nvme/ckpt exists but is not a directory"),
        (
            {"write": 1, "text": b"Read-only file system\n"},
            "fail",
            "/mnt/nvme/ckpt is not writable (Read-only file system)",
        ),
        ({"write": 1}, "fail", "/mnt/nvme/ckpt is not writable (cannot create a file)"),
        (
            {"write": 2, "text": b"/mnt/nvme/ckpt/.fleet-preflight.9"},
            "fail",
            "/mnt/nvme/ckpt: created /mnt/nvme/ckpt/.fleet-preflight.9 but could not remove it",
        ),
    ],
)
def test_dir(fields: dict[str, Any], verdict: str, reason: str) -> None:
    check = check_dir(dir_check(**fields))
    assert (check.verdict, check.reason) == (verdict, reason)


def test_a_path_that_is_no_utf8_is_shown_with_escapes_not_lost() -> None:
    check = check_dir(dir_check(b"/mnt/\xffckpt", kind="n", write=None))
    assert check.reason == "/mnt/\\xffckpt does not exist on this node"


@pytest.mark.parametrize(
    ("available", "minimum", "verdict", "reason"),
    [
        (600 * GIB, 50, "ok", "600.0 GB free on /mnt/nvme/ckpt (>= 50 GB)"),
        (50 * GIB, 50, "ok", "50.0 GB free on /mnt/nvme/ckpt (>= 50 GB)"),
        (
            64 * 1024**2,
            0.5,
            "fail",
            "only 64 MB free on /mnt/nvme/ckpt, 0.5 GB required (65536 KB available)",
        ),
        (
            int(12.34 * GIB),
            999999,
            "fail",
            f"only 12.3 GB free on /mnt/nvme/ckpt, 999999 GB required ({int(12.34 * GIB) // 1024} "
            "KB available)",
        ),
        (6 * 1024**2, 0.005, "ok", "6 MB free on /mnt/nvme/ckpt (>= 0.005 GB)"),
    ],
)
def test_free(available: int, minimum: float, verdict: str, reason: str) -> None:
    check = check_free(dir_check(df=DiskFree(900 * GIB, available, b"/")), minimum)
    assert (check.verdict, check.reason) == (verdict, reason)


def test_free_without_df_warns() -> None:
    check = check_free(dir_check(df=None), 50)
    assert (check.verdict, check.reason) == (
        "warn",
        "df -Pk cannot tell the free space of /mnt/nvme/ckpt",
    )


@given(st.integers(min_value=0, max_value=2**50))
def test_human_sizes_are_powers_of_1024_in_mb_then_tenths_of_gb(size: int) -> None:
    shown = human(size)
    if size < GIB:
        assert shown == f"{size // 1024**2} MB"
    else:
        m = re.fullmatch(r"(\d+)\.(\d) GB", shown)
        assert m, shown
        assert abs(float(shown[:-3]) - size / GIB) <= 0.05 + 1e-9


# ------------------------------------------------------------------------- port, leftovers


LISTENER: dict[str, Any] = {
    "listens": ((39500, 777),),
    "links": (Link(200, "fd", b"socket:[777]"),),
}


def test_a_held_port_fails_on_rank_0_naming_the_holder() -> None:
    check = check_port(snapshot(**LISTENER), spec(port=39500))
    assert check.verdict == "fail"
    assert check.reason == (
        "port 39500 is already in use by 200 (jupyter-lab --port 8888): the rendezvous would "
        "collide; free it (fleet cleanup) or pick another port"
    )


def test_a_port_held_by_another_users_program_says_cleanup_will_not_free_it() -> None:
    """Cleanup leaves a stranger's unrelated program on the port (decide_port): the hint must
    not send the operator to it."""
    snap = snapshot(**LISTENER)
    snap.records[200] = dataclasses.replace(snap.records[200], uid=1234)
    check = check_port(snap, spec(port=39500))
    assert check.verdict == "fail"
    assert check.reason.endswith(
        "the rendezvous would collide; cleanup leaves it (not fleet's): have it stopped or pick "
        "another port"
    )


def test_a_port_held_by_no_visible_process_fails_and_says_so() -> None:
    check = check_port(snapshot(listens=((39500, 777),)), spec(port=39500))
    assert check.verdict == "fail"
    assert check.reason.startswith(
        "port 39500 is already in use by a socket no visible process owns (another user's"
    )


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"port": 39500}, "port 39500 is free"),
        ({"port": 39500, "rank": 3}, "not checked (rank 3)"),
        ({"port": None}, "not checked (no --port)"),
    ],
)
def test_port_ok(kw: dict[str, Any], reason: str) -> None:
    held_elsewhere = snapshot(listens=((29500, 5),), links=(Link(200, "fd", b"socket:[5]"),))
    check = check_port(held_elsewhere, spec(**kw))
    assert (check.verdict, check.reason) == ("ok", reason)


def _patterns(*sources: str) -> tuple[Any, ...]:
    return tuple(compile_ere(s) for s in sources)


def test_leftovers_count_matches_and_descendants_but_never_fleet_s_own_session() -> None:
    # fleet's own shells (61, 62) carry the pattern in their argv: not leftovers.
    state = PathMatch(0, 0, "f", b"/dev/shm/torch_1", b"/dev/shm/torch_1")
    check = check_leftovers(
        snapshot(matches=(state, state)),
        spec(patterns=_patterns("torchrun"), state_paths=("/dev/shm/torch_*",)),
    )
    assert (check.verdict, check.reason) == (
        "warn",
        "leftover training processes or torch state (2 processes, 1 path): run fleet cleanup",
    )


def test_marked_helpers_are_not_leftovers() -> None:
    rows = [*NODE, (300, 1, 300, b"sh -s -- --pattern torchrun"), (301, 300, 300, b"grep torchrun")]
    check = check_leftovers(
        snapshot(rows, helpers=frozenset({300})), spec(patterns=_patterns("torchrun"))
    )
    assert check.reason.startswith("leftover training processes or torch state (2 processes, ")


@pytest.mark.parametrize(
    ("snap_kw", "spec_kw", "verdict", "reason"),
    [
        ({}, {}, "ok", "not checked (no --pattern or --path)"),
        (
            {},
            {"patterns": _patterns("nothing-like-this")},
            "ok",
            "no training process or torch/CUDA state left",
        ),
        (
            {"grep_failed": True},
            {"patterns": _patterns("x")},
            "fail",
            "the node's grep -E rejects the patterns",
        ),
    ],
)
def test_leftovers_otherwise(
    snap_kw: dict[str, Any], spec_kw: dict[str, Any], verdict: str, reason: str
) -> None:
    check = check_leftovers(snapshot(**snap_kw), spec(**spec_kw))
    assert (check.verdict, check.reason) == (verdict, reason)


# -------------------------------------------------------------------------------------- shm


@pytest.mark.parametrize(
    ("snap_kw", "minimum", "verdict", "reason"),
    [
        ({}, 1, "ok", "/dev/shm is 8.0 GB (>= 1 GB)"),
        (
            {"df": {0: DiskFree(64 * 1024**2, 64 * 1024**2, b"/dev/shm")}},
            1,
            "warn",
            "/dev/shm is only 64 MB (< 1 GB): Docker's default 64 MB breaks NCCL and DataLoader "
            "workers; give the container --shm-size or --ipc=host",
        ),
        ({"df": {}}, 1, "warn", "df -Pk cannot tell the size of /dev/shm"),
        (
            {"df": {}, "mounts": MOUNTS[:1]},
            1,
            "warn",
            "/dev/shm does not exist: NCCL and DataLoader workers need shared memory",
        ),
    ],
)
def test_shm(snap_kw: dict[str, Any], minimum: float, verdict: str, reason: str) -> None:
    check = check_shm(snapshot(**snap_kw), minimum)
    assert (check.verdict, check.reason) == (verdict, reason)


# ------------------------------------------------------------------------------ the op


@dataclass
class FakeNode:
    """HostIO that answers the facts command with a canned report (the op's I/O seam)."""

    report: list[str]
    exit_code: int = 0
    emitted: list[tuple[str, str]] = field(default_factory=list)
    commands: list[Cmd] = field(default_factory=list)

    def run(self, cmd: Cmd, on_line: Any) -> CommandResult:
        self.commands.append(cmd)
        for line in self.report:
            on_line("stdout", line)
        return CommandResult(self.exit_code)

    def emit(self, stream: str, line: str) -> None:
        self.emitted.append((stream, line))


def _report(snap_text: Iterable[str]) -> list[str]:
    blob = b"".join(x.encode() + b"\0" for x in snap_text).hex()
    return ["facts 1", "self 62", "t 62 1 62 62 1000 S", *(f"x {blob[i:i + 64]}" for i in
            range(0, len(blob), 64)), "end"]  # fmt: skip


def test_the_op_says_every_check_once_fails_on_stderr_and_sums_up_last() -> None:
    node = FakeNode(
        _report(
            [
                "dir n /mnt/nvme/ckpt",
                "dirat /mnt/nvme",
                "dirreal /mnt/nvme",
                "dirdf /dev/x 100 50 50 50% /mnt/nvme",
                "mount /dev/x /mnt/nvme xfs rw 0 0",
            ]
        )
    )
    op = build({"output_dir": "/mnt/nvme/ckpt"}, sudo=False, timeout_s=60, password_on_stdin=False)

    result = op.run(node)

    names = [line.split()[1].rstrip(":") for _, line in node.emitted[:-1]]
    assert names == list(CHECKS)
    assert [s for s, line in node.emitted if line.startswith("fail ")] == ["stderr"]
    assert node.emitted[-1] == ("stdout", "preflight: 4 ok, 1 warn, 1 fail")
    assert result.exit_code == 1
    assert result.stdout_tail[-1] == "preflight: 4 ok, 1 warn, 1 fail"
    assert result.stderr_tail == ("fail  dir: /mnt/nvme/ckpt does not exist on this node",)
    assert "--dir-check /mnt/nvme/ckpt" in node.commands[0].display


@pytest.mark.parametrize(
    ("report", "code", "why"),
    [
        (["facts 1", "self 1"], 0, "facts.sh said something fleet cannot read: incomplete"),
        ([], 127, "facts.sh failed on this node (exit 127)"),
    ],
)
def test_a_node_whose_facts_fail_fails_with_why(report: list[str], code: int, why: str) -> None:
    node = FakeNode(report, exit_code=code)
    op = build({"output_dir": "/x"}, sudo=False, timeout_s=60, password_on_stdin=False)

    result = op.run(node)

    assert result.exit_code == 1
    assert result.stderr_tail[0].startswith(f"fail  preflight: {why}")


def test_all_checks_in_order_and_the_summary_counts_them() -> None:
    checks = decide(snapshot(**LISTENER), spec(port=39500, patterns=_patterns("torchrun")))
    assert [c.name for c in checks] == list(CHECKS)
    assert [c.verdict for c in checks] == ["ok", "ok", "ok", "fail", "warn", "ok"]
    assert summary(checks) == "preflight: 4 ok, 1 warn, 1 fail"


# ------------------------------------------------------------------------------ the vars


def test_vars_become_the_spec() -> None:
    got = spec_of(
        {
            "output_dir": "~/ckpt",
            "host_index": 2,
            "master_port": "29500",
            "min_free_gb": "0.5",
            "min_shm_gb": 1,
            "patterns": ["torchrun"],
            "state_paths": ["/dev/shm/torch_*"],
        }
    )
    assert (got.directory, got.rank, got.port, got.min_free_gb, got.min_shm_gb) == (
        "~/ckpt",
        2,
        29500,
        0.5,
        1.0,
    )
    assert [p.source for p in got.patterns] == ["torchrun"]
    assert spec_of({"output_dir": "/c", "master_port": ""}).port is None


@pytest.mark.parametrize(
    ("variables", "var"),
    [
        ({"output_dir": ""}, "output_dir"),
        ({"output_dir": "/a\nb"}, "output_dir"),
        ({"output_dir": "/c", "master_port": "70000"}, "master_port"),
        ({"output_dir": "/c", "master_port": "x"}, "master_port"),
        ({"output_dir": "/c", "min_free_gb": "lots"}, "min_free_gb"),
        ({"output_dir": "/c", "min_shm_gb": "-1"}, "min_shm_gb"),
        ({"output_dir": "/c", "patterns": ["a\\d"]}, "patterns"),
        ({"output_dir": "/c", "patterns": [".*"]}, "patterns"),
        ({"output_dir": "/c", "state_paths": ["/tmp/a\nb"]}, "state_paths"),
    ],
)
def test_bad_vars_are_refused_naming_the_var(variables: dict[str, Any], var: str) -> None:
    with pytest.raises(OpVarError) as err:
        spec_of(variables)
    assert err.value.var == var
    assert err.value.hint


def test_no_output_dir_is_an_undefined_variable() -> None:
    with pytest.raises(UndefinedVariable):
        spec_of({"patterns": []})


def test_the_port_is_looked_at_on_rank_0_only() -> None:
    zero = build(
        {"output_dir": "/c", "master_port": 39500, "host_index": 0},
        sudo=False,
        timeout_s=60,
        password_on_stdin=False,
    )
    one = build(
        {"output_dir": "/c", "master_port": 39500, "host_index": 1},
        sudo=False,
        timeout_s=60,
        password_on_stdin=False,
    )
    assert isinstance(zero, PreflightOp)
    assert "--port 39500" in zero.cmd.display
    assert "--port" not in one.cmd.display
    assert "FLEET_NODE_HELPER=1" in zero.cmd.command
