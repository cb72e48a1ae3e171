"""What the command families share: click context settings, and the few steps every verb
body takes (select hosts, perform a job, exit with its code)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from fleet.core import nodeset
from fleet.core.errors import ExitCode, UsageError
from fleet.core.hosts import Host
from fleet.core.playbook import Playbook
from fleet.ops.jobs import Settings, perform, playbook_job, select

F = TypeVar("F", bound=Callable[..., Any])


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def exit_with(code: ExitCode) -> NoReturn:
    raise SystemExit(int(code))


def run_playbook(
    opts: Settings, playbook: Playbook, overrides: dict[str, Any], **job: Any
) -> NoReturn:
    """A verb that is one playbook run: select the hosts, build its job (`job`: the options of
    fleet.ops.jobs.playbook_job), perform it, exit with its code."""
    inventory, hosts = select(opts)
    exit_with(perform(opts, inventory, playbook_job(opts, hosts, playbook, overrides, **job)))


def output_dir(opts: Settings, directory: str | None, hosts: Sequence[Host]) -> dict[str, Any]:
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


def given(**values: Any) -> dict[str, Any]:
    """Only the options the operator actually gave (the playbook's defaults stay otherwise)."""
    return {k: v for k, v in values.items() if v not in (None, [], ())}
