"""The one execution path of every run-type verb: a Job, then a dry run, or the question, the
secrets and the job's runs, ending in an exit code.

A Job is data, built before any question or connection: every plan it may run (rendered and
checked, so a bad pattern or a refused deletion stops it here), the plan a destructive job asks
about, and its chain. The chain is a generator: it yields the next Phase to run, is sent that
run's RunSummary, and returns the job's exit code. A verb that chains runs (launch: cleanup,
preflight, janitor, start, roll back) decides between them in its chain; only `perform` runs them.
"""

from __future__ import annotations

import getpass
import os
import sys
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleet.core import nodeset
from fleet.core.errors import ExitCode, FleetError, UsageError
from fleet.core.events import Outcome, RunSummary
from fleet.core.hosts import Host
from fleet.core.playbook import Playbook
from fleet.core.safetext import clean
from fleet.engine.plan import Plan
from fleet.engine.runner import (
    Handler,
    RunSettings,
    Secrets,
    default_reporters,
    dry_run_lines,
    prepare,
    run_plan,
    select_hosts,
)
from fleet.inventory.loader import Inventory, Selection
from fleet.node import deletion

Confirm = Callable[[str], bool]  # a yes/no question to the operator; True: yes


def declined(prompt: str) -> bool:
    """The answer when nobody was given a way to ask: no (nothing destructive runs unasked)."""
    return False


@dataclass(frozen=True)
class AskSettings:
    """How a job deals with the operator before it runs: --dry-run, --yes, the secrets to prompt
    for (--ask-key-pass, -K), and how a question is put (fleet.cli hands click's prompt)."""

    dry_run: bool = False
    yes: bool = False
    ask_key_pass: bool = False
    ask_become_pass: bool = False
    confirm: Confirm = field(default=declined, compare=False)


@dataclass(frozen=True)
class Settings:
    """Every setting of one invocation, built once by fleet.cli; each layer below is handed only
    its own part: the host selection to fleet.inventory, the run settings to fleet.engine (which
    passes SSH's to fleet.ssh, the output's to fleet.output, the record's to fleet.records)."""

    hosts: Selection = field(default_factory=Selection)
    run: RunSettings = field(default_factory=RunSettings)
    ask: AskSettings = field(default_factory=AskSettings)
    vars: tuple[str, ...] = ()  # every --var NAME=VALUE, as typed

    @property
    def json(self) -> bool:
        return self.run.output.json

    @property
    def verb(self) -> str:
        return self.run.record.verb


def select(settings: Settings) -> tuple[Inventory, list[Host]]:
    """The selected hosts, and the run-record dir checked unless this is a dry run."""
    return select_hosts(settings.hosts, settings.run.record, dry_run=settings.ask.dry_run)


def say(text: str, *, err: bool = False) -> None:
    """One line to the operator, flushed (the terminal's text; callers clean what they quote)."""
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


CANCELLING = (
    "\nfleet: cancelling: no new steps; stopping remote commands (Ctrl-C again to abort at once)"
)


@dataclass(frozen=True)
class Phase:
    """One playbook run of a job."""

    plan: Plan
    reporters: Sequence[Handler] | None = None  # None: the usual ones (runner.default_reporters)
    listeners: Sequence[Handler] = ()  # told every event too, shown or not (collectors)
    cancelling: str | None = CANCELLING  # said on stderr at the first Ctrl-C; None: nothing


Chain = Generator[Phase, RunSummary, ExitCode]


@dataclass(frozen=True)
class Job:
    """What a verb runs, as data."""

    plans: tuple[Plan, ...]  # every plan the chain may run, in order: what --dry-run shows
    chain: Chain
    ask: Plan | None = None  # destructive: on more than one host, ask before running it
    look: Plan | None = None  # a read-only run whose findings the question sums up (cleanup)
    # What the look found, summed in one phrase for the question (the verb knows its findings).
    found: Callable[[Plan], str] | None = None
    notice: str = ""  # said on stderr before the question (what the operator trades away)
    # What the question names, when more runs than `ask` hang on the one answer (launch
    # --cleanup --janitor: one question for the three); "": the asked plan's playbook.
    question: str = ""

    def asked(self) -> str:
        """The name the question and the refusal give what would run."""
        if self.question:
            return self.question
        return f"'{self.ask.playbook.name}'" if self.ask is not None else ""


