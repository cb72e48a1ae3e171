"""fleet/node/cleanup.py: one node's cleanup over rounds of facts -> decide -> act, on synthetic
snapshots and act.sh answers. What it says, in which order, and how each node's step ends."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

import pytest

from fleet.core.result import CleanupDone
from fleet.node.act import Actions, Outcome, parse_line
from fleet.node.cleanup import Cleanup, preview
from fleet.node.decide import CleanupSpec
from fleet.node.ere import compile_ere
from fleet.node.facts import Link, PathMatch, Proc, Record, Snapshot

PLACES = {"tmp": b"/tmp", "vartmp": b"/var/tmp", "shm": b"/dev/shm", "home": b"/root"}
GLOBS = ("/tmp/.torch_distributed_*", "/dev/shm/torch_*", "/tmp/cuda_*", "~/.nv")
BASE = [(1, 0, b"tini -s -- keepalive"), (5, 1, b"sh -s -- facts")]


def node(
    rows: Iterable[tuple[int, int, bytes]] = (),
    *,
    paths: Iterable[tuple[bytes, str]] = (),
    links: Iterable[Link] = (),
    **extra: object,
) -> Snapshot:
    """A node with facts.sh as pid 5 (its own session) and `rows` (pid, ppid, cmdline)."""
    table = [*BASE, *rows]
    matches = tuple(PathMatch(i, 0, kind, p, p) for i, (p, kind) in enumerate(paths))
    matches = extra.pop("matches", matches)  # type: ignore[assignment]
    return Snapshot(
        self_pid=5,
        procs={pid: Proc(pid, ppid, pid, pid, 1000 + pid, "S") for pid, ppid, _ in table},
        records={
            pid: Record(pid, 0, cmd.replace(b" ", b"\0"), user="root") for pid, _, cmd in table
        },
        home=b"/root",
        places=PLACES,
        matches=matches,
        links=tuple(links),
        **extra,  # type: ignore[arg-type]
    )


def spec(**kw: object) -> CleanupSpec:
    defaults: dict[str, object] = {
        "patterns": (compile_ere("torchrun"), compile_ere(r"train\.py")),
        "grace_s": 1.0,
        "port": 39500,
        "state_paths": GLOBS,
    }
    return CleanupSpec(**{**defaults, **kw})  # type: ignore[arg-type]


class Run:
    """A Cleanup and what it said."""

    def __init__(self, **kw: object) -> None:
        self.lines: list[str] = []
        self.cleanup = Cleanup(spec(**kw), self.lines.append)

    def act(self, actions: Actions | None, *answers: str) -> None:
        assert actions
        for line in answers:
            outcome = parse_line(line)
            assert outcome is not None
            self.cleanup.record(outcome)


DEAD_RUN = [
    (100, 1, b"torchrun --nproc-per-node 2 train.py"),
    (101, 100, b"pt_data_worker"),
    (102, 1, b"python3 /tmp/train.py 0"),
    (103, 1, b"python3 /tmp/rdzv_store.py 39500"),
    (200, 1, b"jupyter-lab --no-browser"),
]
DEAD_PATHS = [(b"/tmp/.torch_distributed_x", "d"), (b"/dev/shm/torch_1", "f"), (b"/root/.nv", "d")]
DEAD_LINKS = [Link(102, "fd", b"/dev/shm/torch_1"), Link(103, "fd", b"socket:[77]")]


def test_a_dead_run_ends_in_clean_with_every_part_said_in_order() -> None:
    run = Run()
    first = node(DEAD_RUN, paths=DEAD_PATHS, links=DEAD_LINKS, listens=((39500, 77),))
    actions = run.cleanup.plan(first)
    assert actions is not None
    assert actions.signal == ((100, 1100), (101, 1101), (102, 1102), (103, 1103))
    assert [m.path for m in actions.remove] == [b"/tmp/.torch_distributed_x", b"/root/.nv"]
    # held only by train.py, which this round kills: removed by the same act.sh, after it
    assert [m.path for m in actions.after_kill] == [b"/dev/shm/torch_1"]
    assert not actions.gpu_reset
    args = actions.args()
    assert args[:2] == ["signal", "10"]
    assert args[args.index("remove") :][-3:] == ["F", "/dev/shm/torch_1", "/dev/shm/torch_1"]
    run.act(
        actions,
        "signal 100 term", "signal 101 term", "signal 103 term", "signal 102 kill",
        "remove 0 removed", "remove 1 removed", "remove 2 removed", "done",
    )  # fmt: skip
    assert run.cleanup.plan(node([DEAD_RUN[4]])) is None
    assert run.cleanup.finish(node([DEAD_RUN[4]])) == 0
    assert run.lines == [
        "kill: sending TERM to 3 processes, KILL after 1s",
        "port 39500: held by 103 (python3 /tmp/rdzv_store.py 39500)",
        "killed 100 (TERM): torchrun --nproc-per-node 2 train.py",
        "killed 101 (TERM): pt_data_worker",
        "killed 103 (TERM): python3 /tmp/rdzv_store.py 39500",
        "killed 102 (KILL): python3 /tmp/train.py 0",
        "removed: /tmp/.torch_distributed_x",
        "removed: /root/.nv",
        "removed: /dev/shm/torch_1",
        "kill: 3 ended (2 by TERM, 1 by KILL)",
        "gpu-reset: skipped: no nvidia-smi",
        "state: removed 3, kept 0",
        "port 39500: freed (killed 103 python3 /tmp/rdzv_store.py 39500)",
        "killed 4 processes (TERM 3, KILL 1), removed 3 paths, port 39500 freed (stopped python3)",
    ]
    assert run.cleanup.done == CleanupDone(
        killed=4,
        by_term=3,
        by_kill=1,
        removed=3,
        port_freed=39500,
        port_holders=(103,),
        clean=True,
    )


def test_a_path_whose_holder_survived_the_kill_waits_for_the_next_look() -> None:
    run = Run(port=None)
    snap = node(DEAD_RUN[2:3], paths=[DEAD_PATHS[1]], links=DEAD_LINKS[:1])
    actions = run.cleanup.plan(snap)
    assert actions is not None
    run.act(actions, "signal 102 left", "remove 0 held", "done")
    assert not any(line.startswith("removed") for line in run.lines)
    assert run.cleanup.plan(snap) is None  # the holder is still there: kept, not retried
    assert run.cleanup.finish(snap) == 1
    assert "kept (in use by 102 python3 /tmp/train.py 0): /dev/shm/torch_1" in run.lines
    assert run.lines[-1] == "left: 1 process, 1 path; failed: kill"


def test_workers_a_launcher_restarts_during_teardown_are_caught_by_the_next_round() -> None:
    run = Run()
    run.act(run.cleanup.plan(node(DEAD_RUN[:2])), "signal 100 term", "signal 101 term", "done")
    restarted = node([(150, 1, b"python -u train.py --rank 0")])
    again = run.cleanup.plan(restarted)
    assert again is not None
    assert again.signal == ((150, 1150),)
    run.act(again, "signal 150 kill", "done")
    assert run.cleanup.plan(node()) is None
    assert run.cleanup.finish(node()) == 0
    assert "kill: 3 ended (2 by TERM, 1 by KILL)" in run.lines
    assert run.lines[-1] == "killed 3 processes (TERM 2, KILL 1)"


def test_a_process_that_survives_kill_is_left_once_and_fails_the_kill_part() -> None:
    run = Run()
    run.act(run.cleanup.plan(node(DEAD_RUN[2:3])), "signal 102 left", "done")
    stuck = node(DEAD_RUN[2:3])
    assert run.cleanup.plan(stuck) is None  # tried once; not again
    assert run.cleanup.finish(stuck) == 1
    assert "left 102: python3 /tmp/train.py 0" in run.lines
    assert "kill: 1 left (pids 102); 0 ended (0 by TERM, 0 by KILL)" in run.lines
    assert "left process 102: python3 /tmp/train.py 0" in run.lines
    assert run.lines[-1] == "left: 1 process; failed: kill"


def test_without_permission_it_says_so_and_what_is_left() -> None:
    run = Run(state_paths=(), port=None)
    run.act(run.cleanup.plan(node([(100, 1, b"torchrun 600")])), "signal 100 denied", "done")
    assert run.cleanup.finish(node([(100, 1, b"torchrun 600")])) == 1
    assert run.lines[:3] == [
        "kill: sending TERM to 1 process, KILL after 1s",
        "not permitted to signal 100 (not root?): torchrun 600",
        "left 100: torchrun 600",
    ]
    assert "kill: 1 left (pids 100); 0 ended (0 by TERM, 0 by KILL)" in run.lines


def test_a_process_that_ended_before_the_signal_is_not_claimed() -> None:
    """A second cleanup at once finds them gone under the kill lock: it claims nothing."""
    run = Run(state_paths=(), port=None)
    run.act(run.cleanup.plan(node(DEAD_RUN[:1])), "lock wait", "signal 100 gone", "done")
    run.cleanup.finish(node())
    assert "kill: another cleanup is killing on this node; waiting for it (up to 31s)" in run.lines
    assert not any(line.startswith("killed ") for line in run.lines)
    assert "kill: nothing matched" in run.lines


def test_a_path_a_live_job_holds_is_kept_and_left_but_is_no_failure() -> None:
    run = Run(port=None)
    live = [(70, 1, b"python -m torch.distributed.run job.py")]
    held = node(live, paths=[(b"/tmp/cuda_live", "d")], links=[Link(70, "cwd", b"/tmp/cuda_live")])
    assert run.cleanup.plan(held) is None
    assert run.cleanup.finish(held) == 1
    assert run.lines == [
        "kill: nothing matched",
        "gpu-reset: skipped: no nvidia-smi",
        "kept (in use by 70 python -m torch.distributed.run job.py): /tmp/cuda_live",
        "state: removed 0, kept 1",
        "left path: /tmp/cuda_live (in use by 70 python -m torch.distributed.run job.py)",
        "left: 1 path",
    ]


def test_patterns_that_reach_sshd_leave_the_node_untouched() -> None:
    run = Run(patterns=(compile_ere("sshd"),))
    rows = [(50, 1, b"/usr/sbin/sshd -D"), (300, 50, b"sshd: bob@pts/0")]
    assert run.cleanup.plan(node(rows)) is None
    assert run.cleanup.finish(node(rows)) == 1
    assert run.lines[-1].startswith("refused: the patterns match what cleanup never kills (sshd)")
    assert any("matches 300 (sshd): sshd: bob@pts/0" in line for line in run.lines)


def test_a_state_path_outside_the_places_refuses_the_node_before_anything_is_killed() -> None:
    run = Run(state_paths=("/tmp/cuda_*", "/var/lib/docker"))
    assert run.cleanup.plan(node(DEAD_RUN)) is None
    assert run.cleanup.finish(node(DEAD_RUN)) == 1
    assert run.lines[0].startswith("refused --path '/var/lib/docker': not where training state")
    assert run.lines[-1].startswith("refused: 1 state path outside the places")


def test_a_match_behind_a_symlinked_dir_refuses_the_state_part_but_not_the_kill() -> None:
    run = Run(state_paths=("/tmp/pymp-*/data",), port=None)
    snap = node(DEAD_RUN[:1], matches=(PathMatch(0, 0, "d", b"/tmp/pymp-l/data", b"/opt/data"),))
    actions = run.cleanup.plan(snap)
    assert actions is not None
    assert actions.remove == ()
    run.act(actions, "signal 100 term", "done")
    after = node(matches=snap.matches)
    assert run.cleanup.plan(after) is None
    assert run.cleanup.finish(after) == 1
    assert "refused (resolves to /opt/data): /tmp/pymp-l/data" in run.lines
    assert "state: removed 0, kept 0, refused 1 (outside the places training state lives)" in (
        run.lines
    )
    assert run.lines[-1] == "killed 1 process (TERM 1); left: 1 path; failed: state"


def test_a_port_held_by_a_socket_no_visible_process_owns_fails_the_port_part() -> None:
    run = Run(state_paths=())
    hidden = node(listens=((39500, 5),))
    assert run.cleanup.plan(hidden) is None
    assert run.cleanup.finish(hidden) == 1
    assert "port 39500: still held (no visible process)" in run.lines
    assert "left port 39500: held by a socket no visible process owns" in run.lines
    assert run.lines[-1] == "left: port 39500; failed: port"


def test_the_gpus_are_reset_once_nothing_uses_them_and_failures_are_said() -> None:
    run = Run(state_paths=(), port=None)
    busy = node(DEAD_RUN[:1], smi_rc=0, links=[Link(100, "fd", b"/dev/nvidia0")])
    actions = run.cleanup.plan(busy)
    assert actions is not None
    assert not actions.gpu_reset  # not while it kills
    run.act(actions, "signal 100 term", "done")
    idle = node(smi_rc=0)
    actions = run.cleanup.plan(idle)
    assert actions is not None
    assert actions.args() == ["gpu-reset"]
    output = b"GPU 00000000:01:00.0 was successfully reset.\n".hex()
    run.act(actions, f"gpu-reset 0 {output}", "done")
    assert run.cleanup.plan(idle) is None
    assert run.cleanup.finish(idle) == 0
    assert "GPU 00000000:01:00.0 was successfully reset." in run.lines
    assert "gpu-reset: done" in run.lines
    failing = Run(state_paths=(), port=None)
    failing.act(failing.cleanup.plan(node(smi_rc=0)), f"gpu-reset 3 {b'Unable'.hex()}", "done")
    assert failing.cleanup.finish(node(smi_rc=0)) == 1
    assert failing.lines[-2:] == [
        "gpu-reset: failed (exit 3)",
        "failed: gpu-reset (nothing left behind)",
    ]


def test_a_busy_gpu_is_named_and_skipped() -> None:
    run = Run(state_paths=(), port=None)
    snap = node([(40, 1, b"sleep 600")], smi_rc=0, links=[Link(40, "fd", b"/dev/nvidia0")])
    assert run.cleanup.plan(snap) is None
    assert run.cleanup.finish(snap) == 0
    assert run.lines[:3] == [
        "gpu holder 40 not killed (pass kill_gpu_holders=true): sleep 600",
        "kill: nothing matched",
        "gpu holder 40: sleep 600",
    ]
    assert "gpu-reset: skipped: GPU busy (pids 40)" in run.lines


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (
            "lock none",
            "kill: no lock (flock(1) missing or fleet's node state dir refused): "
            "not serialised with other cleanups on this node",
        ),
        ("lock late", "kill: the other cleanup still holds the kill lock after 31s; going ahead"),
        (f"remove 0 failed {b'rm: Operation not permitted'.hex()}", "failed: /tmp/cuda_x: rm: "),
        ("remove 0 changed", "skipped (changed since cleanup looked at it): /tmp/cuda_x"),
    ],
)
def test_act_sh_s_other_answers_are_said(line: str, said: str) -> None:
    run = Run(port=None)
    actions = run.cleanup.plan(node(paths=[(b"/tmp/cuda_x", "d")]))
    run.act(actions, line)
    assert any(x.startswith(said) for x in run.lines), run.lines


def test_act_outcome_lines_parse_strictly() -> None:
    assert parse_line("signal 12 term") == Outcome("signal", 12, "term")
    assert parse_line("remove 3 failed 6f6b") == Outcome("remove", 3, "failed", b"ok")
    assert parse_line("unrelated text") is None
    for bad in ("signal x term", "signal 1 maybe", "remove 1 failed zz", "gpu-reset x -"):
        with pytest.raises(ValueError, match=r"malformed|hex"):
            parse_line(bad)


# ------------------------------------------------------------------- the result line


def finished(run: Run, snap: Snapshot) -> tuple[int, str, CleanupDone | None]:
    """No round left; the exit code, the last line, and what it did in numbers."""
    assert run.cleanup.plan(snap) is None
    code = run.cleanup.finish(snap)
    return code, run.lines[-1], run.cleanup.done


def test_a_node_with_nothing_to_do_is_already_clean() -> None:
    run = Run()
    assert finished(run, node([DEAD_RUN[4]])) == (0, "already clean", CleanupDone(clean=True))
    assert run.lines == [
        "kill: nothing matched",
        "gpu-reset: skipped: no nvidia-smi",
        "state: removed 0, kept 0",
        "port 39500: free",
        "already clean",
    ]


def test_the_result_counts_term_and_the_kill_after_the_grace_period() -> None:
    run = Run(state_paths=(), port=None)
    first = node(DEAD_RUN[:3])
    run.act(run.cleanup.plan(first), "signal 100 term", "signal 101 kill", "signal 102 kill")
    code, line, done = finished(run, node())
    assert (code, line) == (0, "killed 3 processes (TERM 1, KILL 2)")
    # never to be read as one process's `killed PID (TERM): CMD` line
    assert not any(re.match(r"killed \d+ \(", x) for x in (line, "killed 1 process (TERM 1)"))
    assert done == CleanupDone(killed=3, by_term=1, by_kill=2, clean=True)
    # only what it ended counts: not a process found gone, nor one that survived KILL
    other = Run(state_paths=(), port=None)
    other.act(other.cleanup.plan(first), "signal 100 gone", "signal 101 kill", "signal 102 left")
    code, line, done = finished(other, node(DEAD_RUN[2:3]))
    assert (code, line) == (1, "killed 1 process (KILL 1); left: 1 process; failed: kill")
    assert done == CleanupDone(killed=1, by_kill=1, failed=("kill",))


def test_a_path_rm_could_not_remove_is_counted_and_fails_the_state_part() -> None:
    run = Run(port=None)
    paths = [(b"/tmp/cuda_x", "d"), (b"/tmp/cuda_y", "d"), (b"/tmp/cuda_z", "f")]
    error = b"rm: cannot remove '/tmp/cuda_y/a': Operation not permitted\n".hex()
    run.act(
        run.cleanup.plan(node(DEAD_RUN[:1], paths=paths)),
        "signal 100 term", "remove 0 removed", f"remove 1 failed {error}", "remove 2 removed",
    )  # fmt: skip
    code, line, done = finished(run, node(paths=paths[1:2]))
    assert "failed: /tmp/cuda_y: rm: cannot remove '/tmp/cuda_y/a': Operation not permitted" in (
        run.lines
    )
    assert "state: removed 2, kept 0, failed 1" in run.lines
    assert code == 1
    assert line == (
        "killed 1 process (TERM 1), removed 2 paths, could not remove 1 path; "
        "left: 1 path; failed: state"
    )
    assert done == CleanupDone(killed=1, by_term=1, removed=2, remove_failed=1, failed=("state",))


def test_a_port_freed_by_the_kill_names_its_program_and_not_its_pid() -> None:
    """torchrun's c10d store listens on the rendezvous port itself: killing it frees the port."""
    run = Run(state_paths=())
    store = [(100, 1, b"/opt/venv/bin/torchrun --rdzv-endpoint n1:39500 train.py")]
    held = node(store, links=[Link(100, "fd", b"socket:[9]")], listens=((39500, 9),))
    run.act(run.cleanup.plan(held), "signal 100 term", "done")
    code, line, done = finished(run, node())
    assert "port 39500: freed (killed 100 /opt/venv/bin/torchrun --rdzv-endpoint n1:39500 " in (
        "\n".join(run.lines)
    )
    assert (code, line) == (0, "killed 1 process (TERM 1), port 39500 freed (stopped torchrun)")
    assert done is not None
    assert (done.port_freed, done.port_holders) == (39500, (100,))


