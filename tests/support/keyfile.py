"""A real private key file for tests that check identity files without connecting anywhere."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519


def write_ed25519(path: Path) -> Path:
    """A fresh unencrypted Ed25519 key at `path`, in OpenSSH's format (what ssh-keygen writes)."""
    path.write_bytes(
        ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    return path
