"""The options every run-type command shares, and the settings built from them once, here at
the top: each layer below receives only the settings of its concern."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from fleet.cli.common import F
from fleet.core import defaults
from fleet.core.digits import is_digits

if TYPE_CHECKING:
    from pathlib import Path

    from fleet.core.hosts import Host
    from fleet.inventory.loader import Inventory
    from fleet.ops.jobs import Settings


def selection_options(func: F) -> F:
    """Options that choose hosts (shared by `hosts` and every run-type command)."""
    options = [
        click.option(
            "-i",
            "--inventory",
            type=InventoryPath(path_type=Path),
            multiple=True,
            envvar="FLEET_INVENTORY",
            cls=EnvOption,
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
    return run_options_with(func, short=True)


def run_options_with(func: F, short: bool) -> F:
    """The shared options; `short=False` leaves -n and -f free (`fleet logs -n 50 -f`)."""
    forks_flags = ("-f", "--forks") if short else ("--forks",)
    dry_run_flags = ("-n", "--dry-run") if short else ("--dry-run",)
    options = [
        click.option(
            "-F",
            "--ssh-config",
            type=click.Path(path_type=Path),
            envvar="FLEET_SSH_CONFIG",
            cls=EnvOption,
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
        click.option(
            "--workers",
            "workers",
            type=WorkersType(),
            default="auto",
            envvar="FLEET_WORKERS",
            cls=EnvOption,
            show_default=True,
            help="Processes a run's hosts are split over, each with its share of --forks; auto: "
            f"one per usable core, each with at least {defaults.WORKER_MIN_HOSTS} hosts "
            f"({defaults.WORKER_MIN_HOSTS_PARAMIKO} connecting through paramiko; fewer hosts: one "
            "process); 1: one process. push and pull run in one process "
            "[env FLEET_WORKERS].",
        ),
        click.option(
            "--persist",
            "persist",
            type=Finite(0, 86400),
            default=defaults.PERSIST_S,
            envvar="FLEET_PERSIST",
            cls=EnvOption,
            metavar="SECONDS",
            show_default=True,
            help="Keep this run's SSH connections open this long after it ends, for the next "
            "fleet command to reuse (warm connections; `fleet connections` lists them, `fleet "
            "disconnect` ends them; push, pull and checkpoints connect afresh); 0: connect "
            "afresh and close at the end [env FLEET_PERSIST].",
        ),
        click.option(
            "--ssh-engine",
            "ssh_engine",
            type=click.Choice(defaults.SSH_ENGINES),
            default="auto",
            envvar="FLEET_SSH_ENGINE",
            cls=EnvOption,
            show_default=True,
            help="The SSH library of a run's fresh connections: auto: libssh2 where the host "
            "needs nothing it lacks (direct TCP, a known plain host key, an IdentityFile), "
            "paramiko elsewhere; paramiko: always paramiko [env FLEET_SSH_ENGINE].",
        ),
        click.option("--plain", is_flag=True, help="One line per event instead of the live table."),
        click.option(
            "--json", "json_", is_flag=True, help="JSON lines, one per event, then a summary."
        ),
        click.option(
            "--log-dir",
            type=click.Path(path_type=Path),
            envvar="FLEET_LOG_DIR",
            cls=EnvOption,
            help=f"Where run records go [default {defaults.LOG_DIR}].",
        ),
        click.option(
            "--connect-timeout",
            type=Finite(0.1, 600),
            default=None,
            help="Seconds for the TCP connect [default: ssh config ConnectTimeout, else "
            f"{defaults.CONNECT_TIMEOUT_S:g}].",
        ),
        click.option(
            "--banner-timeout",
            type=Finite(0.1, 600),
            default=defaults.BANNER_TIMEOUT_S,
            show_default=True,
            help="Seconds for the SSH banner after TCP connects (a stalled node sends none).",
        ),
        click.option(
            "--auth-timeout",
            type=Finite(0.1, 600),
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
            help=(
                "Print what would run where and change nothing (push, pull and consolidate "
                "connect, read-only, to list what would move; other verbs connect nowhere)."
            ),
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


class Finite(click.FloatRange):
    """A number in a range that is a number: click's FloatRange lets `nan` through (every
    comparison with it is false) and `inf` wherever it has no upper bound, and either reached a
    socket timeout (an internal error), a node's `sleep` or `timeout` (failing there), or a
    window silently read as 0. No option of fleet means "none" by inf (0 or no flag does), so
    every float option takes this type and refuses both as a usage error before connecting."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = float(value)
        except (TypeError, ValueError):
            return self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            return self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


class EnvOption(click.Option):
    """An option an environment variable can set: a bad value taken from there is blamed on the
    variable (`Invalid value for '--persist' (from env FLEET_PERSIST)`), not on a flag the
    operator never typed."""

    def get_error_hint(self, ctx: click.Context | None) -> str:
        hint = super().get_error_hint(ctx)
        if ctx is None or self.name is None or not isinstance(self.envvar, str):
            return hint
        if ctx.get_parameter_source(self.name) is ParameterSource.ENVIRONMENT:
            return f"{hint} (from env {self.envvar})"
        return hint


