"""What fleet may delete on a node, checked locally before anything connects.

Two node-side helpers delete files: the janitor (janitor-loop.sh) deletes files under an output
dir whose names match `--delete` globs, and cleanup (`op: cleanup`, act.sh) runs `rm -rf` on what
`state_paths` match.
A glob like `*.*` or a state path like `/usr/../opt` reads harmless and takes a finished
model or a system directory with it. This module refuses both before fleet connects: janitor
delete globs that would take a final model's weights, config or tokenizer (unless the operator
passes --allow-weights or keep globs that save them), and state paths outside the places
training state lives (unless allow_any_state_path). Each node is judged again with the symlinks
only it can resolve: by janitor-loop.sh, and for cleanup by fleet/node/decide.py on the node's
facts. The janitor's numbers and glob shapes are judged by fleet/node/janitor.py.

The glob check is exact, not a guess from example names: a glob is a small automaton, and
"some file name matches this delete glob and this protected pattern and no keep glob" is a
search over their product (names are finite words without `/`; the alphabet is split into the
few character ranges the globs tell apart).
"""

from __future__ import annotations

import string
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.core import nodeset
from fleet.core.errors import FleetError, InventoryError, PlaybookError, UsageError
from fleet.core.hosts import Host
from fleet.core.playbook import Playbook
from fleet.core.shell import to_text

# What a finished training run saves as its model: Hugging Face transformers/PEFT/diffusers
# weights, shard indexes, configs and tokenizers, Meta's consolidated checkpoints, GGUF, ONNX,
# TF and Flax exports. Losing one of these loses the run; none is optimizer, scheduler or RNG
# state. Not here on purpose: mp_rank_*_model_states.pt (under ZeRO 0-2 it holds the weights,
# but the janitor's default *_model_states.pt exists to delete ZeRO-3's model-state shards;
# the start warning says so). janitor-loop.sh keeps one example name per pattern (PROTECTED_NAMES)
# for its own check; tests keep the two lists in step.
PROTECTED_GLOBS: tuple[str, ...] = (
    "*.safetensors",
    "*.index.json",
    "pytorch_model*.bin",
    "model*.bin",
    "adapter_model*.bin",
    "*config.json",
    "tokenizer*.json",
    "*.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "*.gguf",
    "*.onnx",
    "tf_model*.h5",
    "flax_model*.msgpack",
    "consolidated*.pth",
    "params.json",
)

# Where cleanup may remove training state: strictly below these directories...
STATE_ROOTS: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm", "~/.cache")
# ...and these directories themselves or anything below them (CUDA's and triton's caches).
STATE_DIRS: tuple[str, ...] = ("~/.nv", "~/.triton")
STATE_PLACES_TEXT = "below /tmp, /var/tmp, /dev/shm or ~/.cache; ~/.nv, ~/.triton"

_MAX_STATES = 5_000  # product states searched before globs count as too intricate to judge
_MAX_GLOB = 1024  # characters: a file name has at most 255 bytes
_UNICODE_END = 0x110000

# ------------------------------------------------------------------------------------ globs


