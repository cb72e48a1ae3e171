"""The `fleet` command line: option declarations and thin command bodies that turn options into
a verb's job (fleet.verbs performs it); `main` maps every error to a documented exit code."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from click.core import ParameterSource

from fleet import __version__, defaults, nodeset
from fleet.errors import ExitCode, FleetError, UsageError
from fleet.inventory import Host
from fleet.plan import parse_vars
from fleet.playbook import Playbook, adhoc, builtin_names, load_playbook, load_shipped
from fleet.runner import Options, select_hosts
from fleet.safetext import clean
from fleet.verbs import perform, playbook_job

F = TypeVar("F", bound=Callable[..., Any])
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def selection_options(func: F) -> F:
    """Options that choose hosts (shared by `hosts` and every run-type command)."""
    options = [
        click.option(
            "-i",
            "--inventory",
            type=click.Path(path_type=Path),
            multiple=True,
            envvar="FLEET_INVENTORY",
            help="Ansible inventory: YAML or INI file, directory of them, or 'host1,host2'; "
            "or a hostfile ('worker-1 slots=8', 'worker-1:8', names); repeat to merge several "
            "[env FLEET_INVENTORY, ':'-separated; default ./inventory.yaml].",
        ),
        click.option(
            "-w",
            "--hosts",
            "nodes",
            metavar="NODESET",
            multiple=True,
            help="The hosts, no inventory needed, as pdsh takes them: 'gpu[01-16]', "
            "'gpu-[01-04,09],cpu1', root@gpu01, ^FILE; or \"$SLURM_JOB_NODELIST\". With -i, "
            "the inventory says how to reach the hosts it defines. Repeatable.",
        ),
        click.option(
            "-l",
            "--limit",
            metavar="PATTERN",
            help="Hosts to act on, Ansible's patterns: names, groups, globs, ~regex, 'a,b' or "
            "'a:b' union, '&g' intersection, '!g' exclusion, g[0]; plus ranges gpu[01-04]; "
            "@failed / @unreachable (the last run's), @FILE (names in FILE).",
        ),
        click.option(
            "--playbook-dir",
            type=click.Path(path_type=Path, file_okay=False, exists=True),
            metavar="DIR",
            help="Also read group_vars/ and host_vars/ here, as Ansible does beside a playbook "
            "[default: the current directory].",
        ),
        click.option("--debug", is_flag=True, help="Show tracebacks and paramiko's own logs."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def run_options(func: F) -> F:
    """Options of every command that runs steps on hosts."""
    return _run_options(func, short=True)


def _run_options(func: F, short: bool) -> F:
    """The shared options; `short=False` leaves -n and -f free (`fleet logs -n 50 -f`)."""
    forks_flags = ("-f", "--forks") if short else ("--forks",)
    dry_run_flags = ("-n", "--dry-run") if short else ("--dry-run",)
    options = [
        click.option(
            "-F",
            "--ssh-config",
            type=click.Path(path_type=Path),
            envvar="FLEET_SSH_CONFIG",
            help=f"OpenSSH client config [env FLEET_SSH_CONFIG; default {defaults.SSH_CONFIG}].",
        ),
        click.option(
            "--host-keys",
            type=click.Choice(["strict", "accept-new"]),
            default=None,
            help="Unknown host keys: reject (strict, default) or record on first use.",
        ),
        click.option(
            *forks_flags,
            "forks",
            type=click.IntRange(1, 1024),
            default=defaults.FORKS,
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
            help=f"Where run records go [default {defaults.LOG_DIR}].",
        ),
        click.option(
            "--connect-timeout",
            type=click.FloatRange(0.1, 600),
            default=None,
            help="Seconds for the TCP connect [default: ssh config ConnectTimeout, else "
            f"{defaults.CONNECT_TIMEOUT_S:g}].",
        ),
        click.option(
            "--banner-timeout",
            type=click.FloatRange(0.1, 600),
            default=defaults.BANNER_TIMEOUT_S,
            show_default=True,
            help="Seconds for the SSH banner after TCP connects (a stalled node sends none).",
        ),
        click.option(
            "--auth-timeout",
            type=click.FloatRange(0.1, 600),
            default=defaults.AUTH_TIMEOUT_S,
            show_default=True,
            help="Seconds for authentication.",
        ),
        click.option(
            "--ask-key-pass",
            is_flag=True,
            help="Ask once for the SSH private key's passphrase (better: use ssh-agent).",
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
            *dry_run_flags,
            "dry_run",
            is_flag=True,
            help="Print what would run where; connect nowhere.",
        ),
        click.option("-y", "--yes", is_flag=True, help="Do not ask before destructive runs."),
        click.option(
            "--gather/--no-gather",
            default=True,
            help="exec/run: print identical outputs once under their folded hosts (default), "
            "or each host's output on its own.",
        ),
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


def _from_config(name: str) -> bool:
    """True when a parameter's value came from a config file (fleet.config), not the
    command line or the environment: fleet found it rather than being told (fleet.trust)."""
    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source(name) is ParameterSource.DEFAULT_MAP


def _options(kw: dict[str, Any]) -> Options:
    """Collect the shared options out of a command's keyword arguments."""
    return Options(
        inventory=kw.pop("inventory", None),
        inventory_found=_from_config("inventory"),
        nodes=kw.pop("nodes", ()),
        playbook_dir=kw.pop("playbook_dir", None),
        limit=kw.pop("limit", None),
        ssh_config=kw.pop("ssh_config", None),
        host_keys=kw.pop("host_keys", None),
        forks=kw.pop("forks", defaults.FORKS),
        plain=kw.pop("plain", False),
        json=kw.pop("json_", False),
        log_dir=kw.pop("log_dir", None),
        connect_timeout_s=kw.pop("connect_timeout", None),
        banner_timeout_s=kw.pop("banner_timeout", defaults.BANNER_TIMEOUT_S),
        auth_timeout_s=kw.pop("auth_timeout", defaults.AUTH_TIMEOUT_S),
        ask_key_pass=kw.pop("ask_key_pass", False),
        ask_become_pass=kw.pop("ask_become_pass", False),
        sudo=kw.pop("sudo", None),
        dry_run=kw.pop("dry_run", False),
        yes=kw.pop("yes", False),
        debug=kw.pop("debug", False),
        vars=list(kw.pop("vars_", ())),
        gather=kw.pop("gather", True),
        verb=click.get_current_context().info_name or "",
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
    from fleet.runner import choose_hosts

    opts = Options(
        inventory=inventory,
        inventory_found=_from_config("inventory"),
        nodes=nodes,
        limit=limit,
        playbook_dir=playbook_dir,
        log_dir=log_dir,
    )
    inv, selected = choose_hosts(opts)
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
    from rich.console import Console
    from rich.table import Table

    from fleet.reporters import data

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
    # Names, addresses, ports and users are never cut; groups and long source paths fold.
    for i, col in enumerate(("name", "address", "port", "user", "groups", "source")):
        if col in ("groups", "source"):
            table.add_column(col, overflow="fold")
        else:
            widest = max((len(row[i]) for row in rows), default=0)
            table.add_column(col, no_wrap=True, min_width=max(len(col), widest))
    for row in rows:
        table.add_row(*(data(cell) for cell in row))
    Console().print(table)


@cli.command(context_settings=CONTEXT)
def playbooks() -> None:
    """List the playbooks shipped with fleet."""
    for name in builtin_names():
        pb = load_shipped(name)
        click.echo(f"{name:<14} {pb.description.splitlines()[0] if pb.description else ''}")


# ---------------------------------------------------------------- run-type commands


@cli.command(context_settings=CONTEXT)
@click.argument("playbook")
@run_options
def run(playbook: str, **kw: Any) -> None:
    """Run a playbook (a shipped name like 'cleanup', or a path) on the selected hosts."""
    opts = _options(kw)
    opts.output = "gather"
    _run_playbook(opts, load_playbook(playbook), parse_vars(opts.vars))


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
    opts.output = "gather"
    playbook = adhoc(command, sudo=bool(opts.sudo), timeout_s=timeout_s or None)
    _run_playbook(opts, playbook, parse_vars(opts.vars))


@cli.command(context_settings=CONTEXT)
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
    type=click.FloatRange(0, 600),
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
    from fleet.preview import cleanup_job

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
    if preview:
        overrides["preview"] = True
    overrides.update(parse_vars(opts.vars))
    inventory, hosts = select_hosts(opts)
    _exit(perform(opts, inventory, cleanup_job(opts, hosts, overrides, preview=preview)))


def _run_playbook(
    opts: Options, playbook: Playbook, overrides: dict[str, Any], **job: Any
) -> NoReturn:
    """A verb that is one playbook run: select the hosts, build its job (`job`: the options of
    verbs.playbook_job), perform it, exit with its code."""
    inventory, hosts = select_hosts(opts)
    _exit(perform(opts, inventory, playbook_job(opts, hosts, playbook, overrides, **job)))


def _output_dir(opts: Options, directory: str | None, hosts: Sequence[Host]) -> dict[str, Any]:
    """`--dir` wins; else every selected host must have `output_dir` in the inventory."""
    if directory:
        return {"output_dir": directory}
    missing = [h.name for h in hosts if not h.vars.get("output_dir")]
    if missing:
        raise UsageError(
            f"no output dir for {nodeset.fold(missing)}",
            hint="pass --dir /path/on/the/nodes, or set output_dir in the inventory",
        )
    return {}


def _given(**values: Any) -> dict[str, Any]:
    """Only the options the operator actually gave (the playbook's defaults stay otherwise)."""
    return {k: v for k, v in values.items() if v not in (None, [], ())}


# ---------------------------------------------------------------- training operations


@cli.command(name="kill-docker", context_settings=CONTEXT)
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
    type=click.FloatRange(0, 600),
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
    opts = _options(kw)
    overrides = _given(
        containers=list(containers),
        labels=list(labels),
        images=list(images),
        patterns=list(patterns),
        grace=grace,
        stop=stop,
    )
    overrides.update(parse_vars(opts.vars))
    _run_playbook(opts, load_shipped("kill-docker"), overrides)


@cli.group(context_settings=CONTEXT)
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
            type=click.FloatRange(0.5, 3600),
            default=None,
            help=f"Seconds between passes [default: {defaults.JANITOR_INTERVAL_S}].",
        ),
        click.option(
            "--min-age",
            type=click.FloatRange(0, 86400),
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


RESUME_WARNING = (
    "warning: the janitor deletes optimizer, scheduler and RNG state: exact resume from these "
    "checkpoints becomes impossible (only what the keep patterns protect survives). The default "
    "*_model_states.pt also matches mp_rank_00_model_states.pt, which under ZeRO stages 0-2 holds "
    "the model weights themselves: pass --delete globs of your own for such runs."
)


def _janitor(action: str, kw: dict[str, Any], destructive: bool, listing: bool = False) -> NoReturn:
    """Run the janitor playbook with ACTION; the subcommands differ only in that."""
    directory: str | None = kw.pop("directory")
    interval: float | None = kw.pop("interval")
    min_age: float | None = kw.pop("min_age")
    delete_patterns: Sequence[str] = kw.pop("delete_patterns")
    keep_patterns: Sequence[str] = kw.pop("keep_patterns")
    allow_weights: bool = kw.pop("allow_weights", False)
    opts = _options(kw)
    if listing:  # `run-once --dry-run` asks the nodes what would go: read-only, so it connects
        opts = dataclasses.replace(opts, dry_run=False)
    inventory, hosts = select_hosts(opts)
    overrides: dict[str, Any] = {"action": action, **_output_dir(opts, directory, hosts)}
    overrides.update(
        _given(
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
    _exit(perform(opts, inventory, job))


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


@cli.command(context_settings=CONTEXT)
@click.option(
    "--dir",
    "directory",
    metavar="PATH",
    help="Output dir on the nodes [default: inventory var output_dir].",
)
@click.option(
    "--min-free-gb",
    type=click.FloatRange(0),
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
    opts = _options(kw)
    inventory, hosts = select_hosts(opts)
    overrides = {
        **_output_dir(opts, directory, hosts),
        **_given(min_free_gb=min_free_gb, master_port=master_port),
    }
    overrides.update(parse_vars(opts.vars))
    job = playbook_job(opts, hosts, load_shipped("preflight"), overrides)
    _exit(perform(opts, inventory, job))


@cli.command(context_settings={**CONTEXT, "ignore_unknown_options": True})
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
@click.option("--cleanup", "with_cleanup", is_flag=True, help="Run `fleet cleanup` first.")
@click.option("--janitor", "with_janitor", is_flag=True, help="Start the janitor too.")
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
    from fleet import launch as launching

    opts = _options(kw)
    # The launch id names a directory on every node: checked here, before anything runs.
    launch_id = launching.check_launch_id(launch_id) if launch_id is not None else None
    extra_vars = parse_vars(opts.vars)
    launching.refuse_launch_id_var(extra_vars)
    words = launching.command_words(command, env_pairs)
    inventory, hosts = select_hosts(opts)
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
        output_dir=_output_dir(opts, directory, hosts).get("output_dir"),
        playbook=load_playbook(playbook_name),
        force=force,
        cleanup=with_cleanup,
        janitor=with_janitor,
        extra_vars=extra_vars,
    )
    _exit(perform(opts, inventory, launching.launch_job(request, opts, hosts)))


@cli.command(context_settings=CONTEXT)
@click.option(
    "--run-id",
    "launch_id",
    help="The training run to stop, by launch id [default: each node's current run].",
)
@click.option(
    "--grace",
    type=click.FloatRange(0, 3600),
    default=None,
    help=f"Seconds between SIGTERM and SIGKILL [default: {defaults.STOP_GRACE_S}].",
)
@run_options
def stop(launch_id: str | None, grace: float | None, **kw: Any) -> None:
    """Stop the launched run on every node (each process of it: TERM, grace, KILL)."""
    from fleet.launch import check_given_launch_id

    opts = _options(kw)
    overrides = _given(run_id=launch_id, grace=grace)
    overrides.update(parse_vars(opts.vars))
    check_given_launch_id(overrides)
    _run_playbook(opts, load_shipped("stop"), overrides)


@cli.command(context_settings=CONTEXT)
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
    type=click.FloatRange(0.5, 3600),
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
    from fleet.status import status_job

    opts = _options(kw)
    overrides = _given(patterns=list(patterns), output_dir=directory)
    overrides.update(parse_vars(opts.vars))
    if watch_s is not None:
        from fleet.watch import run_watch

        _exit(run_watch(opts, overrides, watch_s))
    inventory, hosts = select_hosts(opts)
    _exit(perform(opts, inventory, status_job(opts, hosts, overrides)))


@cli.command(context_settings=CONTEXT)
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
@functools.partial(_run_options, short=False)
def logs(lines: int, follow: bool, launch_id: str | None, **kw: Any) -> None:
    """The last lines of the launched run's log on every node, prefixed by host."""
    from rich.console import Console

    from fleet.launch import check_given_launch_id
    from fleet.reporters import LinesReporter

    opts = _options(kw)
    overrides = {"lines": lines, "follow": follow, **_given(run_id=launch_id)}
    overrides.update(parse_vars(opts.vars))
    check_given_launch_id(overrides)
    reporters = None if opts.json else [LinesReporter(sys.stdout, Console(stderr=True))]
    # Ctrl-C is how one stops following: not an error.
    _run_playbook(opts, load_shipped("logs"), overrides, reporters=reporters, interrupt_ends=follow)


# ---------------------------------------------------------------- sandbox

from fleet.sandbox.cli import sandbox  # noqa: E402 (registered last: `fleet sandbox ...`)

cli.add_command(sandbox)

from fleet.checkpoints import commands as checkpoint_commands  # noqa: E402 (`fleet checkpoints`)

cli.add_command(checkpoint_commands.group())


# ---------------------------------------------------------------- entry point


def _exit(code: ExitCode) -> NoReturn:
    raise SystemExit(int(code))


def _error(message: str, hint: str = "") -> None:
    """The error line and its hint. Messages quote values (inventory keys, host names, file
    lines): their control characters show escaped."""
    click.echo(click.style("fleet: error: ", fg="red", bold=True) + clean(message), err=True)
    if hint:
        click.echo(f"  hint: {clean(hint)}", err=True)


def _defaults(args: Sequence[str]) -> dict[str, Any]:
    """Option defaults from the config files (fleet/config.py); help and version never fail on
    a broken file, everything else stops on it with file:line."""
    from fleet import config

    try:
        return config.default_map(config.resolve(), cli)
    except FleetError:
        if {"-h", "--help", "--version"} & set(args) or not args:
            return {}
        raise


@cli.command(name="config", context_settings=CONTEXT)
@click.option("--json", "json_", is_flag=True, help="Print JSON instead of a table.")
def config_(json_: bool) -> None:
    """Show the effective defaults and where each comes from: env > ./fleet.yaml (or a parent's)
    > ~/.config/fleet/config.yaml > built-in. A flag on the command line wins over all of them."""
    from fleet import config

    for text in config.report(dict(os.environ), Path.cwd(), as_json=json_):
        click.echo(text)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console entry point: one line + hint for every user error, a traceback only with --debug."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or bool(os.environ.get("FLEET_DEBUG"))
    try:
        cli.main(args=args, prog_name="fleet", standalone_mode=False, default_map=_defaults(args))
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
