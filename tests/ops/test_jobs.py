"""fleet.ops.jobs.perform, the one execution path (dry run, question, secrets, the chain's runs),
and the chains of launch and status run through it. No SSH: `run_plan` is replaced by a fake that
records each plan and answers with the outcomes a test gives."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from settings import settings

from fleet.core import defaults
from fleet.core.errors import ExitCode, FleetError, UsageError
from fleet.core.events import HostFinished, Outcome, OutputLine, RunSummary, StepStarted
from fleet.core.hosts import Host
from fleet.core.playbook import Playbook, Step, load_playbook
from fleet.inventory.loader import Inventory
from fleet.node.janitor import RESUME_WARNING
from fleet.ops import jobs as verbs
from fleet.ops.jobs import Chain, Job, Phase, Settings, perform, playbook_job
from fleet.ops.launch import LaunchRequest, launch_job
from fleet.ops.status import status_job

HOSTS = [Host("gpu01", "192.0.2.1"), Host("gpu02", "192.0.2.2")]
INVENTORY = Inventory(path=Path("inventory.yaml"), hosts=tuple(HOSTS), groups={})


@dataclass
class FakeRuns:
    """Stands in for runner.run_plan: records playbook, hosts, commands, on_interrupt per run;
    `outcomes[playbook]` is each host's outcome (default ok), `started[playbook]` the hosts
    whose first step started (default all), `stdout[playbook]` each host's last line."""

    outcomes: dict[str, dict[str, Outcome]] = field(default_factory=dict)
    started: dict[str, list[str]] = field(default_factory=dict)
    stdout: dict[str, dict[str, str]] = field(default_factory=dict)
    interrupted: bool = False
    runs: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, plan: Any, run: Any, secrets: Any, **kw: Any) -> RunSummary:
        name = plan.playbook.name
        self.runs.append(
            {
                "playbook": name,
                "hosts": plan.host_names,
                "command": " ".join(ps.cmd.display for ps in plan.hosts[0].steps),
                "on_interrupt": kw.get("on_interrupt"),
                "secrets": secrets,
            }
        )
        reporters = kw.get("reporters") or []
        for host in self.started.get(name, plan.host_names):
            for r in reporters:
                r.handle(StepStarted(host=host, step="x", index=0, command="x"))
        for host, line in self.stdout.get(name, {}).items():
            step = plan.playbook.steps[0].name
            for r in reporters:
                r.handle(OutputLine(host=host, step=step, stream="stdout", line=line))
        outcomes = self.outcomes.get(name, {})
        results = tuple(
            HostFinished(host=h, outcome=outcomes.get(h, Outcome.OK), duration_s=0.1)
            for h in plan.host_names
        )
        return RunSummary(
            run_id="r", playbook=name, results=results, duration_s=0.1, interrupted=self.interrupted
        )

    @property
    def playbooks(self) -> list[str]:
        return [run["playbook"] for run in self.runs]


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> FakeRuns:
    fake = FakeRuns()
    monkeypatch.setattr(verbs, "run_plan", fake)
    return fake


@pytest.fixture
def no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))


def opts(**kw: Any) -> Settings:
    return settings(plain=True, **kw)


def echo(name: str = "echo", confirm: bool = False) -> Playbook:
    step = Step(name="say", run="echo hi")
    return Playbook(name=name, path=Path(f"{name}.yaml"), steps=(step,), confirm=confirm)


def test_a_chain_runs_its_phases_in_order_and_its_code_is_the_exit_code(runs: FakeRuns) -> None:
    first, second = (verbs.build(opts(), echo(n), {}, HOSTS) for n in ("one", "two"))

    def chain() -> Chain:
        done = yield Phase(first)
        assert done.playbook == "one"
        yield Phase(second, cancelling=None)
        return ExitCode.STEP_FAILED

    job = Job(plans=(first, second), chain=chain())
    assert perform(opts(), INVENTORY, job) is ExitCode.STEP_FAILED
    assert runs.playbooks == ["one", "two"]
    assert runs.runs[0]["on_interrupt"] is not None
    assert runs.runs[1]["on_interrupt"] is None


