"""Which files fleet reads without being told to: one rule, in one place.

fleet runs as root and acts as root on every node, so a file it finds on its own steers root:
./fleet.yaml (and a parent's), ./inventory.yaml, ./group_vars and ./host_vars, and the files
these name. Such a file is read only when nobody but the operator could have written it: it and
every directory on the way to it (as written and as resolved through symlinks) are owned by the
operator (the effective uid) or root, and none is writable by its group or by others, not even
a sticky world-writable directory such as /tmp (Ansible ignores an ansible.cfg in a
world-writable directory; git refuses a repository another user owns). Otherwise fleet says
what it ignored and why, on stderr, and goes on without it.

Files in the operator's home (~/.ssh/config and its Includes, ~/.config/fleet/config.yaml) get
OpenSSH's check of the file alone, and a failure stops fleet, as ssh stops: "Bad owner or
permissions". A file the operator names (-i, -F, FLEET_CONFIG, FLEET_INVENTORY, a path on the
command line) is read as named.

The file's owner and mode are checked on the open descriptor (fstat), so what is checked is
what is read; its directories cannot change under it when they pass.

A directory fleet writes into as root (the sandbox's state dir, which names the programs its
nodes run) has a rule of its own, own_dir_problem: the directory itself must be the operator's
(or root's), not writable by anyone else and not a symlink; the directories above it may be
sticky and world-writable (/tmp), because there nobody else can swap what is ours.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO

_WARNED: set[str] = set()


class Untrusted(Exception):
    """A file or directory someone other than the operator or root could have written."""

    def __init__(self, path: Path, reason: str, label: str | None = None) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.label = str(path) if label is None else label

    def warning(self) -> str:
        """The one line that says what was ignored and why."""
        return f"ignoring {self.label}: {self.reason}"


def problem(st: os.stat_result) -> str | None:
    """Why a file or directory with this stat may hold someone else's text, or None."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"owned by uid {st.st_uid}, not you or root"
    if st.st_mode & stat.S_IWOTH:
        return "writable by others"
    if st.st_mode & stat.S_IWGRP:
        return "writable by its group"
    return None


def _directories(path: Path) -> list[str]:
    """Every directory on the way to `path`: as written (made absolute) and as resolved."""
    written = Path(os.path.abspath(path)).parents
    resolved = Path(os.path.realpath(path)).parents
    return list(dict.fromkeys(str(d) for d in (*written, *resolved)))


def directory_problem(path: Path) -> str | None:
    """Why one of the directories leading to `path` makes it untrusted, or None (directories
    not made yet are skipped: the first one that exists decides who may make them)."""
    for directory in _directories(path):
        try:
            found = problem(os.stat(directory))
        except FileNotFoundError:
            continue
        except OSError:
            return f"cannot check directory {directory}"
        if found is not None:
            return f"directory {directory} is {found}"
    return None


def check(path: Path, label: str | None = None) -> None:
    """Raise Untrusted unless `path` (a file or directory; it need not exist yet) and the
    directories leading to it pass the rule. By path: for a file about to be read, prefer
    open_checked."""
    try:
        found = problem(os.stat(path))
    except FileNotFoundError:
        found = None
    except OSError:
        found = "cannot be checked"
    found = found or directory_problem(path)
    if found is not None:
        raise Untrusted(path, found, label)


def own_dir_problem(path: Path) -> str | None:
    """Why `path` is not a directory that only the operator (or root) can change, or None;
    "missing" when it does not exist (and nothing above it is refused).

    The rule for a directory fleet writes into and starts processes from as root (the sandbox's
    state dir): every directory above it (resolved) is owned by the operator or root, and is
    writable by others only with the sticky bit, as /tmp is (nobody else can then rename or
    remove what is ours in it); the directory itself, seen with lstat (a symlink is refused,
    never followed), is a directory that passes problem(). Checked by path: a caller that makes
    the directory checks again afterwards.
    """
    path = Path(os.path.abspath(path))
    parent = Path(os.path.realpath(path.parent))
    for directory in (parent, *parent.parents):
        try:
            info = os.stat(directory)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"cannot check directory {directory}: {exc.strerror or exc}"
        if not stat.S_ISDIR(info.st_mode):
            return f"{directory} is not a directory"
        if info.st_uid not in (os.geteuid(), 0):
            return f"directory {directory} is owned by uid {info.st_uid}, not you or root"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            return f"directory {directory} is writable by others and not sticky"
    found = dir_at(path)
    return found if isinstance(found, str) else problem(found)


def dir_at(path: Path) -> os.stat_result | str:
    """lstat of `path` when it is a directory itself (a symlink is never followed), else why
    not: "missing", "a symlink", "not a directory" or "cannot check it: WHY"."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"cannot check it: {exc.strerror or exc}"
    if stat.S_ISLNK(info.st_mode):
        return "a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "not a directory"
    return info


def is_trusted(path: Path) -> bool:
    """check() as a boolean, for callers that skip what fails (and warn themselves)."""
    try:
        check(path)
    except Untrusted:
        return False
    return True


def open_checked(path: Path, *, directories: bool = True) -> BinaryIO:
    """Open `path` for reading and check the file on its descriptor (and, by default, the
    directories on the way); raise Untrusted after closing it when it fails the rule.
    `directories=False` is OpenSSH's check for files in the operator's home."""
    fh = path.open("rb")
    try:
        found = problem(os.fstat(fh.fileno()))
        if found is None and directories:
            found = directory_problem(path)
    except BaseException:
        fh.close()
        raise
    if found is not None:
        fh.close()
        raise Untrusted(path, found)
    return fh


def warn(exc: Untrusted) -> None:
    """Say once, on stderr, which file was ignored and why (the path shown as data)."""
    from fleet.core.safetext import clean

    line = f"fleet: warning: {exc.warning()}"
    if line in _WARNED:
        return
    _WARNED.add(line)
    print(clean(line), file=sys.stderr)
