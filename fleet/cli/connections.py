"""`fleet connections` and `fleet disconnect`: the warm connections kept between commands
(fleet/ssh/warm.py), seen and ended."""

from __future__ import annotations

import json
from pathlib import Path

import click

from fleet.cli.common import CONTEXT
from fleet.cli.options import chosen_hosts, selection_options
from fleet.core.safetext import clean


@click.command(context_settings=CONTEXT)
@click.option("--json", "json_", is_flag=True, help="Print JSON instead of a table.")
def connections(json_: bool) -> None:
    """List the warm connections kept for your next commands: each keeper process (pid, age,
    CPU seconds) and the hosts it holds, how long each has been open and idle, and when it
    closes."""
    from fleet.ssh import warm

    keepers = warm.connections()
    if json_:
        click.echo(json.dumps(keepers, indent=2))
        return
    if not keepers:
        click.echo("no warm connections")
        return
    for keeper in keepers:
        held = keeper["connections"]
        click.echo(
            f"keeper pid {keeper['pid']}: {len(held)} connection(s), "
            f"up {keeper['age_s']:.0f}s, cpu {keeper['cpu_s']:.2f}s"
        )
        for conn in held:
            closes = "in use" if conn["in_use"] else f"closes in {conn['closes_in_s']:.0f}s"
            click.echo(
                f"  {clean(conn['host'])}  {clean(conn['user'])}@{clean(conn['address'])}:"
                f"{conn['port']}  age {conn['age_s']:.0f}s  idle {conn['idle_s']:.0f}s  {closes}"
            )


@click.command(context_settings=CONTEXT)
@selection_options
@click.option(
    "--log-dir",
    type=click.Path(path_type=Path),
    envvar="FLEET_LOG_DIR",
    help="Run records that -l @failed / @unreachable read [default ~/.local/state/fleet/runs].",
)
def disconnect(
    inventory: tuple[Path, ...],
    nodes: tuple[str, ...],
    limit: str | None,
    playbook_dir: Path | None,
    debug: bool,
    log_dir: Path | None,
) -> None:
    """End warm connections now: those to the hosts chosen with -l/-w, or all of them. A keeper
    left with none exits."""
    from fleet.ssh import warm

    names: set[str] | None = None
    if limit is not None or nodes:  # an empty -l is refused, not read as every host
        _, selected = chosen_hosts(inventory, nodes, limit, playbook_dir, log_dir)
        names = {h.name for h in selected}
    closed = warm.disconnect(names)
    if closed:
        from fleet.core import nodeset

        click.echo(f"closed {len(closed)} connection(s): {clean(nodeset.fold(closed))}")
    else:
        click.echo("no warm connections to close")
