"""The executor, driven through its Transport/Session seam with an in-memory fake (no SSH here;
tests/e2e drives real sshd). A host's failure is a result, never an exception."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.core.events import (
    Event,
    HostConnected,
    HostConnecting,
    HostFinished,
    Outcome,
    OutputLine,
    RunSummary,
    StepFinished,
    StepStarted,
)
from fleet.core.hosts import Host
from fleet.core.playbook import OnError, Playbook, Step
from fleet.core.result import CommandResult
from fleet.core.shell import Cmd
from fleet.engine.executor import Run, _reason
from fleet.engine.plan import build_plan

DEADLINE_S = 10


class FakeConnectError(Exception):
    """What the fake transport raises for an unreachable host (shaped like ConnectFailed)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


Behaviour = Callable[["FakeSession", Cmd, threading.Event], CommandResult]


class FakeTransport:
    """Hosts in `unreachable` refuse; `behaviour[(host, command)]` decides a step's result
    (default: exit 0 after printing one line). Records what ran and how many sessions were open."""

    def __init__(
        self,
        *,
        unreachable: dict[str, str] | None = None,
        behaviour: dict[tuple[str, str], Behaviour | CommandResult] | None = None,
        in_run: Callable[[], None] | None = None,
    ) -> None:
        self.unreachable = unreachable or {}
        self.behaviour = behaviour or {}
        self.in_run = in_run
        self.lock = threading.Lock()
        self.open_sessions = 0
        self.max_open_sessions = 0
        self.connected: list[str] = []
        self.closed: list[str] = []
        self.ran: list[tuple[str, str]] = []
        self.passwords: list[str | None] = []

    def connect(self, host: Host, on_attempt: Callable[[int], None] | None = None) -> FakeSession:
        if on_attempt is not None:
            on_attempt(1)
        if host.name in self.unreachable:
            raise FakeConnectError(self.unreachable[host.name], f"{host.address}:22")
        with self.lock:
            self.connected.append(host.name)
            self.open_sessions += 1
            self.max_open_sessions = max(self.max_open_sessions, self.open_sessions)
        return FakeSession(self, host.name)

    def close(self) -> None:
        pass


class FakeSession:
    def __init__(self, transport: FakeTransport, host: str) -> None:
        self.transport = transport
        self.host = host
        self.connection = "warm"  # how a warm transport's session says it was had

    def run(
        self,
        cmd: Cmd,
        on_line: Callable[[str, str], None],
        cancel: threading.Event,
        sudo_password: str | None = None,
    ) -> CommandResult:
        t = self.transport
        with t.lock:
            t.ran.append((self.host, cmd.display))
            t.passwords.append(sudo_password)
        if t.in_run is not None:
            t.in_run()
        action = t.behaviour.get((self.host, cmd.display))
        if callable(action):
            return action(self, cmd, cancel)
        if isinstance(action, CommandResult):
            for line in action.stderr_tail:
                on_line("stderr", line)
            return action
        line = f"{self.host}: {cmd.display} done"
        on_line("stdout", line)
        return CommandResult(exit_code=0, stdout_tail=(line,), duration_s=0.01)

    def close(self) -> None:
        with self.transport.lock:
            self.transport.open_sessions -= 1
            self.transport.closed.append(self.host)


def hosts(*names: str) -> list[Host]:
    return [Host(name=n, address=f"{n}.invalid") for n in names]


def playbook(*steps: Step) -> Playbook:
    return Playbook(name="test", path=Path("test.yaml"), steps=steps)


def step(run: str, on_error: OnError = OnError.STOP, timeout_s: float | None = None) -> Step:
    return Step(name=run, run=run, on_error=on_error, timeout_s=timeout_s)


TWO_STEPS = playbook(step("first"), step("second"))


def execute(
    names: list[Host],
    pb: Playbook,
    transport: FakeTransport,
    *,
    forks: int = 32,
    cancel_before_start: bool = False,
    sudo_password: str | None = None,
) -> tuple[list[Event], RunSummary]:
    """Start the run, drain every event, check every worker ended, and summarise."""
    run = Run(
        plan=build_plan(names, pb, {}),
        transport=transport,
        forks=forks,
        sudo_password=sudo_password,
        connect_errors=(FakeConnectError,),
    )
    if cancel_before_start:
        run.cancel.set()
    started = time.monotonic()
    threads = run.start()
    events = list(run.drain(threads, poll_s=0.01))
    for t in threads:
        t.join(timeout=DEADLINE_S)
        assert not t.is_alive()
    assert time.monotonic() - started < DEADLINE_S
    return events, run.summary("run-1", started, False, None)


