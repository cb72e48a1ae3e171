"""SSH trust as OpenSSH does it, against real sshd nodes: known_hosts markers (`@revoked` honoured,
`@cert-authority` host certificates), user certificates, `IdentitiesOnly` against a real
ssh-agent, and an Ansible inventory's strict `ansible_ssh_common_args`.

Certificates need an sshd configured for them: a second sshd inside a node, on port 2222, with
`HostCertificate` (its host key signed by a CA made here with ssh-keygen) and `TrustedUserCAKeys`.
It is started for the test and stopped by its pid; the node's own sshd on port 22 is untouched.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, poll, run_fleet

from fleet.sandbox.host import SSHD

pytestmark = pytest.mark.root

CERT_PORT = 2222


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _keygen(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def _sign(ca: Path, pub: Path, *args: str) -> Path:
    """ssh-keygen -s CA ...: the certificate beside `pub` (KEY-cert.pub)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-s", str(ca), "-I", "fleet-test", *args, str(pub)],
        check=True,
        capture_output=True,
    )
    return Path(str(pub).removesuffix(".pub") + "-cert.pub")


def _pub(path: Path) -> str:
    return Path(f"{path}.pub").read_text().strip()


def _host_key_line(node: Any) -> str:
    """`ssh-ed25519 AAAA...` of the node's real host key."""
    return " ".join((node.node_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2])


def _config(sandbox: Any, tmp_path: Path, known: Path, extra: str = "") -> Path:
    return _write(
        tmp_path / "ssh_config",
        "Host *\n"
        "    User root\n"
        f"    IdentityFile {sandbox.key_path}\n"
        f"    UserKnownHostsFile {known}\n"
        "    GlobalKnownHostsFile /dev/null\n"
        "    StrictHostKeyChecking yes\n"
        "    ConnectTimeout 10\n" + extra,
    )


def _inventory(tmp_path: Path, nodes: list[Any], port: int = 22, extra: str = "") -> Path:
    hosts = "".join(
        f"    {n.name}:\n      ansible_host: {n.address}\n      ansible_port: {port}\n"
        for n in nodes
    )
    return _write(tmp_path / "inventory.yaml", f"all:\n  vars:\n{extra}  hosts:\n{hosts}")


def _exec(sandbox: Any, tmp_path: Path, **kw: Any) -> FleetResult:
    return run_fleet(sandbox, "exec", "hostname", "--json", log_dir=tmp_path / "logs", **kw)


def _hosts(result: FleetResult) -> dict[str, dict[str, Any]]:
    return dict(result.final()["hosts"])


# ---------------------------------------------------------------- known_hosts markers


def test_a_revoked_host_key_is_refused_even_though_it_is_listed(
    sandbox: Any, tmp_path: Path
) -> None:
    node, other = sandbox.nodes()[:2]
    known = _write(
        tmp_path / "known_hosts",
        sandbox.known_hosts_path.read_text() + f"@revoked * {_host_key_line(node)}\n",
    )
    inventory = _inventory(tmp_path, [node, other])
    result = _exec(
        sandbox, tmp_path, inventory=inventory, ssh_config=_config(sandbox, tmp_path, known)
    )

    assert result.code == 4, result.stdout + result.stderr
    hosts = _hosts(result)
    assert hosts[node.name]["reason"] == "host key revoked"
    assert "@revoked" in hosts[node.name]["last_line"]
    assert hosts[other.name]["outcome"] == "ok"


def test_an_unrelated_cert_authority_line_does_not_stop_fleet(sandbox: Any, tmp_path: Path) -> None:
    """It did: paramiko read `@cert-authority` as a host name, and fleet refused the file."""
    node = sandbox.nodes()[0]
    ca = _keygen(tmp_path / "unrelated-ca")
    known = _write(
        tmp_path / "known_hosts",
        f"@cert-authority *.unrelated.example {_pub(ca)}\n" + sandbox.known_hosts_path.read_text(),
    )
    inventory = _inventory(tmp_path, [node])
    result = _exec(
        sandbox, tmp_path, inventory=inventory, ssh_config=_config(sandbox, tmp_path, known)
    )
    assert result.code == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- certificates


