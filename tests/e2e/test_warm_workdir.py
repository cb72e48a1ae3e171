"""A keeper of warm connections leaves the directory its command was started in (chdir /), and
what the command named relative to that directory still means the same to it
(fleet/ssh/workdir.py), against real sshd nodes.

Every way a keeper comes to be is checked: forked at the end of a small first command, a first
command's worker that stays on, forked before a run that finds another keeper running, and a
fresh `python -m fleet.ssh.keeper` (spawned after a typed secret). Each test stops the keepers it
started (tests/e2e/test_warm.py's Warm: `fleet disconnect`, then SIGTERM by pid).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, FleetResult, fleet_code, fleet_env, keeper_pids
from test_warm import Warm, _alive, _connected

from fleet.inventory.loader import load_inventory
from fleet.ssh.warm import shard_of

pytestmark = pytest.mark.root


@pytest.fixture
def warm(sandbox: Any, tmp_path: Path) -> Iterator[Warm]:
    world = Warm(sandbox, tmp_path)
    try:
        yield world
    finally:
        world.stop()


def _mounted(path: Path) -> bool:
    """Something is mounted on `path` (this process's mount namespace)."""
    wanted = str(path)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == wanted:
            return True
    return False


@contextlib.contextmanager
def _tmpfs(path: Path) -> Iterator[Path]:
    """A fresh tmpfs on `path`, taken away at the end if the test did not (lazily, should a
    process still be in it: the test has failed then)."""
    path.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "fleet-workdir", str(path)], check=True
    )
    try:
        yield path
    finally:
        if _mounted(path):
            subprocess.run(["umount", "-l", str(path)], check=False)


