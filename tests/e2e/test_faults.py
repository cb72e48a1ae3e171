"""Faults among healthy nodes, against real sshd nodes: for each one, the run ends within a bound,
the healthy nodes finish ok, the faulty node's summary names the fault, and the exit code follows
docs/reference/output.md's exit codes (4: a host unreachable or timed out; 130: interrupted).

Fault (how it is injected) -> outcome: reason in the --json summary, exit code:

- connection refused (sshd stopped): unreachable: connection refused, 4. In test_run.py.
- host unreachable (an address on the sandbox bridge with nothing behind it): unreachable:
  host unreachable once ARP gives up (~3 s), or connect timed out if --connect-timeout is
  shorter; 4.
- no SSH banner (a listener on the node that accepts TCP and never speaks): unreachable: no SSH
  banner, after the banner timeout, in one attempt; 4.
- authentication failed (ssh_config gives one node a fresh, unauthorised key): unreachable:
  authentication failed; 4.
- slow link (tc netem delay, or tbf rate, on the node's eth0): ok with every output line, visibly
  slower; 0.
- sshd dies mid-step (its listener and session processes SIGKILLed): unreachable: connection
  lost; 4.
- node vanishes mid-step (eth0 down, then its pid 1 killed): unreachable: connection lost, within
  the step deadline's bound or, without one, the keepalive + dead-peer bound; 4.
- node stops answering between steps (frames to it sent to a MAC nobody has, then its first
  step released): unreachable: connection lost, failed_step the second step; 4.
- step hangs past --timeout: timed_out; 4. In test_run.py; one that ignores TERM until
  `timeout`'s KILL ends it: timed_out too, 4 (not connection lost).
- the step's process dies of a signal (`kill -KILL $$`, os.abort(), a KILL from outside as the
  OOM killer sends it), with or without a step timeout: failed: killed by SIGKILL / SIGABRT; 3.
  sshd reports such a death with `exit-signal`, which paramiko ignores: fleet reads it, so it
  does not read as a vanished node (unreachable: connection lost, 4).
- Ctrl-C while the first Ctrl-C's cancel is in flight: 130 at once, no fleet process left.
- sshd MaxStartups drops (one sshd, many inventory names, -f as many): ok after jittered
  retries (0), or unreachable: connection closed during handshake after every attempt (4).

Bounds come from fleet's own constants (connect/banner/auth timeouts, keepalive and dead-peer
bound), plus slack for interpreter start: they prove that a run ends, they are not benchmarks.
Every address used is a sandbox address on the sandbox's own bridge.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import queue
import shlex
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from fleetrun import FLEET, FleetResult, fleet_env, run_fleet
from freesubnet import on_a_free_subnet

from fleet.core.shell import KILL_AFTER_S, KILL_REPORT
from fleet.sandbox import Sandbox, SandboxNode, parse_subnet
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import DEAD_PEER_S, KEEPALIVE_S

pytestmark = pytest.mark.root

DEFAULTS = SshSettings()
BANNER_S = DEFAULTS.banner_timeout_s
AUTH_S = DEFAULTS.auth_timeout_s
SLACK_S = 10.0  # interpreter start and scheduling on a busy CI machine: "ends", not "is fast"
STALL_PORT = 2222


# ----------------------------------------------------------------------------- helpers


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _inventory(
    path: Path, hosts: dict[str, tuple[str, int | None]], key: Path | None = None
) -> Path:
    """An Ansible-style inventory: name -> (address, port or None); root login."""
    lines = ["all:", "  vars:", "    ansible_user: root"]
    if key is not None:
        lines.append(f"    ansible_ssh_private_key_file: {json.dumps(str(key))}")
    lines.append("  hosts:")
    for name, (address, port) in hosts.items():
        extra = f", ansible_port: {port}" if port else ""
        lines.append(f"    {name}: {{ansible_host: {address}{extra}}}")
    return _write(path, "\n".join(lines) + "\n")


def _healthy(box: Sandbox, skip: SandboxNode | None = None) -> dict[str, tuple[str, int | None]]:
    return {n.name: (n.address, None) for n in box.nodes() if skip is None or n.name != skip.name}


def _hosts(result: FleetResult) -> dict[str, dict[str, Any]]:
    hosts: dict[str, dict[str, Any]] = result.final()["hosts"]
    return hosts


def _attempts(result: FleetResult) -> dict[str, list[int]]:
    """Each host's HostConnecting attempts, in order."""
    seen: dict[str, list[int]] = {}
    for event in result.json_lines():
        if event["event"] == "HostConnecting":
            seen.setdefault(event["host"], []).append(event["attempt"])
    return seen