def finished(events: list[Event]) -> dict[str, HostFinished]:
    out = {e.host: e for e in events if isinstance(e, HostFinished)}
    assert len(out) == len([e for e in events if isinstance(e, HostFinished)]), "one per host"
    return out


def steps_started(events: list[Event], host: str) -> list[str]:
    return [e.step for e in events if isinstance(e, StepStarted) and e.host == host]


FAIL = CommandResult(exit_code=2, stderr_tail=("boom", "it broke"), duration_s=0.01)


# ---------------------------------------------------------------- the happy path


def test_every_host_runs_every_step_and_ends_ok() -> None:
    transport = FakeTransport()
    events, summary = execute(hosts("gpu01", "gpu02", "gpu03"), TWO_STEPS, transport)
    assert summary.exit_code == 0
    assert summary.succeeded == ["gpu01", "gpu02", "gpu03"]
    for name in ("gpu01", "gpu02", "gpu03"):
        assert steps_started(events, name) == ["first", "second"]
    assert sorted(transport.ran) == sorted(
        (h, s) for h in ("gpu01", "gpu02", "gpu03") for s in ("first", "second")
    )


def test_events_of_one_host_come_in_lifecycle_order() -> None:
    events, _ = execute(hosts("gpu01"), TWO_STEPS, FakeTransport())
    kinds = [type(e) for e in events if getattr(e, "host", None) == "gpu01"]
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


def test_a_connection_made_again_under_a_step_is_recorded_once_before_its_end() -> None:
    # A warm session whose held connection was dead at the step's start is made again under
    # it (fleet/ssh/keeper.py) and says so in its `connection`: the record gets a second
    # HostConnected, before that step's StepFinished, and none for the steps after.
    def reconnect(session: FakeSession, cmd: Cmd, cancel: threading.Event) -> CommandResult:
        session.connection = "stale"
        return CommandResult(exit_code=0, duration_s=0.01)

    transport = FakeTransport(behaviour={("gpu01", "first"): reconnect})
    events, summary = execute(hosts("gpu01", "gpu02"), TWO_STEPS, transport)
    assert summary.exit_code == 0
    mine = [e for e in events if getattr(e, "host", None) == "gpu01"]
    said = [(type(e).__name__, getattr(e, "connection", None)) for e in mine]
    assert said[:5] == [
        ("HostConnecting", None),
        ("HostConnected", "warm"),
        ("StepStarted", None),
        ("HostConnected", "stale"),
        ("StepFinished", None),
    ]
    assert [c for k, c in said if k == "HostConnected"] == ["warm", "stale"]
    others = [e.connection for e in events if isinstance(e, HostConnected) and e.host == "gpu02"]
    assert others == ["warm"]


def test_ok_host_reports_its_last_output_line() -> None:
    events, _ = execute(hosts("gpu01"), TWO_STEPS, FakeTransport())
    assert finished(events)["gpu01"].last_line == "gpu01: second done"


def test_a_silent_failing_step_is_not_shown_with_an_earlier_steps_line() -> None:
    # The summary prints a failed host's last line under its failing step: a line the first
    # step printed ("disk ok") must not pass for what the silent failing step said.
    silent = CommandResult(exit_code=1, duration_s=0.01)
    transport = FakeTransport(behaviour={("gpu01", "second"): silent})
    events, summary = execute(hosts("gpu01"), TWO_STEPS, transport)
    assert summary.exit_code == 3
    host = finished(events)["gpu01"]
    assert (host.failed_step, host.exit_code, host.last_line) == ("second", 1, None)


def test_a_failing_step_reports_its_own_last_line() -> None:
    said = CommandResult(exit_code=1, stdout_tail=("half done",), duration_s=0.01)
    transport = FakeTransport(behaviour={("gpu01", "second"): said})
    events, _ = execute(hosts("gpu01"), TWO_STEPS, transport)
    assert finished(events)["gpu01"].last_line == "half done"


def test_every_session_is_closed() -> None:
    transport = FakeTransport(behaviour={("gpu02", "first"): FAIL})
    execute(hosts("gpu01", "gpu02"), TWO_STEPS, transport)
    assert sorted(transport.closed) == sorted(transport.connected) == ["gpu01", "gpu02"]
    assert transport.open_sessions == 0


def test_summary_keeps_plan_order() -> None:
    _, summary = execute(hosts("c", "a", "b"), TWO_STEPS, FakeTransport())
    assert [r.host for r in summary.results] == ["c", "a", "b"]
    assert summary.playbook == "test"


# ---------------------------------------------------------------- failures are results


