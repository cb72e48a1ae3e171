"""`fleet status`: one run of the read-only status playbook, read into one row per node (or a
RunState JSON line per node), and an exit code saying whether every node's training run is well."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.core.errors import ExitCode
from fleet.core.events import Outcome, RunSummary
from fleet.core.hosts import Host
from fleet.core.playbook import Playbook, load_shipped
from fleet.engine.plan import Plan, check_patterns
from fleet.engine.runner import Handler, OutputCollector, default_reporters
from fleet.node import runstate
from fleet.node.runstate import NodeRun
from fleet.ops.jobs import Chain, Job, Phase, Settings, build

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


def status_job(opts: Settings, hosts: Sequence[Host], overrides: Mapping[str, Any]) -> Job:
    """The status run; its chain shows the table (or the RunState lines) once it is done."""
    playbook = load_shipped("status")
    check_patterns(playbook, hosts, overrides)
    plan = build(opts, playbook, overrides, hosts)
    return Job(plans=(plan,), chain=_chain(plan, opts))


def _chain(plan: Plan, opts: Settings) -> Chain:
    collector = OutputCollector()
    reporters: list[Handler]
    if opts.json:
        reporters = default_reporters(opts.run.output, Plan(plan.playbook, ()), summary=False)
    else:
        # a live progress table on a terminal while the facts are gathered, then the status table
        reporters = _progress(opts, plan.playbook)
    summary = yield Phase(plan, reporters, listeners=[collector])
    runs = node_runs(collector, answered(summary))
    if opts.json:
        for host, run in runs.items():
            sys.stdout.write(
                json.dumps({"event": "RunState", "host": host, **run.to_dict()}) + "\n"
            )
        return status_exit_code(summary, runs)
    _print_table(summary, collector, runs)
    return status_exit_code(summary, runs)


def _print_table(
    summary: RunSummary, collector: OutputCollector, runs: Mapping[str, NodeRun]
) -> None:
    from fleet.output.console import Console
    from fleet.output.reporters import print_status_table

    rows = []
    for result in summary.results:
        facts: dict[str, str] = {}
        # Each step's own keys only: the janitor step reports a pid too, the run's wins.
        for step, keys in STATUS_KEYS.items():
            found = collector.facts(result.host, step)
            facts.update({k: v for k, v in found.items() if k in keys})
        reason = result.reason or ""
        if reason and result.failed_step:  # which of the steps: a hung `disk` is not the run
            reason = f"{result.failed_step}: {reason}"
        rows.append((result.host, result.outcome.value, reason, facts, runs.get(result.host)))
    wide = None if sys.stdout.isatty() else 160  # pipes and logs get every column
    print_status_table(Console(highlight=False, width=wide), rows)


def answered(summary: RunSummary) -> list[str]:
    """The hosts whose `run` step answered: every host that ended ok or failed, and one that
    timed out in a later step (a `disk` hung on a stale NFS mount): its run's state is known."""
    return [
        r.host
        for r in summary.results
        if r.outcome in (Outcome.OK, Outcome.FAILED)
        or (r.outcome is Outcome.TIMED_OUT and r.failed_step not in (None, "run"))
    ]


def node_runs(collector: OutputCollector, hosts: Sequence[str]) -> dict[str, NodeRun]:
    """Each host's training run, decided from what its `run` step printed."""
    out = {}
    for host in hosts:
        lines = collector.lines.get(host, {}).get("run", [])
        tail = [line[len(LOG_PREFIX) :] for line in lines[:-1] if line.startswith(LOG_PREFIX)]
        said = lines[-1] if lines else ""
        out[host] = runstate.decide(collector.facts(host, "run"), tail, said)
    return out


def status_exit_code(summary: RunSummary, runs: Mapping[str, NodeRun]) -> ExitCode:
    """0 only when every node answered and every node's run is running or finished."""
    if summary.exit_code is not ExitCode.OK:
        return summary.exit_code
    if all(run.healthy for run in runs.values()):
        return ExitCode.OK
    return ExitCode.STEP_FAILED


def _progress(opts: Settings, playbook: Playbook) -> list[Handler]:
    """The usual live table (no summary) on a terminal; nothing off one."""
    if opts.run.output.plain or not sys.stdout.isatty():
        return []
    return default_reporters(opts.run.output, Plan(playbook, ()), summary=False, transient=True)
