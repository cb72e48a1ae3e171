"""Connection setup without a node: identity files are checked before any connection, and the
ProxyCommand process behaves as paramiko's socket should (real subprocesses, no mocks)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ed25519, rsa

from fleet.core.errors import ConfigError
from fleet.core.hosts import Host
from fleet.ssh.classic import _Transport
from fleet.ssh.hops import parse_hop
from fleet.ssh.proxy import ProxyCommandSocket
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import (
    ConnectFailed,
    SSHTransport,
    _IdentityCache,
    _proxy_failure,
)

SECRET = "Hs1kT0pSecr3tHashValue"


def _key(path: Path, passphrase: bytes | None = None, kind: str = "ed25519") -> Path:
    """A real private key file: OpenSSH format, or traditional PEM (`rsa-pem`, and DSA, which
    fleet's SSH library does not support)."""
    private: Any
    if kind == "dsa":
        private = dsa.generate_private_key(key_size=1024)
    elif kind == "ed25519":
        private = ed25519.Ed25519PrivateKey.generate()
    else:
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = kind in ("rsa-pem", "dsa")
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    data = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL
        if pem
        else serialization.PrivateFormat.OpenSSH,
        encryption,
    )
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _transport(tmp_path: Path, config: str = "") -> SSHTransport:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(config)
    return SSHTransport(SshSettings(ssh_config=cfg))


def _hosts(key: Path | str | None, count: int = 3) -> list[Host]:
    return [
        Host(name=f"gpu{i:02d}", address=f"10.0.0.{i}", key_file=str(key) if key else None)
        for i in range(1, count + 1)
    ]


# ---------------------------------------------------------------- identity files


@pytest.mark.parametrize(
    "kind", ["ed25519", "rsa", "rsa-pem", "ed25519-encrypted", "rsa-pem-encrypted"]
)
def test_usable_keys_pass_the_check_encrypted_ones_too(tmp_path: Path, kind: str) -> None:
    encrypted = kind.endswith("-encrypted")
    key = _key(
        tmp_path / "id", b"passphrase" if encrypted else None, kind.replace("-encrypted", "")
    )
    _transport(tmp_path).check(_hosts(key))


def test_a_missing_inventory_key_is_one_line_naming_the_file_and_its_hosts(tmp_path: Path) -> None:
    """It was `ssh error: FileNotFoundError` per host, after connecting."""
    missing = tmp_path / "no-such-key"
    with pytest.raises(ConfigError) as info:
        _transport(tmp_path).check(_hosts(missing))
    assert info.value.message == f"identity file {missing} (used by gpu[01-03]): no such file"
    assert "ansible_ssh_private_key_file" in info.value.hint


