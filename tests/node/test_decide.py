"""fleet/node/decide.py on synthetic snapshots: no root, no sshd, no shell.

What is killed is the pattern matches and their descendants, never pid 1, fleet's own processes
(its shell, ancestors, session, descendants) or another fleet run's marked helpers; a pattern set
that reaches sshd, init, a supervisor or most of a node is refused with what it matched; state
paths are removed only where training state lives and only when no live process holds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.node.decide import (
    SHARE_FLOOR,
    CleanupSpec,
    decide_gpus,
    decide_kill,
    decide_paths,
    decide_port,
    descendants,
    normalise,
    outside,
    places,
    who,
)
from fleet.node.deletion import STATE_PLACES_TEXT, state_path_problem
from fleet.node.ere import compile_ere
from fleet.node.facts import Link, PathMatch, Proc, Record, Snapshot

HOME = b"/tmp/home"


def snapshot(
    procs: Iterable[tuple[int, int, int, bytes]],
    self_pid: int,
    *,
    helpers: Iterable[int] = (),
    comms: dict[int, bytes] | None = None,
    **extra: object,
) -> Snapshot:
    """(pid, ppid, sid, cmdline) rows; every process gets a full record (as if all matched)."""
    rows = list(procs)
    comms = comms or {}
    table = {pid: Proc(pid, ppid, pid, sid, 100 + pid, "S") for pid, ppid, sid, _ in rows}
    records = {
        pid: Record(pid, 0, cmd.replace(b" ", b"\0"), comm=comms.get(pid, cmd.split(b" ")[0][:15]))
        for pid, _, _, cmd in rows
    }
    marked = frozenset(helpers)
    return Snapshot(
        self_pid=self_pid,
        procs=table,
        helpers=marked,
        helper_uids=dict.fromkeys(marked, (0, 0, 0, 0)),  # root's, as fleet's own are
        fleet_uid=0,
        records=records,
        **extra,  # type: ignore[arg-type]
    )


def spec(*patterns: str, **kw: object) -> CleanupSpec:
    return CleanupSpec(patterns=tuple(compile_ere(p) for p in patterns), **kw)  # type: ignore[arg-type]


# A node: init, sshd with our session (sshd -> session -> sudo -> sh -> facts.sh), a dead run
# (torchrun with a renamed worker), a bystander, and another operator's marked cleanup whose
# child carries the pattern.
NODE = [
    (1, 0, 1, b"/sbin/init"),
    (50, 1, 50, b"/usr/sbin/sshd -D"),
    (60, 50, 60, b"sshd: root@notty"),
    (61, 60, 60, b"sudo -n -- sh -s -- --pattern torchrun"),
    (62, 61, 60, b"sh -s -- --pattern torchrun"),
    (100, 1, 100, b"torchrun --nproc-per-node 2 train.py"),
    (101, 100, 101, b"pt_data_worker"),
    (102, 101, 101, b"pt_data_worker"),
    (200, 1, 200, b"jupyter-lab --port 8888"),
    (300, 50, 300, b"sshd: bob@notty"),
    (301, 300, 300, b"sh -s -- --pattern torchrun"),
    (302, 301, 300, b"grep -e torchrun"),
]


def test_kills_matches_and_their_renamed_workers_and_spares_fleet_and_bystanders() -> None:
    snap = snapshot(NODE, 62, helpers=[301])
    kill = decide_kill(snap, spec("torchrun"), who(snap))
    assert kill.refusal == ()
    assert kill.targets == (100, 101, 102)
    assert kill.why[100] == "matches 'torchrun'"
    assert kill.why[101] == "child of 100"


def test_fleet_s_own_session_ancestors_and_marked_helpers_are_its_own() -> None:
    snap = snapshot(NODE, 62, helpers=[301])
    whom = who(snap)
    assert {62, 61, 60, 301, 302} <= whom.own  # the session led by an ancestor; helper + child
    assert whom.ancestry == frozenset({50})  # sshd: never killed, a match refuses the node
    assert 1 not in whom.own


def test_a_session_led_by_pid_1_or_an_invisible_leader_is_not_fleet_s() -> None:
    """In a PID namespace the session leader is often invisible (sid 0) or init: that session
    holds the training job too, and must not be spared."""
    rows = [(1, 0, 1, b"tini"), (5, 1, 0, b"sh -s"), (9, 1, 0, b"torchrun 600")]
    snap = snapshot(rows, 5)
    assert decide_kill(snap, spec("torchrun"), who(snap)).targets == (9,)


@pytest.mark.parametrize(
    ("pattern", "what"),
    [
        ("sshd", "sshd"),  # another user's session, and the daemon fleet came in through
        ("init", "pid 1"),
        ("jupyter|sbin", "pid 1"),
        ("usr", "sshd"),
    ],
)
def test_patterns_that_reach_what_cleanup_never_kills_are_refused_with_what_they_match(
    pattern: str, what: str
) -> None:
    snap = snapshot(NODE, 62, helpers=[301])
    kill = decide_kill(snap, spec(pattern), who(snap))
    assert kill.targets == ()
    assert kill.refusal[-1].startswith("refused: the patterns match what cleanup never kills")
    assert kill.refusal[-1].endswith("did nothing on this node")
    assert what in "\n".join(kill.refusal)
    assert all(line.startswith("refused: ") for line in kill.refusal)


def test_a_container_init_running_the_trainer_refuses_pointing_to_kill_docker() -> None:
    """`docker run --init ... torchrun`: root's docker-init (started by containerd's shim)
    repeats the command; the refusal says where the run must be ended instead."""
    rows = [
        (1, 0, 1, b"init"),
        (40, 1, 40, b"containerd-shim-runc-v2 -id x"),
        (41, 40, 41, b"/sbin/docker-init -- torchrun train.py"),
        (42, 41, 41, b"torchrun train.py"),
        (62, 1, 62, b"sh -s"),
    ]
    snap = snapshot(rows, 62)
    kill = decide_kill(snap, spec("torchrun"), who(snap))
    assert kill.targets == ()
    assert "(docker-init)" in kill.refusal[-1]
    assert "`fleet kill-docker`" in kill.refusal[-2]
    # a refusal for another reason does not send the operator there
    sshd = decide_kill(snapshot(NODE, 62, helpers=[301]), spec("sshd"), who(snapshot(NODE, 62)))
    assert not any("kill-docker" in line for line in sshd.refusal)


def test_supervisors_and_daemons_are_protected_by_name() -> None:
    rows = [(1, 0, 1, b"tini -s -- keepalive"), (7, 1, 7, b"/usr/bin/dockerd -H fd://")]
    rows += [(8, 1, 8, b"containerd-shim-runc-v2 -id x"), (9, 1, 9, b"supervisord -n")]
    rows += [(10, 1, 10, b"sh -s")]
    snap = snapshot(rows, 10)
    for pattern, pid in [("docker", 7), ("shim", 8), ("supervisor", 9), ("keepalive", 1)]:
        kill = decide_kill(snap, spec(pattern), who(snap))
        assert kill.targets == (), pattern
        assert f"matches {pid} (" in "\n".join(kill.refusal), pattern


def test_a_pattern_set_that_would_kill_most_of_a_node_is_refused() -> None:
    rows = [(1, 0, 1, b"init"), (2, 1, 2, b"sh -s")]
    rows += [(pid, 1, pid, b"python worker.py") for pid in range(10, 10 + SHARE_FLOOR + 5)]
    rows += [(pid, 1, pid, b"other") for pid in range(100, 105)]
    snap = snapshot(rows, 2)
    kill = decide_kill(snap, spec("python"), who(snap))
    assert kill.targets == ()
    assert "would kill 21 of this node's" in kill.refusal[-1]
    assert "max_kill_share=1" in kill.refusal[-1]
    allowed = decide_kill(snap, spec("python", max_kill_share=1.0), who(snap))
    assert len(allowed.targets) == SHARE_FLOOR + 5
    few = snapshot(rows[:8], 2)  # a small node: its share alone never refuses
    assert len(decide_kill(few, spec("python"), who(few)).targets) == 6


def test_gpu_holders_are_named_and_killed_only_when_asked_daemons_never() -> None:
    rows = [(1, 0, 1, b"init"), (2, 1, 2, b"sh -s"), (30, 1, 30, b"pt_data_worker")]
    rows += [(31, 1, 31, b"nvidia-persistenced --user nvidia")]
    links = (Link(30, "fd", b"/dev/nvidia0"), Link(31, "fd", b"/dev/nvidiactl"))
    links += (Link(30, "fd", b"/dev/nvidia-uvm"),)
    snap = snapshot(rows, 2, links=links)
    spared = decide_kill(snap, spec("torchrun"), who(snap))
    assert (spared.targets, spared.spared_gpu) == ((), (30,))
    asked = decide_kill(snap, spec("torchrun", kill_gpu_holders=True), who(snap))
    assert (asked.targets, asked.gpu_daemons, asked.why[30]) == ((30,), (31,), "holds a GPU")


def _as_user(
    snap: Snapshot,
    pid: int,
    uid: int,
    exe: bytes | None,
    parent: tuple[int, tuple[tuple[int, ...], bytes] | None] | None = None,
) -> Snapshot:
    """`snap` with `pid` run by `uid`, its program (/proc/PID/exe) `exe` (None: not known);
    `parent`: its parent pid, with that one's uids and comm as facts.sh reports them."""
    records = dict(snap.records)
    procs = dict(snap.procs)
    known = None
    if parent is not None:
        procs[pid] = dataclasses.replace(procs[pid], ppid=parent[0])
        known = parent[1]
    records[pid] = dataclasses.replace(records[pid], uid=uid, exe=exe, parent=known)
    return dataclasses.replace(snap, records=records, procs=procs)


