"""`fleet launch` and `fleet status`: verbs that chain playbook runs and read their results.

launch = optional cleanup (before preflight: it clears the ghosts preflight would refuse on) ->
preflight (refuse on failure unless --force) -> optional janitor -> start on every node -> if the
start failed on any node or was cancelled (Ctrl-C), stop the run by its id on every node where its
start step ran, however that step ended (all or nothing).
"""

from __future__ import annotations

import re
import secrets as tokens
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet import nodeset, runstate
from fleet.errors import ExitCode, UsageError
from fleet.events import Event, Outcome, RunSummary, StepStarted
from fleet.inventory import Host, Inventory
from fleet.plan import Plan
from fleet.playbook import Playbook, load_playbook
from fleet.runner import (
    Options,
    OutputCollector,
    Secrets,
    default_reporters,
    dry_run_lines,
    prepare,
    run_plan,
)
from fleet.runstate import NodeRun

Say = Callable[[str], None]


@dataclass(frozen=True)
class LaunchRequest:
    """Everything `fleet launch` was asked to do."""

    command: list[str]
    run_id: str
    playbook: Playbook
    master_addr: str | None = None
    master_port: int | None = None
    nproc_per_node: int | None = None
    env_pairs: list[str] = field(default_factory=list)
    container: str | None = None
    launcher: str | None = None
    workdir: str | None = None
    output_dir: str | None = None
    force: bool = False
    cleanup: bool = False
    janitor: bool = False
    extra_vars: dict[str, Any] = field(default_factory=dict)


def new_run_id() -> str:
    """Sortable, and unique across launches started in the same second (from any bastion):
    run-20261130-041233-3fa2c1d9. 32 random bits: a launch whose start is refused stops its run
    id everywhere it ran, so an id shared with another launch would stop that launch's run."""
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{tokens.token_hex(4)}"


# A run id names a directory on every node, next to the node's `current` pointer and lock files
# (which all start with '.'): a plain name, checked here before anything runs (launch.sh checks
# it again on the node).
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
RESERVED_RUN_IDS = frozenset({"current"})


def check_run_id(value: str, option: str = "--run-id") -> str:
    """`value` when it can name a run; else a UsageError (exit 2) saying why."""
    if value in RESERVED_RUN_IDS:
        raise UsageError(
            f"{option} {value!r} is reserved: the node's pointer to its newest run has that name",
            hint="pick another name, e.g. --run-id llama-sft-3",
        )
    if not RUN_ID.fullmatch(value):
        raise UsageError(
            f"{option} {value!r} is not a run id: use letters, digits, '.', '_', '-' and '+' "
            "(at most 128, starting with a letter or digit)",
            hint="e.g. --run-id llama-sft-3",
        )
    return value


def master_address(req: LaunchRequest, hosts: Sequence[Host]) -> str:
    """Explicit --master-addr, else the first host's `master_addr` var, else its address.

    Never guessed on the node (`hostname -I` can pick the wrong NIC, PITFALLS 17).
    """
    if req.master_addr:
        return req.master_addr
    first = hosts[0]
    return str(first.vars.get("master_addr") or first.address)


def start_vars(req: LaunchRequest, hosts: Sequence[Host]) -> dict[str, Any]:
    """Variables for the launch playbook (rank and count come per host from the plan)."""
    out: dict[str, Any] = {
        "run_id": req.run_id,
        "master_addr": master_address(req, hosts),
        "command": req.command,
        "extra_env": req.env_pairs,
    }
    if req.master_port is not None:
        out["master_port"] = req.master_port
    if req.nproc_per_node is not None:
        out["gpus"] = req.nproc_per_node
    if req.container:
        out["container"] = req.container
    if req.launcher:
        out["launcher"] = req.launcher
    if req.workdir:
        out["workdir"] = req.workdir
    out.update(req.extra_vars)
    return out


def _dir_vars(req: LaunchRequest) -> dict[str, Any]:
    """The output dir (when given) plus --var values, which apply to every phase."""
    given = {"output_dir": req.output_dir} if req.output_dir else {}
    return {**given, **req.extra_vars}


def _cleanup_vars(req: LaunchRequest) -> dict[str, Any]:
    """Cleanup frees the port this launch will use (not only the default one)."""
    port = {"port": req.master_port} if req.master_port is not None else {}
    return {**port, **req.extra_vars}


def _preflight_vars(req: LaunchRequest) -> dict[str, Any]:
    port = {"master_port": req.master_port} if req.master_port is not None else {}
    return {**port, **_dir_vars(req)}


def check_deletions(req: LaunchRequest, hosts: Sequence[Host]) -> None:
    """Refuse, before anything connects, a --cleanup or --janitor phase whose state paths or
    delete globs fleet would refuse on its own (`fleet cleanup` / `fleet janitor start`)."""
    from fleet import deletion

    if req.cleanup:
        deletion.check_plan(load_playbook("cleanup"), hosts, _cleanup_vars(req))
    if req.janitor:
        deletion.check_plan(load_playbook("janitor"), hosts, {"action": "start", **_dir_vars(req)})


