"""known_hosts as OpenSSH reads it (fleet/ssh/known_hosts.py, fleet/ssh/cert.py): markers, hashed
names, patterns, and the decision on a host key, with certificates made by the real ssh-keygen."""

from __future__ import annotations

import base64
import hashlib
import hmac
import subprocess
import time
from pathlib import Path

import paramiko
import pytest

from fleet.core.errors import ConfigError
from fleet.ssh import cert as sshcert
from fleet.ssh import known_hosts
from fleet.ssh.known_hosts import judge, parse
from fleet.ssh.transport import HostKeyStore


def _keygen(path: Path, kind: str = "ed25519") -> tuple[str, bytes]:
    """A real key pair; (its public line's type, its blob)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    keytype, encoded = Path(f"{path}.pub").read_text().split()[:2]
    return keytype, base64.b64decode(encoded)


def _sign(ca: Path, key: Path, *args: str) -> bytes:
    """ssh-keygen -s: the certificate's blob."""
    subprocess.run(
        ["ssh-keygen", "-q", "-s", str(ca), "-I", "test-id", *args, f"{key}.pub"],
        check=True,
        capture_output=True,
    )
    return base64.b64decode(Path(f"{key}-cert.pub").read_text().split()[1])


def _line(marker: str, hosts: str, path: Path) -> str:
    keytype, encoded = Path(f"{path}.pub").read_text().split()[:2]
    return f"{marker} {hosts} {keytype} {encoded}".strip()


def _hashed(name: str) -> str:
    salt = b"0123456789abcdefghij"
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


# ---------------------------------------------------------------- reading


def test_markers_are_read_not_taken_for_host_names(tmp_path: Path) -> None:
    _keygen(tmp_path / "ca")
    _keygen(tmp_path / "host")
    lines = parse(
        "\n".join(
            [
                "# comment",
                _line("@cert-authority", "*.example.com", tmp_path / "ca"),
                _line("@revoked", "*", tmp_path / "host"),
                _line("", "node01,10.0.0.1", tmp_path / "host") + " a comment",
                _line("@unknown-marker", "node01", tmp_path / "host"),  # skipped, as OpenSSH
                "node02 ssh-ed25519",  # too few fields: skipped
            ]
        )
    )
    assert [(x.marker, x.hosts, x.line) for x in lines] == [
        ("@cert-authority", "*.example.com", 2),
        ("@revoked", "*", 3),
        ("", "node01,10.0.0.1", 4),
    ]


def test_a_key_that_is_not_base64_or_not_its_type_is_damage(tmp_path: Path) -> None:
    with pytest.raises(known_hosts.DamagedLine):
        parse("node01 ssh-ed25519 AAAA$$$\n")
    _keygen(tmp_path / "host")
    encoded = Path(f"{tmp_path / 'host'}.pub").read_text().split()[1]
    with pytest.raises(known_hosts.DamagedLine):
        parse(f"node01 ssh-rsa {encoded}\n")


@pytest.mark.parametrize(
    ("field", "name", "matches"),
    [
        ("node01", "node01", True),
        ("NODE01", "node01", True),
        ("node01,node02", "node02", True),
        ("node0?", "node07", True),
        ("node0?", "node17", False),
        ("*.example.com", "gpu1.example.com", True),
        ("*.example.com", "[gpu1.example.com]:2222", False),  # as OpenSSH: the port is part of it
        ("[*.example.com]:2222", "[gpu1.example.com]:2222", True),
        ("[10.0.0.1]:2222", "[10.0.0.1]:2222", True),
        ("[10.0.0.1]:2222", "10.0.0.1", False),
        ("*,!bad.example.com", "bad.example.com", False),
        ("*,!bad.example.com", "good.example.com", True),
        ("!bad.example.com", "good.example.com", False),  # only a negation: never a match
        (_hashed("node01"), "node01", True),
        (_hashed("node01"), "node02", False),
        (_hashed("[10.0.0.1]:2222"), "[10.0.0.1]:2222", True),
        ("|1|not|base64!", "node01", False),
    ],
)
def test_host_patterns_and_hashed_names_match_as_in_openssh(
    field: str, name: str, matches: bool
) -> None:
    assert known_hosts.host_matches(field, name) is matches


