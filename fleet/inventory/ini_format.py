"""Ansible's INI inventory format (its default, `/etc/ansible/hosts`), read as Ansible's `ini`
inventory plugin reads it:

    mail.example.com                  # hosts before any section are ungrouped
    [webservers]
    www[01:50:10].example.com         # ranges; `name:port`; `key=value` host vars (shell-quoted)
    [dbservers]
    db-[a:c].example.com ansible_user=deploy
    [prod:children]                   # groups of groups
    webservers
    [prod:vars]                       # group vars: the rest of the line after '=' is the value
    ntp_server=ntp.example.com

Values are read as Python literals when they are one (`30` is a number, `True` a boolean,
`['a']` a list) and kept as text otherwise, as Ansible does. `;` and `#` start comment lines; on a
host line `#` starts a comment, on a `[g:vars]` line it does not (Ansible keeps it in the value).

Unlike Ansible's, errors never quote the line: it may hold a secret, or belong to some other file.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.core.yamlfile import Where, shown
from fleet.inventory.build import InventoryData, Place, check_group_name, host_pattern

_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_GROUP_LINE = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")
_STATES = ("hosts", "children", "vars")
_COMMENTS = ("#", ";")
SECTION_HINT = "sections are [group], [group:children] or [group:vars], without spaces"


class IniSource:
    """An INI file as a place values come from: `where` is (line,) or (line, name)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def at(self, where: Where) -> str:
        if not where:
            return str(self.path)
        text = f"{self.path}:{where[0]}"
        if len(where) > 1:
            label = shown(where[1])
            text += f": {label}" if label else ": <key>"
        return text

    def line(self, where: Where) -> int | None:
        return int(where[0]) if where else None


@dataclass
class _Pending:
    """A group named in `[g:vars]` or listed as a child before it is declared."""

    state: str
    line: int
    parents: list[str] = field(default_factory=list)


def parse(path: Path, lines: list[str], data: InventoryData) -> None:
    """Add an INI file's groups, hosts and vars. `lines` are the file's decoded lines."""
    index = data.add_source(IniSource(path))
    pending: dict[str, _Pending] = {}
    group, state = "ungrouped", "hosts"
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line[0] in _COMMENTS:
            continue
        place: Place = (index, (number,))
        section = _SECTION.match(line)
        if section:
            group, state = _section(data, section, place, pending)
            continue
        if line.startswith("[") and line.endswith("]"):
            raise data.fail(place, "not a valid section header", SECTION_HINT)
        if state == "hosts":
            _host_line(data, line, group, index, number)
        elif state == "vars":
            key, sep, value = line.partition("=")
            if not sep:
                raise data.fail(place, "expected key=value", f"[{group}:vars] lines set variables")
            key = key.strip()
            data.set_group_var(group, key, literal(value.strip()), (index, (number, key)))
        else:
            match = _GROUP_LINE.match(line)
            if match is None:
                raise data.fail(place, "expected a group name", f"[{group}:children] lists groups")
            child = match.group(1)
            if child in data.groups:
                data.add_child(group, child, place)
            elif child in pending:
                pending[child].parents.append(group)
            else:
                check_group_name(data, child, place)
                pending[child] = _Pending("children", number, [group])
    for name, declaration in pending.items():
        place = (index, (declaration.line,))
        if declaration.state == "vars":
            raise data.fail(
                place,
                f"[{name}:vars] for a group that is never declared",
                f"declare it with a [{name}] or [{name}:children] section",
            )
        raise data.fail(
            place,
            f"[{declaration.parents[-1]}:children] lists '{name}', a group that is never declared",
            f"declare it with a [{name}] or [{name}:children] section",
        )


def _section(
    data: InventoryData, match: re.Match[str], place: Place, pending: dict[str, _Pending]
) -> tuple[str, str]:
    """A `[name]`, `[name:children]` or `[name:vars]` header: the group and what follows."""
    name, state = match.group(1), match.group(2) or "hosts"
    if state not in _STATES:
        raise data.fail(place, f"unknown section type '{shown(state) or '?'}'", SECTION_HINT)
    if name not in data.groups:
        # [g] and [g:children] declare a group; [g:vars] only refers to one declared elsewhere.
        if state == "vars" and name not in pending:
            pending[name] = _Pending("vars", int(place[1][0]))
        data.add_group(name, place)
    declared = pending.get(name)
    if declared is not None and state != "vars":
        if declared.state == "children":
            _add_pending_children(data, name, pending, place)
        else:
            del pending[name]
    return name, state


def _add_pending_children(
    data: InventoryData, group: str, pending: dict[str, _Pending], place: Place
) -> None:
    """`group` is declared now: make it the child of every section that listed it."""
    for parent in pending[group].parents:
        data.add_child(parent, group, place)
        if parent in pending and pending[parent].state == "children":
            _add_pending_children(data, parent, pending, place)
    del pending[group]


def _host_line(data: InventoryData, line: str, group: str, index: int, number: int) -> None:
    """`name[:port] [key=value ...]`, split as a shell would (comments after `#`)."""
    place: Place = (index, (number,))
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        raise data.fail(place, "cannot split the line (unbalanced quotes?)", _HOST_HINT) from None
    if not tokens:
        return
    names, port = host_pattern(data, tokens[0], place)
    values: list[tuple[str, Any, Place]] = []
    for token in tokens[1:]:
        key, sep, value = token.partition("=")
        if not sep:
            raise data.fail(place, "expected key=value after the host name", _HOST_HINT)
        values.append((key, literal(value), (index, (number, key))))
    for name in names:
        data.add_host(name, group, place, port)
        for key, value, var_place in values:
            data.set_host_var(name, key, value, var_place)


_HOST_HINT = "a host line is: name[:port] key=value key='value with spaces' ..."


def literal(text: str) -> Any:
    """A value as Ansible's INI plugin reads it: a Python literal when it is one, else the text.
    Tuples become lists; literals JSON cannot hold (sets, bytes, complex) stay text."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    plain = _plain(value)
    return text if plain is _NOT_PLAIN else plain


_NOT_PLAIN = object()


def _plain(value: Any) -> Any:
    """`value` with tuples as lists, or _NOT_PLAIN when it holds a type JSON has no form for."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return _NOT_PLAIN if any(i is _NOT_PLAIN for i in items) else items
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            key, item = _plain(k), _plain(v)
            if key is _NOT_PLAIN or item is _NOT_PLAIN or isinstance(key, (list, dict)):
                return _NOT_PLAIN
            out[key] = item
        return out
    return _NOT_PLAIN
