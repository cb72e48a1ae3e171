"""Host ranges: expand `gpu[01-16]` / `gpu[01:16]` to names and fold names back to `gpu[03,07]`.

Expansion is written here because it must accept both conventions operators bring (Ansible's
`[01:16]`, `[01:16:2]` and `[a:c]`; Slurm's `[01-16]`, `[1-16/2]`, lists `[01-04,09]`), which no
single library parses. Folding, the harder half, is ClusterShell's NodeSet, which HPC sites trust.
The one shape nearly every fleet has, names that differ in one number (gpu01..gpu64), folds here
the way NodeSet folds it (a test holds the two together); NodeSet, which costs ~10 ms to load,
folds everything else.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import string
from collections.abc import Iterable

from fleet.core.digits import is_digits

_NAME_CHARS = re.compile(r"^[A-Za-z0-9._\-\[\]:,/]+$")
_SLURM_ITEM = re.compile(r"^([0-9]+)-([0-9]+)(?:/([0-9]+))?$")
_ANSIBLE_ITEM = re.compile(r"^([0-9]*|[A-Za-z]):([0-9]+|[A-Za-z])(?::([0-9]+))?$")
_MAX_RANGE = 100_000  # names in one range item
MAX_NAMES = 100_000  # names one pattern may stand for (docs/reference/inventory.md: Limits)
_LETTERS = string.ascii_lowercase + string.ascii_uppercase
_ONE_NUMBER = re.compile(r"^([A-Za-z._-]*)([0-9]+)([A-Za-z._-]*)$")


class RangeError(ValueError):
    """A host pattern is not a valid name or range."""


def _numeric_count(start: str, end: str, stride: int, item: str, pattern: str) -> int:
    """How many numbers `start`..`end` by `stride` holds; a backwards or oversized range is an
    error."""
    lo, hi = int(start), int(end)
    if lo > hi:
        raise RangeError(f"range '[{item}]' in '{pattern}' runs backwards")
    if hi - lo > _MAX_RANGE:
        raise RangeError(f"range '[{item}]' in '{pattern}' is larger than {_MAX_RANGE} names")
    return (hi - lo) // stride + 1


def _numeric(start: str, end: str, stride: int) -> list[str]:
    """`01`..`16` keeps the zero padding of the start, as both Ansible and Slurm do."""
    width = len(start) if start.startswith("0") else 0
    return [str(i).zfill(width) for i in range(int(start), int(end) + 1, stride)]


def _parse_item(item: str, pattern: str) -> tuple[str, str, int, int]:
    """One comma item of a bracket (`7`, `01-16`, `01:16`, `1-16/2`, `01:16:2`, `a:c`, `:5`):
    its start, end, stride and how many names it stands for, checked."""
    if is_digits(item):
        return item, item, 1, 1
    m = _SLURM_ITEM.match(item) or _ANSIBLE_ITEM.match(item)
    if m is None:
        raise RangeError(f"bad range '[{item}]' in '{pattern}'")
    start, end, stride_text = m.group(1) or "0", m.group(2), m.group(3)  # Ansible: [:5] is [0:5]
    stride = int(stride_text) if stride_text else 1
    if stride < 1:
        raise RangeError(f"bad stride in '[{item}]' of '{pattern}'")
    if is_digits(start) and is_digits(end):
        return start, end, stride, _numeric_count(start, end, stride, item, pattern)
    if len(start) == 1 and len(end) == 1 and start in _LETTERS and end in _LETTERS:
        lo, hi = _LETTERS.index(start), _LETTERS.index(end)
        if lo > hi:
            raise RangeError(f"range '[{item}]' in '{pattern}' runs backwards")
        return start, end, stride, (hi - lo) // stride + 1
    raise RangeError(f"bad range '[{item}]' in '{pattern}'")


def _item(start: str, end: str, stride: int) -> list[str]:
    """The names of one checked bracket item."""
    if is_digits(start):
        return _numeric(start, end, stride)
    return list(_LETTERS[_LETTERS.index(start) : _LETTERS.index(end) + 1 : stride])


def is_range(pattern: str) -> bool:
    """True when `pattern` contains a bracket range."""
    return "[" in pattern


Piece = str | list[tuple[str, str, int, int]]  # literal text, or a bracket's checked items


def _pieces(pattern: str) -> list[Piece]:
    """The pattern cut into literal text and brackets, every item checked, nothing expanded."""
    if not pattern or not _NAME_CHARS.match(pattern):
        # Not echoed: this may be a line of a file that is not an inventory (-i /etc/shadow).
        raise RangeError("not a host name or range (letters, digits, . _ - and [ranges] only)")
    out: list[Piece] = []
    for piece in re.split(r"(\[[^\[\]]*\])", pattern):
        if piece.startswith("[") and piece.endswith("]"):
            items = piece[1:-1].split(",")
            if not all(items):
                raise RangeError(f"empty item in range '{piece}' of '{pattern}'")
            out.append([_parse_item(i, pattern) for i in items])
        elif any(c in piece for c in "[],:/"):
            raise RangeError(f"unbalanced or misplaced brackets in '{pattern}'")
        elif piece:
            out.append(piece)
    return out


def _size(piece: Piece) -> int:
    return 1 if isinstance(piece, str) else sum(item[3] for item in piece)


def count(pattern: str) -> int:
    """How many names `pattern` stands for (an upper bound: `[1,1]` counts twice), computed
    from the ranges' sizes without building a name, so that a hostile pattern
    (`n[0-99999][0-99999]`) is refused before it costs memory. Bad syntax is a RangeError."""
    return math.prod(_size(piece) for piece in _pieces(pattern))


def shown_count(total: int) -> str:
    """`1,200,000`; a count too long to print in full, as its order of magnitude."""
    if total.bit_length() > 64:
        return f"about 10^{int(total.bit_length() * math.log10(2))}"
    return f"{total:,}"


def too_many(total: int, what: str) -> str:
    """The message for more than MAX_NAMES names."""
    return f"{what} expands to {shown_count(total)} names, more than {MAX_NAMES:,}"


def expand(pattern: str) -> list[str]:
    """Expand one host pattern into its names: `gpu[01-03]` and `gpu[01:03]` -> gpu01..gpu03.
    More than MAX_NAMES names is refused before any is built."""
    pieces = _pieces(pattern)
    total = math.prod(_size(piece) for piece in pieces)
    if total > MAX_NAMES:
        raise RangeError(too_many(total, f"'{pattern}'"))
    choices = [
        [piece] if isinstance(piece, str) else [n for item in piece for n in _item(*item[:3])]
        for piece in pieces
    ]
    names = ["".join(parts) for parts in itertools.product(*choices)]
    return list(dict.fromkeys(names))


def fold(names: Iterable[str]) -> str:
    """Fold names back into the shortest range form for messages: gpu03,gpu07 -> gpu[03,07]."""
    return _fold(tuple(sorted(set(names))))


@functools.lru_cache(maxsize=32)
def _fold(items: tuple[str, ...]) -> str:
    """fold() of sorted, distinct names. Cached: a run folds the same set several times (its
    JSON line, its record, its summary), and ClusterShell's parser costs ~1 ms per 20 names."""
    if not items:
        return ""
    # IPv6 addresses (`-w fd00::1`) stay whole: `fd00::[1-2]` would read as neither.
    addresses = [n for n in items if ":" in n]
    names = [n for n in items if ":" not in n]
    folded = names if len(names) < 2 else [_fold_one_number(names) or _fold_any(names)]
    return ",".join(folded + addresses)