def build(
    opts: Settings, playbook: Playbook, overrides: Mapping[str, Any], hosts: Sequence[Host]
) -> Plan:
    """A plan, checked: what a janitor or cleanup step would delete, then every command."""
    deletion.check_plan(playbook, hosts, overrides)
    return prepare(opts.run, playbook, dict(overrides), hosts)


def playbook_job(
    opts: Settings,
    hosts: Sequence[Host],
    playbook: Playbook,
    overrides: Mapping[str, Any],
    *,
    confirm: bool | None = None,
    reporters: Sequence[Handler] | None = None,
    look: Mapping[str, Any] | None = None,
    found: Callable[[Plan], str] | None = None,
    notice: str = "",
    interrupt_ends: bool = False,
) -> Job:
    """The job of a verb that is one playbook run. `confirm`: destructive (default: what the
    playbook says). `look`: the overrides of a read-only run of the same playbook that goes
    before the question (when there is one on a terminal), `found` what the question says of
    its findings. `interrupt_ends`: Ctrl-C is how the
    run ends (logs --follow), exit 0."""
    plan = build(opts, playbook, overrides, hosts)
    destructive = playbook.confirm if confirm is None else confirm
    looked = None
    if look is not None and destructive and _asks(plan, opts) and not opts.ask.dry_run:
        looked = prepare(opts.run, playbook, {**overrides, **look}, hosts)
    return Job(
        plans=(plan,),
        chain=_once(Phase(plan, reporters), interrupt_ends),
        ask=plan if destructive else None,
        look=looked,
        found=found,
        notice=notice,
    )


def _once(phase: Phase, interrupt_ends: bool) -> Chain:
    summary = yield phase
    if interrupt_ends and summary.interrupted:
        # Ctrl-C ends what it cancelled, not an error; a host that had already failed, or was
        # lost, before it still says so in the exit code
        kept = tuple(r for r in summary.results if r.outcome is not Outcome.CANCELLED)
        return replace(summary, results=kept, interrupted=False).exit_code
    return summary.exit_code


def perform(opts: Settings, inventory: Inventory, job: Job) -> ExitCode:
    """Dry run: print every plan, connect nowhere. Else say the notice, ask (destructive jobs on
    more than one host), read the secrets once, run the chain; the exit code is the chain's."""
    if opts.ask.dry_run:
        for plan in job.plans:
            for line in dry_run_lines(plan, inventory, opts.json):
                echo_dry_run(line)
        return ExitCode.OK
    if job.notice:
        say(job.notice, err=True)
    if job.ask is not None and job.look is not None and _asks(job.ask, opts) and _terminal():
        secrets = ask_secrets(opts)  # the look connects: it needs them first
        _confirm_after_look(job.ask, job.look, job.found, opts, secrets, job.asked())
    else:
        if job.ask is not None:
            confirm(job.ask, opts, job.asked())
        secrets = ask_secrets(opts)
    return drive(job.chain, opts, secrets)


def drive(chain: Chain, opts: Settings, secrets: Secrets | None) -> ExitCode:
    """Run each phase the chain yields, send it the summary; return what the chain returns.
    With --json, the last line is the verb's VerbFinished: the exit code fleet exits with."""
    done: list[RunSummary] = []
    try:
        phase = next(chain)
        while True:
            done.append(run_phase(phase, opts, secrets))
            phase = chain.send(done[-1])
    except StopIteration as end:
        code = ExitCode(end.value)
    except FleetError as exc:
        _finished(opts, done, exc.exit_code, str(exc))
        raise
    _finished(opts, done, code)
    return code


def _finished(
    opts: Settings, done: Sequence[RunSummary], code: ExitCode, error: str | None = None
) -> None:
    """The verb's last JSON line (--json only), after every run's own."""
    if not opts.json:
        return
    from fleet.core.events import VerbFinished
    from fleet.output.plain import JsonReporter

    event = VerbFinished(verb=opts.verb, exit_code=code, runs=tuple(done), error=error)
    reporter = JsonReporter(sys.stdout)
    reporter.handle(event)
    reporter.close()


def run_phase(phase: Phase, opts: Settings, secrets: Secrets | None) -> RunSummary:
    """One plan through the runner, with the phase's reporters, listeners and Ctrl-C line."""
    reporters = phase.reporters
    if phase.listeners:
        shown = default_reporters(opts.run.output, phase.plan) if reporters is None else reporters
        reporters = [*shown, *phase.listeners]
    text = phase.cancelling
    return run_plan(
        phase.plan,
        opts.run,
        secrets,
        reporters=reporters,
        on_interrupt=None if text is None else lambda: say(text, err=True),
    )


