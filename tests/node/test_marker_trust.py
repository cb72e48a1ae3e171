"""What no other user on a node can do to fleet (issue 17), on this machine's /proc and in pure
decisions: wear fleet's helper mark and be spared, hide a trainer's match past byte 4,096 of its
command line, or make cleanup's lists too long for a command line.

facts.sh runs for real here in dash, bash and busybox sh, as root (fleet's uid under sudo), marked
as fleet's own like every op step; "another user" is uid 4242, which has no passwd entry."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.core.playbook import shipped_script
from fleet.node.act import Actions
from fleet.node.act import parse as parse_act
from fleet.node.commands import script_cmd
from fleet.node.decide import CleanupSpec, decide_kill, trusted, who
from fleet.node.ere import compile_ere
from fleet.node.facts import CMDLINE_MAX, PathMatch, Proc, Record, Snapshot, facts_args, parse

SHELLS = [["dash"], ["bash", "--posix"], ["busybox", "sh"]]
OTHER = ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="starts processes of another uid")


def facts(shell: list[str], args: list[str], **env: str) -> Snapshot:
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    proc = subprocess.run(
        [*shell, "-s", "--", *args],
        input=shipped_script("facts.sh").encode(),
        capture_output=True,
        env={"PATH": os.environ["PATH"], "FLEET_NODE_HELPER": "1", **env},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return parse(proc.stdout.decode("ascii").splitlines())


@pytest.fixture
def token() -> str:
    return f"fleetmark{uuid.uuid4().hex[:10]}"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def spawn(
    procs: list[subprocess.Popen[bytes]], argv: list[str], argv0: str, **env: str
) -> subprocess.Popen[bytes]:
    """`sleep 60` shown as `argv0`, in a session of its own, with `env` added; up and exec'd."""
    proc = subprocess.Popen(
        [*argv, "bash", "-c", 'exec -a "$0" sleep 60', argv0],
        start_new_session=True,
        env={**os.environ, **env},
    )
    procs.append(proc)
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(argv0.encode()):
        assert time.monotonic() < deadline, "the process did not exec"
        time.sleep(0.01)
    return proc


def spec(*patterns: str) -> CleanupSpec:
    return CleanupSpec(patterns=tuple(compile_ere(p) for p in patterns), max_kill_share=1.0)


@needs_root
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_another_user_s_helper_mark_spares_nothing_fleet_s_own_still_does(
    shell: list[str], token: str, started: list[subprocess.Popen[bytes]]
) -> None:
    forged = spawn(started, OTHER, f"{token} torchrun", FLEET_NODE_HELPER="1")
    own = spawn(started, [], f"{token} helper", FLEET_NODE_HELPER="1")
    snap = facts(shell, facts_args([token]))
    assert snap.fleet_uid == 0
    assert snap.helper_uids[forged.pid] == (4242, 4242, 4242, 4242)
    assert snap.helper_uids[own.pid] == (0, 0, 0, 0)
    assert forged.pid in snap.records  # matched on the node: its mark is not believed
    assert own.pid not in snap.records  # fleet's own, left out as before
    whom = who(snap)
    assert forged.pid not in whom.own
    assert own.pid in whom.own
    assert decide_kill(snap, spec(token), whom).targets == (forged.pid,)


@needs_root
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_the_login_uid_under_sudo_is_fleet_s_own(
    shell: list[str], token: str, started: list[subprocess.Popen[bytes]]
) -> None:
    """The wrapper exports the mark before sudo: sudo's real uid is the login's (SUDO_UID)."""
    login = spawn(started, OTHER, f"{token} sudo", FLEET_NODE_HELPER="1")
    snap = facts(shell, facts_args([token]), SUDO_UID="4242")
    assert snap.login_uid == 4242
    assert login.pid not in snap.records
    assert login.pid in who(snap).own


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_match_past_byte_4096_is_found_and_killed(
    shell: list[str], token: str, started: list[subprocess.Popen[bytes]]
) -> None:
    head = "x" * (CMDLINE_MAX + 200)
    long = spawn(started, [], f"{head} {token}")
    assert subprocess.run(["pgrep", "-f", token], capture_output=True, check=False).stdout
    snap = facts(shell, facts_args(["nomatch", token]))
    record = snap.records[long.pid]
    assert record.cut
    assert token.encode() not in record.cmdline
    assert snap.hits[long.pid] == 1  # the second pattern
    kill = decide_kill(snap, spec("nomatch", token), who(snap))
    assert kill.targets == (long.pid,)
    assert kill.why[long.pid] == f"matches '{token}'"