def test_a_dry_run_prints_every_plan_and_runs_nothing(
    runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    job = playbook_job(opts(dry_run=True), HOSTS, echo(), {})
    assert perform(opts(dry_run=True), INVENTORY, job) is ExitCode.OK
    assert runs.runs == []
    out = capsys.readouterr().out
    assert "dry run: echo on 2 hosts gpu[01-02]" in out
    assert "$ echo hi" in out


def test_a_destructive_job_without_a_terminal_is_refused_before_any_secret_is_asked(
    runs: FakeRuns, no_terminal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def asked(prompt: str) -> str:
        raise AssertionError(f"asked {prompt!r}")

    monkeypatch.setattr("getpass.getpass", asked)
    given = opts(ask_become_pass=True)
    job = playbook_job(given, HOSTS, echo(confirm=True), {})
    with pytest.raises(UsageError, match="destructive"):
        perform(given, INVENTORY, job)
    assert runs.runs == []


def test_yes_skips_the_question_and_the_notice_comes_first(
    runs: FakeRuns, no_terminal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    given = opts(yes=True)
    job = playbook_job(given, HOSTS, echo(confirm=True), {}, notice="warning: think twice")
    assert perform(given, INVENTORY, job) is ExitCode.OK
    assert capsys.readouterr().err == "warning: think twice\n"
    assert runs.playbooks == ["echo"]


def test_a_declined_question_runs_nothing(runs: FakeRuns, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    asked: list[str] = []
    given = opts(confirm=lambda prompt: asked.append(prompt) or False)
    job = playbook_job(given, HOSTS, echo(confirm=True), {})
    with pytest.raises(FleetError, match="not confirmed"):
        perform(given, INVENTORY, job)
    assert asked == ["Run 'echo' on 2 hosts gpu[01-02]?"]
    assert runs.runs == []


def test_secrets_are_asked_once_and_given_to_every_phase(
    runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts: list[str] = []
    monkeypatch.setattr(verbs, "_controlling_terminal", lambda: True)
    monkeypatch.setattr("getpass.getpass", lambda p: prompts.append(p) or "pw")
    given = opts(ask_become_pass=True)
    req = LaunchRequest(
        command=["t.py"], launch_id="r1", playbook=load_playbook("launch"), output_dir="/o"
    )
    assert perform(given, INVENTORY, launch_job(req, given, HOSTS)) is ExitCode.OK
    assert len(prompts) == 1
    assert {run["secrets"].sudo_password for run in runs.runs} == {"pw"}


@pytest.fixture
def no_getpass(monkeypatch: pytest.MonkeyPatch) -> None:
    """No controlling terminal, and getpass must not be reached: off a terminal it warns that
    the input may be echoed before falling back to stdin."""

    def asked(prompt: str) -> str:
        raise AssertionError(f"getpass asked {prompt!r}")

    monkeypatch.setattr(verbs, "_controlling_terminal", lambda: False)
    monkeypatch.setattr("getpass.getpass", asked)


@pytest.mark.parametrize(
    ("flags", "option", "what"),
    [
        ({"ask_key_pass": True}, "--ask-key-pass", "the key's passphrase"),
        ({"ask_become_pass": True}, "-K/--ask-become-pass", "the sudo password"),
        ({"ask_key_pass": True, "ask_become_pass": True}, "--ask-key-pass", "passphrase"),
    ],
)
def test_a_secret_with_no_terminal_and_nothing_on_stdin_names_its_option(
    no_getpass: None,
    no_terminal: None,
    capsys: pytest.CaptureFixture[str],
    flags: dict[str, bool],
    option: str,
    what: str,
) -> None:
    with pytest.raises(UsageError) as info:
        verbs.ask_secrets(opts(**flags))
    assert info.value.message.startswith(f"{option}: no terminal to ask ")
    assert what in info.value.message
    other = "-K" if option == "--ask-key-pass" else "--ask-key-pass"
    assert other not in info.value.message
    assert capsys.readouterr().err == ""


def test_the_second_secret_missing_is_the_one_named(
    no_getpass: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("passphrase\n"))
    with pytest.raises(UsageError, match=r"^-K/--ask-become-pass: "):
        verbs.ask_secrets(opts(ask_key_pass=True, ask_become_pass=True))


def test_secrets_piped_without_a_terminal_are_read_line_by_line_without_a_warning(
    no_getpass: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("key pass \nsudo pw\nrest\n"))
    secrets = verbs.ask_secrets(opts(ask_key_pass=True, ask_become_pass=True))
    assert secrets is not None
    assert (secrets.key_passphrase, secrets.sudo_password) == ("key pass ", "sudo pw")
    assert capsys.readouterr().err.splitlines() == [
        "SSH key passphrase (used locally, never shown or logged): (read from stdin)",
        "sudo password (sent to every host, never shown or logged): (read from stdin)",
    ]


def test_on_a_terminal_getpass_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verbs, "_controlling_terminal", lambda: True)
    monkeypatch.setattr("getpass.getpass", lambda prompt: f"typed at {prompt[:3]}")
    secrets = verbs.ask_secrets(opts(ask_key_pass=True))
    assert secrets is not None
    assert secrets.key_passphrase == "typed at SSH"


def test_interrupt_ends_makes_ctrl_c_a_normal_end(runs: FakeRuns) -> None:
    runs.interrupted = True
    runs.outcomes["echo"] = {"gpu01": Outcome.CANCELLED}
    job = playbook_job(opts(), HOSTS, echo(), {}, interrupt_ends=True)
    assert perform(opts(), INVENTORY, job) is ExitCode.OK
    job = playbook_job(opts(), HOSTS, echo(), {})
    assert perform(opts(), INVENTORY, job) is ExitCode.INTERRUPTED


@pytest.mark.parametrize(
    ("before", "code"),
    [(Outcome.FAILED, ExitCode.STEP_FAILED), (Outcome.UNREACHABLE, ExitCode.UNREACHABLE)],
)
def test_ctrl_c_ending_a_follow_keeps_the_code_of_a_host_that_failed_before_it(
    runs: FakeRuns, before: Outcome, code: ExitCode
) -> None:
    """`fleet logs -f` on a node with no run (or one that went away) ends 3 (4) after Ctrl-C,
    as `fleet logs` does: only the hosts Ctrl-C cancelled are a normal end."""
    runs.interrupted = True
    runs.outcomes["echo"] = {"gpu01": Outcome.CANCELLED, "gpu02": before}
    job = playbook_job(opts(), HOSTS, echo(), {}, interrupt_ends=True)
    assert perform(opts(), INVENTORY, job) is code


# ------------------------------------------------------------------------------- launch


def launch(runs: FakeRuns, **kw: Any) -> ExitCode:
    req = LaunchRequest(
        command=["train.py"],
        launch_id="llama-3",
        playbook=load_playbook("launch"),
        output_dir="/out",
        **kw,
    )
    given = opts(yes=True)
    return perform(given, INVENTORY, launch_job(req, given, HOSTS))


def test_launch_runs_its_phases_and_says_where_it_started(
    runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    assert launch(runs, cleanup=True, janitor=True) is ExitCode.OK
    assert runs.playbooks == ["cleanup", "preflight", "janitor", "launch"]
    assert "--run-id llama-3" in runs.runs[-1]["command"]
    err = capsys.readouterr().err
    assert (
        f"fleet: run llama-3 started on 2 hosts gpu[01-02] (master 192.0.2.1:{defaults.PORT})"
        in err
    )


def test_a_failed_preflight_stops_the_launch_unless_forced(
    runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    runs.outcomes["preflight"] = {"gpu02": Outcome.FAILED}
    assert launch(runs) is ExitCode.STEP_FAILED
    assert runs.playbooks == ["preflight"]
    assert "preflight failed on gpu02: not launching" in capsys.readouterr().err
    runs.runs.clear()
    assert launch(runs, force=True) is ExitCode.OK
    assert runs.playbooks == ["preflight", "launch"]


def test_a_node_that_refused_the_start_is_not_rolled_back(
    runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    """A start refused because a run of the same id still runs there (a relaunch with a fixed
    --run-id) started nothing on that node: the rollback's stop by that id would end the very
    run the refusal protected."""
    runs.outcomes["launch"] = {"gpu01": Outcome.FAILED}
    runs.stdout["launch"] = {
        "gpu01": "start: refused: run llama-3 is still running (...); stop it first (fleet stop)",
        "gpu02": "started run=llama-3 pid=12 log=/var/lib/fleet/launch/llama-3/log",
    }
    assert launch(runs) is ExitCode.STEP_FAILED
    assert runs.playbooks == ["preflight", "launch", "stop"]
    assert runs.runs[-1]["hosts"] == ["gpu02"]
    assert "gpu01 refused the start of run llama-3" in capsys.readouterr().err


def test_a_start_refused_everywhere_stops_nothing(
    runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    runs.outcomes["launch"] = {"gpu01": Outcome.FAILED, "gpu02": Outcome.FAILED}
    refused = "start: refused: another launch is starting or stopping a run on this node (pid 9)"
    runs.stdout["launch"] = {"gpu01": refused, "gpu02": refused}
    assert launch(runs) is ExitCode.STEP_FAILED
    assert runs.playbooks == ["preflight", "launch"]
    err = capsys.readouterr().err
    assert "gpu[01-02] refused the start of run llama-3 and started nothing" in err
    assert "ran on no node" not in err


def test_a_failed_start_is_stopped_by_its_launch_id_where_its_start_ran(
    runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    runs.outcomes["launch"] = {"gpu02": Outcome.UNREACHABLE}
    runs.started["launch"] = ["gpu01"]
    runs.stdout["stop"] = {"gpu01": "stopped run=llama-3"}
    assert launch(runs) is ExitCode.UNREACHABLE
    assert runs.playbooks == ["preflight", "launch", "stop"]
    stop = runs.runs[-1]
    assert stop["hosts"] == ["gpu01"]
    assert f"--run-id llama-3 --grace {defaults.ROLLBACK_GRACE_S}" in stop["command"]
    assert runs.runs[1]["on_interrupt"] is not None  # the start says what Ctrl-C does
    assert stop["on_interrupt"] is None
    err = capsys.readouterr().err
    assert "stopping run llama-3 wherever its start ran: gpu01 (all or nothing)" in err
    assert "fleet: run llama-3 rolled back: stopped on gpu01" in err


def test_a_start_that_ran_nowhere_needs_no_rollback(runs: FakeRuns) -> None:
    runs.outcomes["launch"] = {"gpu01": Outcome.UNREACHABLE, "gpu02": Outcome.UNREACHABLE}
    runs.started["launch"] = []
    assert launch(runs) is ExitCode.UNREACHABLE
    assert runs.playbooks == ["preflight", "launch"]


def test_launch_asks_only_with_cleanup_or_janitor_and_once_for_both(
    runs: FakeRuns, no_terminal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    req = LaunchRequest(
        command=["t.py"], launch_id="r1", playbook=load_playbook("launch"), output_dir="/o"
    )
    assert launch_job(req, opts(), HOSTS).ask is None
    for flags, named in (
        ({"cleanup": True}, "'launch' with --cleanup"),
        ({"janitor": True}, "'launch' with --janitor"),
        ({"cleanup": True, "janitor": True}, "'launch' with --cleanup and --janitor"),
    ):
        job = launch_job(dataclasses.replace(req, **flags), opts(), HOSTS)
        assert job.ask is not None
        with pytest.raises(UsageError, match=f"^{named} is destructive and would run on 2 hosts"):
            perform(opts(), INVENTORY, job)
        warned = RESUME_WARNING in capsys.readouterr().err
        assert warned == ("janitor" in flags)  # the warning `fleet janitor start` gives
    assert runs.runs == []


def test_one_question_covers_cleanup_janitor_and_launch(
    runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    asked: list[str] = []
    given = opts(confirm=lambda prompt: asked.append(prompt) or True)
    req = LaunchRequest(
        command=["t.py"],
        launch_id="r1",
        playbook=load_playbook("launch"),
        output_dir="/o",
        cleanup=True,
        janitor=True,
    )
    assert perform(given, INVENTORY, launch_job(req, given, HOSTS)) is ExitCode.OK
    assert asked == ["Run 'launch' with --cleanup and --janitor on 2 hosts gpu[01-02]?"]
    assert runs.playbooks == ["cleanup", "preflight", "janitor", "launch"]


STARTED = "janitor: started for /out (pid 7, every 3s, files older than 10s, deleting x, keeping y)"
RUNNING = "janitor: already running for /out (pid 5, up 60s)"


def test_a_failed_start_stops_the_janitor_this_launch_started_and_only_that(
    runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    runs.stdout["janitor"] = {"gpu01": STARTED, "gpu02": RUNNING}
    runs.outcomes["launch"] = {"gpu02": Outcome.FAILED}
    runs.stdout["stop"] = {h.name: "stop: no run on this node" for h in HOSTS}
    assert launch(runs, janitor=True) is ExitCode.STEP_FAILED
    assert runs.playbooks == ["preflight", "janitor", "launch", "stop", "janitor"]
    undo = runs.runs[-1]
    assert undo["hosts"] == ["gpu01"]
    assert undo["command"].startswith("sh -s -- stop --dir /out ")
    err = capsys.readouterr().err
    assert "fleet: janitor left running on gpu02: it was running before this launch" in err
    # the fake stop repeats the start's line, not "stopped": fleet does not claim it ended
    assert "could not stop the janitor this launch started on gpu01" in err


def test_a_janitor_that_failed_to_start_somewhere_is_stopped_where_it_started(
    runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    runs.stdout["janitor"] = {"gpu01": STARTED, "gpu02": "janitor: refused: no such directory"}
    runs.outcomes["janitor"] = {"gpu02": Outcome.FAILED}
    assert launch(runs, janitor=True) is ExitCode.STEP_FAILED
    assert runs.playbooks == ["preflight", "janitor", "janitor"]
    assert runs.runs[-1]["hosts"] == ["gpu01"]
    assert "janitor failed to start on gpu02: not launching" in capsys.readouterr().err


# ------------------------------------------------------------------------------- status


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("run=r1 launcher=alive launcher_pid=12", ExitCode.OK),
        ("run=r1 launcher=none exit=1 procs=0", ExitCode.STEP_FAILED),
    ],
)
def test_status_reads_every_node_s_run_into_its_exit_code(
    runs: FakeRuns, capsys: pytest.CaptureFixture[str], line: str, code: ExitCode
) -> None:
    runs.stdout["status"] = {"gpu01": line, "gpu02": "run=r1 launcher=alive launcher_pid=13"}
    given = opts(json=True)
    assert perform(given, INVENTORY, status_job(given, HOSTS, {})) is code
    out = capsys.readouterr().out
    assert '"event": "RunState", "host": "gpu01"' in out


def test_status_says_why_a_node_gave_no_facts(
    runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node that refused its state dir (another user's, writable by others) is `unknown` with
    the node's reason, not a bare `no facts from the node` that leaves the operator guessing."""
    runs.outcomes["status"] = {"gpu01": Outcome.FAILED}
    refused = "launch.sh: refused: /tmp is writable by others (mode drwxrwxrwt)"
    runs.stdout["status"] = {"gpu01": refused, "gpu02": "run=r1 launcher=alive launcher_pid=13"}
    given = opts(json=True)
    assert perform(given, INVENTORY, status_job(given, HOSTS, {})) is ExitCode.STEP_FAILED
    states = [json.loads(x) for x in capsys.readouterr().out.splitlines() if "RunState" in x]
    unknown = next(s for s in states if s["host"] == "gpu01")
    assert unknown["state"] == "unknown"
    assert unknown["detail"] == f"no facts from the node: {refused}"


def test_the_cancel_line_is_said_on_stderr(
    runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    perform(opts(), INVENTORY, playbook_job(opts(), HOSTS, echo(), {}))
    on_interrupt: Callable[[], None] = runs.runs[0]["on_interrupt"]
    on_interrupt()
    assert capsys.readouterr().err == verbs.CANCELLING + "\n"
