"""OpenSSH certificates (PROTOCOL.certkeys): parsed, and host certificates checked as ssh does.

paramiko negotiates a host certificate and checks that the server holds the certified key (the
key exchange signature), but it parses nothing else of the certificate ("very little effort is
made to validate the certificate contents"). Accepting one on that alone would let any key in,
signed by anyone. `host_cert_problem` does what OpenSSH's check_host_cert does: the certificate
is a host certificate, signed (signature verified) by the CA key the caller trusts for this
host, valid now, naming the host among its principals (an empty list names every host, as in
OpenSSH), with no critical options (OpenSSH knows none for hosts).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from fleet.ssh.library import paramiko

CERT_SUFFIX = "-cert-v01@openssh.com"
USER_CERT = 1
HOST_CERT = 2
# The public numbers after the nonce, per certified key type: how many SSH strings/mpints.
_KEY_FIELDS = {
    "ssh-ed25519": 1,
    "ecdsa-sha2-nistp256": 2,
    "ecdsa-sha2-nistp384": 2,
    "ecdsa-sha2-nistp521": 2,
    "ssh-rsa": 2,
}
# OpenSSH's default CASignatureAlgorithms: no SHA-1 RSA signatures ("ssh-rsa") since 8.2.
CA_SIGNATURES = frozenset(
    {
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "rsa-sha2-256",
        "rsa-sha2-512",
    }
)
FOREVER = 0xFFFFFFFFFFFFFFFF


class CertError(ValueError):
    """Not a certificate fleet can parse."""


@dataclass(frozen=True)
class Cert:
    """The fields of an OpenSSH certificate fleet checks."""

    cert_type: str  # e.g. ssh-ed25519-cert-v01@openssh.com
    key_blob: bytes  # the certified key, as a plain public key blob
    serial: int
    kind: int  # USER_CERT or HOST_CERT
    key_id: str
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    critical: bytes
    ca_blob: bytes  # the signature key (the CA's public key)
    signature: bytes
    signed: bytes  # everything the signature covers


class WireReader:
    """SSH wire format (RFC 4251 5) over bytes, failing with CertError (a ValueError), never
    IndexError. Certificates here; private key files in fleet/ssh/keyfiles.py."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, size: int) -> bytes:
        if size < 0 or self.at + size > len(self.data):
            raise CertError("truncated")
        out = self.data[self.at : self.at + size]
        self.at += size
        return out

    def uint32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def uint64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def string(self) -> bytes:
        return self.take(self.uint32())

    def text(self) -> str:
        try:
            return self.string().decode("utf-8")
        except UnicodeDecodeError:
            raise CertError("a name that is not UTF-8") from None


def _pack(*fields: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(f)) + f for f in fields)


def parse(blob: bytes) -> Cert:
    """A certificate from its wire blob (what a -cert.pub holds, base64-decoded)."""
    r = WireReader(blob)
    cert_type = r.text()
    plain = cert_type.removesuffix(CERT_SUFFIX)
    if plain == cert_type or plain not in _KEY_FIELDS:
        raise CertError(f"not a certificate type fleet knows ({cert_type[:60]!r})")
    r.string()  # nonce
    numbers = [r.string() for _ in range(_KEY_FIELDS[plain])]
    serial, kind, key_id = r.uint64(), r.uint32(), r.text()
    names = WireReader(r.string())
    principals: list[str] = []
    while names.at < len(names.data):
        principals.append(names.text())
    valid_after, valid_before = r.uint64(), r.uint64()
    critical = r.string()
    r.string()  # extensions: host certificates define none that change trust
    r.string()  # reserved
    ca_blob = r.string()
    signed = blob[: r.at]
    signature = r.string()
    if r.at != len(blob):
        raise CertError("trailing data")
    return Cert(
        cert_type=cert_type,
        key_blob=_pack(plain.encode(), *numbers),
        serial=serial,
        kind=kind,
        key_id=key_id,
        principals=tuple(principals),
        valid_after=valid_after,
        valid_before=valid_before,
        critical=critical,
        ca_blob=ca_blob,
        signature=signature,
        signed=signed,
    )


def signature_ok(cert: Cert) -> bool:
    """True if the certificate's signature verifies with its own signature key (the CA's), by
    an algorithm OpenSSH accepts for certificates."""
    try:
        sig_alg = WireReader(cert.signature).text()
        ca_type = WireReader(cert.ca_blob).text()
        if sig_alg not in CA_SIGNATURES:
            return False
        ca = paramiko.PKey.from_type_string(ca_type, cert.ca_blob)
        return bool(ca.verify_ssh_sig(cert.signed, paramiko.Message(cert.signature)))
    except (CertError, paramiko.SSHException, ValueError, TypeError):
        return False


def host_cert_problem(cert: Cert, principal: str, now: float | None = None) -> str | None:
    """Why `cert` does not prove it is `principal`'s host key (None: it does). The caller has
    checked that its CA is trusted for this host."""
    when = int(time.time() if now is None else now)
    if cert.kind != HOST_CERT:
        return "a user certificate, not a host certificate"
    if not signature_ok(cert):
        return "its CA signature does not verify"
    if when < cert.valid_after:
        return "not yet valid"
    if cert.valid_before != FOREVER and when >= cert.valid_before:
        return "expired"
    if cert.principals and principal not in cert.principals:
        return f"not issued for {principal} (principals: {', '.join(cert.principals)[:200]})"
    if cert.critical:
        return "carries critical options (OpenSSH accepts none in host certificates)"
    return None
