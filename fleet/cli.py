"""The `fleet` command line: click commands only. Maps every error to a documented exit code."""

from __future__ import annotations

import getpass
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from fleet import __version__, nodeset
from fleet.errors import ExitCode, FleetError, UsageError
from fleet.inventory import Inventory, load_inventory
from fleet.plan import Plan, build_plan, parse_vars
from fleet.playbook import Playbook, adhoc, builtin_names, load_playbook

F = TypeVar("F", bound=Callable[..., Any])
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@dataclass
class Options:
    """The options every run-type command shares."""

    inventory: Path | None = None
    limit: str | None = None
    ssh_config: Path | None = None
    host_keys: str | None = None
    forks: int = 32
    plain: bool = False
    json: bool = False
    log_dir: Path | None = None
    connect_timeout_s: float = 10.0
    ask_become_pass: bool = False
    sudo: bool | None = None
    dry_run: bool = False
    yes: bool = False
    debug: bool = False
    vars: list[str] = field(default_factory=list)


def selection_options(func: F) -> F:
    """Options that choose hosts (shared by `hosts` and every run-type command)."""
    options = [
        click.option(
            "-i",
            "--inventory",
            type=click.Path(path_type=Path),
            envvar="FLEET_INVENTORY",
            help="Inventory file [env FLEET_INVENTORY; default ./inventory.yaml].",
        ),
        click.option(
            "-l",
            "--limit",
            metavar="PATTERN",
            help="Hosts to act on: names, groups, globs, ranges; 'a,b' union, '&g' "
            "intersection, '!g' exclusion.",
        ),
        click.option("--debug", is_flag=True, help="Show tracebacks and paramiko's own logs."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def run_options(func: F) -> F:
    """Options of every command that runs steps on hosts."""
    options = [
        click.option(
            "-F",
            "--ssh-config",
            type=click.Path(path_type=Path),
            envvar="FLEET_SSH_CONFIG",
            help="OpenSSH client config [env FLEET_SSH_CONFIG; default ~/.ssh/config].",
        ),
        click.option(
            "--host-keys",
            type=click.Choice(["strict", "accept-new"]),
            default=None,
            help="Unknown host keys: reject (strict, default) or record on first use.",
        ),
        click.option(
            "-f",
            "--forks",
            type=click.IntRange(1, 1024),
            default=32,
            show_default=True,
            help="Hosts worked on at once.",
        ),
        click.option("--plain", is_flag=True, help="One line per event instead of the live table."),
        click.option(
            "--json", "json_", is_flag=True, help="JSON lines, one per event, then a summary."
        ),
        click.option(
            "--log-dir",
            type=click.Path(path_type=Path),
            envvar="FLEET_LOG_DIR",
            help="Where run records go [default ~/.local/state/fleet/runs].",
        ),
        click.option(
            "--connect-timeout",
            type=click.FloatRange(0.1, 600),
            default=10.0,
            show_default=True,
            help="Seconds to wait for TCP connect (banner/auth: 15 s).",
        ),
        click.option(
            "-K",
            "--ask-become-pass",
            is_flag=True,
            help="Ask once for the sudo password and feed it to every host.",
        ),
        click.option(
            "--sudo/--no-sudo",
            "sudo",
            default=None,
            help="Force every step to run with (or without) sudo.",
        ),
        click.option(
            "-n", "--dry-run", is_flag=True, help="Print what would run where; connect nowhere."
        ),
        click.option("-y", "--yes", is_flag=True, help="Do not ask before destructive runs."),
        click.option(
            "-e",
            "--var",
            "vars_",
            multiple=True,
            metavar="NAME=VALUE",
            help="Set a variable (wins over inventory and playbook). Repeatable.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return selection_options(func)


def _options(kw: dict[str, Any]) -> Options:
    """Collect the shared options out of a command's keyword arguments."""
    return Options(
        inventory=kw.pop("inventory", None),
        limit=kw.pop("limit", None),
        ssh_config=kw.pop("ssh_config", None),
        host_keys=kw.pop("host_keys", None),
        forks=kw.pop("forks", 32),
        plain=kw.pop("plain", False),
        json=kw.pop("json_", False),
        log_dir=kw.pop("log_dir", None),
        connect_timeout_s=kw.pop("connect_timeout", 10.0),
        ask_become_pass=kw.pop("ask_become_pass", False),
        sudo=kw.pop("sudo", None),
        dry_run=kw.pop("dry_run", False),
        yes=kw.pop("yes", False),
        debug=kw.pop("debug", False),
        vars=list(kw.pop("vars_", ())),
    )


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="fleet")
def cli() -> None:
    """Run steps on many GPU training nodes over SSH, in parallel, and see every node's state.

    \b
    Exit codes: 0 all ok · 1 fleet error (inventory, playbook, config) · 2 usage
                3 a step failed on some host · 4 a host unreachable or timed out · 130 interrupted
    """


# ---------------------------------------------------------------- hosts / playbooks


@cli.command(context_settings=CONTEXT)
@selection_options
@click.option("--json", "json_", is_flag=True, help="Print JSON instead of a table.")
def hosts(inventory: Path | None, limit: str | None, debug: bool, json_: bool) -> None:
    """List the selected hosts: name, address, port, user, groups."""
    inv = load_inventory(inventory)
    selected = inv.select(limit)
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
                    }
                    for h in selected
                ],
                indent=2,
            )
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        box=None,
        pad_edge=False,
        title_justify="left",
        title=f"{len(selected)} of {len(inv.hosts)} hosts: {nodeset.fold(h.name for h in selected)}",
    )
    for col in ("name", "address", "port", "user", "groups"):
        table.add_column(col, no_wrap=col != "groups")
    for h in selected:
        table.add_row(h.name, h.address, str(h.port or 22), h.user or "-", ",".join(h.groups))
    Console().print(table)