def _assert_others_ok(result: FleetResult, faulty: set[str]) -> None:
    others = {h: r["outcome"] for h, r in _hosts(result).items() if h not in faulty}
    assert others, "no healthy hosts in the run"
    assert set(others.values()) == {"ok"}, others


def _poll(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll to a deadline instead of sleeping a fixed time."""
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _pids(box: Sandbox, node: SandboxNode, prefix: str) -> list[int]:
    """Pids (in the node's PID namespace) whose command line starts with `prefix`.

    The scan runs from a script file, so its own command line never matches."""
    script = (
        "for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $d/cmdline 2>/dev/null);"
        f' case "$c" in {shlex.quote(prefix)}*) echo "${{d#/proc/}}";; esac; done'
    )
    out = box.run_on(node, script).stdout
    return [int(p) for p in out.split()]


def _kill_on_node(box: Sandbox, node: SandboxNode, prefix: str) -> None:
    """SIGKILL, by pid, whatever on the node runs `prefix`; wait until it is gone."""
    for pid in _pids(box, node, prefix):
        box.run_on(node, f"kill -KILL {pid} 2>/dev/null || true")
    _poll(lambda: not _pids(box, node, prefix), 15, f"{prefix!r} to exit on {node.name}")


def _tcp_accepts(box: Sandbox, address: str, port: int) -> bool:
    """True if something accepts TCP there; bound to the sandbox bridge (never leaves the host)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, box.bridge.encode())
        try:
            sock.connect((address, port))
        except OSError:
            return False
        return True


# Candidate subnets for throwaway sandboxes (the session's is 10.253.0.0/16, test_sandbox's
# 10.252.0.0/16); /24s far from both, so that other engineers' sandboxes rarely collide.
_THROWAWAY_SUBNETS = [f"10.{b}.77.0/24" for b in range(230, 247)]


def _throwaway(
    make_sandbox: Callable[[str], Sandbox], count: int, max_startups: str | None = None
) -> Sandbox:
    """A sandbox of its own (torn down by the fixture), on the first free candidate subnet."""

    def up(subnet: str) -> Sandbox:
        box = make_sandbox(subnet)  # registered for teardown even if `up` fails
        # A second handle on the same state dir carries the sshd setting the fixture lacks.
        Sandbox(box.state_dir, subnet=subnet, max_startups=max_startups).up(count)
        return box

    return on_a_free_subnet(_THROWAWAY_SUBNETS, up)[0]


class LiveRun:
    """`python -m fleet ... --json` in the background, its events read as they come."""

    def __init__(
        self,
        box: Sandbox,
        *args: str,
        log_dir: Path,
        inventory: Path | None = None,
        ssh_config: Path | None = None,
    ) -> None:
        env = fleet_env(box, log_dir, inventory=inventory, ssh_config=ssh_config)
        self.argv = [*FLEET, *args]
        self._stderr: IO[str] = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.started = time.monotonic()
        self.lines: list[str] = []
        self.events: list[dict[str, Any]] = []  # those wait_for has read
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout_s: float) -> None:
        """Until an event (already read or new) matches; fail at the deadline or if fleet exits."""
        if any(match(e) for e in self.events):
            return
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"no matching event within {timeout_s:g}s: {self.lines[-5:]}")
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                pytest.fail(f"fleet exited early: {''.join(self.lines)[-2000:]}{self.stderr()}")
            if not line.strip():
                continue
            self.events.append(json.loads(line))
            if match(self.events[-1]):
                return

    def finish(self, timeout_s: float) -> FleetResult:
        """Wait (bounded) for fleet to exit; kill it and fail if it does not."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
            pytest.fail(f"fleet still running after {timeout_s:g}s: {self.lines[-5:]}")
        self._reader.join(10)
        return FleetResult(self.proc.returncode, "".join(self.lines), self.stderr())

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def close(self) -> None:
        """Kill fleet (by pid) if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(10)
        self._stderr.close()


@contextlib.contextmanager
def live_run(box: Sandbox, *args: str, **kw: Any) -> Iterator[LiveRun]:
    run = LiveRun(box, *args, **kw)
    try:
        yield run
    finally:
        run.close()


