"""What `-i` can name, as Ansible reads it: an inventory file (YAML, JSON or INI, told apart as
Ansible's plugins tell them apart), a directory of them (every file in name order, recursively,
skipping hidden files, `group_vars`/`host_vars`, and Ansible's ignored extensions such as `.md`,
`.ini`, `.cfg`, `~`), or a comma-separated host list (`-i 'gpu01,gpu02'`).

Beyond Ansible: a file named by `-i` that is a hostfile (DeepSpeed's/OpenMPI's `worker-1 slots=8`,
MPICH's `worker-1:8`, a plain list of names; fleet.inventory.hostlist) adds its hosts, ungrouped,
with `slots` as their `gpus` var; and `-w`'s hosts (`add_nodes`) join whatever the inventory holds.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fleet.core import trust
from fleet.core.errors import InventoryError, UsageError
from fleet.core.textfile import read_bounded
from fleet.core.yamlfile import Where
from fleet.inventory import hostlist
from fleet.inventory import ini_format as inventory_ini
from fleet.inventory import yaml_format as inventory_yaml
from fleet.inventory.build import InventoryData, Source, host_pattern

YAML_EXTENSIONS = (".yml", ".yaml", ".json")
# Ansible's INVENTORY_IGNORE_EXTS (REJECT_EXTS plus .orig .ini .cfg .retry) and the names it
# always skips in an inventory directory.
IGNORED = re.compile(
    r"^\.|^host_vars$|^group_vars$|^vars_plugins$"
    r"|(?:\.pyc|\.pyo|\.swp|\.bak|~|\.rpm|\.md|\.txt|\.rst|\.orig|\.ini|\.cfg|\.retry)$"
)
VAULT_MAGIC = b"$ANSIBLE_VAULT;"
BOM = b"\xef\xbb\xbf"
# A line only YAML writes: `all:` alone, or an indented `key: value`.
_YAML_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.\-]*:[ \t]*(?:#.*)?|[ \t]+[\w.\-\[\]]+:(?:[ \t].*)?)$", re.M
)
MAX_DIR_DEPTH = 32
EXPORT_HINT = (
    "fleet reads static inventories; export this one once with "
    "`ansible-inventory -i SOURCE --list --yaml > inventory.yaml` and pass -i inventory.yaml"
)


class HostListSource:
    """`-i 'a,b,c'`: where = (item number,)."""

    def __init__(self) -> None:
        self.path = Path("-i host list")

    def at(self, where: Where) -> str:
        return f"{self.path}, item {where[0]}" if where else str(self.path)

    def line(self, where: Where) -> int | None:
        return None


class HostfileSource:
    """A hostfile (given to -i, or after -w's ^): where = (line,)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def at(self, where: Where) -> str:
        return f"{self.path}:{where[0]}" if where else str(self.path)

    def line(self, where: Where) -> int | None:
        return int(where[0]) if where else None


class NodeSetSource:
    """The hosts named on the command line (`-w gpu[01-16]`): where = ()."""

    def __init__(self, option: str) -> None:
        self.path = Path(option)

    def at(self, where: Where) -> str:
        return str(self.path)

    def line(self, where: Where) -> int | None:
        return None


def empty_path(where: str) -> UsageError:
    """An empty item in -i or FLEET_INVENTORY: refused, never read as '.' (the current directory,
    which may be a shared one, read as if named and so unchecked)."""
    hint = (
        "FLEET_INVENTORY takes paths separated by ':'; a stray ':' (as from $A:$B with B "
        "unset) leaves an empty one"
        if where == "FLEET_INVENTORY"
        else "give -i a path, a directory or 'host1,host2'"
    )
    return UsageError(f"empty path in {where}", hint=hint + "; this directory is -i .")


def add(argument: str | Path, data: InventoryData, found: bool = False) -> Path | None:
    """Read one -i argument into `data`; returns the directory its group_vars/host_vars are in
    (None for a host list). `found`: fleet found it (a config file named it), so each file read
    must pass fleet.core.trust's rule; one that fails is said and skipped."""
    text = str(argument)
    if not text:
        raise empty_path("-i")
    path = Path(os.path.expanduser(text))
    if not os.path.exists(path) and "," in text:
        _host_list(text, data)
        return None
    if path.is_dir():
        _directory(path, data, 0, set(), found)
        return path
    if _trusted(path, found):
        _file(path, data, named=True)
    return path.parent


def _trusted(path: Path, found: bool) -> bool:
    """True unless `path` was found (not named) and fails fleet.core.trust's rule (then said)."""
    if not found:
        return True
    try:
        trust.check(path)
    except trust.Untrusted as exc:
        trust.warn(exc)
        return False
    return True


def add_nodes(entries: list[hostlist.Entry], data: InventoryData) -> None:
    """Hosts of a node set or hostfile: each one new to `data` is added ungrouped, where its
    entry says it came from (`-w`, `hosts.txt:3`); a hostfile's slots set its `gpus` var (the
    command line's word wins over the inventory's, as a host var)."""
    sources: dict[tuple[str, Path | None], int] = {}
    for entry in entries:
        key = (entry.source if entry.path is None else "", entry.path)
        index = sources.get(key)
        if index is None:
            source: Source = (
                NodeSetSource(entry.source) if entry.path is None else HostfileSource(entry.path)
            )
            index = sources[key] = data.add_source(source)
        place = (index, () if entry.line is None else (entry.line,))
        data.check_room((entry.name,), place)
        data.add_host(entry.name, None if entry.name in data.hosts else "ungrouped", place)
        if entry.gpus is not None:
            data.set_host_var(entry.name, "gpus", entry.gpus, place)


def _host_list(text: str, data: InventoryData) -> None:
    """Ansible's host_list: names (and `name:port`) separated by commas, all ungrouped. An empty
    item is refused, as -l and -w refuse one, except one trailing ',': Ansible's mark of a
    one-host list (`-i 'gpu01,'`)."""
    index = data.add_source(HostListSource())
    items = text.split(",")
    if len(items) > 1 and not items[-1].strip():
        items.pop()
    for number, raw in enumerate(items, 1):
        item = raw.strip()
        if not item:
            raise UsageError(
                f"host list '{text}': item {number} is empty",
                hint="write e.g. -i 'gpu01,gpu02' (one host: -i 'gpu01,')",
            )
        place = (index, (number,))
        names, port = host_pattern(data, item, place)
        for name in names:
            if name not in data.hosts:
                data.add_host(name, "ungrouped", place, port)


def _directory(path: Path, data: InventoryData, depth: int, seen: set[str], found: bool) -> None:
    """Every inventory file below `path`, in name order, as Ansible walks an -i directory."""
    real = os.path.realpath(path)
    if real in seen:
        return
    seen.add(real)
    if depth > MAX_DIR_DEPTH:
        raise InventoryError(
            f"{path}: nested more than {MAX_DIR_DEPTH} directories deep",
            hint="point -i at the inventory directory itself",
        )
    try:
        entries = sorted(os.listdir(path))
    except OSError as exc:
        raise InventoryError(
            f"{path}: cannot list: {exc.strerror or type(exc).__name__}",
            hint="check the directory's permissions",
        ) from None
    for entry in entries:
        if IGNORED.search(entry):
            continue
        full = path / entry
        if full.is_dir():
            _directory(full, data, depth + 1, seen, found)
        elif _trusted(full, found):
            _file(full, data)


def _file(path: Path, data: InventoryData, named: bool = False) -> None:
    """One inventory file: YAML/JSON when it parses to a mapping, else INI (as Ansible tries
    its yaml plugin, then its ini plugin). A file `-i` names itself (`named`) may be a
    hostfile instead; in a directory, files are Ansible's formats only."""
    raw = read_bounded(path).removeprefix(BOM)  # Windows editors write one; not the first name
    if raw.startswith(b"#!"):
        raise InventoryError(
            f"{path}: a dynamic inventory script; fleet does not run inventory scripts",
            hint=EXPORT_HINT,
        )
    if raw.startswith(VAULT_MAGIC):
        raise InventoryError(
            f"{path}: encrypted with ansible-vault; fleet cannot decrypt it",
            hint="keep hosts in a plain inventory file (secrets do not belong there for fleet)",
        )
    ext = os.path.splitext(path.name)[1]
    if named and ext not in YAML_EXTENSIONS and _hostfile(path, raw, data):
        return
    if ext == ".toml":
        raise InventoryError(
            f"{path}: a TOML inventory; fleet reads YAML and INI", hint=EXPORT_HINT
        )
    yaml_error: InventoryError | None = None
    text: str | None = None
    if ext in YAML_EXTENSIONS or not ext:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if ext:
                raise InventoryError(
                    f"{path}: not UTF-8 text (invalid byte at offset {exc.start})",
                    hint="check the path: this does not look like an inventory",
                ) from None
        if text is not None:
            try:
                doc, vaulted = inventory_yaml.load_allowing_vault(text, path)
            except InventoryError as exc:
                yaml_error = exc
            else:
                if isinstance(doc.data, dict):
                    inventory_yaml.parse(doc, data, vaulted)
                    return
                if doc.data is None:
                    return  # empty, or only comments: nothing in either format
                yaml_error = InventoryError(
                    f"{path}: expected a mapping of groups at the top, got "
                    f"{'a list' if isinstance(doc.data, list) else 'a single value'}",
                    hint="start the file with 'all:'",
                )
    try:
        inventory_ini.parse(path, _ini_lines(path, raw), data)
    except InventoryError:
        if yaml_error is not None and (ext or (text is not None and _YAML_LINE.search(text))):
            raise yaml_error from None
        raise


def _hostfile(path: Path, raw: bytes, data: InventoryData) -> bool:
    """Read `raw` as a hostfile when it is one (every line `name`, `name slots=N` or `name:N`);
    False when it is not, for the YAML and INI readers."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if not hostlist.looks_like_hostfile(text):
        return False
    add_nodes(hostlist.parse_hostfile(text, path), data)
    return True


def _ini_lines(path: Path, raw: bytes) -> list[str]:
    """The file's lines; as in Ansible, comment lines may hold bytes that are not UTF-8."""
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        pass
    lines: list[str] = []
    for number, line in enumerate(raw.splitlines(), 1):
        if line[:1] in (b"#", b";"):
            lines.append("")
            continue
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise InventoryError(
                f"{path}:{number}: not UTF-8 text",
                hint="check the path: this does not look like an inventory",
            ) from None
    return lines
