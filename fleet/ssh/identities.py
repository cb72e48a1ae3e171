"""Identity files: loaded once per run and shared by every paramiko connection, and the
certificates that go with them."""

from __future__ import annotations

import base64
import copy
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fleet.ssh import cert as sshcert
from fleet.ssh.library import paramiko

# OpenSSH's default identities, tried when no IdentityFile is set (ssh(1) -i).
DEFAULT_IDENTITIES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ed25519")


class _IdentityCache:
    """Identity files read once per run and shared by every connection.

    paramiko reads and parses an identity file for each connection, once per key class it
    tries (an Ed25519 key is read as RSA, then ECDSA, then Ed25519), and an encrypted key's KDF
    (bcrypt, ~0.1-1 s of CPU) ran again for each host. Here each (file, key class, passphrase,
    certificate files) is loaded once, by the first connection that needs it while the others
    wait, and what came of it (the key, or the error paramiko expects for a wrong key class) is
    reused. A loaded key only signs: sharing it between threads is safe (cryptography and
    PyNaCl keys are immutable). The public keys IdentitiesOnly lets the agent offer are read
    once too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[tuple[Any, ...], paramiko.PKey | Exception] = {}
        self._blobs: dict[tuple[str, ...], frozenset[bytes]] = {}

    def key(self, slot: tuple[Any, ...], load: Callable[[], paramiko.PKey]) -> paramiko.PKey:
        with self._lock:
            found = self._keys.get(slot)
            if found is None:
                try:
                    found = load()
                except (paramiko.SSHException, OSError) as exc:  # what paramiko's _auth catches
                    found = exc
                self._keys[slot] = found
        if isinstance(found, Exception):
            raise copy.copy(found)  # a fresh exception per raise: threads share the cause
        return found

    def public_blobs(self, files: tuple[str, ...]) -> frozenset[bytes]:
        with self._lock:
            if files not in self._blobs:
                self._blobs[files] = frozenset(_public_blobs(files))
            return self._blobs[files]


def _public_blobs(files: Iterable[str]) -> list[bytes]:
    """The public keys of identity files, from KEY.pub (readable without a passphrase)."""
    blobs = []
    for path in files:
        try:
            text = Path(f"{path}.pub").read_text(encoding="ascii", errors="replace")
            blobs.append(base64.b64decode(text.split()[1], validate=True))
        except (OSError, IndexError, ValueError):
            continue
    return blobs


def _certificate_for(paths: Iterable[str], key_blob: bytes) -> str | None:
    """The first certificate file among `paths` that certifies `key_blob`."""
    for path in paths:
        try:
            text = Path(path).read_text(encoding="ascii", errors="replace")
            cert = sshcert.parse(base64.b64decode(text.split()[1], validate=True))
        except (OSError, IndexError, ValueError):
            continue
        if cert.key_blob == key_blob:
            return path
    return None
