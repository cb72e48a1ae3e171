"""Warm connections (--persist) against real sshd nodes: reuse, and every safety property.

Each test gets its own XDG_RUNTIME_DIR, so its keepers have their own socket directory, and stops
them at the end even when it fails (`fleet disconnect`, then SIGTERM by pid to any left, found by
the socket path on their command line, and waits until they are gone).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, FleetResult, fleet_env, keeper_pids, poll, run_fleet
from freesubnet import on_a_free_subnet

from fleet.sandbox import Sandbox
from fleet.ssh import wire
from fleet.ssh.settings import SshSettings

pytestmark = pytest.mark.root

# /24s for a throwaway one-node sandbox (its host key is changed): far from the session's.
_THROWAWAY_SUBNETS = [f"10.{b}.79.0/24" for b in range(230, 254)]
STRANGER = ("setpriv", "--reuid=4242", "--regid=4242", "--clear-groups")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class Warm:
    """One test's warm-connection world: its runtime dir, and fleet run with persist on."""

    def __init__(self, sandbox: Any, tmp_path: Path) -> None:
        self.sandbox = sandbox
        self.tmp = tmp_path
        # Short: a unix socket's path is at most 107 bytes, and tmp_path's are long.
        self.runtime = Path(tempfile.mkdtemp(prefix="fw-", dir="/tmp"))
        self.runtime.chmod(0o700)
        self.sockets = self.runtime / "fleet"
        self.runs = 0

    def env(self, persist: str = "60") -> dict[str, str]:
        return {"XDG_RUNTIME_DIR": str(self.runtime), "FLEET_PERSIST": persist}

    def fleet(
        self, *args: str, persist: str = "60", env: dict[str, str] | None = None, **kw: Any
    ) -> FleetResult:
        self.runs += 1
        return run_fleet(
            self.sandbox,
            *args,
            log_dir=self.tmp / f"log{self.runs}",
            extra_env={**self.env(persist), **(env or {})},
            **kw,
        )

    def connections(self) -> list[dict[str, Any]]:
        result = self.fleet("connections", "--json")
        assert result.code == 0, result.stderr
        keepers: list[dict[str, Any]] = json.loads(result.stdout)
        return keepers

    def held(self) -> dict[str, dict[str, Any]]:
        """Host -> its connection, across every keeper."""
        return {c["host"]: c for k in self.connections() for c in k["connections"]}

    def stop(self) -> None:
        """Every keeper of this test gone: disconnect, then TERM by pid, waiting on each."""
        if self.sandbox is not None:
            self.fleet("disconnect", timeout_s=60)
        for pid in keeper_pids(self.runtime):
            os.kill(pid, signal.SIGTERM)
        assert poll(lambda: not any(_alive(p) for p in keeper_pids(self.runtime)), 30)
        shutil.rmtree(self.runtime, ignore_errors=True)


@pytest.fixture
def warm(sandbox: Any, tmp_path: Path) -> Iterator[Warm]:
    world = Warm(sandbox, tmp_path)
    try:
        yield world
    finally:
        world.stop()


def _connected(result: FleetResult) -> dict[str, str | None]:
    return {
        x["host"]: x["connection"] for x in result.json_lines() if x["event"] == "HostConnected"
    }


def _what_hosts_said(result: FleetResult) -> dict[str, Any]:
    """Per host: its lines on each stream and its step exit codes, and the run's exit code.

    Each stream keeps its own order; how stdout and stderr interleave is not defined
    (two streams of one SSH channel, read as they arrive), so it is not compared.
    """
    said: dict[str, Any] = {"exit": result.code}
    for x in result.json_lines():
        if x["event"] == "OutputLine":
            host = said.setdefault(x["host"], {})
            host.setdefault(x["stream"], []).append(x["line"])
        elif x["event"] == "StepFinished":
            said.setdefault(x["host"], {}).setdefault("exit", []).append(x["exit_code"])
    return said