@cli.command(context_settings=CONTEXT)
def playbooks() -> None:
    """List the playbooks shipped with fleet."""
    for name in builtin_names():
        pb = load_playbook(name)
        click.echo(f"{name:<14} {pb.description.splitlines()[0] if pb.description else ''}")


# ---------------------------------------------------------------- run-type commands


@cli.command(context_settings=CONTEXT)
@click.argument("playbook")
@run_options
def run(playbook: str, **kw: Any) -> None:
    """Run a playbook (a shipped name like 'cleanup', or a path) on the selected hosts."""
    opts = _options(kw)
    _exit(execute(opts, load_playbook(playbook), parse_vars(opts.vars)))


@cli.command(name="exec", context_settings=CONTEXT)
@click.argument("command")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(0),
    default=0,
    help="Seconds before the command is killed on the node (0: no limit).",
)
@run_options
def exec_(command: str, timeout_s: float, **kw: Any) -> None:
    """Run an ad-hoc shell COMMAND on the selected hosts."""
    opts = _options(kw)
    if not command.strip():
        raise UsageError("exec: the command is empty", hint="e.g. fleet exec 'nvidia-smi -L'")
    playbook = adhoc(command, sudo=bool(opts.sudo), timeout_s=timeout_s or None)
    _exit(execute(opts, playbook, parse_vars(opts.vars)))


@cli.command(context_settings=CONTEXT)
@click.option(
    "--pattern",
    "patterns",
    multiple=True,
    metavar="ERE",
    help="Training process pattern (full command line, like pkill -f). Repeatable. "
    "[default: torchrun, train.py]",
)
@click.option(
    "--grace",
    type=click.FloatRange(0, 600),
    default=None,
    help="Seconds between SIGTERM and SIGKILL [default: 10].",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Rendezvous port to free [default: 39500].",
)
@click.option(
    "--kill-gpu-holders",
    is_flag=True,
    default=None,
    help="Also kill processes holding /dev/nvidia* that match no pattern.",
)
@run_options
def cleanup(
    patterns: Sequence[str],
    grace: float | None,
    port: int | None,
    kill_gpu_holders: bool | None,
    **kw: Any,
) -> None:
    """Clean nodes after a failed run: kill training processes (TERM, grace, KILL), reset idle
    GPUs, remove torch/CUDA state no process holds, free the rendezvous port, verify."""
    opts = _options(kw)
    overrides: dict[str, Any] = {}
    if patterns:
        overrides["patterns"] = list(patterns)
    if grace is not None:
        overrides["grace"] = grace
    if port is not None:
        overrides["port"] = port
    if kill_gpu_holders:
        overrides["kill_gpu_holders"] = True
    overrides.update(parse_vars(opts.vars))
    _exit(execute(opts, load_playbook("cleanup"), overrides))


