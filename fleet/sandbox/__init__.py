"""A local fleet of real OpenSSH "nodes" on this machine, for tests, the benchmark and the
`fleet sandbox` demo.

Each node is a little host of its own: network, PID, mount, IPC and UTS namespaces, private
/tmp, /dev/shm, /root and /run, and its own sshd; the nodes share a private subnet that exists
only on one bridge of the host. One module per concern:

    box.py          Sandbox: up, down, status, run_on, bind_into, ... (ties the rest together)
    state.py        sandbox.json and the files beside it: atomic writes, the writers' lock
    network.py      subnet, addresses, the bridge, each node's netns and veth
    node.py         a node's init, namespaces and scripts run inside it
    sshd.py         each node's sshd: config, start, stop, wait until it listens
    clientfiles.py  the client key, known_hosts, ssh_config and inventory
    host.py         preflight, host tools, /proc scans, which processes are the sandbox's
    ghosts.py       plant and read back what a dead training run leaves on a node
    defaults.py     default subnet, sshd MaxStartups, ghost port, state dir
    errors.py       SandboxError

Its commands (`fleet sandbox up | down | status`) are in fleet/cli/sandbox.py. The names below
are loaded on first use, so that `fleet --help` (which registers those commands) does not import
the sandbox's machinery.

May import: fleet.core only (a layer beside fleet.ops: import-linter checks it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleet.sandbox.box import Sandbox
    from fleet.sandbox.defaults import DEFAULT_MAX_STARTUPS, DEFAULT_SUBNET
    from fleet.sandbox.errors import SandboxError
    from fleet.sandbox.ghosts import Ghosts, plant_ghosts, read_ghosts
    from fleet.sandbox.host import preflight
    from fleet.sandbox.network import (
        capacity,
        gateway_address,
        node_address,
        parse_subnet,
        sandbox_id,
    )
    from fleet.sandbox.node import node_names
    from fleet.sandbox.state import SandboxNode

_WHERE = {
    "Sandbox": "box",
    "SandboxError": "errors",
    "Ghosts": "ghosts",
    "plant_ghosts": "ghosts",
    "read_ghosts": "ghosts",
    "preflight": "host",
    "DEFAULT_SUBNET": "defaults",
    "capacity": "network",
    "gateway_address": "network",
    "node_address": "network",
    "parse_subnet": "network",
    "sandbox_id": "network",
    "node_names": "node",
    "DEFAULT_MAX_STARTUPS": "defaults",
    "SandboxNode": "state",
}

__all__ = [
    "DEFAULT_MAX_STARTUPS",
    "DEFAULT_SUBNET",
    "Ghosts",
    "Sandbox",
    "SandboxError",
    "SandboxNode",
    "capacity",
    "gateway_address",
    "node_address",
    "node_names",
    "parse_subnet",
    "plant_ghosts",
    "preflight",
    "read_ghosts",
    "sandbox_id",
]


def __getattr__(name: str) -> Any:
    """Load the module that defines `name` on first access (PEP 562)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
