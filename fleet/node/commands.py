"""The commands op steps send: one of fleet's node-side scripts on stdin, to the node's own shell
or to a shell inside a container, marked as fleet's own (FLEET_NODE_HELPER) either way."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.core.playbook import shipped_script
from fleet.core.result import CommandResult
from fleet.core.shell import HELPER_ENV, Cmd, quote, wrap
from fleet.node.facts import facts_command

ARGS_ON_STDIN = ("act.sh",)  # scripts handed lists of any length: their arguments go on stdin


def stdin_args(args: Sequence[str], script: str) -> str:
    """The script's stdin with `args` put first, as a `set -- ARGS` line: a list of thousands of
    pids or paths fits no command line (sshd's `sh -c` takes 128 KiB, an SSH packet 256 KiB),
    and the node's shell reads a script of any length."""
    return f"set -- {facts_command(args)}\n{shipped_script(script)}"


def script_cmd(
    script: str,
    args: Sequence[str],
    *,
    sudo: bool,
    timeout_s: float | None,
    password_on_stdin: bool,
    container: str | None = None,
) -> Cmd:
    """`sh -s -- ARGS < SCRIPT` on the node, or with `container` (an id) inside it:
    `docker exec -i -u 0 -e FLEET_NODE_HELPER=1 -e SUDO_UID= ID sh -s -- ARGS`, the script
    still on stdin (docker exec passes it through; SUDO_UID, which facts.sh believes, never from
    the image). Every word is quoted. An ARGS_ON_STDIN script gets ARGS on stdin instead
    (stdin_args), and the display says how many there are."""
    on_stdin = script in ARGS_ON_STDIN
    body = "" if on_stdin else facts_command(args)
    if container is None:
        inner, shown = body, f"sh -s -- {body}"
    else:
        exe = f"docker exec -i -u 0 -e {HELPER_ENV}=1 -e SUDO_UID= {quote(container)}"
        inner = shown = f"{exe} sh -s -- {body}"
    command = wrap(
        inner,
        sudo=sudo,
        timeout_s=timeout_s,
        script=container is None,
        password_on_stdin=password_on_stdin,
        helper=True,
    )
    shown = f"{shown.rstrip()}  < {script}"
    if on_stdin:
        shown += f" ({len(args)} arguments first on stdin)"
    return Cmd(
        command=command,
        display=f"sudo {shown}" if sudo else shown,
        stdin=stdin_args(args, script) if on_stdin else shipped_script(script),
        timeout_s=timeout_s,
        sudo=sudo,
        helper=True,
    )


def exit_text(result: CommandResult) -> str:
    """`exit 1`, or `killed by SIGKILL` when sshd said so, or why its output was not whole."""
    if result.broken:
        return result.broken
    if result.signal:
        return f"killed by SIG{result.signal}"
    return f"exit {result.exit_code}"
