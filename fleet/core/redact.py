"""Values of the job's environment variables, kept out of what fleet shows and records.

`fleet launch --env WANDB_API_KEY=...` and an inventory's `env: {HF_TOKEN: ...}` put secrets into
the rendered command (`--env 'HF_TOKEN=hf_...'`), which fleet shows in events, the run record's
events.jsonl and host logs; a node may print them back too (`env`, a launcher echoing its
environment). Every such `NAME=value` becomes `NAME=<redacted>` in the text fleet emits, unless
the operator names the variable in FLEET_RECORD_ENV (comma-separated) to keep its value visible.

Only the pair is recognised, not a bare value: a value alone ("1", "INFO", "eth0") is too common
to hunt for in arbitrary output without mangling it.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from fleet.core.result import CUT_MARK
from fleet.core.shell import to_text

RECORD_ENV = "FLEET_RECORD_ENV"  # NAME,NAME,...: environment values shown, not redacted
REDACTED = "<redacted>"
# Playbook variables that carry the job's environment (playbooks/launch.yaml): the inventory's
# `env` mapping and `extra_env`, the `--env NAME=VALUE` list.
ENV_VARIABLES = ("env", "extra_env")


def shown_names(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Names whose values the operator asked to keep: FLEET_RECORD_ENV=NCCL_DEBUG,NNODES."""
    text = (os.environ if environ is None else environ).get(RECORD_ENV, "")
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def env_pairs(variables: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(NAME, value) of every environment variable a host's variables set, as rendered."""
    out: list[tuple[str, str]] = []
    for var in ENV_VARIABLES:
        value = variables.get(var)
        if isinstance(value, Mapping):
            out += [(str(k), to_text(v)) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            for item in value:
                name, sep, rest = to_text(item).partition("=")
                if sep:
                    out.append((name, rest))
    return tuple(dict.fromkeys(out))


class Redactor:
    """Replaces `NAME=value` (bare, or shell-quoted as fleet renders it) by `NAME=<redacted>`."""

    def __init__(self, pairs: Iterable[tuple[str, str]], shown: frozenset[str] = frozenset()):
        self._forms: dict[str, str] = {}
        for name, value in pairs:
            if not value or name in shown:
                continue
            for form in (shlex.quote(f"{name}={value}"), f"{name}={value}"):
                self._forms[form] = f"{name}={REDACTED}"
        # Longest first: a value that extends another one is replaced whole.
        ordered = sorted(self._forms, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def __call__(self, text: str) -> str:
        """`text` with every known pair redacted; a line cut in the middle of a pair (the cut is
        marked) loses the pair's visible start too."""
        if self._pattern is None:
            return text
        if "=" in text:
            text = self._pattern.sub(lambda m: self._forms[m.group()], text)
        mark = text.rfind(CUT_MARK)
        if mark > 0:
            text = self._cut_pair(text[:mark]) + text[mark:]
        return text

    def _cut_pair(self, head: str) -> str:
        """A pair whose value the cut left unfinished: `...HF_TOKEN=hf_ab` ends the head."""
        for form, replacement in self._forms.items():
            name_end = form.index("=") + 1
            for keep in range(len(form) - 1, name_end - 1, -1):
                if head.endswith(form[:keep]):
                    return head[: len(head) - keep] + replacement
        return head