STRANGER = (400, 1, 400, b"sshd python3 -c pass torchrun")  # `exec -a sshd`, by another user
ROOT_SSHD = (50, ((0, 0, 0, 0), b"sshd"))  # sshd's privileged half: a user session's parent
BOBS_SHELL = (200, ((1001, 1001, 1001, 1001), b"sh"))


@pytest.mark.parametrize(
    ("uid", "exe", "parent", "refused"),
    [
        (1001, b"/usr/bin/python3.11", ROOT_SSHD, False),  # calling itself sshd
        (1001, b"/usr/sbin/sshd", ROOT_SSHD, True),  # a user's real sshd session
        (1001, b"/usr/sbin/sshd (deleted)", ROOT_SSHD, True),  # sshd upgraded since it started
        (1001, None, None, True),  # its program not known: the name is believed
        (0, b"/usr/bin/python3.11", None, True),  # root's: only root starts those
        # the program is sshd, but no daemon of root's started it: any user can run sshd
        (1001, b"/usr/sbin/sshd", BOBS_SHELL, False),
        (1001, b"/usr/sbin/sshd", (1, ((0, 0, 0, 0), b"init")), False),  # orphan: pid 1 adopts all
        (1001, b"/usr/sbin/sshd", (50, None), False),  # its parent not known (gone)
        (1001, b"/usr/sbin/sshd", (50, ((1001, 0, 0, 0), b"sshd")), False),  # setuid, not root's
    ],
    ids=[
        "stranger", "user-session", "upgraded", "unknown", "root", "from-a-shell", "orphan",
        "parent-gone", "parent-setuid",
    ],
)  # fmt: skip
def test_a_daemon_name_is_believed_only_from_root_or_from_that_program_started_by_root_s_daemon(
    uid: int,
    exe: bytes | None,
    parent: tuple[int, tuple[tuple[int, ...], bytes] | None] | None,
    refused: bool,
) -> None:
    """Any user can name a process `sshd`, and run sshd, tini or docker-init themselves: if that
    alone refused the node, a stranger's process matching the patterns would keep every cleanup
    from killing the dead run."""
    snap = _as_user(snapshot([*NODE, STRANGER], 62, helpers=[301]), 400, uid, exe, parent)
    kill = decide_kill(snap, spec("torchrun"), who(snap))
    if refused:
        assert kill.targets == ()
        assert "matches 400 (sshd)" in "\n".join(kill.refusal)
    else:
        assert kill.refusal == ()
        assert kill.targets == (100, 101, 102, 400)


