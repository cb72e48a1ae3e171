"""facts.sh's --dir-check (what preflight's dir, fs and free checks stand on) run for real, in
dash, bash and busybox sh, on real directories of this machine; and the preflight op run whole
against this machine's own shell (fleet.engine.local.LocalIO: the same facts.sh, no SSH).

Its only write is the probe file, created and removed inside the directory under test. The
read-only mount case needs root (a private mount namespace); the sandbox tests
(tests/e2e/test_preflight.py) cover real mounts on nodes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fleet.core.playbook import shipped_script
from fleet.engine.local import LocalIO
from fleet.node.facts import DirCheck, Snapshot, facts_args, parse
from fleet.node.preflight import build, check_dir, check_fs, holding_mount

SHELLS = [["dash"], ["bash", "--posix"], ["busybox", "sh"]]


def facts(
    shell: list[str], args: list[str], cwd: Path | None = None, **env: str
) -> tuple[list[str], Snapshot]:
    """facts.sh's lines and their parse, run as fleet runs it."""
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    proc = subprocess.run(
        [*shell, "-s", "--", *args],
        input=shipped_script("facts.sh").encode(),
        capture_output=True,
        env={"PATH": os.environ["PATH"], "FLEET_NODE_HELPER": "1", **env},
        cwd=cwd,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode("ascii").splitlines()
    return lines, parse(lines)


def dir_check(shell: list[str], directory: str, **kw: str) -> DirCheck:
    cwd = Path(kw.pop("cwd")) if "cwd" in kw else None
    _, snap = facts(shell, facts_args(dir_check=directory), cwd=cwd, **kw)
    assert snap.dir_check is not None
    return snap.dir_check


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_writable_dir_is_probed_and_left_as_it_was(shell: list[str], tmp_path: Path) -> None:
    (tmp_path / "keep").write_text("x")

    found = dir_check(shell, str(tmp_path))

    assert (found.kind, found.write, found.text) == ("d", 0, b"")
    assert found.path == found.near == found.real == bytes(tmp_path)
    assert found.df is not None
    assert found.df.total >= found.df.available > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"], "probe left behind"


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_missing_dir_is_looked_at_where_it_would_be_made(
    shell: list[str], tmp_path: Path
) -> None:
    missing = tmp_path / "not" / "there"

    found = dir_check(shell, str(missing))

    assert (found.kind, found.write) == ("n", None)
    assert (found.path, found.near) == (bytes(missing), bytes(tmp_path))
    assert check_dir(found).reason == f"{missing} does not exist on this node"


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_dangling_symlink_a_file_and_a_symlinked_dir(shell: list[str], tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")

    assert dir_check(shell, str(tmp_path / "dangling")).kind == "l"
    file = dir_check(shell, str(tmp_path / "file"))
    assert (file.kind, file.near) == ("o", bytes(tmp_path))
    link = dir_check(shell, str(tmp_path / "link"))
    # a symlink to a directory is that directory: fs looks at where it really is
    assert (link.kind, link.write) == ("d", 0)
    assert (link.near, link.real) == (bytes(tmp_path / "link"), bytes(tmp_path / "real"))


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_tilde_is_the_login_home_and_a_relative_dir_the_login_dir(
    shell: list[str], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / "ckpt").mkdir(parents=True)

    tilde = dir_check(shell, "~/ckpt", HOME=str(home))
    relative = dir_check(shell, "ckpt", cwd=str(home))

    assert (tilde.path, tilde.kind) == (bytes(home / "ckpt"), "d")
    assert (relative.path, relative.kind) == (bytes(home / "ckpt"), "d")


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_path_with_blanks_and_invalid_utf8_round_trips(shell: list[str], tmp_path: Path) -> None:
    odd = bytes(tmp_path) + b"/c  \xff\tx"
    os.mkdir(odd)

    found = dir_check(shell, os.fsdecode(odd))

    assert (found.path, found.kind, found.write, found.real) == (odd, "d", 0, odd)
    assert check_dir(found).reason == f"{tmp_path}/c  \\xff\tx is a writable directory"


def test_the_fs_check_agrees_with_findmnt(tmp_path: Path) -> None:
    if shutil.which("findmnt") is None:
        pytest.skip("findmnt is not installed")
    _, snap = facts(["dash"], facts_args(mounts=True, dir_check=str(tmp_path)))
    assert snap.dir_check is not None
    mount = holding_mount(snap.mounts, snap.dir_check.real)
    assert mount is not None
    out = subprocess.run(
        ["findmnt", "-n", "-r", "-o", "FSTYPE,TARGET", "-T", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert [mount.fstype, os.fsdecode(mount.point).replace(" ", "\\x20")] == out[:2]
    assert check_fs(snap, snap.dir_check).reason.startswith(f"{tmp_path} is on {mount.fstype} (")


@pytest.mark.root
def test_a_read_only_mount_fails_the_probe_for_root_too(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private read-only mount")
    ro = tmp_path / "ro"
    ro.mkdir()
    script = f"mount -t tmpfs -o ro fleet-ro {ro} && exec dash -s -- --dir-check {ro}"
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        input=shipped_script("facts.sh").encode(),
        capture_output=True,
        env={"PATH": os.environ["PATH"], "FLEET_NODE_HELPER": "1"},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    found = parse(proc.stdout.decode("ascii").splitlines()).dir_check
    assert found is not None
    assert (found.kind, found.write, found.text) == ("d", 1, b"Read-only file system")
    assert check_dir(found).reason == f"{ro} is not writable (Read-only file system)"


def test_the_op_against_this_machine_says_every_check_then_the_summary(tmp_path: Path) -> None:
    said: list[tuple[str, str]] = []
    op = build(
        {
            "output_dir": str(tmp_path),
            "host_index": 1,
            "min_free_gb": 0,
            "min_shm_gb": 0,
            "patterns": [f"no-such-process-{os.getpid()}"],
            "state_paths": [f"{tmp_path}/torch_*"],
        },
        sudo=False,
        timeout_s=60,
        password_on_stdin=False,
    )

    result = op.run(LocalIO(lambda stream, line: said.append((stream, line)), dict(os.environ)))

    lines = [line for stream, line in said if stream == "stdout"]
    assert lines[0] == f"ok    dir: {tmp_path} is a writable directory"
    assert lines[3] == "ok    port: not checked (rank 1)"
    assert lines[4] == "ok    leftovers: no training process or torch/CUDA state left"
    assert lines[-1].startswith("preflight: ")
    assert result.exit_code == 0
    assert list(tmp_path.iterdir()) == []
