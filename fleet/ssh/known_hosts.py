"""known_hosts files read as OpenSSH reads them (sshd(8) SSH_KNOWN_HOSTS FILE FORMAT), and the
decision on a server's host key.

paramiko's HostKeys cannot be used for this: a `@cert-authority` line stops it (it takes the
marker for the host names and fails on the key), it drops `@revoked` lines (a revoked key was
accepted when also listed), and it matches host names literally (no `*`, `?` or `!`). Here a
line is `[@marker] hosts keytype base64 [comment]`; hosts are comma-separated patterns (`*`,
`?`, a leading `!` negates and vetoes the line) or one hashed name (`|1|salt|hmac`). A line
fleet cannot use (an unknown marker, too few fields) is skipped, as OpenSSH skips it; a key
that is not base64 is an error (the file is damaged, or not a known_hosts file).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from fleet.ssh import cert as sshcert

CERT_AUTHORITY = "@cert-authority"
REVOKED = "@revoked"
MARKERS = frozenset({CERT_AUTHORITY, REVOKED})
# A known key's type -> the plain host key algorithms negotiated for it (paramiko, libssh2).
ALGORITHMS = {
    "ssh-ed25519": ("ssh-ed25519",),
    "ecdsa-sha2-nistp256": ("ecdsa-sha2-nistp256",),
    "ecdsa-sha2-nistp384": ("ecdsa-sha2-nistp384",),
    "ecdsa-sha2-nistp521": ("ecdsa-sha2-nistp521",),
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256"),
}


class DamagedLine(ValueError):
    """A line whose key is not base64 (or not the type it claims)."""


@dataclass(frozen=True)
class KnownLine:
    """One usable known_hosts line."""

    marker: str  # "", CERT_AUTHORITY or REVOKED
    hosts: str  # the host field as written
    keytype: str
    blob: bytes
    line: int

    def applies_to(self, name: str) -> bool:
        """Does this line's host field name `name` (`host` or `[host]:port`)?"""
        return host_matches(self.hosts, name)


def parse(text: str) -> tuple[KnownLine, ...]:
    """The usable lines of a known_hosts file; DamagedLine names the first damaged line."""
    out: list[KnownLine] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        marker = ""
        if fields[0].startswith("@"):
            marker = fields.pop(0)
            if marker not in MARKERS:
                continue  # OpenSSH skips a line with a marker it does not know
        if len(fields) < 3:
            continue
        hosts, keytype, encoded = fields[:3]
        out.append(KnownLine(marker, hosts, keytype, _decode(encoded, keytype, number), number))
    return tuple(out)


class Index:
    """A file's lines, looked up by host name without testing every line: a line whose host
    field lists only plain names (no `*`, `?`, `!`, not hashed) can only apply to one of them, so
    it is filed under each; the others are tested one by one. (A generated known_hosts has a
    line per node: testing every line for every host was 23 ms per host at 20,000 lines.)"""

    def __init__(self, lines: Iterable[KnownLine] = ()) -> None:
        self.lines: list[KnownLine] = []
        self._by_name: dict[str, list[int]] = {}
        self._others: list[int] = []
        for line in lines:
            self.add(line)

    def add(self, line: KnownLine) -> None:
        at = len(self.lines)
        self.lines.append(line)
        names = line.hosts.lower().split(",")
        if line.hosts.startswith("|") or any(_SPECIAL & set(n) for n in names):
            self._others.append(at)
            return
        for name in dict.fromkeys(names):
            self._by_name.setdefault(name, []).append(at)

    def applying_to(self, name: str) -> list[KnownLine]:
        """The lines that apply to `name`, in file order."""
        named = self._by_name.get(name.lower(), [])
        others = [i for i in self._others if self.lines[i].applies_to(name)]
        return [self.lines[i] for i in sorted((*named, *others))]


_SPECIAL = frozenset("*?!")