def _step_started(host: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["event"] == "StepStarted" and e["host"] == host


# ----------------------------------------------------------------------------- host unreachable


def _arp_give_up_s(bridge: str) -> float:
    """How long Linux tries to resolve an on-link address before connect() gets EHOSTUNREACH."""
    base = Path("/proc/sys/net/ipv4/neigh", bridge)
    probes = int((base / "mcast_solicit").read_text()) + int((base / "app_solicit").read_text())
    return probes * int((base / "retrans_time_ms").read_text()) / 1000


@pytest.mark.parametrize(
    ("case", "expected"),
    [("arp-gives-up", "host unreachable"), ("connect-timeout-first", "connect timed out")],
    ids=["arp-gives-up", "connect-timeout-first"],
)
def test_unreachable_address_is_named_and_ends_within_connect_timeout(
    sandbox: Sandbox, tmp_path: Path, case: str, expected: str
) -> None:
    # An on-link address with nothing behind it: ARP gets no answer. After mcast_solicit probes
    # (3 x 1 s by default) connect() fails with EHOSTUNREACH: "host unreachable". A connect
    # timeout shorter than that ends it first: "connect timed out".
    arp_s = _arp_give_up_s(sandbox.bridge)
    if arp_s <= 0:
        pytest.skip(f"ARP on {sandbox.bridge} never gives up (mcast_solicit 0)")
    connect_s = arp_s + 5 if case == "arp-gives-up" else max(0.2, arp_s / 3)
    net = parse_subnet(sandbox.subnet)
    ghost = str(net.network_address + (250 if case == "arp-gives-up" else 251))
    assert ghost not in {n.address for n in sandbox.nodes()}
    assert ipaddress.IPv4Address(ghost) in net  # on our bridge only
    # No stale neighbour entry from an earlier run decides the timing.
    subprocess.run(
        ["ip", "neigh", "flush", "to", ghost, "dev", sandbox.bridge], check=False, timeout=10
    )
    inventory = _inventory(
        tmp_path / "inv.yaml", {**_healthy(sandbox), "ghost": (ghost, None)}, sandbox.key_path
    )

    started = time.monotonic()
    result = run_fleet(
        sandbox,
        "exec",
        "true",
        "--json",
        "--connect-timeout",
        f"{connect_s:g}",
        inventory=inventory,
        log_dir=tmp_path / "logs",
        timeout_s=connect_s + 60,
    )
    elapsed = time.monotonic() - started

    assert result.code == 4, result.stdout + result.stderr
    ghost_row = _hosts(result)["ghost"]
    assert ghost_row["outcome"] == "unreachable"
    assert ghost_row["reason"] == expected, ghost_row
    assert ghost_row["failed_step"] is None  # it never connected
    assert _attempts(result)["ghost"] == [1], "an unreachable host must not be retried"
    _assert_others_ok(result, {"ghost"})
    assert ghost_row["duration_s"] <= connect_s + SLACK_S, ghost_row
    assert elapsed <= connect_s + SLACK_S


# ----------------------------------------------------------------------------- no SSH banner

_STALL_LISTENER = """# fleet-banner-stall: accept TCP, never say a word
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(64)
held = []
while True:
    held.append(s.accept()[0])
"""


def _start_stall_listener(box: Sandbox, node: SandboxNode, port: int) -> int:
    """A TCP listener inside the node (its netns) that accepts and never sends a banner."""
    start = (
        f"setsid python3 -c {shlex.quote(_STALL_LISTENER)} {node.address} {port}"
        " </dev/null >/dev/null 2>&1 & echo $!"
    )
    pid = int(box.run_on(node, start).stdout.strip())
    _poll(lambda: _tcp_accepts(box, node.address, port), 15, f"the stall listener on {port}")
    return pid


def _stop_stall_listener(box: Sandbox, node: SandboxNode, pid: int) -> None:
    """Kill the listener by pid, after checking the pid is still ours."""
    box.run_on(
        node,
        f"case \"$(tr '\\0' ' ' </proc/{pid}/cmdline 2>/dev/null)\" in"
        f" *fleet-banner-stall*) kill -KILL {pid};; esac",
    )
    _poll(lambda: not _tcp_accepts(box, node.address, STALL_PORT), 15, "the listener to stop")


def test_node_that_accepts_tcp_but_sends_no_banner_is_named_once_not_retried(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    # PITFALLS 18: an I/O-stalled head node accepts TCP but sshd never gets to send its banner.
    node = sandbox.nodes()[0]
    connect_s = 3.0  # shorter than the banner timeout: it must not cut the banner wait short
    # The sandbox config's ConnectTimeout (10) would win over --connect-timeout; drop it.
    config = _write(
        tmp_path / "ssh_config",
        "".join(
            line
            for line in sandbox.ssh_config_path.read_text().splitlines(keepends=True)
            if "ConnectTimeout" not in line
        ),
    )
    inventory = _inventory(
        tmp_path / "inv.yaml",
        {**_healthy(sandbox), "stalled": (node.address, STALL_PORT)},
        sandbox.key_path,
    )
    pid = _start_stall_listener(sandbox, node, STALL_PORT)
    try:
        started = time.monotonic()
        result = run_fleet(
            sandbox,
            "exec",
            "true",
            "--json",
            "--connect-timeout",
            f"{connect_s:g}",
            inventory=inventory,
            ssh_config=config,
            log_dir=tmp_path / "logs",
            timeout_s=connect_s + BANNER_S + 60,
        )
        elapsed = time.monotonic() - started
    finally:
        _stop_stall_listener(sandbox, node, pid)

    assert result.code == 4, result.stdout + result.stderr
    row = _hosts(result)["stalled"]
    assert row["outcome"] == "unreachable"
    assert row["reason"] == "no SSH banner", row
    assert f"no SSH banner within {BANNER_S:g}s" in row["last_line"]
    # One attempt: retrying a stalled node would multiply the wait (4 attempts: 4x).
    assert _attempts(result)["stalled"] == [1]
    # The banner timeout ended it (not the 3 s connect timeout), and nothing beyond it.
    assert BANNER_S * 0.9 <= row["duration_s"] <= BANNER_S + SLACK_S, row
    _assert_others_ok(result, {"stalled"})
    assert elapsed <= connect_s + BANNER_S + SLACK_S


# ----------------------------------------------------------------------------- authentication


def test_unauthorised_key_is_named_authentication_failed(sandbox: Sandbox, tmp_path: Path) -> None:
    bad = sandbox.nodes()[2]
    fresh = tmp_path / "unauthorised_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleet-test", "-f", str(fresh)],
        check=True,
        timeout=30,
    )
    good = [n.address for n in sandbox.nodes() if n.name != bad.name]
    # Keys come only from this config (the inventory names none); the bad node gets the fresh
    # key alone, so nothing else can log in for it.
    config = _write(
        tmp_path / "ssh_config",
        f"Host {bad.address}\n    IdentityFile {fresh}\n\n"
        f"Host {' '.join(good)}\n    IdentityFile {sandbox.key_path}\n\n"
        "Host *\n"
        "    User root\n"
        f"    UserKnownHostsFile {sandbox.known_hosts_path}\n"
        "    GlobalKnownHostsFile /dev/null\n"
        "    StrictHostKeyChecking yes\n"
        "    IdentitiesOnly yes\n",
    )
    inventory = _inventory(tmp_path / "inv.yaml", _healthy(sandbox))
    no_agent = {"SSH_AUTH_SOCK": ""}  # an agent's keys must not rescue the login

    started = time.monotonic()
    result = run_fleet(
        sandbox,
        "exec",
        "true",
        "--json",
        inventory=inventory,
        ssh_config=config,
        log_dir=tmp_path / "logs",
        extra_env=no_agent,
        timeout_s=AUTH_S + 60,
    )
    elapsed = time.monotonic() - started

    assert result.code == 4, result.stdout + result.stderr
    row = _hosts(result)[bad.name]
    assert (row["outcome"], row["reason"]) == ("unreachable", "authentication failed"), row
    assert _attempts(result)[bad.name] == [1], "a refused key must not be retried"
    _assert_others_ok(result, {bad.name})
    assert elapsed <= AUTH_S + SLACK_S

    # The operator's view names it too: the host's line, and the summary's "connect" entry.
    plain = run_fleet(
        sandbox,
        "exec",
        "true",
        "--plain",
        inventory=inventory,
        ssh_config=config,
        log_dir=tmp_path / "logs",
        extra_env=no_agent,
        timeout_s=AUTH_S + 60,
    )
    assert plain.code == 4
    rows = [x for x in plain.stdout.splitlines() if x.startswith(bad.name)]
    assert any(x.endswith("= unreachable: authentication failed") for x in rows), rows
    assert f"{bad.name}: connect: authentication failed" in plain.stdout


