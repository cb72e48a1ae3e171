"""Playbook steps that run Python per host: `op: cleanup`.

A `script:` step is one command; an op step is a loop on the host's one SSH connection: facts.sh,
a decision in Python, act.sh, facts.sh again (fleet/node/cleanup.py), each a channel of the
session the executor already holds. What it needs is rendered before anything connects, like any
step: the facts command is fixed by the plan and shown by --dry-run with the kinds of actions that
may follow; act.sh's exact lists can only come from the node. Bad values (a pattern that is no
regex, a grace that is no number) fail the plan, before any confirmation or connection.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.core import defaults
from fleet.core.result import CommandResult
from fleet.core.shell import Cmd, to_text
from fleet.node import act as acting
from fleet.node import docker, preflight
from fleet.node.cleanup import MAX_ROUNDS, Cleanup, Preview, preview, seconds
from fleet.node.commands import script_cmd
from fleet.node.decide import CleanupSpec
from fleet.node.facts import FactsError, Snapshot, facts_args, parse
from fleet.node.step import (
    FACTS_TIMEOUT_S,
    HostIO,
    NodeOp,
    OpVarError,
    number_var,
    patterns,
    text_items,
    truthy,
)

OPS = ("cleanup", "preflight", "kill-docker")
# What an op step reads from the host's variables (playbook vars < inventory < --var).
CLEANUP_VARS = (
    "patterns",
    "grace",
    "port",
    "kill_gpu_holders",
    "state_paths",
    "allow_any_state_path",
    "max_kill_share",
    "preview",
)
TAIL_LINES = 20  # of the op's own lines, kept for the summary (as a command's tail)


def cleanup_spec(variables: Mapping[str, Any]) -> CleanupSpec:
    """The cleanup op's vars, checked; OpVarError names the first bad one."""
    port_value = to_text(variables.get("port"))
    port = (
        None
        if port_value == ""
        else int(number_var("port", port_value, 1, 65535, "--port 29500 (1-65535)"))
    )
    if port is not None and float(port_value) != port:
        raise OpVarError("port", f"port: '{port_value}' is not a port number", "--port 29500")
    paths = tuple(text_items(variables.get("state_paths")))
    for path in paths:
        if "\n" in path:
            raise OpVarError("state_paths", "state path holds a newline", "one path per item")
    return CleanupSpec(
        patterns=patterns(variables.get("patterns")),
        grace_s=number_var(
            "grace",
            variables.get("grace", defaults.GRACE_S),
            0,
            600,
            f"--grace {defaults.GRACE_S:g} (seconds)",
        ),
        port=port,
        kill_gpu_holders=truthy(variables.get("kill_gpu_holders")),
        state_paths=paths,
        allow_any_path=truthy(variables.get("allow_any_state_path")),
        max_kill_share=number_var(
            "max_kill_share",
            variables.get("max_kill_share", 0.5),
            0.01,
            1,
            "--var max_kill_share=0.5 (a share of the node's processes, up to 1)",
        ),
    )


# --------------------------------------------------------------------------------- the op