# ---------------------------------------------------------------- the engine, wired


def execute(opts: Options, playbook: Playbook, overrides: dict[str, Any]) -> ExitCode:
    """Inventory -> plan -> (confirm) -> executor -> reporters -> exit code."""
    inventory = load_inventory(opts.inventory)
    selected = inventory.select(opts.limit)
    if opts.sudo is not None:
        playbook = _force_sudo(playbook, opts.sudo)
    plan = build_plan(selected, playbook, overrides, password_on_stdin=opts.ask_become_pass)
    if opts.dry_run:
        _print_dry_run(plan, inventory, opts.json)
        return ExitCode.OK
    _confirm(plan, opts)
    password = _ask_password() if opts.ask_become_pass else None
    return _run(plan, opts, password)


def _force_sudo(playbook: Playbook, sudo: bool) -> Playbook:
    """--sudo / --no-sudo overrides every step's own setting."""
    import dataclasses

    steps = tuple(dataclasses.replace(s, sudo=sudo) for s in playbook.steps)
    return dataclasses.replace(playbook, steps=steps)


def _print_dry_run(plan: Plan, inventory: Inventory, as_json: bool) -> None:
    """Every command for every host, exactly as it would be sent; nothing connects."""
    if as_json:
        for hp in plan.hosts:
            click.echo(
                json.dumps(
                    {
                        "host": hp.host.name,
                        "target": hp.host.target,
                        "steps": [
                            {
                                "name": ps.step.name,
                                "command": ps.cmd.display,
                                "sent": ps.cmd.command,
                                "stdin": ps.step.script_name,
                                "sudo": ps.cmd.sudo,
                                "timeout_s": ps.cmd.timeout_s,
                            }
                            for ps in hp.steps
                        ],
                    }
                )
            )
        return
    click.echo(
        f"dry run: {plan.playbook.name} on {len(plan.hosts)} hosts "
        f"{nodeset.fold(plan.host_names)} (from {inventory.path}); nothing connects\n"
    )
    for hp in plan.hosts:
        click.echo(click.style(f"{hp.host.name}", bold=True) + f"  ({hp.host.target})")
        for i, ps in enumerate(hp.steps, 1):
            extras = [
                x
                for x in (
                    "sudo" if ps.cmd.sudo else "",
                    f"timeout {ps.cmd.timeout_s:g}s" if ps.cmd.timeout_s else "",
                    "continue on error" if ps.step.on_error.value == "continue" else "",
                )
                if x
            ]
            click.echo(f"  {i}. {ps.step.name}" + (f"  [{', '.join(extras)}]" if extras else ""))
            click.echo(f"     $ {ps.cmd.display}")
        click.echo()


def _confirm(plan: Plan, opts: Options) -> None:
    """Destructive playbooks on more than one host ask first (refuse when no terminal can answer)."""
    if not plan.playbook.confirm or len(plan.hosts) <= 1 or opts.yes:
        return
    names = nodeset.fold(plan.host_names)
    if not sys.stdin.isatty():
        raise UsageError(
            f"'{plan.playbook.name}' is destructive and would run on {len(plan.hosts)} hosts "
            f"({names}); no terminal to confirm",
            hint="pass --yes to confirm, or --dry-run to see what would run",
        )
    prompt = f"Run '{plan.playbook.name}' on {len(plan.hosts)} hosts {names}?"
    if not click.confirm(prompt, default=False, err=True):
        raise FleetError("not confirmed; nothing was run", hint="pass --yes to skip the question")


