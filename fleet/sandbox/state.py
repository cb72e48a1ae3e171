"""What a sandbox is, on disk: its nodes' records and `sandbox.json`, written so that any other
process can find (and stop) the sandbox at any moment.

Every file the sandbox writes goes through `write_atomic`: a temporary file in the same
directory, renamed over the old one. A reader (`fleet sandbox status`, a test, the benchmark)
that opens a file while `up` rewrites it gets the old contents or the new, never a mix or a part,
and needs no lock. Writers (`up`, `down`) serialise on `StateFile.locked()`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet.sandbox.errors import SandboxError

STATE_VERSION = 1
_HINT = "remove the state dir after checking `ip netns list` for leftovers"


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

    status: str  # "starting", "running" or "stopped"
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


def write_atomic(path: Path, text: str, mode: int = 0o644) -> bool:
    """Replace `path` with `text` (write, then rename), unless it holds that already.

    Returns True if the file was written. No fsync: what these files describe (namespaces,
    processes, interfaces) does not survive a crash of the machine either.
    """
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            os.chmod(path, mode)
            return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
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

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Serialise up/down on one state dir across processes."""
        self.layout.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.layout.lock_path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def load(self) -> SandboxState | None:
        """Read sandbox.json, or None if there is none."""
        try:
            raw = json.loads(self.path.read_text())
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
