"""The commands op steps send: one of fleet's node-side scripts on stdin, to the node's own shell
or to a shell inside a container, marked as fleet's own (FLEET_NODE_HELPER) either way."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.events import CommandResult
from fleet.node.facts import facts_command
from fleet.playbook import shipped_script
from fleet.shell import HELPER_ENV, Cmd, quote, wrap


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
    `docker exec -i -u 0 -e FLEET_NODE_HELPER=1 ID sh -s -- ARGS`, the script still on stdin
    (docker exec passes it through). Every word is quoted."""
    body = facts_command(args)
    if container is None:
        command = wrap(
            body,
            sudo=sudo,
            timeout_s=timeout_s,
            script=True,
            password_on_stdin=password_on_stdin,
            helper=True,
        )
        shown = f"sh -s -- {body}  < {script}"
    else:
        inner = f"docker exec -i -u 0 -e {HELPER_ENV}=1 {quote(container)} sh -s -- {body}"
        command = wrap(
            inner,
            sudo=sudo,
            timeout_s=timeout_s,
            script=False,
            password_on_stdin=password_on_stdin,
            helper=True,
        )
        shown = f"{inner}  < {script}"
    return Cmd(
        command=command,
        display=f"sudo {shown}" if sudo else shown,
        stdin=shipped_script(script),
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
