"""Hosts without an inventory: the node sets, host lists and hostfiles operators already have.

- `-w/--hosts NODESET`, as pdsh and clush take it: `gpu[01-16]`, `gpu[01-04,09],cpu1`,
  `root@gpu01`, `^FILE` (names from a file, pdsh's form); a Slurm node list is the same syntax
  (`-w "$SLURM_JOB_NODELIST"`: `gpu-[01-04,09]`, `tux[0-3,8],lx1`). pdsh and clush take no
  ports, but operators type `host:port` (as ssh's `[host]:port` and Ansible's `name:port`), so
  `gpu01:2222` and `gpu[01-04]:2222` are accepted; an IPv6 address is a literal name (`fd00::1`,
  with a port `[fd00::1]:2222`), never a range: a bracket holding `::` or 3+ colons is one.
- A hostfile given to `-i`, recognised by its format: DeepSpeed's and OpenMPI's `worker-1 slots=8`
  (`slots` becomes the node's `gpus`, OpenMPI's `max_slots` is accepted and ignored), MPICH's
  `worker-1:8`, or a plain list of names. `#` starts a comment. More than MAX_SLOTS slots on one
  host is refused: `gpu01:2222` is an Ansible `name:port` in a file without `[groups]`, not 2222
  processes. A file with a `slots=` on some line and no `[group]` is a hostfile: a line of it that
  is not one (`slots=x`, `slot=4`) is an error at its line, not a reason to read the whole file as
  an INI inventory whose hosts have no slots. A UTF-8 BOM at the start is not part of the first
  name.

At most MAX_HOSTS hosts per node set or hostfile, counted from the ranges' sizes before any name
is built: `n[0-99999][0-99999]` is refused at once, with its count.

Every host keeps where it came from (`-w`, `hosts.txt:3`), for `fleet hosts` and error messages.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from fleet.core import nodeset, userpath
from fleet.core.digits import is_digits
from fleet.core.errors import InventoryError, UsageError

MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_SLOTS = 1024
MAX_HOSTS = nodeset.MAX_NAMES  # per node set and per hostfile (docs/reference/inventory.md: Limits)
BOM = "\ufeff"
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,31}")
_HOSTFILE_LINE = re.compile(
    r"(?P<name>[A-Za-z0-9_.\-\[\],]+?)"
    r"(?::(?P<mpich>\d+))?"
    r"(?P<opts>(?:\s+(?:slots|max_slots|max-slots)\s*=\s*\d+)*)"
)
_OPT = re.compile(r"(slots|max_slots|max-slots)\s*=\s*(\d+)")
_SLOT_KEYS = ("slots", "max_slots", "max-slots")
_HAS_SLOTS = re.compile(r"(?:^|\s)(?:slots|max_slots|max-slots)\s*=", re.M)
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,31}")
_SAFE_VALUE = re.compile(r"[A-Za-z0-9_.+\-]{0,16}")
_BRACKETED = re.compile(r"\[([^\[\]]*)\](?::(.*))?")
SLOTS_HINT = "DeepSpeed/OpenMPI hostfile lines are 'worker-1 slots=8' (max_slots=N is accepted)"


@dataclass(frozen=True)
class Entry:
    """One host of a node set or hostfile."""

    name: str
    source: str  # "-w", "hosts.txt:3"
    user: str | None = None
    port: int | None = None  # `-w gpu01:2222`
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


@dataclass(frozen=True)
class _Target:
    """One item of a node set, read but not expanded: a name pattern or an IPv6 address."""

    pattern: str
    user: str | None
    port: int | None
    literal: bool  # an IPv6 address: a name as it is, never a range


def parse_nodeset(text: str, option: str = "-w") -> list[Entry]:
    """A pdsh/clush/Slurm node set: names in the order given, duplicates dropped; refused when
    it stands for more than MAX_HOSTS hosts, before a name is built."""
    if not text.strip():
        raise UsageError(f"{option}: empty node set", hint="e.g. -w 'gpu[01-16]' or -w a,b,c")
    items: list[_Target | list[Entry]] = []
    total = 0
    for item in _split_top(text):
        if not item:
            raise UsageError(f"{option} '{text}': empty item", hint="e.g. -w 'gpu[01-04,09],cpu1'")
        if item.startswith("^"):
            entries = read_hostfile(userpath.expand(item[1:], f"{option} ^"))
            items.append(entries)
            total += len(entries)
            if total > MAX_HOSTS:  # built already: stop before reading the next file
                raise _too_many(total, option)
            continue
        target = _target(item, text, option)
        items.append(target)
        total += 1 if target.literal else _count(target.pattern, text, option)
    if total > MAX_HOSTS:
        raise _too_many(total, option)
    out: dict[str, Entry] = {}
    for found in items:
        for entry in found if isinstance(found, list) else _entries(found, option):
            _add(out, entry, option)
    return list(out.values())


def _too_many(total: int, option: str) -> UsageError:
    return UsageError(
        f"{option}: the node set expands to {nodeset.shown_count(total)} hosts, "
        f"more than {MAX_HOSTS:,}",
        hint=f"fleet takes at most {MAX_HOSTS:,} hosts per node set; check its ranges",
    )


def _count(pattern: str, text: str, option: str) -> int:
    try:
        return nodeset.count(pattern)
    except nodeset.RangeError as exc:
        raise UsageError(
            f"{option} '{text}': {exc}", hint="e.g. -w 'gpu[01-16]' or -w 'gpu-[01-04,09]'"
        ) from None


def _entries(target: _Target, option: str) -> list[Entry]:
    names = [target.pattern] if target.literal else nodeset.expand(target.pattern)
    return [Entry(name, option, target.user, port=target.port) for name in names]


def _add(out: dict[str, Entry], entry: Entry, option: str) -> None:
    """Keep the first of a name given twice; twice with different ports is an error."""
    first = out.setdefault(entry.name, entry)
    if first.port != entry.port:
        ports = " and ".join(str(p or "the default") for p in (first.port, entry.port))
        raise UsageError(
            f"{option}: {entry.name} is given twice with different ports ({ports})",
            hint="one port per host; two sshds on one machine need two ssh config Host names",
        )


def _target(item: str, text: str, option: str) -> _Target:
    """`[user@]NAME[:PORT]`, NAME a pattern (`gpu[01-04]`) or an IPv6 address (`fd00::1`,
    `[fd00::1]`, `[fd00::1]:2222`)."""
    user, at, spec = item.rpartition("@")
    if at and not _USER.fullmatch(user):
        raise UsageError(f"{option}: bad user in '{item}'", hint="e.g. -w root@gpu01")
    login = user or None
    bracketed = _BRACKETED.fullmatch(spec)
    if bracketed and _ipv6_like(bracketed.group(1)):
        address, port_text = bracketed.groups()
        _check_ipv6(address, f"[{address}]", option)
        return _Target(address, login, _port(port_text, spec, option), True)
    if _ipv6_like(_outside_brackets(spec)):
        _check_ipv6(spec, spec, option)
        return _Target(spec, login, None, True)
    name, colon, port_text = spec.rpartition(":")
    if not colon or "]" in port_text or not name or _outside_brackets(name).count(":"):
        return _Target(spec, login, None, False)
    return _Target(name, login, _port(port_text, spec, option), False)


def _outside_brackets(text: str) -> str:
    """`text` without its `[...]` parts: where a port's or an address's colons can be."""
    return re.sub(r"\[[^\[\]]*\]", "", text)


def _ipv6_like(text: str) -> bool:
    """What only an IPv6 address has: `::`, or more colons than a range or `name:port`."""
    return "::" in text or text.count(":") >= 3


def _check_ipv6(address: str, shown: str, option: str) -> None:
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        raise UsageError(
            f"{option}: '{shown}' is not an IPv6 address",
            hint="write an IPv6 address as fd00::1, or with a port as [fd00::1]:2222",
        ) from None


def _port(text: str | None, spec: str, option: str) -> int | None:
    """The port after `name:` (None when there is no `:PORT`)."""
    if text is None:
        return None
    if not is_digits(text):
        raise UsageError(
            f"{option}: '{spec}': a port is a number", hint="e.g. -w gpu01:2222 or [fd00::1]:2222"
        )
    port = int(text)
    if not 1 <= port <= 65535:
        raise UsageError(
            f"{option}: '{spec}': port {port} is not 1-65535", hint="e.g. -w gpu01:2222"
        )
    return port


def looks_like_hostfile(text: str) -> bool:
    """True when every line is a hostfile line (`name`, `name slots=N`, `name:N`) and there is
    at least one: what a YAML or INI inventory never is without a `[group]` or a `key: value`.
    Also True when some line has a `slots=` and none is a `[group]`: then the file was written
    as a hostfile, and parse_hostfile names the line that is not one."""
    seen = False
    lines = [raw.split("#", 1)[0].strip() for raw in text.removeprefix(BOM).splitlines()]
    if any(line.startswith("[") for line in lines):
        return False
    for line in lines:
        if not line:
            continue
        if not _HOSTFILE_LINE.fullmatch(line):
            return any(_HAS_SLOTS.search(other) for other in lines)
        seen = True
    return seen


def parse_hostfile(text: str, path: Path) -> list[Entry]:
    """The hosts of a DeepSpeed/OpenMPI/MPICH hostfile or a plain list, with file:line errors
    (never echoing the line: a file given by mistake may hold secrets; at most the key of a
    bad token, or a short value of a slots token)."""
    out: dict[str, Entry] = {}
    for number, raw in enumerate(text.removeprefix(BOM).splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        m = _HOSTFILE_LINE.fullmatch(line)
        if m is None:
            raise _bad_line(where, line)
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
            total = len(out) + nodeset.count(m.group("name"))
            if total > MAX_HOSTS:
                raise InventoryError(
                    f"{where}: the hostfile expands to {nodeset.shown_count(total)} hosts by "
                    f"this line, more than {MAX_HOSTS:,}",
                    hint=f"fleet takes at most {MAX_HOSTS:,} hosts per hostfile; check the ranges",
                )
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


def _bad_line(where: str, line: str) -> InventoryError:
    """Why a line is not a hostfile line: the first token after the name that is not a whole
    `slots=N`, shown by its key (a slots value only when short and plain)."""
    for token in line.split()[1:]:
        key, eq, value = token.partition("=")
        if key in _SLOT_KEYS and not is_digits(value):
            shown = f"'{key}={value}'" if _SAFE_VALUE.fullmatch(value) else f"'{key}=...'"
            return InventoryError(f"{where}: {shown}: slots must be a whole number", SLOTS_HINT)
        if key not in _SLOT_KEYS and eq and _KEY.fullmatch(key):
            return InventoryError(
                f"{where}: unknown hostfile option '{key}'",
                hint=SLOTS_HINT + "; for Ansible variables put the hosts under a [group] line",
            )
    return InventoryError(
        f"{where}: not a hostfile line",
        hint="one host per line: 'worker-1 slots=8', 'worker-1:8' or 'worker-1'",
    )


def read_hostfile(path: Path) -> list[Entry]:
    """parse_hostfile on a file, read by the inventory's bounded reader."""
    from fleet.core.textfile import read_text

    text = read_text(
        path,
        limit=MAX_FILE_BYTES,
        what="a hostfile",
        hint="check the path given after ^ (a file of host names)",
    )
    return parse_hostfile(text, path)