def dry_run(
    req: LaunchRequest, opts: Options, inventory: Inventory, hosts: Sequence[Host]
) -> Iterator[str]:
    """What each phase would run where."""
    phases: list[tuple[Playbook, dict[str, Any]]] = []
    if req.cleanup:
        phases.append((load_playbook("cleanup"), _cleanup_vars(req)))
    phases.append((load_playbook("preflight"), _preflight_vars(req)))
    if req.janitor:
        phases.append((load_playbook("janitor"), {"action": "start", **_dir_vars(req)}))
    phases.append((req.playbook, start_vars(req, hosts)))
    for playbook, overrides in phases:
        yield from dry_run_lines(prepare(opts, playbook, overrides, hosts), inventory, opts.json)


def _run(
    opts: Options,
    playbook: Playbook,
    overrides: dict[str, Any],
    hosts: Sequence[Host],
    secrets: Secrets | None,
) -> RunSummary:
    return run_plan(prepare(opts, playbook, overrides, hosts), opts, secrets)


def launch(
    req: LaunchRequest, opts: Options, hosts: Sequence[Host], secrets: Secrets | None, say: Say
) -> ExitCode:
    """Run the launch phases; return the exit code of the phase that decided the outcome."""
    names = nodeset.fold(h.name for h in hosts)
    if req.cleanup:
        done = _run(opts, load_playbook("cleanup"), _cleanup_vars(req), hosts, secrets)
        if done.exit_code is not ExitCode.OK:
            say(f"fleet: cleanup failed on {nodeset.fold(done.failed)}: not launching")
            return done.exit_code
    pre = _run(opts, load_playbook("preflight"), _preflight_vars(req), hosts, secrets)
    if pre.exit_code is not ExitCode.OK:
        bad = nodeset.fold(pre.failed)
        if not req.force:
            say(f"fleet: preflight failed on {bad}: not launching (fix it, or pass --force)")
            return pre.exit_code
        say(f"fleet: preflight failed on {bad}; launching anyway (--force)")
    if req.janitor:
        janitor_vars = {"action": "start", **_dir_vars(req)}
        done = _run(opts, load_playbook("janitor"), janitor_vars, hosts, secrets)
        if done.exit_code is not ExitCode.OK:
            say(f"fleet: janitor failed to start on {nodeset.fold(done.failed)}: not launching")
            return done.exit_code
    reached = _StepsReached()
    plan = prepare(opts, req.playbook, start_vars(req, hosts), hosts)
    started = run_plan(
        plan,
        opts,
        secrets,
        reporters=[*default_reporters(opts, plan), reached],
        on_interrupt=lambda: say(
            f"fleet: cancelling the start of run {req.run_id}: it will be stopped wherever it "
            "started (Ctrl-C again to abort at once, leaving that to you)"
        ),
    )
    if started.exit_code is ExitCode.OK:
        master = master_address(req, hosts)
        port = req.master_port or req.playbook.vars.get("master_port", 39500)
        say(
            f"fleet: run {req.run_id} started on {len(hosts)} hosts {names} "
            f"(master {master}:{port}); follow with `fleet logs -f`, stop with `fleet stop`"
        )
        return ExitCode.OK
    touched = [h for h in hosts if h.name in reached.hosts]
    return _roll_back(req, opts, touched, started, secrets, say)


class _StepsReached:
    """Reporter: the hosts where a step started. Where the start step started, the run may run,
    whatever the step's outcome says: a cancelled or timed-out step may have been stopped after
    its job was launched, and a node that went away mid-step may have launched it all the same."""

    def __init__(self) -> None:
        self.hosts: set[str] = set()

    def handle(self, event: Event) -> None:
        if isinstance(event, StepStarted):
            self.hosts.add(event.host)

    def close(self) -> None:
        return None


# What `launch.sh stop` says last, per node (see its action_stop).
_STOPPED = "stopped run="
_NOTHING = ("stop: no run on this node", "stop: run ")


def _roll_back(
    req: LaunchRequest,
    opts: Options,
    touched: Sequence[Host],
    started: RunSummary,
    secrets: Secrets | None,
    say: Say,
) -> ExitCode:
    """All or nothing: stop this run, by its id (never another), on every node its start reached.

    On a node whose start was interrupted, launch.sh already stopped what it had begun, and the
    stop finds nothing; on one where it completed, or where the interruption could not be
    delivered, the stop ends it. Returns the start's exit code (130 after Ctrl-C)."""
    failed = nodeset.fold(started.failed)
    if started.interrupted:
        why = "launch interrupted"
    else:
        why = f"run {req.run_id} failed to start on {failed}"
    if not touched:
        say(f"fleet: {why}; its start ran on no node, so it started nowhere")
        return started.exit_code
    say(
        f"fleet: {why}; stopping run {req.run_id} wherever its start ran: "
        f"{nodeset.fold(h.name for h in touched)} (all or nothing)"
    )
    collector = OutputCollector()
    plan = prepare(opts, load_playbook("stop"), {"run_id": req.run_id, "grace": 10}, touched)
    stopped = run_plan(plan, opts, secrets, reporters=[*default_reporters(opts, plan), collector])
    for line in _rollback_report(req.run_id, stopped, collector):
        say(line)
    return started.exit_code