class InventoryPath(click.Path):
    """-i / FLEET_INVENTORY: a path, never an empty one. click splits FLEET_INVENTORY at ':' and
    keeps empty items (`$A:$B` with B empty), and Path('') is '.': the current directory, maybe
    a shared one, would be read as an inventory directory, unchecked, as if the operator had
    named it."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            from fleet.inventory.sources import empty_path

            from_env = (
                ctx is not None
                and param is not None
                and param.name is not None
                and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT
            )
            raise empty_path("FLEET_INVENTORY" if from_env else "-i")
        return super().convert(value, param, ctx)


class WorkersType(click.ParamType):  # type: ignore[type-arg]
    """--workers: `auto` (None) or a whole number from 1 to 256."""

    name = "auto|N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or value == "auto":
            return None
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 256:
            return value
        text = str(value).strip()
        if is_digits(text) and 1 <= int(text) <= 256:
            return int(text)
        return self.fail(f"{value!r}: expected auto or a whole number from 1 to 256", param, ctx)


def chosen_hosts(
    inventory: tuple[Path, ...],
    nodes: tuple[str, ...],
    limit: str | None,
    playbook_dir: Path | None,
    log_dir: Path | None,
) -> tuple[Inventory, list[Host]]:
    """The inventory and the hosts chosen by a command's selection options (`hosts`,
    `disconnect -l`): the inventory found implicitly is judged as found (fleet.core.trust)."""
    from fleet.engine.runner import choose_hosts
    from fleet.inventory.loader import Selection
    from fleet.records.runlog import RecordSettings

    selection = Selection(
        inventory=inventory,
        found=from_config("inventory"),
        nodes=nodes,
        limit=limit,
        playbook_dir=playbook_dir,
    )
    return choose_hosts(selection, RecordSettings(log_dir=log_dir))


def from_config(name: str) -> bool:
    """True when a parameter's value came from a config file (fleet.cli.config), not the
    command line or the environment: fleet found it rather than being told (fleet.core.trust)."""
    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source(name) is ParameterSource.DEFAULT_MAP


def options_from(kw: dict[str, Any], *, output: str = "last") -> Settings:
    """Collect the shared options out of a command's keyword arguments into the settings of each
    concern, once: what selects hosts, what SSH needs, what the output shows (`output`: what the
    summary shows of the hosts' output, fleet.output.settings), what the run record says, and
    how the job deals with the operator."""
    from fleet.engine.runner import RunSettings
    from fleet.inventory.loader import Selection
    from fleet.ops.jobs import AskSettings, Settings
    from fleet.output.settings import OutputSettings
    from fleet.records.runlog import RecordSettings
    from fleet.ssh.settings import SshSettings

    return Settings(
        hosts=Selection(
            inventory=kw.pop("inventory", None),
            found=from_config("inventory"),
            nodes=kw.pop("nodes", ()),
            playbook_dir=kw.pop("playbook_dir", None),
            limit=kw.pop("limit", None),
        ),
        run=RunSettings(
            ssh=SshSettings(
                ssh_config=kw.pop("ssh_config", None),
                host_keys=kw.pop("host_keys", None),
                connect_timeout_s=kw.pop("connect_timeout", None),
                banner_timeout_s=kw.pop("banner_timeout", defaults.BANNER_TIMEOUT_S),
                auth_timeout_s=kw.pop("auth_timeout", defaults.AUTH_TIMEOUT_S),
                debug=kw.pop("debug", False),
                persist_s=kw.pop("persist", defaults.PERSIST_S),
                engine=kw.pop("ssh_engine", defaults.SSH_ENGINES[0]),
            ),
            output=OutputSettings(
                json=kw.pop("json_", False),
                plain=kw.pop("plain", False),
                output=output,
                gather=kw.pop("gather", True),
            ),
            record=RecordSettings(
                log_dir=kw.pop("log_dir", None),
                verb=click.get_current_context().info_name or "",
            ),
            forks=kw.pop("forks", defaults.FORKS),
            workers=kw.pop("workers", None),
            sudo=kw.pop("sudo", None),
            password_on_stdin=kw.get("ask_become_pass", False),
        ),
        ask=AskSettings(
            dry_run=kw.pop("dry_run", False),
            yes=kw.pop("yes", False),
            ask_key_pass=kw.pop("ask_key_pass", False),
            ask_become_pass=kw.pop("ask_become_pass", False),
            confirm=ask,
        ),
        vars=tuple(kw.pop("vars_", ())),
    )


def ask(prompt: str) -> bool:
    """A yes/no question on stderr, no by default (click's prompt: Ctrl-C aborts)."""
    return click.confirm(prompt, default=False, err=True)
