"""The directory a fleet command was started in, as the keeper that outlives the command sees it.

A keeper (fleet/ssh/keeper.py) lives on for the window after the command that made it has ended.
Were it to keep the command's working directory, it would pin it: `umount` of its filesystem
would fail ("target is busy") and a directory removed meanwhile would stay allocated, for as long
as the keeper lives (OpenSSH's ControlPersist master does just that). So a process leaves the
command's directory (chdir /) as soon as it becomes a keeper, whichever way it came to be
(`leave`), and remembers it as a path string only: never a descriptor of it, which would pin it
just the same.

Nothing a path means changes. A keeper serves only commands started in a directory of that
name (its socket's name hashes the working directory: fleet/ssh/warm.py identity()), so what a
command names relative to its directory (an identity file, a certificate, a known_hosts file, the
ssh config of -F, HOME, SSH_AUTH_SOCK) is resolved against the string (`absolute`, `Resolver`),
and what it would start there (a ProxyCommand, a `Match exec`) is started with that directory as
its working directory (`here`). A command that is no keeper resolves against its own working
directory the same way, so a connection's key (fleet/ssh/keeper.py connection_key) is the same
whether a command or a keeper worked it out. A directory that is gone by the time something
needs it is a failure that says so (the caller's: ConnectFailed for a host, ConfigError for the
ssh config), never a path silently resolved elsewhere.
"""

from __future__ import annotations

import os
import sys

from fleet.core.errors import ConfigError


class _Left:
    """Whether this process has left the command's directory, and what that was (None: it
    could not be told, it was gone already)."""

    done = False
    directory: str | None = None


_LEFT = _Left()
# Environment variables whose relative value names a path relative to the working directory.
PATH_VARIABLES = ("HOME", "SSH_AUTH_SOCK")


class Unknown(ConfigError):
    """This keeper could not tell the directory it was started in, and something needs it."""


def leave() -> None:
    """Become a keeper: remember the working directory (a string) and chdir to `/`. What still
    names a path relative to it is made absolute first: the import path's relative entries (a
    fork of a `python -c` command has '' there) and the PATH_VARIABLES. Once only."""
    if _LEFT.done:
        return
    try:
        _LEFT.directory = os.getcwd()
    except OSError:
        _LEFT.directory = None  # removed before we got here: relative paths fail, said (Unknown)
    _LEFT.done = True
    base = _LEFT.directory
    if base is not None:
        sys.path[:] = [_joined(base, entry) for entry in sys.path]
        for name in PATH_VARIABLES:
            value = os.environ.get(name)
            if value and not os.path.isabs(value):
                os.environ[name] = os.path.join(base, value)
    os.chdir("/")


def _joined(base: str, entry: str) -> str:
    """An import path entry as it read in `base` ('' is the working directory itself)."""
    if os.path.isabs(entry):
        return entry
    return os.path.join(base, entry) if entry else base


def left() -> bool:
    """This process has left the command's directory (it is a keeper)."""
    return _LEFT.done


def here() -> str | None:
    """The command's directory: the one recorded when this process became a keeper, else the
    working directory; None in a command whose working directory cannot be told (removed under
    it: relative paths are then left as they are, as before). Unknown in a keeper that could
    not tell it."""
    if _LEFT.done:
        if _LEFT.directory is None:
            raise Unknown(
                "the directory this fleet command was started in was gone before its keeper of "
                "warm connections could note it: relative paths cannot be resolved",
                hint="run fleet from a directory that exists, or pass --persist 0",
            )
        return _LEFT.directory
    try:
        return os.getcwd()
    except OSError:
        return None


def absolute(path: str) -> str:
    """`path` as the command meant it: a relative one joined to the command's directory (as a
    string: nothing is normalized, so `..` and symlinks mean what the kernel made of them)."""
    if os.path.isabs(path):
        return path
    base = here()
    return path if base is None else os.path.join(base, path)


def exists(directory: str) -> bool:
    """The directory of that name is there (removed and made again counts: it is what a command
    started there now means)."""
    return os.path.isdir(directory)


def gone(directory: str) -> str:
    """Why something that needs `directory` cannot be done, in words for an error's detail."""
    return f"{directory}, the directory fleet was started in, is gone"


class Resolver:
    """The paths of one host's target resolved against the command's directory, and whether any
    of them needed it (a relative path)."""

    def __init__(self) -> None:
        self.needed = False

    def path(self, path: str) -> str:
        """`path` made absolute (`absolute`), noting whether it needed the directory."""
        self.needed = self.needed or not os.path.isabs(path)
        return absolute(path)

    def directory(self, runs_something: bool) -> str | None:
        """The command's directory when this target depends on it: a relative path was
        resolved against it, or `runs_something` (a ProxyCommand, started there)."""
        return here() if self.needed or runs_something else None