def test_a_file_that_is_not_a_key_is_refused_without_echoing_it(tmp_path: Path) -> None:
    """/etc/shadow as a key was retried 6 times as "connection closed during handshake"."""
    shadow = tmp_path / "shadow"
    shadow.write_text(f"root:$y$j9T${SECRET}:19700:0:99999:7:::\n")
    with pytest.raises(ConfigError) as info:
        _transport(tmp_path).check(_hosts(shadow, 1))
    assert info.value.message == f"identity file {shadow} (used by gpu01): not a private key"
    assert SECRET not in info.value.message + info.value.hint


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI x@y\n", "is a public key"),
        (b"PuTTY-User-Key-File-3: ssh-ed25519\n", "PuTTY"),
        (b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA" + SECRET.encode() + b"\n", "damaged"),
    ],
)
def test_near_misses_say_what_they_are(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "id"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        _transport(tmp_path).check(_hosts(path, 1))
    assert problem in info.value.message
    assert SECRET not in info.value.message


def test_a_directory_or_a_key_type_fleet_cannot_use(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _transport(tmp_path).check(_hosts(tmp_path, 1))
    assert "is a directory" in info.value.message
    dsa_key = _key(tmp_path / "id_dsa", kind="dsa")
    with pytest.raises(ConfigError) as info:
        _transport(tmp_path).check(_hosts(dsa_key, 1))
    assert "type fleet cannot use" in info.value.message


def test_ssh_config_identity_files_and_jump_hosts_are_checked_too(tmp_path: Path) -> None:
    good = _key(tmp_path / "good")
    config = (
        f"Host gpu*\n    IdentityFile {good}\n    ProxyJump bastion\n"
        f"Host bastion\n    IdentityFile {tmp_path / 'bastion-key'}\n"
    )
    hosts = [Host(name="gpu01", address="gpu01"), Host(name="gpu02", address="gpu02")]
    with pytest.raises(ConfigError) as info:
        _transport(tmp_path, config).check(hosts)
    assert info.value.message == (
        f"identity file {tmp_path / 'bastion-key'} (used by bastion): no such file"
    )
    missing_for_nodes = config.replace(str(good), str(tmp_path / "gone"))
    with pytest.raises(ConfigError) as info:
        _transport(tmp_path, missing_for_nodes).check(hosts)
    assert (
        info.value.message
        == f"identity file {tmp_path / 'gone'} (used by gpu[01-02]): no such file"
    )


# ---------------------------------------------------------------- the ProxyCommand process


def test_proxy_command_is_a_socket_through_the_shell(tmp_path: Path) -> None:
    """Run the way OpenSSH runs it: `exec COMMAND` in a shell, so pipes and quotes work."""
    sock = ProxyCommandSocket("cat | cat")
    try:
        sock.settimeout(5)
        assert sock.send(b"hello\n") == 6
        got = b""
        while len(got) < 6:
            got += sock.recv(64)
        assert got == b"hello\n"
    finally:
        sock.close()
    assert sock.closed


def test_proxy_command_eof_is_an_empty_read_not_a_spin(tmp_path: Path) -> None:
    sock = ProxyCommandSocket("printf x")
    try:
        sock.settimeout(5)
        assert sock.recv(64) == b"x"
        assert sock.recv(64) == b""
    finally:
        sock.close()


def test_a_failing_proxy_command_says_why(tmp_path: Path) -> None:
    sock = ProxyCommandSocket(
        "sh -c 'echo ssh: connect to host jump port 22: Connection refused >&2; exit 255'"
    )
    sock.settimeout(5)
    assert sock.recv(64) == b""
    failed = _proxy_failure(sock)
    sock.close()
    assert failed is not None
    assert failed.reason == "proxy command failed"
    assert failed.detail == "exit status 255: ssh: connect to host jump port 22: Connection refused"
    assert failed.retryable
    missing = ProxyCommandSocket("/nonexistent/fleet-proxy %h")
    missing.settimeout(5)
    missing.recv(1)
    not_found = _proxy_failure(missing)
    missing.close()
    assert not_found is not None
    assert not not_found.retryable  # 127: the command does not exist, retrying will not help


def test_proxy_command_values_never_run_as_commands(tmp_path: Path) -> None:
    """An inventory address with shell syntax reaches the proxy as one word, never runs."""
    marker = tmp_path / "ran"
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host *\n    ProxyCommand {sys.executable} -c 'import sys; print(sys.argv[1:])' %h\n"
    )
    transport = SSHTransport(SshSettings(ssh_config=config))
    target = transport.target(Host(name="gpu01", address=f"x;touch {marker};$(touch {marker})"))
    assert target.proxy_command is not None
    sock = ProxyCommandSocket(target.proxy_command)
    sock.settimeout(10)
    out = b""
    while not out.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        out += chunk
    sock.close()
    assert out.decode().strip() == repr([f"x;touch {marker};$(touch {marker})"])
    assert not marker.exists()


def test_the_proxy_survives_a_terminal_ctrl_c(tmp_path: Path) -> None:
    """It runs in its own session: SIGINT to fleet's process group must not cut the connections
    fleet's first Ctrl-C still needs (to stop the remote commands)."""
    sock = ProxyCommandSocket("cat")
    try:
        assert os.getsid(sock.process.pid) == sock.process.pid
        assert os.getpgid(sock.process.pid) != os.getpgid(0)
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("bastion", (None, "bastion", None)),
        ("alice@bastion:2201", ("alice", "bastion", 2201)),
        ("ssh://alice@bastion:2201/", ("alice", "bastion", 2201)),
        ("[fe80::1]:2222", (None, "fe80::1", 2222)),
        ("root@fe80::1", ("root", "fe80::1", None)),
    ],
)
def test_proxyjump_hops_parse_like_openssh(spec: str, parsed: tuple[object, ...]) -> None:
    assert parse_hop(spec) == parsed


@pytest.mark.parametrize("spec", ["", "alice@", "bastion:x", "bastion:70000", "[::1]x"])
def test_bad_hops_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match=r"host|port|\]"):
        parse_hop(spec)


def test_a_damaged_known_hosts_file_is_one_error_before_connecting(tmp_path: Path) -> None:
    """paramiko's InvalidHostKey quotes the line; fleet reads the file once, before connecting,
    and says so in one error (not one per host, inside the run)."""
    known = tmp_path / "known_hosts"
    known.write_text(f"gpu01 ssh-ed25519 AAAA$$not-base64 {SECRET}\n")
    transport = _transport(tmp_path, f"Host *\n    UserKnownHostsFile {known}\n")
    with pytest.raises(ConfigError) as info:
        transport.check(_hosts(None))
    assert info.value.message == f"{known}: not a known_hosts file (a line with a damaged key)"
    assert SECRET not in info.value.message + info.value.hint