def test_a_second_command_reuses_the_connections_with_the_same_outcome(warm: Warm) -> None:
    names = {n.name for n in warm.sandbox.nodes()}
    args = ("exec", "--json", "echo out-$(hostname); echo err >&2; exit 3")

    cold = warm.fleet(*args, persist="0")
    first = warm.fleet(*args)
    second = warm.fleet(*args)

    assert cold.code == first.code == second.code == 3
    assert _connected(cold) == dict.fromkeys(names)
    assert _connected(first) == dict.fromkeys(names, "fresh")
    assert _connected(second) == dict.fromkeys(names, "warm")
    assert _what_hosts_said(cold) == _what_hosts_said(first) == _what_hosts_said(second)
    # The run record says so too.
    record = Path(second.final()["run_dir"]) / "events.jsonl"
    recorded = [json.loads(x) for x in record.read_text().splitlines()]
    assert {x["connection"] for x in recorded if x["event"] == "HostConnected"} == {"warm"}
    keepers = warm.connections()
    assert set(warm.held()) == names
    assert {k["pid"] for k in keepers} == set(keeper_pids(warm.runtime))
    assert all(isinstance(k["cpu_s"], float) for k in keepers)


def _workers(result: FleetResult) -> list[dict[str, Any]]:
    """The run's worker processes, as its record says (summary.json)."""
    summary = json.loads((Path(result.final()["run_dir"]) / "summary.json").read_text())
    workers: list[dict[str, Any]] = summary.get("workers", [])
    return workers


