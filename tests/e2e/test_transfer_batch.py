"""Small files pushed and pulled in batches (fleet/transfer/putmany.py, getmany.py) against real
sshd nodes: a tree of small files and one large file lands byte-identical both ways, a rerun
skips every file, nothing of a part is left; a node without python3 on its PATH gets and
gives every file the per-file way; Ctrl-C ends a batch that hangs on the node; and a login
shell line shaped like an answer is never taken for one.

The node's sha256sum is wrapped to count its calls: the per-file path hashes each small file
with it, the batched path never does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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

NODE = "node01"
CALLS = "/tmp/fleet-sha256sum-calls"
COUNTING_SHA256SUM = f'#!/bin/sh\necho x >> {CALLS}\nexec /usr/bin/sha256sum "$@"\n'
# /root is private per node: a PATH of links to every tool but python3, set by ~/.bashrc (bash
# sources it for every command sshd runs).
HIDE_PYTHON = """
mkdir -p /root/nopy-bin
for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
  for f in "$d"/*; do
    n=${f##*/}
    case $n in python3*) continue;; esac
    [ -e "/root/nopy-bin/$n" ] || ln -s "$f" "/root/nopy-bin/$n"
  done
done
[ -e /root/.bashrc ] && cp -p /root/.bashrc /root/.bashrc.fleet-test
echo 'export PATH=/root/nopy-bin' >> /root/.bashrc
"""
SHOW_PYTHON = """
rm -rf /root/nopy-bin
if [ -e /root/.bashrc.fleet-test ]; then mv /root/.bashrc.fleet-test /root/.bashrc;
else rm -f /root/.bashrc; fi
"""


@contextlib.contextmanager
def python_hidden(sandbox: Any) -> Iterator[None]:
    """No python3 on the node's PATH for what runs inside (HIDE_PYTHON), put back after."""
    sandbox.run_on(NODE, HIDE_PYTHON)
    try:
        yield
    finally:
        sandbox.run_on(NODE, SHOW_PYTHON)


def events(result: Any, kind: str) -> list[dict[str, Any]]:
    return [x for x in result.json_lines() if x["event"] == kind]


@pytest.fixture
def remote(sandbox: Any) -> Iterator[str]:
    path = f"/tmp/xfer-batch-{uuid.uuid4().hex[:8]}"
    sandbox.run_on(
        NODE,
        f"rm -f {CALLS}; printf %s {shlex.quote(COUNTING_SHA256SUM)} > /usr/local/bin/sha256sum"
        " && chmod +x /usr/local/bin/sha256sum",
    )
    yield path
    sandbox.run_on(NODE, f"rm -rf {shlex.quote(path)} {CALLS}; rm -f /usr/local/bin/sha256sum")


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, bytes]:
    """~40 small files of 0-64 KiB in nested directories, and one of 3 MB."""
    root = tmp_path / "src"
    files: dict[str, bytes] = {}
    for i in range(40):
        rel = f"d{i % 3}/sub{i % 2}/f {i}.bin" if i % 4 else f"top{i}"
        files[rel] = os.urandom((i * 1637) % 65536)
    files["d0/big"] = os.urandom(3_000_000)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def on_node(sandbox: Any, remote: str) -> dict[str, str]:
    """rel -> sha256 of every file under `remote` on the node."""
    out = sandbox.run_on(
        NODE, f"cd {shlex.quote(remote)} && find . -type f -exec /usr/bin/sha256sum {{}} +"
    ).stdout
    found = {}
    for line in out.splitlines():
        digest, _, name = line.partition("  ")
        found[name.removeprefix("./")] = digest
    return found


def sha256_calls(sandbox: Any) -> int:
    return len(sandbox.run_on(NODE, f"cat {CALLS} 2>/dev/null || true").stdout.split())


def push(sandbox: Any, tmp_path: Path, remote: str) -> Any:
    result = run_fleet(
        sandbox, "push", str(tmp_path / "src"), remote, "-l", NODE, "--json",
        log_dir=tmp_path / "logs",
    )  # fmt: skip
    assert result.code == 0, result.stdout + result.stderr
    return result


