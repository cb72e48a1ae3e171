"""What the command families share: click context settings, and the few steps every verb
body takes (select hosts, perform a job, exit with its code).

Loading fleet.cli loads click and this layer's own modules, nothing below them that a verb
does not need: `fleet --help` and `fleet VERB --help` must not pay for paramiko, rich, yaml,
the inventory or the engine (tests/cli/test_startup.py). So the machinery a verb body uses is
imported inside that body, and names used only in annotations come under TYPE_CHECKING.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from fleet.core.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from fleet.core.hosts import Host
    from fleet.core.playbook import Playbook
    from fleet.ops.jobs import Settings

F = TypeVar("F", bound=Callable[..., Any])


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def exit_with(code: ExitCode) -> NoReturn:
    raise SystemExit(int(code))


def run_playbook(
    opts: Settings,
    playbook: Playbook,
    overrides: dict[str, Any],
    *,
    fit: Callable[[Playbook, Sequence[Host]], Playbook] | None = None,
    **job: Any,
) -> NoReturn:
    """A verb that is one playbook run: select the hosts, build its job (`job`: the options of
    fleet.ops.jobs.playbook_job), perform it, exit with its code. `fit`: the playbook made for
    the hosts selected (stop's step timeout, from the largest grace any of them gets)."""
    from fleet.ops.jobs import perform, playbook_job, select

    inventory, hosts = select(opts)
    if fit is not None:
        playbook = fit(playbook, hosts)
    exit_with(perform(opts, inventory, playbook_job(opts, hosts, playbook, overrides, **job)))


def output_dir(opts: Settings, directory: str | None, hosts: Sequence[Host]) -> dict[str, Any]:
    """`--dir` wins; else every selected host must have `output_dir` in the inventory."""
    if directory:
        return {"output_dir": directory}
    from fleet.core import nodeset

    missing = [h.name for h in hosts if not h.vars.get("output_dir")]
    if missing:
        raise UsageError(
            f"no output dir for {nodeset.fold(missing)}",
            hint="pass --dir /path/on/the/nodes, or set output_dir in the inventory",
        )
    return {}


def given(**values: Any) -> dict[str, Any]:
    """Only the options the operator actually gave (the playbook's defaults stay otherwise)."""
    return {k: v for k, v in values.items() if v not in (None, [], ())}
