"""The inventory as Ansible builds it, from any number of files in any format.

Every source (YAML or INI file, host list) feeds one `InventoryData`, as Ansible's parsers feed
its `InventoryData`: groups with their own hosts, children and vars; hosts with their vars and
direct groups, in the order they were first seen. `reconcile` then does what Ansible does once
everything is read (groups without a parent go under `all`, hosts in no group go to
`ungrouped`), and `layers` says which group vars apply to a host in Ansible's precedence order.

Each value remembers where it was written (file, line, place), so errors point at it without
quoting it: inventory files and group_vars hold secrets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fleet.core import nodeset
from fleet.core.errors import InventoryError
from fleet.core.hosts import Origin
from fleet.core.yamlfile import Where, shown

GROUP_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-.]*$")
VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
GROUP_HINT = "group names use letters, digits, _ - . (is -i pointing at an inventory?)"
VAR_HINT = "variable names use letters, digits and _ (not starting with a digit)"
PRIORITY_VAR = "ansible_group_priority"
# Groups of groups nest a few levels; hundreds is a broken or hostile file (each group's
# ancestors are kept, so depth costs memory).
MAX_GROUP_DEPTH = 200
# Per inventory, all sources together (docs/reference/inventory.md: Limits).
MAX_HOSTS = nodeset.MAX_NAMES


class Source(Protocol):
    """One file (or -i argument) that inventory data came from."""

    path: Path

    def at(self, where: Where) -> str:
        """`FILE:LINE: place` for a message (never the file's text)."""

    def line(self, where: Where) -> int | None:
        """The line `where` is on, when known."""


# Where a value was written: the index of its Source in InventoryData.sources, and the place.
Place = tuple[int, Where]


@dataclass
class GroupData:
    """One group as the files define it (its own hosts only; members come from `closure`)."""

    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    var_places: dict[str, Place] = field(default_factory=dict)
    # Ordered sets (dicts of None): membership tests must not scan.
    hosts: dict[str, None] = field(default_factory=dict)
    children: dict[str, None] = field(default_factory=dict)
    parents: dict[str, None] = field(default_factory=dict)
    priority: int = 1
    place: Place | None = None  # where it was first named


@dataclass
class HostData:
    """One host: its own vars (all sources merged, later wins) and the groups it was put in."""

    name: str
    place: Place
    vars: dict[str, Any] = field(default_factory=dict)
    var_places: dict[str, Place] = field(default_factory=dict)
    groups: dict[str, None] = field(default_factory=dict)


class InventoryData:
    """Hosts and groups from every source, merged as Ansible merges them."""

    def __init__(self) -> None:
        self.sources: list[Source] = []
        self.hosts: dict[str, HostData] = {}
        self.groups: dict[str, GroupData] = {}
        self.groups["all"] = GroupData("all")
        self.groups["ungrouped"] = GroupData("ungrouped")
        self.add_child("all", "ungrouped", None)
        self.var_names: set[str] = set()  # names already checked
        self.warnings: list[str] = []  # what a source left out and says so (`!vault` values)

    # ------------------------------------------------------------ building

    def add_source(self, source: Source) -> int:
        self.sources.append(source)
        return len(self.sources) - 1

    def at(self, place: Place) -> str:
        """`FILE:LINE: place` of a value, for messages."""
        index, where = place
        return self.sources[index].at(where)

    def origin(self, place: Place) -> Origin:
        index, where = place
        source = self.sources[index]
        return Origin(source.path, source.line(where))

    def check_room(self, names: Iterable[str], place: Place) -> None:
        """Refuse the names at `place` when they would take the inventory past MAX_HOSTS hosts
        (each pattern is bounded before it is expanded, so this holds memory to two bounds)."""
        total = len(self.hosts) + sum(1 for name in names if name not in self.hosts)
        if total > MAX_HOSTS:
            raise self.fail(
                place,
                f"the inventory reaches {total:,} hosts here, more than {MAX_HOSTS:,}",
                f"fleet takes at most {MAX_HOSTS:,} hosts per inventory; check the ranges",
            )

    def fail(self, place: Place, message: str, hint: str) -> InventoryError:
        return InventoryError(f"{self.at(place)}: {message}", hint=hint)

    def add_group(self, name: Any, place: Place) -> GroupData:
        """The group called `name`, created if new; a name that is not one is an error."""
        check_group_name(self, name, place)
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = GroupData(name, place=place)
        return group

    def add_child(self, parent: str, child: str, place: Place | None) -> None:
        """Make `child` a child of `parent` (both exist); a cycle is an error."""
        if child == parent or self._reaches(child, parent):
            assert place is not None  # the built-in all/ungrouped link cannot loop
            raise self.fail(
                place, f"group '{child}' contains itself", "remove the cycle in children"
            )
        self.groups[parent].children.setdefault(child, None)
        self.groups[child].parents.setdefault(parent, None)

    def _reaches(self, start: str, target: str) -> bool:
        """True when `target` is `start` or one of its descendants."""
        seen: set[str] = set()
        stack = [start]
        while stack:
            name = stack.pop()
            if name == target:
                return True
            if name not in seen:
                seen.add(name)
                stack.extend(self.groups[name].children)
        return False

    def add_host(self, name: str, group: str | None, place: Place, port: int | None = None) -> None:
        """Add a host (first sight fixes its place in the order) and put it in `group`."""
        host = self.hosts.get(name)
        if host is None:
            host = self.hosts[name] = HostData(name, place)
        if group is not None:
            self.groups[group].hosts.setdefault(name, None)
            host.groups.setdefault(group, None)
        if port is not None:
            self.set_host_var(name, "ansible_port", port, place)

    def set_host_var(self, name: str, key: Any, value: Any, place: Place) -> None:
        if key not in self.var_names:
            check_var_name(self, key, place)
            self.var_names.add(key)
        host = self.hosts[name]
        host.vars[key] = value
        host.var_places[key] = place

    def set_group_var(self, name: str, key: Any, value: Any, place: Place) -> None:
        """A group var; `ansible_group_priority` sets the group's priority, as in Ansible."""
        check_var_name(self, key, place)
        group = self.groups[name]
        if key == PRIORITY_VAR:
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise self.fail(place, f"{PRIORITY_VAR} must be a number", "e.g. 10")
            try:
                group.priority = int(value)
            except ValueError:
                raise self.fail(place, f"{PRIORITY_VAR} must be a number", "e.g. 10") from None
            return
        group.vars[key] = value
        group.var_places[key] = place

    # ------------------------------------------------------------ once everything is read

    def reconcile(self) -> None:
        """Ansible's last pass: top-level groups become children of `all`; a host in no group
        goes to `ungrouped`, and leaves it when it is in another group too."""
        for name, group in self.groups.items():
            if name != "all" and not group.parents:
                self.add_child("all", name, None)
        self.depths()  # refuses absurd nesting before ancestors are collected
        ancestors = self.ancestors()
        ungrouped = self.groups["ungrouped"]
        for name, host in self.hosts.items():
            mine: set[str] = set()
            for g in host.groups:
                mine.add(g)
                mine |= ancestors[g]
            if "ungrouped" in mine:
                if mine - {"all", "ungrouped"}:
                    ungrouped.hosts.pop(name, None)
                    host.groups.pop("ungrouped", None)
            elif not mine - {"all"}:
                ungrouped.hosts[name] = None
                host.groups["ungrouped"] = None

    def topological(self) -> list[str]:
        """Groups parents first (the graph has no cycles: add_child refuses them). Iterative: an
        INI file can chain thousands of groups, deeper than Python's recursion limit."""
        waiting = {name: len(group.parents) for name, group in self.groups.items()}
        ready = [name for name, count in waiting.items() if count == 0]
        order: list[str] = []
        while ready:
            name = ready.pop()
            order.append(name)
            for child in self.groups[name].children:
                waiting[child] -= 1
                if waiting[child] == 0:
                    ready.append(child)
        return order

    def ancestors(self) -> dict[str, set[str]]:
        """Each group's ancestors (parents, their parents, ...)."""
        found: dict[str, set[str]] = {}
        for name in self.topological():
            mine: set[str] = set()
            for parent in self.groups[name].parents:
                mine.add(parent)
                mine |= found[parent]
            found[name] = mine
        return found

    def depths(self) -> dict[str, int]:
        """Ansible's group depth: `all` is 0, a child is one deeper than its deepest parent."""
        depth: dict[str, int] = {}
        for name in self.topological():
            group = self.groups[name]
            depth[name] = 1 + max(depth[p] for p in group.parents) if group.parents else 0
            if depth[name] > MAX_GROUP_DEPTH and group.place is not None:
                raise self.fail(
                    group.place,
                    f"groups nested more than {MAX_GROUP_DEPTH} levels deep",
                    "flatten the children",
                )
        return depth

    def host_groups(self, ancestors: Mapping[str, set[str]]) -> dict[str, frozenset[str]]:
        """Every group each host is in, through nesting (`all` included)."""
        out: dict[str, frozenset[str]] = {}
        cache: dict[tuple[str, ...], frozenset[str]] = {}
        for name, host in self.hosts.items():
            direct = tuple(host.groups)
            found = cache.get(direct)
            if found is None:
                mine: set[str] = {"all"}
                for g in direct:
                    mine.add(g)
                    mine |= ancestors[g]
                found = cache[direct] = frozenset(mine)
            out[name] = found
        return out


def check_group_name(data: InventoryData, name: Any, place: Place) -> None:
    """Group names are words (they appear in patterns and messages)."""
    if not isinstance(name, str) or not GROUP_NAME.match(name):
        raise data.fail(place, f"{quoted(name)}is not a valid group name", GROUP_HINT)


def check_var_name(data: InventoryData, key: Any, place: Place) -> None:
    """Variable names are identifiers, as Ansible documents them."""
    if not isinstance(key, str) or not VAR_NAME.match(key):
        raise data.fail(place, f"{quoted(key)}is not a valid variable name", VAR_HINT)


def quoted(name: Any) -> str:
    """`'gpu 01' ` for a message when the name looks like one; else nothing: a file that is not
    an inventory (-i /etc/shadow) must not have its lines echoed."""
    text = shown(name) if isinstance(name, str) else None
    return f"'{text}' " if text else ""


def kind(value: Any) -> str:
    """A YAML-ish name for a value's type, for messages (never a string's text: see quoted)."""
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return "nothing" if value is None else type(value).__name__


def sort_groups(names: Iterable[str], depths: Mapping[str, int], data: InventoryData) -> list[str]:
    """Ansible's order for merging group vars: by depth, then priority, then name."""
    return sorted(names, key=lambda g: (depths[g], data.groups[g].priority, g))


# `name:port` with the name possibly holding [ranges], as Ansible's parse_address reads it.
_HOST_PORT = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$")
RANGE_HINT = "host names use letters, digits, . _ -; ranges look like gpu[01:16] or gpu[01-16]"


def host_pattern(data: InventoryData, pattern: Any, place: Place) -> tuple[list[str], int | None]:
    """The names a host key or INI host stands for (`gpu[01:16]`, `gpu[01-16]`), and the port
    of a `name:port` form. Errors quote the pattern only when it looks like a name."""
    if not isinstance(pattern, str):
        raise data.fail(
            place, f"host names must be text, got {kind(pattern)}", "quote it in the inventory"
        )
    text, port = pattern, None
    match = _HOST_PORT.match(text)
    if match:
        text, port = match.group(1), int(match.group(2))
        if not 1 <= port <= 65535:
            raise data.fail(place, f"port {port} is not 1-65535", "write e.g. gpu01:2222")
    if not text or not (text[0].isalnum() or text[0] in "_["):
        raise data.fail(place, f"{quoted(text)}is not a host name or range", RANGE_HINT)
    try:
        names = nodeset.expand(text)
    except nodeset.RangeError as exc:
        # The reason quotes the pattern: given only when the pattern looks like a name.
        reason = str(exc) if shown(text) else "not a host name or range"
        raise data.fail(place, reason, RANGE_HINT) from None
    data.check_room(names, place)
    return names, port
