"""Render every command for every host before anything connects (so --dry-run is free and a
template error fails the run before it touches a single node)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from fleet.core import nodeset
from fleet.core.errors import TemplateError, UsageError
from fleet.core.hosts import Host
from fleet.core.playbook import Playbook, Step
from fleet.core.redact import ENV_VARIABLES, env_pairs
from fleet.core.shell import BadTemplate, Cmd, UndefinedVariable, names_in, render, wrap
from fleet.node.step import NodeOp, OpVarError


@dataclass(frozen=True)
class PlannedStep:
    """A step and its rendered command for one host; for an op step, also the op (whose `cmd`
    is the first command it sends)."""

    step: Step
    cmd: Cmd
    op: NodeOp | None = None


@dataclass(frozen=True)
class HostPlan:
    """Everything one host will run, in order."""

    host: Host
    steps: tuple[PlannedStep, ...]
    # (NAME, value) of the job environment this host's variables set (`env`, `extra_env`): the
    # values are redacted from what fleet shows and records (fleet/core/redact.py).
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Plan:
    """The whole run: the playbook and each selected host's commands."""

    playbook: Playbook
    hosts: tuple[HostPlan, ...]

    @property
    def host_names(self) -> list[str]:
        """Selected host names in inventory order."""
        return [hp.host.name for hp in self.hosts]


def parse_vars(pairs: Sequence[str]) -> dict[str, Any]:
    """`--var k=v` pairs; a value written `[a, b]` or `{...}` is read as YAML, else kept as text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--var '{pair}': expected NAME=VALUE", hint="e.g. --var port=39501")
        parsed: Any = value
        if value.strip().startswith(("[", "{")):
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError:
                raise UsageError(
                    f"--var {key}: '{value}' is not a valid YAML list or mapping",
                    hint="e.g. --var 'patterns=[torchrun, train.py]'",
                ) from None
        out[key] = parsed
    return out


def host_variables(
    host: Host, playbook: Playbook, overrides: Mapping[str, Any], index: int, count: int
) -> dict[str, Any]:
    """Playbook defaults < inventory (all < groups < host) < --var, plus fleet's own facts."""
    merged: dict[str, Any] = dict(playbook.vars)
    merged.update(host.vars)
    merged.update(
        inventory_hostname=host.name,
        fleet_address=host.address,
        host_index=index,
        host_count=count,
    )
    merged.update(overrides)
    return merged


def args_on_stdin(step: Step) -> bool:
    """A script step that passes the job's environment (`env`, `extra_env`: an HF_TOKEN) gets
    its arguments on stdin, ahead of the script, never on the command line: a node's every user
    reads every process's argv (`ps`), for as long as the step runs."""
    return step.script is not None and any(n in ENV_VARIABLES for n in names_in(step.run))


def _render_step(step: Step, variables: Mapping[str, Any], password_on_stdin: bool) -> Cmd:
    """One step's exact remote command for one host; with args_on_stdin, `sh -s` is sent
    bare and the script is fed `set -- ARGS` first, which gives it the same "$@"."""
    body = render(step.run, variables)
    hidden = args_on_stdin(step)
    command = wrap(
        "" if hidden else body,
        sudo=step.sudo,
        timeout_s=step.timeout_s,
        script=step.script is not None,
        password_on_stdin=password_on_stdin and step.sudo,
        helper=step.helper,
    )
    display = f"sh -s -- {body}  < {step.script_name}" if step.script is not None else body
    if step.sudo:
        display = f"sudo {display}"
    return Cmd(
        command=command,
        display=display,
        stdin=f"set -- {body}\n{step.script}" if hidden else step.script,
        timeout_s=step.timeout_s,
        sudo=step.sudo,
        helper=step.helper,
    )


