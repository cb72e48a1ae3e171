"""`fleet hosts` and `fleet playbooks`: what fleet would run on, and what it can run."""

from __future__ import annotations

import json
from pathlib import Path

import click

from fleet.cli.common import CONTEXT
from fleet.cli.options import (
    chosen_hosts,
    selection_options,
)


@click.command(context_settings=CONTEXT)
@selection_options
@click.option(
    "--log-dir",
    type=click.Path(path_type=Path),
    envvar="FLEET_LOG_DIR",
    help="Run records that -l @failed / @unreachable read [default ~/.local/state/fleet/runs].",
)
@click.option("--json", "json_", is_flag=True, help="Print JSON instead of a table.")
def hosts(
    inventory: tuple[Path, ...],
    nodes: tuple[str, ...],
    limit: str | None,
    playbook_dir: Path | None,
    debug: bool,
    log_dir: Path | None,
    json_: bool,
) -> None:
    """List the selected hosts: name, address, port, user, groups, and where each came from
    (inventory file:line, -w, hostfile:line)."""
    from fleet.core import nodeset

    inv, selected = chosen_hosts(inventory, nodes, limit, playbook_dir, log_dir)
    if json_:
        click.echo(
            json.dumps(
                [
                    {
                        "name": h.name,
                        "address": h.address,
                        "port": h.port or 22,
                        "user": h.user,
                        "groups": list(h.groups),
                        "source": str(h.origin) if h.origin else None,
                    }
                    for h in selected
                ],
                indent=2,
            )
        )
        return
    from rich.table import Table

    from fleet.output.console import Console
    from fleet.output.reporters import data, keep

    # Names, addresses, users and paths come from the inventory: data, never markup.
    table = Table(
        box=None,
        pad_edge=False,
        title_justify="left",
        title=data(
            f"{len(selected)} of {len(inv.hosts)} hosts: {nodeset.fold(h.name for h in selected)}"
        ),
    )
    rows = [
        (
            h.name,
            h.address,
            str(h.port or 22),
            h.user or "-",
            ",".join(h.groups),
            str(h.origin) if h.origin else "-",
        )
        for h in selected
    ]
    # Names, addresses, ports and users are never cut (sized on what is shown: escapes included);
    # groups and long source paths fold.
    for i, col in enumerate(("name", "address", "port", "user", "groups", "source")):
        if col in ("groups", "source"):
            table.add_column(col, overflow="fold")
        else:
            keep(table, col, [row[i] for row in rows])
    for row in rows:
        table.add_row(*(data(cell) for cell in row))
    Console().print(table)


@click.command(context_settings=CONTEXT)
def playbooks() -> None:
    """List the playbooks shipped with fleet."""
    from fleet.core.playbook import builtin_names, load_shipped

    for name in builtin_names():
        pb = load_shipped(name)
        click.echo(f"{name:<14} {pb.description.splitlines()[0] if pb.description else ''}")