@dataclass(frozen=True)
class _CharSet:
    """One position of a glob: the characters it accepts (ranges of code points, inclusive)."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False

    def __contains__(self, code: object) -> bool:
        inside = any(lo <= code <= hi for lo, hi in self.ranges) if isinstance(code, int) else False
        return inside != self.negated


_ANY = _CharSet((), negated=True)
_CLASSES = {
    "alpha": string.ascii_letters,
    "digit": string.digits,
    "alnum": string.ascii_letters + string.digits,
    "upper": string.ascii_uppercase,
    "lower": string.ascii_lowercase,
    "space": " \t\n\r\f\v",
    "blank": " \t",
    "punct": string.punctuation,
    "xdigit": string.hexdigits,
    "print": "".join(chr(c) for c in range(0x20, 0x7F)),
    "graph": "".join(chr(c) for c in range(0x21, 0x7F)),
    "cntrl": "".join(chr(c) for c in range(0x20)) + "\x7f",
}

# A token is a _CharSet (one character) or None (`*`: any run of characters).
_Token = _CharSet | None


def _literal(char: str) -> _CharSet:
    return _CharSet(((ord(char), ord(char)),))


def _bracket(glob: str, start: int) -> tuple[_CharSet, int] | None:
    """The `[...]` set opening at glob[start] and the index after it; None when unterminated
    (fnmatch then reads `[` as itself)."""
    i = start + 1
    negated = i < len(glob) and glob[i] in "!^"
    if negated:
        i += 1
    ranges: list[tuple[int, int]] = []
    first = True
    while i < len(glob):
        char = glob[i]
        if char == "]" and not first:
            return _CharSet(tuple(ranges), negated), i + 1
        first = False
        if glob.startswith("[:", i):
            end = glob.find(":]", i + 2)
            chars = _CLASSES.get(glob[i + 2 : end]) if end > 0 else None
            if chars is not None:
                ranges += [(ord(c), ord(c)) for c in chars]
                i = end + 2
                continue
        if char == "\\" and i + 1 < len(glob):
            i += 1
            char = glob[i]
        if i + 2 < len(glob) and glob[i + 1] == "-" and glob[i + 2] != "]":
            ranges.append((ord(char), ord(glob[i + 2])))
            i += 3
            continue
        ranges.append((ord(char), ord(char)))
        i += 1
    return None


def _parse(glob: str) -> tuple[_Token, ...]:
    """A glob's tokens, read the way fnmatch (find -name) reads it."""
    tokens: list[_Token] = []
    i = 0
    while i < len(glob):
        char = glob[i]
        if char == "*":
            if not tokens or tokens[-1] is not None:
                tokens.append(None)
            i += 1
        elif char == "?":
            tokens.append(_ANY)
            i += 1
        elif char == "[" and (parsed := _bracket(glob, i)) is not None:
            tokens.append(parsed[0])
            i = parsed[1]
        elif char == "\\" and i + 1 < len(glob):
            tokens.append(_literal(glob[i + 1]))
            i += 2
        else:
            tokens.append(_literal(char))
            i += 1
    return tuple(tokens)


def _alphabet(globs: Sequence[tuple[_Token, ...]]) -> list[int]:
    """One representative character per range of characters that no glob tells apart; never
    `/` or NUL (not in file names)."""
    cuts = {0, 1, ord("/"), ord("/") + 1, _UNICODE_END}
    for tokens in globs:
        for token in tokens:
            for lo, hi in token.ranges if token is not None else ():
                cuts.update((lo, hi + 1))
    points = sorted(c for c in cuts if c <= _UNICODE_END)
    return [lo for lo in points[:-1] if lo not in (0, ord("/"))]


class TooComplex(ValueError):
    """The globs are too intricate to judge within the search budget."""


class _Automaton:
    """A glob as a set-of-positions automaton over an alphabet of representative characters,
    its transitions computed once each (a search visits the same ones many times)."""

    def __init__(self, tokens: tuple[_Token, ...], alphabet: Sequence[int]) -> None:
        self.tokens = tokens
        self.final = len(tokens)
        # accepts[pos][letter]: the token at pos reads that letter (a `*` reads every letter)
        self.accepts = [
            tuple(token is None or code in token for code in alphabet) for token in tokens
        ]
        self.start = self._closure({0})
        self._memo: dict[tuple[frozenset[int], int], frozenset[int]] = {}

    def _closure(self, positions: set[int]) -> frozenset[int]:
        """Positions reachable without reading a character (a `*` may match nothing)."""
        for start in list(positions):
            pos = start
            while pos < self.final and self.tokens[pos] is None:
                pos += 1
                positions.add(pos)
        return frozenset(positions)

    def step(self, positions: frozenset[int], letter: int) -> frozenset[int]:
        key = (positions, letter)
        found = self._memo.get(key)
        if found is None:
            nxt = {
                pos if self.tokens[pos] is None else pos + 1
                for pos in positions
                if pos < self.final and self.accepts[pos][letter]
            }
            found = self._memo[key] = self._closure(nxt)
        return found


def _some_name(required: Sequence[str], forbidden: Sequence[str]) -> bool:
    """True when some file name matches every `required` glob and no `forbidden` one: a
    breadth-first search of the globs' product automaton, within _MAX_STATES states."""
    if any(len(g) > _MAX_GLOB for g in [*required, *forbidden]):
        raise TooComplex("a glob longer than any file name")
    parsed = [_parse(g) for g in [*required, *dict.fromkeys(forbidden)]]
    alphabet = _alphabet(parsed)
    machines = [_Automaton(tokens, alphabet) for tokens in parsed]
    n_req = len(required)
    start = tuple(m.start for m in machines)
    seen = {start}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        for letter in range(len(alphabet)):
            nxt = tuple(m.step(s, letter) for m, s in zip(machines, state, strict=True))
            if not all(nxt[:n_req]):
                continue  # a required glob can no longer match
            accepted = [m.final in s for m, s in zip(machines, nxt, strict=True)]
            if all(accepted[:n_req]) and not any(accepted[n_req:]):
                return True
            if nxt in seen:
                continue
            if len(seen) >= _MAX_STATES:
                raise TooComplex("too intricate to check")
            seen.add(nxt)
            queue.append(nxt)
    return False


