"""Ansible's YAML (and JSON) inventory format, read as Ansible's `yaml` inventory plugin reads it:
top-level keys are groups; a group has `hosts`, `vars` and `children`, handled in the order the
file writes them (so hosts keep Ansible's order); host keys may be ranges and `name:port`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fleet.core.errors import InventoryError
from fleet.core.yamlfile import Where, YamlDoc, YamlFileError, loads
from fleet.inventory.ansible_vars import is_secret
from fleet.inventory.build import InventoryData, Place, host_pattern, kind, quoted

_SECTIONS = ("hosts", "vars", "children")
VAULT_MAGIC = "$ANSIBLE_VAULT;"
# The `!vault` tag of an inline encrypted value, where YAML allows a tag.
VAULT_TAG = re.compile(r"(:[ \t]+|^[ \t]*-[ \t]+|[\[,{][ \t]*)!vault(?=[ \t\r\n]|$)", re.M)
PLUGIN_HINT = (
    "fleet reads static inventories; export this one once with "
    "`ansible-inventory -i FILE --list --yaml > inventory.yaml` and pass -i inventory.yaml"
)


class YamlSource:
    """A loaded YAML file as a place that values come from."""

    def __init__(self, doc: YamlDoc) -> None:
        self.doc = doc
        self.path: Path = doc.path

    def at(self, where: Where) -> str:
        return self.doc.at(where)

    def line(self, where: Where) -> int | None:
        probe = where
        while probe:
            found = self.doc.lines.get(probe)
            if found is not None:
                return found
            probe = probe[:-1]
        return None


def is_plugin_config(data: Any) -> bool:
    """A `plugin: aws_ec2`-style file configures a dynamic inventory plugin (Ansible's `auto`)."""
    return isinstance(data, dict) and bool(data.get("plugin"))


def parse(doc: YamlDoc, data: InventoryData, vaulted: bool = False) -> None:
    """Add the groups, hosts and vars of a YAML inventory (its top level is a mapping);
    `vaulted`: it has inline `!vault` values, whose variables are left out with a warning."""
    index = data.add_source(YamlSource(doc))
    top = doc.data
    if not isinstance(top, dict):
        raise data.fail(
            (index, ()),
            f"expected a mapping of groups at the top, got {kind(top)}",
            "start the file with 'all:'",
        )
    if is_plugin_config(top):
        raise data.fail(
            (index, ("plugin",)),
            "a dynamic inventory plugin's config, not an inventory",
            PLUGIN_HINT,
        )
    reader = _Reader(data, index, vaulted)
    for name, body in top.items():
        reader.group(name, body, (name,))


class _Reader:
    def __init__(self, data: InventoryData, index: int, vaulted: bool) -> None:
        self.data = data
        self.index = index
        self.vaulted = vaulted

    def kept(self, var: Any, value: Any, where: Where) -> bool:
        """False for a variable holding an ansible-vault value, said in a warning."""
        if not (self.vaulted and left_out(var, value)):
            return True
        self.data.warnings.append(vault_warning(self.data.at(self.place(where))))
        return False

    def place(self, where: Where) -> Place:
        return (self.index, where)

    def group(self, name: Any, body: Any, where: Where) -> str:
        """One group, then its sections in file order (children recursively)."""
        group = self.data.add_group(name, self.place(where)).name
        if body is None:
            return group
        if not isinstance(body, dict):
            raise self.data.fail(
                self.place(where),
                f"expected a mapping with hosts/vars/children, got {kind(body)}",
                "see the example inventory.yaml",
            )
        for key, written in body.items():
            here = (*where, key)
            if key not in _SECTIONS:
                raise self.data.fail(
                    self.place(here),
                    f"unknown key {quoted(key)}".rstrip(),
                    "a group may only have 'hosts', 'vars' and 'children'",
                )
            # Ansible allows `hosts: web1`, `children: web`.
            value = {written: None} if isinstance(written, str) else written
            if value is None:
                continue
            if not isinstance(value, dict):
                raise self.data.fail(self.place(here), *_shape_error(key, value))
            if key == "vars":
                for var, var_value in value.items():
                    if self.kept(var, var_value, (*here, var)):
                        self.data.set_group_var(group, var, var_value, self.place((*here, var)))
            elif key == "children":
                for child, child_body in value.items():
                    child_where = (*here, child)
                    self.group(child, child_body, child_where)
                    self.data.add_child(group, child, self.place(child_where))
            else:
                for pattern, host_body in value.items():
                    self.hosts(group, pattern, host_body, (*here, pattern))
        return group

    def hosts(self, group: str, pattern: Any, body: Any, where: Where) -> None:
        """One host key (maybe a range) and its vars."""
        place = self.place(where)
        names, port = host_pattern(self.data, pattern, place)
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise self.data.fail(
                place,
                f"expected a mapping of variables, got {kind(body)}",
                "write hosts: {gpu01: {ansible_host: 10.0.0.1}} (a null value is fine)",
            )
        values = [
            (var, value, self.place((*where, var)))
            for var, value in body.items()
            if self.kept(var, value, (*where, var))
        ]
        for name in names:
            self.data.add_host(name, group, place, port)
            for var, value, var_place in values:
                self.data.set_host_var(name, var, value, var_place)


def _shape_error(section: str, value: Any) -> tuple[str, str]:
    """The message and hint for a group section that is not a mapping."""
    if section == "vars":
        return f"expected a mapping of variables, got {kind(value)}", "write vars: {name: value}"
    if section == "children":
        return (
            f"expected a mapping of groups, got {kind(value)}",
            "write children: {groupname: {hosts: ...}}",
        )
    return (
        f"expected a mapping of host names, got {kind(value)}",
        "write hosts: {gpu01: {ansible_host: 10.0.0.1}} (a null value is fine)",
    )


def load_allowing_vault(text: str, path: Path) -> tuple[YamlDoc, bool]:
    """The YAML document, and whether it has inline `!vault` values: a tag fleet's loader
    refuses, so they are read as plain text, for the rest of the file still to apply and the
    variables holding them to be left out (`left_out`)."""
    try:
        return loads(text, path), False
    except YamlFileError as exc:
        if not VAULT_TAG.search(text):
            raise InventoryError(str(exc), hint=exc.hint or "fix the YAML at that line") from None
    try:
        return loads(VAULT_TAG.sub(r"\1!!str", text), path), True
    except YamlFileError as again:
        raise InventoryError(str(again), hint=again.hint or "fix the YAML at that line") from None


def left_out(key: Any, value: Any) -> bool:
    """True for a variable holding an ansible-vault value: fleet cannot decrypt it. A password
    variable stays, to be refused like any password."""
    return has_vault(value) and not (isinstance(key, str) and is_secret(key))


def vault_warning(where: str) -> str:
    """The warning for a variable left out (`where`: FILE:LINE: its place, never its value)."""
    return f"{where}: an ansible-vault value; fleet cannot decrypt it and left the variable out"


def has_vault(value: Any) -> bool:
    """True when an inline `!vault` value is in `value` (nesting is bounded by the loader)."""
    if isinstance(value, str):
        return value.lstrip().startswith(VAULT_MAGIC)
    if isinstance(value, dict):
        return any(has_vault(v) for v in value.values())
    if isinstance(value, list):
        return any(has_vault(v) for v in value)
    return False