@dataclass(frozen=True)
class CertNode:
    """A node's second sshd (port 2222) with a host certificate and a trusted user CA."""

    node: Any
    host_ca: Path
    user_ca: Path


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def cert_node(sandbox: Any, tmp_path: Path) -> Iterator[CertNode]:
    node = sandbox.nodes()[2]
    host_ca = _keygen(tmp_path / "host-ca")
    user_ca = _keygen(tmp_path / "user-ca")
    pub = _write(tmp_path / "host_key.pub", _host_key_line(node) + "\n")
    cert = _sign(host_ca, pub, "-h", "-n", f"{node.address},{node.name}")
    inner = "/run/fleet"
    files = {
        "test-host-cert.pub": cert.read_text(),
        "test-user-ca.pub": _pub(user_ca) + "\n",
        "test-cert-sshd_config": f"""\
ListenAddress {node.address}:{CERT_PORT}
HostKey {inner}/ssh_host_ed25519_key
HostCertificate {inner}/test-host-cert.pub
TrustedUserCAKeys {inner}/test-user-ca.pub
AuthorizedKeysFile {inner}/authorized_keys
PidFile {inner}/test-cert-sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
LogLevel VERBOSE
""",
    }
    for name, text in files.items():
        _write(node.node_dir / name, text)
    done = sandbox.run_on(
        node, f"{SSHD} -f {inner}/test-cert-sshd_config -E {inner}/test-cert-sshd.log"
    )
    assert done.returncode == 0, done.stderr
    pidfile = node.node_dir / "test-cert-sshd.pid"
    try:
        assert poll(lambda: _listening(node.address, CERT_PORT), timeout_s=20)
        yield CertNode(node, host_ca, user_ca)
    finally:
        if pidfile.exists():
            sandbox.run_on(node, f"kill -TERM {int(pidfile.read_text())}")
        poll(lambda: not _listening(node.address, CERT_PORT), timeout_s=15)
        for name in (*files, "test-cert-sshd.log", "test-cert-sshd.pid"):
            (node.node_dir / name).unlink(missing_ok=True)


def test_a_host_certificate_from_the_listed_ca_is_trusted(
    sandbox: Any, cert_node: CertNode, tmp_path: Path
) -> None:
    node = cert_node.node
    known = _write(
        tmp_path / "known_hosts",
        f"@cert-authority [{node.address}]:{CERT_PORT},10.9.9.9 {_pub(cert_node.host_ca)}\n",
    )
    inventory = _inventory(tmp_path, [node], port=CERT_PORT)
    result = _exec(
        sandbox, tmp_path, inventory=inventory, ssh_config=_config(sandbox, tmp_path, known)
    )
    assert result.code == 0, result.stdout + result.stderr

    # The same CA, but only for other hosts: not trusted for this one.
    _write(known, f"@cert-authority [10.9.9.9]:{CERT_PORT} {_pub(cert_node.host_ca)}\n")
    result = _exec(
        sandbox, tmp_path, inventory=inventory, ssh_config=_config(sandbox, tmp_path, known)
    )
    assert result.code == 4
    assert _hosts(result)[node.name]["reason"] == "host key unknown"


def test_a_host_certificate_for_another_name_is_rejected(
    sandbox: Any, cert_node: CertNode, tmp_path: Path
) -> None:
    """The certificate names the node's address; reached by an alias (HostKeyAlias), the name
    it must be issued to is the alias, which it does not name."""
    node = cert_node.node
    known = _write(tmp_path / "known_hosts", f"@cert-authority * {_pub(cert_node.host_ca)}\n")
    inventory = _inventory(tmp_path, [node], port=CERT_PORT)
    config = _config(sandbox, tmp_path, known, "    HostKeyAlias elsewhere.example\n")
    result = _exec(sandbox, tmp_path, inventory=inventory, ssh_config=config)
    assert result.code == 4, result.stdout + result.stderr
    host = _hosts(result)[node.name]
    assert host["reason"] == "host certificate rejected"
    assert "not issued for elsewhere.example" in host["last_line"]


