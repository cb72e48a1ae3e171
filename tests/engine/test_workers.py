"""Worker processes (fleet/engine/workers.py), driven with an in-memory transport: real forks,
real pipes, real signals; no SSH (tests/e2e/test_workers.py drives real sshd)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.core import defaults
from fleet.core.events import (
    Event,
    HostConnected,
    HostConnecting,
    HostFinished,
    Outcome,
    OutputLine,
    StepFinished,
    StepStarted,
)
from fleet.core.hosts import Host
from fleet.core.playbook import Playbook, Step
from fleet.core.result import CommandResult
from fleet.core.shell import Cmd
from fleet.engine import runner
from fleet.engine import workers as workers_module
from fleet.engine.executor import Run
from fleet.engine.plan import Plan, build_plan
from fleet.engine.runner import RunSettings
from fleet.engine.workers import (
    Workers,
    fork_safe,
    split_forks,
    split_forks_by,
    split_hosts,
    worker_count,
)

DEADLINE_S = 20
Behaviour = Callable[[str, threading.Event], CommandResult]


def ok(host: str, cancel: threading.Event) -> CommandResult:
    return CommandResult(exit_code=0, stdout_tail=(f"{host} done",), duration_s=0.01)


class FakeTransport:
    """Every host's steps do `behaviour(host, cancel)` and print a line first; `password` is
    what each step was given for sudo (checked in the worker: it is in fork memory)."""

    def __init__(self, behaviour: Behaviour = ok) -> None:
        self.behaviour = behaviour

    def connect(self, host: Host, on_attempt: Callable[[int], None] | None = None) -> FakeSession:
        if on_attempt is not None:
            on_attempt(1)
        return FakeSession(self, host.name)

    def close(self) -> None:
        pass


class FakeSession:
    def __init__(self, transport: FakeTransport, host: str) -> None:
        self.transport = transport
        self.host = host

    def run(
        self,
        cmd: Cmd,
        on_line: Callable[[str, str], None],
        cancel: threading.Event,
        sudo_password: str | None = None,
    ) -> CommandResult:
        said = "sudo password known" if sudo_password == "s3cret" else "no sudo password"
        on_line("stdout", f"{self.host} pid={os.getpid()} {said}")
        return self.transport.behaviour(self.host, cancel)

    def close(self) -> None:
        pass


def plan_of(count: int, steps: int = 2) -> Plan:
    pb = Playbook(
        name="test",
        path=Path("test.yaml"),
        steps=tuple(Step(name=f"s{i}", run=f"step {i}") for i in range(steps)),
    )
    hosts = [Host(name=f"gpu{i:02d}", address=f"gpu{i:02d}.invalid") for i in range(1, count + 1)]
    return build_plan(hosts, pb, {})


def make_run_with(transport: FakeTransport) -> Callable[[Plan, int], Run]:
    def make_run(share: Plan, forks: int) -> Run:
        return Run(plan=share, transport=transport, forks=forks, sudo_password="s3cret")

    return make_run


def run_workers(
    plan: Plan, count: int, transport: FakeTransport, *, forks: int = 8
) -> tuple[Workers, list[Event]]:
    workers = Workers(plan, count, forks, make_run_with(transport), cancel_wait_s=5)
    try:
        workers.start()
        events = list(workers.drain(deadline=time.monotonic() + DEADLINE_S))
    finally:
        workers.close()
    return workers, events


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------- how many, and who gets what


def test_hosts_are_dealt_round_robin_in_plan_order() -> None:
    shares = split_hosts(plan_of(7), 3)
    assert [s.host_names for s in shares] == [
        ["gpu01", "gpu04", "gpu07"],
        ["gpu02", "gpu05"],
        ["gpu03", "gpu06"],
    ]
    assert all(s.playbook is shares[0].playbook for s in shares)


@pytest.mark.parametrize(("forks", "count"), [(32, 3), (4, 4), (7, 2), (100, 7)])
def test_forks_are_shared_so_the_total_stays_forks(forks: int, count: int) -> None:
    shares = split_forks(forks, count)
    assert sum(shares) == forks
    assert max(shares) - min(shares) <= 1
    assert min(shares) >= 1


@pytest.mark.parametrize(
    ("forks", "sizes", "expected"),
    [
        (8, [5, 3], [5, 3]),  # an even 4/4 would leave a host of the first waiting a round
        (64, [71, 57], [35, 29]),
        (64, [700, 300], [45, 19]),
        (2, [5, 3], [1, 1]),  # one each at least
        (10, [1, 2], [1, 2]),  # never more than a share's hosts
        (4, [0, 3], [0, 3]),
    ],
)
def test_forks_over_unequal_shares_follow_their_sizes(
    forks: int, sizes: list[int], expected: list[int]
) -> None:
    given = split_forks_by(forks, sizes)
    assert given == expected
    assert sum(given) <= max(forks, sum(1 for s in sizes if s))
    rounds = max(-(-size // n) for size, n in zip(sizes, given, strict=True) if size)
    # No other split of the same total needs fewer rounds (checked exhaustively for two).
    if len(sizes) == 2 and all(sizes):
        total = sum(given)
        best = min(
            max(-(-sizes[0] // a), -(-sizes[1] // (total - a)))
            for a in range(1, total)
            if total - a >= 1
        )
        assert rounds == best


def test_auto_forks_only_when_each_worker_gets_enough_hosts() -> None:
    small = defaults.WORKER_MIN_HOSTS
    assert worker_count(None, 2 * small - 1, forks=1024, cores=8) == 1
    assert worker_count(None, 2 * small, forks=1024, cores=8) == 2
    assert worker_count(None, 100 * small, forks=1024, cores=8) == 8
    assert worker_count(None, 100 * small, forks=1024, cores=1) == 1


def test_hosts_through_paramiko_fill_a_worker_sooner() -> None:
    """A paramiko host costs the client ~4x a libssh2 one: WORKER_MIN_HOSTS_PARAMIKO of them
    are a worker's worth of work, and they add up with the libssh2 ones."""
    small = defaults.WORKER_MIN_HOSTS
    few = defaults.WORKER_MIN_HOSTS_PARAMIKO
    assert few < small
    assert worker_count(None, 2 * few, forks=1024, cores=8, paramiko_hosts=2 * few) == 2
    assert worker_count(None, 2 * few, forks=1024, cores=8, paramiko_hosts=0) == 1
    assert worker_count(None, small + few, forks=1024, cores=8, paramiko_hosts=few) == 2
    assert worker_count(None, small, forks=1024, cores=8, paramiko_hosts=small) == small // few
    assert worker_count(None, small, forks=1024, cores=8, paramiko_hosts=10 * small) == small // few
    assert worker_count(1, 10 * few, forks=1024, cores=8, paramiko_hosts=10 * few) == 1


