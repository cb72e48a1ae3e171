"""`fleet sandbox up | down | status`: the sandbox from the command line (root).

Only click is loaded here; each command imports the sandbox's machinery when it runs. Help
options and widths come from the `fleet` group these commands are registered under.
"""

from __future__ import annotations

from pathlib import Path

import click

from fleet.sandbox.defaults import DEFAULT_SUBNET, GHOST_PORT, default_dir


@click.group()
def sandbox() -> None:
    """A local fleet of real sshd nodes, each in its own namespaces, to try fleet on (root)."""


def _state_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """--dir as a Path; an empty one is refused, not taken as the current directory."""
    if value is None:
        return None
    if not value:
        raise click.BadParameter("is empty: name the sandbox's state directory")
    return Path(value)


_DIR = click.option(
    "--dir",
    "path",
    type=click.Path(),
    callback=_state_dir,
    help="Sandbox state directory, yours alone (see docs/tests.md) "
    "[default: $XDG_STATE_HOME/fleet/sandbox].",
)


@sandbox.command("up")
@click.option(
    "-n",
    "--nodes",
    "count",
    type=click.IntRange(1, 1000),
    default=4,
    show_default=True,
    help="The sandbox's size afterwards: node01..nodeNN (nodes already running are reused).",
)
@_DIR
@click.option(
    "--subnet",
    default=DEFAULT_SUBNET,
    show_default=True,
    help="Private subnet that exists only on the sandbox bridge.",
)
@click.option(
    "--ghosts",
    is_flag=True,
    help="Plant a dead run's leftovers on every node (training processes, torch state, "
    f"a listener on {GHOST_PORT}), so `fleet cleanup` has work to do.",
)
def up(count: int, path: Path | None, subnet: str, ghosts: bool) -> None:
    """Start (or grow) the sandbox and print how to point fleet at it."""
    from fleet.core import nodeset
    from fleet.sandbox.box import Sandbox
    from fleet.sandbox.ghosts import plant_ghosts

    box = Sandbox(path or default_dir(), subnet=subnet)
    nodes = box.up(count)
    if ghosts:
        for node in nodes:
            plant_ghosts(box, node)
    click.echo(
        f"sandbox: {len(nodes)} nodes up: {nodeset.fold(n.name for n in nodes)}"
        + (" (with a dead run's leftovers planted)" if ghosts else ""),
        err=True,
    )
    click.echo(f"export FLEET_INVENTORY={box.inventory_path}")
    click.echo(f"export FLEET_SSH_CONFIG={box.ssh_config_path}")


@sandbox.command("down")
@_DIR
def down(path: Path | None) -> None:
    """Stop the sandbox's nodes and remove its namespaces and bridge (exit 0, nothing made, when
    there is no state dir)."""
    from fleet.sandbox.box import Sandbox

    box = Sandbox(path or default_dir())
    if box.down():
        click.echo("sandbox: stopped", err=True)
    else:  # as `status` says "no nodes" there: nothing is wrong, and nothing is made
        click.echo(f"sandbox: nothing to stop: no sandbox in {box.state_dir}", err=True)


@sandbox.command("status")
@_DIR
def status(path: Path | None) -> None:
    """Show each sandbox node: alive, sshd listening (and say so when the last `up` failed)."""
    from fleet.sandbox.box import Sandbox

    box = Sandbox(path or default_dir())
    rows = box.status()
    if not rows:
        click.echo("sandbox: no nodes (start with: fleet sandbox up)")
    for node, alive, listening in rows:
        click.echo(
            f"{node.name:<10} {node.address:<15} {'up' if alive else 'down':<5} "
            f"sshd {'listening' if listening else 'not listening'}"
        )
    said = SANDBOX_STATES.get(box.recorded_status() or "")
    if said is not None:
        click.echo(f"sandbox: {said[0]}", err=True)
        click.echo(f"  hint: {said[1]}", err=True)


# What `status` adds, on stderr, when the sandbox as a whole needs a look.
SANDBOX_STATES = {
    "failed": (
        "the last `fleet sandbox up` failed: the nodes above are the ones it kept",
        "`fleet sandbox up` again heals it; `fleet sandbox down` removes whatever was started",
    ),
    "starting": (
        "an `up` is under way, or died before it ended",
        "wait for it; if none is running, `fleet sandbox down` removes whatever was started",
    ),
}