# ----------------------------------------------------------------------------- slow link

_OUTPUT_LINES = 632  # 36000 zero bytes, base64 in 76-column lines: ~48 KB of output


@pytest.mark.parametrize(
    ("kind", "qdisc", "extra_s"),
    [
        # 200 ms more on every packet the node sends: every round trip of the handshake pays it.
        ("netem", "netem delay 200ms", 1.0),
        # A 128 kbit/s link (16 KB/s): ~48 KB of output takes ~3 s instead of milliseconds.
        ("tbf", "tbf rate 128kbit burst 4kb latency 10s", 1.5),
    ],
    ids=["netem-delay", "tbf-rate"],
)
def test_slow_link_completes_with_all_output(
    sandbox: Sandbox, tmp_path: Path, kind: str, qdisc: str, extra_s: float
) -> None:
    slow = sandbox.nodes()[1]
    added = sandbox.run_on(slow, f"tc qdisc add dev eth0 root {qdisc}")
    if added.returncode != 0:
        reason = added.stderr.strip()
        if "unknown" in reason.lower() or "no such file" in reason.lower():
            pytest.skip(f"this kernel has no sch_{kind} (tc: {reason})")
        pytest.fail(f"tc qdisc add failed: {reason}")
    try:
        started = time.monotonic()
        result = run_fleet(
            sandbox,
            "exec",
            "head -c 36000 /dev/zero | base64 -w 76 | cat -n",
            "--json",
            log_dir=tmp_path,
            timeout_s=120,
        )
        elapsed = time.monotonic() - started
    finally:
        sandbox.run_on(slow, "tc qdisc del dev eth0 root")
    assert kind not in sandbox.run_on(slow, "tc qdisc show dev eth0").stdout

    assert result.code == 0, result.stdout + result.stderr
    hosts = _hosts(result)
    assert {r["outcome"] for r in hosts.values()} == {"ok"}
    lines: dict[str, int] = {}
    for event in result.json_lines():
        if event["event"] == "OutputLine":
            lines[event["host"]] = lines.get(event["host"], 0) + 1
    # Every line arrived, the last one included (sshd sends the exit status ahead of output
    # still queued behind a slow link: fleet must read on to EOF).
    assert lines == dict.fromkeys(hosts, _OUTPUT_LINES)
    for name, row in hosts.items():
        assert row["last_line"].split()[0] == str(_OUTPUT_LINES), (name, row["last_line"])
    # The slow link's delay shows in its host's time (measured against the fault itself, not
    # the other hosts, whose times a loaded machine stretches too).
    assert hosts[slow.name]["duration_s"] >= extra_s, hosts
    assert elapsed <= 60