def _plan_op(step: Step, variables: Mapping[str, Any], password_on_stdin: bool) -> PlannedStep:
    """An op step for one host (OpVarError for a var it cannot use). fleet.node.ops (the
    cleanup's facts, decisions and actions) loads here, only for a playbook with an op step:
    `fleet exec` does without it."""
    from fleet.node.ops import CLEANUP_VARS
    from fleet.node.ops import build as build_op

    if CLEANUP_VARS[0] not in variables:
        raise UndefinedVariable(CLEANUP_VARS[0])
    op = build_op(
        step.op or "",
        variables,
        sudo=step.sudo,
        timeout_s=step.timeout_s,
        password_on_stdin=password_on_stdin and step.sudo,
    )
    return PlannedStep(step, op.cmd, op)


def _refuse_op_var(
    playbook: Playbook,
    overrides: Mapping[str, Any],
    bad: Mapping[tuple[str, str, str], list[Host]],
) -> None:
    """An op var no host can use is refused before any question or connection, as an error of
    wherever its value came from (the command line: exit 2), naming the hosts it came for."""
    from fleet.node.deletion import value_source

    (var, message, hint), hosts = next(iter(bad.items()))
    error, origin = value_source(playbook, overrides, hosts, [var])
    raise error(f"{playbook.name}: {message} (from {origin})", hint=hint)


def check_patterns(playbook: Playbook, hosts: Sequence[Host], overrides: Mapping[str, Any]) -> None:
    """For a playbook that hands `patterns` to the nodes' grep -E (status): each host's patterns
    read first, as the cleanup op reads its own, so one grep cannot use is refused before
    anything connects, as an error of wherever it came from (the command line: exit 2), not a
    `-` in the table with grep's complaint only in --json."""
    from fleet.node.ere import BadPattern, compile_ere
    from fleet.node.step import text_items

    bad: dict[tuple[str, str, str], list[Host]] = {}
    for index, host in enumerate(hosts):
        variables = host_variables(host, playbook, overrides, index, len(hosts))
        for text in text_items(variables.get("patterns")):
            try:
                compile_ere(text)
            except BadPattern as exc:
                key = ("patterns", f"--pattern '{text}': {exc}", exc.hint)
                bad.setdefault(key, []).append(host)
                break
    if bad:
        _refuse_op_var(playbook, overrides, bad)


def _at(playbook: Playbook, step: Step) -> str:
    """`book.yaml:12` (the step's `run` line) for an error found while rendering a step."""
    return f"{playbook.path}:{step.line}" if step.line else str(playbook.path)


def build_plan(
    hosts: Sequence[Host],
    playbook: Playbook,
    overrides: Mapping[str, Any],
    *,
    password_on_stdin: bool = False,
) -> Plan:
    """Render all steps for all hosts; an undefined variable names file, step, hosts and var."""
    plans: list[HostPlan] = []
    missing: dict[tuple[Step, str], list[str]] = {}
    bad: dict[tuple[str, str, str], list[Host]] = {}
    for index, host in enumerate(hosts):
        variables = host_variables(host, playbook, overrides, index, len(hosts))
        planned: list[PlannedStep] = []
        for step in playbook.steps:
            try:
                if step.op is not None:
                    planned.append(_plan_op(step, variables, password_on_stdin))
                    continue
                planned.append(PlannedStep(step, _render_step(step, variables, password_on_stdin)))
            except UndefinedVariable as exc:
                missing.setdefault((step, exc.name), []).append(host.name)
            except OpVarError as exc:
                bad.setdefault((exc.var, exc.message, exc.hint), []).append(host)
            except BadTemplate as exc:  # a value the template cannot use (`|words` unbalanced)
                raise TemplateError(
                    f"{_at(playbook, step)}: step '{step.name}' on host {host.name}: {exc}",
                    hint="fix the value (inventory var, playbook var or --var)",
                ) from None
        plans.append(HostPlan(host, tuple(planned), env_pairs(variables)))
    if bad:
        _refuse_op_var(playbook, overrides, bad)
    if missing:
        (step, var), names = next(iter(missing.items()))
        raise TemplateError(
            f"{_at(playbook, step)}: step '{step.name}': undefined variable '{var}' "
            f"on host {nodeset.fold(names)}",
            hint=f"define '{var}' in the inventory (host or group vars), in the playbook's vars, "
            f"or pass --var {var}=VALUE",
        )
    return Plan(playbook, tuple(plans))