def _decode(encoded: str, keytype: str, number: int) -> bytes:
    """The key blob; it must be base64 and start with its own type, as OpenSSH checks."""
    try:
        blob = base64.b64decode(encoded.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise DamagedLine(f"line {number}") from None
    if len(blob) < 4:
        raise DamagedLine(f"line {number}")
    size = struct.unpack(">I", blob[:4])[0]
    if blob[4 : 4 + size] != keytype.encode():
        raise DamagedLine(f"line {number}")
    return blob


def host_matches(field: str, name: str) -> bool:
    """OpenSSH's match_hostname for a known_hosts host field (case-insensitive), or a hashed
    name (HMAC-SHA1 of the name under the salt)."""
    name = name.lower()
    if field.startswith("|1|"):
        return _hashed_matches(field, name)
    matched = False
    for pattern in field.lower().split(","):
        negated = pattern.startswith("!")
        if _wildcard(pattern[1:] if negated else pattern).fullmatch(name):
            if negated:
                return False
            matched = True
    return matched


def _hashed_matches(field: str, name: str) -> bool:
    parts = field.split("|")
    if len(parts) != 4:
        return False
    try:
        salt = base64.b64decode(parts[2], validate=True)
        want = base64.b64decode(parts[3], validate=True)
    except binascii.Error:
        return False
    got = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(got, want)


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _wildcard(pattern: str) -> re.Pattern[str]:
    """`*` and `?` only (a `[` is literal: `[host]:port`)."""
    compiled = _PATTERNS.get(pattern)
    if compiled is None:
        regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
        compiled = _PATTERNS.setdefault(pattern, re.compile(regex, re.S))
    return compiled


def fingerprint(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


# ---------------------------------------------------------------- the decision

KNOWN = "known"
UNKNOWN = "unknown"
CHANGED = "changed"
REVOKED_KEY = "revoked"
BAD_CERT = "bad certificate"


@dataclass(frozen=True)
class Verdict:
    """What the known_hosts lines say of a server's host key."""

    outcome: str
    detail: str = ""
    expected: KnownLine | None = None  # for CHANGED: the key on record


def judge(
    lines: Iterable[KnownLine],
    principal: str,
    key_blob: bytes,
    cert_blob: bytes | None,
    now: float | None = None,
) -> Verdict:
    """OpenSSH's check_host_key on the lines that apply to this host: a revoked key (or CA) is
    refused even when also listed; a certificate is checked against the CAs listed for the host
    (`principal` is the name it must be issued to), and one no listed CA signed falls back to
    its plain key, as OpenSSH does."""
    lines = list(lines)
    revoked = {x.blob for x in lines if x.marker == REVOKED}
    if key_blob in revoked:
        return Verdict(REVOKED_KEY, "the host key is marked @revoked in known_hosts")
    if cert_blob is not None:
        try:
            cert = sshcert.parse(cert_blob)
        except sshcert.CertError as exc:
            return Verdict(BAD_CERT, f"the host certificate cannot be read: {exc}")
        if cert.key_blob != key_blob:
            return Verdict(BAD_CERT, "the host certificate certifies another key")
        if cert.ca_blob in revoked:
            return Verdict(REVOKED_KEY, "the CA key that signed the host certificate is @revoked")
        if any(x.marker == CERT_AUTHORITY and x.blob == cert.ca_blob for x in lines):
            problem = sshcert.host_cert_problem(cert, principal, now)
            if problem is not None:
                return Verdict(BAD_CERT, f"host certificate {cert.key_id[:80]!r}: {problem}")
            return Verdict(KNOWN)
    plain = [x for x in lines if not x.marker]
    if any(x.blob == key_blob for x in plain):
        return Verdict(KNOWN)
    if plain:
        return Verdict(CHANGED, expected=plain[0])
    return Verdict(UNKNOWN)


def algorithm_order(lines: Iterable[KnownLine], preferred: Iterable[str]) -> tuple[str, ...]:
    """Host key algorithms in the order to offer them: those of the keys on record first, then
    certificates when a CA is listed for the host (OpenSSH's order_hostkeyalgs), then the rest;
    only algorithms in `preferred` (which keeps its own order within each group)."""
    lines = list(lines)
    preferred = tuple(preferred)
    known = {a for x in lines if not x.marker for a in ALGORITHMS.get(x.keytype, ())}
    has_ca = any(x.marker == CERT_AUTHORITY for x in lines)
    first = [a for a in preferred if a in known]
    certs = [a for a in preferred if has_ca and a.endswith(sshcert.CERT_SUFFIX)]
    rest = [a for a in preferred if a not in first and a not in certs]
    return (*first, *certs, *rest)
