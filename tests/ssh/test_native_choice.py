"""Which hosts the libssh2 engine takes (fleet/ssh/native.py): a pure decision on the resolved
target, before any connection. Everything it does not take goes to paramiko's path; the
end-to-end tests (tests/e2e/test_native.py) check the hand-over against real nodes."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import select
import socket
import threading
import time
from pathlib import Path

import pytest
from keyfile import write_ed25519
from ssh2.exceptions import SSH2Error
from ssh2.session import Session as L2Session

from fleet.core.hosts import Host
from fleet.core.shell import Cmd
from fleet.ssh.known_hosts import ALGORITHMS
from fleet.ssh.native import (
    _IO,
    KEX,
    NativeSession,
    NativeTransport,
    _readable,
    _send_keepalive,
)
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import SSHTransport, Target


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


def test_the_engine_counts_the_hosts_paramiko_will_take_before_connecting(
    tmp_path: Path, key: Path
) -> None:
    """What sizes the run's worker processes (a paramiko host costs ~4x the CPU): the hosts a
    ProxyJump reaches go to paramiko, the direct ones to libssh2; with paramiko alone, all."""
    write_ed25519(key)
    config = tmp_path / "ssh_config"
    config.write_text("Host far*\n    ProxyJump bastion\n")
    settings = SshSettings(ssh_config=config)
    hosts = [
        Host(name=n, address=n, port=22, user="root", key_file=str(key))
        for n in ("near1", "near2", "far1", "far2", "far3")
    ]
    native = NativeTransport(settings)
    native.check(hosts)
    assert native.paramiko_hosts(hosts) == 3
    assert SSHTransport(settings).paramiko_hosts(hosts) == 5


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


def test_a_key_with_a_certificate_beside_it_is_paramikos(
    transport: NativeTransport, key: Path
) -> None:
    """OpenSSH and paramiko present KEY-cert.pub with the key; libssh2 would send the bare key."""
    Path(f"{key}-cert.pub").write_text("ssh-ed25519-cert-v01@openssh.com AAAA\n")
    assert transport._unsuited(_target(key)) == "certificate"


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


# ----------------------------------------------------------------- a session's own machinery
# On a real libssh2 session over a socketpair whose other end says nothing (no SSH server
# needed): what fleet relies on of libssh2's blocking calls, and how a session is let go.


def _session(ours: socket.socket) -> NativeSession:
    target = _target(Path("/nonexistent"))
    return NativeSession(L2Session(), ours, target, b"")


def test_a_blocking_call_keeps_its_whole_deadline_after_a_keepalive_was_sent() -> None:
    """libssh2 waits no longer than its keepalive interval in a blocking call: left on, every
    deadline ended after 2 s of silence. The interval is on only around a keepalive's send."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        session = L2Session()
        io = _IO(session, ours)
        with contextlib.suppress(SSH2Error):  # no handshake yet: the send itself may fail
            _send_keepalive(session)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            io.until(lambda: session.handshake(ours), started + 4.0)
        assert time.monotonic() - started >= 3.5


def test_close_from_another_thread_never_waits_and_the_runner_frees_the_session() -> None:
    ours, theirs = socket.socketpair()
    with theirs:
        native = _session(ours)
        running, closed, left = threading.Event(), threading.Event(), threading.Event()

        def command() -> None:  # what run() does around a command, holding the session
            native.lock.acquire()
            running.set()
            closed.wait(10)
            native._leave()
            left.set()

        worker = threading.Thread(target=command)
        worker.start()
        assert running.wait(10)
        native.close()  # returns at once (it used to wait for the command)
        assert native.session is not None  # not freed under the running command
        assert theirs.recv(16) == b""  # but its socket is shut down: the command fails now
        assert not native.alive()
        closed.set()
        assert left.wait(10)
        worker.join(10)
        assert native.session is None  # the command's thread freed it on its way out
        assert ours.fileno() == -1


def test_a_kill_that_cannot_open_its_channel_is_not_a_closed_connection() -> None:
    """A connection that dies between a step and its kill: the kill is "not sent", never the
    CLOSED_BEFORE that lets a keeper run the step again on a fresh connection."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        native = _session(ours)
        theirs.close()
        stop = native._stop_remote(4242, Cmd(command="sleep 9", display="sleep 9"), None)
        assert not stop.delivered
        assert stop.error is not None
        assert "could not be sent" in stop.error
