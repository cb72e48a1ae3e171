"""The OpenSSH client binary (`ssh`, what scp runs) as a bulk byte path to a host fleet has
already connected to and verified: an argv that keeps fleet's trust decisions, or the reason
there is none.

Why: paramiko decrypts and checks every packet in Python; on this 2-core machine it moved a
1 GiB stream at ~450 MB/s with the client's core saturated, where `ssh` with AES-GCM moved it at
~1.1 GB/s (docs/benchmark.md, "Push and pull"). fleet still authenticates and judges the host
key with its own connection (fleet.ssh.transport); the binary only carries bytes, and only to
the host key fleet verified on that connection:

- `-F none`: no ssh config is read; every setting below comes from fleet's resolved Target;
- the verified key is the only line of a private known_hosts file (StrictHostKeyChecking=yes,
  GlobalKnownHostsFile=/dev/null, HostKeyAlias, HostKeyAlgorithms of that key's type): a host
  offering any other key is refused, as fleet's own connection refuses it;
- BatchMode (no prompt), no agent or X11 forwarding, no forwardings, no LocalCommand, never
  the operator's ControlMaster (fleet's own, in the private directory); every option one argv
  element, no shell on the bastion.

No route (fleet keeps paramiko for the host, and says why): no `ssh` binary, a ProxyJump or
ProxyCommand, algorithm lists from the ssh config, a host certificate, or a user, address or
file name with a character ssh would expand or split (`%`, `$`, `~`, quotes, spaces): fleet
passes only values that ssh reads literally, so nothing is escaped.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fleet.ssh.transport import SSHSession

ALIAS = "fleet-bulk"  # the destination's name for ssh: known_hosts line and HostKeyAlias
# Preferred first; every one is in OpenSSH's defaults. AES-GCM first: with AES-NI it moved a
# 1 GiB stream here 2.4x faster than chacha20-poly1305 (OpenSSH's own first choice).
CIPHERS = (
    "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
    "aes128-ctr,aes192-ctr,aes256-ctr"
)
# The key exchange fleet's own connection makes (paramiko: curve25519, no post-quantum one)
# first, then the rest of what OpenSSH has offered since 7.4, so every ssh fleet may find knows
# each name. OpenSSH 9's own first choice, sntrup761x25519, cost the bastion 0.06 CPU-s and
# 70 ms per handshake here (60 CPU-s for a 1,000-node pull), and a route is no stronger than
# the connection that verified its host and carries the commands and secrets.
KEX = (
    "curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256,ecdh-sha2-nistp384,"
    "ecdh-sha2-nistp521,diffie-hellman-group-exchange-sha256,diffie-hellman-group16-sha512,"
    "diffie-hellman-group18-sha512,diffie-hellman-group14-sha256"
)
KEEPALIVE_S = 15
KEEPALIVE_COUNT = 4
LITERAL = re.compile(r"[A-Za-z0-9_@+:./][A-Za-z0-9_@+:./-]*")  # no %, $, ~, quotes, spaces
FAMILIES = {int(socket.AF_INET): "inet", int(socket.AF_INET6): "inet6"}


@dataclass(frozen=True)
class Route:
    """How to run node commands through `ssh` to one verified host: one master connection
    (ControlMaster, its socket in the private directory beside the pinned known_hosts) and one
    short `ssh` per file multiplexed over it, so a file costs no handshake (a handshake per
    file measured 0.2 s). `close` removes the directory; a fleet killed outright leaves it in
    TMPDIR (a public host key; its ssh processes end with their pipes)."""

    prefix: tuple[str, ...]  # ssh and its options, up to and including the destination
    pin_dir: Path

    @property
    def control_path(self) -> Path:
        return self.pin_dir / "mux"

    def argv(self, command: bytes) -> list[str | bytes]:
        """A file's ssh: through the master when it runs (else a connection of its own, with
        the same options); the node command is one element, sh text fleet quoted already."""
        mux = ["-o", "ControlMaster=no", "-o", f"ControlPath={self.control_path}"]
        return [self.prefix[0], *mux, *self.prefix[1:], command]

    def master_argv(self, command: bytes) -> list[str | bytes]:
        """The master connection's ssh, running `command` for as long as it should live."""
        mux = ["-o", "ControlMaster=yes", "-o", f"ControlPath={self.control_path}"]
        return [self.prefix[0], *mux, *self.prefix[1:], command]

    def close(self) -> None:
        shutil.rmtree(self.pin_dir, ignore_errors=True)


