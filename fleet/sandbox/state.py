"""What a sandbox is, on disk: its nodes' records and `sandbox.json`, written so that any other
process can find (and stop) the sandbox at any moment.

Every file the sandbox writes goes through `write_atomic`: a temporary file in the same
directory, renamed over the old one. A reader (`fleet sandbox status`, a test, the benchmark)
that opens a file while `up` rewrites it gets the old contents or the new, never a mix or a part,
and needs no lock. Writers (`up`, `down`) serialise on `StateFile.locked()`.

The state dir steers root: its files name the keys, the nodes' sshd config and the programs
mounted over each node's /usr/local/bin. So it is used only when nobody but the operator (or
root) can change it (fleet.core.trust.own_dir_problem: the operator's own directory, writable by
nobody else, not a symlink; a sticky /tmp above it is fine), checked before every read and
write, and made 0700 when `up` finds it missing. Files in it are opened with O_NOFOLLOW and
chmod-ed through their descriptor, so a symlink there is never followed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet.core.trust import own_dir_problem
from fleet.sandbox.errors import SandboxError

STATE_VERSION = 1
_HINT = "remove the state dir after checking `ip netns list` for leftovers"
_REFUSED_HINT = (
    "it must be your own directory, writable by nobody else, not a symlink, under directories "
    "only you or root can change: pick another --dir (if it is not yours, ask who made it)"
)


@dataclass(frozen=True)
class SandboxNode:
    """One sandbox node: its name, address, network namespace, host pid of its init, files."""

    name: str
    address: str
    netns: str
    pid1: int
    node_dir: Path

    @property
    def bin_dir(self) -> Path:
        """Host directory mounted over the node's /usr/local/bin: drop shims here."""
        return self.node_dir / "bin"


@dataclass(frozen=True)
class NodeRecord:
    """What is kept about a node beyond `SandboxNode`: slot, veth and launcher pid."""

    node: SandboxNode
    index: int
    veth: str
    launcher_pid: int


@dataclass
class SandboxState:
    """The contents of sandbox.json."""

    status: str  # "starting", "running", "failed" (the last `up` failed) or "stopped"
    sid: str
    subnet: str
    max_startups: str
    nodes: list[NodeRecord]


@dataclass(frozen=True)
class Layout:
    """Where a sandbox keeps its files, all under its state dir."""

    state_dir: Path

    @property
    def state_path(self) -> Path:
        """The JSON state file another process uses to find and stop this sandbox."""
        return self.state_dir / "sandbox.json"

    @property
    def lock_path(self) -> Path:
        """Held (flock) by `up` and `down` while they change the sandbox."""
        return self.state_dir / ".lock"

    @property
    def inventory_path(self) -> Path:
        """Ansible-style inventory listing every node."""
        return self.state_dir / "inventory.yaml"

    @property
    def ssh_config_path(self) -> Path:
        """OpenSSH client config for `ssh -F` with strict host key checking."""
        return self.state_dir / "ssh_config"

    @property
    def known_hosts_path(self) -> Path:
        """Every node's host key, so clients can keep StrictHostKeyChecking on."""
        return self.state_dir / "known_hosts"

    @property
    def key_path(self) -> Path:
        """The client private key (ed25519, no passphrase) every node accepts for root."""
        return self.state_dir / "id_ed25519"

    def node_dir(self, name: str) -> Path:
        """Host-side directory of one node."""
        return self.state_dir / "nodes" / name


def check_state_dir(state_dir: Path, create: bool) -> bool:
    """Refuse (SandboxError) a state dir someone else could change; True when it is there.

    Missing, it is made 0700 when `create` (its missing parents 0755), else False is returned
    and nothing is made. It is checked again once made: if another user made it first, it is
    theirs, and refused.
    """
    found = own_dir_problem(state_dir)
    if found == "missing" and create:
        _make_dir(state_dir)
        found = own_dir_problem(state_dir)
    if found == "missing":
        return False
    if found is not None:
        hint = _REFUSED_HINT if found != "not a directory" else "pick another --dir"
        raise SandboxError(f"{state_dir}: refused as the sandbox state dir: {found}", hint=hint)
    return True


