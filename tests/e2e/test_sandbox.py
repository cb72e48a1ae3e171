"""The sandbox is a real fleet: real sshd, strict host keys, isolated processes and files.

Every probe here targets only sandbox addresses while the sandbox is up, and TCP probes are
bound to the sandbox bridge, so no test traffic can leave the machine.
"""

from __future__ import annotations

import collections
import concurrent.futures
import ipaddress
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from fleetrun import FLEET
from freesubnet import on_a_free_subnet

from fleet.sandbox import (
    DEFAULT_MAX_STARTUPS,
    Sandbox,
    SandboxError,
    SandboxNode,
    node_address,
    node_names,
    parse_subnet,
    preflight,
)
from fleet.sandbox.network import node_mac
from fleet.sandbox.state import Layout, NodeRecord, SandboxState, StateFile

SESSION_NODES = 4  # what the `sandbox` fixture in conftest.py starts

cluster = pytest.mark.root


# ----------------------------------------------------------------------------- helpers


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll to a deadline instead of sleeping a fixed time."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def tcp_state(sb: Sandbox, address: str, port: int = 22) -> str:
    """'open', 'refused' or another error name; bound to the sandbox bridge."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(3)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, sb.bridge.encode())
        try:
            sock.connect((address, port))
        except ConnectionRefusedError:
            return "refused"
        except OSError as exc:
            return type(exc).__name__
        return "open"


def ssh(sb: Sandbox, target: str, command: str, *opts: str) -> subprocess.CompletedProcess[str]:
    """Real OpenSSH client with the sandbox's ssh_config (strict host key checking)."""
    return subprocess.run(
        ["ssh", "-F", str(sb.ssh_config_path), *opts, target, command],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def proc_alive(pid: int) -> bool:
    """True if pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def host_pids_matching(token: str) -> list[int]:
    """Host pids whose command line contains token (the host sees every node's processes)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and proc_alive(int(entry)):
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline and b"pgrep" not in cmdline:
                found.append(int(entry))
    return found


def node(sb: Sandbox, name: str) -> SandboxNode:
    """A session node by name."""
    return next(n for n in sb.nodes() if n.name == name)


# /24s for a second sandbox; one that overlaps a running sandbox (the session's, another test
# session's, a benchmark's) is refused as "already in use" and the next is tried.
# FLEET_TEST_EXTRA_SUBNETS (comma-separated) names the candidates instead.
EXTRA_SUBNETS = [s for s in os.environ.get("FLEET_TEST_EXTRA_SUBNETS", "").split(",") if s] or [
    f"10.{b}.78.0/24" for b in range(230, 254)
]


def up_on_a_free_subnet(
    make_sandbox: Callable[[str], Sandbox], count: int
) -> tuple[Sandbox, list[SandboxNode]]:
    """A sandbox of its own (downed by the fixture) on the first free candidate subnet."""

    def up(subnet: str) -> tuple[Sandbox, list[SandboxNode]]:
        sb = make_sandbox(subnet)
        return sb, sb.up(count)

    return on_a_free_subnet(EXTRA_SUBNETS, up)[0]


def fleet_sandbox(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real `fleet sandbox ...` command line."""
    return subprocess.run(
        [*FLEET, "sandbox", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


# ----------------------------------------------------------------------------- pure logic


def test_addresses_follow_the_documented_scheme() -> None:
    net = parse_subnet("10.251.0.0/16")
    assert str(node_address(net, 0)) == "10.251.0.10"
    assert str(node_address(net, 239)) == "10.251.0.249"
    assert str(node_address(net, 240)) == "10.251.1.10"
    assert node_names(3, "node") == ["node01", "node02", "node03"]
    assert node_names(100, "gpu")[-1] == "gpu100"


@pytest.mark.parametrize("subnet", ["8.8.8.0/24", "10.0.0.0/25", "10.251.0.1/16", "nonsense"])
def test_bad_subnets_are_refused(subnet: str) -> None:
    with pytest.raises(SandboxError, match="subnet"):
        parse_subnet(subnet)


def test_preflight_refuses_non_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxError, match="needs root") as info:
        preflight()
    assert info.value.hint


def fake_state(count: int, node_dir: Path) -> SandboxState:
    """A state as `up` records it, for nodes that do not exist (pid 1 = 0: shown as down)."""
    net = parse_subnet("10.9.0.0/16")
    records = [
        NodeRecord(
            node=SandboxNode(
                name=name,
                address=str(node_address(net, i)),
                netns=f"fl-test-{name}",
                pid1=0,
                node_dir=node_dir / name,
            ),
            index=i,
            veth=f"fltest-{i}",
            launcher_pid=0,
        )
        for i, name in enumerate(node_names(count, "node"))
    ]
    return SandboxState("running", "abcd", str(net), DEFAULT_MAX_STARTUPS, records)


BRIDGE = {"name": "flbr-abcd", "address": "10.9.255.254/16"}
STATUS_LINE = re.compile(r"^node\d{2,} +10\.9\.\d+\.\d+ +down +sshd not listening$")


def test_state_readers_never_see_half_a_file(tmp_path: Path) -> None:
    """sandbox.json is replaced whole (write, then rename): while it is rewritten over and over,
    alternating 1 and 300 nodes, readers in threads and concurrent `fleet sandbox status`
    processes always read one complete state, never an empty or cut file."""
    state_file = StateFile(Layout(tmp_path))
    small, large = fake_state(1, tmp_path), fake_state(300, tmp_path)
    state_file.save(small, BRIDGE)
    stop = threading.Event()
    writes = [0]
    seen: collections.Counter[int] = collections.Counter()
    errors: list[str] = []

    def writer() -> None:
        while not stop.is_set():
            state_file.save(large if writes[0] % 2 else small, BRIDGE)
            writes[0] += 1

    def reader() -> None:
        box = Sandbox(tmp_path)
        while not stop.is_set():
            try:
                seen[len(box.nodes())] += 1
            except SandboxError as exc:
                errors.append(exc.message)

    threads = [threading.Thread(target=fn) for fn in (writer, reader, reader)]
    for thread in threads:
        thread.start()
    try:
        statuses = []
        for _ in range(3):  # rounds of 3 `fleet sandbox status` at once, all during the writes
            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                statuses += pool.map(
                    lambda _: fleet_sandbox("status", "--dir", str(tmp_path)), "xyz"
                )
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == []
    assert set(seen) == {1, 300}, seen  # both versions were read, nothing else
    assert writes[0] > 20
    for status in statuses:
        assert status.returncode == 0, status.stderr
        assert status.stderr == ""
        lines = status.stdout.splitlines()
        assert len(lines) in (1, 300)
        assert all(STATUS_LINE.match(line) for line in lines), lines[:3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sandbox.json"]  # no temp file left


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "unreadable sandbox state"),
        ('{"status": "running", "nodes": [{"name": "node01"}]}', "not a sandbox state file"),
        ('["a", "list"]', "not a sandbox state file"),
    ],
)
def test_a_bad_state_file_is_one_error_line(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / "sandbox.json").write_text(text)
    status = fleet_sandbox("status", "--dir", str(tmp_path))
    assert status.returncode == 1
    error, hint = status.stderr.splitlines()
    assert error.startswith("fleet: error: ")
    assert says in error
    assert str(tmp_path / "sandbox.json") in error
    assert hint.startswith("  hint: ")


# ----------------------------------------------------------------------------- the fleet


@cluster
def test_real_ssh_with_strict_host_keys_reaches_every_node(sandbox: Sandbox) -> None:
    nodes = sandbox.nodes()
    assert [n.name for n in nodes] == node_names(SESSION_NODES, "node")
    assert {str(ipaddress.IPv4Address(n.address)) for n in nodes} == {
        str(node_address(parse_subnet(sandbox.subnet), i)) for i in range(SESSION_NODES)
    }
    for n in nodes:
        effective = subprocess.run(
            ["ssh", "-F", str(sandbox.ssh_config_path), "-G", n.address],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        assert "stricthostkeychecking true" in effective
        assert f"userknownhostsfile {sandbox.known_hosts_path}" in effective
        by_address = ssh(sandbox, n.address, "hostname")
        assert by_address.returncode == 0, by_address.stderr
        assert by_address.stdout.strip() == n.name
        by_name = ssh(sandbox, n.name, "echo $(hostname):$(id -un):$HOME")
        assert by_name.stdout.strip() == f"{n.name}:root:/root", by_name.stderr


@cluster
def test_client_files_describe_the_fleet(sandbox: Sandbox) -> None:
    nodes = sandbox.nodes()
    text = sandbox.inventory_path.read_text()
    assert text.startswith("# Generated by `fleet sandbox up`")
    inv = yaml.safe_load(text)
    hosts = inv["all"]["children"]["gpu"]["hosts"]
    assert hosts == {n.name: {"ansible_host": n.address, "gpus": 8} for n in nodes}
    assert inv["all"]["vars"]["ansible_user"] == "root"
    assert inv["all"]["vars"]["ansible_ssh_private_key_file"] == str(sandbox.key_path)
    known = sandbox.known_hosts_path.read_text().splitlines()
    for n in nodes:
        pub = (n.node_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        assert f"{n.address} {pub[0]} {pub[1]}" in known
    assert len(known) == len(nodes)
    assert sandbox.key_path.stat().st_mode & 0o777 == 0o600
    state = json.loads((sandbox.state_dir / "sandbox.json").read_text())
    assert state["status"] == "running"
    assert [(s["name"], s["pid1"]) for s in state["nodes"]] == [(n.name, n.pid1) for n in nodes]


@cluster
def test_each_node_is_its_own_host(sandbox: Sandbox) -> None:
    for n in sandbox.nodes():
        out = sandbox.run_on(
            n, "hostname; cat /proc/1/comm; ip -4 -o addr show dev eth0; ip route show"
        )
        assert out.returncode == 0, out.stderr
        hostname, init, addr, *routes = out.stdout.splitlines()
        assert hostname == n.name
        assert init == "tini"  # own PID namespace: pid 1 is the node's tini
        assert f"inet {n.address}/{parse_subnet(sandbox.subnet).prefixlen}" in addr
        assert routes == [f"{sandbox.subnet} dev eth0 proto kernel scope link src {n.address} "]
        # No default route: anything off the sandbox subnet is unreachable, never forwarded.
        off = sandbox.run_on(n, "ip route get 192.0.2.1")
        assert off.returncode != 0
        assert "unreachable" in off.stderr
    # And the host will not forward anything that arrives on the sandbox bridge.
    assert Path(f"/proc/sys/net/ipv4/conf/{sandbox.bridge}/forwarding").read_text() == "0\n"


@cluster
def test_planted_process_is_invisible_and_unkillable_from_another_node(sandbox: Sandbox) -> None:
    token = f"fleet-plant-{uuid.uuid4().hex[:8]}"
    node01, node02 = node(sandbox, "node01"), node(sandbox, "node02")
    started = time.monotonic()
    plant = sandbox.run_on(
        node01, f"cp /bin/sleep /tmp/{token}; setsid /tmp/{token} 600 </dev/null >/dev/null 2>&1 &"
    )
    assert plant.returncode == 0, plant.stderr
    assert time.monotonic() - started < 10  # run_on did not wait for the detached process
    try:
        wait_for(lambda: bool(host_pids_matching(token)), 10, "the planted process")
        host_pids = host_pids_matching(token)
        on01 = sandbox.run_on(node01, f"pgrep -f {token}")
        assert on01.returncode == 0, on01.stderr
        assert int(on01.stdout.split()[0]) not in host_pids  # a pid of node01's own namespace
        assert sandbox.run_on(node02, f"pgrep -f {token}").returncode == 1
        assert sandbox.run_on(node02, f"pkill -9 -f {token}").returncode == 1
        inner = on01.stdout.split()[0]
        peek = sandbox.run_on(node02, f"grep -qs {token} /proc/{inner}/cmdline")
        assert peek.returncode != 0  # node01's pid number means nothing on node02
        assert host_pids_matching(token) == host_pids  # still alive after node02's pkill
        assert sandbox.run_on(node01, f"pgrep -f {token}").stdout == on01.stdout
    finally:
        sandbox.run_on(node01, f"pkill -9 -f {token}")
    wait_for(lambda: not host_pids_matching(token), 10, "the planted process to die")


@cluster
def test_run_on_returns_despite_background_child_and_pkill_sleep_spares_the_node(
    sandbox: Sandbox,
) -> None:
    node03 = node(sandbox, "node03")
    started = time.monotonic()
    out = sandbox.run_on(node03, "sleep 600 & echo started", timeout_s=20)
    assert time.monotonic() - started < 10
    assert out.stdout.strip() == "started"
    # A test cleaning up with `pkill sleep` must not take the node down with it.
    assert sandbox.run_on(node03, "pkill -x sleep").returncode == 0
    assert sandbox.run_on(node03, "pgrep -x sleep").returncode == 1
    assert [alive for n, alive, _ in sandbox.status() if n.name == "node03"] == [True]
    assert ssh(sandbox, node03.address, "hostname").stdout.strip() == "node03"


@cluster
def test_run_on_times_out(sandbox: Sandbox) -> None:
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        sandbox.run_on("node04", "sleep 613", timeout_s=1)
    assert time.monotonic() - started < 10
    wait_for(
        lambda: sandbox.run_on("node04", "pgrep -fx 'sleep 613'").returncode == 1,
        10,
        "the timed-out script to be killed",
    )


@cluster
@pytest.mark.parametrize("directory", ["/tmp", "/dev/shm", "/root", "/run"])
def test_scratch_directories_are_private_per_node(sandbox: Sandbox, directory: str) -> None:
    path = f"{directory}/fleet-private-{uuid.uuid4().hex[:8]}"
    node01, node02 = node(sandbox, "node01"), node(sandbox, "node02")
    try:
        assert sandbox.run_on(node01, f"echo secret > {path}").returncode == 0
        assert sandbox.run_on(node01, f"cat {path}").stdout == "secret\n"
        assert sandbox.run_on(node02, f"test -e {path}").returncode == 1
        assert not Path(path).exists()  # not on the host either
        assert ssh(sandbox, node01.address, f"cat {path}").stdout == "secret\n"
    finally:
        sandbox.run_on(node01, f"rm -f {path}")


@cluster
def test_bin_dir_puts_a_shim_on_one_nodes_path(sandbox: Sandbox) -> None:
    node01, node02 = node(sandbox, "node01"), node(sandbox, "node02")
    shim = node01.bin_dir / "nvidia-smi"
    shim.write_text('#!/bin/sh\necho "fake nvidia-smi on $(hostname)"\n')
    shim.chmod(0o755)
    try:
        assert ssh(sandbox, node01.name, "nvidia-smi").stdout == "fake nvidia-smi on node01\n"
        other = sandbox.run_on(node02, "nvidia-smi")
        assert "fake nvidia-smi" not in other.stdout
    finally:
        shim.unlink()


@cluster
def test_bind_into_mounts_on_one_node_only_and_unbind_undoes_it(sandbox: Sandbox) -> None:
    node01, node02 = node(sandbox, "node01"), node(sandbox, "node02")
    tag = uuid.uuid4().hex[:8]
    source = Path("/var/lib/fleet-test") / f"bind-{tag}"  # nodes see /var/lib as the host does
    inner = f"/run/fleet-bind-{tag}"  # on node01's private /run
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text("from the host\n")
    try:
        sandbox.bind_into(node01, source, inner)
        sandbox.bind_into(node01, source, inner)  # again: replaced, not stacked

        assert ssh(sandbox, node01.address, f"cat {inner}").stdout == "from the host\n"
        mounts = sandbox.run_on(node01, f"grep -c ' {inner} ' /proc/self/mountinfo").stdout
        assert mounts == "1\n"
        assert sandbox.run_on(node02, f"test -e {inner}").returncode == 1
        assert not Path(inner).exists()  # not on the host either
        sandbox.unbind(node01, inner, remove=True)
        assert sandbox.run_on(node01, f"test -e {inner}").returncode == 1
        with pytest.raises(SandboxError, match="nodes mount their own"):
            sandbox.bind_into(node01, "/tmp", "/mnt/from-tmp")  # node01's /tmp is not this one
    finally:
        sandbox.unbind(node01, inner, remove=True)
        source.unlink()


@cluster
def test_unknown_or_wrong_host_key_is_rejected(sandbox: Sandbox, tmp_path: Path) -> None:
    node01, node02 = node(sandbox, "node01"), node(sandbox, "node02")
    known_hosts = tmp_path / "known_hosts"

    def plain_ssh() -> subprocess.CompletedProcess[str]:
        opts = [
            "-F",
            "/dev/null",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-i",
            str(sandbox.key_path),
        ]
        return subprocess.run(
            ["ssh", *opts, f"root@{node01.address}", "hostname"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    known_hosts.write_text("")
    empty = plain_ssh()
    assert empty.returncode == 255
    assert "Host key verification failed" in empty.stderr
    assert "node01" not in empty.stdout

    key02 = (node02.node_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    known_hosts.write_text(f"{node01.address} {key02[0]} {key02[1]}\n")
    wrong = plain_ssh()
    assert wrong.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in wrong.stderr

    key01 = (node01.node_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    known_hosts.write_text(f"{node01.address} {key01[0]} {key01[1]}\n")
    right = plain_ssh()  # control: the same command succeeds with the right key
    assert right.returncode == 0, right.stderr
    assert right.stdout.strip() == "node01"


@cluster
def test_stop_sshd_refuses_connections_and_start_sshd_restores(sandbox: Sandbox) -> None:
    node01, node02 = node(sandbox, "node01"), node(sandbox, "node02")
    assert tcp_state(sandbox, node02.address) == "open"
    try:
        sandbox.stop_sshd(node02)
        assert tcp_state(sandbox, node02.address) == "refused"
        assert tcp_state(sandbox, node01.address) == "open"
        assert ssh(sandbox, node01.name, "hostname").stdout.strip() == "node01"
        failed = ssh(sandbox, node02.name, "hostname")
        assert failed.returncode == 255
        assert "Connection refused" in failed.stderr
        status = {n.name: (alive, listening) for n, alive, listening in sandbox.status()}
        assert status["node02"] == (True, False)
        assert status["node01"] == (True, True)
        sandbox.stop_sshd(node02)  # idempotent
    finally:
        sandbox.start_sshd(node02)
    assert tcp_state(sandbox, node02.address) == "open"
    assert ssh(sandbox, node02.name, "hostname").stdout.strip() == "node02"
    sandbox.start_sshd(node02)  # idempotent


@cluster
def test_up_again_reuses_nodes_and_applies_max_startups(sandbox: Sandbox) -> None:
    before = sandbox.nodes()
    other_process_view = Sandbox(sandbox.state_dir)  # what `fleet sandbox status` would see
    assert other_process_view.nodes() == before
    assert Sandbox(sandbox.state_dir).up(SESSION_NODES) == before
    try:
        Sandbox(sandbox.state_dir, max_startups="3:50:6").up(SESSION_NODES)
        assert sandbox.nodes() == before  # nodes kept; only sshd restarted
        for n in before:
            assert "MaxStartups 3:50:6" in (n.node_dir / "sshd_config").read_text()
            listener = sandbox.run_on(n, "pgrep -a -f 'listener'").stdout
            assert "of 3-6 startups" in listener
    finally:
        Sandbox(sandbox.state_dir, max_startups=DEFAULT_MAX_STARTUPS).up(SESSION_NODES)
    assert all(alive and listening for _, alive, listening in sandbox.status())


@cluster
def test_status_while_up_rewrites_the_state_sees_every_node(sandbox: Sandbox) -> None:
    """`up` on a running sandbox rewrites sandbox.json several times (and the client files);
    `fleet sandbox status` run meanwhile, from other processes, always sees all the nodes."""
    before = sandbox.nodes()
    ups: list[list[SandboxNode]] = []
    done = threading.Event()

    def again() -> None:
        try:
            for _ in range(3):
                ups.append(Sandbox(sandbox.state_dir).up(SESSION_NODES))
        finally:
            done.set()

    writer = threading.Thread(target=again)
    writer.start()
    statuses = []
    try:
        while not done.is_set():
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                statuses += pool.map(
                    lambda _: fleet_sandbox("status", "--dir", str(sandbox.state_dir)), "ab"
                )
    finally:
        writer.join()
    assert ups == [before] * 3
    assert len(statuses) >= 2
    for status in statuses:
        assert status.returncode == 0, status.stderr
        rows = [line.split() for line in status.stdout.splitlines()]
        assert [(r[0], r[1], r[2], r[4]) for r in rows] == [
            (n.name, n.address, "up", "listening") for n in before
        ]


@cluster
def test_a_subnet_in_use_is_refused(
    sandbox: Sandbox, make_sandbox: Callable[[str], Sandbox]
) -> None:
    clash = make_sandbox(sandbox.subnet)
    with pytest.raises(SandboxError, match="already in use") as info:
        clash.up(1)
    assert sandbox.bridge in info.value.message
    # The holder is a sandbox: the hint names the command that stops it.
    assert f"fleet sandbox down --dir {shlex.quote(str(sandbox.state_dir))}" in info.value.hint
    assert not Path("/sys/class/net", clash.bridge).exists()
    assert all(alive and listening for _, alive, listening in sandbox.status())


@cluster
def test_down_heals_and_then_leaves_nothing_behind(
    make_sandbox: Callable[[str], Sandbox],
) -> None:
    sb, first = up_on_a_free_subnet(make_sandbox, 2)
    # A dead node is replaced by `up`; the live one is kept as is.
    os.kill(first[0].pid1, signal.SIGKILL)
    wait_for(lambda: not proc_alive(first[0].pid1), 10, "node01's init to die")
    assert [alive for _, alive, _ in sb.status()] == [False, True]
    healed = sb.up(2)
    assert healed[0].pid1 != first[0].pid1
    assert healed[1] == first[1]
    assert ssh(sb, "node01", "hostname").stdout.strip() == "node01"

    token = f"fleet-orphan-{uuid.uuid4().hex[:8]}"
    sb.run_on("node02", f"cp /bin/sleep /tmp/{token}; setsid /tmp/{token} 600 >/dev/null 2>&1 &")
    wait_for(lambda: bool(host_pids_matching(token)), 10, "the planted process")
    state = json.loads((sb.state_dir / "sandbox.json").read_text())
    pids = [n["pid1"] for n in state["nodes"]] + [n["launcher_pid"] for n in state["nodes"]]
    pids += host_pids_matching(token)
    netns = [n.netns for n in healed]
    links = [sb.bridge] + [n["veth"] for n in state["nodes"]]
    assert all(Path("/run/netns", ns).exists() for ns in netns)
    assert all(Path("/sys/class/net", link).exists() for link in links)
    assert all(proc_alive(pid) for pid in pids)

    sb.down()

    assert not [ns for ns in netns if Path("/run/netns", ns).exists()]
    assert not [link for link in links if Path("/sys/class/net", link).exists()]
    wait_for(lambda: not any(proc_alive(pid) for pid in pids), 10, "every sandbox pid to exit")
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True)
    assert f"{sb.subnet.rsplit('.', 1)[0]}." not in routes.stdout
    assert json.loads((sb.state_dir / "sandbox.json").read_text())["status"] == "stopped"
    assert sb.nodes() == []
    with pytest.raises(SandboxError):
        sb.run_on("node01", "true")
    sb.down()  # idempotent
    assert sb.key_path.exists()  # files are kept
    assert sb.inventory_path.exists()


def pinned_neighbours(bridge: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The host's neighbour entries on `bridge`: address -> (MAC, states)."""
    out = subprocess.run(
        ["ip", "-j", "neigh", "show", "dev", bridge], capture_output=True, text=True, check=True
    )
    return {e["dst"]: (e.get("lladdr", ""), tuple(e["state"])) for e in json.loads(out.stdout)}


def test_each_node_is_pinned_on_the_bridge_and_unpinned_when_removed(
    make_sandbox: Callable[[str], Sandbox],
) -> None:
    """Learned ARP entries overflow the kernel's default table (1,024) at ~1,000 nodes and
    nodes go unreachable at random; `up` pins each node's address to its slot's MAC instead."""
    sb, nodes = up_on_a_free_subnet(make_sandbox, 2)
    state = json.loads((sb.state_dir / "sandbox.json").read_text())
    macs = {n["address"]: node_mac(state["sid"], n["index"]) for n in state["nodes"]}
    pinned = pinned_neighbours(sb.bridge)
    for node in nodes:
        assert pinned[node.address] == (macs[node.address], ("PERMANENT",))
        assert ssh(sb, node.name, "hostname").stdout.strip() == node.name
    sb.up(1)  # node02 goes: so does its entry
    assert nodes[1].address not in pinned_neighbours(sb.bridge)
    assert pinned_neighbours(sb.bridge)[nodes[0].address][1] == ("PERMANENT",)


# ----------------------------------------------------------------------------- the state dir

OTHER = 4242  # another user: a numeric uid with no passwd entry


def snapshot(top: Path) -> dict[str, tuple[int, int, int, int]]:
    """Everything under `top` (itself included) as lstat shows it: mode, owner, size, mtime."""
    seen = {}
    for path in [top, *sorted(top.rglob("*"))]:
        info = path.lstat()
        seen[str(path)] = (info.st_mode, info.st_uid, info.st_size, info.st_mtime_ns)
    return seen


def one_error(result: subprocess.CompletedProcess[str], code: int, says: str) -> None:
    """The command failed with `code`, one error line saying `says`, then a hint line."""
    assert result.returncode == code, (result.stdout, result.stderr)
    error, hint = result.stderr.splitlines()
    assert error.startswith("fleet: error: ")
    assert says in error
    assert hint.startswith("  hint: ")


def stranger_dir(tmp_path: Path, how: str) -> Path:
    """The state dir `fleet sandbox --dir` gets, made the way `how` says someone else could
    steer it; inside, what an attacker would plant (symlinks to root-only files, a state)."""
    base = tmp_path / "base"
    base.mkdir(mode=0o755)
    state_dir = base / "sb"
    if how == "symlink":  # the operator's own private dir, reached through someone's symlink
        real = tmp_path / "real"
        real.mkdir(mode=0o700)
        state_dir.symlink_to(real)
        planted = real
    else:
        state_dir.mkdir(mode=0o700)
        planted = state_dir
    (planted / ".lock").symlink_to(tmp_path / "root-only" / "newfile")
    (planted / "id_ed25519").symlink_to(tmp_path / "root-only" / "token")
    (planted / "sandbox.json").write_text('{"status": "running", "nodes": []}')
    if how == "owner":
        os.chown(state_dir, OTHER, OTHER)
    elif how == "parent-owner":
        os.chown(base, OTHER, OTHER)
    elif how == "parent-writable":
        base.chmod(0o777)  # world-writable without the sticky bit: `sb` can be swapped
    elif how != "symlink":
        state_dir.chmod(int(how, 8))
    return state_dir


@cluster
@pytest.mark.parametrize(
    "how", ["owner", "0770", "0707", "01777", "symlink", "parent-owner", "parent-writable"]
)
def test_a_state_dir_someone_else_could_change_is_refused_by_every_verb(
    sandbox: Sandbox, tmp_path: Path, how: str
) -> None:
    """up (on a subnet in use: were the dir used, it would get as far as the client key), down
    and status all refuse it before touching anything in it: no symlink followed, no file made,
    the root-only token not chmod-ed."""
    root_only = tmp_path / "root-only"
    root_only.mkdir(mode=0o700)
    token = root_only / "token"
    token.write_text("secret\n")
    token.chmod(0o640)
    state_dir = stranger_dir(tmp_path, how)
    before = snapshot(tmp_path)
    for verb in (["up", "-n", "1", "--subnet", sandbox.subnet], ["down"], ["status"]):
        result = fleet_sandbox(*verb, "--dir", str(state_dir))
        one_error(result, 1, f"{state_dir}: refused as the sandbox state dir")
        assert snapshot(tmp_path) == before, verb
    assert sorted(p.name for p in root_only.iterdir()) == ["token"]
    assert token.stat().st_mode & 0o777 == 0o640


@cluster
@pytest.mark.parametrize("verb", ["up", "down"])
def test_a_symlinked_lock_is_never_followed(
    make_sandbox: Callable[[str], Sandbox], tmp_path: Path, verb: str
) -> None:
    """In the operator's own state dir too: `.lock` is opened with O_NOFOLLOW."""
    target = tmp_path / "newfile"
    planted: list[Path] = []

    def attempt(subnet: str) -> None:
        sb = make_sandbox(subnet)
        planted.append(sb.state_dir / ".lock")
        planted[-1].symlink_to(target)
        if verb == "up":
            sb.up(1)
        else:
            one_error(fleet_sandbox("down", "--dir", str(sb.state_dir)), 1, "a symlink")

    try:
        if verb == "up":
            with pytest.raises(SandboxError, match=r"\.lock: a symlink in the sandbox state dir"):
                on_a_free_subnet(EXTRA_SUBNETS, attempt)
        else:
            attempt(EXTRA_SUBNETS[0])  # `down` reaches no network
        assert not target.exists()
    finally:
        for link in planted:  # so that the fixture's `down` can lock
            link.unlink(missing_ok=True)


@cluster
def test_a_symlinked_client_key_is_neither_chmod_ed_nor_used(
    make_sandbox: Callable[[str], Sandbox], tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    token.chmod(0o644)

    def attempt(subnet: str) -> None:
        sb = make_sandbox(subnet)
        (sb.state_dir / "id_ed25519").symlink_to(token)
        sb.up(1)

    with pytest.raises(SandboxError, match=r"id_ed25519: a symlink in the sandbox state dir"):
        on_a_free_subnet(EXTRA_SUBNETS, attempt)
    assert token.stat().st_mode & 0o777 == 0o644
    assert token.read_text() == "secret\n"


@cluster
def test_a_sticky_tmp_above_the_state_dir_is_fine(tmp_path: Path) -> None:
    """/tmp is world-writable with the sticky bit: nobody else can rename or remove what is
    ours there, so a state dir under such a directory is used (and made 0700)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    status = fleet_sandbox("status", "--dir", str(shared / "sb"))
    assert (status.returncode, status.stderr) == (0, ""), status.stderr
    down = fleet_sandbox("down", "--dir", str(shared / "sb"))
    assert down.returncode == 0, down.stderr
    assert not (shared / "sb").exists()


@cluster
def test_down_and_status_without_a_state_dir_make_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "missing" / "sb"
    down = fleet_sandbox("down", "--dir", str(missing))
    assert down.returncode == 0, down.stderr
    assert down.stderr == f"sandbox: nothing to stop: no sandbox in {missing}\n"
    status = fleet_sandbox("status", "--dir", str(missing))
    assert (status.returncode, status.stderr) == (0, "")
    assert status.stdout == "sandbox: no nodes (start with: fleet sandbox up)\n"
    assert list(tmp_path.iterdir()) == []


@cluster
def test_an_empty_dir_is_a_usage_error(tmp_path: Path) -> None:
    """Not the current directory: nothing is made there."""
    for verb in ("up", "down", "status"):
        result = fleet_sandbox(verb, "--dir", "", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert "Invalid value for '--dir': is empty" in result.stderr
    assert list(tmp_path.iterdir()) == []


@cluster
def test_a_file_is_not_a_state_dir(tmp_path: Path) -> None:
    afile = tmp_path / "passwd"
    afile.write_text("root:x:0:0::/root:/bin/sh\n")
    before = snapshot(tmp_path)
    for verb in ("up", "down", "status"):
        one_error(fleet_sandbox(verb, "--dir", str(afile)), 1, f"{afile}: refused")
        one_error(fleet_sandbox(verb, "--dir", str(afile / "sb")), 1, f"{afile} is not a dir")
    assert "not a directory" in fleet_sandbox("up", "--dir", str(afile)).stderr
    assert snapshot(tmp_path) == before


@cluster
@pytest.mark.parametrize("exists", [False, True])
def test_a_subnet_in_use_writes_nothing_and_up_then_works(
    sandbox: Sandbox, make_sandbox: Callable[[str], Sandbox], tmp_path: Path, exists: bool
) -> None:
    state_dir = tmp_path / "sb"
    if exists:
        state_dir.mkdir(mode=0o700)
    refused = fleet_sandbox("up", "-n", "1", "--dir", str(state_dir), "--subnet", sandbox.subnet)
    one_error(refused, 1, f"subnet {sandbox.subnet} is already in use")
    assert list(tmp_path.iterdir()) == ([state_dir] if exists else [])
    assert not exists or list(state_dir.iterdir()) == []
    later: list[Sandbox] = []

    def attempt(subnet: str) -> list[SandboxNode]:
        later.append(make_sandbox(subnet))  # downed by the fixture
        return Sandbox(state_dir, subnet=subnet).up(1)

    try:
        assert [n.name for n in on_a_free_subnet(EXTRA_SUBNETS, attempt)[0]] == ["node01"]
        assert json.loads((state_dir / "sandbox.json").read_text())["status"] == "running"
    finally:
        Sandbox(state_dir).down()


def fail_sshd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `up` fail late, after the state, the bridge and the nodes were made."""

    def refuse(*_: object) -> None:
        raise SandboxError("sshd refused to start (injected)")

    monkeypatch.setattr("fleet.sandbox.box.sshd.ensure_all", refuse)


def leftovers(sb: Sandbox) -> list[str]:
    """This sandbox's bridge, netns and processes that still exist."""
    found = [sb.bridge] if Path("/sys/class/net", sb.bridge).exists() else []
    found += [n for n in os.listdir("/run/netns") if n.startswith(f"fl-{sb.sid}-")]
    return found + [str(pid) for pid in host_pids_matching(str(sb.state_dir))]


@cluster
def test_a_failed_up_of_a_new_sandbox_stops_all_it_started(
    make_sandbox: Callable[[str], Sandbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_sshd(monkeypatch)
    tried: list[Sandbox] = []

    def attempt(subnet: str) -> list[SandboxNode]:
        tried.append(make_sandbox(subnet))
        return tried[-1].up(2)

    with pytest.raises(SandboxError, match="injected") as info:
        on_a_free_subnet(EXTRA_SUBNETS, attempt)
    sb = tried[-1]
    assert info.value.hint == "nothing is left running; `fleet sandbox up` tries again"
    assert json.loads(sb.state_path.read_text())["status"] == "stopped"
    assert sb.nodes() == []
    assert leftovers(sb) == []
    monkeypatch.undo()
    assert [n.name for n in sb.up(2)] == ["node01", "node02"]
    assert all(alive and listening for _, alive, listening in sb.status())


@cluster
def test_a_failed_grow_keeps_the_running_nodes_and_says_failed(
    make_sandbox: Callable[[str], Sandbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    sb, (node01,) = up_on_a_free_subnet(make_sandbox, 1)
    fail_sshd(monkeypatch)
    with pytest.raises(SandboxError, match="injected") as info:
        sb.up(2)
    assert info.value.hint == "`fleet sandbox down` removes whatever was started"
    assert json.loads(sb.state_path.read_text())["status"] == "failed"
    status = {n.name: (n.pid1, alive, listening) for n, alive, listening in sb.status()}
    assert status["node01"] == (node01.pid1, True, True)
    shown = fleet_sandbox("status", "--dir", str(sb.state_dir))  # the operator is told, too
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split()[:3] == ["node01", node01.address, "up"], shown.stdout
    assert "sandbox: the last `fleet sandbox up` failed" in shown.stderr, shown.stderr
    assert "  hint: `fleet sandbox up` again heals it" in shown.stderr, shown.stderr
    monkeypatch.undo()
    healed = sb.up(2)
    assert healed[0] == node01
    assert json.loads(sb.state_path.read_text())["status"] == "running"
    assert fleet_sandbox("status", "--dir", str(sb.state_dir)).stderr == ""
