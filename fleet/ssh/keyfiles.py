"""Identity files checked before any connection: a missing, unreadable or non-key file is one
clear error naming the file and the hosts that use it, not a failure per host."""

from __future__ import annotations

import base64
import binascii
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

from fleet.core.errors import ConfigError
from fleet.ssh.cert import WireReader

MAX_KEY_BYTES = 1024 * 1024  # private keys are a few KB; reading stops here
USABLE_TYPES = frozenset(
    {"ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521"}
)
UNUSABLE = "a private key of a type fleet cannot use (RSA, ECDSA and Ed25519 work)"
_OPENSSH_BEGIN = b"-----BEGIN OPENSSH PRIVATE KEY-----"
_OPENSSH_END = b"-----END OPENSSH PRIVATE KEY-----"
_OPENSSH_MAGIC = b"openssh-key-v1\0"


def key_file_problem(path: Path) -> str | None:
    """Why `path` cannot be used as a private key (None: it can; encrypted is fine, that is
    --ask-key-pass's or ssh-agent's job). Never quotes the file."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_KEY_BYTES + 1)
    except FileNotFoundError:
        return "no such file"
    except IsADirectoryError:
        return "is a directory, not a private key"
    except PermissionError:
        return "permission denied"
    except OSError as exc:
        return f"cannot read: {exc.strerror or type(exc).__name__}"
    if len(data) > MAX_KEY_BYTES:
        return "not a private key (far too large)"
    head = data.lstrip()[:64]
    if head.startswith((b"ssh-", b"ecdsa-", b"sk-")):
        return "is a public key; name the private key (the file without .pub)"
    if head.startswith(b"PuTTY-User-Key-File"):
        return "is a PuTTY key; convert it with `puttygen KEY -O private-openssh`"
    if not head.startswith(b"-----BEGIN "):
        return "not a private key"
    key_type = _plain_openssh_type(data)
    if key_type is not None:
        return None if key_type in USABLE_TYPES else UNUSABLE
    return _parse_problem(data)


def _plain_openssh_type(data: bytes) -> str | None:
    """The key type of an unencrypted single-key OpenSSH private key (what ssh-keygen writes by
    default) whose every part checks out, read without loading cryptography (~20 ms of every
    command's start): the magic, cipher and KDF `none`, one key, nothing after the private
    section, the two check integers equal, the key's own fields (Ed25519: the public half of the
    private key is the public key; RSA: n and e are the public key's and p*q = n; ECDSA: the curve
    and point are the public key's), then the comment and the padding 1, 2, 3, ... None for
    anything else, which cryptography then parses and judges."""
    text = data.strip()
    if not (text.startswith(_OPENSSH_BEGIN) and text.endswith(_OPENSSH_END)):
        return None
    try:
        blob = base64.b64decode(
            b"".join(text[len(_OPENSSH_BEGIN) : -len(_OPENSSH_END)].split()), validate=True
        )
        if not blob.startswith(_OPENSSH_MAGIC):
            return None
        whole = WireReader(blob[len(_OPENSSH_MAGIC) :])
        cipher, kdf, _options = whole.string(), whole.string(), whole.string()
        if cipher != b"none" or kdf != b"none" or whole.uint32() != 1:
            return None
        public, private = whole.string(), whole.string()
        if whole.at != len(whole.data) or len(private) < 8 or len(private) % 8:
            return None
        key = WireReader(private)
        if key.uint32() != key.uint32():  # the check integers
            return None
        key_type = key.string()
        if not _key_fields_match(key_type, WireReader(public), key):
            return None
        key.string()  # the comment
    except (binascii.Error, ValueError):  # WireReader's CertError is one
        return None
    padding = private[key.at :]
    if padding != bytes(range(1, len(padding) + 1)):
        return None
    return key_type.decode("ascii")


def _key_fields_match(key_type: bytes, public: WireReader, key: WireReader) -> bool:
    """The private key's own fields (read on from `key`) agree with the public key (all of it);
    False when they do not, or for a key type this check does not know."""
    if public.string() != key_type:
        return False
    if key_type == b"ssh-ed25519":
        pub, priv = key.string(), key.string()
        ok = public.string() == pub and len(pub) == 32 and len(priv) == 64 and priv[32:] == pub
    elif key_type == b"ssh-rsa":
        n, e, _d, _iqmp, p, q = (key.string() for _ in range(6))
        ok = (public.string(), public.string()) == (e, n) and _int(p) * _int(q) == _int(n) > 0
    elif key_type in (b"ecdsa-sha2-nistp256", b"ecdsa-sha2-nistp384", b"ecdsa-sha2-nistp521"):
        curve, point, _d = (key.string() for _ in range(3))
        ok = (public.string(), public.string()) == (curve, point) and key_type.endswith(curve)
    else:
        return False
    return ok and public.at == len(public.data)


def _int(mpint: bytes) -> int:
    return int.from_bytes(mpint, "big", signed=True)


def _parse_problem(data: bytes) -> str | None:
    """Parse the key (without a passphrase: encrypted is fine) and check paramiko can use it."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    loaders = (serialization.load_ssh_private_key, serialization.load_pem_private_key)
    for load in loaders:
        try:
            with warnings.catch_warnings():  # a DSA key: fleet says why, not cryptography
                warnings.simplefilter("ignore")
                key = load(data, password=None)
        except TypeError:
            return None  # encrypted: the passphrase comes from --ask-key-pass or the agent
        except UnsupportedAlgorithm:
            return UNUSABLE
        except ValueError:
            continue
        if isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
            return None
        if isinstance(key, ed25519.Ed25519PrivateKey):
            return None
        return UNUSABLE
    return "not a private key fleet can read (damaged, or an unsupported format)"


def check_key_files(users: Mapping[str, Iterable[str]]) -> None:
    """Refuse, before any connection, an identity file that is missing, unreadable or not a
    private key: one line naming the file and the hosts that use it."""
    for path, names in users.items():
        problem = key_file_problem(Path(path))
        if problem is None:
            continue
        from fleet.core import nodeset  # only for the error: ClusterShell is not light

        who = nodeset.fold(names)
        if len(who) > 120:
            who = who[:117] + "..."
        raise ConfigError(
            f"identity file {path} (used by {who}): {problem}",
            hint="fix ansible_ssh_private_key_file / key in the inventory or IdentityFile in "
            "the ssh config",
        )