def test_a_file_with_cert_authority_and_revoked_lines_loads(tmp_path: Path) -> None:
    """paramiko took `@cert-authority` for a host name and failed on the line: fleet refused to
    run with any such line in any known_hosts it reads."""
    _keygen(tmp_path / "ca")
    _keygen(tmp_path / "host")
    path = tmp_path / "known_hosts"
    path.write_text(
        _line("@cert-authority", "*.corp.example", tmp_path / "ca")
        + "\n"
        + _line("", "node01", tmp_path / "host")
        + "\n"
    )
    store = HostKeyStore()
    assert len(store.load(path).lines) == 2
    assert list(store.known((path,), "node01")) == ["ssh-ed25519"]


def test_a_damaged_file_is_still_one_error(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text("node01 ssh-ed25519 AAAA$$ secret\n")
    with pytest.raises(ConfigError, match="not a known_hosts file"):
        HostKeyStore().load(path)


# ---------------------------------------------------------------- the decision


def _lines_for(text: str, name: str) -> list[known_hosts.KnownLine]:
    return [x for x in parse(text) if x.applies_to(name)]


def test_a_revoked_key_is_refused_even_when_also_listed(tmp_path: Path) -> None:
    _, blob = _keygen(tmp_path / "host")
    text = _line("", "node01", tmp_path / "host") + "\n" + _line("@revoked", "*", tmp_path / "host")
    assert judge(_lines_for(text, "node01"), "node01", blob, None).outcome == "revoked"
    assert judge(_lines_for(text, "node01")[:1], "node01", blob, None).outcome == "known"


def test_plain_keys_known_changed_unknown(tmp_path: Path) -> None:
    _, blob = _keygen(tmp_path / "host")
    _, other = _keygen(tmp_path / "other")
    text = _line("", "node01", tmp_path / "host")
    assert judge(_lines_for(text, "node01"), "node01", blob, None).outcome == "known"
    changed = judge(_lines_for(text, "node01"), "node01", other, None)
    assert changed.outcome == "changed"
    assert changed.expected is not None
    assert changed.expected.blob == blob
    assert judge(_lines_for(text, "node02"), "node02", blob, None).outcome == "unknown"


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    paths = {name: tmp_path / name for name in ("ca", "otherca", "host")}
    for path in paths.values():
        _keygen(path)
    return paths


def _host_key(pki: dict[str, Path]) -> bytes:
    return base64.b64decode(Path(f"{pki['host']}.pub").read_text().split()[1])


def test_a_host_certificate_from_a_listed_ca_is_known(pki: dict[str, Path]) -> None:
    cert = _sign(pki["ca"], pki["host"], "-h", "-n", "node01.corp,10.0.0.1")
    lines = _lines_for(_line("@cert-authority", "*.corp,10.0.0.*", pki["ca"]), "node01.corp")
    assert judge(lines, "node01.corp", _host_key(pki), cert).outcome == "known"


@pytest.mark.parametrize(
    ("args", "principal", "problem"),
    [
        (("-n", "node01.corp"), "node01.corp", "a user certificate"),  # no -h
        (("-h", "-n", "node02.corp"), "node01.corp", "not issued for node01.corp"),
        (("-h", "-n", "node01.corp", "-V", "-2d:-1d"), "node01.corp", "expired"),
        (("-h", "-n", "node01.corp", "-V", "+1d:+2d"), "node01.corp", "not yet valid"),
        (("-h", "-n", "node01.corp", "-O", "force-command=true"), "node01.corp", "critical"),
    ],
)
def test_a_host_certificate_that_does_not_hold_is_rejected(
    pki: dict[str, Path], args: tuple[str, ...], principal: str, problem: str
) -> None:
    cert = _sign(pki["ca"], pki["host"], *args)
    lines = _lines_for(_line("@cert-authority", "*", pki["ca"]), principal)
    verdict = judge(lines, principal, _host_key(pki), cert)
    assert verdict.outcome == "bad certificate"
    assert problem in verdict.detail


def test_a_certificate_with_a_forged_signature_is_rejected(pki: dict[str, Path]) -> None:
    cert = bytearray(_sign(pki["ca"], pki["host"], "-h", "-n", "node01"))
    parsed = sshcert.parse(bytes(cert))
    assert sshcert.signature_ok(parsed)
    # Change one byte of the signed part (inside the key id): the signature no longer holds.
    at = bytes(cert).index(b"test-id")
    cert[at] ^= 0x01
    lines = _lines_for(_line("@cert-authority", "*", pki["ca"]), "node01")
    verdict = judge(lines, "node01", _host_key(pki), bytes(cert))
    assert verdict.outcome == "bad certificate"
    assert "signature does not verify" in verdict.detail


def test_a_certificate_from_an_unlisted_ca_falls_back_to_the_plain_key(
    pki: dict[str, Path],
) -> None:
    cert = _sign(pki["otherca"], pki["host"], "-h", "-n", "node01")
    ca_only = _lines_for(_line("@cert-authority", "*", pki["ca"]), "node01")
    assert judge(ca_only, "node01", _host_key(pki), cert).outcome == "unknown"
    listed = ca_only + _lines_for(_line("", "node01", pki["host"]), "node01")
    assert judge(listed, "node01", _host_key(pki), cert).outcome == "known"


def test_a_revoked_ca_or_certified_key_is_refused(pki: dict[str, Path]) -> None:
    cert = _sign(pki["ca"], pki["host"], "-h", "-n", "node01")
    trusted = _line("@cert-authority", "*", pki["ca"])
    for revoked in (pki["ca"], pki["host"]):
        text = trusted + "\n" + _line("@revoked", "*", revoked)
        verdict = judge(_lines_for(text, "node01"), "node01", _host_key(pki), cert)
        assert verdict.outcome == "revoked", revoked


def test_a_ca_listed_for_other_hosts_does_not_vouch_for_this_one(pki: dict[str, Path]) -> None:
    cert = _sign(pki["ca"], pki["host"], "-h", "-n", "node01")
    lines = _lines_for(_line("@cert-authority", "*.other.example", pki["ca"]), "node01")
    assert judge(lines, "node01", _host_key(pki), cert).outcome == "unknown"


def test_rsa_and_ecdsa_certificates_parse_and_verify(tmp_path: Path) -> None:
    for ca_kind, host_kind in (("rsa", "ecdsa"), ("ecdsa", "rsa")):
        ca, host = tmp_path / f"ca-{ca_kind}", tmp_path / f"host-{host_kind}"
        _keygen(ca, ca_kind)
        _, blob = _keygen(host, host_kind)
        cert = sshcert.parse(_sign(ca, host, "-h", "-n", "node01"))
        assert cert.key_blob == blob
        assert sshcert.host_cert_problem(cert, "node01", time.time()) is None


def test_certificate_algorithms_come_first_only_when_a_ca_is_listed(pki: dict[str, Path]) -> None:
    preferred = paramiko.Transport._preferred_keys + tuple(
        f"{x}{sshcert.CERT_SUFFIX}" for x in paramiko.Transport._preferred_keys
    )
    ca = _lines_for(_line("@cert-authority", "*", pki["ca"]), "node01")
    assert known_hosts.algorithm_order(ca, preferred)[0].endswith(sshcert.CERT_SUFFIX)
    plain = _lines_for(_line("", "node01", pki["host"]), "node01")
    assert known_hosts.algorithm_order(plain + ca, preferred)[0] == "ssh-ed25519"
    assert known_hosts.algorithm_order([], preferred) == preferred


def test_the_index_finds_what_testing_every_line_finds(tmp_path: Path) -> None:
    _keygen(tmp_path / "host")
    fields = [
        "node01",
        "NODE02,10.0.0.2",
        "node0?",
        "*,!node03",
        _hashed("node04"),
        "[node05]:2222",
        "!node01",
        "node01,node01",
    ]
    lines = parse("\n".join(_line("", f, tmp_path / "host") for f in fields))
    index = known_hosts.Index(lines)
    for name in ("node01", "node02", "NODE02", "10.0.0.2", "node03", "node04", "[node05]:2222"):
        assert index.applying_to(name) == [x for x in lines if x.applies_to(name)], name


def test_looking_up_a_host_does_not_test_every_line(tmp_path: Path) -> None:
    _keygen(tmp_path / "host")
    keytype, encoded = Path(f"{tmp_path / 'host'}.pub").read_text().split()[:2]
    text = "".join(
        f"10.0.{i // 250}.{i % 250},node{i:05d} {keytype} {encoded}\n" for i in range(20000)
    )
    index = known_hosts.Index(parse(text))
    started = time.perf_counter()
    for i in range(0, 20000, 20):
        assert len(index.applying_to(f"node{i:05d}")) == 1
    assert time.perf_counter() - started < 1.0  # was 23 s testing every line
