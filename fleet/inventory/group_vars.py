"""`group_vars/` and `host_vars/` directories, read as Ansible's `host_group_vars` plugin reads
them: beside each inventory source (the -i file's directory, or the -i directory itself) and in
the playbook directory (for `ansible` and `ansible-inventory`, the current directory).

For a group or host NAME, the first of `NAME`, `NAME.yml`, `NAME.yaml`, `NAME.json` that exists
is used; when it is a directory, every file in it (and in its subdirectories without a dot in
their name) with one of those extensions or none is read, in name order, later files winning.
Hidden files and names ending in `~` are skipped. Files are YAML or JSON mappings; an empty file
is fine. Directories fleet finds on its own (the current directory's, or beside an inventory it
found) are read only as far as they pass fleet.core.trust's rule. A file encrypted with
ansible-vault is skipped with a warning, and so is a variable with an inline `!vault` value: fleet
cannot decrypt them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.core import trust
from fleet.core.errors import InventoryError
from fleet.inventory.build import InventoryData, Place, check_var_name, kind
from fleet.inventory.yaml_format import YamlSource, left_out, load_allowing_vault, vault_warning

EXTENSIONS = ("", ".yml", ".yaml", ".json")
VAULT_MAGIC = b"$ANSIBLE_VAULT;"


@dataclass(frozen=True)
class Layer:
    """The vars one file sets, and the InventoryData source index that says where each is."""

    vars: dict[str, Any]
    source: int

    def place(self, key: str) -> Place:
        return (self.source, (key,))


class VarsDir:
    """One `group_vars` or `host_vars` directory (it may not exist)."""

    def __init__(
        self, path: Path, data: InventoryData, warnings: list[str], found: bool = False
    ) -> None:
        """`found`: fleet found this directory on its own (the current directory's, or beside an
        inventory it found), so it and its files must pass fleet.core.trust's rule."""
        self.path = path
        self.data = data
        self.warnings = warnings
        self.found = found
        self._cache: dict[str, tuple[Layer, ...]] = {}
        try:
            # Listed once: looking up four names per host is 400,000 stat calls at 100k hosts.
            self.entries: frozenset[str] = (
                frozenset(os.listdir(path))
                if path.is_dir() and self._trusted(path)
                else frozenset()
            )
        except OSError as exc:
            raise InventoryError(
                f"{path}: cannot list: {exc.strerror or type(exc).__name__}",
                hint="check the directory's permissions",
            ) from None

    def layers(self, name: str) -> tuple[Layer, ...]:
        """What the files for group or host `name` set, in the order they apply."""
        if not self.entries:
            return ()
        found = self._cache.get(name)
        if found is None:
            found = self._cache[name] = tuple(self._load(name))
        return found

    def _load(self, name: str) -> list[Layer]:
        if name.startswith(os.sep):
            return []
        for ext in EXTENSIONS:
            candidate = name + ext
            if candidate not in self.entries:
                continue
            full = self.path / candidate
            if not full.exists():  # a dangling link: Ansible looks on, silently; fleet says so
                self.warnings.append(_dangling(full))
                continue
            files = _dir_files(full, self.warnings) if full.is_dir() else [full]
            return [layer for f in files if (layer := self._file(f)) is not None]
        return []

    def _trusted(self, path: Path) -> bool:
        """True unless this directory was found and `path` fails the rule (then said)."""
        if not self.found:
            return True
        try:
            trust.check(path)
        except trust.Untrusted as exc:
            self.warnings.append(exc.warning())
            return False
        return True

    def _file(self, path: Path) -> Layer | None:
        from fleet.core.textfile import read_bounded

        if not self._trusted(path):
            return None
        raw = read_bounded(path)
        if raw.startswith(VAULT_MAGIC):
            self.warnings.append(
                f"{path}: encrypted with ansible-vault; fleet cannot decrypt it and did not read it"
            )
            return None
        doc, vaulted = load_allowing_vault(_text(path, raw), path)
        index = self.data.add_source(YamlSource(doc))
        if doc.data is None:
            return None
        if not isinstance(doc.data, dict):
            raise self.data.fail(
                (index, ()),
                f"expected a mapping of variables, got {kind(doc.data)}",
                "a vars file maps names to values: 'ansible_user: deploy'",
            )
        for key in doc.data:
            check_var_name(self.data, key, (index, (key,)))
        if vaulted:
            self._drop_vaulted(doc.data, index)
        return Layer(doc.data, index)

    def _drop_vaulted(self, values: dict[str, Any], index: int) -> None:
        """Leave out variables holding an ansible-vault value, and say so."""
        for key in [k for k, v in values.items() if left_out(k, v)]:
            del values[key]
            self.warnings.append(vault_warning(self.data.at((index, (key,)))))


def _text(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError(
            f"{path}: not UTF-8 text (invalid byte at offset {exc.start})",
            hint="vars files are YAML or JSON",
        ) from None


def _dangling(path: Path) -> str:
    """The warning for a vars file that is a symlink to nothing: its vars do not apply, and a
    run must not look as if they did."""
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:  # gone meanwhile, or no link at all: an entry that cannot be read
        target = ""
    return f"{path}: a symlink to nothing{target}; its vars were not read"


def _dir_files(path: Path, warnings: list[str], depth: int = 0) -> list[Path]:
    """The vars files in a NAME/ directory, as Ansible finds them (sorted, recursive); a
    dangling symlink among them is said in `warnings`, and skipped as Ansible skips it."""
    if depth > 32:
        raise InventoryError(
            f"{path}: nested more than 32 directories deep (a symlink loop?)",
            hint="flatten the vars directory",
        )
    found: list[Path] = []
    for entry in sorted(os.listdir(path)):
        if entry.startswith(".") or entry.endswith("~"):
            continue
        full = path / entry
        ext = os.path.splitext(entry)[1]
        if full.is_dir() and not ext:
            found += _dir_files(full, warnings, depth + 1)
        elif ext in EXTENSIONS and full.is_symlink() and not full.exists():
            warnings.append(_dangling(full))
        elif full.is_file() and ext in EXTENSIONS:
            found.append(full)
    return found