def echo_dry_run(line: str) -> None:
    """One dry-run line: commands hold inventory values, so controls show escaped (a multi-line
    step keeps its lines); `--dry-run --json` has the exact text, JSON-escaped."""
    say(clean(line, keep_newlines=True))


def _asks(plan: Plan, opts: Settings) -> bool:
    return len(plan.hosts) > 1 and not opts.ask.yes


def _terminal() -> bool:
    return sys.stdin.isatty()


def confirm(plan: Plan, opts: Settings, what: str = "") -> None:
    """A destructive plan on more than one host asks first (refused with no terminal to ask).
    `what`: the name the question gives what runs (default: the plan's playbook)."""
    if not _asks(plan, opts):
        return
    what = what or f"'{plan.playbook.name}'"
    names = clean(nodeset.fold(plan.host_names))
    if not _terminal():
        raise UsageError(
            f"{what} is destructive and would run on {len(plan.hosts)} hosts "
            f"({names}); no terminal to confirm",
            hint="pass --yes to confirm, or --dry-run to see what would run",
        )
    prompt = clean(f"Run {what} on {len(plan.hosts)} hosts {names}?")
    if not opts.ask.confirm(prompt):
        raise FleetError("not confirmed; nothing was run", hint="pass --yes to skip the question")


def _confirm_after_look(
    plan: Plan,
    look: Plan,
    found_in: Callable[[Plan], str] | None,
    opts: Settings,
    secrets: Secrets | None,
    what: str,
) -> None:
    """Run the look (a passing live table on a terminal, nothing else), then ask with its totals.
    They say what the nodes hold right now; the run itself decides again from what it finds."""
    quiet = opts.json or not sys.stdout.isatty()
    shown = [] if quiet else default_reporters(opts.run.output, look, False, True)
    run_phase(Phase(look, shown), opts, secrets)
    names = nodeset.fold(plan.host_names)
    found = found_in(look) if found_in else ""
    prompt = clean(f"Run {what} on {len(plan.hosts)} hosts {names}? {found}")
    if not opts.ask.confirm(prompt):
        raise FleetError("not confirmed; nothing was run", hint="pass --yes to skip the question")


def ask_secrets(opts: Settings) -> Secrets | None:
    """Prompt once, locally, without echo (never from worker threads: PITFALLS 16)."""
    if not (opts.ask.ask_become_pass or opts.ask.ask_key_pass):
        return None
    sudo = key = None
    if opts.ask.ask_key_pass:
        key = _secret(
            "SSH key passphrase (used locally, never shown or logged): ",
            "--ask-key-pass",
            "the key's passphrase",
            "better: ssh-agent, which asks nothing",
        )
    if opts.ask.ask_become_pass:
        sudo = _secret(
            "sudo password (sent to every host, never shown or logged): ",
            "-K/--ask-become-pass",
            "the sudo password",
            "better: NOPASSWD sudo for fleet's steps",
        )
    return Secrets(sudo_password=sudo, key_passphrase=key)


def _secret(prompt: str, option: str, what: str, better: str) -> str:
    """One secret: asked without echo on a terminal (the controlling one, else stdin if it is
    one), else the next line of stdin (a script's pipe, which echoes nothing). getpass reads a
    pipe by itself too, but first warns that the input may be echoed (GetPassWarning and a line
    of its own), never true of a pipe: so the terminal is looked for here, getpass used on one."""
    stdin = sys.stdin
    if _controlling_terminal() or (stdin is not None and stdin.isatty()):
        return getpass.getpass(prompt)
    line = stdin.readline() if stdin is not None else ""
    if not line:
        raise UsageError(
            f"{option}: no terminal to ask {what} on, and nothing on stdin",
            hint=f"run it in a terminal, or pipe the secret in as stdin's first line; {better}",
        )
    # Said as getpass said it, so a script's log shows a secret was taken, and from where.
    sys.stderr.write(f"{prompt}(read from stdin)\n")
    return line.removesuffix("\n")


def _controlling_terminal() -> bool:
    """True when /dev/tty opens: the terminal getpass asks on (and turns echo off on)."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True