def _ask_password() -> str:
    """Prompt once, locally, without echo (never from worker threads: PITFALLS 16)."""
    try:
        return getpass.getpass("sudo password (sent to every host, never shown or logged): ")
    except EOFError:
        raise UsageError(
            "-K needs a terminal to read the sudo password from",
            hint="run interactively, or configure NOPASSWD sudo for fleet's steps",
        ) from None


def _reporters(opts: Options, plan: Plan) -> list[Any]:
    """Live table on a terminal; plain lines off one (or --plain); JSON lines with --json."""
    from rich.console import Console

    from fleet.reporters import JsonReporter, LiveReporter, PlainReporter

    if opts.json:
        return [JsonReporter(sys.stdout)]
    console = Console(highlight=False)
    if opts.plain or not sys.stdout.isatty():
        return [PlainReporter(sys.stdout, console)]
    return [LiveReporter(console, step_count=len(plan.playbook.steps))]


def _run(plan: Plan, opts: Options, password: str | None) -> ExitCode:
    """Execute the plan with Ctrl-C semantics: first cancels (and stops remote commands), second aborts."""
    from fleet import runlog
    from fleet.events import RunFinished, RunStarted
    from fleet.executor import Run
    from fleet.transport import ConnectFailed, SSHOptions, SSHTransport

    transport = SSHTransport(
        SSHOptions(
            ssh_config=opts.ssh_config,
            host_keys=opts.host_keys,
            connect_timeout_s=opts.connect_timeout_s,
            sudo_password=password,
        ),
        debug=opts.debug,
    )
    run_id = runlog.new_run_id(plan.playbook.name)
    record = runlog.RunRecord(opts.log_dir or runlog.default_base(), run_id)
    handlers: list[Any] = [record, *_reporters(opts, plan)]

    def dispatch(event: Any) -> None:
        for h in handlers:
            h.handle(event)

    started = time.monotonic()
    dispatch(
        RunStarted(
            run_id=run_id,
            playbook=plan.playbook.name,
            hosts=tuple(plan.host_names),
            forks=opts.forks,
            run_dir=str(record.dir),
        )
    )
    run = Run(
        plan=plan,
        transport=transport,
        forks=opts.forks,
        sudo_password=password,
        connect_errors=(ConnectFailed,),
    )
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    interrupted = False
    try:
        threads = run.start()
        try:
            for event in run.drain(threads):
                dispatch(event)
        except KeyboardInterrupt:
            interrupted = True
            run.cancel.set()
            click.echo(
                "\nfleet: cancelling: no new steps; stopping remote commands "
                "(Ctrl-C again to abort at once)",
                err=True,
            )
            deadline = time.monotonic() + 20
            try:
                for event in run.drain(threads):
                    dispatch(event)
                    if time.monotonic() > deadline:
                        break
            except KeyboardInterrupt:
                for h in handlers:
                    h.close()
                os._exit(int(ExitCode.INTERRUPTED))
        summary = run.summary(run_id, started, interrupted, str(record.dir))
        dispatch(RunFinished(summary=summary))
    finally:
        signal.signal(signal.SIGTERM, previous)
        for h in handlers:
            h.close()
        transport.close()
    return summary.exit_code


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM (a scheduler or `timeout` stopping fleet) cancels like Ctrl-C."""
    raise KeyboardInterrupt


# ---------------------------------------------------------------- sandbox


@cli.group(context_settings=CONTEXT)
def sandbox() -> None:
    """A local fleet of real sshd nodes (network/PID/mount namespaces) to try fleet on. Needs root."""


def _sandbox_dir(path: Path | None) -> Path:
    if path:
        return path
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "fleet" / "sandbox"


@sandbox.command("up", context_settings=CONTEXT)
@click.option("-n", "--nodes", "count", type=click.IntRange(1, 1000), default=4, show_default=True)
@click.option("--dir", "path", type=click.Path(path_type=Path), help="Sandbox state directory.")
@click.option(
    "--subnet",
    default="10.251.0.0/16",
    show_default=True,
    help="Private subnet that exists only on the sandbox bridge.",
)
@click.option(
    "--ghosts",
    is_flag=True,
    help="Plant a dead run's leftovers on every node (training processes, torch state, "
    "a listener on 39500), so `fleet cleanup` has work to do.",
)
def sandbox_up(count: int, path: Path | None, subnet: str, ghosts: bool) -> None:
    """Start (or grow) the sandbox and print how to point fleet at it."""
    from fleet.sandbox import Sandbox, SandboxError

    box = Sandbox(_sandbox_dir(path), subnet=subnet)
    try:
        nodes = box.up(count)
        if ghosts:
            from fleet.ghosts import plant_ghosts

            for node in nodes:
                plant_ghosts(box, node)
    except SandboxError as exc:
        raise FleetError(str(exc), hint=getattr(exc, "hint", "")) from None
    click.echo(
        f"sandbox: {len(nodes)} nodes up: {nodeset.fold(n.name for n in nodes)}"
        + (" (with a dead run's leftovers planted)" if ghosts else ""),
        err=True,
    )
    click.echo(f"export FLEET_INVENTORY={box.inventory_path}")
    click.echo(f"export FLEET_SSH_CONFIG={box.ssh_config_path}")


@sandbox.command("down", context_settings=CONTEXT)
@click.option("--dir", "path", type=click.Path(path_type=Path), help="Sandbox state directory.")
def sandbox_down(path: Path | None) -> None:
    """Stop the sandbox's nodes and remove its namespaces and bridge."""
    from fleet.sandbox import Sandbox, SandboxError

    try:
        Sandbox(_sandbox_dir(path)).down()
    except SandboxError as exc:
        raise FleetError(str(exc), hint=getattr(exc, "hint", "")) from None
    click.echo("sandbox: stopped", err=True)


