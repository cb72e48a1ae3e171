"""Events of a push or pull, beside fleet.core.events' own (RunStarted, HostConnected, HostFinished,
RunFinished): they go to the same reporters and run record, and to `--json` as lines."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.core.events import Event


@dataclass(frozen=True, kw_only=True)
class TransferPlanned(Event):
    """What one host's transfer will move: after its listing (pull) or probe (push)."""

    host: str
    files: int
    total_bytes: int
    via: str = ""  # "ssh" (the OpenSSH client carries the bytes) or "paramiko (why not ssh)"


@dataclass(frozen=True, kw_only=True)
class TransferProgress(Event):
    """Bytes moved so far for one host, a few times a second at most."""

    host: str
    done_bytes: int
    total_bytes: int
    rate_bps: float
    eta_s: float | None


@dataclass(frozen=True, kw_only=True)
class FileMoved(Event):
    """One file's outcome on one host (the path is node or local text: reporters escape it)."""

    host: str
    path: str
    action: str
    size: int
    moved_bytes: int
    sha256: str
    error: str
    via: str = ""  # "ssh" or "paramiko": which path carried the bytes
