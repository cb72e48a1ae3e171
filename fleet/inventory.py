"""The host inventory: Ansible's YAML format read as is, plus host selection (`--limit`)."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet import nodeset
from fleet.errors import InventoryError
from fleet.yamlfile import Where, YamlDoc, YamlFileError, load, shown

# Connection vars: Ansible's long names and fleet's short aliases.
_ADDRESS_KEYS = ("ansible_host", "host")
_PORT_KEYS = ("ansible_port", "port")
_USER_KEYS = ("ansible_user", "user")
_KEY_KEYS = ("ansible_ssh_private_key_file", "key")
_SHORT_CONNECTION_KEYS = frozenset({"host", "port", "user", "key"})
_GROUP_KEYS = frozenset({"hosts", "vars", "children"})
_GROUP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-.]*$")
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GROUP_HINT = "group names use letters, digits, _ - . (is -i pointing at an inventory?)"


@dataclass(frozen=True, eq=False)
class Host:
    """One node: how to reach it, which groups it is in, and its merged variables."""

    name: str
    address: str
    port: int | None = None
    user: str | None = None
    key_file: str | None = None
    groups: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> str:
        """`user@address:port` as an operator would type it, for messages."""
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.address}{port}"


@dataclass(frozen=True)
class Inventory:
    """All hosts in file order, and each group's members (including those of its children)."""

    path: Path
    hosts: tuple[Host, ...]
    groups: Mapping[str, tuple[str, ...]]

    def host(self, name: str) -> Host:
        """Look a host up by its inventory name."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def select(self, limit: str | None) -> list[Host]:
        """Hosts matching `--limit`: `a,b` union, `&g` intersection, `!g` exclusion (as Ansible)."""
        if limit is None or not limit.strip():
            return list(self.hosts)
        terms = _split_limit(limit)
        union: set[str] = set()
        has_union = False
        for term in terms:
            if term.startswith(("!", "&")):
                continue
            has_union = True
            union |= self._match(term)
        chosen = union if has_union else {h.name for h in self.hosts}
        for term in terms:
            if term.startswith("&"):
                chosen &= self._match(term[1:])
            elif term.startswith("!"):
                chosen -= self._match(term[1:])
        selected = [h for h in self.hosts if h.name in chosen]
        if not selected:
            raise InventoryError(
                f"{self.path}: --limit '{limit}' selects no hosts",
                hint="`fleet hosts` lists every host; groups: " + _groups_hint(self.groups),
            )
        return selected

    def _match(self, pattern: str) -> set[str]:
        """Names of the hosts one limit term names: a group, a host, a range or a glob."""
        if not pattern:
            raise InventoryError(
                "--limit has an empty term", hint="write e.g. --limit 'gpu,!gpu03'"
            )
        if pattern in self.groups:
            return set(self.groups[pattern])
        names = {h.name for h in self.hosts}
        if pattern in names:
            return {pattern}
        found: set[str] = set()
        if any(c in pattern for c in "*?"):
            for group, members in self.groups.items():
                if fnmatch.fnmatchcase(group, pattern):
                    found |= set(members)
            found |= {n for n in names if fnmatch.fnmatchcase(n, pattern)}
        elif nodeset.is_range(pattern):
            try:
                found = set(nodeset.expand(pattern)) & names
            except nodeset.RangeError as exc:
                raise InventoryError(
                    f"--limit: {exc}", hint="ranges look like gpu[01-16]"
                ) from None
        if not found:
            raise InventoryError(
                f"{self.path}: --limit term '{pattern}' matches no host or group",
                hint="groups: " + _groups_hint(self.groups),
            )
        return found


def _groups_hint(groups: Mapping[str, Sequence[str]]) -> str:
    """A short list of group names for hints."""
    names = sorted(groups)
    shown = ", ".join(names[:12])
    return shown + (f" (+{len(names) - 12} more)" if len(names) > 12 else "")


def _split_limit(limit: str) -> list[str]:
    """Split on commas outside brackets, so `gpu[01,03],cpu` stays two terms."""
    terms: list[str] = []
    depth, current = 0, ""
    for ch in limit:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += ch
    terms.append(current.strip())
    return terms


def default_path() -> Path:
    """`$FLEET_INVENTORY`, else ./inventory.yaml."""
    return Path(os.environ.get("FLEET_INVENTORY") or "inventory.yaml")


@dataclass
class _Builder:
    """Walks the YAML tree once, collecting host order, memberships and vars per layer."""

    doc: YamlDoc
    order: list[str] = field(default_factory=list)
    host_vars: dict[str, dict[str, Any]] = field(default_factory=dict)
    host_groups: dict[str, dict[str, None]] = field(default_factory=dict)
    group_vars: dict[str, dict[str, Any]] = field(default_factory=dict)
    group_depth: dict[str, int] = field(default_factory=dict)
    # Ordered sets (dicts of None): a membership test per host must not scan the group.
    members: dict[str, dict[str, None]] = field(default_factory=dict)
    var_where: dict[str, dict[str, Where]] = field(default_factory=dict)  # "g:NAME"/"h:NAME"
    children: dict[str, list[str]] = field(default_factory=dict)

    def fail(self, where: Where, message: str, hint: str) -> InventoryError:
        """An error pointing at a place in the file."""
        return InventoryError(f"{self.doc.at(where)}: {message}", hint=hint)

    def group(self, name: str, body: Any, where: Where, depth: int, stack: tuple[str, ...]) -> None:
        """Read one group: its vars, its hosts, then its children (recursively)."""
        if not isinstance(name, str) or not _GROUP_NAME.match(name):
            raise self.fail(where, f"{_quoted(name)}is not a valid group name", _GROUP_HINT)
        if name in stack:
            raise self.fail(
                where, f"group '{name}' contains itself", "remove the cycle in children"
            )
        self.members.setdefault(name, {})
        self.children.setdefault(name, [])
        self.group_depth[name] = max(self.group_depth.get(name, 0), depth)
        if body is None:
            return
        if not isinstance(body, dict):
            raise self.fail(
                where,
                f"expected a mapping with hosts/vars/children, got {_kind(body)}",
                "see the example inventory.yaml",
            )
        unknown = [k for k in body if k not in _GROUP_KEYS]
        if unknown:
            raise self.fail(
                (*where, unknown[0]),
                f"unknown key {_quoted(unknown[0])}".rstrip(),
                "a group may only have 'hosts', 'vars' and 'children'",
            )
        for key in body.get("vars") or {}:
            self.var_where.setdefault(f"g:{name}", {})[key] = (*where, "vars", key)
        self.group_vars.setdefault(name, {}).update(
            self.vars_of(body.get("vars"), (*where, "vars"))
        )
        self.hosts(name, body.get("hosts"), (*where, "hosts"))
        kids = body.get("children")
        if kids is None:
            return
        if not isinstance(kids, dict):
            raise self.fail(
                (*where, "children"),
                f"expected a mapping of groups, got {_kind(kids)}",
                "write children: {groupname: {hosts: ...}}",
            )
        for child, child_body in kids.items():
            if child not in self.children[name]:
                self.children[name].append(child)
            self.group(child, child_body, (*where, "children", child), depth + 1, (*stack, name))

    def vars_of(self, raw: Any, where: Where) -> dict[str, Any]:
        """Validate a vars mapping: string keys that are valid variable names."""
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise self.fail(
                where,
                f"expected a mapping of variables, got {_kind(raw)}",
                "write vars: {name: value}",
            )
        for key in raw:
            if not isinstance(key, str) or not _VAR_NAME.match(key):
                raise self.fail(
                    (*where, key),
                    f"{_quoted(key)}is not a valid variable name",
                    "use letters, digits and _ (not starting with a digit)",
                )
        return dict(raw)

    def hosts(self, group: str, raw: Any, where: Where) -> None:
        """Read a group's hosts mapping; keys may be ranges like gpu[01:16]."""
        if raw is None:
            return
        if not isinstance(raw, dict):
            raise self.fail(
                where,
                f"expected a mapping of host names, got {_kind(raw)}",
                "write hosts: {gpu01: {ansible_host: 10.0.0.1}} (a null value is fine)",
            )
        for pattern, body in raw.items():
            here = (*where, pattern)
            try:
                names = nodeset.expand(str(pattern))
            except nodeset.RangeError as exc:
                raise self.fail(
                    here, str(exc), "ranges look like gpu[01:16] or gpu[01-16]"
                ) from None
            host_vars = self.vars_of(body, here)
            members = self.members[group]
            for name in names:
                if name not in self.host_vars:
                    self.order.append(name)
                    self.host_vars[name] = {}
                    self.host_groups[name] = {}
                self.host_vars[name].update(host_vars)
                if host_vars:
                    origin = self.var_where.setdefault(f"h:{name}", {})
                    for key in host_vars:
                        origin[key] = (*here, key)
                self.host_groups[name][group] = None
                members[name] = None