def test_a_users_own_tini_around_a_trainer_is_killed_as_a_match_not_a_veto() -> None:
    """`tini -- python train.py` run by another user from their shell: the real tini program,
    and a match; once believed, it made every cleanup of the node refuse."""
    rows = [*NODE, (500, 1, 500, b"bash"), (501, 500, 500, b"tini -- python train.py")]
    rows += [(502, 501, 500, b"python train.py")]
    snap = snapshot(rows, 62, helpers=[301])
    snap = _as_user(snap, 500, 1001, b"/usr/bin/bash")
    snap = _as_user(snap, 501, 1001, b"/usr/bin/tini", (500, ((1001,) * 4, b"bash")))
    kill = decide_kill(snap, spec("torchrun", "train\\.py"), who(snap))
    assert kill.refusal == ()
    assert kill.targets == (100, 101, 102, 501, 502)


def test_a_gpu_daemon_name_is_believed_only_from_root_or_from_that_program() -> None:
    rows = [(1, 0, 1, b"init"), (2, 1, 2, b"sh -s"), (31, 1, 31, b"nvidia-persistenced x")]
    snap = snapshot(rows, 2, links=(Link(31, "fd", b"/dev/nvidiactl"),))
    asked = spec("torchrun", kill_gpu_holders=True)
    real = _as_user(snap, 31, 1001, b"/usr/bin/nvidia-persistenced")
    assert decide_kill(real, asked, who(real)).gpu_daemons == (31,)
    fake = _as_user(snap, 31, 1001, b"/usr/bin/python3.11")
    kill = decide_kill(fake, asked, who(fake))
    assert (kill.targets, kill.gpu_daemons) == ((31,), ())


