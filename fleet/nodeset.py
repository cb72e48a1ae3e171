"""Host ranges: expand `gpu[01-16]` / `gpu[01:16]` to names and fold names back to `gpu[03,07]`.

Expansion is written here because it must accept both conventions operators bring (Ansible's
`[01:16]`, `[01:16:2]` and `[a:c]`; Slurm's `[01-16]`, `[1-16/2]`, lists `[01-04,09]`), which no
single library parses. Folding, the harder half, is ClusterShell's NodeSet, which HPC sites trust.
"""

from __future__ import annotations

import itertools
import re
import string
from collections.abc import Iterable

from ClusterShell.NodeSet import NodeSet, NodeSetException

_NAME_CHARS = re.compile(r"^[A-Za-z0-9._\-\[\]:,/]+$")
_SLURM_ITEM = re.compile(r"^([0-9]+)-([0-9]+)(?:/([0-9]+))?$")
_ANSIBLE_ITEM = re.compile(r"^([0-9]*|[A-Za-z]):([0-9]+|[A-Za-z])(?::([0-9]+))?$")
_MAX_RANGE = 100_000
_LETTERS = string.ascii_lowercase + string.ascii_uppercase


class RangeError(ValueError):
    """A host pattern is not a valid name or range."""


def _numeric(start: str, end: str, stride: int, item: str, pattern: str) -> list[str]:
    """`01`..`16` keeps the zero padding of the start, as both Ansible and Slurm do."""
    lo, hi = int(start), int(end)
    if lo > hi:
        raise RangeError(f"range '[{item}]' in '{pattern}' runs backwards")
    if hi - lo > _MAX_RANGE:
        raise RangeError(f"range '[{item}]' in '{pattern}' is larger than {_MAX_RANGE} names")
    width = len(start) if start.startswith("0") else 0
    return [str(i).zfill(width) for i in range(lo, hi + 1, stride)]


def _item(item: str, pattern: str) -> list[str]:
    """Expand one comma item of a bracket: `7`, `01-16`, `01:16`, `1-16/2`, `01:16:2`, `a:c`,
    `:5`."""
    if item.isdigit():
        return [item]
    m = _SLURM_ITEM.match(item) or _ANSIBLE_ITEM.match(item)
    if m is None:
        raise RangeError(f"bad range '[{item}]' in '{pattern}'")
    start, end, stride_text = m.group(1) or "0", m.group(2), m.group(3)  # Ansible: [:5] is [0:5]
    stride = int(stride_text) if stride_text else 1
    if stride < 1:
        raise RangeError(f"bad stride in '[{item}]' of '{pattern}'")
    if start.isdigit() and end.isdigit():
        return _numeric(start, end, stride, item, pattern)
    if len(start) == 1 and len(end) == 1 and start in _LETTERS and end in _LETTERS:
        lo, hi = _LETTERS.index(start), _LETTERS.index(end)
        if lo > hi:
            raise RangeError(f"range '[{item}]' in '{pattern}' runs backwards")
        return list(_LETTERS[lo : hi + 1 : stride])
    raise RangeError(f"bad range '[{item}]' in '{pattern}'")


def is_range(pattern: str) -> bool:
    """True when `pattern` contains a bracket range."""
    return "[" in pattern


def expand(pattern: str) -> list[str]:
    """Expand one host pattern into its names: `gpu[01-03]` and `gpu[01:03]` -> gpu01..gpu03."""
    if not pattern or not _NAME_CHARS.match(pattern):
        # Not echoed: this may be a line of a file that is not an inventory (-i /etc/shadow).
        raise RangeError("not a host name or range (letters, digits, . _ - and [ranges] only)")
    if "[" not in pattern:
        if any(c in pattern for c in "],:/"):
            raise RangeError(f"unbalanced or misplaced brackets in '{pattern}'")
        return [pattern]
    pieces = re.split(r"(\[[^\[\]]*\])", pattern)
    choices: list[list[str]] = []
    for piece in pieces:
        if piece.startswith("[") and piece.endswith("]"):
            items = piece[1:-1].split(",")
            if not all(items):
                raise RangeError(f"empty item in range '{piece}' of '{pattern}'")
            choices.append([name for i in items for name in _item(i, pattern)])
        elif any(c in piece for c in "[],:/"):
            raise RangeError(f"unbalanced or misplaced brackets in '{pattern}'")
        else:
            choices.append([piece])
    total = 1
    for c in choices:
        total *= len(c)
    if total > _MAX_RANGE:
        raise RangeError(f"'{pattern}' expands to more than {_MAX_RANGE} names")
    names = ["".join(parts) for parts in itertools.product(*choices)]
    return list(dict.fromkeys(names))


def fold(names: Iterable[str]) -> str:
    """Fold names back into the shortest range form for messages: gpu03,gpu07 -> gpu[03,07]."""
    items = sorted(set(names))
    if not items:
        return ""
    try:
        return str(NodeSet.fromlist(items))
    except NodeSetException:
        return ",".join(items)