# ---------------------------------------------------------------- what each connection costs


def _refused_port() -> int:
    """A loopback port nothing listens on (connecting to it is refused at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_connect_reuses_the_target_check_resolved(tmp_path: Path) -> None:
    """check() resolves every host's ssh_config target; connect() used to resolve it again."""
    transport = _transport(tmp_path)
    host = Host(name="gpu01", address="127.0.0.1", port=_refused_port())
    transport.check([host])

    def resolve_again(*args: Any, **kw: Any) -> Any:
        raise AssertionError("the target was resolved a second time")

    transport.target = resolve_again  # type: ignore[method-assign]
    with pytest.raises(ConnectFailed) as failed:
        transport.connect(host)
    assert failed.value.reason == "connection refused"
    # Another Host object (even with the same name) is resolved anew, never given another's.
    with pytest.raises(AssertionError, match="resolved a second time"):
        transport.connect(Host(name="gpu01", address="127.0.0.1", port=host.port))


def test_a_node_that_stalls_after_its_banner_is_one_handshake_timeout_not_retried(
    tmp_path: Path,
) -> None:
    """sshd sends its banner, then never answers the key exchange (a node hung in I/O):
    paramiko gives up at its handshake timeout with a bare EOFError, which read as a handshake
    sshd dropped (MaxStartups) and was retried: 6 attempts, 100 s and more, then
    "connection closed during handshake"."""
    from fleet.ssh.transport import HANDSHAKE_S

    attempts: list[int] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        held: list[socket.socket] = []

        def serve() -> None:
            with contextlib.suppress(OSError):
                while True:
                    conn = server.accept()[0]
                    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                    held.append(conn)

        threading.Thread(target=serve, daemon=True).start()
        transport = _transport(tmp_path)
        host = Host(name="gpu01", address="127.0.0.1", port=server.getsockname()[1])
        transport.check([host])
        started = time.monotonic()
        try:
            with pytest.raises(ConnectFailed) as failed:
                transport.connect(host, on_attempt=attempts.append)
        finally:
            for conn in held:
                conn.close()
    assert (failed.value.reason, failed.value.retryable) == ("handshake timed out", False)
    assert attempts == [1]
    assert time.monotonic() - started < HANDSHAKE_S + 10


def test_ciphers_and_macs_are_paramikos_own_cheapest_first() -> None:
    """The same algorithms paramiko offers (none added, none weaker preferred): AES-GCM first
    (no MAC compared byte by byte in Python), then encrypt-then-MAC, as OpenSSH orders MACs."""
    base: Any = paramiko.Transport
    assert sorted(_Transport._preferred_ciphers) == sorted(base._preferred_ciphers)
    assert sorted(_Transport._preferred_macs) == sorted(base._preferred_macs)
    assert _Transport._preferred_ciphers[:2] == (
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
    )
    assert _Transport._preferred_ciphers[2:] == tuple(
        c for c in base._preferred_ciphers if "gcm" not in c
    )
    assert _Transport._preferred_macs[:2] == (
        "hmac-sha2-256-etm@openssh.com",
        "hmac-sha2-512-etm@openssh.com",
    )


def test_an_identity_is_loaded_once_and_a_failure_is_raised_afresh_each_time() -> None:
    cache = _IdentityCache()
    loads: list[str] = []
    key = paramiko.Ed25519Key.from_private_key(io.StringIO(_ed25519_text()))

    def good() -> paramiko.PKey:
        loads.append("good")
        return key

    def wrong_class() -> paramiko.PKey:
        loads.append("bad")
        raise paramiko.SSHException("not a valid RSA private key file")

    assert cache.key(("id", "ed25519"), good) is key
    assert cache.key(("id", "ed25519"), good) is key
    raised = []
    for _ in range(2):
        with pytest.raises(paramiko.SSHException, match="not a valid RSA") as info:
            cache.key(("id", "rsa"), wrong_class)
        raised.append(info.value)
    assert raised[0] is not raised[1]
    assert loads == ["good", "bad"]
    # Anything else is not what paramiko expects of a wrong key class: raised, not kept.
    with pytest.raises(ZeroDivisionError):
        cache.key(("id", "other"), lambda: 1 / 0)  # type: ignore[arg-type, return-value]


def _ed25519_text() -> str:
    private = ed25519.Ed25519PrivateKey.generate()
    return private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()


