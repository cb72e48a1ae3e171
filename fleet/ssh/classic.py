"""fleet's subclasses of paramiko's client, transport and host key policy: the paramiko path's
connection (SSHTransport._connect_once, fleet/ssh/transport.py). Imported only when a host
connects through paramiko: importing this module loads paramiko (fleet/ssh/library.py)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from fleet.ssh import known_hosts
from fleet.ssh.failure import ConnectFailed
from fleet.ssh.hostkeys import HostKeyStore, _cert_blob, _changed_detail
from fleet.ssh.identities import DEFAULT_IDENTITIES, _certificate_for, _IdentityCache
from fleet.ssh.known_hosts import KnownLine
from fleet.ssh.library import paramiko
from fleet.ssh.target import Target


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Every host key is judged here (paramiko is given no keys of its own): against the
    known_hosts lines for the host (known_hosts.judge), then, for a key none of them lists,
    rejected (strict) or recorded (accept-new)."""

    def __init__(self, store: HostKeyStore, target: Target, lines: list[KnownLine]) -> None:
        self.store = store
        self.target = target
        self.lines = lines

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        principal = self.target.host_key_alias or self.target.address
        verdict = known_hosts.judge(self.lines, principal, key.asbytes(), _cert_blob(key))
        offered = f"{hostname} offered {key.get_name()} {key.fingerprint}"
        if verdict.outcome == known_hosts.KNOWN:
            return
        if verdict.outcome == known_hosts.REVOKED_KEY:
            raise ConnectFailed(
                "host key revoked",
                f"{offered}: {verdict.detail}; fleet will not connect to it",
            )
        if verdict.outcome == known_hosts.BAD_CERT:
            raise ConnectFailed("host certificate rejected", f"{offered}: {verdict.detail}")
        if verdict.outcome == known_hosts.CHANGED:
            assert verdict.expected is not None
            raise ConnectFailed("host key changed", _changed_detail(key, verdict.expected.blob))
        if self.target.policy == "accept-new":
            name = self.target.host_key_alias or hostname
            self.store.record(self.target.known_hosts[-1], name, key)
            return
        raise ConnectFailed(
            "host key unknown",
            f"{offered}, not in known_hosts; "
            "verify it, then rerun with --host-keys accept-new to record it",
        )


class _AgentSubset:
    """ssh-agent's keys, only those whose public key is in `allowed`: what IdentitiesOnly
    leaves of the agent (an agent key is still used for an IdentityFile it holds, e.g. an
    encrypted key loaded with ssh-add, as ssh does)."""

    def __init__(self, allowed: frozenset[bytes]) -> None:
        self.allowed = allowed
        self._agent: paramiko.Agent | None = None

    def get_keys(self) -> tuple[paramiko.AgentKey, ...]:
        if self._agent is None:
            self._agent = paramiko.Agent()
        return tuple(k for k in self._agent.get_keys() if k.asbytes() in self.allowed)

    def close(self) -> None:
        if self._agent is not None:
            self._agent.close()


class _Client(paramiko.SSHClient):
    """paramiko's client, with two things ssh does that it does not: IdentitiesOnly (the
    agent's other keys are not offered) and CertificateFile (a certificate named in the config,
    not only KEY-cert.pub beside the key, goes with the identity it certifies); identity files
    come from the run's _IdentityCache."""

    def __init__(self, target: Target, identities: _IdentityCache) -> None:
        super().__init__()
        self._cert_files = target.certificate_files
        self._identities = identities
        if target.identities_only:
            files = target.key_files or tuple(os.path.expanduser(p) for p in DEFAULT_IDENTITIES)
            self._agent = _AgentSubset(identities.public_blobs(files))

    def forget_secrets(self) -> None:
        """Once authenticated: let go of the run's identity cache (its decrypted keys, and the
        passphrase in its slots) and of the key paramiko signed with. A keeper holds a
        connection for the window, past the command that typed the passphrase."""
        self._identities = _IdentityCache()
        handler = getattr(self.get_transport(), "auth_handler", None)
        if handler is not None:
            handler.private_key = None
            handler.password = None

    def _key_from_filepath(self, filename: str, klass: Any, password: Any) -> paramiko.PKey:
        slot = (filename, klass, password, self._cert_files)
        return self._identities.key(slot, lambda: self._load_key(filename, klass, password))

    def _load_key(self, filename: str, klass: Any, password: Any) -> paramiko.PKey:
        key: paramiko.PKey = super()._key_from_filepath(  # type: ignore[misc]
            filename, klass, password
        )
        if key.public_blob is None:
            cert = _certificate_for(self._cert_files, key.asbytes())
            if cert is not None:
                key.load_certificate(cert)
        return key


def _first(preferred: Sequence[str], *first: str) -> tuple[str, ...]:
    """paramiko's algorithm list with `first` moved to its front (the same set, reordered)."""
    return (*(a for a in first if a in preferred), *(a for a in preferred if a not in first))


class _Transport(paramiko.Transport):
    """paramiko's transport, offering host key algorithms in OpenSSH's order for this host:
    those of the keys on record first, then certificates when a CA is listed for it.

    Ciphers and MACs: the same algorithms paramiko offers, in an order that costs the client
    less. AES-GCM first (AEAD: one C call per packet; both are in OpenSSH's default list): with
    paramiko's first choice, aes128-ctr + hmac-sha2-256, every packet's MAC was compared byte by
    byte in Python (paramiko.util.constant_time_bytes_eq), ~10% of the client's CPU per host
    (bench/profile_cpu.py). For a server without GCM, the encrypt-then-MAC variants first, as
    OpenSSH orders them. Nothing is added and nothing weaker is preferred: ssh_config's
    Ciphers/MACs still restrict these lists (disabled_algorithms)."""

    _preferred_ciphers = _first(
        paramiko.Transport._preferred_ciphers,  # type: ignore[attr-defined]
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
    )
    _preferred_macs = _first(
        paramiko.Transport._preferred_macs,  # type: ignore[attr-defined]
        "hmac-sha2-256-etm@openssh.com",
        "hmac-sha2-512-etm@openssh.com",
    )

    def __init__(self, sock: Any, lines: list[KnownLine], **kw: Any) -> None:
        self._known_lines = lines
        super().__init__(sock, **kw)

    @property
    def preferred_keys(self) -> tuple[str, ...]:
        return known_hosts.algorithm_order(self._known_lines, super().preferred_keys)

    def _parse_debug(self, m: paramiko.Message) -> None:
        """sshd's SSH_MSG_DEBUG (e.g. the authorized_keys options it applied): paramiko formats
        it byte by byte in Python for a debug log line; read only with --debug."""
        if self.logger.isEnabledFor(logging.DEBUG):
            super()._parse_debug(m)  # type: ignore[misc]
