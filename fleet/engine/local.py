"""Run an op step against this machine's own shell instead of over SSH.

    python3 -m fleet.engine.local [NAME=VALUE]...      e.g. patterns='[torchrun]' grace=1 port=

The same facts.sh, decisions and act.sh as `fleet cleanup` on a node, with the playbook's
defaults, without sudo; prints the step's lines and exits with its exit code. For tests (which
run it inside throwaway PID and mount namespaces) and for looking at one machine by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence

from fleet.core.errors import FleetError
from fleet.core.playbook import load_shipped
from fleet.core.result import CommandResult
from fleet.core.shell import HELPER_ENV, PID_MARKER, Cmd
from fleet.engine.plan import parse_vars
from fleet.node.ops import build
from fleet.node.step import OpVarError


class LocalIO:
    """HostIO for this machine: each command runs under `sh -c`, its script on stdin."""

    def __init__(self, emit: Callable[[str, str], None], env: dict[str, str] | None = None):
        self.emit_line = emit
        self.env = env

    def run(self, cmd: Cmd, on_line: Callable[[str, str], None]) -> CommandResult:
        proc = subprocess.run(
            ["sh", "-c", cmd.command],
            input=(cmd.stdin or "").encode(),
            capture_output=True,
            env=self.env,
            check=False,
            timeout=(cmd.timeout_s or 600) + 30,
        )
        out = proc.stdout.decode("utf-8", "replace").splitlines()
        err = [
            line
            for line in proc.stderr.decode("utf-8", "replace").splitlines()
            if not line.startswith(PID_MARKER)
        ]
        for line in out:
            on_line("stdout", line)
        for line in err:
            on_line("stderr", line)
        code = proc.returncode
        return CommandResult(
            exit_code=code if code >= 0 else 128 - code,
            stdout_tail=tuple(out[-20:]),
            stderr_tail=tuple(err[-20:]),
        )

    def emit(self, stream: str, line: str) -> None:
        self.emit_line(stream, line)


def run(assignments: Sequence[str], emit: Callable[[str, str], None]) -> int:
    """The cleanup op with the playbook's vars and NAME=VALUE overrides; its exit code."""
    playbook = load_shipped("cleanup")
    (step,) = playbook.steps
    variables = {**playbook.vars, **parse_vars(list(assignments))}
    op = build(
        step.op or "cleanup",
        variables,
        sudo=False,
        timeout_s=step.timeout_s,
        password_on_stdin=False,
    )
    result = op.run(LocalIO(emit, dict(os.environ)))
    return result.exit_code if result.exit_code is not None else 1


def main(argv: Sequence[str] | None = None) -> int:
    if os.environ.get(HELPER_ENV) is None:
        # Marked as fleet's own from its start, as fleet marks what it runs on a node: its argv
        # holds the patterns, and a cleanup must know it for its own.
        args = sys.argv[1:] if argv is None else list(argv)
        env = {**os.environ, HELPER_ENV: "1"}
        # -P: not the working directory first on the import path (a `fleet/` there is not ours).
        argv = [sys.executable, "-P", "-m", "fleet.engine.local", *args]
        os.execve(sys.executable, argv, env)  # noqa: S606

    def emit(stream: str, line: str) -> None:
        print(line, file=sys.stdout if stream == "stdout" else sys.stderr, flush=True)

    try:
        return run(sys.argv[1:] if argv is None else argv, emit)
    except (OpVarError, FleetError) as exc:
        print(f"error: {exc.message}\n  hint: {exc.hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