def test_a_user_certificate_logs_in_beside_the_key_or_as_certificate_file(
    sandbox: Any, cert_node: CertNode, tmp_path: Path
) -> None:
    node = cert_node.node
    known = _write(tmp_path / "known_hosts", f"@cert-authority * {_pub(cert_node.host_ca)}\n")
    inventory = _inventory(tmp_path, [node], port=CERT_PORT)
    user_key = _keygen(tmp_path / "user" / "id_ed25519")  # not in the node's authorized_keys
    no_cert = (
        _config(sandbox, tmp_path, known).read_text().replace(str(sandbox.key_path), str(user_key))
    )
    config = _write(tmp_path / "ssh_config", no_cert)
    refused = _exec(sandbox, tmp_path, inventory=inventory, ssh_config=config)
    assert refused.code == 4
    assert _hosts(refused)[node.name]["reason"] == "authentication failed"

    # The certificate beside the key (KEY-cert.pub), as ssh finds it.
    cert = _sign(cert_node.user_ca, Path(f"{user_key}.pub"), "-n", "root")
    beside = _exec(sandbox, tmp_path, inventory=inventory, ssh_config=config)
    assert beside.code == 0, beside.stdout + beside.stderr

    # Elsewhere, named by CertificateFile.
    moved = tmp_path / "certs" / "mine-cert.pub"
    moved.parent.mkdir()
    cert.rename(moved)
    with_file = _write(tmp_path / "ssh_config2", no_cert + f"    CertificateFile {moved}\n")
    named = _exec(sandbox, tmp_path, inventory=inventory, ssh_config=with_file)
    assert named.code == 0, named.stdout + named.stderr


# ---------------------------------------------------------------- IdentitiesOnly


@pytest.fixture
def agent(sandbox: Any, tmp_path: Path) -> Iterator[str]:
    """A real ssh-agent (started here, killed by its pid) holding the key every node accepts."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(sock)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert poll(sock.exists, timeout_s=10)
        added = subprocess.run(
            ["ssh-add", str(sandbox.key_path)],
            env={**os.environ, "SSH_AUTH_SOCK": str(sock)},
            capture_output=True,
            check=False,
        )
        assert added.returncode == 0, added.stderr
        yield str(sock)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def test_identities_only_keeps_the_agents_other_keys_out_as_ssh_does(
    sandbox: Any, agent: str, tmp_path: Path
) -> None:
    node = sandbox.nodes()[0]
    unaccepted = _keygen(tmp_path / "not-authorized")
    known = sandbox.known_hosts_path
    base = (
        _config(sandbox, tmp_path, known)
        .read_text()
        .replace(str(sandbox.key_path), str(unaccepted))
    )
    env = {"SSH_AUTH_SOCK": agent}
    inventory = _inventory(tmp_path, [node])

    for identities_only, code in (("yes", 4), ("no", 0)):
        config = _write(
            tmp_path / f"config-{identities_only}",
            base + f"    BatchMode yes\n    IdentitiesOnly {identities_only}\n",
        )
        ssh = subprocess.run(
            ["ssh", "-F", str(config), node.address, "true"],
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
            check=False,
        )
        result = run_fleet(
            sandbox,
            "exec",
            "true",
            "--json",
            inventory=inventory,
            ssh_config=config,
            log_dir=tmp_path / f"logs-{identities_only}",
            extra_env=env,
        )
        assert (ssh.returncode == 0) == (code == 0), ssh.stderr
        assert result.code == code, result.stdout + result.stderr
        if code:
            assert _hosts(result)[node.name]["reason"] == "authentication failed"


# ---------------------------------------------------------------- ansible_ssh_common_args


def test_strict_ansible_ssh_common_args_are_honoured(sandbox: Any, tmp_path: Path) -> None:
    """An inventory that works with `ansible`: every option in it is one fleet honours in an
    ssh config, so it is honoured here too (it was refused whole)."""
    nodes = sandbox.nodes()[:2]
    empty = _write(tmp_path / "empty_known_hosts", "")

    def run(known: Path, name: str) -> FleetResult:
        args = (
            f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes "
            f"-o IdentitiesOnly=yes -o 'ConnectTimeout 10' -i {sandbox.key_path} -l root"
        )
        inventory = _inventory(
            tmp_path / name, nodes, extra=f'    ansible_ssh_common_args: "{args}"\n'
        )
        return _exec(sandbox, tmp_path / name, inventory=inventory, ssh_config=Path("/dev/null"))

    ok = run(sandbox.known_hosts_path, "a")
    assert ok.code == 0, ok.stdout + ok.stderr
    # The known_hosts named there is the one used: an empty one knows no node.
    unknown = run(empty, "b")
    assert unknown.code == 4, unknown.stdout + unknown.stderr
    assert {h["reason"] for h in _hosts(unknown).values()} == {"host key unknown"}