def test_marks_count_only_on_fleet_s_uids_and_above_them() -> None:
    """Another login's sudo (real uid 1000, marked) above a root helper is fleet's own too; a
    mark on a process of another uid, or above one, is not."""
    procs = {
        pid: Proc(pid, ppid, pid, pid, 1, "S")
        for pid, ppid in [(1, 0), (10, 1), (11, 10), (12, 11), (20, 1), (21, 20), (30, 1)]
    }
    snap = Snapshot(
        self_pid=30,
        procs=procs,
        helpers=frozenset({11, 12, 20, 21}),
        helper_uids={11: (1000, 0, 0, 0), 12: (0, 0, 0, 0), 20: (4242,) * 4, 21: (4242,) * 4},
        fleet_uid=0,
        login_uid=999,
    )
    assert trusted(snap) == frozenset({11, 12})
    assert trusted(Snapshot(self_pid=30, procs=procs, helpers=frozenset({12}))) == frozenset()


def test_the_uids_and_hits_parse() -> None:
    lines = [
        "facts 1",
        "self 10",
        "trust 0 1000 ",
        "t 10 1 10 10 5 S",
        "m 20 4242 4242 4242 4242",
        "m 21",
        "hit 22 1",
        "end",
    ]
    snap = parse(lines)
    assert (snap.fleet_uid, snap.login_uid) == (0, 1000)
    assert snap.helpers == frozenset({20, 21})
    assert snap.helper_uids == {20: (4242, 4242, 4242, 4242)}
    assert snap.hits == {22: 1}
    assert parse([*lines[:2], "trust 0 -", "end"]).login_uid is None


def test_act_sh_lists_of_any_length_travel_on_stdin_not_in_the_command() -> None:
    paths = tuple(
        PathMatch(i, 0, "f", f"/dev/shm/torch_{i:05}".encode(), f"/dev/shm/torch_{i:05}".encode())
        for i in range(5000)
    )
    actions = Actions(signal=tuple((1000 + i, 7) for i in range(3000)), remove=paths)
    cmd = script_cmd(
        "act.sh", actions.args(then_facts=["--pattern", "x"]), sudo=True, timeout_s=60,
        password_on_stdin=False,
    )  # fmt: skip
    assert len(cmd.command) < 1000
    assert "torch_00001" not in cmd.command
    assert cmd.stdin is not None
    assert cmd.stdin.startswith("set -- signal 100 1000:7 ")
    assert cmd.display.endswith("< act.sh (18006 arguments first on stdin)")


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_act_sh_removes_thousands_of_paths_given_on_stdin(shell: list[str], tmp_path: Path) -> None:
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    made = []
    for i in range(3000):
        path = tmp_path / f"torch_{i}"
        path.write_bytes(b"")
        made.append(PathMatch(i, 0, "f", bytes(path), bytes(path)))
    cmd = script_cmd(
        "act.sh", Actions(remove=tuple(made)).args(), sudo=False, timeout_s=None,
        password_on_stdin=False,
    )  # fmt: skip
    assert cmd.stdin is not None
    proc = subprocess.run(
        [*shell, "-s"], input=cmd.stdin.encode(), capture_output=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    outcomes = parse_act(proc.stdout.decode("ascii").splitlines())
    removed = [o for o in outcomes if o.kind == "remove" and o.result == "removed"]
    assert len(removed) == 3000
    assert list(tmp_path.iterdir()) == []


def test_a_record_of_another_uid_with_a_hit_but_no_cut_is_matched_by_its_text_only() -> None:
    """A hit counts only for a record facts.sh cut: what fleet can read it matches itself."""
    snap = Snapshot(
        self_pid=5,
        procs={9: Proc(9, 1, 9, 9, 1, "S"), 5: Proc(5, 1, 5, 5, 1, "S")},
        records={9: Record(9, 4242, b"sleep\x0060")},
        hits={9: 0},
    )
    assert decide_kill(snap, spec("torchrun"), who(snap)).targets == ()
