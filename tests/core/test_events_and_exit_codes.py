"""One documented exit-code mapping, and events that serialise to plain JSON."""

from __future__ import annotations

import json

import pytest

from fleet.core.errors import (
    ConfigError,
    ExitCode,
    FleetError,
    InventoryError,
    PlaybookError,
    TemplateError,
    UsageError,
)
from fleet.core.events import (
    HostConnected,
    HostConnecting,
    HostFinished,
    Outcome,
    OutputLine,
    RunFinished,
    RunStarted,
    RunSummary,
    StepFinished,
    StepStarted,
    by_host,
)
from fleet.core.result import CommandResult


def summary(*outcomes: Outcome, interrupted: bool = False) -> RunSummary:
    results = tuple(
        HostFinished(host=f"gpu{i:02d}", outcome=o, duration_s=1.0, ts=0.0)
        for i, o in enumerate(outcomes, 1)
    )
    return RunSummary(
        run_id="r", playbook="p", results=results, duration_s=2.0, interrupted=interrupted
    )


def test_documented_exit_code_values() -> None:
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 130, 141]


@pytest.mark.parametrize(
    ("outcomes", "interrupted", "code"),
    [
        ((), False, 0),
        ((Outcome.OK,), False, 0),
        ((Outcome.OK, Outcome.OK, Outcome.OK), False, 0),
        ((Outcome.OK, Outcome.SKIPPED), False, 0),
        ((Outcome.OK, Outcome.FAILED), False, 3),
        ((Outcome.FAILED, Outcome.FAILED), False, 3),
        ((Outcome.OK, Outcome.UNREACHABLE), False, 4),
        ((Outcome.OK, Outcome.TIMED_OUT), False, 4),
        ((Outcome.FAILED, Outcome.UNREACHABLE), False, 4),
        ((Outcome.UNREACHABLE, Outcome.FAILED, Outcome.OK), False, 4),
        ((Outcome.TIMED_OUT, Outcome.FAILED), False, 4),
        ((Outcome.OK,), True, 130),
        ((Outcome.FAILED, Outcome.UNREACHABLE), True, 130),
    ],
)
def test_exit_code_mapping(outcomes: tuple[Outcome, ...], interrupted: bool, code: int) -> None:
    result = summary(*outcomes, interrupted=interrupted).exit_code
    assert result == code
    assert isinstance(result, ExitCode)


def test_succeeded_and_failed_lists_keep_result_order() -> None:
    s = summary(
        Outcome.FAILED,
        Outcome.OK,
        Outcome.UNREACHABLE,
        Outcome.SKIPPED,
        Outcome.OK,
        Outcome.TIMED_OUT,
    )
    assert s.succeeded == ["gpu02", "gpu05"]
    assert s.failed == ["gpu01", "gpu03", "gpu06"]
    assert s.hosts_with(Outcome.UNREACHABLE, Outcome.TIMED_OUT) == ["gpu03", "gpu06"]
    assert s.counts() == {"failed": 1, "ok": 2, "unreachable": 1, "skipped": 1, "timed_out": 1}


def test_error_kinds_carry_their_exit_codes_and_hints() -> None:
    for kind in (InventoryError, PlaybookError, TemplateError, ConfigError):
        error = kind("what and where", hint="what next")
        assert isinstance(error, FleetError)
        assert error.exit_code is ExitCode.FLEET_ERROR
        assert (error.message, error.hint, str(error)) == (
            "what and where",
            "what next",
            "what and where",
        )
    assert UsageError("x").exit_code is ExitCode.USAGE