def test_a_port_whose_holder_ended_by_itself_is_not_claimed() -> None:
    run = Run(state_paths=())
    rows = [(103, 1, b"python3 /tmp/rdzv_store.py 39500")]
    run.act(
        run.cleanup.plan(node(rows, links=DEAD_LINKS[1:], listens=((39500, 77),))),
        "signal 103 gone",
        "done",
    )
    code, line, done = finished(run, node())
    assert "port 39500: freed (its holder ended before this cleanup signalled it)" in run.lines
    assert (code, line, done) == (0, "already clean", CleanupDone(clean=True))


def _strangers(snap: Snapshot, *pids: int) -> Snapshot:
    """`snap` seen by fleet as root over a login of uid 1000, `pids` run by nobody (65534)."""
    records = dict(snap.records)
    for pid in pids:
        records[pid] = dataclasses.replace(records[pid], uid=65534, user="nobody")
    return dataclasses.replace(snap, records=records, fleet_uid=0, login_uid=1000)


def _holding(rows: Iterable[tuple[int, int, bytes]], holder: int) -> Snapshot:
    """A node where `holder` listens on port 39500."""
    return node(rows, links=[Link(holder, "fd", b"socket:[4]")], listens=((39500, 4),))


def test_another_users_program_on_the_port_is_named_and_left_not_stopped() -> None:
    """`python3 -m http.server 39500` of another user's, matching no pattern, is no part of the
    run: cleanup used to stop whatever held the port. Now it says whose it is and leaves it,
    and the port part fails (the relaunch would collide)."""
    run = Run(state_paths=())
    rows = [(100, 1, b"torchrun x"), (103, 1, b"python3 -m http.server 39500")]
    actions = run.cleanup.plan(_strangers(_holding(rows, 103), 103))
    assert actions is not None
    assert [pid for pid, _ in actions.signal] == [100]
    assert (
        "port 39500: not stopping 103 (user nobody's, not fleet's, and it matches no pattern; "
        "stop it yourself or pick another port): python3 -m http.server 39500"
    ) in run.lines
    run.act(actions, "signal 100 term", "done")
    code, line, _ = finished(run, _strangers(_holding(rows[1:], 103), 103))
    assert code == 1
    assert line == "killed 1 process (TERM 1); left: port 39500; failed: port"
    shown = preview(_strangers(_holding(rows, 103), 103), spec(state_paths=()))
    assert shown.port_holders == ()
    assert "would leave 103 (nobody), holder of port 39500: another user's" in shown.lines()[1]
    assert "leave port 39500 to another user's process (103)" in shown.summary()


