"""`fleet janitor start|stop|status|run-once`: the checkpoint janitor on every node."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from fleet.cli.common import CONTEXT, F, exit_with, given, output_dir
from fleet.cli.options import (
    Finite,
    options_from,
    run_options,
)
from fleet.core import defaults


@click.group(context_settings=CONTEXT)
def janitor() -> None:
    """A background loop on every node deleting unwanted checkpoint files (ZeRO optimizer and
    model-state shards, scheduler, RNG state) under the output dir, to keep disks bounded."""


def janitor_options(func: F) -> F:
    """Options shared by the janitor subcommands."""
    options = [
        click.option(
            "--dir",
            "directory",
            metavar="PATH",
            help="Output dir on the nodes [default: inventory var output_dir].",
        ),
        click.option(
            "--interval",
            type=Finite(0.5, 3600),
            default=None,
            help=f"Seconds between passes [default: {defaults.JANITOR_INTERVAL_S}].",
        ),
        click.option(
            "--min-age",
            type=Finite(0, 86400),
            default=None,
            help="Never touch files modified in the last N seconds "
            f"[default: {defaults.JANITOR_MIN_AGE_S}].",
        ),
        click.option(
            "--delete",
            "delete_patterns",
            multiple=True,
            metavar="GLOB",
            help="File name pattern to delete (replaces the defaults). Repeatable.",
        ),
        click.option(
            "--keep",
            "keep_patterns",
            multiple=True,
            metavar="GLOB",
            help="File name pattern never deleted (replaces the defaults). Repeatable.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return run_options(func)


def _janitor(action: str, kw: dict[str, Any], destructive: bool, listing: bool = False) -> NoReturn:
    """Run the janitor playbook with ACTION; the subcommands differ only in that."""
    directory: str | None = kw.pop("directory")
    interval: float | None = kw.pop("interval")
    min_age: float | None = kw.pop("min_age")
    delete_patterns: Sequence[str] = kw.pop("delete_patterns")
    keep_patterns: Sequence[str] = kw.pop("keep_patterns")
    allow_weights: bool = kw.pop("allow_weights", False)
    opts = options_from(kw)
    from fleet.core.playbook import load_shipped
    from fleet.engine.plan import parse_vars
    from fleet.node.janitor import RESUME_WARNING
    from fleet.ops.jobs import perform, playbook_job, select

    if listing:  # `run-once --dry-run` asks the nodes what would go: read-only, so it connects
        opts = dataclasses.replace(opts, ask=dataclasses.replace(opts.ask, dry_run=False))
    inventory, hosts = select(opts)
    overrides: dict[str, Any] = {"action": action, **output_dir(opts, directory, hosts)}
    overrides.update(
        given(
            interval=interval,
            min_age=min_age,
            delete_patterns=list(delete_patterns),
            keep_patterns=list(keep_patterns),
            allow_weights=allow_weights or None,
        )
    )
    if listing:
        overrides["dry_run"] = True
    overrides.update(parse_vars(opts.vars))
    # Said after the checks (no warning about a trade not made), before the question.
    notice = RESUME_WARNING if action == "start" else ""
    job = playbook_job(
        opts, hosts, load_shipped("janitor"), overrides, confirm=destructive, notice=notice
    )
    exit_with(perform(opts, inventory, job))


ALLOW_WEIGHTS = click.option(
    "--allow-weights",
    is_flag=True,
    help="Let --delete globs take final model weights, configs and tokenizers "
    "(*.safetensors, pytorch_model*.bin, config.json...), refused otherwise.",
)


@janitor.command("start", context_settings=CONTEXT)
@ALLOW_WEIGHTS
@janitor_options
def janitor_start(**kw: Any) -> None:
    """Start the janitor on every node (a second start reports the running one)."""
    _janitor("start", kw, destructive=True)


@janitor.command("stop", context_settings=CONTEXT)
@janitor_options
def janitor_stop(**kw: Any) -> None:
    """Stop the janitor (and only it) on every node."""
    _janitor("stop", kw, destructive=False)


@janitor.command("status", context_settings=CONTEXT)
@janitor_options
def janitor_status(**kw: Any) -> None:
    """Running or not, pid, uptime, files deleted, bytes freed, free space on the output dir."""
    _janitor("status", kw, destructive=False)


@janitor.command("run-once", context_settings=CONTEXT)
@ALLOW_WEIGHTS
@janitor_options
def janitor_run_once(**kw: Any) -> None:
    """One pass now, in the foreground. With --dry-run: list what would be deleted (this asks
    the nodes, read-only), delete nothing."""
    listing = bool(kw.get("dry_run"))
    _janitor("run-once", kw, destructive=not listing, listing=listing)