@sandbox.command("status", context_settings=CONTEXT)
@click.option("--dir", "path", type=click.Path(path_type=Path), help="Sandbox state directory.")
def sandbox_status(path: Path | None) -> None:
    """Show each sandbox node: alive, sshd listening."""
    from fleet.sandbox import Sandbox, SandboxError

    try:
        rows = Sandbox(_sandbox_dir(path)).status()
    except SandboxError as exc:
        raise FleetError(str(exc), hint=getattr(exc, "hint", "")) from None
    if not rows:
        click.echo("sandbox: no nodes (start with: fleet sandbox up)")
    for node, alive, listening in rows:
        click.echo(
            f"{node.name:<10} {node.address:<15} {'up' if alive else 'down':<5} "
            f"sshd {'listening' if listening else 'not listening'}"
        )


# ---------------------------------------------------------------- entry point


def _exit(code: ExitCode) -> NoReturn:
    raise SystemExit(int(code))


def _error(message: str, hint: str = "") -> None:
    click.echo(click.style("fleet: error: ", fg="red", bold=True) + message, err=True)
    if hint:
        click.echo(f"  hint: {hint}", err=True)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console entry point: one line + hint for every user error, a traceback only with --debug."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or bool(os.environ.get("FLEET_DEBUG"))
    try:
        cli.main(args=args, prog_name="fleet", standalone_mode=False)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.exit(code)
    except click.exceptions.Abort:
        click.echo("\nfleet: aborted", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except FleetError as exc:
        if debug:
            raise
        _error(exc.message, exc.hint)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        click.echo("\nfleet: interrupted", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    except Exception as exc:
        if debug:
            raise
        _error(
            f"internal error: {type(exc).__name__}: {exc}",
            "this is a bug in fleet; rerun with --debug for the traceback and report it",
        )
        sys.exit(int(ExitCode.FLEET_ERROR))
    sys.exit(0)
