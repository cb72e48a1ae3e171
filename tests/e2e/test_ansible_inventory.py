"""An Ansible repository's inventory drives real runs unchanged: an INI inventory whose connection
settings live in group_vars/ and host_vars/ (address, key, user), a ProxyJump given the Ansible
way (`ansible_ssh_common_args: -o ProxyJump=...`), Ansible's `a:!b` pattern; and a sudo
password in group_vars is refused before any connection, its value nowhere in what fleet prints
or records.

The ssh config here names no identity file and no user for the nodes: a node is reached only if
fleet took them from the inventory's vars files. Each node's sshd log says who connected from
where, so a ProxyJump that was ignored (a direct connection) cannot pass.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, poll, run_fleet

pytestmark = pytest.mark.root

SECRET = "Hs1kT0pSudoPassw0rd-in-group_vars"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _log(node: Any) -> str:
    return (node.node_dir / "sshd.log").read_text(errors="replace")


class SshdLogs:
    """What each node's sshd logged after the test started."""

    def __init__(self, nodes: list[Any]) -> None:
        self.start = {n.name: len(_log(n)) for n in nodes}
        self.nodes = nodes

    def logins(self, node: Any) -> list[str]:
        """Source addresses of the logins accepted since the start."""
        new = _log(node)[self.start[node.name] :]
        return re.findall(r"Accepted publickey for \S+ from (\S+) port", new)

    def connections(self) -> int:
        return sum(_log(n)[self.start[n.name] :].count("Connection from ") for n in self.nodes)


def _repo(tmp_path: Path, sandbox: Any) -> tuple[Path, Path, list[Any]]:
    """An Ansible-style repo: inventories/prod/hosts (INI) with group_vars/ and host_vars/, and an
    ssh config that only checks host keys (the jump node's own key file is its only identity)."""
    nodes = sandbox.nodes()
    jump = nodes[0]
    names = [f"train-{i}" for i in range(1, len(nodes) + 1)]
    inv = tmp_path / "repo" / "inventories" / "prod"
    _write(
        inv / "hosts",
        "# the jump node, then the nodes behind it\n"
        f"{names[0]}\n\n[proxied]\n" + "".join(f"{n}\n" for n in names[1:]) + "\n"
        "[gpu:children]\nproxied\n\n[gpu:vars]\ngpus=8\n",
    )
    _write(
        inv / "group_vars" / "all.yml",
        f"ansible_user: root\nansible_ssh_private_key_file: {sandbox.key_path}\n",
    )
    _write(
        inv / "group_vars" / "proxied.yml",
        f"ansible_ssh_common_args: '-o ProxyJump=root@{jump.address}'\n",
    )
    for name, node in zip(names, nodes, strict=True):
        _write(inv / "host_vars" / f"{name}.yml", f"ansible_host: {node.address}\n")
    config = _write(
        tmp_path / "ssh_config",
        f"Host {jump.address}\n    IdentityFile {sandbox.key_path}\n"
        "Host *\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {sandbox.known_hosts_path}\n"
        "    GlobalKnownHostsFile /dev/null\n"
        "    StrictHostKeyChecking yes\n"
        "    BatchMode yes\n",
    )
    return inv / "hosts", config, nodes


def _exec(sandbox: Any, tmp_path: Path, inv: Path, config: Path, *args: str) -> FleetResult:
    return run_fleet(
        sandbox,
        "exec",
        "hostname",
        "--json",
        "--playbook-dir",
        str(tmp_path / "repo"),
        *args,
        log_dir=tmp_path / "logs",
        inventory=inv,
        ssh_config=config,
        extra_env={"SSH_AUTH_SOCK": ""},
    )


def test_group_vars_host_vars_and_an_ansible_proxyjump_reach_every_node(
    sandbox: Any, tmp_path: Path
) -> None:
    inv, config, nodes = _repo(tmp_path, sandbox)
    logs = SshdLogs(nodes)

    result = _exec(sandbox, tmp_path, inv, config)

    assert result.code == 0, result.stdout + result.stderr
    printed = {
        e["host"]: e["line"]
        for e in result.json_lines()
        if e["event"] == "OutputLine" and e["stream"] == "stdout"
    }
    assert printed == {f"train-{i}": n.name for i, n in enumerate(nodes, 1)}
    jump, behind = nodes[0], nodes[1:]
    assert poll(lambda: all(logs.logins(n) for n in nodes), timeout_s=10)
    for node in behind:
        assert set(logs.logins(node)) == {jump.address}, f"{node.name} was reached directly"
    assert jump.address not in logs.logins(jump)  # train-1 itself was reached directly


def test_ansible_pattern_syntax_selects_the_hosts_that_run(sandbox: Any, tmp_path: Path) -> None:
    inv, config, nodes = _repo(tmp_path, sandbox)

    result = _exec(sandbox, tmp_path, inv, config, "-l", "gpu:!train-3")

    assert result.code == 0, result.stdout + result.stderr
    ran = set(result.final()["hosts"])
    assert ran == {f"train-{i}" for i in range(2, len(nodes) + 1)} - {"train-3"}


def test_a_sudo_password_in_group_vars_is_refused_and_never_shown(
    sandbox: Any, tmp_path: Path
) -> None:
    inv, config, nodes = _repo(tmp_path, sandbox)
    vault = _write(
        inv.parent / "group_vars" / "gpu" / "secrets.yml",
        f"ansible_become_password: {SECRET}\n",
    )
    logs = SshdLogs(nodes)

    for args in (("exec", "hostname"), ("cleanup", "--yes"), ("hosts",), ("exec", "id", "-n")):
        result = run_fleet(
            sandbox,
            *args,
            "--playbook-dir",
            str(tmp_path / "repo"),
            log_dir=tmp_path / "logs",
            inventory=inv,
            ssh_config=config,
        )
        assert result.code == 1, result.stdout + result.stderr
        assert result.stderr.startswith(f"fleet: error: {vault}:1: ansible_become_password: ")
        assert "-K" in result.stderr
        assert SECRET not in result.stdout + result.stderr
    assert logs.connections() == 0
    # The first node is not in `gpu`: a run that leaves the password's hosts out goes ahead.
    ok = _exec(sandbox, tmp_path, inv, config, "-l", "ungrouped")
    assert ok.code == 0, ok.stdout + ok.stderr
    records = tmp_path / "logs"
    for path in records.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
