"""`fleet push` and `fleet pull`: files to or from every selected host (fleet.transfer)."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from fleet.cli.common import CONTEXT, F, exit_with
from fleet.cli.options import options_from, run_options
from fleet.core.errors import ExitCode, FleetError, UsageError
from fleet.core.safetext import clean

if TYPE_CHECKING:
    from fleet.core.hosts import Host
    from fleet.ops.jobs import Settings
    from fleet.transfer import fanout


def _rate(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    from fleet.transfer.ratelimit import parse_rate

    try:
        return parse_rate(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def transfer_options(func: F) -> F:
    """The bandwidth caps, then fleet's usual run options."""
    options = [
        click.option(
            "--bwlimit-node",
            "per_node",
            metavar="RATE",
            callback=_rate,
            help="Cap per host, bytes/s: 50M, 800k, 1G (powers of 1000; Mi/Gi too).",
        ),
        click.option(
            "--bwlimit",
            "total",
            metavar="RATE",
            callback=_rate,
            help="Cap for all hosts together, bytes/s.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return run_options(func)


def _refuse_unsupported(opts: Settings) -> None:
    """--sudo, -K and -e mean nothing to a transfer: say so rather than ignore them."""
    if opts.run.sudo:
        raise UsageError(
            f"{opts.verb}: --sudo is not supported: files move as the SSH login user",
            hint="log in as a user who can read/write the paths (ansible_user), e.g. root",
        )
    if opts.ask.ask_become_pass or opts.vars:
        raise UsageError(f"{opts.verb}: -K and -e do not apply", hint="drop them")


def _confirm(opts: Settings, hosts: Sequence[Host], remote: str) -> None:
    """A push may overwrite files on many hosts: ask, as destructive verbs do (fleet.ops.jobs)."""
    if len(hosts) <= 1 or opts.ask.yes or opts.ask.dry_run:
        return
    from fleet.core import nodeset

    names = clean(nodeset.fold(h.name for h in hosts))
    if not sys.stdin.isatty():
        raise UsageError(
            f"push would write {remote} on {len(hosts)} hosts ({names}), overwriting what differs;"
            " no terminal to confirm",
            hint="pass --yes to confirm, or --dry-run to see what would move",
        )
    prompt = clean(f"Push to {remote} on {len(hosts)} hosts {names}, overwriting what differs?")
    if not opts.ask.confirm(prompt):
        raise FleetError("not confirmed; nothing was sent", hint="pass --yes to skip the question")


def _check_local(local: str) -> Path:
    """LOCAL of a push: a regular file or a directory, or a symlink the operator named to one
    (followed, as scp and cp -r follow a named one; links inside a tree are refused). Empty,
    missing, a dangling link, or a FIFO or device (which would send nothing, or block) is a
    usage error before anything connects."""
    if not local:
        raise UsageError("push: LOCAL is empty", hint="give a file or a directory; . for this one")
    try:
        mode = os.stat(local).st_mode
    except FileNotFoundError:
        raise UsageError(
            f"push: {local}: no such file or directory", hint="check the path"
        ) from None
    except OSError as exc:
        raise UsageError(f"push: {local}: {exc.strerror}", hint="check the path") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise UsageError(
            f"push: {local}: not a regular file or directory",
            hint="push a file or a directory tree (FIFOs and devices are not sent)",
        )
    from fleet.transfer import files

    try:
        files.follow_named(Path(local))
    except files.NotOurs as exc:
        raise UsageError(f"push: {exc}", hint="name what it points to by its own path") from None
    return Path(local)


def _check_localdir(localdir: str, dry_run: bool) -> Path:
    """LOCALDIR of a pull: a directory fleet can write in, or one it can create (the nearest
    existing directory on its path is writable). Checked before anything connects, so a bad
    one is one error rather than one per host; a dry run only looks."""
    if not localdir:
        raise UsageError("pull: LOCALDIR is empty", hint="give a directory; . for this one")
    path = Path(localdir)
    existing = next(p for p in (path, *path.parents) if p.exists() or p.is_symlink())
    hint = "give a directory to pull into (created if missing)"
    if not existing.is_dir():
        raise UsageError(f"pull: {existing}: not a directory", hint=hint)
    if dry_run:
        return path
    try:  # the one sure test: what the pull will do there (access() says yes to root in /proc)
        os.rmdir(tempfile.mkdtemp(prefix=".fleet-check-", dir=existing))
    except OSError as exc:
        raise UsageError(f"pull: cannot write in {existing}: {exc.strerror}", hint=hint) from None
    return path


def _from_home(verb: str, remote: str) -> str:
    """REMOTE with `~` and `~/` read as the login's home (fleet.transfer.paths.from_home)."""
    from fleet.transfer import paths

    try:
        return paths.from_home(remote)
    except paths.BadName as exc:
        raise UsageError(
            f"{verb}: {exc}", hint="e.g. /home/bob/x, or ~/x for the login's own home"
        ) from None


def _go(request: fanout.Request, opts: Settings, hosts: Sequence[Host]) -> NoReturn:
    from fleet.ops.jobs import ask_secrets
    from fleet.transfer import fanout

    secrets = ask_secrets(opts)
    summary = fanout.run(request, opts.run, hosts, secrets, dry_run=opts.ask.dry_run)
    exit_with(ExitCode(summary.exit_code))


@click.command(context_settings=CONTEXT)
@click.argument("local", type=click.Path())
@click.argument("remote")
@transfer_options
def push(local: str, remote: str, per_node: float | None, total: float | None, **kw: Any) -> None:
    """Copy LOCAL (a file or a directory tree) to REMOTE on every selected host.

    \b
    REMOTE is the path LOCAL becomes on each node; REMOTE ending in / means REMOTE/<name of
    LOCAL>. Every file is written beside its final name, fsynced, checked against the
    bastion's sha256 on the node and only then renamed; files already there with the same
    sha256 are skipped, and an interrupted push resumes. Local symlinks, FIFOs and devices
    are not sent, and a file swapped for one after LOCAL was listed fails. Files keep their
    permission bits, never setuid or setgid. --dry-run connects and lists what would move,
    writing nothing.
    """
    from fleet.ops.jobs import select
    from fleet.transfer import fanout

    opts = options_from(kw, output="last")
    _refuse_unsupported(opts)
    source = _check_local(local)
    if not remote.strip():
        raise UsageError("push: REMOTE is empty", hint="give the path on the nodes")
    remote = _from_home("push", remote)
    _, hosts = select(opts)
    _confirm(opts, hosts, remote)
    _go(fanout.Request("push", source, remote, per_node, total), opts, hosts)


@click.command(context_settings=CONTEXT)
@click.argument("remote")
@click.argument("localdir", type=click.Path())
@transfer_options
def pull(
    remote: str, localdir: str, per_node: float | None, total: float | None, **kw: Any
) -> None:
    """Copy REMOTE (a file or a directory tree) from every selected host to
    LOCALDIR/HOST/<name of REMOTE>.

    \b
    Never writes outside LOCALDIR/HOST: node names with `..` or `/` are refused, node symlinks
    are listed as refused and never followed, local paths are opened without following links.
    Files are written beside their final name, fsynced, checked against the node's sha256 and
    only then renamed; files already there with the same sha256 are skipped; an interrupted
    pull resumes from its part files. --dry-run connects and lists what would move, creating
    nothing. LOCALDIR must be a directory fleet can write in, or one it can create.
    """
    from fleet.ops.jobs import select
    from fleet.transfer import fanout, paths

    opts = options_from(kw, output="last")
    _refuse_unsupported(opts)
    remote = _from_home("pull", remote)
    try:
        paths.remote_name(remote)
    except paths.BadName as exc:
        raise UsageError(
            f"pull: {exc}", hint="e.g. fleet pull /data/run1/checkpoint-2 ./out"
        ) from None
    dest = _check_localdir(localdir, opts.ask.dry_run)
    _, hosts = select(opts)
    for host in hosts:
        try:
            paths.check_host_dir(host.name)
        except paths.BadName as exc:
            raise UsageError(f"pull: {exc}", hint="rename the host in the inventory") from None
    _go(fanout.Request("pull", dest, remote, per_node, total), opts, hosts)