def _quoted(name: Any) -> str:
    """`'gpu 01' ` for a message when the name looks like one; else nothing: a file that is not
    an inventory (-i /etc/shadow) must not have its lines echoed."""
    text = shown(name) if isinstance(name, str) else None
    return f"'{text}' " if text else ""


def _kind(value: Any) -> str:
    """A YAML-ish name for a value's type, for messages (never a string's text: see _quoted)."""
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


def _first(vars_: Mapping[str, Any], keys: Sequence[str]) -> tuple[str | None, Any]:
    """The first of several alias keys present, and its value."""
    for key in keys:
        if key in vars_:
            return key, vars_[key]
    return None, None


def _closure(builder: _Builder) -> dict[str, tuple[str, ...]]:
    """Each group's members including those of its descendants, in host order."""
    memo: dict[str, set[str]] = {}

    def collect(group: str) -> set[str]:
        if group not in memo:
            found = set(builder.members.get(group, {}))
            for child in builder.children.get(group, []):
                found |= collect(child)
            memo[group] = found
        return memo[group]

    position = {name: i for i, name in enumerate(builder.order)}
    return {g: tuple(sorted(collect(g), key=position.__getitem__)) for g in builder.members}


def _ancestry(builder: _Builder) -> dict[str, list[str]]:
    """Each group's ancestors (parents first), so a host inherits vars through nesting."""
    parents: dict[str, list[str]] = {}
    for parent, kids in builder.children.items():
        for kid in kids:
            parents.setdefault(kid, []).append(parent)
    out: dict[str, list[str]] = {}
    for group in builder.members:
        seen: list[str] = []
        frontier = list(parents.get(group, []))
        while frontier:
            g = frontier.pop()
            if g not in seen:
                seen.append(g)
                frontier.extend(parents.get(g, []))
        out[group] = seen
    return out