class ParamikoOnly(FakeTransport):
    """A transport whose hosts all connect through paramiko (a ProxyJump fleet)."""

    def paramiko_hosts(self, hosts: list[Host]) -> int:
        return len(hosts)


def test_the_engine_splits_a_paramiko_fleet_sooner(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's engine asks the transport how many hosts go through paramiko: 64 such hosts
    get two processes, 64 libssh2 ones stay in one."""
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 8)
    monkeypatch.setattr(workers_module, "fork_safe", lambda: True)
    plan = plan_of(2 * defaults.WORKER_MIN_HOSTS_PARAMIKO)
    settings = RunSettings(forks=64)
    through_paramiko = runner._engine(plan, settings, None, ParamikoOnly())
    assert isinstance(through_paramiko, Workers)
    assert len(through_paramiko.spec.forks) == 2
    assert isinstance(runner._engine(plan, settings, None, FakeTransport()), Run)


def test_an_explicit_count_is_kept_but_never_above_hosts_or_forks() -> None:
    assert worker_count(3, 8, forks=32, cores=1) == 3
    assert worker_count(1, 10_000, forks=32, cores=64) == 1
    assert worker_count(8, 5, forks=32, cores=8) == 5
    assert worker_count(8, 100, forks=2, cores=8) == 2


def test_fork_is_refused_while_another_thread_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Threads that earlier tests of this pytest process left (a paramiko transport ending)
    # are not this test's: count only the main thread and the ones started here.
    before = [t for t in threading.enumerate() if t is not threading.main_thread()]
    monkeypatch.setattr(
        workers_module,
        "threads_now",
        lambda: sum(1 for t in threading.enumerate() if t not in before),
    )
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert not fork_safe(settle_s=0.05)
    finally:
        stop.set()
        thread.join(DEADLINE_S)
    assert fork_safe(settle_s=DEADLINE_S)


# ---------------------------------------------------------------- the merged run


def test_every_hosts_events_arrive_in_order_from_its_worker() -> None:
    plan = plan_of(7)
    workers, events = run_workers(plan, 3, FakeTransport())

    for name in plan.host_names:
        kinds = [type(e) for e in events if getattr(e, "host", None) == name]
        assert kinds == [
            HostConnecting,
            HostConnected,
            StepStarted,
            OutputLine,
            StepFinished,
            StepStarted,
            OutputLine,
            StepFinished,
            HostFinished,
        ]
    summary = workers.summary("r", time.monotonic(), False, None)
    assert summary.exit_code == 0
    assert summary.succeeded == plan.host_names  # plan order, whichever worker finished first
    pids = {e.line.split("pid=")[1].split()[0] for e in events if isinstance(e, OutputLine)}
    assert len(pids) == 3  # three processes,
    assert str(os.getpid()) not in pids  # none of them this one
    assert all("sudo password known" in e.line for e in events if isinstance(e, OutputLine))
    figures = workers.figures()
    assert [(f.index, f.hosts) for f in figures] == [(0, 3), (1, 2), (2, 2)]
    assert {str(f.pid) for f in figures} == pids
    assert all(f.user_s >= 0 and f.sys_s >= 0 and f.maxrss_kb > 0 for f in figures)
    assert not any(alive(c.pid) for c in workers.children)


def test_a_drain_cut_short_loses_no_event() -> None:
    """Ctrl-C ends the parent's drain between two events; the next drain goes on from there."""
    plan = plan_of(6)
    workers = Workers(plan, 2, 8, make_run_with(FakeTransport()), cancel_wait_s=5)
    events: list[Event] = []
    try:
        workers.start()
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            taken = next(iter(workers.drain(deadline=deadline)), None)  # one, then cut short
            if taken is None:
                break
            events.append(taken)
    finally:
        workers.close()
    assert len(events) == 6 * 9  # every host's whole lifecycle (see above), none lost
    assert {e.host for e in events if isinstance(e, HostFinished)} == set(plan.host_names)


def test_a_failed_step_is_the_same_result_as_in_one_process() -> None:
    def fail_on_gpu02(host: str, cancel: threading.Event) -> CommandResult:
        if host == "gpu02":
            return CommandResult(exit_code=3, stderr_tail=("boom",), duration_s=0.01)
        return ok(host, cancel)

    plan = plan_of(5)
    workers, _ = run_workers(plan, 2, FakeTransport(fail_on_gpu02))
    summary = workers.summary("r", time.monotonic(), False, None)

    run = Run(plan=plan, transport=FakeTransport(fail_on_gpu02), sudo_password="s3cret")
    list(run.drain(run.start(), poll_s=0.01))
    alone = run.summary("r", time.monotonic(), False, None)

    assert summary.exit_code == alone.exit_code == 3
    strip = ("ts", "duration_s")
    assert [{k: v for k, v in vars(r).items() if k not in strip} for r in summary.results] == [
        {k: v for k, v in vars(r).items() if k not in strip} for r in alone.results
    ]


def test_a_worker_that_dies_has_its_unfinished_hosts_failed_not_lost() -> None:
    def die_on_gpu03(host: str, cancel: threading.Event) -> CommandResult:
        if host == "gpu03":
            os.kill(os.getpid(), signal.SIGKILL)
        return ok(host, cancel)

    plan = plan_of(6)
    workers, events = run_workers(plan, 2, FakeTransport(die_on_gpu03), forks=2)
    # Worker 0 has gpu01, gpu03, gpu05 (one at a time) and dies on gpu03; gpu01's end may
    # have been sent before, or not (then it too is failed: the parent never heard of it).
    results = {e.host: e for e in events if isinstance(e, HostFinished)}
    assert set(results) == set(plan.host_names)
    died = "fleet's worker process {} was killed by SIGKILL before this host finished"
    pid = workers.children[0].pid
    for host in ("gpu01", "gpu03", "gpu05"):
        if host == "gpu01" and results[host].outcome is Outcome.OK:
            continue
        assert results[host].outcome is Outcome.FAILED
        assert results[host].reason == died.format(pid)
    assert all(results[h].outcome is Outcome.OK for h in ("gpu02", "gpu04", "gpu06"))
    assert workers.summary("r", time.monotonic(), False, None).exit_code == 3
    assert [f.index for f in workers.figures()] == [1]


def test_cancel_reaches_every_worker_and_each_host_ends_cancelled() -> None:
    def wait_for_cancel(host: str, cancel: threading.Event) -> CommandResult:
        cancel.wait(DEADLINE_S)
        return CommandResult(exit_code=None, cancelled=cancel.is_set(), duration_s=0.01)

    plan = plan_of(6, steps=1)
    workers = Workers(plan, 3, 8, make_run_with(FakeTransport(wait_for_cancel)), cancel_wait_s=5)
    try:
        workers.start()
        started: set[str] = set()
        events: list[Event] = []
        for event in workers.drain(deadline=time.monotonic() + DEADLINE_S):
            events.append(event)
            started |= {event.host} if isinstance(event, StepStarted) else set()
            if len(started) == 6 and not workers.cancel.is_set():
                workers.cancel.set()
    finally:
        workers.close()
    results = {e.host: e.outcome for e in events if isinstance(e, HostFinished)}
    assert results == dict.fromkeys(plan.host_names, Outcome.CANCELLED)
    assert len(workers.figures()) == 3  # each ended on its own, with its last report


def test_close_ends_workers_that_do_not_stop_and_none_outlives_the_run() -> None:
    def ignore_cancel(host: str, cancel: threading.Event) -> CommandResult:
        time.sleep(3600)
        return ok(host, cancel)

    plan = plan_of(4, steps=1)
    workers = Workers(plan, 2, 8, make_run_with(FakeTransport(ignore_cancel)), cancel_wait_s=60)
    workers.start()
    pids = [c.pid for c in workers.children]
    started: set[str] = set()
    for event in workers.drain(deadline=time.monotonic() + DEADLINE_S):
        started |= {event.host} if isinstance(event, StepStarted) else set()
        if len(started) == 4:
            break
    workers.cancel.set()
    late = list(workers.drain(deadline=time.monotonic() + 0.2))
    assert not [e for e in late if isinstance(e, HostFinished)]  # they never end on their own
    workers.close()
    assert not any(alive(pid) for pid in pids)
    summary = workers.summary("r", time.monotonic(), True, None)
    assert {r.outcome for r in summary.results} == {Outcome.CANCELLED}
    assert summary.exit_code == 130


def test_workers_ignore_the_terminals_ctrl_c() -> None:
    """The terminal sends SIGINT to the whole group: the parent decides what it means."""
    release = threading.Event()

    def wait_for_cancel(host: str, cancel: threading.Event) -> CommandResult:
        cancel.wait(DEADLINE_S)
        return CommandResult(exit_code=None, cancelled=cancel.is_set(), duration_s=0.01)

    plan = plan_of(2, steps=1)
    workers = Workers(plan, 2, 8, make_run_with(FakeTransport(wait_for_cancel)), cancel_wait_s=5)
    try:
        workers.start()
        started: set[str] = set()
        events: list[Event] = []
        for event in workers.drain(deadline=time.monotonic() + DEADLINE_S):
            events.append(event)
            if isinstance(event, StepStarted):
                started.add(event.host)
                if len(started) == 2 and not release.is_set():
                    release.set()
                    for child in workers.children:
                        os.kill(child.pid, signal.SIGINT)
                    assert all(alive(c.pid) for c in workers.children)
                    workers.cancel.set()
    finally:
        workers.close()
    assert [c.status for c in workers.children] == [0, 0]  # exited on their own, not by SIGINT


def test_a_process_freezes_what_it_holds_once_its_first_run_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A frozen object is never collected: freezing again at each run (a verb's next phase)
    # would keep the garbage of the runs before it for good.
    frozen: list[int] = []
    monkeypatch.setattr(runner, "_FROZEN", [])
    monkeypatch.setattr(runner.gc, "freeze", lambda: frozen.append(1))
    for _ in range(3):
        runner._freeze_once()
    assert frozen == [1]


# ---------------------------------------------------------------- a worker that lives on


def test_a_worker_that_stays_leaves_the_parents_world_and_is_neither_waited_for_nor_ended(
    tmp_path: Path,
) -> None:
    """With warm connections a worker lives on as the keeper of its connections
    (fleet/ssh/handoff.py). It says so; the parent's close neither waits for it nor kills it;
    it is in a session of its own, and holds none of the parent's descriptors (its stdio, a
    file the parent had open, the pipes to the parent): each is /dev/null in place."""
    parents_file = open(tmp_path / "parents.txt", "w")  # noqa: SIM115 - held across the fork
    report = tmp_path / "stayed"
    stayed: list[int] = []

    def stay(index: int, whole: bool) -> Callable[[], None] | None:
        if index == 1:
            return None  # worker 1 exits as a worker does

        def live_on() -> None:
            fds = {}
            for fd in os.listdir("/proc/self/fd"):
                with contextlib.suppress(OSError):  # the listing's own, closed by now
                    fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
            (tmp_path / "part").write_text(json.dumps([whole, os.getsid(0), fds]))
            (tmp_path / "part").rename(report)  # whole when seen
            time.sleep(3600)

        return live_on

    plan = plan_of(4, steps=1)
    workers = Workers(plan, 2, 8, make_run_with(FakeTransport()), cancel_wait_s=5, stay=stay)
    try:
        workers.start()
        list(workers.drain(deadline=time.monotonic() + DEADLINE_S))
        began = time.monotonic()
        workers.close()
        closed_in = time.monotonic() - began
        figures = {f.index: f.stays for f in workers.figures()}
        stayer = workers.children[0].pid
        stayed.append(stayer)
        assert figures == {0: True, 1: False}
        assert closed_in < workers_module.REAP_WAIT_S  # not waited for
        assert alive(stayer)  # not ended
        assert workers.children[1].status == 0  # the other one was reaped as always
        deadline = time.monotonic() + DEADLINE_S
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        whole, sid, fds = json.loads(report.read_text())
        assert whole is True
        assert sid == stayer
        assert [fds[n] for n in ("0", "1", "2")] == ["/dev/null"] * 3
        # Every descriptor it had from the parent (its file, the pipes) is /dev/null in place:
        # this worker made none of its own.
        assert set(fds.values()) == {"/dev/null"}, fds
        assert len(fds) >= 5  # stdio, the parent's file, the control pipe at least
    finally:
        parents_file.close()
        for pid in stayed:
            os.kill(pid, signal.SIGKILL)
