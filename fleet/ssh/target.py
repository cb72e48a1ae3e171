"""Where and as whom fleet connects to a host, once the inventory and the ssh config are merged."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    """Where and as whom to connect, after merging inventory and ssh config."""

    name: str
    address: str
    port: int
    user: str
    key_files: tuple[str, ...]
    known_hosts: tuple[Path, ...]
    policy: str
    proxy_jump: tuple[str, ...]  # hops, first hop first; () when direct
    connect_timeout_s: float
    proxy_command: str | None = None  # %-tokens expanded, values shell-quoted
    host_key_alias: str | None = None  # known_hosts name instead of [address]:port
    bind_address: str | None = None
    address_family: int = socket.AF_UNSPEC
    allow_agent: bool = True
    identities_only: bool = False  # IdentitiesOnly: the agent's keys only for IdentityFiles
    certificate_files: tuple[str, ...] = ()  # CertificateFile
    disabled_algorithms: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The directory the command was started in (fleet/ssh/workdir.py), when this target depends
    # on it: a relative path above was resolved against it, or the ProxyCommand is started there.
    workdir: str | None = None