# ----------------------------------------------------------------------------- sshd dies


def _step_for(faulty: SandboxNode, long_s: int, short_s: int) -> str:
    """A step that sleeps `long_s` on the faulty node (so only a detected fault ends it there)
    and `short_s` elsewhere."""
    return f'if [ "$(hostname)" = {faulty.name} ]; then sleep {long_s}; else sleep {short_s}; fi'


def test_sshd_killed_mid_step_is_connection_lost(
    make_sandbox: Callable[[str], Sandbox], tmp_path: Path
) -> None:
    box = _throwaway(make_sandbox, 3)
    victim = box.nodes()[1]
    step = _step_for(victim, 301, 3)
    with live_run(box, "exec", step, "--json", log_dir=tmp_path) as run:
        run.wait_for(_step_started(victim.name), 30)
        _poll(lambda: bool(_pids(box, victim, "sleep 301")), 15, "the step to run")
        # The listener and every per-connection sshd (found by command line, killed by pid).
        sshds = _pids(box, victim, "sshd: ")
        assert len(sshds) >= 2, "expected the listener and the session's sshd"
        box.run_on(victim, "kill -KILL " + " ".join(map(str, sshds)))
        injected = time.monotonic()
        result = run.finish(timeout_s=30)
        ended_after = time.monotonic() - injected

    assert result.code == 4, result.stdout + result.stderr
    row = _hosts(result)[victim.name]
    assert (row["outcome"], row["reason"]) == ("unreachable", "connection lost"), row
    assert row["failed_step"] == "exec"
    assert "went away while a step ran" in row["last_line"]
    _assert_others_ok(result, {victim.name})
    assert ended_after <= 3 + SLACK_S  # the others' 3 s step, not the victim's 301 s


# ----------------------------------------------------------------------------- node vanishes