# ---------------------------------------------------------------------- property: who dies

NAMES = [b"torchrun x", b"python train.py", b"sleep 1", b"bash", b"pt_data_worker"]


@st.composite
def nodes(draw: st.DrawFn) -> tuple[Snapshot, frozenset[int]]:
    """A random process tree under pid 1 with a self pid, sessions and marked helpers."""
    count = draw(st.integers(3, 40))
    rows = [(1, 0, 1, b"init")]
    for pid in range(2, count + 2):
        parent = draw(st.sampled_from([r[0] for r in rows]))
        parent_sid = next(r[2] for r in rows if r[0] == parent)
        sid = draw(st.sampled_from([pid, parent_sid, 0]))
        rows.append((pid, parent, sid, draw(st.sampled_from(NAMES))))
    me = draw(st.sampled_from([r[0] for r in rows[1:]]))
    helpers = frozenset(draw(st.sets(st.sampled_from([r[0] for r in rows]), max_size=3)))
    return snapshot(rows, me, helpers=helpers), helpers


@settings(max_examples=300, deadline=None)
@given(node=nodes(), pattern=st.sampled_from(["torchrun", r"train\.py", "worker|sleep"]))
def test_never_kills_pid_1_fleet_s_own_processes_or_marked_helpers(
    node: tuple[Snapshot, frozenset[int]], pattern: str
) -> None:
    snap, helpers = node
    whom = who(snap)
    kill = decide_kill(snap, spec(pattern, max_kill_share=1.0), whom)
    targets = set(kill.targets)
    me = snap.self_pid
    chain = set()
    pid = me
    while (proc := snap.procs.get(pid)) is not None and proc.ppid not in (0, 1):
        chain.add(proc.ppid)
        pid = proc.ppid
    assert 1 not in targets
    assert not targets & ({me} | chain | descendants(snap, [me]))
    assert not targets & descendants(snap, helpers)
    sid = snap.procs[me].sid
    if sid > 1 and sid in {me} | chain:
        assert not targets & {p.pid for p in snap.procs.values() if p.sid == sid}
    if not kill.refusal:
        # every other match goes, and everything below it
        matches = {
            p
            for p, r in snap.records.items()
            if p not in whom.own and compile_ere(pattern).search(r.text)
        }
        assert descendants(snap, matches) - whom.own - whom.ancestry - {1} == targets
    assert kill.targets == tuple(sorted(targets))