def matches_every_name(glob: str) -> bool:
    """True when `glob` matches every file name (`*`, `?*`, `*[!/]`...)."""
    return not _some_name(["*"], [glob])


def protected_matches(delete: str, keeps: Sequence[str] = ()) -> list[str]:
    """The PROTECTED_GLOBS that `delete` would take files of: some name matches both and no
    keep glob (keep always wins in the janitor)."""
    return [p for p in PROTECTED_GLOBS if _some_name([delete, p], keeps)]


def janitor_glob_problems(
    deletes: Sequence[str], keeps: Sequence[str], allow_weights: bool
) -> list[str]:
    """Why each delete glob may not run, as one phrase per glob; empty when all may."""
    problems: list[str] = []
    for glob in deletes:
        if "/" in glob:
            continue  # fleet/node/janitor.py refuses paths with its own message
        try:
            if matches_every_name(glob):
                problems.append(f"--delete '{glob}' matches every file: name what to delete")
                continue
            taken = [] if allow_weights else protected_matches(glob, keeps)
        except TooComplex:
            if not allow_weights:
                problems.append(f"--delete '{glob}' is too intricate to check for model weights")
            continue
        if taken:
            problems.append(
                f"--delete '{glob}' would delete final model weights or configs: "
                + ", ".join(taken)
            )
    return problems


# ------------------------------------------------------------------------------ state paths


def _normalise(path: str) -> str | None:
    """`//`, `.` and `..` resolved as text (`/..` is `/`); a leading `~` kept. None when `..`
    climbs out of `~` (where to, only the node knows)."""
    head, rest = ("~", path[1:]) if path.startswith("~") else ("", path)
    parts: list[str] = []
    for part in rest.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts and head:
                return None
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return head + "/" + "/".join(parts) if parts or not head else head


def _only_wildcards(name: str) -> bool:
    """Nothing but wildcards, [...] sets and dots: matches everything in its directory."""
    rest = []
    i = 0
    while i < len(name):
        if name[i] == "[" and (parsed := _bracket(name, i)) is not None:
            i = parsed[1]
            continue
        if name[i] not in "*?.\\":
            rest.append(name[i])
        i += 1
    return not rest


def state_path_problem(path: str) -> str | None:
    """Why cleanup may not remove `path` (a glob), or None. Judged as written, after `~` and
    normalising; the node judges again with its symlinks resolved."""
    if not path:
        return "is empty"
    if "\n" in path:
        return "has a newline"
    if path != "~" and not path.startswith(("/", "~/")):
        return "is relative: give an absolute path or ~/..."
    norm = _normalise(path)
    if norm is None:
        return "climbs out of ~ with ..: give the absolute path"
    shown = "" if norm == path.rstrip("/") else f"{norm}: "
    parts = norm.split("/")
    for root in STATE_ROOTS:
        depth = len(root.split("/"))
        if norm.startswith(root + "/") and len(parts) > depth:
            if _only_wildcards(parts[depth]):
                return f"{shown}'{parts[depth]}' matches everything in {root}"
            return None
    for directory in STATE_DIRS:
        if norm == directory or norm.startswith(directory + "/"):
            return None
    return f"{shown}not where training state lives ({STATE_PLACES_TEXT})"


# ------------------------------------------------------------------------- the plan's vars


def _items(value: Any) -> list[str]:
    """A var's values the way `${var|opt:--flag}` renders them (a list, or one value)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return [to_text(v) for v in items if v is not None and v != ""]


def _truthy(value: Any) -> bool:
    """The template's `flag:` truth test (fleet/core/shell.py): true/yes/1/on/y."""
    if isinstance(value, str):
        return value.strip().lower() in {"true", "yes", "1", "on", "y"}
    return bool(value)


def _value(host: Host, playbook: Playbook, overrides: Mapping[str, Any], name: str) -> Any:
    """One var for one host, as the plan sees it: --var over inventory over playbook."""
    if name in overrides:
        return overrides[name]
    if name in host.vars:
        return host.vars[name]
    return playbook.vars.get(name)