def _literal(*values: str) -> bool:
    """Every value is one that ssh reads as it is (no token, variable, tilde or quoting)."""
    return all(LITERAL.fullmatch(v) for v in values)


def _key_algorithms(key_type: str) -> str:
    """HostKeyAlgorithms that make the server prove the pinned key (an RSA key signs with SHA-2)."""
    return "rsa-sha2-512,rsa-sha2-256" if key_type == "ssh-rsa" else key_type


def unavailable(session: SSHSession, ssh: str | None) -> str | None:
    """Why `ssh` cannot carry this host's bytes with fleet's settings; None when it can."""
    target = session.target
    transport = session.client.get_transport()
    key = transport.get_remote_server_key() if transport is not None else None
    checks = (
        (ssh is None, "no ssh binary on PATH"),
        (bool(target.proxy_jump), "ProxyJump"),
        (target.proxy_command is not None, "ProxyCommand"),
        (bool(target.disabled_algorithms), "algorithm lists from the ssh config"),
        (key is None, "no host key"),
        (key is not None and "-cert-" in key.get_name(), "a host certificate"),
        (not _literal(target.user, target.address), "a user or address ssh would expand"),
        (
            not _literal(*target.key_files, *target.certificate_files),
            "a key file name ssh would expand",
        ),
        (not _literal(target.bind_address or "x"), "a BindAddress ssh would expand"),
        (not _literal(tempfile.gettempdir()), "a temporary directory name ssh would expand"),
    )
    return next((why for bad, why in checks if bad), None)


def route(session: SSHSession, ssh: str | None = None) -> Route | str:
    """A Route to the host of a connected, verified session, or why there is none."""
    ssh = ssh or shutil.which("ssh")
    why = unavailable(session, ssh)
    if why is not None:
        return why
    assert ssh is not None
    transport = session.client.get_transport()
    assert transport is not None  # unavailable() said so
    key = transport.get_remote_server_key()
    pin_dir = Path(tempfile.mkdtemp(prefix="fleet-pin-"))
    pinned = pin_dir / "known_hosts"
    fd = os.open(pinned, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(f"{ALIAS} {key.get_name()} {key.get_base64()}\n")
    return Route(tuple(_argv(ssh, session, pinned, key.get_name())), pin_dir)


def _argv(ssh: str, session: SSHSession, pinned: Path, key_type: str) -> list[str]:
    target = session.target
    opts = {
        "BatchMode": "yes",
        "StrictHostKeyChecking": "yes",
        "UserKnownHostsFile": str(pinned),
        "GlobalKnownHostsFile": "/dev/null",
        "HostKeyAlias": ALIAS,
        "HostKeyAlgorithms": _key_algorithms(key_type),
        "CheckHostIP": "no",
        "UpdateHostKeys": "no",
        "VerifyHostKeyDNS": "no",
        "HostName": target.address,
        "Port": str(target.port),
        "User": target.user,
        "ConnectTimeout": str(max(1, int(target.connect_timeout_s))),
        "ForwardAgent": "no",
        "ForwardX11": "no",
        "ClearAllForwardings": "yes",
        "PermitLocalCommand": "no",
        "RequestTTY": "no",
        "EscapeChar": "none",
        "Compression": "no",
        "LogLevel": "ERROR",
        "Ciphers": CIPHERS,
        "KexAlgorithms": KEX,
        "ServerAliveInterval": str(KEEPALIVE_S),
        "ServerAliveCountMax": str(KEEPALIVE_COUNT),
        "IdentitiesOnly": "yes" if target.identities_only else "no",
        "AddressFamily": FAMILIES.get(target.address_family, "any"),
    }
    if not target.allow_agent:
        opts["IdentityAgent"] = "none"
    if target.bind_address:
        opts["BindAddress"] = target.bind_address
    argv = [ssh, "-F", "none", "-T", "-x", "-a"]
    for name, value in opts.items():
        argv += ["-o", f"{name}={value}"]
    for path in target.key_files:
        argv += ["-o", f"IdentityFile={path}"]
    for path in target.certificate_files:
        argv += ["-o", f"CertificateFile={path}"]
    return [*argv, "--", ALIAS]
