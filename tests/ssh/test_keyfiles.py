"""Identity files checked before any connection (fleet/ssh/keyfiles.py): an unencrypted OpenSSH
key, what ssh-keygen writes, is read without loading cryptography; anything else, or one whose
structure does not check out, is parsed by cryptography as before."""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa

from fleet.ssh.keyfiles import UNUSABLE, _plain_openssh_type, key_file_problem

BEGIN = b"-----BEGIN OPENSSH PRIVATE KEY-----"
END = b"-----END OPENSSH PRIVATE KEY-----"


def _openssh(key: object, password: bytes | None = None) -> bytes:
    encryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, encryption
    )


def _blob(pem: bytes) -> bytes:
    return base64.b64decode(b"".join(pem.strip()[len(BEGIN) : -len(END)].split()))


def _pem(blob: bytes) -> bytes:
    text = base64.b64encode(blob)
    lines = [text[i : i + 70] for i in range(0, len(text), 70)]
    return b"\n".join([BEGIN, *lines, END]) + b"\n"


KEYS = {
    "ssh-ed25519": ed25519.Ed25519PrivateKey.generate(),
    "ssh-rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    "ecdsa-sha2-nistp256": ec.generate_private_key(ec.SECP256R1()),
    "ecdsa-sha2-nistp384": ec.generate_private_key(ec.SECP384R1()),
}


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_plain_openssh_keys_are_read_without_cryptography(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "id"
    path.write_bytes(_openssh(KEYS[kind]))
    assert _plain_openssh_type(path.read_bytes()) == kind
    probe = (
        "import json, sys\nfrom pathlib import Path\n"
        "from fleet.ssh.keyfiles import key_file_problem\n"
        f"problem = key_file_problem(Path({str(path)!r}))\n"
        "print(json.dumps([problem, 'cryptography' in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == [None, False]


@pytest.mark.filterwarnings("ignore:SSH DSA key support is deprecated")  # writing one, here
def test_a_dsa_key_in_openssh_format_is_refused_as_unusable(tmp_path: Path) -> None:
    path = tmp_path / "id_dsa"
    path.write_bytes(_openssh(dsa.generate_private_key(key_size=1024)))
    assert _plain_openssh_type(path.read_bytes()) is None  # cryptography's to judge
    assert key_file_problem(path) == UNUSABLE


def test_an_encrypted_key_goes_to_cryptography_and_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "id"
    path.write_bytes(_openssh(KEYS["ssh-ed25519"], b"secret"))
    assert _plain_openssh_type(path.read_bytes()) is None
    assert key_file_problem(path) is None  # the passphrase is --ask-key-pass's or the agent's


def _with_private(pem: bytes, edit: object) -> bytes:
    """The key with its private section changed by `edit` (bytes -> bytes), lengths fixed."""
    blob = _blob(pem)
    at = len(b"openssh-key-v1\0")
    for _ in range(3):  # cipher, kdf, kdf options
        (size,) = struct.unpack_from(">I", blob, at)
        at += 4 + size
    at += 4  # the number of keys
    (size,) = struct.unpack_from(">I", blob, at)
    at += 4 + size  # the public key
    (size,) = struct.unpack_from(">I", blob, at)
    private = edit(blob[at + 4 : at + 4 + size])  # type: ignore[operator]
    return _pem(blob[:at] + struct.pack(">I", len(private)) + private)


DAMAGED = "not a private key fleet can read (damaged, or an unsupported format)"


def _flip(at: int) -> object:
    """An edit of the private section: one byte at `at` (negative: from the end) flipped."""
    return lambda p: p[:at] + bytes([p[at] ^ 0x55]) + (p[at + 1 :] if at != -1 else b"")


def _field_start(private: bytes, index: int) -> int:
    """Where the data of the private section's `index`-th field (0: the key type) starts."""
    at = 8
    for _ in range(index):
        (size,) = struct.unpack_from(">I", private, at)
        at += 4 + size
    return at + 4


ED_PEM = _openssh(KEYS["ssh-ed25519"])
RSA_PEM = _openssh(KEYS["ssh-rsa"])


def _private_of(pem: bytes) -> bytes:
    got: list[bytes] = []
    _with_private(pem, lambda p: got.append(p) or p)
    return got[0]


@pytest.mark.parametrize(
    ("what", "damaged"),
    [
        ("check integers differ", _with_private(ED_PEM, _flip(4))),
        ("padding not 1, 2, 3, ...", _with_private(ED_PEM, _flip(-1))),
        ("bytes after the private section", _pem(_blob(ED_PEM) + b"\0\0\0\0")),
        (
            "the private key's public half is not the public key",
            _with_private(ED_PEM, _flip(_field_start(_private_of(ED_PEM), 2) + 40)),
        ),
        (
            "RSA: p * q is not n",
            _with_private(RSA_PEM, _flip(_field_start(_private_of(RSA_PEM), 6) + 10)),
        ),
    ],
)
def test_a_damaged_key_is_not_taken_on_its_looks(what: str, damaged: bytes, tmp_path: Path) -> None:
    """A damaged file: the fast path declines, and cryptography's verdict stands (one error
    before connecting, not an authentication failure per host)."""
    assert _plain_openssh_type(damaged) is None, what
    path = tmp_path / "id"
    path.write_bytes(damaged)
    assert key_file_problem(path) == DAMAGED, what


def test_a_public_key_that_is_not_the_private_keys_is_declined() -> None:
    """The public blob of one key with the private section of another."""
    other = _with_private(_openssh(ed25519.Ed25519PrivateKey.generate()), lambda p: p)
    mixed = _pem(
        _blob(ED_PEM)[: -len(_private_of(ED_PEM)) - 4]
        + _blob(other)[-len(_private_of(other)) - 4 :]
    )
    assert _plain_openssh_type(mixed) is None


@pytest.mark.parametrize(
    "text",
    [
        BEGIN + b"\n!!!not base64!!!\n" + END,
        BEGIN + b"\n" + base64.b64encode(b"openssh-key-v1\0\0\0") + b"\n" + END,
        BEGIN + b"\n" + base64.b64encode(b"something else entirely") + b"\n" + END,
    ],
)
def test_garbage_between_the_markers_is_left_to_cryptography(text: bytes, tmp_path: Path) -> None:
    assert _plain_openssh_type(text) is None
    path = tmp_path / "id"
    path.write_bytes(text)
    assert key_file_problem(path) is not None
