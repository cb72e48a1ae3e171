"""What each connection costs the bastion, against real sshd nodes (fleet.ssh in-process): the
cipher negotiated, identity files read once per run, and no busy loop while a step ends.
Counts, not timings: the time itself is measured in bench/."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import paramiko
import pytest

from fleet.core.hosts import Host
from fleet.core.shell import Cmd, wrap
from fleet.sandbox import Sandbox
from fleet.ssh import transport as fleet_ssh
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import SSHSession, SSHTransport

pytestmark = pytest.mark.root

TRUE = Cmd(command=wrap("true", sudo=False, timeout_s=None, script=False), display="true")


def _hosts(box: Sandbox) -> list[Host]:
    return [Host(name=node.name, address=node.name) for node in box.nodes()]


def _transport(config: Path, hosts: list[Host]) -> SSHTransport:
    transport = SSHTransport(SshSettings(ssh_config=config))
    transport.check(hosts)
    return transport


def _run_true(session: SSHSession) -> int | None:
    return session.run(TRUE, lambda stream, line: None, threading.Event()).exit_code


def _negotiated(config: Path, host: Host) -> tuple[str, str]:
    session = _transport(config, [host]).connect(host)
    try:
        assert _run_true(session) == 0
        link: Any = session.client.get_transport()
        return link.remote_cipher, link.remote_mac
    finally:
        session.close()


def test_aes_gcm_by_default_and_the_configs_ciphers_still_rule(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    host = _hosts(sandbox)[0]
    assert _negotiated(sandbox.ssh_config_path, host)[0] == "aes128-gcm@openssh.com"
    restricted = tmp_path / "ssh_config"
    restricted.write_text(
        f"Host *\n    Ciphers aes256-ctr\n\n{sandbox.ssh_config_path.read_text()}"
    )
    assert _negotiated(restricted, host) == ("aes256-ctr", "hmac-sha2-256-etm@openssh.com")


def test_the_identity_file_is_read_once_for_all_hosts(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """paramiko read and parsed it per connection, once per key class it tried."""
    reads: list[tuple[str, str]] = []
    original = paramiko.PKey.from_private_key_file.__func__  # type: ignore[attr-defined]

    def counted(cls: Any, filename: str, password: Any = None) -> Any:
        reads.append((filename, cls.__name__))
        return original(cls, filename, password)

    monkeypatch.setattr(paramiko.PKey, "from_private_key_file", classmethod(counted))
    hosts = _hosts(sandbox)
    assert len(hosts) >= 3
    transport = _transport(sandbox.ssh_config_path, hosts)
    sessions = [transport.connect(host) for host in hosts]
    try:
        assert [_run_true(s) for s in sessions] == [0] * len(hosts)
    finally:
        for session in sessions:
            session.close()
    # Each key class paramiko tries (RSA and ECDSA fail on an Ed25519 key), once per run.
    assert len(reads) == len(set(reads)) <= 3
    assert "Ed25519Key" in {kind for _, kind in reads}


def test_a_channel_at_eof_is_waited_on_not_spun_on(sandbox: Sandbox) -> None:
    """After EOF paramiko keeps the channel's fd readable for good: select() returned at once
    until the exit status came. Here the command closes its output, then runs on for a second:
    the waits in that second are a handful of POLL_S timeouts, not thousands of turns."""
    host = _hosts(sandbox)[0]
    session = _transport(sandbox.ssh_config_path, [host]).connect(host)
    try:
        link = session.client.get_transport()
        assert link is not None
        channel = link.open_session()
        channel.exec_command("exec >/dev/null 2>&1 </dev/null; exec 1>&- 2>&-; sleep 1")
        deadline = time.monotonic() + 30
        while not channel.eof_received and time.monotonic() < deadline:
            fleet_ssh._wait_for_news(channel)
        assert channel.eof_received
        turns = 0
        waited_from = time.monotonic()
        while not channel.exit_status_ready() and time.monotonic() < deadline:
            fleet_ssh._wait_for_news(channel)
            turns += 1
        waited_s = time.monotonic() - waited_from
        assert channel.recv_exit_status() == 0
        # One turn per POLL_S of waiting, however long a loaded machine made the wait (a spin
        # takes thousands of turns in the same time).
        assert turns <= waited_s / fleet_ssh.POLL_S + 3
    finally:
        session.close()
