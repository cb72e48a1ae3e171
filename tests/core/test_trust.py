"""What fleet reads without being told to: only files nobody but the operator or root could have
written (fleet/core/trust.py), from the rule itself to every place that finds a file on its own."""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.cli import config
from fleet.core import trust
from fleet.core.errors import ConfigError, InventoryError
from fleet.inventory.loader import load_inventory
from fleet.ssh.config import read_config

pytestmark = pytest.mark.root  # chown to another uid needs root
OTHER = 4242  # another user: a numeric uid with no passwd entry

RunMain = Callable[..., tuple[int, str, str]]


def _file(path: Path, text: str = "x: 1\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# ---------------------------------------------------------------- the rule


def test_the_operators_own_file_in_a_private_directory_is_trusted(trusted_tmp: Path) -> None:
    path = _file(trusted_tmp / "proj" / "fleet.yaml")
    trust.check(path)
    with trust.open_checked(path) as fh:
        assert fh.read() == b"x: 1\n"


def test_a_file_another_user_owns_is_not(trusted_tmp: Path) -> None:
    path = _file(trusted_tmp / "fleet.yaml")
    os.chown(path, OTHER, OTHER)
    with pytest.raises(trust.Untrusted) as info:
        trust.open_checked(path)
    assert info.value.warning() == f"ignoring {path}: owned by uid 4242, not you or root"


@pytest.mark.parametrize(
    ("mode", "reason"), [(0o664, "writable by its group"), (0o646, "writable by others")]
)
def test_a_file_others_can_write_is_not(trusted_tmp: Path, mode: int, reason: str) -> None:
    path = _file(trusted_tmp / "fleet.yaml")
    path.chmod(mode)
    with pytest.raises(trust.Untrusted, match=reason):
        trust.check(path)
    with pytest.raises(trust.Untrusted, match=reason):
        trust.open_checked(path)


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_a_directory_others_can_write_on_the_way_makes_it_untrusted(
    trusted_tmp: Path, mode: int
) -> None:
    """Even a sticky one like /tmp: anyone may create a file there (Ansible's rule for
    ansible.cfg in a world-writable directory)."""
    shared = trusted_tmp / "shared"
    path = _file(shared / "proj" / "fleet.yaml")
    shared.chmod(mode)
    with pytest.raises(trust.Untrusted, match=f"directory {shared} is writable by"):
        trust.open_checked(path)
    assert trust.open_checked(path, directories=False).close() is None  # OpenSSH's check


def test_a_directory_another_user_owns_on_the_way_makes_it_untrusted(trusted_tmp: Path) -> None:
    path = _file(trusted_tmp / "theirs" / "fleet.yaml")
    os.chown(path.parent, OTHER, OTHER)
    with pytest.raises(trust.Untrusted, match="owned by uid 4242"):
        trust.check(path)


def test_tmp_is_world_writable_so_tmp_path_is_untrusted(tmp_path: Path) -> None:
    path = _file(tmp_path / "fleet.yaml")
    with pytest.raises(trust.Untrusted, match="directory /tmp is writable by others"):
        trust.check(path)


def test_symlinks_are_checked_where_they_are_and_where_they_lead(trusted_tmp: Path) -> None:
    mine = _file(trusted_tmp / "mine" / "fleet.yaml")
    shared = trusted_tmp / "shared"
    theirs = _file(shared / "fleet.yaml")
    shared.chmod(0o1777)
    (trusted_tmp / "mine" / "to-theirs.yaml").symlink_to(theirs)
    (shared / "to-mine.yaml").symlink_to(mine)
    (trusted_tmp / "mine" / "to-mine.yaml").symlink_to(mine)
    with pytest.raises(trust.Untrusted, match="writable by others"):
        trust.open_checked(trusted_tmp / "mine" / "to-theirs.yaml")
    with pytest.raises(trust.Untrusted, match="writable by others"):
        trust.open_checked(shared / "to-mine.yaml")
    trust.open_checked(trusted_tmp / "mine" / "to-mine.yaml").close()


def test_a_symlinked_directory_is_checked_where_it_leads(trusted_tmp: Path) -> None:
    shared = trusted_tmp / "shared"
    _file(shared / "proj" / "fleet.yaml")
    shared.chmod(0o777)
    (trusted_tmp / "proj").symlink_to(shared / "proj")
    with pytest.raises(trust.Untrusted, match=f"directory {shared} is writable"):
        trust.check(trusted_tmp / "proj" / "fleet.yaml")


# ---------------------------------------------------------------- fleet.yaml and the user file


def test_a_planted_project_file_is_ignored_with_a_warning(
    trusted_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proj = trusted_tmp / "proj"
    planted = _file(proj / "fleet.yaml", "host_keys: accept-new\nlauncher: evil\n")
    os.chown(planted, OTHER, OTHER)
    settings = config.load_settings({"XDG_CONFIG_HOME": str(trusted_tmp / "none")}, proj)
    assert settings == {}
    err = capsys.readouterr().err
    assert f"warning: ignoring {planted}: owned by uid 4242, not you or root" in err
    assert len(err.strip().splitlines()) == 1


def test_an_ignored_project_file_lets_a_parents_apply(trusted_tmp: Path) -> None:
    _file(trusted_tmp / "fleet.yaml", "forks: 7\n")
    sub = trusted_tmp / "shared" / "sub"
    _file(sub / "fleet.yaml", "forks: 9\n")
    (trusted_tmp / "shared").chmod(0o1777)
    settings = config.load_settings({"XDG_CONFIG_HOME": str(trusted_tmp / "none")}, sub)
    assert settings["forks"].value == 7


def test_the_operators_project_file_still_applies(trusted_tmp: Path) -> None:
    _file(trusted_tmp / "fleet.yaml", "forks: 7\n")
    settings = config.load_settings({"XDG_CONFIG_HOME": str(trusted_tmp / "none")}, trusted_tmp)
    assert settings["forks"].value == 7


def test_a_file_a_trusted_project_file_names_must_pass_too(
    trusted_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ssh_config named by fleet.yaml may hold ProxyCommand: it runs on the bastion as root."""
    ssh = _file(trusted_tmp / "ssh_config", "Host *\n  ProxyCommand evil %h\n")
    os.chown(ssh, OTHER, OTHER)
    _file(trusted_tmp / "inv.yaml", "all: {hosts: {a: {}}}\n").chmod(0o666)
    _file(trusted_tmp / "fleet.yaml", "ssh_config: ssh_config\ninventory: inv.yaml\nforks: 3\n")
    settings = config.load_settings({"XDG_CONFIG_HOME": str(trusted_tmp / "none")}, trusted_tmp)
    assert set(settings) == {"forks"}
    err = capsys.readouterr().err
    assert f"ignoring ssh_config: {ssh}: owned by uid 4242" in err
    assert "ignoring inventory: " in err
    assert "writable by others" in err


def test_the_user_file_is_refused_like_ssh_refuses_its_config(trusted_tmp: Path) -> None:
    user = _file(trusted_tmp / "xdg" / "fleet" / "config.yaml", "forks: 3\n")
    user.chmod(0o666)
    with pytest.raises(ConfigError, match="bad owner or permissions: writable by others"):
        config.load_settings({"XDG_CONFIG_HOME": str(trusted_tmp / "xdg")}, trusted_tmp)


def test_a_config_file_the_operator_names_is_read_as_named(trusted_tmp: Path) -> None:
    named = _file(trusted_tmp / "named.yaml", "forks: 3\n")
    os.chown(named, OTHER, OTHER)
    settings = config.load_settings({"FLEET_CONFIG": str(named)}, trusted_tmp)
    assert settings["forks"].value == 3


# ---------------------------------------------------------------- ./inventory.yaml, group_vars


INVENTORY = "all:\n  hosts:\n    a: {ansible_host: 10.0.0.1}\n"


def test_a_planted_default_inventory_is_not_read(
    trusted_tmp: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain
) -> None:
    planted = _file(trusted_tmp / "inventory.yaml", INVENTORY)
    os.chown(planted, OTHER, OTHER)
    monkeypatch.chdir(trusted_tmp)
    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(trusted_tmp / "none"))
    code, out, err = run_main("hosts", "--json")
    assert code == 1
    assert out == ""
    assert "warning: ignoring ./inventory.yaml: owned by uid 4242, not you or root" in err
    code, out, err = run_main("hosts", "--json", "-i", "./inventory.yaml")  # named: read
    assert code == 0, err
    assert [h["name"] for h in json.loads(out)] == ["a"]


def test_the_operators_default_inventory_is_read(
    trusted_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _file(trusted_tmp / "inventory.yaml", INVENTORY)
    monkeypatch.chdir(trusted_tmp)
    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    assert [h.name for h in load_inventory().hosts] == ["a"]


def test_planted_group_and_host_vars_in_the_working_directory_are_skipped(
    trusted_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = _file(tmp_path / "inv" / "hosts.yaml", INVENTORY)  # named: its own vars are read
    _file(tmp_path / "inv" / "group_vars" / "all.yml", "beside: 1\n")
    gv = _file(trusted_tmp / "group_vars" / "all.yml", "ansible_user: evil\n")
    hv = _file(trusted_tmp / "host_vars" / "a.yml", "ansible_port: 2222\n")
    _file(trusted_tmp / "group_vars" / "ungrouped.yml", "mine: 1\n")  # the operator's own
    os.chown(gv, OTHER, OTHER)
    hv.chmod(0o666)
    monkeypatch.chdir(trusted_tmp)
    inventory = load_inventory(inv)
    (host,) = inventory.hosts
    assert (host.user, host.port) == (None, None)
    assert host.vars["beside"] == 1
    assert f"ignoring {gv}: owned by uid 4242, not you or root" in inventory.warnings
    assert f"ignoring {hv}: writable by others" in inventory.warnings
    assert host.vars["mine"] == 1
    # Named with --playbook-dir, the same directory is the operator's choice: read as named.
    assert load_inventory(inv, playbook_dir=trusted_tmp).hosts[0].user == "evil"


def test_group_vars_in_a_world_writable_working_directory_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = _file(tmp_path / "inv" / "hosts.yaml", INVENTORY)
    gv = _file(tmp_path / "work" / "group_vars" / "all.yml", "ansible_user: evil\n")
    monkeypatch.chdir(tmp_path / "work")
    inventory = load_inventory(inv)
    assert inventory.hosts[0].user is None
    assert any(w.startswith(f"ignoring {gv.parent}: directory /tmp is") for w in inventory.warnings)


def test_vars_beside_an_inventory_a_project_file_names_must_pass_too(
    trusted_tmp: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain
) -> None:
    _file(trusted_tmp / "fleet.yaml", "inventory: inv/hosts.yaml\n")
    _file(trusted_tmp / "inv" / "hosts.yaml", INVENTORY)
    gv = _file(trusted_tmp / "inv" / "group_vars" / "all.yml", "ansible_user: evil\n")
    os.chown(gv, OTHER, OTHER)
    monkeypatch.chdir(trusted_tmp)
    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(trusted_tmp / "none"))
    code, out, err = run_main("hosts", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["user"] is None
    assert f"warning: ignoring {gv}: owned by uid 4242" in err
    code, out, err = run_main("hosts", "--json", "-i", "inv/hosts.yaml")  # named: read
    assert json.loads(out)[0]["user"] == "evil"


def test_files_in_an_inventory_directory_a_project_file_names_must_pass_too(
    trusted_tmp: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain
) -> None:
    _file(trusted_tmp / "fleet.yaml", "inventory: inv\n")
    _file(trusted_tmp / "inv" / "a.yaml", INVENTORY)
    theirs = _file(trusted_tmp / "inv" / "b.yaml", "all:\n  hosts:\n    b: {}\n")
    os.chown(theirs, OTHER, OTHER)
    monkeypatch.chdir(trusted_tmp)
    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(trusted_tmp / "none"))
    code, out, err = run_main("hosts", "--json")
    assert code == 0, err
    assert [h["name"] for h in json.loads(out)] == ["a"]
    assert f"warning: ignoring {theirs}: owned by uid 4242" in err
    code, out, err = run_main("hosts", "--json", "-i", "inv")  # named: read
    assert [h["name"] for h in json.loads(out)] == ["a", "b"]


# ---------------------------------------------------------------- ~/.ssh/config


def test_ssh_config_others_can_write_is_refused_as_ssh_refuses_it(trusted_tmp: Path) -> None:
    ssh = _file(trusted_tmp / ".ssh" / "config", "Host *\n  ProxyCommand evil %h\n")
    ssh.chmod(0o666)
    with pytest.raises(ConfigError, match=r"\.ssh/config: bad owner or permissions"):
        read_config(None, home=trusted_tmp)
    os.chown(ssh, OTHER, OTHER)
    ssh.chmod(0o644)
    with pytest.raises(ConfigError, match="owned by uid 4242"):
        read_config(None, home=trusted_tmp)
    assert read_config(ssh, home=trusted_tmp).lookup("x")["proxycommand"] == "evil %h"  # -F


def test_an_included_ssh_config_another_user_owns_is_refused(trusted_tmp: Path) -> None:
    included = _file(trusted_tmp / "inc.conf", "Host *\n  ProxyCommand evil %h\n")
    os.chown(included, OTHER, OTHER)
    _file(trusted_tmp / ".ssh" / "config", f"Include {included}\n")
    with pytest.raises(ConfigError, match=r"inc\.conf: bad owner or permissions"):
        read_config(None, home=trusted_tmp)


def test_the_operators_ssh_config_is_read(trusted_tmp: Path) -> None:
    _file(trusted_tmp / ".ssh" / "config", "Host a\n  Port 2200\n")
    assert read_config(None, home=trusted_tmp).lookup("a")["port"] == "2200"


def test_a_missing_inventory_does_not_raise_untrusted(trusted_tmp: Path) -> None:
    with pytest.raises(InventoryError):
        load_inventory(trusted_tmp / "nope.yaml")
