"""What SSH needs to know beyond the inventory, as one frozen value: light to import (no paramiko),
so that the CLI can build it before any command decides to connect."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fleet.core import defaults


@dataclass(frozen=True)
class SshSettings:
    """Everything the transport needs that does not come from the inventory: built once by
    fleet.cli from the flags, the secrets added when the operator has typed them."""

    ssh_config: Path | None = None
    host_keys: str | None = None  # "strict" | "accept-new"; None: from ssh config, else strict
    known_hosts: tuple[Path, ...] = ()
    connect_timeout_s: float | None = None  # None: the ssh config's ConnectTimeout, else default
    banner_timeout_s: float = defaults.BANNER_TIMEOUT_S
    auth_timeout_s: float = defaults.AUTH_TIMEOUT_S
    # sshd's MaxStartups drops handshakes beyond ~10 pending per node; with jittered backoff
    # (0.3 s doubling) six attempts span about 10 s, enough for 128 connections to one sshd.
    connect_attempts: int = 6
    backoff_base_s: float = 0.3
    sudo_password: str | None = field(default=None, repr=False)
    key_passphrase: str | None = field(default=None, repr=False)
    debug: bool = False  # paramiko's own log on stderr (--debug)
    # Warm connections (fleet/ssh/warm.py): seconds a run's connections stay open for the next
    # command; 0: connect afresh and close at the end.
    persist_s: float = 0.0
    engine: str = defaults.SSH_ENGINES[0]  # one of defaults.SSH_ENGINES
    # The environment the ssh config is evaluated in (Include's ${VAR}s, Match exec) and a
    # ProxyCommand runs in: None, this process's; in a keeper, the fleet command's it serves.
    environ: Mapping[str, str] | None = field(default=None, repr=False, compare=False)
