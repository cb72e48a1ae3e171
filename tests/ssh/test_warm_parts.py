"""The light parts of warm connections: the socket directory's checks, the wire's values and
bounds, the peer check, and that a warm command never loads paramiko."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fleet.core.errors import ConfigError
from fleet.core.frame import Noise
from fleet.core.hosts import Host
from fleet.core.result import CommandResult
from fleet.core.shell import Cmd
from fleet.ssh import rundir, warm, wire
from fleet.ssh.failure import ConnectFailed
from fleet.ssh.settings import SshSettings
from fleet.ssh.warm import Link, WarmSession, WarmTransport


def _runtime(tmp_path: Path) -> Path:
    path = tmp_path / "xdg"
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    return path


def test_the_socket_dir_is_made_0700_under_the_users_runtime_dir(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    made = rundir.socket_dir(env={"XDG_RUNTIME_DIR": str(runtime)})
    assert made == runtime / "fleet"
    assert made.stat().st_mode & 0o777 == 0o700


def test_a_runtime_dir_not_private_is_passed_over_for_tmp(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    runtime.chmod(0o755)
    none = tmp_path / "no-run-user"
    tmp = Path(f"/tmp/fleet-{os.getuid()}")
    assert rundir.base_dir({"XDG_RUNTIME_DIR": str(runtime)}, none) == tmp
    assert rundir.base_dir({}, none) == tmp


def test_without_xdg_runtime_dir_systemds_own_for_the_uid_comes_before_tmp(
    tmp_path: Path,
) -> None:
    """sudo and cron drop XDG_RUNTIME_DIR; /run/user/UID is still the user's, and nobody else
    can make it (unlike /tmp/fleet-UID)."""
    run_user = tmp_path / "run-user"
    run_user.mkdir()
    mine = run_user / str(os.getuid())
    mine.mkdir(mode=0o700)
    mine.chmod(0o700)
    assert rundir.base_dir({}, run_user) == mine / "fleet"
    runtime = _runtime(tmp_path)  # a runtime dir named in the environment still comes first
    assert rundir.base_dir({"XDG_RUNTIME_DIR": str(runtime)}, run_user) == runtime / "fleet"
    mine.chmod(0o755)  # not private: passed over
    assert rundir.base_dir({}, run_user) == Path(f"/tmp/fleet-{os.getuid()}")


@pytest.mark.parametrize("bad", ["symlink", "mode", "file"])
def test_a_socket_dir_that_is_not_ours_alone_is_refused(tmp_path: Path, bad: str) -> None:
    runtime = _runtime(tmp_path)
    target = runtime / "fleet"
    if bad == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        target.symlink_to(tmp_path / "real")
    elif bad == "mode":
        target.mkdir()
        target.chmod(0o777)
    else:
        target.write_text("")
    with pytest.raises(ConfigError, match="refused as the warm connections' directory"):
        rundir.socket_dir(env={"XDG_RUNTIME_DIR": str(runtime)})


@pytest.mark.root
def test_a_socket_dir_owned_by_another_uid_is_refused(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    (runtime / "fleet").mkdir(mode=0o700)
    os.chown(runtime / "fleet", 4242, 4242)
    with pytest.raises(ConfigError, match="owned by uid 4242"):
        rundir.socket_dir(env={"XDG_RUNTIME_DIR": str(runtime)})


def test_values_cross_the_wire_unchanged() -> None:
    host = Host("gpu01", "10.0.0.1", 2222, "ops", "/k", ssh_options=(("proxyjump", "b"),))
    back = wire.host_from_wire(wire.host_to_wire(host))
    assert (back.name, back.address, back.port, back.user, back.key_file, back.ssh_options) == (
        "gpu01",
        "10.0.0.1",
        2222,
        "ops",
        "/k",
        (("proxyjump", "b"),),
    )
    cmd = Cmd("echo 'x'", "echo x", stdin="data\n", timeout_s=5.0, sudo=True, helper=True)
    assert wire.cmd_from_wire(wire.cmd_to_wire(cmd)) == cmd
    result = CommandResult(
        exit_code=137,
        stdout_tail=("a",),
        stderr_tail=("b",),
        duration_s=1.5,
        signal="KILL",
        stop_failed="why",
        broken="frame",
        noise=Noise(("motd",), 3),
    )
    assert wire.result_from_wire(wire.result_to_wire(result)) == result


def test_the_settings_go_without_their_secrets() -> None:
    opts = SshSettings(
        ssh_config=Path("/c"), known_hosts=(Path("/k"),), key_passphrase="s3", sudo_password="p"
    )
    sent = wire.settings_to_wire(opts)
    assert "s3" not in repr(sent)
    assert "p" not in sent.values()
    back = wire.settings_from_wire(sent, None)
    assert back.ssh_config == Path("/c")
    assert back.known_hosts == (Path("/k"),)


def test_a_message_past_the_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MESSAGE_MAX_BYTES", 1000)
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x" * 5000)
        with pytest.raises(wire.WireError):
            wire.LineReader(right).next()


def test_messages_split_across_reads_are_joined_and_eof_is_none() -> None:
    left, right = socket.socketpair()
    with right:
        reader = wire.LineReader(right)
        data = wire.encode({"op": "x", "l": "é"}) + wire.encode({"op": "y"})
        left.sendall(data[:5])
        left.sendall(data[5:])
        left.close()
        assert reader.next() == {"op": "x", "l": "é"}
        assert reader.next() == {"op": "y"}
        assert reader.next() is None


def test_the_peer_is_known_by_its_uid() -> None:
    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        assert wire.peer_uid(left) == os.getuid()
        assert wire.same_user(right)


def test_the_warm_client_never_loads_paramiko() -> None:
    code = (
        "import sys, fleet.cli.app, fleet.engine.runner, fleet.ssh.warm; "
        "print(sorted(m for m in ('paramiko', 'cryptography') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_keepers_identity_follows_every_module_and_skips_editor_files(
    tmp_path: Path,
) -> None:
    """A keeper serves only commands of the same code: a change to any module of fleet.ssh
    (native.py, sshconfig.py, ...) gives a new identity, and an editor's dangling lock file
    (.#transport.py) beside them neither breaks it nor counts."""
    for name in ("keeper.py", "native.py", "sshconfig.py"):
        (tmp_path / name).write_text("# a module\n")
    before = warm.identity(2, tmp_path)
    (tmp_path / ".#transport.py").symlink_to(tmp_path / "gone")  # what Emacs leaves
    assert warm.identity(2, tmp_path) == before
    os.utime(tmp_path / "sshconfig.py", ns=(1, 10**18))
    assert warm.identity(2, tmp_path) != before


def test_the_keepers_identity_follows_fleet_core_too(tmp_path: Path) -> None:
    """A keeper runs fleet.core's modules as well (the frame and the remote kill, a command's
    and a result's fields): a change there must not be served by an older keeper either."""
    ssh, core = tmp_path / "ssh", tmp_path / "core"
    for directory in (ssh, core):
        directory.mkdir()
        (directory / "a.py").write_text("# a module\n")
    before = warm.identity(2, ssh)
    os.utime(core / "a.py", ns=(1, 10**18))
    assert warm.identity(2, ssh) != before


def _session_against(replies: list[dict[str, Any]]) -> tuple[WarmSession, socket.socket]:
    """A WarmSession on a Link whose keeper is this test: `replies` answer its run request."""
    ours, keeper = socket.socketpair()
    session = WarmSession(Link(ours), 7, "warm")

    def answer() -> None:
        request = wire.LineReader(keeper).next()
        assert request is not None
        assert request["op"] == "run"
        for reply in replies:
            keeper.sendall(wire.encode({**reply, "id": request["id"]}))

    threading.Thread(target=answer, daemon=True).start()
    return session, keeper


def test_a_run_made_again_by_the_keeper_says_how_and_returns_its_result() -> None:
    done = wire.result_to_wire(CommandResult(exit_code=0, stdout_tail=("ok",), duration_s=0.1))
    session, keeper = _session_against(
        [{"reconnected": "stale"}, {"s": "stdout", "l": "ok"}, {"result": done}]
    )
    lines: list[tuple[str, str]] = []
    with keeper:
        result = session.run(
            Cmd("echo ok", "echo ok"), lambda s, t: lines.append((s, t)), threading.Event()
        )
        session.link.close()
    assert (result.exit_code, lines, session.connection) == (0, [("stdout", "ok")], "stale")


def test_a_reply_a_keeper_never_sends_is_named_not_a_bare_ssh_error() -> None:
    # A connect's attempts once reached a run this way, and the host ended "ssh error" with
    # nothing more said: whatever a run does not expect is named in the record.
    session, keeper = _session_against([{"attempt": 1}])
    with keeper, pytest.raises(ConnectFailed) as failed:
        session.run(Cmd("true", "true"), lambda s, t: None, threading.Event())
    session.link.close()
    assert (failed.value.reason, failed.value.detail) == (
        "ssh error",
        "unexpected reply from the keeper (attempt)",
    )


def test_a_keeper_that_stops_answering_fails_the_run_instead_of_hanging_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A keeper SIGSTOPped or wedged mid-run: the command waited for ever. Asked (`ping`) once
    it has been quiet, it says nothing: the run fails as a lost connection."""
    monkeypatch.setattr(warm, "PING_AFTER_S", 0.5)
    monkeypatch.setattr(warm, "PONG_WAIT_S", 1.0)
    session, keeper = _session_against([])  # takes the run request, then is silent for good
    with keeper, pytest.raises(ConnectFailed) as failed:
        session.run(Cmd("sleep 1d", "sleep 1d"), lambda s, t: None, threading.Event())
    session.link.close()
    assert failed.value.reason == "connection lost"
    assert "stopped answering" in failed.value.detail


def test_a_quiet_step_on_a_keeper_that_answers_its_pings_runs_to_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(warm, "PING_AFTER_S", 0.5)
    monkeypatch.setattr(warm, "PONG_WAIT_S", 1.0)
    ours, keeper = socket.socketpair()
    session = WarmSession(Link(ours), 7, "warm")
    pings = []

    def keeper_side() -> None:  # the step prints nothing for 4 s; each ping is answered
        reader = wire.LineReader(keeper)
        run = reader.next()
        assert run is not None
        end = time.monotonic() + 4
        keeper.settimeout(0.1)
        while time.monotonic() < end:
            try:
                message = reader.next()
            except TimeoutError:
                continue
            assert message is not None
            assert message["op"] == "ping"
            pings.append(message)
            keeper.sendall(wire.encode({"id": message["id"], "pong": True}))
        done = wire.result_to_wire(CommandResult(exit_code=0, duration_s=4))
        keeper.sendall(wire.encode({"id": run["id"], "result": done}))

    threading.Thread(target=keeper_side, daemon=True).start()
    with keeper:
        result = session.run(Cmd("sleep 4", "sleep 4"), lambda s, t: None, threading.Event())
        session.link.close()
    assert result.exit_code == 0
    assert pings  # it was asked, and its answers kept it


def _transport_on(link: Link, hosts: list[Host]) -> WarmTransport:
    """A WarmTransport whose one keeper link is `link`, its hosts checked (placed) as check()
    places them, without reaching a keeper."""
    transport = WarmTransport.__new__(WarmTransport)
    transport.opts = SshSettings(persist_s=60.0)
    transport.shards = 1
    transport.paths = []
    transport.links = {0: link}
    transport.placed = {id(h): (h, 0, i) for i, h in enumerate(hosts)}
    return transport


def _connect_request(transport: WarmTransport, host: Host, keeper: socket.socket) -> Any:
    """The request `transport.connect(host)` sends, answered as a keeper would."""
    seen: list[dict[str, Any]] = []

    def answer() -> None:
        request = wire.LineReader(keeper).next()
        assert request is not None
        seen.append(request)
        keeper.sendall(wire.encode({"id": request["id"], "connected": "warm", "ssh": "libssh2"}))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    session = transport.connect(host)
    thread.join()
    assert session.connection == "warm"
    return seen[0]


def test_a_checked_host_is_named_by_its_place_in_the_hello_and_another_is_sent_whole() -> None:
    ours, keeper = socket.socketpair()
    checked = [Host(name=f"gpu{i}", address=f"10.0.0.{i}") for i in (1, 2, 3)]
    transport = _transport_on(Link(ours), checked)
    with keeper:
        by_place = _connect_request(transport, checked[2], keeper)
        # An equal host, but not the object check() saw: the keeper resolves it afresh.
        whole = _connect_request(transport, Host(name="gpu3", address="10.0.0.3"), keeper)
        transport.close()
    assert {k: v for k, v in by_place.items() if k != "id"} == {"op": "connect", "h": 2}
    assert "h" not in whole
    assert whole["host"] == wire.host_to_wire(checked[2])


@pytest.mark.parametrize(
    ("cores", "given", "keepers"),
    [(1, "", 1), (2, "", 2), (6, "", 6), (64, "", 8), (64, "12", 12), (2, "0", 2)],
)
def test_one_keeper_per_core_up_to_eight_unless_told(
    monkeypatch: pytest.MonkeyPatch, cores: int, given: str, keepers: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setenv("FLEET_KEEPERS", given)
    assert warm.shard_count() == keepers


def test_a_connection_key_tells_apart_targets_that_differ_in_any_one_field(
    tmp_path: Path,
) -> None:
    """The key a held connection is found by: the same for the same target, another for a
    target that differs in any field, even where str() of the two would read alike."""
    import dataclasses

    from fleet.ssh.keeper import connection_key
    from fleet.ssh.target import Target
    from fleet.ssh.transport import SSHTransport

    transport = SSHTransport(SshSettings(ssh_config=Path(os.devnull)))
    base = Target(
        name="n1",
        address="10.0.0.1",
        port=22,
        user="root",
        key_files=(str(tmp_path / "id"),),
        known_hosts=(Path("a,b"), Path("c")),
        policy="strict",
        proxy_jump=(),
        connect_timeout_s=10.0,
    )
    changes: dict[str, Any] = {
        "name": "n2",
        "address": "10.0.0.2",
        "port": 2222,
        "user": "ops",
        "key_files": (str(tmp_path / "id2"),),
        "known_hosts": (Path("a"), Path("b,c")),  # the same text joined by commas
        "policy": "accept-new",
        "proxy_command": "nc %h %p",
        "host_key_alias": "alias",
        "bind_address": "10.0.0.9",
        "address_family": socket.AF_INET,
        "allow_agent": False,
        "identities_only": True,
        "certificate_files": (str(tmp_path / "cert"),),
        "disabled_algorithms": (("ciphers", ("aes128-ctr",)),),
        "connect_timeout_s": 5.0,
    }
    key = connection_key(transport, base)
    assert connection_key(transport, dataclasses.replace(base)) == key
    seen = {key}
    for name, value in changes.items():
        other = connection_key(transport, dataclasses.replace(base, **{name: value}))
        assert other not in seen, name
        seen.add(other)


def _hello(keeper_: Any, settings: SshSettings, hosts: list[Host], env: dict[str, str]) -> Any:
    """A keeper's client greeted by a command with `env`: the client and the keeper's reply."""
    from fleet.ssh import keeper

    ours, theirs = socket.socketpair()
    client = keeper.Client(keeper_, ours)
    hello = {
        "op": "hello",
        "id": 1,
        "settings": wire.settings_to_wire(settings),
        "persist_s": 60,
        "hosts": [wire.host_to_wire(h) for h in hosts],
        "env": env,
    }
    client.handle(hello)
    reply = wire.LineReader(theirs).next()
    ours.close()
    theirs.close()
    return client, reply


def test_a_keeper_reads_the_ssh_config_in_the_environment_of_the_command_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Include ${SITE}/config`: the keeper, started by a command of one site, serves a command
    of another site with that site's settings (here its user), never its own: the connection
    key differs, so the first site's connections are not handed to the second."""
    from fleet.ssh import keeper

    for site, user in (("a", "alice"), ("b", "bob")):
        (tmp_path / site).mkdir()
        (tmp_path / site / "config").write_text(f"Host 10.0.0.1\n    User {user}\n")
    top = tmp_path / "config"
    top.write_text("Include ${SITE}/config\n")
    monkeypatch.delenv("SITE", raising=False)  # the keeper's own environment has none
    settings = SshSettings(ssh_config=top, engine="paramiko")
    hosts = [Host(name="gpu01", address="10.0.0.1")]
    kept = keeper.Keeper(tmp_path / "k.sock")
    try:
        first, said = _hello(kept, settings, hosts, {**os.environ, "SITE": str(tmp_path / "a")})
        assert said.get("ok"), said
        second, said = _hello(kept, settings, hosts, {**os.environ, "SITE": str(tmp_path / "b")})
        assert said.get("ok"), said
    finally:
        kept.listener.close()
    assert first.transport.target_of(first.hosts[0][0]).user == "alice"
    assert second.transport.target_of(second.hosts[0][0]).user == "bob"
    assert first.hosts[0][1] != second.hosts[0][1]


def test_match_exec_and_a_proxy_command_run_in_the_environment_given(tmp_path: Path) -> None:
    """What a keeper runs for a command (a `Match exec`, a ProxyCommand) sees that command's
    environment, not the keeper's."""
    from fleet.ssh.config import read_config
    from fleet.ssh.proxy import ProxyCommandSocket
    from fleet.ssh.transport import SSHTransport

    config = tmp_path / "config"
    config.write_text('Match exec "test \\"$SITE\\" = b"\n    User bob\n')
    environ = {**os.environ, "SITE": "b"}
    transport = SSHTransport(SshSettings(ssh_config=config, environ=environ))
    assert transport.target(Host(name="gpu01", address="10.0.0.1")).user == "bob"
    assert read_config(config, environ={**os.environ, "SITE": "a"}).lookup("x").get("user") is None
    proxy = ProxyCommandSocket("sh -c 'echo \"$SITE\"'", None, environ)
    try:
        assert proxy.process.stdout is not None
        assert proxy.process.stdout.read() == b"b\n"
    finally:
        proxy.close()
