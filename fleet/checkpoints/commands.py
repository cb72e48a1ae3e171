"""`fleet checkpoints` (the audit) and `fleet checkpoints consolidate`: click declarations."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from fleet import nodeset
from fleet.cli import CONTEXT, _options, run_options
from fleet.errors import ExitCode, UsageError
from fleet.inventory import Host
from fleet.runner import select_hosts
from fleet.verbs import ask_secrets


def _exit(code: ExitCode) -> NoReturn:
    sys.exit(int(code))


def _refuse_dry_run(dry_run: bool) -> None:
    """These verbs build no plan of commands to show: a dry run would have to act or lie."""
    if dry_run:
        raise UsageError(
            "--dry-run: `fleet checkpoints` has no plan to print (the audit only reads)",
            hint="run the audit itself: it changes nothing on the nodes",
        )


def _dirs(directory: str | None, hosts: Sequence[Host]) -> dict[str, str]:
    """`--dir` wins; else every selected host's `output_dir` from the inventory."""
    if directory:
        return {h.name: directory for h in hosts}
    missing = [h.name for h in hosts if not h.vars.get("output_dir")]
    if missing:
        raise UsageError(
            f"no output dir for {nodeset.fold(missing)}",
            hint="pass --dir /path/on/the/nodes, or set output_dir in the inventory",
        )
    return {h.name: str(h.vars["output_dir"]) for h in hosts}


def _dir_option(func: Any) -> Any:
    return click.option(
        "--dir",
        "directory",
        metavar="PATH",
        help="The training's output dir on the nodes [default: inventory var output_dir].",
    )(func)


@click.group(invoke_without_command=True, context_settings=CONTEXT)
@_dir_option
@click.option(
    "--no-crc", is_flag=True, help="Skip the node-side zip CRC check (it reads every shard whole)."
)
@run_options
@click.pass_context
def checkpoints(ctx: click.Context, /, directory: str | None, no_crc: bool, **kw: Any) -> None:
    """What the run saved, on every node and across them: DeepSpeed tags and their ranks,
    HF Trainer and Lightning checkpoint dirs, adapters. Exit 0 only when every tag is whole."""
    if ctx.invoked_subcommand is not None:
        return
    from fleet.checkpoints.audit import run_audit

    opts = _options(kw)
    _inventory, hosts = select_hosts(opts)
    _refuse_dry_run(opts.dry_run)
    dirs = _dirs(directory, hosts)
    _exit(run_audit(opts, hosts, dirs, not no_crc, ask_secrets(opts)))


@checkpoints.command(context_settings=CONTEXT)
@click.argument("tag")
@_dir_option
@click.option("--to", "destination", required=True, metavar="HOST:PATH", help="Where to gather.")
@click.option(
    "--python",
    default="python3",
    show_default=True,
    help="The python on HOST that runs zero_to_fp32.py (torch, deepspeed, huggingface_hub).",
)
@run_options
def consolidate(tag: str, directory: str | None, destination: str, python: str, **kw: Any) -> None:
    """Gather TAG's shards from every node into one directory on HOST (verified), run the
    zero_to_fp32.py DeepSpeed wrote there, report the file it made."""
    from fleet.checkpoints.audit import size_text
    from fleet.checkpoints.consolidate import consolidate as run
    from fleet.safetext import clean

    opts = _options(kw)
    _inventory, hosts = select_hosts(opts)
    _refuse_dry_run(opts.dry_run)
    dirs = _dirs(directory, hosts)
    made = run(opts, hosts, dirs, tag, destination, python, ask_secrets(opts))
    if opts.json:
        sys.stdout.write(
            json.dumps(
                {
                    "event": "Consolidated",
                    "tag": tag,
                    "host": made.host,
                    "path": made.path,
                    "size": made.size,
                    "tensors": made.tensors,
                }
            )
            + "\n"
        )
    else:
        click.echo(
            clean(
                f"consolidated {tag}: {made.host}:{made.path} "
                f"({size_text(made.size)}, {made.tensors} tensors)"
            )
        )
    _exit(ExitCode.OK)


def group() -> click.Group:
    """The `fleet checkpoints` group, for fleet.cli to register."""
    return checkpoints