def test_another_users_port_holder_that_matches_the_patterns_is_killed_as_a_match() -> None:
    run = Run(state_paths=())
    rows = [(100, 1, b"torchrun --rdzv-endpoint n1:39500 train.py")]
    actions = run.cleanup.plan(_strangers(_holding(rows, 100), 100))
    assert actions is not None
    assert [pid for pid, _ in actions.signal] == [100]
    assert not any("not stopping" in line for line in run.lines)


def test_the_same_work_reads_the_same_on_every_node_whatever_the_pids() -> None:
    lines = []
    for base in (100, 7000):
        run = Run(state_paths=())
        rows = [(base, 1, b"torchrun x"), (base + 1, 1, b"python3 /tmp/rdzv_store.py 39500")]
        snap = node(rows, links=[Link(base + 1, "fd", b"socket:[4]")], listens=((39500, 4),))
        run.act(run.cleanup.plan(snap), f"signal {base} term", f"signal {base + 1} kill")
        lines.append(finished(run, node())[1])
    assert lines == ["killed 2 processes (TERM 1, KILL 1), port 39500 freed (stopped python3)"] * 2


def test_a_gpu_reset_is_counted_from_what_nvidia_smi_said() -> None:
    said = b"GPU 00000000:01:00.0 was successfully reset.\nGPU 00000000:41:00.0 was successfully"
    said += b" reset.\nAll done.\n"
    run = Run(state_paths=(), port=None)
    run.act(run.cleanup.plan(node(smi_rc=0)), f"gpu-reset 0 {said.hex()}", "done")
    code, line, done = finished(run, node(smi_rc=0))
    assert (code, line) == (0, "2 GPUs reset")
    assert done == CleanupDone(gpu_reset=True, gpus=2, clean=True)
    quiet = Run(state_paths=(), port=None)
    quiet.act(quiet.cleanup.plan(node(smi_rc=0)), "gpu-reset 0 -", "done")
    assert finished(quiet, node(smi_rc=0))[1] == "GPUs reset"


