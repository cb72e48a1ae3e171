"""`fleet push` / `fleet pull` against real sshd nodes (fleet/transfer/): files and trees to and
from 4 nodes verified by sha256, an interrupted pull that resumes, hostile node-side names and
symlinks, a node that lies about a checksum or changes a file while it is sent, dry runs.

Each node has a private /tmp: the node-side trees live there. Waits poll to deadlines.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, fleet_env, poll, run_fleet

pytestmark = pytest.mark.root

NODES = ("node01", "node02", "node03", "node04")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def node_sha(sandbox: Any, node: str, path: str) -> str:
    out = sandbox.run_on(node, f"sha256sum < {shlex.quote(path)}").stdout
    return out.split()[0]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A local tree: a small file, a 3 MB binary in a subdirectory, an empty file."""
    root = tmp_path / "ckpt"
    (root / "global_step2").mkdir(parents=True)
    (root / "latest").write_text("global_step2")
    (root / "global_step2" / "shard.pt").write_bytes(os.urandom(3_000_000))
    (root / "empty").write_bytes(b"")
    return root


@pytest.fixture
def remote(sandbox: Any) -> Iterator[str]:
    """A fresh node-side path under /tmp (private per node), removed afterwards."""
    path = f"/tmp/xfer-{uuid.uuid4().hex[:8]}"
    yield path
    for node in NODES:
        sandbox.run_on(
            node,
            f"rm -rf {shlex.quote(path)}; "
            "rm -f /usr/local/bin/sha256sum /usr/local/bin/openssl /usr/local/bin/python3",
        )


