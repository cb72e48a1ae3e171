"""The one bounded read of the files that name hosts (inventories, vars files, hostfiles, retry
files): a file that cannot be what it should is refused by size, name and offset, never echoed."""

from __future__ import annotations

from pathlib import Path

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
        with path.open("rb") as fh:
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