@dataclass(frozen=True)
class CleanupOp:
    """`op: cleanup` for one host: up to MAX_ROUNDS rounds of facts -> decide -> act."""

    spec: CleanupSpec
    cmd: Cmd
    sudo: bool
    timeout_s: float | None
    password_on_stdin: bool
    is_preview: bool = False
    # Filled by run() in preview mode (one per host), read by the CLI once the run is over.
    previews: list[Preview] = field(default_factory=list, compare=False, repr=False)
    stdin_name: str = "facts.sh"

    @property
    def keeps_findings(self) -> bool:
        """A preview keeps what it found in this object (`previews`), not in events: its run
        must stay in the process that reads them (fleet/engine/workers.py does not fork it)."""
        return self.is_preview

    def describe(self) -> str:
        """The kinds of actions that may follow the facts command."""
        if self.is_preview:
            return "preview: facts.sh only, nothing is changed"
        s = self.spec
        also = ", GPU holders too" if s.kill_gpu_holders else ""
        parts = [f"signal PID:START... (TERM, {seconds(s.grace_s)}s, KILL{also})"]
        if s.state_paths:
            anywhere = " (anywhere: allow_any_state_path)" if s.allow_any_path else ""
            parts.append(f"remove PATH...{anywhere}")
        parts.append("gpu-reset")
        return (
            f"then, until clean (at most {MAX_ROUNDS} rounds): act.sh {' | '.join(parts)}; "
            "facts.sh again"
        )

    @property
    def facts_args(self) -> list[str]:
        s = self.spec
        return facts_args([p.source for p in s.patterns], s.state_paths, s.port, gpus=True)

    def run(self, io: HostIO) -> CommandResult:
        started = time.monotonic()
        deadline = started + self.timeout_s if self.timeout_s else None
        said: list[str] = []

        def say(line: str) -> None:
            said.append(line)
            del said[:-TAIL_LINES]
            io.emit("stdout", line)

        def done(code: int | None, failure: CommandResult | None = None) -> CommandResult:
            tail = tuple(said)
            if failure is not None:
                return CommandResult(
                    exit_code=failure.exit_code if code is None else code,
                    stdout_tail=tail,
                    stderr_tail=failure.stderr_tail,
                    duration_s=time.monotonic() - started,
                    timed_out=failure.timed_out,
                    cancelled=failure.cancelled,
                    stop_failed=failure.stop_failed,
                )
            return CommandResult(code, tail, (), time.monotonic() - started)

        snap, failure = self._look(io, deadline, say, None, None)
        if snap is None:
            return done(None, failure) if failure else done(1)
        if self.is_preview:
            seen = preview(snap, self.spec)
            self.previews.append(seen)
            for line in seen.lines():
                say(line)
            return done(1 if seen.refused else 0)
        cleanup = Cleanup(self.spec, say)
        for _ in range(MAX_ROUNDS):
            actions = cleanup.plan(snap)
            if actions is None:
                break
            snap, failure = self._look(io, deadline, say, actions, cleanup)
            if snap is None:
                if failure is not None and (failure.cancelled or failure.timed_out):
                    return done(None, failure)
                cleanup.finish(None)
                result = done(None, failure) if failure else done(1)
                return dataclasses.replace(result, done=cleanup.done)
        code = cleanup.finish(snap)
        return dataclasses.replace(done(code), done=cleanup.done)  # what it did, in numbers

    def _command(self, script: str, args: list[str], deadline: float | None, cap: float) -> Cmd:
        left = cap if deadline is None else min(cap, max(1.0, deadline - time.monotonic()))
        return script_cmd(
            script, args, sudo=self.sudo, timeout_s=left, password_on_stdin=self.password_on_stdin
        )

    def _look(
        self,
        io: HostIO,
        deadline: float | None,
        say: Callable[[str], None],
        actions: acting.Actions | None,
        cleanup: Cleanup | None,
    ) -> tuple[Snapshot | None, CommandResult | None]:
        """One channel: facts.sh alone, or act.sh doing `actions` and then looking again (its
        answers go to `cleanup` as they come, so the operator sees each kill as it happens).
        The fresh snapshot, or None and the failed command's result (None: unreadable)."""
        lines: list[str] = []
        acting_done = actions is None
        broken: list[str] = []

        def on_line(stream: str, line: str) -> None:
            nonlocal acting_done
            if stream != "stdout":
                io.emit(stream, line)
            elif acting_done:
                lines.append(line)
            else:
                try:
                    outcome = acting.parse_line(line)
                except acting.ActError as exc:
                    broken.append(str(exc))
                    return
                if outcome is not None and outcome.kind == "done":
                    acting_done = True
                elif outcome is not None and cleanup is not None:
                    cleanup.record(outcome)

        if actions is None:
            cmd = self._command("facts.sh", self.facts_args, deadline, FACTS_TIMEOUT_S)
        else:
            # TERM, the grace period, KILL and 5 s for it, the wait for another cleanup's lock,
            # nvidia-smi's reset, and the look afterwards.
            cap = 2 * self.spec.grace_s + 60 + (120 if actions.gpu_reset else 0) + FACTS_TIMEOUT_S
            args = actions.args(then_facts=self.facts_args)
            cmd = self._command("act.sh", args, deadline, cap)
        result = io.run(cmd, on_line)
        if result.cancelled or result.timed_out:
            return None, result
        script = "facts.sh" if actions is None or acting_done else "act.sh"
        if result.exit_code != 0 or broken:
            detail = f"; {broken[0]}" if broken else ""
            say(f"{script} failed on this node ({_exit(result)}{detail})")
            return None, dataclasses.replace(result, exit_code=result.exit_code or 1)
        try:
            return parse(lines), None
        except FactsError as exc:
            say(f"facts.sh said something fleet cannot read: {exc}")
            return None, None


def _exit(result: CommandResult) -> str:
    if result.broken:  # its output was not whole (fleet/core/frame.py): why says more than a code
        return result.broken
    if result.signal:
        return f"killed by SIG{result.signal}"
    return f"exit {result.exit_code}"


def build(
    name: str,
    variables: Mapping[str, Any],
    *,
    sudo: bool,
    timeout_s: float | None,
    password_on_stdin: bool,
) -> NodeOp:
    """The planned op `name` for one host; OpVarError for a bad var."""
    if name in ("preflight", "kill-docker"):  # their own modules, on fleet.node.step as this one
        maker = preflight.build if name == "preflight" else docker.build
        return maker(variables, sudo=sudo, timeout_s=timeout_s, password_on_stdin=password_on_stdin)
    if name != "cleanup":
        raise OpVarError("op", f"unknown op '{name}'", "known: " + ", ".join(OPS))
    spec = cleanup_spec(variables)
    preview_only = truthy(variables.get("preview"))
    probe = CleanupOp(spec, Cmd("", ""), sudo, timeout_s, password_on_stdin, preview_only)
    cap = min(FACTS_TIMEOUT_S, timeout_s) if timeout_s else FACTS_TIMEOUT_S
    first = probe._command("facts.sh", probe.facts_args, None, cap)
    # The step's own deadline (for its reason when it times out); the command carries the cap.
    return dataclasses.replace(probe, cmd=dataclasses.replace(first, timeout_s=timeout_s))