def _cwd(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/cwd")


def _spawned(warm: Warm, cwd: Path, *args: str, env: dict[str, str]) -> FleetResult:
    """fleet with a typed secret (--ask-key-pass, read from stdin: no terminal, a session of its
    own), so that its keepers are spawned, never forked."""
    environment = fleet_code(fleet_env(warm.sandbox, warm.tmp / "spawned", **warm.env(), **env))
    proc = subprocess.run(
        [*FLEET, *args, "--ask-key-pass"],
        input="not-needed\n",
        capture_output=True,
        text=True,
        env=environment,
        cwd=cwd,
        timeout=180,
        check=False,
        start_new_session=True,
    )
    return FleetResult(proc.returncode, proc.stdout, proc.stderr)


def _workers(result: FleetResult) -> list[dict[str, Any]]:
    summary = json.loads((Path(result.final()["run_dir"]) / "summary.json").read_text())
    workers: list[dict[str, Any]] = summary.get("workers", [])
    return workers


def _argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _alone_in_its_shard(sandbox: Any, shards: int) -> str:
    """A host of the sandbox's inventory that some other host does not share a keeper with."""
    hosts = load_inventory(sandbox.inventory_path).hosts
    for host in hosts:
        if any(shard_of(o, shards) != shard_of(host, shards) for o in hosts):
            return host.name
    pytest.fail(f"every host in one keeper shard of {shards}")


@pytest.mark.parametrize("how", ["forked-at-end", "worker", "forked-ahead", "spawned"])
def test_a_keeper_leaves_the_commands_directory_so_its_filesystem_can_be_unmounted(
    warm: Warm, tmp_path: Path, how: str
) -> None:
    """`cd /mnt/nfs/project && fleet status`, then `umount /mnt/nfs` within the window: the
    keepers hold the connections, not the directory (OpenSSH's ControlPersist master keeps
    it, "target is busy")."""
    names = sorted(n.name for n in warm.sandbox.nodes())
    with _tmpfs(tmp_path / "mnt") as mount:
        project = mount / "project"
        project.mkdir()
        if how == "forked-at-end":  # a small first command: keepers forked at its end
            result = warm.fleet("exec", "--json", "true", cwd=project)
            assert _workers(result) == []
        elif how == "worker":  # a first command's workers stay on as its keepers
            result = warm.fleet(
                "exec", "--json", "--workers", "2", "true", env={"FLEET_KEEPERS": "2"}, cwd=project
            )
            assert _workers(result)
            assert all(w["stays"] for w in _workers(result))
        elif how == "forked-ahead":  # one keeper runs: the others forked before the run
            env = {"FLEET_KEEPERS": "8"}
            one = _alone_in_its_shard(warm.sandbox, 8)
            first = warm.fleet("exec", "--json", "-l", one, "true", env=env, cwd=project)
            assert first.code == 0, first.stderr
            before = set(keeper_pids(warm.runtime))
            result = warm.fleet("exec", "--json", "true", env=env, cwd=project)
            assert set(keeper_pids(warm.runtime)) > before
        else:  # spawned: a typed secret is never in a forked keeper's memory
            result = _spawned(warm, project, "exec", "--json", "true", env={})
            assert all("fleet.ssh.keeper" in _argv(p) for p in keeper_pids(warm.runtime))
        assert result.code == 0, result.stdout + result.stderr
        assert set(_connected(result)) == set(names)
        pids = keeper_pids(warm.runtime)
        assert pids
        assert {pid: _cwd(pid) for pid in pids} == dict.fromkeys(pids, "/")

        unmounted = subprocess.run(
            ["umount", str(mount)], capture_output=True, text=True, check=False
        )
        assert unmounted.returncode == 0, unmounted.stderr  # not "target is busy"
    assert all(_alive(pid) for pid in pids)  # still holding the connections
    assert set(warm.held()) == set(names)


def _relay(path: Path) -> None:
    """A ProxyCommand's program: bytes between its stdin/stdout and HOST PORT."""
    path.write_text(
        "import os, socket, sys, threading\n"
        "sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
        "def up():\n"
        "    while data := os.read(0, 65536):\n"
        "        sock.sendall(data)\n"
        "    sock.shutdown(socket.SHUT_WR)\n"
        "threading.Thread(target=up, daemon=True).start()\n"
        "while data := sock.recv(65536):\n"
        "    os.write(1, data)\n"
    )


def _project(sandbox: Any, project: Path) -> None:
    """A directory whose files fleet is given by relative paths only: an identity file in the
    ssh config and another in the inventory, the known_hosts file, the ssh config itself, and a
    ProxyCommand (which notes, in its own working directory, each host it was run for)."""
    nodes = sandbox.nodes()
    (project / "keys").mkdir(parents=True)
    for name in ("id", "id2"):
        shutil.copy(sandbox.key_path, project / "keys" / name)
        (project / "keys" / name).chmod(0o600)
    shutil.copy(sandbox.known_hosts_path, project / "kh")
    _relay(project / "relay.py")
    proxy = project / "proxy"
    proxy.write_text(f'#!/bin/sh\necho "$1" >> proxied\nexec {sys.executable} relay.py "$1" "$2"\n')
    proxy.chmod(0o755)
    (project / "cfg").write_text(
        f"Host {nodes[1].address}\n"
        "    ProxyCommand ./proxy %h %p\n"
        f"Host * !{nodes[2].address}\n"
        "    IdentityFile keys/id\n"
        "Host *\n"
        "    User root\n"
        "    IdentitiesOnly yes\n"
        "    UserKnownHostsFile kh\n"
        "    GlobalKnownHostsFile /dev/null\n"
        "    StrictHostKeyChecking yes\n"
        "    BatchMode yes\n"
        "    ConnectTimeout 10\n"
    )
    hosts = "".join(f"    {n.name}:\n      ansible_host: {n.address}\n" for n in nodes[:3])
    hosts += "      ansible_ssh_private_key_file: keys/id2\n"  # the last one, nodes[2]
    (project / "inventory.yaml").write_text(f"all:\n  hosts:\n{hosts}")


def test_relative_paths_still_mean_the_commands_directory_to_a_keeper_that_left_it(
    warm: Warm, tmp_path: Path
) -> None:
    """A keeper that left the directory connects a new host for a later command started there:
    the ssh config named by a relative path, its relative IdentityFile and UserKnownHostsFile,
    the inventory's relative key file, and a ProxyCommand run by a relative path, in that
    directory, all as the command meant them."""
    nodes = warm.sandbox.nodes()[:3]
    project = tmp_path / "project"
    _project(warm.sandbox, project)
    env = {
        "FLEET_KEEPERS": "1",  # one keeper: the later command's new hosts go through it
        "FLEET_SSH_CONFIG": "cfg",
        "FLEET_INVENTORY": "inventory.yaml",
        "SSH_AUTH_SOCK": "",  # no agent: only the identity files can log in
    }
    first = warm.fleet("exec", "--json", "-l", nodes[0].name, "hostname", env=env, cwd=project)
    assert first.code == 0, first.stdout + first.stderr
    (keeper,) = keeper_pids(warm.runtime)
    assert _cwd(keeper) == "/"

    every = warm.fleet("exec", "--json", "hostname", env=env, cwd=project)

    assert every.code == 0, every.stdout + every.stderr
    assert _connected(every) == {
        nodes[0].name: "warm",
        nodes[1].name: "fresh",
        nodes[2].name: "fresh",
    }
    said = {x["host"]: x["line"] for x in every.json_lines() if x["event"] == "OutputLine"}
    assert said == {n.name: n.name for n in nodes}
    assert keeper_pids(warm.runtime) == [keeper]  # made by the keeper that had left
    assert _cwd(keeper) == "/"
    # The ProxyCommand ran in the command's directory: what it wrote by a relative path is there.
    assert set((project / "proxied").read_text().split()) == {nodes[1].address}


def test_a_host_that_needs_the_commands_directory_after_it_is_gone_fails_saying_so(
    warm: Warm, tmp_path: Path
) -> None:
    """The directory the keeper was started from is removed; a command whose working directory
    has that name (here: in a mount namespace of its own, on a tmpfs over the parent) reaches the
    keeper. A host whose identity file is relative to it fails, saying why, and only that host;
    the others are served. Made again, the directory is what its name means: the host connects."""
    nodes = warm.sandbox.nodes()[:2]
    outer = tmp_path / "outer"
    project = outer / "p"

    def make_project() -> None:
        (project / "keys").mkdir(parents=True)
        shutil.copy(warm.sandbox.key_path, project / "keys" / "id")
        (project / "keys" / "id").chmod(0o600)

    make_project()
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "all:\n"
        "  vars:\n"
        "    ansible_user: root\n"
        f"    ansible_ssh_private_key_file: {json.dumps(str(warm.sandbox.key_path))}\n"
        "  hosts:\n"
        f"    {nodes[0].name}:\n      ansible_host: {nodes[0].address}\n"
        f"    {nodes[1].name}:\n      ansible_host: {nodes[1].address}\n"
        "      ansible_ssh_private_key_file: keys/id\n"
    )
    env = {"FLEET_KEEPERS": "1", "FLEET_INVENTORY": str(inventory)}
    first = warm.fleet("exec", "--json", "-l", nodes[0].name, "true", env=env, cwd=project)
    assert first.code == 0, first.stdout + first.stderr
    (keeper,) = keeper_pids(warm.runtime)
    shutil.rmtree(project)

    environment = fleet_code(fleet_env(warm.sandbox, tmp_path / "gone-log", **warm.env(), **env))
    in_its_place = 'mount -t tmpfs fleet-workdir "$1" && mkdir "$1/p" && cd "$1/p" && shift && '
    unshare = ["unshare", "-m", "--propagation", "private"]
    script = ["sh", "-c", in_its_place + 'exec "$@"', "sh", str(outer)]
    proc = subprocess.run(
        [*unshare, *script, *FLEET, "exec", "--json", "true"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=180,
        check=False,
    )
    gone = FleetResult(proc.returncode, proc.stdout, proc.stderr)
    assert gone.code == 4, gone.stdout + gone.stderr
    hosts = gone.final()["hosts"]
    assert hosts[nodes[0].name]["outcome"] == "ok", hosts
    assert hosts[nodes[1].name]["reason"] == "working directory gone", hosts
    assert str(project) in hosts[nodes[1].name]["last_line"], hosts
    assert keeper_pids(warm.runtime) == [keeper]  # served by it, which is still there

    make_project()
    again = warm.fleet("exec", "--json", "-l", nodes[1].name, "true", env=env, cwd=project)
    assert again.code == 0, again.stdout + again.stderr
    assert _connected(again) == {nodes[1].name: "fresh"}
    assert keeper_pids(warm.runtime) == [keeper]
