"""The one bounded read of the files that name hosts (inventories, vars files, hostfiles, retry
files): a file that cannot be what it should is refused by size, name and offset, never echoed."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

from fleet.core.errors import InventoryError
from fleet.core.yamlfile import MAX_BYTES

MISSING_HINT = (
    "pass -i PATH or -w HOSTS, or set FLEET_INVENTORY; `fleet sandbox up` makes a test fleet"
)


def read_bounded(
    path: Path,
    *,
    label: str | None = None,
    limit: int = MAX_BYTES,
    what: str = "an inventory",
    hint: str = MISSING_HINT,
) -> bytes:
    """A file's bytes, refusing what cannot be `what` (never echoing its text): fleet's one
    bounded read for the files that name hosts (inventories, vars files, hostfiles, retry files).
    Messages start with `label` (default: the path); `hint` says what to check when the file
    is missing or unreadable."""
    label = str(path) if label is None else label
    try:
        with _open_regular(path, label) as fh:
            raw = fh.read(limit + 1)
    except FileNotFoundError:
        raise InventoryError(f"{label}: cannot read: no such file", hint=hint) from None
    except PermissionError:
        raise InventoryError(
            f"{label}: cannot read: permission denied", hint="check the file's owner and mode"
        ) from None
    except OSError as exc:
        raise InventoryError(
            f"{label}: cannot read: {exc.strerror or type(exc).__name__}", hint=hint
        ) from None
    if len(raw) > limit:
        raise InventoryError(
            f"{label}: larger than {limit // (1024 * 1024)} MiB, not {what}",
            hint="check the path",
        )
    return raw


# What a file that is not a regular one is, for the message (stat.S_IFMT -> words).
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


# A descriptor fleet was started with, named as the shell names one for `<(command)`.
_INHERITED = re.compile(r"/(dev|proc/self)/fd/[0-9]+")


def _open_regular(path: Path, label: str) -> BinaryIO:
    """`path` opened for reading if it is a regular file. Opened non-blocking and judged on the
    descriptor: a FIFO with no writer would block the open, one whose writer never writes the
    read, and a device (/dev/zero, a tty) is no file of names either. The one pipe read is the
    operator's own: `-i <(command)`, a descriptor fleet inherited from the shell that runs the
    command (its writer is there; what it gives is bounded like a file)."""
    fh = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb")
    try:
        mode = os.fstat(fh.fileno()).st_mode
    except BaseException:
        fh.close()
        raise
    if stat.S_ISFIFO(mode) and _INHERITED.fullmatch(str(path)):
        os.set_blocking(fh.fileno(), True)
        return fh
    if not stat.S_ISREG(mode):
        fh.close()
        raise InventoryError(
            f"{label}: not a regular file ({_KINDS.get(stat.S_IFMT(mode), 'a special file')})",
            hint="fleet reads only regular files; write what this gives to one first",
        )
    os.set_blocking(fh.fileno(), True)
    return fh


def read_text(
    path: Path,
    *,
    label: str | None = None,
    limit: int = MAX_BYTES,
    what: str = "an inventory",
    hint: str = MISSING_HINT,
) -> str:
    """read_bounded, decoded as UTF-8 (a file that is not names the offset, never the bytes)."""
    raw = read_bounded(path, label=label, limit=limit, what=what, hint=hint)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError(
            f"{str(path) if label is None else label}: not UTF-8 text "
            f"(invalid byte at offset {exc.start})",
            hint=f"check the path: this is not {what}",
        ) from None
