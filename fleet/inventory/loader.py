"""The host inventory: Ansible's inventories read as Ansible reads them, plus host selection.

`load_inventory` takes what `-i` names (one or several): YAML/JSON and INI inventory files,
directories of them, comma-separated host lists. group_vars/ and host_vars/ beside each source and
in the playbook directory (default: the current directory, as for `ansible`) apply with Ansible's
precedence. The pieces: inventory_sources (what -i names), inventory_yaml / inventory_ini (the
formats), inventory_vars (group_vars/host_vars), inventory_build (the merged model and Ansible's
reconciliation), inventory_patterns (`--limit`), ansible_vars (connection variables).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.core import defaults, nodeset, trust
from fleet.core.digits import is_digits
from fleet.core.errors import InventoryError
from fleet.core.hosts import Host, Origin, Refusal
from fleet.inventory import patterns as inventory_patterns
from fleet.inventory import sources as inventory_sources
from fleet.inventory.ansible_vars import SHORT_KEYS, Connection, connection
from fleet.inventory.build import (
    InventoryData,
    Place,
    kind,
    sort_groups,
)
from fleet.inventory.group_vars import VarsDir

if TYPE_CHECKING:
    from fleet.inventory.hostlist import Entry

__all__ = ["Inventory", "InventoryError", "load_inventory"]


@dataclass(frozen=True)
class Inventory:
    """All hosts in inventory order (first definition), and each group's members (including
    those of its children), groups in the order they were first named."""

    path: Path
    hosts: tuple[Host, ...]
    groups: Mapping[str, tuple[str, ...]]
    # Every -i argument, in order.
    sources: tuple[str, ...] = ()
    # Each group's own hosts and children, in definition order (Ansible's order, for subscripts).
    group_hosts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    children: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Things fleet skipped and says so (an ansible-vault file it cannot decrypt).
    warnings: tuple[str, ...] = ()

    @functools.cached_property
    def host_index(self) -> dict[str, int]:
        """Host name -> position in inventory order."""
        return {h.name: i for i, h in enumerate(self.hosts)}

    def print_warnings(self) -> None:
        """Say on stderr what was skipped (paths shown as data: controls escaped)."""
        from fleet.core.safetext import clean

        for warning in self.warnings:
            print(f"fleet: warning: {clean(warning)}", file=sys.stderr)

    def host(self, name: str) -> Host:
        """Look a host up by its inventory name."""
        return self.hosts[self.host_index[name]]

    def select(self, limit: str | None) -> list[Host]:
        """Hosts matching `--limit` (Ansible's pattern syntax, plus ranges), in inventory order;
        a setting fleet refuses on any of them stops here. Only no --limit at all (None) is every
        host: an empty one (`-l "$UNSET"`) is refused by the pattern's reader."""
        if limit is None:
            selected = list(self.hosts)
        else:
            chosen = inventory_patterns.select(self, limit)
            selected = [h for h in self.hosts if h.name in chosen]
            if not selected:
                raise InventoryError(
                    f"{self.path}: --limit '{limit}' selects no hosts",
                    hint="`fleet hosts` lists every host; groups: "
                    + inventory_patterns.groups_hint(self.groups),
                )
        check_refusals(selected)
        return selected


def check_refusals(hosts: Sequence[Host]) -> None:
    """Stop on the first setting fleet refuses, naming where it is set and every selected host
    it applies to (never its value)."""
    first: Refusal | None = None
    names: list[str] = []
    for host in hosts:
        for refusal in host.refusals:
            if first is None:
                first = refusal
            if refusal == first:
                names.append(host.name)
    if first is not None:
        raise InventoryError(
            f"{first.where}: {first.reason} (applies to {nodeset.fold(names)})", hint=first.hint
        )


def env_paths() -> list[Path]:
    """`$FLEET_INVENTORY`: several paths separated by ':' (unset or empty: none); an empty item
    is refused, as the -i option refuses it (fleet.cli.options.InventoryPath)."""
    value = os.environ.get("FLEET_INVENTORY", "")
    if not value:
        return []
    items = value.split(os.pathsep)
    if not all(items):
        raise inventory_sources.empty_path("FLEET_INVENTORY")
    return [Path(p) for p in items]


def default_paths() -> list[Path]:
    """`$FLEET_INVENTORY` (several paths separated by ':'), else ./inventory.yaml."""
    return env_paths() or [Path(defaults.INVENTORY)]


@dataclass(frozen=True)
class Selection:
    """Which hosts a command is about, as the CLI read them: every -i (several merge, as in
    Ansible; none: FLEET_INVENTORY or ./inventory.yaml), whether that came from a config file
    (fleet.core.trust), every -w node set (these are the hosts; the inventory, only when named,
    says how to reach those it defines), --playbook-dir and --limit."""

    inventory: Path | Sequence[Path] | None = None
    found: bool = False
    nodes: Sequence[str] = ()
    playbook_dir: Path | None = None  # group_vars/host_vars beside the playbook (default: cwd)
    limit: str | None = None


def load_inventory(
    path: Path | str | Sequence[Path | str] | None = None,
    playbook_dir: Path | None = None,
    nodes: Sequence[Entry] | None = None,
    found: bool = False,
) -> Inventory:
    """Read every source; every problem is an InventoryError with file, place and hint.
    `playbook_dir` (default: the current directory) is where Ansible's ad-hoc and inventory
    commands look for group_vars/host_vars besides the inventory's own.

    `nodes` (`-w`, fleet.inventory.hostlist) names the hosts: the inventory is then only the one
    named (`path`, else $FLEET_INVENTORY; never an implicit ./inventory.yaml), its hosts outside the
    node set are dropped, and a node it does not define is added ungrouped, so `all`'s vars,
    group_vars/all and host_vars/NAME still apply to it. A node's `user@` wins over them.

    What fleet finds on its own obeys fleet.core.trust's rule: ./inventory.yaml (no `path`, no
    $FLEET_INVENTORY), the group_vars/host_vars of the current directory (no `playbook_dir`),
    and, with `found` (the inventory came from a config file), those beside the inventory."""
    if path is None or isinstance(path, (str, Path)):
        arguments: list[Path | str] = [path] if path is not None else []
    else:
        arguments = list(path)
    if not arguments:
        arguments = list(env_paths() if nodes else default_paths())
        found = found or not env_paths()
        if found and not nodes:
            _check_default(defaults.INVENTORY)
    data = InventoryData()
    bases = [base for a in arguments if (base := inventory_sources.add(a, data, found)) is not None]
    if nodes:
        inventory_sources.add_nodes(list(nodes), data)
    first = Path("-w" if nodes else str(arguments[0]))
    if not data.hosts:
        raise _no_hosts(first, data, len(arguments))
    data.reconcile()
    warnings: list[str] = list(data.warnings)
    play = playbook_dir if playbook_dir is not None else Path.cwd()
    found_dirs = (found, playbook_dir is None)
    inventory = _build(
        data, first, tuple(str(a) for a in arguments), bases, play, warnings, found_dirs
    )
    return _only(inventory, nodes) if nodes else inventory


def _check_default(path: str) -> None:
    """./inventory.yaml is found, not named: read it only if it passes fleet.core.trust's rule."""
    try:
        trust.check(Path(path), label=path)
    except trust.Untrusted as exc:
        trust.warn(exc)
        raise InventoryError(
            f"{path}: not read (see the warning above)",
            hint=f"name it to read it anyway (-i {path}), or fix its owner and mode",
        ) from None


def _only(inventory: Inventory, nodes: Sequence[Entry]) -> Inventory:
    """The inventory cut down to the node set, in its order, with each node's `user@` and
    `:port` (the command line wins, as ssh's `-p` over its config)."""
    hosts = tuple(
        dataclasses.replace(
            host,
            user=e.user or host.user,
            port=e.port or host.port,
        )
        for e in nodes
        for host in (inventory.host(e.name),)
    )
    keep = {h.name for h in hosts}

    def kept(members: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        return {g: tuple(h for h in names if h in keep) for g, names in members.items()}

    return dataclasses.replace(
        inventory,
        hosts=hosts,
        groups=kept(inventory.groups),
        group_hosts=kept(inventory.group_hosts),
    )


def _no_hosts(first: Path, data: InventoryData, count: int) -> InventoryError:
    if count == 1 and first.is_dir():
        return InventoryError(
            f"{first}: a directory with no hosts in its inventory files",
            hint="point -i at an inventory file, or a directory of them",
        )
    if count == 1 and not data.sources:
        return InventoryError(
            f"{first}: the inventory is empty", hint="see the example inventory.yaml"
        )
    return InventoryError(
        f"{first}: the inventory defines no hosts",
        hint="add hosts under all.hosts or a group's hosts",
    )


# Vars that apply to a host, and where each of them was written.
Layer = tuple[Mapping[str, Any], Callable[[str], Place]]


@dataclass
class _Layers:
    """The vars that apply to a set of groups, lowest precedence first, merged once per set."""

    layers: list[Layer]
    merged: dict[str, Any]


def _build(
    data: InventoryData,
    first: Path,
    sources: tuple[str, ...],
    bases: list[Path],
    playbook_dir: Path,
    warnings: list[str],
    found: tuple[bool, bool] = (False, False),
) -> Inventory:
    """Hosts with their merged vars and connection settings, groups with their members.
    `found`: whether the vars dirs beside the inventory, and in the playbook dir, were found
    rather than named (fleet.core.trust)."""
    ancestors = data.ancestors()
    depths = data.depths()
    host_groups = data.host_groups(ancestors)
    known: dict[Path, tuple[VarsDir, VarsDir]] = {}
    inventory_dirs = [_vars_dirs(b, data, warnings, known, found[0]) for b in bases]
    play_dirs = [_vars_dirs(playbook_dir, data, warnings, known, found[1])]
    host_dirs = [d for _, d in (*inventory_dirs, *play_dirs) if d.entries]
    rank = {g: i for i, g in enumerate(data.groups)}
    group_layers: dict[frozenset[str], _Layers] = {}
    shown_groups: dict[frozenset[str], tuple[str, ...]] = {}
    members: dict[str, list[str]] = {g: [] for g in data.groups}
    hosts: list[Host] = []
    for name, entry in data.hosts.items():
        mine = host_groups[name]
        for g in mine:
            members[g].append(name)
        shared = group_layers.get(mine)
        if shared is None:
            shared = group_layers[mine] = _group_layers(
                data, mine, depths, inventory_dirs, play_dirs
            )
            shown_groups[mine] = tuple(
                sorted((g for g in mine if g not in ("all", "ungrouped")), key=rank.__getitem__)
            )
        merged = dict(shared.merged)
        merged.update(entry.vars)
        own: list[Layer] = [(entry.vars, entry.var_places.__getitem__)]
        for host_dir in host_dirs:
            for layer in host_dir.layers(name):
                merged.update(layer.vars)
                own.append((layer.vars, layer.place))
        hosts.append(
            _make_host(
                data,
                name,
                merged,
                (shared.layers, own),
                shown_groups[mine],
                data.origin(entry.place),
            )
        )
    groups = {g: tuple(m) for g, m in members.items()}
    return Inventory(
        path=first,
        hosts=tuple(hosts),
        groups=groups,
        sources=sources,
        group_hosts={g: tuple(d.hosts) for g, d in data.groups.items()},
        children={g: tuple(d.children) for g, d in data.groups.items()},
        warnings=tuple(dict.fromkeys(warnings)),
    )


def _vars_dirs(
    base: Path,
    data: InventoryData,
    warnings: list[str],
    known: dict[Path, tuple[VarsDir, VarsDir]],
    found: bool,
) -> tuple[VarsDir, VarsDir]:
    """The group_vars and host_vars dirs in `base`, each read once however often it applies
    (a directory both named and found is read as named: beside an inventory -i names)."""
    real = Path(os.path.realpath(base))
    dirs = known.get(real)
    if dirs is None:
        dirs = known[real] = (
            VarsDir(base / "group_vars", data, warnings, found),
            VarsDir(base / "host_vars", data, warnings, found),
        )
    return dirs


def _group_layers(
    data: InventoryData,
    groups: frozenset[str],
    depths: Mapping[str, int],
    inventory_dirs: list[tuple[VarsDir, VarsDir]],
    play_dirs: list[tuple[VarsDir, VarsDir]],
) -> _Layers:
    """Ansible's default VARIABLE_PRECEDENCE for group vars: the inventory's `all`, the
    inventory's groups, group_vars/all beside the inventory, then beside the playbook,
    group_vars/<group> beside the inventory, then beside the playbook; groups by depth,
    priority, name."""
    ordered = sort_groups(groups - {"all"}, depths, data)
    layers: list[Layer] = []
    for g in ("all", *ordered):
        group = data.groups[g]
        layers.append((group.vars, group.var_places.__getitem__))
    for dirs in (inventory_dirs, play_dirs):
        for group_dir, _ in dirs:
            layers += [(layer.vars, layer.place) for layer in group_dir.layers("all")]
    for dirs in (inventory_dirs, play_dirs):
        for group_dir, _ in dirs:
            for g in ordered:
                layers += [(layer.vars, layer.place) for layer in group_dir.layers(g)]
    merged: dict[str, Any] = {}
    for values, _ in layers:
        merged.update(values)
    return _Layers(layers, merged)


def _make_host(
    data: InventoryData,
    name: str,
    merged: dict[str, Any],
    layers: tuple[list[Layer], list[Layer]],
    groups: tuple[str, ...],
    origin: Origin,
) -> Host:
    """Connection settings out of a host's merged vars, their types checked.

    The short forms (`host`, `port`, `user`, `key`) are connection settings only: they are not
    template variables, so an SSH `port: 2222` can never become cleanup's rendezvous `${port}`.
    Passwords are dropped: fleet never holds them.
    """

    def place_of(key: str) -> Place:
        """Where the winning value of `key` was written: the last layer that sets it."""
        shared, own = layers
        for values, place in (*reversed(own), *reversed(shared)):
            if key in values:
                found: Place = place(key)
                return found
        raise KeyError(key)

    def origin_of(key: str) -> str | None:
        try:
            return data.at(place_of(key))
        except KeyError:
            return None

    conn: Connection = connection(merged, lambda key: data.at(place_of(key)))
    keys = conn.keys or {}
    address, port, user = conn.address, conn.port, conn.user
    if address is not None and (not isinstance(address, str) or not address.strip()):
        raise data.fail(
            place_of(keys["address"]),
            f"host address must be a non-empty string, got {kind(address)}",
            "set ansible_host: 10.0.0.1 (or a DNS name)",
        )
    if port is not None:
        if isinstance(port, str) and is_digits(port.strip()):
            port = int(port)
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise data.fail(
                place_of(keys["port"]),
                f"host {name}: expected a port number 1-65535, got {kind(port)}",
                "write e.g. ansible_port: 2222",
            )
    for setting, value in (("user", user), ("key_file", conn.key_file)):
        if value is not None and not isinstance(value, str):
            raise data.fail(
                place_of(keys[setting]),
                f"host {name}: expected a string, got {kind(value)}",
                "quote the value in the inventory",
            )
    for dropped in (*SHORT_KEYS, *conn.secrets):
        merged.pop(dropped, None)
    return Host(
        name=name,
        address=address or name,
        port=port,
        user=user,
        key_file=conn.key_file,
        groups=groups,
        vars=merged,
        origin=origin,
        ssh_options=conn.ssh_options,
        refusals=conn.refusals,
        var_origin=origin_of,
    )
