"""`fleet checkpoints` (the audit) and `fleet checkpoints consolidate` (fleet.checkpoints)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from fleet.cli.common import CONTEXT, exit_with
from fleet.cli.options import options_from, run_options
from fleet.core.errors import ExitCode, UsageError
from fleet.core.safetext import clean

if TYPE_CHECKING:
    from fleet.core.hosts import Host
    from fleet.ops.jobs import Settings


def _refuse_dry_run(dry_run: bool) -> None:
    """The audit only reads: a dry run of it would have nothing to leave out (consolidate's
    --dry-run is the one that means something: the audit, then what would be copied)."""
    if dry_run:
        raise UsageError(
            "--dry-run: `fleet checkpoints` has no plan to print (the audit only reads)",
            hint="run the audit itself: it changes nothing on the nodes; "
            "`fleet checkpoints consolidate TAG --dry-run` shows what a consolidation would copy",
        )


def _refuse_unsupported(opts: Settings) -> None:
    """--sudo and -e mean nothing here: say so rather than ignore them (as push/pull do)."""
    if opts.run.sudo:
        raise UsageError(
            f"{opts.verb}: --sudo is not supported: checkpoints are read and copied as the SSH "
            "login user",
            hint="log in as a user who can read the output dir (ansible_user), e.g. root",
        )
    if opts.vars:
        raise UsageError(f"{opts.verb}: -e/--var does not apply", hint="drop it")


def _dirs(directory: str | None, hosts: Sequence[Host]) -> dict[str, str]:
    """`--dir` wins; else every selected host's `output_dir` from the inventory."""
    if directory:
        return {h.name: directory for h in hosts}
    missing = [h.name for h in hosts if not h.vars.get("output_dir")]
    if missing:
        from fleet.core import nodeset

        raise UsageError(
            f"no output dir for {nodeset.fold(missing)}",
            hint="pass --dir /path/on/the/nodes, or set output_dir in the inventory",
        )
    return {h.name: str(h.vars["output_dir"]) for h in hosts}


def _files(files: tuple[str, ...]) -> str:
    """ "N files, " when zero_to_fp32.py sharded the model (an index and its shards)."""
    return f"{len(files)} files, " if len(files) > 1 else ""


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
    HF Trainer and Lightning checkpoint dirs, adapters. Exit 0 only when every node has the
    dir and every tag is whole."""
    if ctx.invoked_subcommand is not None:
        return
    from fleet.checkpoints.audit import run_audit
    from fleet.ops.jobs import ask_secrets, select

    opts = options_from(kw)
    _refuse_unsupported(opts)
    _refuse_dry_run(opts.ask.dry_run)
    _inventory, hosts = select(opts)
    dirs = _dirs(directory, hosts)
    exit_with(run_audit(opts.run, hosts, dirs, not no_crc, ask_secrets(opts)))


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
    """Gather TAG's shards from every node into one directory on HOST, each streamed through
    the bastion (never written to its disk) and verified by sha256 on both nodes, then run the
    zero_to_fp32.py DeepSpeed wrote there and report the file it made.

    \b
    Refused, naming the ranks, unless the audit finds TAG whole. A rerun skips every file HOST
    already holds verified, so an interrupted consolidation resumes. --dry-run runs the audit
    and lists every file that would be copied (from which node, to where; or skipped: already
    there) and the zero_to_fp32.py command, changing nothing.
    """
    from fleet.checkpoints.analysis import size_text
    from fleet.checkpoints.consolidate import DryRun
    from fleet.checkpoints.consolidate import consolidate as run
    from fleet.ops.jobs import ask_secrets, select

    opts = options_from(kw)
    _refuse_unsupported(opts)
    _inventory, hosts = select(opts)
    dirs = _dirs(directory, hosts)
    dry_run = opts.ask.dry_run
    made = run(opts.run, hosts, dirs, tag, destination, python, ask_secrets(opts), dry_run=dry_run)
    copies = [
        {"host": c.host, "source": c.source, "target": c.target, "action": c.action, "size": c.size}
        for c in made.copies
    ]
    doc: dict[str, Any]
    if isinstance(made, DryRun):
        if opts.json:
            doc = {"event": "ConsolidationPlan", "tag": tag, "host": made.host}
            doc |= {"copies": copies, "command": made.command}
            sys.stdout.write(json.dumps(doc) + "\n")
        else:
            for c in made.copies:
                click.echo(
                    clean(f"{c.action}: {c.host}:{c.source} -> {made.host}:{c.target}")
                    + f" ({size_text(c.size)})"
                )
            click.echo(clean(f"would run on {made.host}: {made.command}"))
        exit_with(ExitCode.OK)
    if opts.json:
        doc = {"event": "Consolidated", "tag": tag, "host": made.host, "path": made.path}
        doc |= {"size": made.size, "tensors": made.tensors, "files": list(made.files)}
        doc |= {"copies": copies}
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        done = sum(c.action != "skipped" for c in made.copies)
        click.echo(
            clean(
                f"consolidated {tag}: {made.host}:{made.path} "
                f"({_files(made.files)}{size_text(made.size)}, {made.tensors} tensors; "
                f"{done} files copied, {len(made.copies) - done} already there)"
            )
        )
    exit_with(ExitCode.OK)