def _make_dir(state_dir: Path) -> None:
    """mkdir the state dir 0700 (and missing parents 0755); one that appears meanwhile is left
    for the check that follows to judge."""
    missing = [d for d in (state_dir, *state_dir.parents) if not os.path.lexists(d)]
    try:
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700 if directory == state_dir else 0o755)
    except OSError as exc:
        raise SandboxError(
            f"{state_dir}: cannot make the sandbox state dir: {exc.strerror or exc}",
            hint="pick another --dir",
        ) from None


def open_nofollow(path: Path, flags: int, mode: int = 0o600) -> int:
    """os.open that never follows a symlink at `path` (SandboxError naming it instead)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise SandboxError(
            f"{path}: a symlink in the sandbox state dir (never followed)",
            hint="remove it; the sandbox writes its own files there",
        ) from None


def read_text(path: Path) -> str:
    """A file of the state dir, read without following a symlink."""
    with os.fdopen(open_nofollow(path, os.O_RDONLY), encoding="utf-8") as fh:
        return fh.read()


def write_atomic(path: Path, text: str, mode: int = 0o644) -> bool:
    """Replace `path` with `text` (write, then rename), unless it holds that already.

    Returns True if the file was written. No fsync: what these files describe (namespaces,
    processes, interfaces) does not survive a crash of the machine either. A symlink at `path`
    is replaced, never written through.
    """
    unreadable = contextlib.suppress(OSError, SandboxError)  # e.g. a symlink: replaced below
    with unreadable, os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as fh:
        if fh.read() == text.encode():
            os.fchmod(fh.fileno(), mode)
            return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


class StateFile:
    """sandbox.json of one state dir: load, save, and the lock that serialises writers."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.path = layout.state_path

    def present(self) -> bool:
        """True when the state dir is there (checked: SandboxError when it is refused)."""
        return check_state_dir(self.layout.state_dir, create=False)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Serialise up/down on one state dir across processes; the dir is checked, and made
        (0700) when missing."""
        check_state_dir(self.layout.state_dir, create=True)
        fd = open_nofollow(self.layout.lock_path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # drops the lock

    def load(self) -> SandboxState | None:
        """Read sandbox.json, or None if there is none (or no state dir)."""
        if not self.present():
            return None
        try:
            raw = json.loads(read_text(self.path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise SandboxError(f"{self.path}: unreadable sandbox state: {exc}", hint=_HINT) from exc
        try:
            return _parse(raw)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SandboxError(
                f"{self.path}: not a sandbox state file (bad or missing {exc})", hint=_HINT
            ) from exc

    def save(self, state: SandboxState, bridge: dict[str, str]) -> None:
        """Write sandbox.json atomically: it must be usable by `down` after any crash."""
        doc = {
            "version": STATE_VERSION,
            "generated_by": "fleet sandbox up",
            "status": state.status,
            "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "state_dir": str(self.layout.state_dir),
            "sid": state.sid,
            "subnet": state.subnet,
            "bridge": bridge,
            "max_startups": state.max_startups,
            "nodes": [
                {
                    "name": r.node.name,
                    "index": r.index,
                    "address": r.node.address,
                    "netns": r.node.netns,
                    "veth": r.veth,
                    "pid1": r.node.pid1,
                    "launcher_pid": r.launcher_pid,
                    "node_dir": str(r.node.node_dir),
                }
                for r in state.nodes
            ],
        }
        write_atomic(self.path, json.dumps(doc, indent=2) + "\n")


def _parse(raw: Any) -> SandboxState:
    """A SandboxState from sandbox.json's parsed JSON (KeyError/TypeError/ValueError if bad)."""
    nodes = [
        NodeRecord(
            node=SandboxNode(
                name=str(n["name"]),
                address=str(n["address"]),
                netns=str(n["netns"]),
                pid1=int(n["pid1"]),
                node_dir=Path(n["node_dir"]),
            ),
            index=int(n["index"]),
            veth=str(n["veth"]),
            launcher_pid=int(n["launcher_pid"]),
        )
        for n in raw.get("nodes", [])
    ]
    return SandboxState(
        status=str(raw["status"]),
        sid=str(raw["sid"]),
        subnet=str(raw["subnet"]),
        max_startups=str(raw["max_startups"]),
        nodes=nodes,
    )