def test_push_then_pull_a_tree_and_a_file_on_4_nodes_verified(
    sandbox: Any, tree: Path, remote: str, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    pushed = run_fleet(sandbox, "push", str(tree), remote, "--yes", "--plain", log_dir=logs)
    assert pushed.code == 0, pushed.stdout + pushed.stderr
    for node in NODES:
        assert node_sha(sandbox, node, f"{remote}/global_step2/shard.pt") == sha(
            tree / "global_step2" / "shard.pt"
        )
        assert sandbox.run_on(node, f"cat {remote}/latest").stdout == "global_step2"
        leftovers = sandbox.run_on(node, f"find {remote} -name '.fleet-part-*'").stdout
        assert leftovers == ""
    out = tmp_path / "out"
    pulled = run_fleet(sandbox, "pull", remote, str(out), "--json", log_dir=logs)
    assert pulled.code == 0, pulled.stdout + pulled.stderr
    for node in NODES:
        got = out / node / Path(remote).name
        assert sha(got / "global_step2" / "shard.pt") == sha(tree / "global_step2" / "shard.pt")
        assert (got / "latest").read_text() == "global_step2"
        assert (got / "empty").read_bytes() == b""
    moved = [x for x in pulled.json_lines() if x["event"] == "FileMoved"]
    assert {x["action"] for x in moved} == {"copied"}
    assert len(moved) == 12
    assert all(len(x["sha256"]) == 64 for x in moved)
    # a single file: LOCALDIR/HOST/<name>
    one = run_fleet(sandbox, "pull", f"{remote}/latest", str(tmp_path / "one"), log_dir=logs)
    assert one.code == 0, one.stdout + one.stderr
    assert {p.read_text() for p in (tmp_path / "one").glob("*/latest")} == {"global_step2"}
    # a rerun moves nothing: every file matches
    again = run_fleet(sandbox, "push", str(tree), remote, "--yes", "--json", log_dir=logs)
    assert again.code == 0
    assert {x["action"] for x in again.json_lines() if x["event"] == "FileMoved"} == {"skipped"}


def test_push_to_many_hosts_asks_first_and_dry_run_moves_nothing(
    sandbox: Any, tree: Path, remote: str, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    refused = run_fleet(sandbox, "push", str(tree), remote, log_dir=logs)
    assert refused.code == 2
    assert "--yes" in refused.stderr
    dry = run_fleet(sandbox, "push", str(tree), remote, "--dry-run", "--json", log_dir=logs)
    assert dry.code == 0, dry.stderr
    assert {x["action"] for x in dry.json_lines() if x["event"] == "FileMoved"} == {"would copy"}
    assert sandbox.run_on("node01", f"test -e {remote}; echo $?").stdout.strip() == "1"
    run_fleet(sandbox, "push", str(tree), remote, "--yes", "-l", "node01", log_dir=logs)
    out = tmp_path / "out"
    dry = run_fleet(sandbox, "pull", remote, str(out), "-l", "node01", "-n", "--json", log_dir=logs)
    assert dry.code == 0, dry.stderr
    assert {x["action"] for x in dry.json_lines() if x["event"] == "FileMoved"} == {"would copy"}
    assert not out.exists()  # not even LOCALDIR/HOST: a dry run changes nothing


def test_interrupted_pull_leaves_no_whole_file_and_a_rerun_resumes(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    sandbox.run_on("node01", f"mkdir -p {remote} && head -c 8000000 /dev/urandom > {remote}/big")
    want = node_sha(sandbox, "node01", f"{remote}/big")
    out = tmp_path / "out"
    logs = tmp_path / "logs"
    args = ["pull", remote, str(out), "-l", "node01", "--bwlimit-node", "1M", "--plain"]
    proc = subprocess.Popen(
        [*FLEET, *args],
        # killed, fleet cannot remove its pinned known_hosts: keep it in the test's directory
        env=fleet_env(sandbox, logs, TMPDIR=str(tmp_path)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    landing = out / "node01" / Path(remote).name

    def part_grew() -> list[Path]:
        parts = list(landing.glob(".fleet-part-*")) if landing.exists() else []
        return [p for p in parts if p.stat().st_size > 1_000_000]

    try:
        assert poll(part_grew, timeout_s=30), "no part file grew"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert not (landing / "big").exists()  # nothing that looks whole
    [part] = landing.glob(".fleet-part-*")
    assert 0 < part.stat().st_size < 8_000_000
    rerun = run_fleet(sandbox, "pull", remote, str(out), "-l", "node01", "--json", log_dir=logs)
    assert rerun.code == 0, rerun.stdout + rerun.stderr
    [moved] = [x for x in rerun.json_lines() if x["event"] == "FileMoved"]
    assert moved["action"] == "resumed"
    assert moved["moved_bytes"] < 8_000_000
    assert sha(landing / "big") == want
    assert not list(landing.glob(".fleet-part-*"))
    third = run_fleet(sandbox, "pull", remote, str(out), "-l", "node01", "--json", log_dir=logs)
    assert [x["action"] for x in third.json_lines() if x["event"] == "FileMoved"] == ["skipped"]


HOSTILE = r"""
set -e
mkdir -p {r}/inner /tmp/outside
echo secret > /tmp/outside/secret
echo ok > {r}/inner/plain
ln -s /etc {r}/etc_link
ln -s /etc/shadow {r}/inner/shadow
ln -s /tmp/outside {r}/escape
ln -s ../../tmp/outside/secret {r}/inner/rel_escape
ln -s loop_b {r}/loop_a
ln -s loop_a {r}/loop_b
echo dots > {r}/..foo
echo nl > "{r}/$(printf 'new\nline')"
echo ctl > "{r}/$(printf 'ctl\033]0;pwned\007')"
echo tab > "{r}/$(printf 'a\tb')"
"""


def test_hostile_names_and_symlinks_never_write_outside_or_follow(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    sandbox.run_on("node02", HOSTILE.format(r=remote))
    out = tmp_path / "out"
    result = run_fleet(
        sandbox, "pull", remote, str(out), "-l", "node02", "--json", log_dir=tmp_path / "logs"
    )
    assert result.code == 0, result.stdout + result.stderr
    moved = {x["path"]: x for x in result.json_lines() if x["event"] == "FileMoved"}
    for link in ("etc_link", "inner/shadow", "escape", "inner/rel_escape", "loop_a", "loop_b"):
        assert moved[link]["action"] == "refused", link
    landing = out / "node02" / Path(remote).name
    written = {p.relative_to(out) for p in out.rglob("*")}
    assert all(str(p).startswith("node02") for p in written)
    assert not any(p.is_symlink() for p in out.rglob("*"))
    names = {p.name for p in landing.iterdir()}
    assert {"..foo", "new\nline", "ctl\x1b]0;pwned\x07", "a\tb", "inner"} <= names
    assert (landing / "..foo").read_text() == "dots\n"
    assert not any(p.read_text().strip() == "secret" for p in out.rglob("*") if p.is_file())
    assert not (landing / "inner" / "shadow").exists()
    # the terminal never sees the raw control characters
    plain = run_fleet(
        sandbox, "pull", remote, str(out), "-l", "node02", "--plain", log_dir=tmp_path / "logs"
    )
    assert "\x1b" not in plain.stdout
    assert "\x07" not in plain.stdout


def test_a_local_landing_that_is_a_symlink_or_blocked_fails_the_host_saying_why(
    sandbox: Any, tree: Path, remote: str, tmp_path: Path
) -> None:
    """LOCALDIR/HOST that is a symlink is never followed, and one of the tree's directories
    that cannot be made here (a file in its place) fails it and its files: each said as a
    failure of that host, never an internal error, and nothing written through the link."""
    logs = tmp_path / "logs"
    pushed = run_fleet(sandbox, "push", str(tree), remote, "-l", "node01", log_dir=logs)
    assert pushed.code == 0, pushed.stdout + pushed.stderr
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "node01").symlink_to(elsewhere)
    linked = run_fleet(sandbox, "pull", remote, str(out), "-l", "node01", "--json", log_dir=logs)
    assert linked.code == 3, linked.stdout + linked.stderr
    assert "internal error" not in linked.stdout + linked.stderr
    (failed,) = [x for x in linked.json_lines() if x["event"] == "FileMoved"]
    assert failed["action"] == "failed"
    assert failed["error"] == f"local: {out / 'node01'}: a symlink (not followed)"
    assert list(elsewhere.iterdir()) == []
    (out / "node01").unlink()
    (out / "node01" / Path(remote).name).mkdir(parents=True)
    (out / "node01" / Path(remote).name / "global_step2").write_text("a file, not a directory")
    blocked = run_fleet(sandbox, "pull", remote, str(out), "-l", "node01", "--json", log_dir=logs)
    assert blocked.code == 3, blocked.stdout + blocked.stderr
    assert "internal error" not in blocked.stdout + blocked.stderr
    moved = {x["path"]: x for x in blocked.json_lines() if x["event"] == "FileMoved"}
    assert moved["global_step2"]["action"] == "failed"
    assert moved["global_step2/shard.pt"]["action"] == "failed"
    assert moved["latest"]["action"] == "copied"


def test_a_node_that_lies_about_the_checksum_fails_and_leaves_nothing_whole(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    sandbox.run_on("node03", f"mkdir -p {remote} && head -c 100000 /dev/urandom > {remote}/f")
    fake = "#!/bin/sh\ncat >/dev/null; echo " + "0" * 64 + "  -\n"
    # whichever the node hashes with lies; its python3 (which would pull the small file in a
    # batch, hashing it itself: tests/transfer/test_getmany.py lies there) fails to start
    no_python = "#!/bin/sh\nexit 127\n"
    for tool, text in (("sha256sum", fake), ("openssl", fake), ("python3", no_python)):
        sandbox.run_on(
            "node03",
            f"printf %s {shlex.quote(text)} > /usr/local/bin/{tool}; "
            f"chmod +x /usr/local/bin/{tool}",
        )
    out = tmp_path / "out"
    result = run_fleet(
        sandbox, "pull", remote, str(out), "-l", "node03", "--json", log_dir=tmp_path / "logs"
    )
    assert result.code == 3, result.stdout + result.stderr
    [moved] = [x for x in result.json_lines() if x["event"] == "FileMoved"]
    assert moved["action"] == "failed"
    assert "sha256 mismatch" in moved["error"]
    landing = out / "node03" / Path(remote).name
    assert not (landing / "f").exists()
    assert not list(landing.glob(".fleet-part-*"))


def test_a_file_changed_while_it_is_sent_is_a_failure(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    # larger than what the channel window and socket buffers hold, so the node is still reading
    # it when the byte changes: the node's sha256 (taken after sending) then differs
    sandbox.run_on("node04", f"mkdir -p {remote} && head -c 24000000 /dev/urandom > {remote}/f")
    out = tmp_path / "out"
    args = ["pull", remote, str(out), "-l", "node04", "--bwlimit", "3M", "--json"]
    proc = subprocess.Popen(
        [*FLEET, *args],
        env=fleet_env(sandbox, tmp_path / "logs"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    landing = out / "node04" / Path(remote).name
    try:
        assert poll(
            lambda: (
                [p for p in landing.glob(".fleet-part-*") if p.stat().st_size > 300_000]
                if landing.exists()
                else []
            ),
            timeout_s=30,
        )
        # flip the first byte, already sent: what arrived no longer matches the node's file
        sandbox.run_on(
            "node04", f"printf '\\377' | dd of={remote}/f bs=1 count=1 conv=notrunc status=none"
        )
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, stdout
    assert "changed on the node while it was sent" in stdout
    assert not (landing / "f").exists()


def test_a_directory_swapped_for_a_symlink_after_the_listing_is_not_followed(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    """The race a listing cannot close: between `find` and the read, a node user replaces a
    directory of the tree with a symlink to a place outside it. The read refuses it."""
    from fleet.core.hosts import Host
    from fleet.ssh.settings import SshSettings
    from fleet.ssh.transport import SSHTransport
    from fleet.transfer import files

    sandbox.run_on(
        "node01",
        f"mkdir -p {remote}/sub /tmp/outside-swap && echo mine > {remote}/sub/file && "
        "echo evil > /tmp/outside-swap/file",  # same size: only the check stops it
    )
    transport = SSHTransport(SshSettings(ssh_config=sandbox.ssh_config_path))
    session = transport.connect(Host(name="node01", address="node01"))
    try:
        plan = files.plan_pull(files.list_remote(session, remote))
        assert [e.rel for e in plan.files] == [b"sub/file"]
        sandbox.run_on(
            "node01", f"mv {remote}/sub {remote}/was-sub && ln -s /tmp/outside-swap {remote}/sub"
        )
        results = list(files.pull_tree(session, remote, tmp_path / "node01", files.Options(), plan))
    finally:
        session.close()
        transport.close()
        sandbox.run_on("node01", "rm -rf /tmp/outside-swap")
    [result] = results
    assert result.action is files.Action.FAILED
    assert "refused" in result.error
    assert not any(p.is_file() for p in (tmp_path / "node01").rglob("*"))


def _relay(sandbox: Any, source: str, target: str) -> Any:
    """files.relay_file from node01's `source` to node02's `target`, over fresh connections."""
    from fleet.core.hosts import Host
    from fleet.ssh.settings import SshSettings
    from fleet.ssh.transport import SSHTransport
    from fleet.transfer import files

    transport = SSHTransport(SshSettings(ssh_config=sandbox.ssh_config_path))
    one = transport.connect(Host(name="node01", address="node01"))
    two = transport.connect(Host(name="node02", address="node02"))
    try:
        return files.relay_file(one, source, two, target, files.Options())
    finally:
        one.close()
        two.close()
        transport.close()


def test_relay_streams_a_file_node_to_node_verified(sandbox: Any, remote: str) -> None:
    """The API consolidate builds on: node01 -> bastion -> node02, checked on both nodes."""
    from fleet.core.hosts import Host
    from fleet.ssh.settings import SshSettings
    from fleet.ssh.transport import SSHTransport
    from fleet.transfer import files

    sandbox.run_on("node01", f"mkdir -p {remote} && head -c 2000000 /dev/urandom > {remote}/shard")
    transport = SSHTransport(SshSettings(ssh_config=sandbox.ssh_config_path))
    one = transport.connect(Host(name="node01", address="node01"))
    two = transport.connect(Host(name="node02", address="node02"))
    try:
        planned = files.relay_file(
            one, f"{remote}/shard", two, f"{remote}/in/shard", files.Options(dry_run=True)
        )
        nothing = sandbox.run_on("node02", f"ls -A {remote} 2>/dev/null || true").stdout
        result = files.relay_file(
            one, f"{remote}/shard", two, f"{remote}/in/shard", files.Options()
        )
        again = files.relay_file(one, f"{remote}/shard", two, f"{remote}/in/shard", files.Options())
    finally:
        one.close()
        two.close()
        transport.close()
    assert planned.action is files.Action.WOULD_COPY, planned.error
    assert nothing.strip() == ""  # the dry run wrote nothing, not even the directory
    assert result.action is files.Action.COPIED, result.error
    assert result.sha256 == node_sha(sandbox, "node01", f"{remote}/shard")
    assert node_sha(sandbox, "node02", f"{remote}/in/shard") == result.sha256
    assert again.action is files.Action.SKIPPED  # already there, same sha256: a rerun resumes
    assert again.moved_bytes == 0


def test_interrupted_push_leaves_no_whole_file_on_the_node_and_a_rerun_resumes(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    source = tmp_path / "big"
    source.write_bytes(os.urandom(8_000_000))
    logs = tmp_path / "logs"
    args = ["push", str(source), f"{remote}/big", "-l", "node02", "--bwlimit-node", "1M"]
    proc = subprocess.Popen(
        [*FLEET, *args, "--plain"],
        # killed, fleet cannot remove its pinned known_hosts: keep it in the test's directory
        env=fleet_env(sandbox, logs, TMPDIR=str(tmp_path)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def part_size() -> int:
        out = sandbox.run_on("node02", f"stat -c %s {remote}/.fleet-part-* 2>/dev/null").stdout
        return int(out.split()[0]) if out.strip() else 0

    try:
        assert poll(lambda: part_size() > 1_000_000, timeout_s=30), "no part file grew"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert sandbox.run_on("node02", f"test -e {remote}/big; echo $?").stdout.strip() == "1"
    rerun = run_fleet(sandbox, *args[:-2], "--json", log_dir=logs)
    assert rerun.code == 0, rerun.stdout + rerun.stderr
    [moved] = [x for x in rerun.json_lines() if x["event"] == "FileMoved"]
    assert moved["action"] == "resumed"
    assert moved["moved_bytes"] < 8_000_000
    assert node_sha(sandbox, "node02", f"{remote}/big") == sha(source)
    assert sandbox.run_on("node02", f"ls -A {remote}").stdout.split() == ["big"]


def test_push_never_sends_setuid_or_setgid_and_refuses_a_directory_before_sending(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    tool = tmp_path / "tool"
    tool.write_bytes(os.urandom(200_000))
    tool.chmod(0o4755)  # in a tree another user could write, it would be setuid root on nodes
    logs = tmp_path / "logs"
    pushed = run_fleet(sandbox, "push", str(tool), f"{remote}/tool", "-l", "node01", log_dir=logs)
    assert pushed.code == 0, pushed.stdout + pushed.stderr
    assert sandbox.run_on("node01", f"stat -c %a {remote}/tool").stdout.strip() == "755"
    # REMOTE an existing directory: failed before a byte moved, nothing left behind
    sandbox.run_on("node01", f"mkdir -p {remote}/dir/inside")
    onto = run_fleet(
        sandbox, "push", str(tool), f"{remote}/dir", "-l", "node01", "--json", log_dir=logs
    )
    assert onto.code == 3, onto.stdout + onto.stderr
    [moved] = [x for x in onto.json_lines() if x["event"] == "FileMoved"]
    assert moved["action"] == "failed"
    assert moved["moved_bytes"] == 0
    assert moved["size"] == 200_000
    assert f"{remote}/dir is a directory on the node" in moved["error"]
    assert "end REMOTE with /" in moved["error"]
    left = sandbox.run_on("node01", f"find {remote} -name '.fleet-part-*'").stdout
    assert left == ""
    assert sandbox.run_on("node01", f"ls -A {remote}/dir").stdout.split() == ["inside"]


def test_a_local_directory_swapped_for_a_symlink_after_the_walk_is_not_sent(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    """The race a walk cannot close: root pushes a tree another user owns; between the walk and
    the send, that user replaces a directory of it with a symlink to one only root can read.
    The file is opened through what was listed, so it fails, and nothing of root's is sent."""
    from fleet.core.hosts import Host
    from fleet.ssh.settings import SshSettings
    from fleet.ssh.transport import SSHTransport
    from fleet.transfer import files

    source = tmp_path / "src"
    (source / "d").mkdir(parents=True)
    (source / "d" / "f").write_text("mine\n")
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "f").write_text("root's\n")  # same size: only the open stops it
    listed = files.walk_local(source)
    (source / "d").rename(source / "d.old")
    (source / "d").symlink_to(secret)
    transport = SSHTransport(SshSettings(ssh_config=sandbox.ssh_config_path))
    session = transport.connect(Host(name="node01", address="node01"))
    try:
        [result] = files.push_tree(session, listed, remote, files.Options())
    finally:
        session.close()
        transport.close()
    assert result.action is files.Action.FAILED
    assert "symlink" in result.error
    assert sandbox.run_on("node01", f"test -e {remote}; echo $?").stdout.strip() == "1"


def test_a_node_whose_login_shell_talks_is_pulled_from_whole(
    sandbox: Any, tree: Path, remote: str, tmp_path: Path
) -> None:
    """A ~/.bashrc that prints (bash sources it for ssh commands) made every pull from the node
    fail, `bad listing from the node`, and put its banner at the front of a file's stream.
    What the login shell prints before a transfer's command is skipped, as for steps."""
    logs = tmp_path / "logs"
    pushed = run_fleet(sandbox, "push", str(tree), remote, "-l", "node01", "--plain", log_dir=logs)
    assert pushed.code == 0, pushed.stdout + pushed.stderr
    sandbox.run_on("node01", "echo 'echo Welcome to node01; printf no-newline' > /root/.bashrc")
    try:
        out = tmp_path / "out"
        pulled = run_fleet(sandbox, "pull", remote, str(out), "-l", "node01", log_dir=logs)
        assert pulled.code == 0, pulled.stdout + pulled.stderr
        got = out / "node01" / Path(remote).name
        assert sha(got / "global_step2" / "shard.pt") == sha(tree / "global_step2" / "shard.pt")
        assert (got / "latest").read_text() == "global_step2"
        one = tmp_path / "one"
        single = run_fleet(
            sandbox, "pull", f"{remote}/global_step2/shard.pt", str(one), "-l", "node01",
            log_dir=logs,
        )  # fmt: skip
        assert single.code == 0, single.stdout + single.stderr
        assert sha(one / "node01" / "shard.pt") == sha(tree / "global_step2" / "shard.pt")
        relayed = _relay(sandbox, f"{remote}/global_step2/shard.pt", f"{remote}/relayed")
        assert relayed.action.name == "COPIED", relayed.error  # consolidate's node-to-node copy
    finally:
        sandbox.run_on("node01", "rm -f /root/.bashrc")
