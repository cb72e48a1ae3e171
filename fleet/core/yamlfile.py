"""Load a YAML file into plain data, remembering each key's line so errors can point at it.

The data is built straight from the parser's events (libyaml's C parser when PyYAML has it) in one
loop, instead of PyYAML's composer and constructor, for three reasons:

* speed: the pure-Python scanner and a constructor per scalar made a 100k-host inventory take
  minutes; events from the C parser plus this loop take seconds;
* bounds: an alias (`*name`) is a copy of its anchor's value, so a dozen lines of nested aliases
  (a "billion laughs" file) expand to billions of values. Each anchor's expanded size is known when
  it closes, so an alias that would push the file past its budget is refused before anything is
  copied. Nesting is capped too (libyaml's composer recurses in C and crashes on ~40k levels; the
  loop here does not recurse at all, but whatever reads the data later might);
* errors that name the file, line and problem but never echo the file's text (an inventory path
  pointed at /etc/shadow must not print a password hash): quoted text is cut from parser messages,
  and keys are only shown when they look like names (`shown`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import yaml

Where = tuple[str | int, ...]

# Bigger than any inventory or playbook (100k hosts are ~7 MB); reading stops there, so an
# inventory path pointed at /dev/zero or a huge log fails fast instead of filling memory.
MAX_BYTES = 128 * 1024 * 1024
# Inventories nest a few levels per group; hundreds of levels is a hostile or broken file.
MAX_DEPTH = 200
# Aliases may add this many values, or 10x the values written out in the file, whichever is more:
# reusing a vars block on every host of a 100k-host file fits, a billion laughs does not.
ALIAS_FLOOR = 100_000
ALIAS_FACTOR = 10

_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_AS_TEXT_TAGS = frozenset({_MERGE_TAG, "tag:yaml.org,2002:value"})
# Keys shown in messages: names, host ranges and var names as inventories write them (':' and
# '/' only inside brackets, so a passwd or DES-crypt shadow line does not qualify). Matched on at
# most `limit` characters, so the regex cannot backtrack for long.
_SHOWN = re.compile(r"^(?:[A-Za-z0-9_.\- ]|\[[A-Za-z0-9:,/\-]*\]?)+$")
_QUOTED = re.compile(r"""\s*('[^']*'|"[^"]*")""")
_Parser = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def shown(key: Any, limit: int = 64) -> str | None:
    """`key` as it may appear in a message, or None when it does not look like a name (then it
    may be a line of some other file, e.g. a password hash, and must not be echoed)."""
    if isinstance(key, int):  # bool too
        return str(key)
    if isinstance(key, str) and 0 < len(key) <= limit and _SHOWN.match(key):
        return key
    return None


@dataclass(frozen=True)
class YamlDoc:
    """Plain data (dicts, lists, scalars) plus the line of every mapping key and list item."""

    path: Path
    data: Any
    lines: dict[Where, int] = field(default_factory=dict)

    def at(self, where: Where) -> str:
        """`inventory.yaml:12: all.children.gpu.hosts` for an error message."""
        line = None
        probe = where
        while probe and line is None:
            line = self.lines.get(probe)
            probe = probe[:-1]
        dotted = ".".join(shown(p) or "<key>" for p in where) or "(top level)"
        return f"{self.path}:{line}: {dotted}" if line else f"{self.path}: {dotted}"


