"""A launched run's processes are known by a secret of the run's, not by a name anyone can wear
(issue 17): launch.sh run locally under dash, as in test_launch_script.py, with uid 4242 (no
passwd entry) as the other user who sets FLEET_RUN_ID=<the run's id> in their own processes."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.test_launch_script import Node, marked
from node.test_launch_script import node as node  # noqa: PLC0414 (the fixture, re-exported)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts processes of another uid")

OTHER = ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups"]


@pytest.fixture
def forged() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def forge(procs: list[subprocess.Popen[bytes]], run_id: str, **env: str) -> int:
    """uid 4242's `sleep`, carrying the run's id (and whatever else it likes)."""
    proc = subprocess.Popen(
        [
            *OTHER,
            "env",
            f"FLEET_RUN_ID={run_id}",
            *(f"{k}={v}" for k, v in env.items()),
            "sleep",
            "120",
        ]
    )
    procs.append(proc)
    deadline = time.monotonic() + 10
    while proc.pid not in marked(run_id):
        assert time.monotonic() < deadline, "the forged process did not come up"
        time.sleep(0.01)
    return proc.pid


def cmdlines() -> bytes:
    out = b""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                out += Path(f"/proc/{entry}/cmdline").read_bytes() + b"\n"
    return out


def test_the_run_s_key_is_root_s_alone_and_in_no_command_line(node: Node) -> None:
    run_id, started = node.start("sleep 60\n")
    assert started.returncode == 0, started.stdout + started.stderr
    key_file = node.state / run_id / "key"
    key = key_file.read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{32}", key)
    assert key_file.stat().st_mode & 0o077 == 0
    assert (node.state / run_id).stat().st_mode & 0o077 == 0
    launcher = int(node.file(run_id, "launcher"))
    assert f"FLEET_RUN_KEY={key}".encode() in Path(f"/proc/{launcher}/environ").read_bytes()
    assert key.encode() not in cmdlines()


def test_another_user_wearing_the_run_s_id_is_not_the_run(
    node: Node, forged: list[subprocess.Popen[bytes]]
) -> None:
    run_id, started = node.start("sleep 1\n")
    assert started.returncode == 0, started.stdout + started.stderr
    deadline = time.monotonic() + 20
    while not (node.state / run_id / "exit").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    fake = forge(forged, run_id, FLEET_RUN_KEY="0" * 32)

    facts = node.facts()
    assert (facts["procs"], facts["exit"]) == ("0", "0"), facts  # finished, not orphaned

    second, again = node.start("exec sleep 60\n")
    assert again.returncode == 0, again.stdout  # not blocked by the forgery
    fake2 = forge(forged, second)
    assert node.facts()["procs"] == "0"
    stopped = node("stop")
    assert stopped.returncode == 0, stopped.stdout
    assert f"pid={fake2}" not in stopped.stdout
    for pid in (fake, fake2):
        assert Path(f"/proc/{pid}").exists(), "stop killed another user's process"
    assert marked(second) == [fake2]


@pytest.mark.parametrize("run_id", [".", "..", "../evil", "./"])
def test_another_user_wearing_a_run_id_that_names_no_run_does_not_block_a_launch(
    node: Node, forged: list[subprocess.Popen[bytes]], tmp_path: Path, run_id: str
) -> None:
    """`.`, `..` or a path out of the state dir is no run id: the start's check for a live run
    must not probe it (as a directory it is one, and without a key it would be matched by the
    stranger's own FLEET_RUN_ID, refusing every launch on the node with a hint fleet refuses)."""
    node.state.mkdir(mode=0o700)
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "key").write_text("f" * 32 + "\n")  # a key the stranger wears too
    forge(forged, run_id, FLEET_RUN_KEY="f" * 32)

    _, started = node.start("exec sleep 60\n")
    assert started.returncode == 0, started.stdout
    assert "refused" not in started.stdout


def test_the_key_cannot_be_overridden_with_env(node: Node) -> None:
    run_id, started = node.start("exec sleep 60\n", "FLEET_RUN_KEY=x")
    assert started.returncode == 0, started.stdout + started.stderr
    key = node.file(run_id, "key")
    launcher = int(node.file(run_id, "launcher"))
    assert f"FLEET_RUN_KEY={key}".encode() in Path(f"/proc/{launcher}/environ").read_bytes()
    assert node.facts()["launcher"] == "alive"