# -------------------------------------------------------------------------------- the port


def test_the_port_holder_is_stopped_unless_it_is_fleet_s_own_or_protected() -> None:
    rows = [*NODE, (400, 1, 400, b"python3 rdzv_store.py 39500")]
    links = (Link(400, "fd", b"socket:[77]"), Link(50, "fd", b"socket:[78]"))
    links += (Link(61, "fd", b"socket:[79]"),)
    listens = ((39500, 77), (22, 78), (4000, 79))
    snap = snapshot(rows, 62, helpers=[301], listens=listens, links=links)
    whom = who(snap)
    port = decide_port(snap, 39500, whom)
    assert (port.held, port.holders, port.stop) == (True, (400,), (400,))
    ssh = decide_port(snap, 22, whom)
    assert (ssh.stop, ssh.protected) == ((), ((50, "sshd"),))
    own = decide_port(snap, 4000, whom)
    assert (own.stop, own.own) == ((), (61,))
    free = decide_port(snap, 29500, whom)
    assert (free.held, free.holders) == (False, ())


def test_a_listener_no_visible_process_owns_is_held_without_holders() -> None:
    snap = snapshot([(1, 0, 1, b"init"), (2, 1, 2, b"sh")], 2, listens=((39500, 5),))
    port = decide_port(snap, 39500, who(snap))
    assert (port.held, port.holders, port.stop) == (True, (), ())


# ------------------------------------------------------------------------------------ GPUs


def test_gpus_are_reset_only_when_nvidia_smi_exists_and_nothing_uses_them() -> None:
    base = [(1, 0, 1, b"init"), (2, 1, 2, b"sh"), (3, 1, 3, b"x")]
    assert decide_gpus(snapshot(base, 2)).status == "absent"
    assert decide_gpus(snapshot(base, 2, smi_rc=9)).rc == 9
    assert decide_gpus(snapshot(base, 2, smi_rc=0, apps=frozenset({4242}))).busy == (4242,)
    held = snapshot(base, 2, smi_rc=0, links=(Link(3, "fd", b"/dev/nvidia3"),))
    assert decide_gpus(held).busy == (3,)
    assert decide_gpus(snapshot(base, 2, smi_rc=0)).status == "reset"


# ------------------------------------------------------------------------------ state paths


def node_places(home: bytes = HOME, **resolved: bytes) -> Snapshot:
    keys = {"tmp": b"/tmp", "vartmp": b"/var/tmp", "shm": b"/dev/shm", "home": home}
    keys.update(resolved)
    return snapshot([(1, 0, 1, b"init"), (2, 1, 2, b"sh")], 2, home=home, places=keys)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/opt/*", "not where training state lives"),
        ("/usr/../opt", "/opt: not where training state lives"),
        ("/tmp/../etc/x", "/etc/x: not where training state lives"),
        ("/tmp", "not where training state lives"),
        ("/", "not where training state lives"),
        ("~", "not where training state lives"),
        ("~/.cache", "not where training state lives"),
        ("~/.ssh/id_rsa", "/tmp/home/.ssh/id_rsa: not where training state lives"),
        ("/tmp/*", "'*' matches everything in /tmp"),
        ("/tmp/.*", "'.*' matches everything in /tmp"),
        ("/var/tmp/[!.]*", "'[!.]*' matches everything in /var/tmp"),
        ("//tmp//*/x", "'*' matches everything in /tmp"),
        ("/tmp/cuda_*", None),
        ("//tmp//./cuda_*", None),
        ("/tmp/x/../torch_y", None),
        ("/dev/shm/torch_*", None),
        ("/var/tmp/job-1", None),
        ("~/.nv", None),
        ("~/.nv/ComputeCache", None),
        ("~/.triton", None),
        ("~/.cache/torch_extensions", None),
    ],
)
def test_a_node_refuses_exactly_what_fleet_refuses_and_says_why(path: str, why: str | None) -> None:
    snap = node_places()
    paths = decide_paths(snap, spec("x", state_paths=(path,)), who(snap))
    if why is None:
        assert paths.refused_globs == ()
        assert state_path_problem(path) is None
    else:
        ((glob, got),) = paths.refused_globs
        assert glob == path
        assert why in got, got
        assert state_path_problem(path) is not None


