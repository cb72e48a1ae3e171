"""`fleet run PLAYBOOK` and `fleet exec COMMAND`: a playbook or one command on every host."""

from __future__ import annotations

from typing import Any

import click

from fleet.cli.common import CONTEXT, run_playbook
from fleet.cli.options import (
    Finite,
    options_from,
    run_options,
)
from fleet.core.errors import UsageError


@click.command(context_settings=CONTEXT)
@click.argument("playbook")
@run_options
def run(playbook: str, **kw: Any) -> None:
    """Run a playbook (a shipped name like 'cleanup', or a path) on the selected hosts."""
    opts = options_from(kw, output="gather")
    from fleet.core.playbook import load_playbook
    from fleet.engine.plan import parse_vars

    run_playbook(opts, load_playbook(playbook), parse_vars(opts.vars))


@click.command(name="exec", context_settings=CONTEXT)
@click.argument("command")
@click.option(
    "--timeout",
    "timeout_s",
    type=Finite(0),
    default=0,
    help="Seconds before the command is killed on the node (0: no limit).",
)
@run_options
def exec_(command: str, timeout_s: float, **kw: Any) -> None:
    """Run an ad-hoc shell COMMAND on the selected hosts."""
    opts = options_from(kw, output="gather")
    from fleet.core.playbook import adhoc
    from fleet.engine.plan import parse_vars

    if not command.strip():
        raise UsageError("exec: the command is empty", hint="e.g. fleet exec 'nvidia-smi -L'")
    playbook = adhoc(command, sudo=bool(opts.run.sudo), timeout_s=timeout_s or None)
    run_playbook(opts, playbook, parse_vars(opts.vars))
