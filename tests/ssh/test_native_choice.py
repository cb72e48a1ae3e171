"""Which hosts the libssh2 engine takes (fleet/ssh/native.py): a pure decision on the resolved
target, before any connection. Everything it does not take goes to paramiko's path; the
end-to-end tests (tests/e2e/test_native.py) check the hand-over against real nodes."""

from __future__ import annotations

import dataclasses
import os
import resource
import select
import socket
from pathlib import Path

import pytest

from fleet.ssh.known_hosts import ALGORITHMS
from fleet.ssh.native import KEX, NativeTransport, _readable
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import Target


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
    return path


@pytest.fixture
def transport() -> NativeTransport:
    return NativeTransport(SshSettings(ssh_config=Path("/dev/null")))


def _target(key: Path, **changes: object) -> Target:
    base = Target(
        name="gpu01",
        address="10.0.0.1",
        port=22,
        user="root",
        key_files=(str(key),),
        known_hosts=(),
        policy="strict",
        proxy_jump=(),
        connect_timeout_s=10,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_a_direct_host_with_a_readable_key_is_libssh2s(
    transport: NativeTransport, key: Path
) -> None:
    assert transport._unsuited(_target(key)) is None


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"proxy_jump": ("bastion",)}, "proxy"),
        ({"proxy_command": "nc %h %p"}, "proxy"),
        ({"certificate_files": ("/k-cert.pub",)}, "certificate"),
        ({"disabled_algorithms": (("ciphers", ("aes128-ctr",)),)}, "algorithms"),
        ({"key_files": ()}, "no key file"),
        ({"key_files": ("/nonexistent/id_ed25519",)}, "no key file"),
    ],
)
def test_what_libssh2_cannot_do_the_same_way_is_paramikos(
    transport: NativeTransport, key: Path, changes: dict[str, object], why: str
) -> None:
    assert transport._unsuited(_target(key, **changes)) == why


def test_only_plain_host_key_algorithms_and_the_terrapin_guard_are_offered() -> None:
    offered = [a for algorithms in ALGORITHMS.values() for a in algorithms]
    assert not [a for a in offered if "cert" in a]
    assert "ssh-rsa" not in offered  # RSA keys are asked to sign with SHA-2
    kex = KEX.split(",")
    assert "kex-strict-c-v00@openssh.com" in kex
    assert not [a for a in kex if a.endswith("sha1")]


def test_socket_waits_work_past_selects_1024_descriptors() -> None:
    """A keeper holding a thousand connections has descriptors past select()'s FD_SETSIZE;
    select() raises on them ("filedescriptor out of range"), poll() does not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    spare: list[int] = []
    try:
        while not spare or spare[-1] < 1100:
            spare.append(os.open("/dev/null", os.O_RDONLY))
        ours, theirs = socket.socketpair()
        with ours, theirs:
            assert ours.fileno() > 1024
            with pytest.raises(ValueError, match="out of range"):
                select.select([ours], [], [], 0)
            assert not _readable(ours, 0)
            theirs.sendall(b"x")
            assert _readable(ours, 1.0)
    finally:
        for fd in spare:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