def test_sshds_debug_messages_are_read_only_with_debug(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """paramiko formats SSH_MSG_DEBUG byte by byte in Python for a log line nobody reads."""
    formatted: list[bytes] = []
    monkeypatch.setattr(paramiko.util, "safe_string", lambda s: formatted.append(s) or "")
    left, right = socket.socketpair()
    with left, right:
        transport = _Transport(left, lines=[])
        message = paramiko.Message()
        message.add_boolean(False)
        message.add_string(b"key options: agent-forwarding")
        message.add_string(b"")
        transport.logger.setLevel(logging.INFO)
        transport._parse_debug(paramiko.Message(message.asbytes()))
        assert formatted == []
        transport.logger.setLevel(logging.DEBUG)
        transport._parse_debug(paramiko.Message(message.asbytes()))
        assert formatted == [b"key options: agent-forwarding"]


def test_known_hosts_paths_follow_home_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ~ of known_hosts paths is expanded once per $HOME (not once per host), never once for
    good: a HOME set later is the one used."""
    config = "Host *\n    UserKnownHostsFile ~/kh\n"
    host = Host(name="gpu01", address="10.0.0.1")
    for home in ("a", "b", "a"):
        monkeypatch.setenv("HOME", str(tmp_path / home))
        target = _transport(tmp_path, config).target(host)
        assert tmp_path / home / "kh" in target.known_hosts
        other = tmp_path / ("b" if home == "a" else "a") / "kh"
        assert other not in target.known_hosts
    monkeypatch.setenv("HOME", str(tmp_path / "c"))
    assert tmp_path / "c" / ".ssh" / "known_hosts" in _transport(tmp_path).target(host).known_hosts


def test_connections_send_each_packet_at_once(tmp_path: Path) -> None:
    """Both engines dial through _open_socket: TCP_NODELAY set (without it an exec round trip
    on a node waited out the node's 40 ms delayed ACK), and the dead-peer bound kept."""
    from fleet.ssh.target import Target
    from fleet.ssh.transport import _bound_silence, _open_socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        target = Target("n", "127.0.0.1", port, "root", (), (), "strict", (), 5.0)
        sock = _open_socket(target)
        try:
            _bound_silence(sock)
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) > 0
        finally:
            sock.close()


def _reachable(root: Any, wanted: str) -> bool:
    """`wanted` (a string equal to it) is reachable from `root` through instances, containers
    and their attributes (not through classes, modules or functions: those reach everything)."""
    import gc
    import types

    skip = (type, types.ModuleType, types.FunctionType, types.FrameType, types.CodeType)
    seen: set[int] = set()
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        if isinstance(obj, str) and obj == wanted:
            return True
        todo.extend(gc.get_referents(obj))
    return False


def test_a_paramiko_connection_keeps_neither_the_key_passphrase_nor_the_identity_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keeper holds a command's connections for the window: once made, a connection must not
    keep the passphrase typed for its key (--ask-key-pass) reachable, nor the command's
    decrypted identities."""
    import subprocess

    from fleet.ssh import classic
    from fleet.ssh.target import Target

    secret = "".join(["pass", "phrase-", str(os.getpid())])  # made at run time: no constant
    key = tmp_path / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", secret, "-f", str(key)], check=True)

    def authenticated(self: Any, *args: Any, **kw: Any) -> None:
        """What paramiko's authentication leaves: the key loaded through the identity cache
        (classic._Client._key_from_filepath), under a slot that holds the passphrase."""
        passphrase = kw["passphrase"]
        slot = (str(key), paramiko.Ed25519Key, passphrase, self._cert_files)
        self._identities.key(
            slot, lambda: paramiko.Ed25519Key.from_private_key_file(str(key), passphrase)
        )

    monkeypatch.setattr(classic._Client, "connect", authenticated)
    opts = SshSettings(ssh_config=Path(os.devnull), key_passphrase=secret, engine="paramiko")
    transport = SSHTransport(opts)
    listener = socket.create_server(("127.0.0.1", 0))  # a node: the TCP connect succeeds
    target = Target(
        name="n1",
        address="127.0.0.1",
        port=listener.getsockname()[1],
        user="root",
        key_files=(str(key),),
        known_hosts=(),
        policy="strict",
        proxy_jump=(),
        connect_timeout_s=10.0,
    )
    session = transport._connect_once(target)
    try:
        assert transport.identities._keys  # the key was loaded with it
        assert not _reachable(session, secret)
        client = session.client
        assert not any(v is transport.identities for v in vars(client).values()), (
            "the connection keeps the command's identity cache"
        )
    finally:
        session.close()
        listener.close()