def test_a_glob_behind_a_symlinked_directory_is_judged_where_it_leads() -> None:
    snap = node_places()
    to_etc = snapshot(
        [(1, 0, 1, b"init"), (2, 1, 2, b"sh")],
        2,
        home=HOME,
        places=snap.places,
        globs={0: b"/etc/*", 1: b"/tmp/cuda_*"},
    )
    paths = decide_paths(
        to_etc, spec("x", state_paths=("~/.cache/to-etc/*", "~/.cache/c")), who(to_etc)
    )
    ((glob, why),) = paths.refused_globs
    assert glob == "~/.cache/to-etc/*"
    assert why == f"resolves to /etc/*: not where training state lives ({STATE_PLACES_TEXT})"


def test_places_count_as_written_and_as_resolved_but_never_as_root() -> None:
    where = places(node_places(shm=b"/run/shm", home=b"/data/home"))
    assert outside(where, b"/run/shm/torch_1") is None
    assert outside(where, b"/data/home/.nv") is None
    assert outside(normalise_places := where, b"/x") is not None  # noqa: F841
    rooted = places(node_places(tmp=b"/"))
    assert outside(rooted, b"/etc/passwd") is not None


def test_inside_the_home_only_its_own_places_count_even_below_tmp() -> None:
    where = places(node_places())
    assert outside(where, b"/tmp/home/.nv/x") is None
    assert outside(where, b"/tmp/home/.cache/torch") is None
    assert outside(where, b"/tmp/home/precious") is not None


def test_normalise_resolves_dots_as_text() -> None:
    assert normalise(b"//tmp//./a/../b/") == b"/tmp/b"
    assert normalise(b"/..") == b"/"


def match(index: int, path: bytes, kind: str = "d", real: bytes | None = None) -> PathMatch:
    return PathMatch(index, 0, kind, path, real or path)


def test_held_paths_are_kept_free_ones_removed_and_those_of_the_dying_wait_for_the_kill() -> None:
    rows = [(1, 0, 1, b"init"), (2, 1, 2, b"sh"), (70, 1, 70, b"python job"), (71, 1, 71, b"x")]
    matches = (
        match(0, b"/tmp/pymp-free"),
        match(1, b"/tmp/pymp-live"),
        match(2, b"/tmp/torchelastic_a"),
        match(3, b"/dev/shm/torch_1", "f"),
        match(4, b"/tmp/cuda_link", "l", b"/tmp/cuda_link"),
    )
    links = (
        Link(70, "fd", b"socket:[9]"),  # bound inside /tmp/pymp-live
        Link(71, "env", b"/tmp/torchelastic_a/none/attempt_0/0/error.json"),
        Link(71, "env", b"/tmp/torchelastic_abc"),  # only starts like a held one
        Link(70, "map", b"/dev/shm/torch_1"),
        Link(70, "cwd", b"/tmp/cuda_link"),  # a symlink is never held
    )
    snap = snapshot(
        rows, 2, home=HOME, places=node_places().places, matches=matches, links=links,
        unix={9: b"/tmp/pymp-live/listener-1"},
    )  # fmt: skip
    globs = ("/tmp/pymp-*", "/tmp/torchelastic_*", "/dev/shm/torch_*", "/tmp/cuda_*")
    paths = decide_paths(snap, spec("x", state_paths=globs), who(snap), killing=[70])
    assert [m.path for m in paths.remove] == [b"/tmp/pymp-free", b"/tmp/cuda_link"]
    assert [m.path for m in paths.after_kill] == [b"/tmp/pymp-live", b"/dev/shm/torch_1"]
    assert [(m.path, users) for m, users in paths.kept] == [(b"/tmp/torchelastic_a", (71,))]


