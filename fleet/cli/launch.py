"""`fleet preflight`, `launch`, `stop`, `status` and `logs`: a training job's life on every node."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

import click

from fleet.cli.common import CONTEXT, exit_with, given, output_dir, run_playbook
from fleet.cli.options import (
    Finite,
    options_from,
    run_options,
    run_options_with,
)
from fleet.core import defaults


@click.command(context_settings=CONTEXT)
@click.option(
    "--dir",
    "directory",
    metavar="PATH",
    help="Output dir on the nodes [default: inventory var output_dir].",
)
@click.option(
    "--min-free-gb",
    type=Finite(0),
    default=None,
    help=f"Fail below this free space on the output dir [default: {defaults.MIN_FREE_GB}].",
)
@click.option(
    "--port",
    "master_port",
    type=click.IntRange(1, 65535),
    default=None,
    help=f"Master port that must be free on rank 0 [default: {defaults.PORT}].",
)
@run_options
def preflight(
    directory: str | None, min_free_gb: float | None, master_port: int | None, **kw: Any
) -> None:
    """Check every node before a launch: output dir writable and node-local (not NFS, not the
    container overlay), free space, master port free on rank 0, no leftovers, /dev/shm size."""
    opts = options_from(kw)
    from fleet.core.playbook import load_shipped
    from fleet.engine.plan import parse_vars
    from fleet.ops.jobs import perform, playbook_job, select

    inventory, hosts = select(opts)
    overrides = {
        **output_dir(opts, directory, hosts),
        **given(min_free_gb=min_free_gb, master_port=master_port),
    }
    overrides.update(parse_vars(opts.vars))
    job = playbook_job(opts, hosts, load_shipped("preflight"), overrides)
    exit_with(perform(opts, inventory, job))


# The command's words are its own from its first one on: `fleet launch train.py -n 4 -w 2` must
# not hand `-n` (--dry-run) and `-w` (the hosts) to fleet and launch `train.py 4` somewhere else.
@click.command(
    context_settings={**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option(
    "--master-addr",
    help="Rendezvous address [default: the first selected host's "
    "inventory var master_addr, else its address].",
)
@click.option(
    "--master-port",
    type=click.IntRange(1, 65535),
    default=None,
    help=f"Rendezvous port [default: {defaults.PORT}].",
)
@click.option(
    "--nproc-per-node",
    type=click.IntRange(1, 1024),
    default=None,
    help=f"Processes per node [default: inventory var gpus, else {defaults.NPROC_PER_NODE}].",
)
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="K=V",
    help="Extra environment for the job (after inventory var env). Repeatable.",
)
@click.option(
    "--launcher",
    metavar="CMD",
    help="The torchrun to start: a path or shell words, e.g. /opt/venv/bin/torchrun or "
    "'/opt/venv/bin/python -m torch.distributed.run' [default: inventory var launcher, else "
    f"{defaults.LAUNCHER}].",
)
@click.option("--container", help="Start the job inside this container (docker exec -d).")
@click.option("--workdir", help="Directory to start the job in, on the node.")
@click.option(
    "--run-id",
    "launch_id",
    help="Name of the training run on the nodes (its launch id) [default: a timestamped id].",
)
@click.option(
    "--dir",
    "directory",
    metavar="PATH",
    help="Output dir checked by preflight [default: inventory var output_dir].",
)
@click.option(
    "--playbook",
    "playbook_name",
    default="launch",
    show_default=True,
    help="Launch playbook (copy playbooks/launch.yaml to use another launcher).",
)
@click.option("--force", is_flag=True, help="Launch even if preflight fails.")
@click.option(
    "--cleanup",
    "with_cleanup",
    is_flag=True,
    help="Run `fleet cleanup` first (destructive: asked about, with --janitor, in one question).",
)
@click.option(
    "--janitor",
    "with_janitor",
    is_flag=True,
    help="Start the janitor too (destructive: warned and asked about as `fleet janitor start` "
    "is); a launch that fails stops the janitor where it started it.",
)
@run_options
def launch(
    command: Sequence[str],
    master_addr: str | None,
    master_port: int | None,
    nproc_per_node: int | None,
    env_pairs: Sequence[str],
    launcher: str | None,
    container: str | None,
    workdir: str | None,
    launch_id: str | None,
    directory: str | None,
    playbook_name: str,
    force: bool,
    with_cleanup: bool,
    with_janitor: bool,
    **kw: Any,
) -> None:
    """Start one training job on every selected node: `fleet launch -- python train.py ...`.

    \b
    Renders NODE_RANK, NNODES, NPROC_PER_NODE, MASTER_ADDR and MASTER_PORT into the command line
    (sshd drops environment variables) and runs it detached, logging to a file on each node.
    Preflight first (refuses on failure unless --force); all or nothing: if any node fails to
    start, the run is stopped on the nodes where it did start.
    """
    opts = options_from(kw)
    from fleet.core.playbook import load_playbook
    from fleet.engine.plan import parse_vars
    from fleet.ops import launch as launching
    from fleet.ops.jobs import perform, select

    # The launch id names a directory on every node: checked here, before anything runs.
    launch_id = launching.check_launch_id(launch_id) if launch_id is not None else None
    extra_vars = parse_vars(opts.vars)
    launching.refuse_launch_id_var(extra_vars)
    words = launching.command_words(command, env_pairs)
    inventory, hosts = select(opts)
    request = launching.LaunchRequest(
        command=words,
        launch_id=launch_id or launching.new_launch_id(),
        master_addr=master_addr,
        master_port=master_port,
        nproc_per_node=nproc_per_node,
        env_pairs=list(env_pairs),
        container=container,
        launcher=launching.check_launcher(launcher),
        workdir=workdir,
        output_dir=output_dir(opts, directory, hosts).get("output_dir"),
        playbook=load_playbook(playbook_name),
        force=force,
        cleanup=with_cleanup,
        janitor=with_janitor,
        extra_vars=extra_vars,
    )
    exit_with(perform(opts, inventory, launching.launch_job(request, opts, hosts)))


@click.command(context_settings=CONTEXT)
@click.option(
    "--run-id",
    "launch_id",
    help="The training run to stop, by launch id [default: each node's current run].",
)
@click.option(
    "--grace",
    type=Finite(0, 3600),
    default=None,
    help=f"Seconds between SIGTERM and SIGKILL [default: {defaults.STOP_GRACE_S}].",
)
@run_options
def stop(launch_id: str | None, grace: float | None, **kw: Any) -> None:
    """Stop the launched run on every node (each process of it: TERM, grace, KILL)."""
    opts = options_from(kw)
    from fleet.core.playbook import load_shipped
    from fleet.engine.plan import parse_vars
    from fleet.ops.launch import check_given_launch_id, stop_playbook

    overrides = given(run_id=launch_id, grace=grace)
    overrides.update(parse_vars(opts.vars))
    check_given_launch_id(overrides)
    run_playbook(
        opts,
        load_shipped("stop"),
        overrides,
        fit=lambda playbook, hosts: stop_playbook(playbook, hosts, overrides),
    )


@click.command(context_settings=CONTEXT)
@click.option(
    "--pattern",
    "patterns",
    multiple=True,
    metavar="ERE",
    help=f"Training process pattern. Repeatable. [default: {defaults.shown()}]",
)
@click.option(
    "--dir",
    "directory",
    metavar="PATH",
    help="Output dir whose free space is shown [default: inventory var output_dir].",
)
@click.option(
    "--watch",
    "watch_s",
    type=Finite(0.5, 3600),
    is_flag=False,
    flag_value=defaults.WATCH_INTERVAL_S,
    default=None,
    metavar="[SECONDS]",
    help=f"Refresh the table in place every SECONDS (default {defaults.WATCH_INTERVAL_S:g}) "
    "until Ctrl-C, one SSH connection per node kept open.",
)
@run_options
def status(
    patterns: Sequence[str], directory: str | None, watch_s: float | None, **kw: Any
) -> None:
    """Per node: the launched run (pid, alive, uptime), training processes, GPU memory and
    utilisation, janitor state, free disk on the output dir."""
    opts = options_from(kw)
    from fleet.engine.plan import parse_vars
    from fleet.ops.jobs import perform, select
    from fleet.ops.status import status_job

    overrides = given(patterns=list(patterns), output_dir=directory)
    overrides.update(parse_vars(opts.vars))
    if watch_s is not None:
        from fleet.ops.watch import run_watch

        exit_with(run_watch(opts, overrides, watch_s))
    inventory, hosts = select(opts)
    exit_with(perform(opts, inventory, status_job(opts, hosts, overrides)))


@click.command(context_settings=CONTEXT)
@click.option(
    "-n",
    "--lines",
    type=click.IntRange(0),
    default=defaults.LOG_LINES,
    show_default=True,
    help="Lines to show from the end of each node's log.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep following every node's log until Ctrl-C.")
@click.option(
    "--run-id",
    "launch_id",
    help="The training run, by launch id [default: each node's current run].",
)
@functools.partial(run_options_with, short=False)
def logs(lines: int, follow: bool, launch_id: str | None, **kw: Any) -> None:
    """The last lines of the launched run's log on every node, prefixed by host."""
    opts = options_from(kw)

    from fleet.core.playbook import load_shipped
    from fleet.engine.plan import parse_vars
    from fleet.ops.launch import check_given_launch_id
    from fleet.output.plain import LinesReporter
    from fleet.output.printer import printer_for

    overrides = {"lines": lines, "follow": follow, **given(run_id=launch_id)}
    overrides.update(parse_vars(opts.vars))
    check_given_launch_id(overrides)
    reporters = None if opts.json else [LinesReporter(sys.stdout, printer_for(sys.stderr))]
    # Ctrl-C is how one stops following: not an error.
    run_playbook(opts, load_shipped("logs"), overrides, reporters=reporters, interrupt_ends=follow)
