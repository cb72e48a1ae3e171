"""`fleet cleanup` and `fleet kill-docker`: what a crashed run left behind, killed and removed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from fleet.cli.common import CONTEXT, exit_with, given, run_playbook
from fleet.cli.options import (
    Finite,
    options_from,
    run_options,
)
from fleet.core import defaults


@click.command(context_settings=CONTEXT)
@click.option(
    "--pattern",
    "patterns",
    multiple=True,
    metavar="ERE",
    help="Training process pattern (full command line, like pkill -f). Repeatable. "
    f"[default: {defaults.shown()}]",
)
@click.option(
    "--grace",
    type=Finite(0, 600),
    default=None,
    help=f"Seconds between SIGTERM and SIGKILL [default: {defaults.GRACE_S}].",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help=f"Rendezvous port to free [default: {defaults.PORT}].",
)
@click.option(
    "--kill-gpu-holders",
    is_flag=True,
    default=None,
    help="Also kill processes holding /dev/nvidia* that match no pattern.",
)
@click.option(
    "--preview",
    is_flag=True,
    help="Connect, look, and show per node which processes, paths, port holder and GPUs the "
    "cleanup would touch; change nothing.",
)
@run_options
def cleanup(
    patterns: Sequence[str],
    grace: float | None,
    port: int | None,
    kill_gpu_holders: bool | None,
    preview: bool,
    **kw: Any,
) -> None:
    """Clean nodes after a failed run: kill training processes (TERM, grace, KILL), reset idle
    GPUs, remove torch/CUDA state no process holds, free the rendezvous port, verify."""
    opts = options_from(kw)
    from fleet.engine.plan import parse_vars
    from fleet.ops.cleanup import cleanup_job
    from fleet.ops.jobs import perform, select

    overrides: dict[str, Any] = {}
    if patterns:
        overrides["patterns"] = list(patterns)
    if grace is not None:
        overrides["grace"] = grace
    if port is not None:
        overrides["port"] = port
    if kill_gpu_holders:
        overrides["kill_gpu_holders"] = True
    if preview:
        overrides["preview"] = True
    overrides.update(parse_vars(opts.vars))
    inventory, hosts = select(opts)
    exit_with(perform(opts, inventory, cleanup_job(opts, hosts, overrides, preview=preview)))


@click.command(name="kill-docker", context_settings=CONTEXT)
@click.option(
    "--container",
    "containers",
    multiple=True,
    metavar="NAME|ERE",
    help="Container name or anchored regex. Repeatable.",
)
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="KEY[=VALUE]",
    help="Label the container must carry. Repeatable.",
)
@click.option(
    "--image",
    "images",
    multiple=True,
    metavar="IMAGE[:TAG]",
    help="Image the container must run. Repeatable.",
)
@click.option(
    "--pattern",
    "patterns",
    multiple=True,
    metavar="ERE",
    help=f"Training process pattern inside containers. [default: {defaults.shown()}]",
)
@click.option(
    "--grace",
    type=Finite(0, 600),
    default=None,
    help=f"Seconds between SIGTERM and SIGKILL [default: {defaults.GRACE_S}].",
)
@click.option("--stop", is_flag=True, default=None, help="Also stop each selected container.")
@run_options
def kill_docker(
    containers: Sequence[str],
    labels: Sequence[str],
    images: Sequence[str],
    patterns: Sequence[str],
    grace: float | None,
    stop: bool | None,
    **kw: Any,
) -> None:
    """Kill training processes inside Docker containers (killing `docker exec` clients leaves
    them running): TERM, grace, KILL by pid inside each selected container."""
    opts = options_from(kw)
    from fleet.core.playbook import load_shipped
    from fleet.engine.plan import parse_vars

    overrides = given(
        containers=list(containers),
        labels=list(labels),
        images=list(images),
        patterns=list(patterns),
        grace=grace,
        stop=stop,
    )
    overrides.update(parse_vars(opts.vars))
    run_playbook(opts, load_shipped("kill-docker"), overrides)