def test_failed_step_stops_that_host_only() -> None:
    transport = FakeTransport(behaviour={("gpu02", "first"): FAIL})
    events, summary = execute(hosts("gpu01", "gpu02", "gpu03"), TWO_STEPS, transport)
    results = finished(events)
    assert results["gpu02"].outcome is Outcome.FAILED
    assert results["gpu02"].failed_step == "first"
    assert results["gpu02"].exit_code == 2
    assert results["gpu02"].reason == "exit code 2"
    assert results["gpu02"].stderr_tail == ("boom", "it broke")
    assert steps_started(events, "gpu02") == ["first"]
    assert ("gpu02", "second") not in transport.ran
    assert results["gpu01"].outcome is results["gpu03"].outcome is Outcome.OK
    assert steps_started(events, "gpu01") == steps_started(events, "gpu03") == ["first", "second"]
    assert summary.exit_code == 3


def test_on_error_continue_runs_the_next_step_but_host_ends_failed() -> None:
    pb = playbook(step("first", OnError.CONTINUE), step("second"), step("third"))
    transport = FakeTransport(behaviour={("gpu01", "first"): FAIL})
    events, summary = execute(hosts("gpu01"), pb, transport)
    assert steps_started(events, "gpu01") == ["first", "second", "third"]
    result = finished(events)["gpu01"]
    assert result.outcome is Outcome.FAILED
    assert result.failed_step == "first"
    assert result.exit_code == 2
    assert summary.exit_code == 3


def test_first_failure_is_reported_when_several_continue_steps_fail() -> None:
    pb = playbook(step("first", OnError.CONTINUE), step("second", OnError.CONTINUE), step("third"))
    failing = CommandResult(exit_code=5)
    transport = FakeTransport(behaviour={("gpu01", "first"): FAIL, ("gpu01", "second"): failing})
    events, _ = execute(hosts("gpu01"), pb, transport)
    assert steps_started(events, "gpu01") == ["first", "second", "third"]
    assert finished(events)["gpu01"].failed_step == "first"


def test_timed_out_step_stops_the_host_even_with_on_error_continue() -> None:
    pb = playbook(step("first", OnError.CONTINUE, timeout_s=5), step("second"))
    expired = CommandResult(exit_code=None, timed_out=True, stderr_tail=("still going",))
    transport = FakeTransport(behaviour={("gpu01", "first"): expired})
    events, summary = execute(hosts("gpu01", "gpu02"), pb, transport)
    result = finished(events)["gpu01"]
    assert result.outcome is Outcome.TIMED_OUT
    assert "timed out after 5s" in (result.reason or "")
    assert steps_started(events, "gpu01") == ["first"]
    assert finished(events)["gpu02"].outcome is Outcome.OK
    assert summary.exit_code == 4


def test_unreachable_host_is_a_result_while_others_finish_ok() -> None:
    transport = FakeTransport(unreachable={"gpu02": "connection refused"})
    events, summary = execute(hosts("gpu01", "gpu02", "gpu03"), TWO_STEPS, transport)
    results = finished(events)
    assert results["gpu02"].outcome is Outcome.UNREACHABLE
    assert results["gpu02"].reason == "connection refused"
    assert results["gpu02"].last_line == "gpu02.invalid:22"
    assert results["gpu02"].failed_step is None
    assert steps_started(events, "gpu02") == []
    assert results["gpu01"].outcome is results["gpu03"].outcome is Outcome.OK
    assert summary.exit_code == 4
    assert "gpu02" not in transport.connected


def test_connection_lost_during_a_step_is_unreachable_at_that_step() -> None:
    def drop(session: FakeSession, cmd: Cmd, cancel: threading.Event) -> CommandResult:
        raise FakeConnectError("connection lost", "the node went away")

    transport = FakeTransport(behaviour={("gpu01", "second"): drop})
    events, _ = execute(hosts("gpu01", "gpu02"), TWO_STEPS, transport)
    result = finished(events)["gpu01"]
    assert result.outcome is Outcome.UNREACHABLE
    assert result.failed_step == "second"
    assert result.reason == "connection lost"
    assert "gpu01" in transport.closed
    assert finished(events)["gpu02"].outcome is Outcome.OK


def test_a_bug_in_one_session_does_not_hide_the_other_hosts() -> None:
    def crash(session: FakeSession, cmd: Cmd, cancel: threading.Event) -> CommandResult:
        raise RuntimeError("kaboom")

    transport = FakeTransport(behaviour={("gpu01", "first"): crash})
    events, summary = execute(hosts("gpu01", "gpu02"), TWO_STEPS, transport)
    result = finished(events)["gpu01"]
    assert result.outcome is Outcome.FAILED
    assert "kaboom" in (result.reason or "")
    assert "gpu01" in transport.closed
    assert finished(events)["gpu02"].outcome is Outcome.OK
    assert summary.exit_code == 3


