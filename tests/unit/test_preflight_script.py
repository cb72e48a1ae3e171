"""fleet/remote/preflight.sh, run locally (no root, no node): the filesystem verdicts and the
output contract `fleet preflight` relies on.

The script text comes from fleet's own loader, so `# fleet:include cleanup.sh as CLEANUP_SH` is
resolved exactly as when fleet sends it. The real checks against real mounts, listeners and
leftovers on sandbox nodes are in tests/cluster/test_preflight.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleet.playbook import load_playbook

REPO = Path(__file__).resolve().parents[2]
PREFLIGHT = REPO / "fleet" / "remote" / "preflight.sh"
CHECKS = ["dir", "fs", "free", "port", "leftovers", "shm"]
LINE = re.compile(r"^(ok|warn|fail) +(\w+): (.*)$")
SUMMARY = re.compile(r"^preflight: (\d+) ok, (\d+) warn, (\d+) fail$")
# What a node may have: the shell's builtins plus these (no python, ps, ss, fuser, findmnt).
CLEANUP_TOOLS = ["tr", "ls", "grep", "sed", "cut", "sort", "rm", "sleep", "timeout", "cat"]
NODE_TOOLS = [*CLEANUP_TOOLS, "stat", "df"]
SHELLS = ["dash", "bash", "busybox"]


@pytest.fixture(scope="module")
def script() -> str:
    text = load_playbook("preflight").steps[0].script
    assert text is not None
    assert "CLEANUP_SH=$(cat <<'" in text
    assert "# fleet:include" not in text
    return text


@dataclass
class Result:
    rc: int
    lines: list[str]
    stderr: str

    def checks(self) -> list[tuple[str, str, str]]:
        """(verdict, check, reason) of every stdout line before the summary and every stderr
        line (where fail lines go); each must parse."""
        out = []
        for line in self.lines[:-1] + self.stderr.splitlines():
            m = LINE.match(line)
            assert m, f"not a check line: {line!r}"
            out.append((m.group(1), m.group(2), m.group(3)))
        return out

    def check(self, name: str) -> tuple[str, str]:
        """(verdict, reason) of the one line for check `name`."""
        found = [(v, r) for v, c, r in self.checks() if c == name]
        assert len(found) == 1, (name, self.lines)
        return found[0]


def _argv(shell: str) -> list[str]:
    """The shell's absolute path (the node PATH given to the script may not hold it)."""
    path = shutil.which(shell)
    if path is None:
        pytest.skip(f"{shell} is not installed")
    return [path, "sh"] if shell == "busybox" else [path]


def run(script: str, *args: str, shell: str = "dash", env: dict[str, str] | None = None) -> Result:
    """`SHELL -s -- ARGS < script`, the way fleet runs it."""
    proc = subprocess.run(
        [*_argv(shell), "-s", "--", *args],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    return Result(proc.returncode, proc.stdout.splitlines(), proc.stderr)


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
        ("fuseblk", "warn"),  # what GNU stat prints for every FUSE mount
        ("fuse.something-new", "warn"),
        ("overlay", "fail"),  # findmnt
        ("overlayfs", "fail"),  # GNU stat
        ("aufs", "fail"),
        ("tmpfs", "warn"),
        ("ramfs", "warn"),
        ("ext2/ext3", "ok"),  # GNU stat, ext4 included
        ("ext4", "ok"),
        ("xfs", "ok"),
        ("btrfs", "ok"),
        ("zfs", "ok"),
        ("UNKNOWN (0x1234abcd)", "warn"),  # GNU stat on a magic it does not know
        ("squashfs", "warn"),
    ],
)
def test_classify_fs_gives_each_filesystem_type_its_verdict(
    script: str, fstype: str, verdict: str
) -> None:
    result = run(script, "classify-fs", fstype)

    assert result.rc == 0, result.stderr
    assert len(result.lines) == 1, result.lines
    assert result.lines[0].startswith(f"{verdict:<4}  fs: {fstype}: "), result.lines


def test_classify_fs_reasons_name_the_risk(script: str) -> None:
    assert "checkpoint storms on network storage" in run(script, "classify-fs", "nfs4").lines[0]
    assert "container overlay" in run(script, "classify-fs", "overlay").lines[0]
    assert "RAM" in run(script, "classify-fs", "tmpfs").lines[0]
    assert "FUSE" in run(script, "classify-fs", "fuse").lines[0]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_local_dir_gets_every_check_once_in_order_then_the_summary(
    script: str, tmp_path: Path, shell: str
) -> None:
    result = run(
        script,
        *("--dir", str(tmp_path), "--rank", "1", "--port", "39500"),
        *("--min-free-gb", "0.001", "--min-shm-gb", "0"),
        *("--pattern", "^no-such-process-[x]$", "--path", str(tmp_path / "torch_*")),
        shell=shell,
    )

    assert [c for _, c, _ in result.checks()] == CHECKS, result.lines
    assert result.check("dir") == ("ok", f"{tmp_path} is a writable directory")
    assert result.check("port") == ("ok", "not checked (rank 1)")
    # The leftover check ran cleanup.sh's verify through the include, and found nothing.
    assert result.check("leftovers")[0] == "ok"
    counts = SUMMARY.match(result.lines[-1])
    assert counts, result.lines
    verdicts = [v for v, _, _ in result.checks()]
    assert [int(n) for n in counts.groups()] == [verdicts.count(v) for v in ("ok", "warn", "fail")]
    assert result.rc == (1 if "fail" in verdicts else 0), result.lines
    assert list(tmp_path.iterdir()) == [], "the write probe was left behind"


