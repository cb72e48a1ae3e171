"""fleet.ssh.openssh: the `ssh` argv keeps fleet's trust decisions, one option per element, and
there is no route (paramiko carries the bytes) where ssh could not do what fleet resolved."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fleet.ssh import openssh
from fleet.ssh.transport import Target

TARGET = Target(
    name="node01",
    address="10.0.0.5",
    port=2222,
    user="ops",
    key_files=("/keys/id_ed25519",),
    known_hosts=(Path("/etc/ssh/ssh_known_hosts"),),
    policy="strict",
    proxy_jump=(),
    connect_timeout_s=10,
    identities_only=True,
)


class Key:
    def __init__(self, name: str = "ssh-ed25519") -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name

    def get_base64(self) -> str:
        return "AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests"


def session(target: Target = TARGET, key: Key | None = None) -> Any:
    transport = SimpleNamespace(get_remote_server_key=lambda: key or Key())
    return SimpleNamespace(target=target, client=SimpleNamespace(get_transport=lambda: transport))


@pytest.fixture
def route() -> Any:
    found = openssh.route(session(), ssh="/usr/bin/ssh")
    assert isinstance(found, openssh.Route)
    yield found
    found.close()


def options(argv: list[Any]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    return dict(p.split("=", 1) for p in pairs if p.split("=", 1)[0] != "IdentityFile")


def test_the_argv_pins_the_verified_key_and_nothing_else(route: Any) -> None:
    argv = route.argv(b"echo 'a b'; rm -rf /")
    assert argv[0] == "/usr/bin/ssh"
    assert argv[1:3] == ["-o", "ControlMaster=no"]
    assert argv[-3:] == ["--", openssh.ALIAS, b"echo 'a b'; rm -rf /"]  # one element
    assert argv[argv.index("-F") + 1] == "none"
    opts = options(argv)
    assert opts["StrictHostKeyChecking"] == "yes"
    assert opts["BatchMode"] == "yes"
    assert opts["GlobalKnownHostsFile"] == "/dev/null"
    assert opts["HostKeyAlias"] == openssh.ALIAS
    assert opts["HostKeyAlgorithms"] == "ssh-ed25519"
    assert opts["ForwardAgent"] == "no"
    assert opts["ForwardX11"] == "no"
    assert opts["ClearAllForwardings"] == "yes"
    assert opts["PermitLocalCommand"] == "no"
    assert (opts["HostName"], opts["Port"], opts["User"]) == ("10.0.0.5", "2222", "ops")
    assert opts["IdentitiesOnly"] == "yes"
    assert opts["ControlPath"] == str(route.pin_dir / "mux")
    assert "IdentityFile=/keys/id_ed25519" in argv
    pinned = Path(opts["UserKnownHostsFile"])
    assert pinned.read_text() == f"{openssh.ALIAS} ssh-ed25519 {Key().get_base64()}\n"
    assert pinned.stat().st_mode & 0o777 == 0o600
    assert route.pin_dir.stat().st_mode & 0o777 == 0o700
    assert all(isinstance(a, str) and " " not in a for a in argv[:-1])


# What `ssh -Q kex` lists in OpenSSH 7.4 (its release notes: curve25519-sha256 new there; the
# group14-sha256/16/18 exchanges from 7.3).
OPENSSH_7_4_KEX = {
    "curve25519-sha256",
    "curve25519-sha256@libssh.org",
    "ecdh-sha2-nistp256",
    "ecdh-sha2-nistp384",
    "ecdh-sha2-nistp521",
    "diffie-hellman-group-exchange-sha256",
    "diffie-hellman-group-exchange-sha1",
    "diffie-hellman-group16-sha512",
    "diffie-hellman-group18-sha512",
    "diffie-hellman-group14-sha256",
    "diffie-hellman-group14-sha1",
    "diffie-hellman-group1-sha1",
}


@pytest.mark.skipif(not shutil.which("ssh"), reason="no OpenSSH client here")
def test_the_key_exchange_is_fleets_own_first_and_every_name_is_known_to_ssh(route: Any) -> None:
    """A name this ssh does not know fails every route (paramiko would carry all bytes)."""
    offered = options(route.argv(b"true"))["KexAlgorithms"].split(",")
    assert offered[0] == "curve25519-sha256"
    assert set(offered) <= OPENSSH_7_4_KEX  # older bastions' ssh knows them too
    known = subprocess.run(["ssh", "-Q", "kex"], capture_output=True, text=True, check=True)
    assert set(offered) <= set(known.stdout.split())


def test_the_master_is_fleets_own_and_close_removes_the_pin(route: Any) -> None:
    argv = route.master_argv(b"cat")
    assert argv[1:5] == ["-o", "ControlMaster=yes", "-o", f"ControlPath={route.pin_dir}/mux"]
    route.close()
    assert not route.pin_dir.exists()


def test_an_rsa_key_is_proven_with_sha2_signatures() -> None:
    found = openssh.route(session(key=Key("ssh-rsa")), ssh="/usr/bin/ssh")
    assert isinstance(found, openssh.Route)
    try:
        assert options(found.argv(b"true"))["HostKeyAlgorithms"] == "rsa-sha2-512,rsa-sha2-256"
    finally:
        found.close()


def test_no_agent_means_no_agent() -> None:
    found = openssh.route(
        session(dataclasses.replace(TARGET, allow_agent=False)), ssh="/usr/bin/ssh"
    )
    assert isinstance(found, openssh.Route)
    try:
        assert options(found.argv(b"true"))["IdentityAgent"] == "none"
    finally:
        found.close()


@pytest.mark.parametrize(
    ("change", "key", "why"),
    [
        ({"proxy_jump": ("bastion",)}, None, "ProxyJump"),
        ({"proxy_command": "nc %h %p"}, None, "ProxyCommand"),
        ({"disabled_algorithms": (("ciphers", ("aes128-ctr",)),)}, None, "algorithm lists"),
        ({}, Key("ssh-ed25519-cert-v01@openssh.com"), "a host certificate"),
        ({"user": "%d"}, None, "a user or address"),
        ({"user": "-oProxyCommand=x"}, None, "a user or address"),
        ({"address": "host name"}, None, "a user or address"),
        ({"key_files": ("~/.ssh/id_${USER}",)}, None, "a key file name"),
        ({"certificate_files": ("/k/it's",)}, None, "a key file name"),
    ],
)
def test_what_ssh_could_not_do_as_fleet_resolved_it_stays_on_paramiko(
    change: dict[str, Any], key: Key | None, why: str
) -> None:
    found = openssh.route(session(dataclasses.replace(TARGET, **change), key), ssh="/usr/bin/ssh")
    assert isinstance(found, str)
    assert found.startswith(why)


def test_no_ssh_binary_no_route(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert openssh.route(session()) == "no ssh binary on PATH"
