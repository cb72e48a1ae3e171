"""The janitor's settings, judged before anything connects.

The janitor itself is node-side sh (fleet/remote/janitor-loop.sh): its daemon outlives the client.
What can be decided without the node is decided here, once, for every host of a plan: numbers
that are no numbers of seconds and globs that name paths are refused with one error (exit 2 from
the command line, 1 from the inventory or a playbook) instead of a `janitor: refused:` line from
every node. The node checks the same again, for playbooks that feed it values of their own, and
resolves what only it can (the directory, behind its symlinks). What the globs would delete is
judged by fleet/node/deletion.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.core.shell import to_text

# What the node takes for seconds: digits with at most one point (janitor-loop.sh's own test).
_SECONDS = re.compile(r"[0-9]+\.?[0-9]*|\.[0-9]+")
ACTIONS_THAT_DELETE = ("start", "run-once")
# The shell's `{a,b}` alternatives, which find -name does not have (janitor-loop.sh's own test).
_BRACES = re.compile(r"\{.*,.*\}")

# Said before a janitor start is confirmed (`fleet janitor start`, `fleet launch --janitor`).
RESUME_WARNING = (
    "warning: the janitor deletes optimizer, scheduler and RNG state: exact resume from these "
    "checkpoints becomes impossible (only what the keep patterns protect survives). The default "
    "*_model_states.pt also matches mp_rank_00_model_states.pt, which under ZeRO stages 0-2 holds "
    "the model weights themselves: pass --delete globs of your own for such runs."
)


def seconds_problem(option: str, value: Any, *, positive: bool) -> str | None:
    """Why `value` cannot be the janitor's `option` in seconds, or None (None: the default)."""
    if value is None:
        return None
    text = to_text(value)
    if not _SECONDS.fullmatch(text):
        return f"{option} {text!r} is not a number of seconds"
    if positive and float(text) == 0:
        return f"{option} must be more than 0 seconds"
    return None


def problems(
    variables: Mapping[str, Any], deletes: Sequence[str], keeps: Sequence[str]
) -> list[str]:
    """Why a janitor start or run-once with these vars and globs may not run, one phrase each
    (numbers and the globs' shape; what they would delete is fleet/node/deletion.py's to judge)."""
    action = to_text(variables.get("action"))
    if action not in ACTIONS_THAT_DELETE:
        return []
    found = [seconds_problem("--min-age", variables.get("min_age"), positive=False)]
    if action == "start":  # run-once makes one pass: it has no interval
        found.insert(0, seconds_problem("--interval", variables.get("interval"), positive=True))
    out = [p for p in found if p is not None]
    if not deletes:
        out.append("no --delete glob given: nothing to delete")
    for option, globs in (("--delete", deletes), ("--keep", keeps)):
        named = [g for g in globs if "/" in g]
        out += [f"{option} '{g}': globs match file names, not paths (no /)" for g in named]
        # find -name reads `{a,b}` as those characters: such a --delete deletes nothing and
        # such a --keep keeps nothing, silently
        braced = [g for g in globs if "/" not in g and _BRACES.search(g)]
        why = "no {a,b} alternatives (find reads them literally): give one"
        out += [f"{option} '{g}': {why} {option} per alternative" for g in braced]
    return out