def _merged_vars(
    builder: _Builder, name: str, ancestry: Mapping[str, list[str]]
) -> tuple[dict[str, Any], dict[str, Where]]:
    """all < parent groups < child groups (by depth, then name) < host vars, as Ansible merges;
    also where in the file each winning value was written, for error messages."""
    groups = set(builder.host_groups[name])
    for g in list(groups):
        groups |= set(ancestry[g])
    groups.add("all")
    ordered = sorted(groups, key=lambda g: (g != "all", builder.group_depth.get(g, 0), g))
    merged: dict[str, Any] = {}
    origin: dict[str, Where] = {}
    for g in ordered:
        merged.update(builder.group_vars.get(g, {}))
        origin.update(builder.var_where.get(f"g:{g}", {}))
    merged.update(builder.host_vars[name])
    origin.update(builder.var_where.get(f"h:{name}", {}))
    return merged, origin


def _make_host(
    builder: _Builder,
    name: str,
    merged_and_origin: tuple[dict[str, Any], dict[str, Where]],
    groups: tuple[str, ...],
) -> Host:
    """Pull connection settings out of a host's merged vars, checking their types.

    The short forms (`host`, `port`, `user`, `key`) are connection settings only: they are not
    template variables, so an SSH `port: 2222` can never become cleanup's rendezvous `${port}`.
    """
    merged, origin = merged_and_origin
    address_key, address = _first(merged, _ADDRESS_KEYS)
    port_key, port = _first(merged, _PORT_KEYS)
    user_key, user = _first(merged, _USER_KEYS)
    key_key, key = _first(merged, _KEY_KEYS)
    if address is not None and (not isinstance(address, str) or not address.strip()):
        raise builder.fail(
            origin.get(str(address_key), ("hosts", name)),
            f"host address must be a non-empty string, got {_kind(address)}",
            "set ansible_host: 10.0.0.1 (or a DNS name)",
        )
    if port is not None:
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise builder.fail(
                origin.get(str(port_key), ("hosts", name)),
                f"host {name}: expected a port number 1-65535, got {_kind(port)}",
                "write e.g. ansible_port: 2222",
            )
    for key_name, value in ((user_key, user), (key_key, key)):
        if value is not None and not isinstance(value, str):
            raise builder.fail(
                origin.get(str(key_name), ("hosts", name)),
                f"host {name}: expected a string, got {_kind(value)}",
                "quote the value in the inventory",
            )
    return Host(
        name=name,
        address=str(address) if address else name,
        port=port,
        user=user,
        key_file=os.path.expanduser(key) if key else None,
        groups=groups,
        vars={k: v for k, v in merged.items() if k not in _SHORT_CONNECTION_KEYS},
    )