def test_a_node_it_could_not_look_at_again_says_what_was_done_before() -> None:
    run = Run(state_paths=(), port=None)
    run.act(run.cleanup.plan(node(DEAD_RUN[:1])), "signal 100 term")
    assert run.cleanup.finish(None) == 1
    assert run.lines[-1] == "killed 1 process (TERM 1); failed: facts (could not look again)"
    assert run.cleanup.done == CleanupDone(killed=1, by_term=1, failed=("facts",))


def test_a_refused_node_did_nothing_and_its_refusal_stays_the_last_line() -> None:
    run = Run(patterns=(compile_ere("sshd"),))
    rows = [(50, 1, b"/usr/sbin/sshd -D")]
    code, line, done = finished(run, node(rows))
    assert code == 1
    assert line.startswith("refused: the patterns match what cleanup never kills (sshd)")
    assert done == CleanupDone(refused=True)


# -------------------------------------------------------------------------------- preview


def test_a_preview_says_what_each_part_would_touch_and_changes_nothing() -> None:
    snap = node(DEAD_RUN, paths=DEAD_PATHS, links=DEAD_LINKS, listens=((39500, 77),))
    seen = preview(snap, spec())
    assert [t.pid for t in seen.processes] == [100, 101, 102]
    assert seen.processes[1].why == "child of 100"
    assert [t.pid for t in seen.port_holders] == [103]
    assert seen.paths == (
        ("remove", "/tmp/.torch_distributed_x"),
        ("remove", "/root/.nv"),
        ("remove after the kill", "/dev/shm/torch_1"),
    )
    lines = seen.lines()
    assert (
        lines[0]
        == "would kill 100 (root, matches 'torchrun'): torchrun --nproc-per-node 2 train.py"
    )
    assert "would stop 103 (root), holder of port 39500: python3 /tmp/rdzv_store.py 39500" in lines
    assert lines[-1] == (
        "preview: would kill 3 processes; remove 3 paths; stop the holder of port 39500 (103); "
        "gpu-reset: skipped: no nvidia-smi; nothing changed"
    )
    data = seen.to_dict()
    assert data["processes"][0] == {
        "pid": 100, "user": "root", "command": "torchrun --nproc-per-node 2 train.py",
        "why": "matches 'torchrun'",
    }  # fmt: skip
    assert data["port_holders"][0]["pid"] == 103


def test_a_preview_of_a_refused_node_says_why() -> None:
    seen = preview(node([(50, 1, b"/usr/sbin/sshd -D")]), spec(patterns=(compile_ere("sshd"),)))
    assert seen.refused
    assert seen.summary().startswith("refused: the patterns match what cleanup never kills")