EVENTS = [
    RunStarted(run_id="r1", playbook="cleanup", hosts=("gpu01", "gpu02"), forks=2, run_dir=None),
    HostConnecting(host="gpu01", attempt=2),
    HostConnected(host="gpu01", duration_s=0.2),
    StepStarted(host="gpu01", step="kill", index=0, command="kill --grace 10"),
    OutputLine(host="gpu01", step="kill", stream="stdout", line="killed 3 ☃"),
    StepFinished(
        host="gpu01",
        step="kill",
        index=0,
        exit_code=1,
        duration_s=0.5,
        timed_out=False,
        cancelled=False,
        stderr_tail=("no such process",),
    ),
    HostFinished(
        host="gpu01",
        outcome=Outcome.FAILED,
        duration_s=1.0,
        failed_step="kill",
        exit_code=1,
        reason="exit code 1",
        stderr_tail=("no such process",),
    ),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.kind)
def test_every_event_serialises_to_plain_json(event) -> None:
    data = event.to_dict()
    assert data["event"] == type(event).__name__
    assert isinstance(data["ts"], float)
    round_tripped = json.loads(json.dumps(data))  # no default=: only plain types allowed
    assert round_tripped == data


def test_host_finished_outcome_is_its_string_value() -> None:
    data = EVENTS[-1].to_dict()
    assert data["outcome"] == "failed"
    assert data["stderr_tail"] == ["no such process"]


def test_run_finished_carries_counts_exit_code_and_every_hosts_outcome() -> None:
    s = summary(Outcome.OK, Outcome.FAILED, Outcome.UNREACHABLE)
    data = json.loads(json.dumps(RunFinished(summary=s).to_dict()))
    assert data["event"] == "RunFinished"
    assert data["exit_code"] == 4
    assert data["counts"] == {"ok": 1, "failed": 1, "unreachable": 1}
    assert {h: v["outcome"] for h, v in data["hosts"].items()} == {
        "gpu01": "ok",
        "gpu02": "failed",
        "gpu03": "unreachable",
    }
    assert data["interrupted"] is False


def test_events_are_frozen() -> None:
    with pytest.raises(AttributeError):
        EVENTS[1].attempt = 3  # type: ignore[misc]


def test_command_result_defaults() -> None:
    r = CommandResult(exit_code=0)
    assert (r.stdout_tail, r.stderr_tail, r.timed_out, r.cancelled) == ((), (), False, False)


def test_by_host_indexes_results() -> None:
    s = summary(Outcome.OK, Outcome.FAILED)
    assert by_host(s.results)["gpu02"].outcome is Outcome.FAILED


def test_verb_finished_carries_fleets_exit_code_and_each_run() -> None:
    from fleet.core.events import VerbFinished

    runs = (summary(Outcome.OK, Outcome.OK), summary(Outcome.OK, Outcome.FAILED))
    data = VerbFinished(verb="launch", exit_code=ExitCode.STEP_FAILED, runs=runs, ts=1.0).to_dict()
    assert data == {
        "event": "VerbFinished",
        "ts": 1.0,
        "verb": "launch",
        "exit_code": 3,
        "error": None,
        "runs": [
            {
                "run_id": "r",
                "playbook": "p",
                "exit_code": 0,
                "interrupted": False,
                "counts": {"ok": 2},
            },
            {
                "run_id": "r",
                "playbook": "p",
                "exit_code": 3,
                "interrupted": False,
                "counts": {"ok": 1, "failed": 1},
            },
        ],
    }
    assert json.loads(json.dumps(data)) == data


def test_an_error_between_runs_still_ends_json_with_the_verbs_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A verb stopped by an error (a refused ssh config before its second run) exits 1: its
    last JSON line says so, with the error."""
    from settings import settings

    from fleet.ops.jobs import Chain, drive

    def chain() -> Chain:
        raise InventoryError("inventory.yaml:3: bad", hint="fix it")
        yield  # a generator

    with pytest.raises(InventoryError):
        drive(chain(), settings(json=True, verb="launch"), None)
    last = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (last["event"], last["verb"], last["exit_code"]) == ("VerbFinished", "launch", 1)
    assert last["error"] == "inventory.yaml:3: bad"
    assert last["runs"] == []
    drive_plain = settings(json=False, verb="launch")
    with pytest.raises(InventoryError):
        drive(chain(), drive_plain, None)
    assert capsys.readouterr().out == ""