def _janitor_problem(variables: Mapping[str, Any]) -> str | None:
    if to_text(variables.get("action")) not in ("start", "run-once"):
        return None  # stop and status delete nothing
    problems = janitor_glob_problems(
        _items(variables.get("delete_patterns")),
        _items(variables.get("keep_patterns")),
        _truthy(variables.get("allow_weights")),
    )
    return "; ".join(problems) or None


def _janitor_options_problem(variables: Mapping[str, Any]) -> str | None:
    from fleet.node import janitor

    deletes = _items(variables.get("delete_patterns"))
    keeps = _items(variables.get("keep_patterns"))
    return "; ".join(janitor.problems(variables, deletes, keeps)) or None


def _state_problem(variables: Mapping[str, Any]) -> str | None:
    paths = _items(variables.get("state_paths"))
    if _truthy(variables.get("allow_any_state_path")):
        # Anywhere, but still a path the node can expand the same way every time.
        problems = [
            f"state path '{p}': is relative: give an absolute path or ~/..."
            for p in paths
            if p != "~" and not p.startswith(("/", "~/"))
        ]
    else:
        problems = [
            f"state path '{p}': {why}" for p in paths if (why := state_path_problem(p)) is not None
        ]
    return "; ".join(problems) or None


@dataclass(frozen=True)
class _Check:
    """One node-side deleter: the vars a step of it uses and how fleet judges them."""

    script: str  # a `script:` step of this script, or an `op:` step of this name
    judged: tuple[str, ...]  # the first one, in a script step's run line, marks a deleting step
    context: tuple[str, ...]  # read, but set by fleet itself (never the operator's doing)
    judge: Callable[[Mapping[str, Any]], str | None]
    hint: str


_CHECKS = (
    _Check(
        "janitor.sh",
        ("delete_patterns", "keep_patterns", "allow_weights"),
        ("action",),
        _janitor_problem,
        "narrow the glob (e.g. --delete '*_optim_states.pt'), add --keep globs for those "
        "files, or pass --allow-weights (--var allow_weights=true) if you mean to delete them",
    ),
    _Check(
        "janitor.sh",
        ("interval", "min_age", "delete_patterns", "keep_patterns"),
        ("action",),
        _janitor_options_problem,
        "seconds are digits with at most one point (--interval 3, --min-age 0.5); globs match "
        "file names, not paths, with * ? [...] only (no {a,b})",
    ),
    _Check(
        "cleanup",
        ("state_paths", "allow_any_state_path"),
        (),
        _state_problem,
        "list paths below /tmp, /var/tmp or /dev/shm, or ~/.nv, ~/.triton, ~/.cache/NAME; "
        "or pass --var allow_any_state_path=true if you mean it",
    ),
)


def value_source(
    playbook: Playbook, overrides: Mapping[str, Any], hosts: Sequence[Host], names: Sequence[str]
) -> tuple[type[FleetError], str]:
    """Where judged values came from, as the error to raise (the command line: exit 2; the
    inventory or the playbook: exit 1) and a phrase naming it."""
    if any(n in overrides for n in names):
        return UsageError, "the command line"
    if any(n in h.vars for h in hosts for n in names):
        return InventoryError, f"inventory vars of {nodeset.fold(h.name for h in hosts)}"
    return PlaybookError, f"playbook {playbook.path}"


def check_plan(playbook: Playbook, hosts: Sequence[Host], overrides: Mapping[str, Any]) -> None:
    """Refuse, before anything connects, a janitor or cleanup step that would delete what fleet
    protects: one line naming the glob or path and what it would take, and a hint. Each
    distinct set of values is judged once, however many hosts share it."""
    for check in _CHECKS:
        trigger = "${" + check.judged[0]
        if not any(
            s.op == check.script or (s.script_name == check.script and trigger in s.run)
            for s in playbook.steps
        ):
            continue
        names = (*check.judged, *check.context)
        groups: dict[str, tuple[dict[str, Any], list[Host]]] = {}
        for host in hosts:
            values = {n: _value(host, playbook, overrides, n) for n in names}
            groups.setdefault(repr(values), (values, []))[1].append(host)
        for values, group in groups.values():
            problem = check.judge(values)
            if problem is not None:
                error, where = value_source(playbook, overrides, group, check.judged)
                raise error(f"{playbook.name}: refused: {problem} (from {where})", hint=check.hint)