def _detached_keeper(warm: Warm, pid: int, holds: int) -> None:
    """The keeper `pid` is detached like any keeper: named, a session of its own, stdio on
    /dev/null, none of the command's files (the command returned at the end of its stdout
    pipe: no keeper held it); it holds `holds` sockets (its connections and its own socket),
    and its other descriptors are /dev/null."""
    title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert title.startswith(f"fleet-keeper {warm.sockets}/"), title
    assert os.getsid(pid) == pid
    fds = {fd.name: os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
    assert [fds[n] for n in ("0", "1", "2")] == ["/dev/null"] * 3
    others = [t for n, t in fds.items() if n not in ("0", "1", "2")]
    assert all(t.startswith("socket:") or t == "/dev/null" for t in others), fds
    assert sum(t.startswith("socket:") for t in others) >= holds, fds


def test_a_first_commands_workers_become_its_keepers(warm: Warm) -> None:
    """No keeper runs and the run is split over workers (--workers 2 here; by default from 256
    hosts on two cores): the hosts are split by keeper shard; each worker connects to its share
    itself (no relay through a keeper) and then lives on as that shard's keeper."""
    names = {n.name for n in warm.sandbox.nodes()}
    env = {"FLEET_KEEPERS": "2"}
    first = warm.fleet("exec", "--json", "--workers", "2", "true", env=env)
    assert first.code == 0, first.stderr
    assert _connected(first) == dict.fromkeys(names, "fresh")
    workers = _workers(first)
    assert workers
    assert all(w["stays"] for w in workers), workers
    assert sum(w["hosts"] for w in workers) == len(names)
    keepers = {k["pid"]: k for k in warm.connections()}
    assert set(keepers) == {w["pid"] for w in workers}
    for worker in workers:
        pid = worker["pid"]
        held = {c["host"] for c in keepers[pid]["connections"]}
        assert len(held) == worker["hosts"]
        _detached_keeper(warm, pid, len(held))
    second = warm.fleet("exec", "--json", "true", env=env)
    assert _connected(second) == dict.fromkeys(names, "warm")
    assert _workers(second) == []  # through the keepers: nothing to split


def test_a_small_first_command_runs_alone_and_forks_its_keepers_at_the_end(warm: Warm) -> None:
    """No keeper runs and the run is one process's work (a few hosts): the command connects
    to every host itself, as with --persist 0 (no worker, no relay), and at its end forks one
    keeper per shard the hosts fall in, each holding its shard's connections only, detached
    like any keeper; the command's own copies are let go without a goodbye, so the second
    command finds every connection warm and working."""
    names = {n.name for n in warm.sandbox.nodes()}
    env = {"FLEET_KEEPERS": "2"}
    first = warm.fleet("exec", "--json", "true", env=env)
    assert first.code == 0, first.stderr
    assert _connected(first) == dict.fromkeys(names, "fresh")
    assert _workers(first) == []  # in the command itself
    keepers = warm.connections()
    sockets = {Path(k["socket"]).name for k in keepers}
    # One keeper per shard: keeper-<id>-<shard>.sock; with 2 shards the hosts fill both unless
    # they all hash to one (1 in 2^(N-1)): then one keeper.
    assert 1 <= len(keepers) <= 2, keepers
    assert len(sockets) == len(keepers)
    held = [c["host"] for k in keepers for c in k["connections"]]
    assert sorted(held) == sorted(names)  # each host held once, by one keeper
    for keeper in keepers:
        pid = keeper["pid"]
        assert os.getppid() != pid
        _detached_keeper(warm, pid, len(keeper["connections"]))
    second = warm.fleet("exec", "--json", "hostname", env=env)
    assert second.code == 0, second.stderr
    assert _connected(second) == dict.fromkeys(names, "warm")
    assert {x["host"]: x["line"] for x in second.json_lines() if x["event"] == "OutputLine"} == {
        n.name: n.name for n in warm.sandbox.nodes()
    }


def test_a_run_one_host_at_a_time_is_not_split_over_workers(warm: Warm) -> None:
    """--forks 1 (a rolling run): a worker per shard would each run a host at once; the run
    goes through keepers instead, one host at a time."""
    names = {n.name for n in warm.sandbox.nodes()}
    # Eight shards: the sandbox's hosts fall in more than one (all in one would be a 1 in 8^3
    # chance, and would make a one-worker split allowed).
    result = warm.fleet("exec", "--json", "-f", "1", "true", env={"FLEET_KEEPERS": "8"})
    assert result.code == 0, result.stderr
    assert _connected(result) == dict.fromkeys(names, "fresh")
    assert _workers(result) == []
    assert set(warm.held()) == names


def test_a_keeper_already_there_serves_its_hosts_and_the_others_are_started(warm: Warm) -> None:
    """Some of the hosts' keepers run (an earlier command had one host): the command goes
    through the keepers, the running one and those it starts, rather than splitting the run
    (a worker of a shard whose keeper runs would only close its connections at the end)."""
    env = {"FLEET_KEEPERS": "2"}
    names = sorted(n.name for n in warm.sandbox.nodes())
    one = warm.fleet("exec", "--json", "-l", names[0], "true", env=env)
    assert one.code == 0, one.stderr
    (kept,) = keeper_pids(warm.runtime)
    every = warm.fleet("exec", "--json", "true", env=env)
    assert every.code == 0, every.stderr
    assert _connected(every) == {n: "warm" if n == names[0] else "fresh" for n in names}
    assert _workers(every) == []
    pids = set(keeper_pids(warm.runtime))
    assert kept in pids
    assert pids == {k["pid"] for k in warm.connections()}
    assert set(warm.held()) == set(names)


def test_a_keeper_stopped_mid_run_fails_the_command_instead_of_hanging_it(warm: Warm) -> None:
    """A keeper SIGSTOPped (or wedged) while a command's step runs through it: the command
    waited for ever. It now asks the keeper after 5 s of quiet and, with no word 15 s later,
    fails the host as a lost connection (exit 4), naming the keeper and the way out."""
    node = warm.sandbox.nodes()[0]
    first = warm.fleet("exec", "-l", node.name, "true")
    assert first.code == 0, first.stderr
    (keeper,) = keeper_pids(warm.runtime)
    mark = f"sleep 120.{os.getpid()}"  # this test's alone
    env = fleet_env(warm.sandbox, warm.tmp / "stopped", **warm.env())
    args = [*FLEET, "exec", "-l", node.name, "--json", mark]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        on_node = f"pgrep -f '^{mark}' >/dev/null && echo yes || true"
        assert poll(lambda: warm.sandbox.run_on(node, on_node).stdout.strip() == "yes", 30)
        os.kill(keeper, signal.SIGSTOP)
        out, err = proc.communicate(timeout=90)
    finally:
        os.kill(keeper, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        warm.sandbox.run_on(node, f"pkill -KILL -f '^{mark}'; true")
    assert proc.returncode == 4, err
    host = FleetResult(proc.returncode, out.decode(), err.decode()).final()["hosts"][node.name]
    assert host["outcome"] == "unreachable", host
    assert "stopped answering" in json.dumps(host), host


def test_the_window_ends_and_the_keepers_exit(warm: Warm) -> None:
    # A window long enough for the keepers to be seen before it ends on a loaded machine.
    result = warm.fleet("exec", "--json", "true", "--persist", "10")
    assert result.code == 0
    assert set(_connected(result).values()) == {"fresh"}
    pids = keeper_pids(warm.runtime)
    assert pids  # kept for the window...
    # ...then closed, the keepers gone and their sockets removed.
    assert poll(lambda: not any(_alive(p) for p in pids), timeout_s=60)
    assert list(warm.sockets.glob("*.sock")) == []


def test_a_keeper_started_early_and_not_needed_goes_away(warm: Warm) -> None:
    """A command starts its keepers (one per shard) before it knows its hosts; one host needs
    one of them, and the other, given nothing, exits instead of waiting out a grace period."""
    node = warm.sandbox.nodes()[0]
    result = warm.fleet("exec", "--json", "-l", node.name, "true", env={"FLEET_KEEPERS": "4"})
    assert result.code == 0, result.stderr
    assert poll(lambda: len(keeper_pids(warm.runtime)) == 1, timeout_s=30)
    assert set(warm.held()) == {node.name}


def test_disconnect_ends_them_at_once(warm: Warm) -> None:
    names = {n.name for n in warm.sandbox.nodes()}
    assert warm.fleet("exec", "--json", "true").code == 0
    pids = keeper_pids(warm.runtime)
    one = sorted(names)[0]

    some = warm.fleet("disconnect", "-l", one)
    assert some.code == 0, some.stderr
    assert set(warm.held()) == names - {one}

    every = warm.fleet("disconnect")
    assert every.code == 0, every.stderr
    assert not any(_alive(p) for p in pids)  # no polling: they are gone when it returns
    assert list(warm.sockets.glob("*.sock")) == []
    assert set(_connected(warm.fleet("exec", "--json", "true")).values()) == {"fresh"}


def _session_pid_of(sandbox: Any, node: Any, keeper_pids: list[int]) -> int:
    """The node-side sshd process serving a keeper's connection to `node`, by the keeper's
    local port (ss on both ends)."""
    mine = subprocess.run(
        ["ss", "-Htnp", "state", "established", f"( dst {node.address} and dport = :22 )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    ports = [
        line.split()[2].rsplit(":", 1)[1]
        for line in mine
        if any(f"pid={p}," in line for p in keeper_pids)
    ]
    assert len(ports) == 1, mine
    theirs = sandbox.run_on(node, "ss -Htnp state established '( sport = :22 )'").stdout
    for line in theirs.splitlines():
        if line.split()[3].endswith(f":{ports[0]}"):
            return int(line.split("pid=", 1)[1].split(",", 1)[0])
    raise AssertionError(theirs)


def test_a_node_that_dropped_the_connection_gets_a_fresh_one(warm: Warm) -> None:
    node = warm.sandbox.nodes()[1]
    args = ("exec", "--json", "echo ok")
    assert warm.fleet(*args).code == 0
    pid = _session_pid_of(warm.sandbox, node, keeper_pids(warm.runtime))
    warm.sandbox.run_on(node, f"kill -KILL {pid}")

    again = warm.fleet(*args)
    assert again.code == 0, again.stdout
    assert _connected(again)[node.name] in ("fresh", "stale")
    assert _what_hosts_said(again)[node.name] == {"stdout": ["ok"], "exit": [0]}


def _throwaway(make_sandbox: Callable[[str], Sandbox], count: int = 1) -> Sandbox:
    """A sandbox of its own (downed by the fixture), on the first free candidate subnet."""

    def up(subnet: str) -> Sandbox:
        box = make_sandbox(subnet)
        box.up(count)
        return box

    return on_a_free_subnet(_THROWAWAY_SUBNETS, up)[0]


def _unacked_to(address: str) -> int:
    """Bytes this machine's connections to `address`:22 have sent and not had acknowledged."""
    out = subprocess.run(
        ["ss", "-Htn", "state", "established", "dst", address, "dport", "=", ":22"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert rows, f"no connection to {address}:22 held"
    return sum(int(row[1]) for row in rows)


@pytest.mark.parametrize("engine", ["auto", "paramiko"])
def test_a_node_that_rebooted_behind_a_warm_connection_gets_a_fresh_one(
    make_sandbox: Callable[[str], Sandbox], tmp_path: Path, engine: str
) -> None:
    # A reboot, as a wedged GPU node gets one: the node goes silent (its link down first, so no
    # FIN or RST gets out), its whole PID namespace dies, and it comes back at the same address
    # with the same host key and no TCP state. The held connection looks alive until its first
    # packet meets the new kernel's reset: the step must run on a fresh connection, once.
    box = _throwaway(make_sandbox, 2)
    world = Warm(box, tmp_path)
    try:
        victim, other = box.nodes()
        marker = f"/tmp/rebooted-{os.getpid()}"
        step = f"echo ran >> {marker}; cat {marker}"
        assert world.fleet("exec", "--json", "--ssh-engine", engine, "true").code == 0
        # Nothing of the keeper's left unacknowledged: else its retransmission meets the new
        # kernel's reset before the next command, and the keeper sees the death up front.
        assert poll(lambda: _unacked_to(victim.address) == 0, 15)
        box.run_on(victim, "ip link set eth0 down")
        os.kill(victim.pid1, signal.SIGKILL)
        assert poll(lambda: not _alive(victim.pid1), 15)
        box.up(2)
        assert box.nodes()[0].pid1 != victim.pid1, "the node did not come back"

        again = world.fleet("exec", "--json", "--ssh-engine", engine, step)
        assert again.code == 0, again.stdout + again.stderr
        said = _what_hosts_said(again)
        assert said[victim.name] == {"stdout": ["ran"], "exit": [0]}  # ran once, not twice
        # The record says what happened: handed out warm, then made again.
        how = [
            x["connection"]
            for x in again.json_lines()
            if x["event"] == "HostConnected" and x["host"] == victim.name
        ]
        assert how == ["warm", "stale"], how
        assert _connected(again)[other.name] == "warm"
        libraries = {x["ssh"] for x in again.json_lines() if x["event"] == "HostConnected"}
        assert libraries == {"libssh2" if engine == "auto" else "paramiko"}
    finally:
        world.stop()


def test_a_changed_host_key_is_refused_when_the_connection_is_made_again(
    make_sandbox: Callable[[str], Sandbox], tmp_path: Path
) -> None:
    box = _throwaway(make_sandbox)
    world = Warm(box, tmp_path)
    try:
        node = box.nodes()[0]
        assert world.fleet("exec", "--json", "true").code == 0
        key = node.node_dir / "ssh_host_ed25519_key"
        key.unlink()
        key.with_suffix(".pub").unlink()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        box.stop_sshd(node)
        box.start_sshd(node)
        # The warm connection still works (its key was checked when it was made)...
        assert _connected(world.fleet("exec", "--json", "true")) == {node.name: "warm"}
        # ...until it dies: the connection made again meets the new key and is refused.
        pid = _session_pid_of(box, node, keeper_pids(world.runtime))
        box.run_on(node, f"kill -KILL {pid}")

        warm_again = world.fleet("exec", "--json", "true")
        cold = world.fleet("exec", "--json", "true", persist="0")
        assert warm_again.code == cold.code == 4
        for result in (warm_again, cold):
            assert result.final()["hosts"][node.name]["reason"] == "host key changed"
    finally:
        world.stop()


STRANGER_CLIENT = textwrap.dedent(
    """
    import json, socket, sys
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(sys.argv[1])
    except OSError as exc:
        print("connect:", type(exc).__name__)
        raise SystemExit(0)
    host = {"name": sys.argv[2], "address": sys.argv[3], "port": None, "user": None,
            "key_file": None, "ssh_options": []}
    cmd = {"command": "touch /tmp/stranger-was-here", "display": "x"}
    settings = json.loads(sys.argv[4])
    for m in ({"op": "hello", "id": 1, "settings": settings, "hosts": [host]},
              {"op": "connect", "id": 2, "host": host},
              {"op": "run", "id": 3, "session": 2, "cmd": cmd}):
        try:
            sock.sendall(json.dumps(m).encode() + b"\\n")
        except OSError as exc:
            print("send:", type(exc).__name__)
            break
    sock.settimeout(20)
    got = b""
    try:
        while b'"result"' not in got:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        print("got:", repr(got))
    except OSError as exc:
        print("recv:", type(exc).__name__, repr(got))
    """
)


def test_another_uid_can_not_use_the_keepers(warm: Warm) -> None:
    node = warm.sandbox.nodes()[0]
    assert warm.fleet("exec", "--json", "-l", node.name, "true").code == 0
    # The keeper holding the node's connection (another, started for hosts this command did
    # not have, may not have exited yet).
    [sock] = [
        Path(k["socket"])
        for k in warm.connections()
        if any(c["host"] == node.name for c in k["connections"])
    ]
    stranger = [*STRANGER, "/usr/bin/python3", "-c", STRANGER_CLIENT]
    settings = wire.settings_to_wire(SshSettings(ssh_config=warm.sandbox.ssh_config_path))
    args = [str(sock), node.name, node.address, json.dumps(settings)]

    # The directory keeps another uid out...
    denied = subprocess.run([*stranger, *args], capture_output=True, text=True, check=True)
    assert denied.stdout.strip() == "connect: PermissionError"
    # ...and were its modes loosened, the keeper drops the stranger without a word.
    warm.runtime.chmod(0o711)
    warm.sockets.chmod(0o711)
    sock.chmod(0o666)
    try:
        dropped = subprocess.run([*stranger, *args], capture_output=True, text=True, check=True)
    finally:
        sock.chmod(0o600)
        warm.sockets.chmod(0o700)
        warm.runtime.chmod(0o700)
    assert dropped.stdout.strip() in ("got: b''", "recv: ConnectionResetError b''") or (
        dropped.stdout.startswith("send:")
    ), dropped.stdout
    probe = warm.sandbox.run_on(node, "test -e /tmp/stranger-was-here && echo RAN || echo no")
    assert probe.stdout.strip() == "no"
    assert warm.held()[node.name]["in_use"] == 0  # the keeper serves its own user still


def _start(warm: Warm, *args: str) -> subprocess.Popen[str]:
    env = fleet_env(warm.sandbox, warm.tmp / "bg", **warm.env())
    return subprocess.Popen(
        [*FLEET, *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_a_warm_command_interrupted_or_killed_stops_on_the_node(
    warm: Warm, how: signal.Signals
) -> None:
    node = warm.sandbox.nodes()[2]
    marker = f"sleep 31{int(how)}"
    assert warm.fleet("exec", "--json", "-l", node.name, "true").code == 0  # warm it

    client = _start(warm, "exec", "--plain", "-l", node.name, marker)
    try:
        looking = f"pgrep -f '{marker[:-1]}[{marker[-1]}]' || true"

        def running() -> str:
            return str(warm.sandbox.run_on(node, looking).stdout.strip())

        assert poll(running, 60)
        client.send_signal(how)
        out, _ = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
    if how == signal.SIGINT:
        assert client.returncode == 130
        assert "cancelled; remote command stopped" in out
    assert poll(lambda: not running(), 60)


@pytest.mark.parametrize("bad", ["symlink", "mode", "owner"])
def test_a_socket_directory_not_ours_alone_is_refused_and_the_command_runs_cold(
    sandbox: Any, tmp_path: Path, bad: str
) -> None:
    world = Warm(sandbox, tmp_path)
    if bad == "symlink":
        real = tmp_path / "elsewhere"
        real.mkdir(mode=0o700)
        world.sockets.symlink_to(real)
    else:
        world.sockets.mkdir(mode=0o700)
        if bad == "mode":
            world.sockets.chmod(0o777)
        else:
            os.chown(world.sockets, 4242, 4242)
    before = os.lstat(world.sockets)
    try:
        # Anyone can make /tmp/fleet-UID first: that costs the warm connections, said, never
        # the command; the directory is left as it was (refused, never repaired or used).
        result = world.fleet("exec", "--json", "true")
        assert result.code == 0, result.stderr
        assert "no warm connections for this command" in result.stderr
        assert "refused as the warm connections' directory" in result.stderr
        assert set(_connected(result).values()) == {None}  # as with --persist 0: no keeper
        assert keeper_pids(world.runtime) == []
        after = os.lstat(world.sockets)
        assert (after.st_mode, after.st_uid, after.st_ino) == (
            before.st_mode,
            before.st_uid,
            before.st_ino,
        )
        if bad != "symlink":
            assert list(world.sockets.iterdir()) == []
        # The verbs about the keepers themselves say it as an error.
        listed = world.fleet("connections")
        assert listed.code == 1
        assert "refused as the warm connections' directory" in listed.stderr
    finally:
        world.sandbox = None
        world.stop()


def _together(warm: Warm, *args: str, count: int = 3) -> list[str]:
    """`count` fleet commands started at once, each waited for (killed past 120 s); each must
    exit 0. Their stdouts."""
    clients = [_start(warm, *args) for _ in range(count)]
    try:
        outs = [c.communicate(timeout=120)[0] for c in clients]
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
                c.communicate()
    assert [c.returncode for c in clients] == [0] * count
    return outs


def test_commands_started_together_share_the_keepers(warm: Warm) -> None:
    names = {n.name for n in warm.sandbox.nodes()}
    outs = _together(warm, "exec", "--json", "echo same")
    for out in outs:
        lines = [json.loads(x) for x in out.splitlines()]
        said = {x["host"] for x in lines if x["event"] == "OutputLine" and x["line"] == "same"}
        assert said == names
    # One keeper per socket (none started twice), holding one connection per host.
    sockets = list(warm.sockets.glob("*.sock"))
    assert len(keeper_pids(warm.runtime)) == len(sockets) >= 1
    assert set(warm.held()) == names
    assert set(_connected(warm.fleet("exec", "--json", "true")).values()) == {"warm"}


def test_keepers_forked_by_first_commands_started_together_answer_the_next(warm: Warm) -> None:
    """Round after round, three first commands at once: each runs alone and forks its keepers
    at its end, one per shard wins, and the next command is served warm, promptly. A keeper
    forked while a finished thread of the command was still exiting inherited OpenSSL's lock
    held and hung the next command on its first channel (1 round in ~20 before the fix)."""
    names = {n.name for n in warm.sandbox.nodes()}
    for _ in range(12):
        assert warm.fleet("disconnect", timeout_s=60).code == 0
        _together(warm, "exec", "--json", "true")
        after = warm.fleet("exec", "--json", "true", timeout_s=60)
        assert after.code == 0, after.stderr
        assert _connected(after) == dict.fromkeys(names, "warm")


def test_a_flood_through_a_warm_connection_keeps_the_command_bounded(
    warm: Warm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keeper's output reaches the command no faster than the engine takes it (the node is
    held back, as by a cold connection's SSH window), not piled up in the command's memory."""
    from test_floods import FLOOD, HEADROOM_MIB, _peak_rss_mib

    for name, value in warm.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FLEET_TEST_PERSIST", "60")
    code, idle = _peak_rss_mib(warm.sandbox, warm.tmp / "idle", "exec", "true", "--plain")
    assert code == 0
    code, flooded = _peak_rss_mib(warm.sandbox, warm.tmp / "flood", "exec", FLOOD, "--plain")
    assert code == 0
    assert _connected_in(warm.tmp / "flood") == {"warm"}
    assert flooded < idle + HEADROOM_MIB, f"peak RSS {flooded:.0f} MiB, idle run {idle:.0f} MiB"


def _connected_in(log_dir: Path) -> set[str | None]:
    (record,) = log_dir.iterdir()
    events = [json.loads(x) for x in (record / "events.jsonl").read_text().splitlines()]
    return {x["connection"] for x in events if x["event"] == "HostConnected"}


def test_a_keeper_whose_socket_is_removed_closes_and_exits(warm: Warm) -> None:
    assert warm.fleet("exec", "--json", "true").code == 0
    pids = keeper_pids(warm.runtime)
    for sock in warm.sockets.glob("*.sock"):
        sock.unlink()  # nobody can reach its connections any more: it must not keep them
    assert poll(lambda: not any(_alive(p) for p in pids), timeout_s=30)
    assert set(_connected(warm.fleet("exec", "--json", "true")).values()) == {"fresh"}


def test_a_libssh2_connection_closed_under_a_running_command_ends_it_cleanly(warm: Warm) -> None:
    """A libssh2 session is not thread-safe: `fleet disconnect` closes one that a command is
    using from another thread of the keeper. The command's host ends as a lost connection,
    the keeper goes on (no crash: it is asked again afterwards), and a second command meanwhile
    got a connection of its own rather than sharing the busy one."""
    node = warm.sandbox.nodes()[3]
    marker = "sleep 45.678"
    first = warm.fleet("exec", "--json", "-l", node.name, "true")
    assert first.code == 0, first.stdout + first.stderr
    assert {x.get("ssh") for x in first.json_lines() if x["event"] == "HostConnected"} == {
        "libssh2"
    }

    client = _start(warm, "exec", "--json", "-l", node.name, marker)
    try:
        assert poll(lambda: warm.sandbox.run_on(node, f"pgrep -f '{marker}'").returncode == 0, 60)
        meanwhile = warm.fleet("exec", "--json", "-l", node.name, "echo meanwhile")
        assert meanwhile.code == 0, meanwhile.stdout + meanwhile.stderr
        assert _connected(meanwhile)[node.name] == "fresh"  # not the busy one
        assert warm.fleet("disconnect").code == 0
        out, _ = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
    assert client.returncode == 4, out
    finished = [json.loads(x) for x in out.splitlines() if '"RunFinished"' in x]
    assert finished[0]["hosts"][node.name]["reason"] == "connection lost", out
    after = warm.fleet("exec", "--json", "-l", node.name, "true")
    assert after.code == 0, after.stdout + after.stderr
    warm.sandbox.run_on(node, f"pkill -f '{marker}' || true")