def _fold_any(names: list[str]) -> str:
    from ClusterShell.NodeSet import NodeSet, NodeSetException

    try:
        return str(NodeSet.fromlist(names))
    except NodeSetException:
        return ",".join(names)


def _fold_one_number(names: list[str]) -> str | None:
    """gpu01,gpu02,gpu03,gpu05 -> gpu[01-03,05] when every name is one prefix, one number and one
    suffix, and the numbers agree on their padding: none zero-padded, or all padded to one width
    P but those that need more digits (node01..node128 -> node[01-99,100-128], NodeSet's split
    between the padded and the wider ones); None for anything else."""
    parts = [_ONE_NUMBER.match(name) for name in names]
    first = parts[0]
    if first is None:
        return None
    prefix, suffix = first.group(1), first.group(3)
    digits: list[str] = []
    for part in parts:
        if part is None or part.group(1) != prefix or part.group(3) != suffix:
            return None
        digits.append(part.group(2))
    padded = {len(d) for d in digits if len(d) > 1 and d.startswith("0")}
    if len(padded) > 1:
        return None  # several paddings: NodeSet's rules
    width = padded.pop() if padded else 0
    if any(len(d) < width for d in digits):
        return None  # gpu1 beside gpu01: NodeSet's rules
    items = _runs({int(d) for d in digits if len(d) == width}, width)
    items += _runs({int(d) for d in digits if len(d) != width}, 0)
    return f"{prefix}[{','.join(items)}]{suffix}"


def _runs(numbers: set[int], width: int) -> list[str]:
    """Runs of consecutive numbers, `low-high` or one number, each zero-padded to `width`."""
    items: list[str] = []
    # Consecutive numbers keep the same distance to their index: one group per run.
    for _, run in itertools.groupby(enumerate(sorted(numbers)), lambda pair: pair[1] - pair[0]):
        low, *rest = (str(number).zfill(width) for _, number in run)
        items.append(f"{low}-{rest[-1]}" if rest else low)
    return items