def parse(doc: YamlDoc) -> Inventory:
    """Build an Inventory from loaded YAML (Ansible's `all:` layout, or top-level groups)."""
    data = doc.data
    if data is None:
        raise InventoryError(
            f"{doc.path}: the inventory is empty", hint="see the example inventory.yaml"
        )
    if not isinstance(data, dict):
        raise InventoryError(
            f"{doc.path}: expected a mapping of groups at the top, got {_kind(data)}",
            hint="start the file with 'all:'",
        )
    builder = _Builder(doc)
    builder.members["all"] = {}
    builder.children["all"] = []
    for top, body in data.items():
        if top == "all":
            builder.group("all", body, ("all",), 0, ())
        else:
            builder.children["all"].append(top)
            builder.group(top, body, (top,), 1, ("all",))
    if not builder.order:
        raise InventoryError(
            f"{doc.path}: the inventory defines no hosts",
            hint="add hosts under all.hosts or a group's hosts",
        )
    closure = _closure(builder)
    ancestry = _ancestry(builder)
    # Each host's groups in closure order, by walking each group's members once (asking every
    # group whether it holds each host made loading quadratic: minutes at 100k hosts).
    groups_of: dict[str, list[str]] = {name: [] for name in builder.order}
    for group, members in closure.items():
        if group != "all":
            for name in members:
                groups_of[name].append(group)
    hosts = []
    for name in builder.order:
        merged = _merged_vars(builder, name, ancestry)
        hosts.append(_make_host(builder, name, merged, tuple(groups_of[name])))
    closure["all"] = tuple(builder.order)
    return Inventory(path=doc.path, hosts=tuple(hosts), groups=closure)


def load_inventory(path: Path | None = None) -> Inventory:
    """Read the inventory file; every problem is an InventoryError with file, place and hint."""
    chosen = path or default_path()
    try:
        doc = load(chosen)
    except YamlFileError as exc:
        hint = exc.hint or "fix the YAML at that line"
        if "no such file" in str(exc):
            hint = "pass -i PATH or set FLEET_INVENTORY; `fleet sandbox up` makes a test fleet"
        raise InventoryError(str(exc), hint=hint) from None
    return parse(doc)
