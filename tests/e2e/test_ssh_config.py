"""The ssh config is honoured or refused, never ignored: ProxyCommand, multi-hop ProxyJump, Include,
-F /dev/null and HostKeyAlias against real sshd nodes; refusals and bad identity files stop the
run before a single connection (each node's sshd log says whether one was made).

The two-hop test makes the last node reachable only from the second hop (an iptables rule inside
that node's own network namespace), so a chain that skips a hop cannot pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, poll, run_fleet

pytestmark = pytest.mark.root

SECRET = "Hs1kT0pSecr3tHashValue"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _common(sandbox: Any) -> str:
    """The options every Host block needs to reach a sandbox node as root, strictly."""
    return (
        "    User root\n"
        f"    IdentityFile {sandbox.key_path}\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {sandbox.known_hosts_path}\n"
        "    GlobalKnownHostsFile /dev/null\n"
        "    StrictHostKeyChecking yes\n"
        "    BatchMode yes\n"
        "    ConnectTimeout 10\n"
    )


def _log(node: Any) -> str:
    return (node.node_dir / "sshd.log").read_text(errors="replace")


class SshdLogs:
    """What each node's sshd logged after the test started."""

    def __init__(self, nodes: list[Any]) -> None:
        self.nodes = nodes
        self.start = {n.name: len(_log(n)) for n in nodes}

    def new(self, node: Any) -> str:
        return _log(node)[self.start[node.name] :]

    def logins(self, node: Any) -> list[str]:
        """Source addresses of the accepted logins."""
        return re.findall(r"Accepted publickey for \S+ from (\S+) port", self.new(node))

    def connections(self) -> int:
        """TCP connections any node's sshd saw (sshd logs each one at VERBOSE)."""
        return sum(len(re.findall(r"Connection from ", self.new(n))) for n in self.nodes)


@pytest.fixture
def logs(sandbox: Any) -> SshdLogs:
    return SshdLogs(sandbox.nodes())


def _printed(result: FleetResult) -> dict[str, str]:
    return {
        e["host"]: e["line"]
        for e in result.json_lines()
        if e["event"] == "OutputLine" and e["stream"] == "stdout"
    }


def _exec(sandbox: Any, tmp_path: Path, *args: str, **kw: Any) -> FleetResult:
    return run_fleet(sandbox, "exec", "hostname", "--json", *args, log_dir=tmp_path / "logs", **kw)


def _fails_before_connecting(result: FleetResult, logs: SshdLogs, *words: str) -> str:
    """Exit 1, one `fleet: error:` line plus a hint, and no node saw a connection."""
    assert result.code == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("fleet: error: ")
    assert lines[1].startswith("  hint: ")
    for word in words:
        assert word in lines[0], lines[0]
    assert logs.connections() == 0
    return lines[0]


# ---------------------------------------------------------------- ProxyCommand


def test_proxy_command_reaches_every_node_through_it(
    sandbox: Any, logs: SshdLogs, tmp_path: Path
) -> None:
    """It was silently ignored: fleet connected directly."""
    nodes = sandbox.nodes()
    jump, others = nodes[0], nodes[1:]
    plain = _write(
        tmp_path / "openssh_config",
        f"Host jump\n    HostName {jump.address}\n" + _common(sandbox),
    )
    config = _write(
        tmp_path / "ssh_config",
        f"Host {' '.join(n.address for n in others)}\n"
        f"    ProxyCommand ssh -F {plain} -W %h:%p jump\n"
        "Host *\n" + _common(sandbox),
    )

    result = _exec(sandbox, tmp_path, ssh_config=config)

    assert result.code == 0, result.stdout + result.stderr
    assert _printed(result) == {n.name: n.name for n in nodes}
    assert poll(lambda: all(logs.logins(n) for n in nodes), timeout_s=10)
    for node in others:
        assert logs.logins(node) == [jump.address], f"{node.name} was reached directly"
    # The jump node itself: its own session, plus one `ssh -W` login per proxied node.
    assert len(logs.logins(jump)) >= 1 + len(others)
    assert jump.address not in logs.logins(jump)