class YamlFileError(Exception):
    """The file cannot be read or is not valid YAML; message names file and line, never the
    file's text; `hint` (may be empty) says what to do."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


def load(path: Path, opener: Callable[[Path], BinaryIO] | None = None) -> YamlDoc:
    """Read and parse `path`; every failure is a YamlFileError naming the file (and line).
    `opener` opens it instead of Path.open (fleet.core.trust.open_checked: what is checked is what
    is read); what it raises beyond OSError passes through."""
    try:
        with (opener or _open)(path) as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise YamlFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise YamlFileError(
            f"{path}: is a directory, not a YAML file", hint="name the file itself"
        ) from None
    except PermissionError:
        raise YamlFileError(
            f"{path}: permission denied", hint="check the file's owner and mode"
        ) from None
    except OSError as exc:
        raise YamlFileError(f"{path}: cannot read: {exc.strerror or type(exc).__name__}") from None
    if len(raw) > MAX_BYTES:
        raise YamlFileError(
            f"{path}: larger than {MAX_BYTES // (1024 * 1024)} MiB, not an inventory or playbook",
            hint="check the path",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlFileError(
            f"{path}: not UTF-8 text (invalid byte at offset {exc.start})",
            hint="check the path: this does not look like a YAML file",
        ) from None
    return loads(text, path)


def _open(path: Path) -> BinaryIO:
    return path.open("rb")


def loads(text: str, path: Path) -> YamlDoc:
    """Parse YAML text attributed to `path`."""
    builder = _Builder(path)
    try:
        for event in yaml.parse(text, Loader=_Parser):
            builder.feed(event)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise YamlFileError(f"{where}: invalid YAML: {_problem(exc)}") from None
    except yaml.YAMLError:
        raise YamlFileError(f"{path}: invalid YAML") from None
    return YamlDoc(path, builder.root, builder.lines)


def _problem(exc: yaml.MarkedYAMLError) -> str:
    """The parser's complaint without the file's text: quoted excerpts are cut, token names such
    as '<block end>' are kept."""
    problem = exc.problem or exc.context or "syntax error"
    if "nesting depth" in problem:  # libyaml builds that cap depth before our own check runs
        return "nested too many levels deep (flatten the structure)"

    def keep_tokens(m: re.Match[str]) -> str:
        inner = m.group(1)[1:-1]
        return m.group(0) if re.fullmatch(r"<[a-z ]+>", inner) else ""

    return _QUOTED.sub(keep_tokens, problem).strip() or "syntax error"


class _Open:
    """A mapping or sequence being built: where it is, its anchor, its expanded size so far."""

    __slots__ = ("anchor", "key", "key_line", "size", "value", "where")

    def __init__(self, value: dict[Any, Any] | list[Any], where: Where, anchor: str | None):
        self.value = value
        self.where = where
        self.anchor = anchor
        self.size = 1
        self.key: Any = _NO_KEY
        self.key_line = 0


_NO_KEY = object()


class _Builder:
    """Turns parser events into plain data, refusing what fleet's files must not contain."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: dict[Where, int] = {}
        self.root: Any = None
        self.stack: list[_Open] = []
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.written = 0  # values spelled out in the file
        self.expanded = 0  # values aliases added on top
        self.documents = 0
        self.resolver = yaml.resolver.Resolver()
        self.constructor = yaml.constructor.SafeConstructor()

    def fail(self, event: yaml.Event, message: str, hint: str = "") -> YamlFileError:
        return YamlFileError(f"{self.path}:{_line(event)}: {message}", hint=hint)

    def feed(self, event: yaml.Event) -> None:
        """Handle one event; values are added to the innermost open collection."""
        if isinstance(event, yaml.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                raise self.fail(event, "more than one YAML document (a second '---')")
        elif isinstance(event, yaml.ScalarEvent):
            self.written += 1
            value = self.scalar(event)
            self.remember(event.anchor, value, 1)
            self.add(event, value, 1)
        elif isinstance(event, yaml.AliasEvent):
            self.alias(event)
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            self.open(event)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            done = self.stack.pop()
            self.remember(done.anchor, done.value, done.size)
            self.add(event, done.value, done.size, opened=True)

    def open(self, event: yaml.MappingStartEvent | yaml.SequenceStartEvent) -> None:
        """Start a collection under the current key or list index."""
        if len(self.stack) >= MAX_DEPTH:
            raise self.fail(
                event, f"nested more than {MAX_DEPTH} levels deep", "flatten the structure"
            )
        self.written += 1
        where: Where = ()
        if self.stack:
            top = self.stack[-1]
            if isinstance(top.value, dict) and top.key is _NO_KEY:
                raise self.fail(event, "a key must be a plain value")
            where = self.child_where(top, event)
        value: dict[Any, Any] | list[Any] = {} if isinstance(event, yaml.MappingStartEvent) else []
        self.stack.append(_Open(value, where, event.anchor))

    def child_where(self, top: _Open, event: yaml.Event) -> Where:
        """The path of the value that starts at `event`; list items record their line here."""
        if isinstance(top.value, list):
            where = (*top.where, len(top.value))
            self.lines[where] = _line(event)
            return where
        return (*top.where, top.key)

    def alias(self, event: yaml.AliasEvent) -> None:
        """A copy of an anchor's value, if the file's alias budget allows it."""
        if any(o.anchor == event.anchor for o in self.stack):
            raise self.fail(event, "an alias refers to the collection it is in (recursive)")
        if event.anchor not in self.anchors:
            raise self.fail(event, "alias to an undefined anchor")
        value, size = self.anchors[event.anchor]
        budget = max(ALIAS_FLOOR, ALIAS_FACTOR * self.written)
        if self.expanded + size > budget:
            raise self.fail(
                event,
                f"aliases expand this file to more than {budget} values (a YAML alias bomb?)",
                "write the values out instead of nesting aliases",
            )
        self.expanded += size
        self.add(event, copy.deepcopy(value), size)

    def remember(self, anchor: str | None, value: Any, size: int) -> None:
        if anchor is not None:
            self.anchors[anchor] = (value, size)

    def add(self, event: yaml.Event, value: Any, size: int, opened: bool = False) -> None:
        """Put a finished value into the open collection (or make it the document)."""
        if not self.stack:
            self.root = value
            return
        top = self.stack[-1]
        top.size += size
        if isinstance(top.value, list):
            if not opened:
                self.lines[(*top.where, len(top.value))] = _line(event)
            top.value.append(value)
            return
        if top.key is _NO_KEY:
            self.key(top, event, value)
            return
        top.value[top.key] = value
        top.key = _NO_KEY

    def key(self, top: _Open, event: yaml.Event, key: Any) -> None:
        """A mapping key: plain, not a merge (`<<`), not seen before in this mapping."""
        line = _line(event)
        if key is _MERGE:
            raise self.fail(event, "'<<' merge keys are not supported")
        if isinstance(key, (dict, list)):
            raise self.fail(event, "a key must be a plain value")
        if key in top.value:
            first = self.lines.get((*top.where, key))
            name = shown(key)
            raise self.fail(
                event,
                (f"duplicate key '{name}'" if name else "duplicate key")
                + (f" (first defined on line {first})" if first else ""),
                "remove one of them (YAML would silently keep the last)",
            )
        self.lines[(*top.where, key)] = line
        top.key = key

    def scalar(self, event: yaml.ScalarEvent) -> Any:
        """A scalar with the safe loader's rules (ints, bools, nulls, dates, strings)."""
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolver.resolve(  # type: ignore[no-untyped-call]
                yaml.ScalarNode, event.value, event.implicit
            )
        if tag == _STR_TAG:
            return event.value
        if tag in _AS_TEXT_TAGS:
            in_key = bool(self.stack) and isinstance(self.stack[-1].value, dict)
            if tag == _MERGE_TAG and in_key and self.stack[-1].key is _NO_KEY:
                return _MERGE
            return event.value
        construct = self.constructor.yaml_constructors.get(tag)
        if construct is None:
            raise self.fail(event, "unsupported YAML tag", "remove the !tag")
        node = yaml.ScalarNode(tag, event.value, None, None, event.style)
        try:
            return construct(self.constructor, node)
        except (yaml.YAMLError, ValueError, OverflowError, TypeError):
            kind = tag.rpartition(":")[2]
            hint = "quote it to keep it as text"
            raise self.fail(event, f"not a valid {kind} value", hint) from None


def _line(event: yaml.Event) -> int:
    """The 1-based line an event starts on."""
    return event.start_mark.line + 1 if event.start_mark is not None else 0


class _Merge:
    """The `<<` key marker."""


_MERGE = _Merge()