@pytest.mark.parametrize("step_timeout_s", [5, 0], ids=["with-step-timeout", "no-step-timeout"])
def test_node_that_vanishes_mid_step_is_connection_lost_within_a_bound(
    make_sandbox: Callable[[str], Sandbox], tmp_path: Path, step_timeout_s: int
) -> None:
    # Power loss: the link goes down first (so not even a FIN or RST gets out), then the node's
    # whole PID namespace dies. The client's TCP connection just goes silent.
    box = _throwaway(make_sandbox, 3)
    victim = box.nodes()[1]
    args = ["exec", _step_for(victim, 301, 3), "--json"]
    if step_timeout_s:
        args += ["--timeout", str(step_timeout_s)]
        # The node's own `timeout` would answer by timeout + KILL_AFTER_S; fleet waits 10 s more,
        # then tries the kill over a fresh channel (5 s to open) and gives the node up.
        bound = step_timeout_s + KILL_AFTER_S + 10 + 5
        detail = "stopped answering"
    else:
        # No step deadline: after KEEPALIVE_S of silence fleet asks the node for a reply, and
        # gives it up when none comes within DEAD_PEER_S.
        bound = KEEPALIVE_S + DEAD_PEER_S
        detail = "went away while a step ran"
    with live_run(box, *args, log_dir=tmp_path) as run:
        run.wait_for(_step_started(victim.name), 30)
        _poll(lambda: bool(_pids(box, victim, "sleep 301")), 15, "the step to run")
        box.run_on(victim, "ip link set eth0 down")
        injected = time.monotonic()
        with Path(f"/proc/{victim.pid1}/cmdline").open("rb") as fh:
            assert fh.read().split(b"\0")[0].endswith(b"tini"), "pid 1 is not the node's init"
        os.kill(victim.pid1, signal.SIGKILL)
        result = run.finish(timeout_s=bound + 2 * SLACK_S)
        ended_after = time.monotonic() - injected

    assert result.code == 4, result.stdout + result.stderr
    row = _hosts(result)[victim.name]
    assert (row["outcome"], row["reason"]) == ("unreachable", "connection lost"), row
    assert row["failed_step"] == "exec"
    assert detail in row["last_line"], row
    _assert_others_ok(result, {victim.name})
    print(f"VANISH ended_after={ended_after:.1f} bound={bound}")
    assert ended_after <= bound + SLACK_S


# ----------------------------------------------------------------------------- between steps


def _unacked_ssh_bytes(box: Sandbox, node: SandboxNode) -> int:
    """Bytes the node's sshd connections have sent and not yet had acknowledged."""
    out = box.run_on(node, "ss -Htn state established '( sport = :22 )'").stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.strip())


def test_node_that_stops_answering_between_steps_is_connection_lost(
    make_sandbox: Callable[[str], Sandbox], tmp_path: Path
) -> None:
    # The node still talks but no longer hears us: a bogus permanent neighbour entry on our
    # bridge sends every frame for it to a MAC nobody has. Its first step then ends (the exit
    # status gets out), and opening the second step's channel gets no answer.
    box = _throwaway(make_sandbox, 3)
    victim = box.nodes()[1]
    gate = "/tmp/fleet-fault-go"
    playbook = _write(
        tmp_path / "pb.yaml",
        f"""
name: two-steps
steps:
  - name: first
    run: 'if [ "$(hostname)" = {victim.name} ]; then while [ ! -e {gate} ]; do sleep 0.1; done; fi'
  - name: second
    run: echo second
""",
    )
    with live_run(box, "run", str(playbook), "--json", log_dir=tmp_path / "logs") as run:
        run.wait_for(_step_started(victim.name), 30)
        # Nothing of the node's in flight: otherwise its TCP would retransmit that forever and
        # never send the exit status, and the fault would be "mid-step", not "between steps".
        _poll(lambda: _unacked_ssh_bytes(box, victim) == 0, 15, "the node's output to be acked")
        nowhere = ["lladdr", "02:00:00:00:00:99", "nud", "permanent"]
        subprocess.run(
            ["ip", "neigh", "replace", victim.address, "dev", box.bridge, *nowhere],
            check=True,
            timeout=10,
        )
        box.run_on(victim, f"touch {gate}")
        injected = time.monotonic()
        result = run.finish(timeout_s=60)
        ended_after = time.monotonic() - injected

    assert result.code == 4, result.stdout + result.stderr
    row = _hosts(result)[victim.name]
    assert (row["outcome"], row["reason"]) == ("unreachable", "connection lost"), row
    assert row["failed_step"] == "second", row
    assert "Timeout opening channel" in row["last_line"], row
    _assert_others_ok(result, {victim.name})
    # The channel-open timeout is the connect timeout (the sandbox's ssh_config: 10 s).
    assert ended_after <= 10 + SLACK_S