def test_a_proxy_command_that_cannot_run_is_reported_as_such(
    sandbox: Any, logs: SshdLogs, tmp_path: Path
) -> None:
    node = sandbox.nodes()[1]
    config = _write(
        tmp_path / "ssh_config",
        "Host *\n    ProxyCommand /nonexistent/fleet-proxy %h %p\n" + _common(sandbox),
    )

    result = _exec(sandbox, tmp_path, "-l", node.name, ssh_config=config)

    assert result.code == 4, result.stdout + result.stderr
    row = result.final()["hosts"][node.name]
    assert (row["outcome"], row["reason"]) == ("unreachable", "proxy command failed"), row
    assert row["last_line"].startswith("exit status 127: "), row
    assert "(after" not in row["last_line"]  # a command that does not exist is not retried
    assert logs.connections() == 0


# ---------------------------------------------------------------- multi-hop ProxyJump


@pytest.fixture
def only_via(sandbox: Any) -> Iterator[Callable[[Any, Any], None]]:
    """only_via(node, hop): the node's sshd port accepts connections from `hop` only (an
    iptables rule in the node's own network namespace); removed after the test."""
    rules: list[tuple[Any, str]] = []

    def isolate(node: Any, hop: Any) -> None:
        rule = f"INPUT -p tcp --dport 22 ! -s {hop.address} -j REJECT"
        done = sandbox.run_on(node, f"iptables -A {rule}")
        if done.returncode != 0:
            pytest.fail(f"iptables in {node.name}'s namespace failed: {done.stderr}")
        rules.append((node, rule))

    try:
        yield isolate
    finally:
        for node, rule in rules:
            sandbox.run_on(node, f"iptables -D {rule}")


def test_two_hop_proxyjump_goes_through_each_hop_with_its_own_config(
    sandbox: Any, logs: SshdLogs, tmp_path: Path, only_via: Callable[[Any, Any], None]
) -> None:
    """`ProxyJump a,b` used only `a`. The last node here accepts connections from `b` only."""
    hop1, hop2, _, final = sandbox.nodes()
    only_via(final, hop2)
    config = _write(
        tmp_path / "ssh_config",
        f"Host {final.address}\n    ProxyJump first-hop,second-hop\n"
        # Each hop's address comes from its own block: a hop read without its config fails.
        f"Host first-hop\n    HostName {hop1.address}\n"
        f"Host second-hop\n    HostName {hop2.address}\n"
        "Host *\n" + _common(sandbox),
    )
    direct = _exec(sandbox, tmp_path, "-l", final.name)  # the sandbox's own config: no jump
    assert direct.code == 4, "the isolation did not hold: the node answers directly"
    logs = SshdLogs(sandbox.nodes())

    result = _exec(sandbox, tmp_path, "-l", final.name, ssh_config=config)

    assert result.code == 0, result.stdout + result.stderr
    assert _printed(result) == {final.name: final.name}
    assert poll(lambda: all(logs.logins(n) for n in (hop1, hop2, final)), timeout_s=10)
    assert logs.logins(final) == [hop2.address]  # the last hop came from the second
    assert logs.logins(hop2) == [hop1.address]  # the second hop was reached via the first
    assert len(logs.logins(hop1)) == 1  # the first, directly from this machine
    assert hop1.address not in logs.logins(hop1)


# ---------------------------------------------------------------- Include and -F /dev/null


def test_include_is_honoured_relative_to_dot_ssh(sandbox: Any, tmp_path: Path) -> None:
    """Include was ignored: the included known_hosts and options never applied."""
    home = tmp_path / "home"
    _write(home / ".ssh" / "fleet.d" / "50-sandbox.conf", sandbox.ssh_config_path.read_text())
    config = _write(tmp_path / "ssh_config", "# fleet's own config\nInclude fleet.d/*.conf\n")

    result = _exec(sandbox, tmp_path, ssh_config=config, extra_env={"HOME": str(home)})

    assert result.code == 0, result.stdout + result.stderr
    assert _printed(result) == {n.name: n.name for n in sandbox.nodes()}