def test_a_missing_dir_fails_on_stderr_only_and_exits_1(script: str, tmp_path: Path) -> None:
    missing = tmp_path / "not" / "there"
    result = run(script, "--dir", str(missing), "--rank", "1", "--min-free-gb", "0")

    assert result.rc == 1
    assert result.check("dir") == ("fail", f"{missing} does not exist on this node")
    line = f"fail  dir: {missing} does not exist on this node"
    assert line in result.stderr.splitlines()
    # once: on both streams, a live view (`--plain`) printed every failing check twice
    assert line not in result.lines
    # fs and free look where the directory would be created, and say so.
    assert f"{tmp_path} (nearest existing parent of {missing}) is on " in result.check("fs")[1]
    assert result.lines[-1].endswith(", 1 fail")


def test_too_little_free_space_fails_with_the_numbers(script: str, tmp_path: Path) -> None:
    result = run(script, "--dir", str(tmp_path), "--rank", "1", "--min-free-gb", "999999")

    verdict, reason = result.check("free")
    assert verdict == "fail"
    assert re.fullmatch(rf"only \d+(\.\d)? [MG]B free on {tmp_path}, 999999 GB required .*", reason)
    assert result.rc == 1


def test_fs_check_reads_the_mount_table_without_findmnt(script: str, tmp_path: Path) -> None:
    # A node PATH with only the allowed tools: no findmnt, no python. The mount point and type
    # then come from /proc/self/mountinfo and must agree with findmnt's.
    node_bin = tmp_path / "bin"
    node_bin.mkdir()
    for tool in ("dash", *NODE_TOOLS):
        found = shutil.which(tool)
        assert found, f"{tool} missing on this machine"
        (node_bin / ("sh" if tool == "dash" else tool)).symlink_to(found)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = ("--dir", str(out_dir), "--rank", "1", "--min-free-gb", "0")
    bare = run(script, *args, env={"PATH": str(node_bin), "HOME": str(tmp_path)})
    full = run(script, *args, env={**os.environ})

    where = re.compile(r".* is on (\S+) \(.* mounted at (.*)\): .*")
    bare_fs, full_fs = where.fullmatch(bare.check("fs")[1]), where.fullmatch(full.check("fs")[1])
    assert bare_fs, bare.lines
    assert full_fs, full.lines
    if shutil.which("findmnt"):
        assert bare_fs.groups() == full_fs.groups()
    assert bare.check("dir")[0] == "ok"
    assert bare.check("free")[0] == "ok"
    assert bare.check("shm")[0] in ("ok", "warn")


def test_a_busybox_only_node_gets_the_same_verdicts(script: str, tmp_path: Path) -> None:
    # Alpine-like containers: busybox applets only (its stat, df, sed; no findmnt).
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox is not installed")
    node_bin = tmp_path / "bin"
    node_bin.mkdir()
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    for applet in applets.stdout.split():
        (node_bin / applet).symlink_to(busybox)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = ("--dir", str(out_dir), "--rank", "1", "--min-free-gb", "0", "--pattern", "^nope-[x]$")
    bare = run(script, *args, shell="busybox", env={"PATH": str(node_bin), "HOME": str(tmp_path)})
    full = run(script, *args, env={**os.environ})

    assert bare.rc == full.rc, (bare.lines, bare.stderr)
    assert [(v, c) for v, c, _ in bare.checks()] == [(v, c) for v, c, _ in full.checks()]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--dir is required"),
        (("--dir", "/x", "--port", "70000"), "--port must be 1-65535"),
        (("--dir", "/x", "--rank", "one"), "--rank needs a number"),
        (("--dir", "/x", "--min-free-gb", "lots"), "--min-free-gb needs a number"),
        (("--dir", "/x", "--pattern", ""), "--pattern must not be empty"),
        (("--dir", "/x", "--bogus", "1"), "unknown option: --bogus"),
        (("--dir",), "--dir needs a value"),
        (("classify-fs",), "classify-fs takes one filesystem type"),
    ],
)
def test_bad_usage_exits_2_with_the_reason_on_stderr(
    script: str, args: tuple[str, ...], message: str
) -> None:
    result = run(script, *args)

    assert result.rc == 2
    assert result.lines == []
    assert result.stderr.startswith(f"preflight.sh: {message}"), result.stderr


def test_script_passes_shellcheck_as_posix_sh() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck)")
    result = subprocess.run(
        ["shellcheck", "--shell=sh", str(PREFLIGHT)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_combined_script_parses_in_every_shell(script: str, shell: str) -> None:
    result = subprocess.run(
        [*_argv(shell), "-n"], input=script, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