# ----------------------------------------------------------------------------- Ctrl-C twice


def _fleet_processes(token: str) -> list[int]:
    """Host pids of `python -m fleet` processes whose command line carries `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"fleet" in argv and any(token.encode() in a for a in argv) and b"-m" in argv:
            found.append(int(entry.name))
    return found


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_second_ctrl_c_while_cancelling_exits_130_at_once(sandbox: Sandbox, tmp_path: Path) -> None:
    nodes = sandbox.nodes()[:2]
    probe = f"fleet-sigint2-{os.getpid()}"
    # The step ignores SIGTERM, so the first Ctrl-C's remote kill takes its full grace (TERM,
    # 5 s of polling, KILL): the second Ctrl-C lands while that cancel is in flight.
    step = f"bash -c 'trap \"\" TERM; exec -a {probe} sleep 300'"
    limit = ",".join(n.name for n in nodes)
    try:
        with live_run(sandbox, "exec", step, "--json", "--limit", limit, log_dir=tmp_path) as run:
            for node in nodes:
                run.wait_for(_step_started(node.name), 30)
                _poll(lambda n=node: bool(_pids(sandbox, n, probe)), 15, "the probes to run")
            # The command, and the worker processes it forked, if any (with warm connections a
            # first command's workers connect and become the keepers): all must go at once.
            found = _fleet_processes(probe)
            assert run.proc.pid in found
            assert all(_parent(pid) == run.proc.pid for pid in found if pid != run.proc.pid)

            run.proc.send_signal(signal.SIGINT)
            # The cancel is in flight: fleet's kill script (TERM, then polling) runs on a node.
            _poll(
                lambda: any(KILL_REPORT in c for n in nodes for c in _cmdlines(sandbox, n)),
                15,
                "fleet's remote kill to start",
            )
            run.proc.send_signal(signal.SIGINT)
            second = time.monotonic()
            result = run.finish(timeout_s=15)
            exited_after = time.monotonic() - second

        assert result.code == 130, result.stdout + result.stderr
        assert exited_after <= 3, f"second Ctrl-C took {exited_after:.1f}s"
        assert "Traceback" not in result.stderr
        assert not Path(f"/proc/{run.proc.pid}").exists()
        assert _fleet_processes(probe) == [], "a fleet process outlived the abort"
    finally:
        # The documented trade-off: remote commands may survive an abort. Clean them up.
        for node in nodes:
            _kill_on_node(sandbox, node, probe)


def _cmdlines(box: Sandbox, node: SandboxNode) -> list[str]:
    """Every command line on the node (from a script file, so the scan never lists itself)."""
    out = box.run_on(
        node, "for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline 2>/dev/null; echo; done"
    ).stdout
    return [x for x in out.splitlines() if x.strip()]


# ----------------------------------------------------------------------------- MaxStartups


def _one_sshd_many_names(
    make_sandbox: Callable[[str], Sandbox], tmp_path: Path, names: int, max_startups: str
) -> tuple[Sandbox, SandboxNode, FleetResult, float]:
    """`names` inventory hosts that are all the same node, connected at once (-f names)."""
    box = _throwaway(make_sandbox, 1, max_startups=max_startups)
    node = box.nodes()[0]
    setting = (node.node_dir / "sshd_config").read_text()
    assert f"MaxStartups {max_startups}\n" in setting
    inventory = _inventory(
        tmp_path / "inv.yaml",
        {f"alias{i:02d}": (node.address, None) for i in range(1, names + 1)},
        box.key_path,
    )
    started = time.monotonic()
    result = run_fleet(
        box,
        "exec",
        "true",
        "--json",
        "--forks",
        str(names),
        inventory=inventory,
        log_dir=tmp_path / "logs",
        timeout_s=120,
    )
    return box, node, result, time.monotonic() - started


def _drops_logged(node: SandboxNode) -> int:
    log = (node.node_dir / "sshd.log").read_text(errors="replace")
    return log.count("past MaxStartups")


def test_maxstartups_drops_are_retried_until_every_host_is_in(
    make_sandbox: Callable[[str], Sandbox], tmp_path: Path
) -> None:
    # OpenSSH's default (10:30:100): beyond 10 unauthenticated connections sshd drops 30% of
    # new ones, rising to all at 100. 48 handshakes at once to one sshd: some are dropped.
    _, node, result, elapsed = _one_sshd_many_names(make_sandbox, tmp_path, 48, "10:30:100")

    assert result.code == 0, result.stdout + result.stderr
    assert {r["outcome"] for r in _hosts(result).values()} == {"ok"}
    retried = {h: a for h, a in _attempts(result).items() if max(a) > 1}
    assert retried, "no handshake was dropped: the test did not provoke MaxStartups"
    assert _drops_logged(node) > 0
    assert elapsed <= 60


def test_maxstartups_beyond_the_retry_budget_is_named_precisely(
    make_sandbox: Callable[[str], Sandbox], tmp_path: Path
) -> None:
    # 2:100:2: sshd drops every handshake while two are pending. 24 at once outrun fleet's 4
    # jittered attempts (~2 s of backoff) on some runs and not others; either way each host is
    # ok or named as a dropped handshake after the whole budget, and the exit code agrees.
    _, node, result, elapsed = _one_sshd_many_names(make_sandbox, tmp_path, 24, "2:100:2")

    hosts = _hosts(result)
    attempts = _attempts(result)
    assert any(max(a) > 1 for a in attempts.values()), "no handshake was dropped"
    assert _drops_logged(node) > 0
    lost = {h: r for h, r in hosts.items() if r["outcome"] != "ok"}
    for name, row in lost.items():
        assert (row["outcome"], row["reason"]) == (
            "unreachable",
            "connection closed during handshake",
        ), row
        assert row["last_line"].endswith(f"(after {DEFAULTS.connect_attempts} attempts)"), row
        assert attempts[name] == list(range(1, DEFAULTS.connect_attempts + 1))
    assert result.code == (4 if lost else 0), result.stdout + result.stderr
    assert elapsed <= 60


# ------------------------------------------------------------------------ step dies of a signal


@pytest.mark.parametrize("timeout", ["0", "60"], ids=["no-step-timeout", "step-timeout"])
@pytest.mark.parametrize(
    ("step", "died_of"),
    [
        ("kill -KILL $$", "SIGKILL"),
        ("exec python3 -c 'import os; os.abort()'", "SIGABRT"),
    ],
    ids=["kill-9-self", "abort"],
)
def test_a_step_that_dies_of_a_signal_is_a_failed_step_not_a_lost_node(
    sandbox: Sandbox, tmp_path: Path, step: str, died_of: str, timeout: str
) -> None:
    node = sandbox.nodes()[0]
    args = ["exec", step, "--timeout", timeout, "--limit", node.name, "--json"]
    result = run_fleet(sandbox, *args, log_dir=tmp_path)

    assert result.code == 3, result.stdout + result.stderr
    row = _hosts(result)[node.name]
    assert row["outcome"] == "failed", row
    assert row["reason"].startswith(f"killed by {died_of}"), row
    assert row["failed_step"] == "exec"


def test_a_step_killed_from_outside_like_the_oom_killer_is_a_failed_step(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    node = sandbox.nodes()[1]
    probe = f"fleet-oom-{os.getpid()}"
    step = f"exec bash -c 'exec -a {probe} sleep 300'"
    with live_run(sandbox, "exec", step, "--json", "--limit", node.name, log_dir=tmp_path) as run:
        run.wait_for(_step_started(node.name), 30)
        _poll(lambda: bool(_pids(sandbox, node, probe)), 15, "the step to run")
        _kill_on_node(sandbox, node, probe)  # SIGKILL by pid, as the OOM killer does
        result = run.finish(timeout_s=30)

    assert result.code == 3, result.stdout + result.stderr
    row = _hosts(result)[node.name]
    assert (row["outcome"], row["reason"]) == ("failed", "killed by SIGKILL"), row


def test_a_step_that_ignores_term_past_its_timeout_is_timed_out_not_a_lost_node(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """`timeout` sends TERM at the deadline, and KILL (to its whole group, itself included)
    KILL_AFTER_S later: its own death by KILL is the step timing out."""
    node = sandbox.nodes()[2]
    probe = f"fleet-stubborn-{os.getpid()}"
    step = f"trap '' TERM; exec bash -c 'exec -a {probe} sleep 300'"
    args = ["exec", step, "--timeout", "1", "--limit", node.name, "--json"]
    try:
        result = run_fleet(sandbox, *args, log_dir=tmp_path)

        assert result.code == 4, result.stdout + result.stderr
        row = _hosts(result)[node.name]
        assert row["outcome"] == "timed_out", row
        assert row["reason"] == "step timed out after 1s; remote command killed", row
        _poll(lambda: not _pids(sandbox, node, probe), 15, "the stubborn step to be gone")
    finally:
        _kill_on_node(sandbox, node, probe)