def test_a_tree_of_small_files_lands_in_batches_and_a_re_push_skips_them(
    sandbox: Any, tree: dict[str, bytes], remote: str, tmp_path: Path
) -> None:
    first = push(sandbox, tmp_path, remote)
    moved = events(first, "FileMoved")
    assert sorted(m["path"] for m in moved) == sorted(tree)
    assert {m["action"] for m in moved} == {"copied"}
    assert {m["via"] for m in moved if m["path"] != "d0/big"} == {"paramiko"}
    assert on_node(sandbox, remote) == {
        rel: hashlib.sha256(data).hexdigest() for rel, data in tree.items()
    }
    assert sha256_calls(sandbox) == 0  # no small file went the per-file way
    again = push(sandbox, tmp_path, remote)
    assert {m["action"] for m in events(again, "FileMoved")} == {"skipped"}
    assert len(events(again, "FileMoved")) == len(tree)
    left = sandbox.run_on(NODE, f"find {remote} -name '.fleet-part-*'").stdout
    assert left == ""


def test_without_python3_on_the_node_every_file_moves_the_per_file_way(
    sandbox: Any, tree: dict[str, bytes], remote: str, tmp_path: Path
) -> None:
    with python_hidden(sandbox):
        first = push(sandbox, tmp_path, remote)
    moved = events(first, "FileMoved")
    assert len(moved) == len(tree)
    assert {m["action"] for m in moved} == {"copied"}
    assert on_node(sandbox, remote) == {
        rel: hashlib.sha256(data).hexdigest() for rel, data in tree.items()
    }
    assert sha256_calls(sandbox) >= 40  # each small file probed, written and hashed alone
    left = sandbox.run_on(NODE, f"find {remote} -name '.fleet-part-*'").stdout
    assert left == ""


def pull(sandbox: Any, tmp_path: Path, remote: str) -> Any:
    result = run_fleet(
        sandbox, "pull", remote, str(tmp_path / "out"), "-l", NODE, "--json",
        log_dir=tmp_path / "logs",
    )  # fmt: skip
    assert result.code == 0, result.stdout + result.stderr
    return result


def pulled(tmp_path: Path, remote: str) -> dict[str, bytes]:
    root = tmp_path / "out" / NODE / Path(remote).name
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_tree_of_small_files_is_pulled_in_batches_and_a_re_pull_skips_them(
    sandbox: Any, tree: dict[str, bytes], remote: str, tmp_path: Path
) -> None:
    push(sandbox, tmp_path, remote)
    sandbox.run_on(NODE, f"rm -f {CALLS}")
    first = pull(sandbox, tmp_path, remote)
    moved = events(first, "FileMoved")
    assert sorted(m["path"] for m in moved) == sorted(tree)
    assert {m["action"] for m in moved} == {"copied"}
    assert {m["via"] for m in moved if m["path"] != "d0/big"} == {"paramiko"}
    assert pulled(tmp_path, remote) == tree  # byte-identical, no part file among them
    assert sha256_calls(sandbox) == 0  # no small file went the per-file way
    again = pull(sandbox, tmp_path, remote)
    assert {m["action"] for m in events(again, "FileMoved")} == {"skipped"}
    assert len(events(again, "FileMoved")) == len(tree)
    assert pulled(tmp_path, remote) == tree


def test_a_pull_without_python3_on_the_node_moves_every_file_the_per_file_way(
    sandbox: Any, tree: dict[str, bytes], remote: str, tmp_path: Path
) -> None:
    push(sandbox, tmp_path, remote)
    sandbox.run_on(NODE, f"rm -f {CALLS}")
    with python_hidden(sandbox):
        first = pull(sandbox, tmp_path, remote)
    moved = events(first, "FileMoved")
    assert len(moved) == len(tree)
    assert {m["action"] for m in moved} == {"copied"}
    assert pulled(tmp_path, remote) == tree
    assert sha256_calls(sandbox) >= 39  # each small file read and hashed alone


