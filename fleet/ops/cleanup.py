"""`fleet cleanup`'s job: with --preview, a read-only look shown per node; else the cleanup, whose
question on a terminal comes after such a look and sums up what it found."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.core.hosts import Host
from fleet.core.playbook import load_shipped
from fleet.core.safetext import clean
from fleet.engine.plan import Plan
from fleet.ops.jobs import Chain, Job, Phase, Settings, build, playbook_job, say


def cleanup_job(
    opts: Settings, hosts: Sequence[Host], overrides: Mapping[str, Any], *, preview: bool
) -> Job:
    """`preview`: the overrides ask for a look (`preview: true`); run it, then show what each
    node holds. Else the cleanup, destructive whatever the playbook says."""
    playbook = load_shipped("cleanup")
    if preview:
        plan = build(opts, playbook, overrides, hosts)
        return Job(plans=(plan,), chain=_shown(plan, opts))
    return playbook_job(
        opts,
        hosts,
        playbook,
        overrides,
        confirm=True,
        look={"preview": True},
        found=totals,
    )


def _shown(plan: Plan, opts: Settings) -> Chain:
    summary = yield Phase(plan)
    show(plan, opts)
    return summary.exit_code


def previews(plan: Plan) -> list[tuple[str, Any]]:
    """(host, Preview) for every host a preview run reached."""
    from fleet.node.ops import CleanupOp

    out = []
    for hp in plan.hosts:
        for ps in hp.steps:
            if isinstance(ps.op, CleanupOp):
                out += [(hp.host.name, seen) for seen in ps.op.previews]
    return out


def show(plan: Plan, opts: Settings) -> None:
    """After the run's own output, each node's findings: with --json a CleanupPreview line per
    host; on a terminal a few lines per host; nothing with --plain or off a terminal (the plain
    lines already said all of it)."""
    if opts.json:
        for host, seen in previews(plan):
            say(json.dumps({"event": "CleanupPreview", "host": host, **seen.to_dict()}))
    elif not opts.run.output.plain and sys.stdout.isatty():
        for host, seen in previews(plan):
            say(clean(f"{host}: {seen.summary()}"))
            for line in seen.lines()[:-1]:
                say(clean(f"  {line}"))


def totals(plan: Plan) -> str:
    """What a preview found, summed: `Right now it would kill 12 processes and remove 40 paths`,
    then how many nodes refused or did not answer."""
    from fleet.node.cleanup import plural

    seen = [p for _, p in previews(plan)]
    fine = [p for p in seen if not p.refused]
    kills = sum(len(p.processes) + len(p.port_holders) for p in fine)
    paths = sum(p.removals for p in fine)
    text = f"Right now it would kill {plural(kills, 'process')} and remove {plural(paths, 'path')}"
    refused = len(seen) - len(fine)
    silent = len(plan.hosts) - len(seen)
    text += f"; {refused} refused" if refused else ""
    text += f"; {silent} did not answer" if silent else ""
    return clean(text + " (fleet cleanup --preview shows them).")