def _rollback_report(run_id: str, stopped: RunSummary, collector: OutputCollector) -> list[str]:
    """Where the rollback stopped the run and where nothing of it was left (one line), and where
    it could not make sure (a line of its own: those nodes need the operator)."""
    ended: list[str] = []
    nothing: list[str] = []
    unsure: list[str] = []
    for result in stopped.results:
        lines = collector.lines.get(result.host, {}).get("stop", [])
        last = lines[-1] if lines else ""
        if result.outcome is Outcome.OK and last.startswith(_STOPPED):
            ended.append(result.host)
        elif result.outcome is Outcome.OK and last.startswith(_NOTHING):
            nothing.append(result.host)
        else:
            unsure.append(result.host)
    parts = []
    if ended:
        parts.append(f"stopped on {nodeset.fold(ended)}")
    if nothing:
        parts.append(f"nothing of it running on {nodeset.fold(nothing)}")
    lines = [f"fleet: run {run_id} rolled back: {'; '.join(parts)}"] if parts else []
    if unsure:
        lines.append(
            f"fleet: could not stop run {run_id} on {nodeset.fold(unsure)}: it may still be "
            f"running there; check with `fleet status`, stop it with "
            f"`fleet stop --run-id {run_id}`"
        )
    return lines


STATUS_KEYS = {  # status playbook step -> the facts it owns
    "run": (
        "run",
        "launcher",
        "wrapper",
        "launcher_pid",
        "exit",
        "procs",
        "uptime_s",
        "stopped",
        "container",
    ),
    "processes": ("training", "pids"),
    "gpus": ("gpus", "mem_used_mib", "mem_total_mib", "util_avg_pct"),
    "janitor": ("janitor",),
    "disk": ("free_bytes", "fs"),
}
LOG_PREFIX = "log: "  # launch.sh status: the run's last log lines, before its facts line


def node_runs(collector: OutputCollector, hosts: Sequence[str]) -> dict[str, NodeRun]:
    """Each host's run, decided from what its `run` step printed."""
    out = {}
    for host in hosts:
        lines = collector.lines.get(host, {}).get("run", [])
        tail = [line[len(LOG_PREFIX) :] for line in lines[:-1] if line.startswith(LOG_PREFIX)]
        out[host] = runstate.decide(collector.facts(host, "run"), tail)
    return out


def status_exit_code(summary: RunSummary, runs: dict[str, NodeRun]) -> ExitCode:
    """0 only when every node answered and every node's run is running or finished."""
    if summary.exit_code is not ExitCode.OK:
        return summary.exit_code
    if all(run.healthy for run in runs.values()):
        return ExitCode.OK
    return ExitCode.STEP_FAILED


def status(
    opts: Options,
    overrides: dict[str, Any],
    execute: Callable[..., RunSummary | None],
) -> ExitCode:
    """Run the read-only status playbook; show one row per host; say whether all is well."""
    import json

    from rich.console import Console

    from fleet.reporters import print_status_table

    collector = OutputCollector()
    playbook = load_playbook("status")
    reporters: list[Any] = [collector]
    if opts.json:
        reporters += default_reporters(opts, Plan(playbook, ()), summary=False)
    else:
        # a live progress table on a terminal while the facts are gathered, then the status table
        reporters += _progress(opts, playbook)
    summary = execute(opts, playbook, overrides, reporters=reporters)
    if summary is None:
        return ExitCode.OK
    answered = [r.host for r in summary.results if r.outcome in (Outcome.OK, Outcome.FAILED)]
    runs = node_runs(collector, answered)
    if opts.json:
        for host, run in runs.items():
            sys.stdout.write(
                json.dumps({"event": "RunState", "host": host, **run.to_dict()}) + "\n"
            )
        return status_exit_code(summary, runs)
    rows = []
    for result in summary.results:
        facts: dict[str, str] = {}
        # Each step's own keys only: the janitor step reports a pid too, the run's wins.
        for step, keys in STATUS_KEYS.items():
            found = collector.facts(result.host, step)
            facts.update({k: v for k, v in found.items() if k in keys})
        rows.append(
            (result.host, result.outcome.value, result.reason or "", facts, runs.get(result.host))
        )
    wide = None if sys.stdout.isatty() else 160  # pipes and logs get every column
    print_status_table(Console(highlight=False, width=wide), rows)
    return status_exit_code(summary, runs)


def _progress(opts: Options, playbook: Playbook) -> list[Any]:
    """The usual live table (no summary) on a terminal; nothing off one."""
    if opts.plain or not sys.stdout.isatty():
        return []
    return default_reporters(opts, Plan(playbook, ()), summary=False, transient=True)