# A stand-in for a node that hangs in the middle of a batch (a stuck disk or NFS mount): a
# python3 first on the node's PATH that never reads its stdin nor answers. It records its pid,
# which the test ends.
HUNG = "/tmp/fleet-hung-batch.pid"
HANGING_PYTHON3 = f"#!/bin/sh\necho $$ > {HUNG}\nexec sleep 600\n"


def hung_pid(sandbox: Any) -> str:
    """The hanging python3's pid once it runs on the node, else ""."""
    return str(sandbox.run_on(NODE, f"cat {HUNG} 2>/dev/null || true").stdout.strip())


@pytest.mark.parametrize("verb", ["push", "pull"])
def test_ctrl_c_ends_a_batch_that_hangs_on_the_node_at_once(
    sandbox: Any, remote: str, tmp_path: Path, verb: str
) -> None:
    src = tmp_path / "src"
    for i in range(12):  # 2.4 MB: more than the batch's channel window, so sending blocks
        (src / f"d{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 2}" / f"f{i}").write_bytes(os.urandom(200_000))
    if verb == "pull":
        push(sandbox, tmp_path, remote)
        args = [remote, str(tmp_path / "out")]
    else:
        args = [str(src), remote]
    shim = shlex.quote(HANGING_PYTHON3)
    sandbox.run_on(
        NODE, f"printf %s {shim} > /usr/local/bin/python3; chmod +x /usr/local/bin/python3"
    )
    try:
        proc = subprocess.Popen(
            [*FLEET, verb, *args, "-l", NODE, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=fleet_env(sandbox, tmp_path / "logs"),
        )
        hung = poll(lambda: hung_pid(sandbox))
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"{verb} went on after Ctrl-C while the node's batch hung")
    finally:
        sandbox.run_on(
            NODE, f"rm -f /usr/local/bin/python3; kill $(cat {HUNG}) 2>/dev/null; rm -f {HUNG}"
        )
    assert hung.isdigit()
    assert proc.returncode == 130, err
    final = next(json.loads(x) for x in out.splitlines() if '"RunFinished"' in x)
    assert final["hosts"][NODE]["outcome"] == "cancelled"
    # The host's own work stopped on the cancel: not abandoned to the run's 10 s grace, after
    # which a host that never finished is "run interrupted" and its thread left running.
    assert final["hosts"][NODE]["reason"].startswith("cancelled; part files kept"), final
    if verb == "push":  # the node's program never ran: nothing there under any name
        assert sandbox.run_on(NODE, f"find {remote} -type f").stdout == ""
    else:  # the node answered nothing: no file landed here
        assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


# A node whose rc file prints a line shaped like the batch's answers, and whose python3 starts
# but breaks before it answers (here: it reads the batch and exits 1, writing nothing).
ANSWER_SHAPED_BASHRC = "echo '0 copied'; echo '1 skipped'"
BROKEN_PYTHON3 = "#!/bin/sh\ncat >/dev/null\nexit 1\n"


def test_a_login_shell_line_shaped_like_an_answer_is_no_file_pushed(
    sandbox: Any, remote: str, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a", "b"):
        (src / name).write_bytes(os.urandom(1000))
    sandbox.run_on(
        NODE,
        "[ -e /root/.bashrc ] && cp -p /root/.bashrc /root/.bashrc.fleet-test; "
        f"echo {shlex.quote(ANSWER_SHAPED_BASHRC)} >> /root/.bashrc; "
        f"printf %s {shlex.quote(BROKEN_PYTHON3)} > /usr/local/bin/python3; "
        "chmod +x /usr/local/bin/python3",
    )
    try:
        result = run_fleet(
            sandbox, "push", str(src), remote, "-l", NODE, "--json", log_dir=tmp_path / "logs"
        )
    finally:
        sandbox.run_on(NODE, "rm -f /usr/local/bin/python3; " + SHOW_PYTHON)
    assert result.code == 3, result.stdout + result.stderr
    moved = events(result, "FileMoved")
    assert sorted(m["path"] for m in moved) == ["a", "b"]
    assert {m["action"] for m in moved} == {"failed"}, moved
    assert sandbox.run_on(NODE, f"find {remote} -type f 2>/dev/null").stdout == ""