def test_dash_F_dev_null_reads_no_config(sandbox: Any, tmp_path: Path) -> None:
    """OpenSSH's "no config" was refused as "ssh config not found"."""
    home = tmp_path / "home"
    _write(home / ".ssh" / "known_hosts", sandbox.known_hosts_path.read_text())
    # A default config that would break every connection, to show it is not read.
    _write(home / ".ssh" / "config", "Host *\n    Port 1\n")
    env = {"HOME": str(home), "FLEET_SSH_CONFIG": ""}

    result = _exec(sandbox, tmp_path, "-F", "/dev/null", extra_env=env)

    assert result.code == 0, result.stdout + result.stderr
    assert _printed(result) == {n.name: n.name for n in sandbox.nodes()}


def test_host_key_alias_names_the_known_hosts_entry(sandbox: Any, tmp_path: Path) -> None:
    """Keys recorded under an alias (as `ssh -o HostKeyAlias=...` records them) are found."""
    nodes = sandbox.nodes()
    entries = dict(line.split(" ", 1) for line in sandbox.known_hosts_path.read_text().splitlines())
    known = _write(
        tmp_path / "known_hosts", "".join(f"alias-{n.name} {entries[n.address]}\n" for n in nodes)
    )
    config = _write(
        tmp_path / "ssh_config",
        "".join(f"Host {n.address}\n    HostKeyAlias alias-{n.name}\n" for n in nodes)
        + "Host *\n"
        + _common(sandbox).replace(str(sandbox.known_hosts_path), str(known)),
    )

    result = _exec(sandbox, tmp_path, ssh_config=config)

    assert result.code == 0, result.stdout + result.stderr
    assert _printed(result) == {n.name: n.name for n in nodes}


# ---------------------------------------------------------------- refused before connecting


def test_an_option_fleet_cannot_honour_stops_the_run_before_connecting(
    sandbox: Any, logs: SshdLogs, tmp_path: Path
) -> None:
    config = _write(
        tmp_path / "ssh_config",
        "Host *\n" + _common(sandbox) + "    ProxyUseFdpass yes\n",
    )
    line = _fails_before_connecting(
        _exec(sandbox, tmp_path, ssh_config=config), logs, f"{config}:10: ProxyUseFdpass"
    )
    assert "fleet cannot honour it" in line


def test_dash_F_at_a_file_that_is_not_a_config_never_echoes_it(
    sandbox: Any, logs: SshdLogs, tmp_path: Path
) -> None:
    shadow = _write(tmp_path / "shadow", f"root:$y$j9T${SECRET}:19700:0:99999:7:::\n")
    result = _exec(sandbox, tmp_path, ssh_config=shadow)
    _fails_before_connecting(result, logs, f"{shadow}:1: not an ssh_config line")
    assert SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize("kind", ["not-a-key", "missing"])
def test_an_unusable_identity_file_stops_the_run_before_connecting(
    sandbox: Any, logs: SshdLogs, tmp_path: Path, kind: str
) -> None:
    """A non-key was retried 6 times per host as "connection closed during handshake"; a
    missing one was `ssh error: FileNotFoundError` per host."""
    key = tmp_path / "id_fake"
    if kind == "not-a-key":
        _write(key, f"root:$y$j9T${SECRET}:19700:0:99999:7:::\n")
    inventory = _write(
        tmp_path / "inventory.yaml",
        sandbox.inventory_path.read_text().replace(str(sandbox.key_path), str(key)),
    )
    assert str(key) in inventory.read_text()
    problem = "not a private key" if kind == "not-a-key" else "no such file"

    result = _exec(sandbox, tmp_path, inventory=inventory)

    _fails_before_connecting(result, logs, f"identity file {key} (used by node[01-04]): {problem}")
    assert SECRET not in result.stdout + result.stderr