@pytest.mark.parametrize("kind", ["env", "fd", "cwd", "map"])
def test_another_users_hold_on_a_path_not_theirs_does_not_keep_it_their_own_does(
    kind: str,
) -> None:
    """Any user can put HOLD=/tmp/cuda_x in their environment, or open a directory anyone may
    read: counted, a stranger's sleep kept the run's ghost state on the node for good. A use
    keeps a match only when it is root's, fleet's own uids' or the match's owner's."""
    rows = [(1, 0, 1, b"init"), (2, 1, 2, b"sh"), (80, 1, 80, b"sleep 3600")]
    rows += [(81, 1, 81, b"python job")]
    matches = (
        PathMatch(0, 0, "d", b"/tmp/cuda_ghost", b"/tmp/cuda_ghost", owner=0),  # the run's
        PathMatch(1, 0, "d", b"/tmp/pymp-bob", b"/tmp/pymp-bob", owner=1001),  # bob's own
        PathMatch(2, 0, "d", b"/tmp/cuda_login", b"/tmp/cuda_login", owner=1000),  # the login's
        PathMatch(3, 0, "d", b"/tmp/cuda_unknown", b"/tmp/cuda_unknown"),  # owner not known
    )
    links = (
        Link(80, kind, b"/tmp/cuda_ghost"),
        Link(80, kind, b"/tmp/pymp-bob/x"),
        Link(80, kind, b"/tmp/cuda_login"),
        Link(80, kind, b"/tmp/cuda_unknown"),
        Link(81, kind, b"/tmp/cuda_login/y"),  # the login's own job
    )
    snap = snapshot(
        rows, 2, home=HOME, places=node_places().places, matches=matches, links=links,
        login_uid=1000,
    )  # fmt: skip
    snap = _as_user(_as_user(snap, 80, 1001, b"/usr/bin/sleep"), 81, 1000, b"/usr/bin/python3")
    paths = decide_paths(snap, spec("x", state_paths=("/tmp/cuda_*", "/tmp/pymp-*")), who(snap))
    assert [m.path for m in paths.remove] == [b"/tmp/cuda_ghost"]
    assert [(m.path, users) for m, users in paths.kept] == [
        (b"/tmp/pymp-bob", (80,)),
        (b"/tmp/cuda_login", (81,)),
        (b"/tmp/cuda_unknown", (80,)),
    ]


def test_matches_that_resolve_outside_refuse_the_state_part_or_to_home_the_item() -> None:
    rows = [(1, 0, 1, b"init"), (2, 1, 2, b"sh")]
    outside_match = match(0, b"/tmp/pymp-link/data", real=b"/opt/app/data")
    snap = snapshot(rows, 2, home=HOME, places=node_places().places, matches=(outside_match,))
    paths = decide_paths(snap, spec("x", state_paths=("/tmp/pymp-*/data",)), who(snap))
    assert paths.outside == (outside_match,)
    assert paths.remove == ()
    home = match(0, b"/tmp/cuda_root/", real=b"/")
    link = match(1, b"/tmp/cuda_l", "l", b"/tmp/cuda_l")
    snap = snapshot(rows, 2, home=HOME, places=node_places().places, matches=(home, link))
    anywhere = spec("x", state_paths=("/tmp/cuda_*/",), allow_any_path=True)
    paths = decide_paths(snap, anywhere, who(snap))
    assert (paths.refused, paths.remove) == ((home,), (link,))


def test_a_tilde_glob_without_a_known_home_is_skipped() -> None:
    snap = node_places(home=b"")
    paths = decide_paths(snap, spec("x", state_paths=("~/.nv", "/tmp/cuda_*")), who(snap))
    assert paths.no_home == ("~/.nv",)
    assert paths.refused_globs == ()
