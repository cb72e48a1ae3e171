"""Hosts without an inventory: the node sets, host lists and hostfiles operators already have.

- `-w/--hosts NODESET`, as pdsh and clush take it: `gpu[01-16]`, `gpu[01-04,09],cpu1`,
  `root@gpu01`, `^FILE` (names from a file, pdsh's form); a Slurm node list is the same syntax
  (`-w "$SLURM_JOB_NODELIST"`: `gpu-[01-04,09]`, `tux[0-3,8],lx1`).
- A hostfile given to `-i`, recognised by its format: DeepSpeed's and OpenMPI's `worker-1 slots=8`
  (`slots` becomes the node's `gpus`, OpenMPI's `max_slots` is accepted and ignored), MPICH's
  `worker-1:8`, or a plain list of names. `#` starts a comment. More than MAX_SLOTS slots on one
  host is refused: `gpu01:2222` is an Ansible `name:port` in a file without `[groups]`, not 2222
  processes.

Every host keeps where it came from (`-w`, `hosts.txt:3`), for `fleet hosts` and error messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fleet import nodeset
from fleet.errors import InventoryError, UsageError

MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_SLOTS = 1024
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,31}")
_HOSTFILE_LINE = re.compile(
    r"(?P<name>[A-Za-z0-9_.\-\[\],]+?)"
    r"(?::(?P<mpich>\d+))?"
    r"(?P<opts>(?:\s+(?:slots|max_slots|max-slots)\s*=\s*\d+)*)"
)
_OPT = re.compile(r"(slots|max_slots|max-slots)\s*=\s*(\d+)")


@dataclass(frozen=True)
class Entry:
    """One host of a node set or hostfile."""

    name: str
    source: str  # "-w", "hosts.txt:3"
    user: str | None = None
    gpus: int | None = None  # a hostfile's slots
    path: Path | None = None  # the hostfile it is in, and its line there
    line: int | None = None


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets: `gpu[01-04,09],cpu1` -> [`gpu[01-04,09]`, `cpu1`]."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items]


def parse_nodeset(text: str, option: str = "-w") -> list[Entry]:
    """A pdsh/clush/Slurm node set: names in the order given, duplicates dropped."""
    if not text.strip():
        raise UsageError(f"{option}: empty node set", hint="e.g. -w 'gpu[01-16]' or -w a,b,c")
    out: dict[str, Entry] = {}
    for item in _split_top(text):
        if not item:
            raise UsageError(f"{option} '{text}': empty item", hint="e.g. -w 'gpu[01-04,09],cpu1'")
        if item.startswith("^"):
            for entry in read_hostfile(Path(item[1:]).expanduser()):
                out.setdefault(entry.name, entry)
            continue
        user, at, spec = item.rpartition("@")
        if at and not _USER.fullmatch(user):
            raise UsageError(f"{option}: bad user in '{item}'", hint="e.g. -w root@gpu01")
        try:
            names = nodeset.expand(spec)
        except nodeset.RangeError as exc:
            raise UsageError(
                f"{option} '{text}': {exc}", hint="e.g. -w 'gpu[01-16]' or -w 'gpu-[01-04,09]'"
            ) from None
        for name in names:
            out.setdefault(name, Entry(name, option, user or None))
    return list(out.values())


def looks_like_hostfile(text: str) -> bool:
    """True when every line is a hostfile line (`name`, `name slots=N`, `name:N`) and there is
    at least one: what a YAML or INI inventory never is without a `[group]` or a `key: value`."""
    seen = False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") or not _HOSTFILE_LINE.fullmatch(line):
            return False
        seen = True
    return seen


def parse_hostfile(text: str, path: Path) -> list[Entry]:
    """The hosts of a DeepSpeed/OpenMPI/MPICH hostfile or a plain list, with file:line errors
    (never echoing the line: a file given by mistake may hold secrets)."""
    out: dict[str, Entry] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        m = _HOSTFILE_LINE.fullmatch(line)
        if m is None:
            raise InventoryError(
                f"{where}: not a hostfile line",
                hint="one host per line: 'worker-1 slots=8', 'worker-1:8' or 'worker-1'",
            )
        opts = dict(_OPT.findall(m.group("opts") or ""))
        slots = m.group("mpich") or opts.get("slots")
        if slots is not None and int(slots) < 1:
            raise InventoryError(f"{where}: slots must be at least 1", hint="e.g. worker-1 slots=8")
        if slots is not None and int(slots) > MAX_SLOTS:
            raise InventoryError(
                f"{where}: more than {MAX_SLOTS} slots on one host",
                hint="read as a hostfile ('worker-1:8' is 8 processes); for an SSH port "
                "('gpu01:2222') put the hosts under a [group] line, an Ansible INI inventory",
            )
        try:
            names = nodeset.expand(m.group("name"))
        except nodeset.RangeError as exc:
            raise InventoryError(f"{where}: {exc}", hint="e.g. 'worker-[1-4] slots=8'") from None
        for name in names:
            if name in out:
                raise InventoryError(
                    f"{where}: host {name} is listed twice (first at {out[name].source})",
                    hint="list each host once",
                )
            out[name] = Entry(
                name, where, gpus=int(slots) if slots else None, path=path, line=number
            )
    if not out:
        raise InventoryError(f"{path}: no hosts in the hostfile", hint="one host name per line")
    return list(out.values())


def read_hostfile(path: Path) -> list[Entry]:
    """parse_hostfile on a file, read by the inventory's bounded reader."""
    from fleet.inventory_sources import read_text  # it reads hostfiles given to -i with us

    text = read_text(
        path,
        limit=MAX_FILE_BYTES,
        what="a hostfile",
        hint="check the path given after ^ (a file of host names)",
    )
    return parse_hostfile(text, path)
