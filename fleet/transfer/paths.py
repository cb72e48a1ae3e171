"""Names from nodes made safe to write under one local directory; pure, no I/O.

A node is not trusted to name files well: its listing may hold `..`, absolute paths, empty
components, or bytes that are not UTF-8. A name is kept only when every component is an ordinary
file name (not empty, not `.` or `..`, no NUL); anything else is refused, never "repaired", so
two different node names can never land on one local file.
"""

from __future__ import annotations

import os
import posixpath

MAX_COMPONENT_BYTES = 255  # NAME_MAX on Linux filesystems
MAX_PATH_BYTES = 4096  # PATH_MAX


class BadName(ValueError):
    """A node-side name that cannot be written locally as it is."""


def components(rel: bytes) -> tuple[bytes, ...]:
    """The components of a node-relative name, or BadName: absolute, `..`, `.`, empty (`a//b`),
    NUL, or longer than Linux allows."""
    if not rel:
        raise BadName("empty name")
    if len(rel) > MAX_PATH_BYTES:
        raise BadName("name longer than PATH_MAX")
    if rel.startswith(b"/"):
        raise BadName("absolute name")
    if b"\0" in rel:
        raise BadName("NUL in name")
    parts = tuple(rel.split(b"/"))
    for part in parts:
        if part in (b"", b".", b".."):
            raise BadName(f"component {part.decode() or '(empty)'!r}")
        if len(part) > MAX_COMPONENT_BYTES:
            raise BadName("component longer than NAME_MAX")
    return parts


def is_safe(rel: bytes) -> bool:
    """True when `components(rel)` accepts it."""
    try:
        components(rel)
    except BadName:
        return False
    return True


def local_parts(rel: bytes) -> tuple[str, ...]:
    """The components as local str names (non-UTF-8 bytes kept, as os.fsdecode does)."""
    return tuple(os.fsdecode(p) for p in components(rel))


def shown(rel: bytes) -> str:
    """A node name for messages and events: decoded with replacement (reporters escape controls)."""
    return rel.decode("utf-8", "replace")


def from_home(remote: str) -> str:
    """An operator's REMOTE as the node commands take it. Every node command starts in the
    login's home directory, and names are quoted (no shell expands them there): `~` is `.`
    and `~/x` is `x`, as scp, rsync and Ansible read them; BadName for `~user`, which a quoted
    name would make a directory literally called `~user`."""
    if remote == "~":
        return "."
    if remote.startswith("~/"):
        return remote[2:].lstrip("/") or "./"
    if remote.startswith("~"):
        raise BadName(f"{remote!r}: ~user is not expanded (give the path from / or the home)")
    return remote


def remote_name(remote: str) -> str:
    """The last component of an operator's REMOTE path: what a pull names it locally."""
    name = posixpath.basename(posixpath.normpath(remote))
    if name in ("", ".", "..", "/"):
        raise BadName(f"{remote!r} has no name to land under (give a file or directory path)")
    return name


def check_host_dir(name: str) -> str:
    """A host name as one directory component of LOCALDIR (a name from the inventory)."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise BadName(f"host name {name!r} cannot be a directory name")
    return name