def test_sudo_password_reaches_every_session_run() -> None:
    transport = FakeTransport()
    execute(hosts("gpu01", "gpu02"), TWO_STEPS, transport, sudo_password="s3cret")
    assert transport.passwords == ["s3cret"] * 4


# ---------------------------------------------------------------- cancel


def test_cancel_set_before_start_cancels_every_host_without_connecting() -> None:
    transport = FakeTransport()
    events, summary = execute(
        hosts("gpu01", "gpu02", "gpu03"), TWO_STEPS, transport, cancel_before_start=True
    )
    assert {h: r.outcome for h, r in finished(events).items()} == dict.fromkeys(
        ("gpu01", "gpu02", "gpu03"), Outcome.CANCELLED
    )
    assert transport.connected == []
    assert transport.ran == []
    assert summary.exit_code != 0


def test_cancel_during_a_step_stops_new_steps_and_new_hosts() -> None:
    def cancelled(session: FakeSession, cmd: Cmd, cancel: threading.Event) -> CommandResult:
        cancel.set()  # as Ctrl-C would, while this step runs
        return CommandResult(exit_code=None, cancelled=True)

    transport = FakeTransport(behaviour={("gpu01", "first"): cancelled})
    events, _ = execute(hosts("gpu01", "gpu02", "gpu03"), TWO_STEPS, transport, forks=1)
    results = finished(events)
    assert results["gpu01"].outcome is Outcome.CANCELLED
    assert steps_started(events, "gpu01") == ["first"]
    assert results["gpu02"].outcome is results["gpu03"].outcome is Outcome.CANCELLED
    assert transport.connected == ["gpu01"]


def test_hosts_without_a_result_count_as_cancelled_in_the_summary() -> None:
    run = Run(plan=build_plan(hosts("gpu01", "gpu02"), TWO_STEPS, {}), transport=FakeTransport())
    summary = run.summary("run-1", time.monotonic(), True, None)
    assert [r.outcome for r in summary.results] == [Outcome.CANCELLED, Outcome.CANCELLED]
    assert summary.exit_code == 130


# ---------------------------------------------------------------- bounded parallelism


@pytest.mark.parametrize(("forks", "count"), [(1, 3), (3, 9), (4, 8)])
def test_forks_bound_the_number_of_open_sessions(forks: int, count: int) -> None:
    """Every step waits until `forks` steps run at once (a barrier with a deadline): the bound is
    both reached and never exceeded."""
    barrier = threading.Barrier(forks)
    transport = FakeTransport(in_run=lambda: barrier.wait(timeout=DEADLINE_S))
    names = hosts(*(f"gpu{i:02d}" for i in range(count)))
    _, summary = execute(names, playbook(step("only")), transport, forks=forks)
    assert summary.exit_code == 0
    assert transport.max_open_sessions == forks
    assert len(transport.connected) == count


def test_no_more_workers_than_hosts() -> None:
    run = Run(plan=build_plan(hosts("a", "b"), TWO_STEPS, {}), transport=FakeTransport(), forks=50)
    threads = run.start()
    assert len(threads) == 2
    list(run.drain(threads, poll_s=0.01))


def test_drain_returns_when_the_last_worker_ends_not_on_its_next_poll() -> None:
    """Each worker thread's last word ends the drain: with a poll of an hour, the drain still
    returns once every host is done (before, it waited out one poll at every run's end)."""
    run = Run(
        plan=build_plan(hosts("gpu01", "gpu02"), TWO_STEPS, {}),
        transport=FakeTransport(),
        forks=2,
        connect_errors=(FakeConnectError,),
    )
    threads = run.start()
    events: list[Event] = []
    drainer = threading.Thread(
        target=lambda: events.extend(run.drain(threads, poll_s=3600)), daemon=True
    )
    drainer.start()
    drainer.join(timeout=DEADLINE_S)
    assert not drainer.is_alive(), "drain waited for its poll after every worker ended"
    assert set(finished(events)) == {"gpu01", "gpu02"}


@pytest.mark.parametrize(
    ("stderr", "reason"),
    [
        (("sudo: a password is required",), "sudo needs a password (pass -K/--ask-become-pass)"),
        (("sudo: 1 incorrect password attempt",), "sudo refused the password given with -K"),
        # the step's own program saying such words (a database client) is its own failure
        (("ERROR 1045: Access denied: a password is required",), "exit code 1"),
        (("mysql: 3 incorrect password attempts",), "exit code 1"),
    ],
)
def test_a_sudo_failure_is_named_from_sudos_own_lines_only(
    stderr: tuple[str, ...], reason: str
) -> None:
    cmd = Cmd("true", "true", sudo=True)
    assert _reason(CommandResult(1, (), stderr, 0.1), cmd) == reason
