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
import sys
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click

from fleet.core import nodeset
from fleet.core.errors import ExitCode, FleetError, UsageError
from fleet.core.events import RunSummary
from fleet.core.hosts import Host
from fleet.core.playbook import Playbook
from fleet.core.safetext import clean
from fleet.engine.plan import Plan
from fleet.engine.runner import (
    Handler,
    Options,
    Secrets,
    default_reporters,
    dry_run_lines,
    prepare,
    run_plan,
)
from fleet.inventory.loader import Inventory
from fleet.node import deletion

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


def build(
    opts: Options, playbook: Playbook, overrides: Mapping[str, Any], hosts: Sequence[Host]
) -> Plan:
    """A plan, checked: what a janitor or cleanup step would delete, then every command."""
    deletion.check_plan(playbook, hosts, overrides)
    return prepare(opts, playbook, dict(overrides), hosts)


def playbook_job(
    opts: Options,
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
    if look is not None and destructive and _asks(plan, opts) and not opts.dry_run:
        looked = prepare(opts, playbook, {**overrides, **look}, hosts)
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
        return ExitCode.OK
    return summary.exit_code


def perform(opts: Options, inventory: Inventory, job: Job) -> ExitCode:
    """Dry run: print every plan, connect nowhere. Else say the notice, ask (destructive jobs on
    more than one host), read the secrets once, run the chain; the exit code is the chain's."""
    if opts.dry_run:
        for plan in job.plans:
            for line in dry_run_lines(plan, inventory, opts.json):
                echo_dry_run(line)
        return ExitCode.OK
    if job.notice:
        click.echo(job.notice, err=True)
    if job.ask is not None and job.look is not None and _asks(job.ask, opts) and _terminal():
        secrets = ask_secrets(opts)  # the look connects: it needs them first
        _confirm_after_look(job.ask, job.look, job.found, opts, secrets)
    else:
        if job.ask is not None:
            confirm(job.ask, opts)
        secrets = ask_secrets(opts)
    return drive(job.chain, opts, secrets)


def drive(chain: Chain, opts: Options, secrets: Secrets | None) -> ExitCode:
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
    opts: Options, done: Sequence[RunSummary], code: ExitCode, error: str | None = None
) -> None:
    """The verb's last JSON line (--json only), after every run's own."""
    if not opts.json:
        return
    from fleet.core.events import VerbFinished
    from fleet.output.reporters import JsonReporter

    event = VerbFinished(verb=opts.verb, exit_code=code, runs=tuple(done), error=error)
    JsonReporter(sys.stdout).handle(event)


def run_phase(phase: Phase, opts: Options, secrets: Secrets | None) -> RunSummary:
    """One plan through the runner, with the phase's reporters, listeners and Ctrl-C line."""
    reporters = phase.reporters
    if phase.listeners:
        shown = default_reporters(opts, phase.plan) if reporters is None else reporters
        reporters = [*shown, *phase.listeners]
    text = phase.cancelling
    return run_plan(
        phase.plan,
        opts,
        secrets,
        reporters=reporters,
        on_interrupt=None if text is None else lambda: click.echo(text, err=True),
    )


def echo_dry_run(line: str) -> None:
    """One dry-run line: commands hold inventory values, so controls show escaped (a multi-line
    step keeps its lines); `--dry-run --json` has the exact text, JSON-escaped."""
    click.echo(clean(line, keep_newlines=True))


def _asks(plan: Plan, opts: Options) -> bool:
    return len(plan.hosts) > 1 and not opts.yes


def _terminal() -> bool:
    return sys.stdin.isatty()


def confirm(plan: Plan, opts: Options) -> None:
    """A destructive plan on more than one host asks first (refused with no terminal to ask)."""
    if not _asks(plan, opts):
        return
    names = clean(nodeset.fold(plan.host_names))
    if not _terminal():
        raise UsageError(
            f"'{plan.playbook.name}' is destructive and would run on {len(plan.hosts)} hosts "
            f"({names}); no terminal to confirm",
            hint="pass --yes to confirm, or --dry-run to see what would run",
        )
    prompt = clean(f"Run '{plan.playbook.name}' on {len(plan.hosts)} hosts {names}?")
    if not click.confirm(prompt, default=False, err=True):
        raise FleetError("not confirmed; nothing was run", hint="pass --yes to skip the question")


def _confirm_after_look(
    plan: Plan,
    look: Plan,
    found_in: Callable[[Plan], str] | None,
    opts: Options,
    secrets: Secrets | None,
) -> None:
    """Run the look (a passing live table on a terminal, nothing else), then ask with its totals.
    They say what the nodes hold right now; the run itself decides again from what it finds."""
    quiet = opts.json or not sys.stdout.isatty()
    shown = [] if quiet else default_reporters(opts, look, False, True)
    run_phase(Phase(look, shown), opts, secrets)
    names = nodeset.fold(plan.host_names)
    found = found_in(look) if found_in else ""
    prompt = clean(f"Run '{plan.playbook.name}' on {len(plan.hosts)} hosts {names}? {found}")
    if not click.confirm(prompt, default=False, err=True):
        raise FleetError("not confirmed; nothing was run", hint="pass --yes to skip the question")


def ask_secrets(opts: Options) -> Secrets | None:
    """Prompt once, locally, without echo (never from worker threads: PITFALLS 16)."""
    if not (opts.ask_become_pass or opts.ask_key_pass):
        return None
    sudo = key = None
    try:
        if opts.ask_key_pass:
            key = getpass.getpass("SSH key passphrase (used locally, never shown or logged): ")
        if opts.ask_become_pass:
            sudo = getpass.getpass("sudo password (sent to every host, never shown or logged): ")
    except EOFError:
        raise UsageError(
            "-K/--ask-key-pass need a terminal (or stdin) to read the secret from",
            hint="run interactively; or use ssh-agent and NOPASSWD sudo for fleet's steps",
        ) from None
    return Secrets(sudo_password=sudo, key_passphrase=key)
