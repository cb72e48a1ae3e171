"""fleet reads Ansible inventories as Ansible does: checked against Debian's ansible-core itself.

The inventories under tests/data/ansible/site are written from the examples in Ansible's
inventory and patterns guides (INI and YAML, ranges, groups of groups, group_vars/ and host_vars/
as files, directories and JSON, an inventory directory). For each, `ansible-inventory --list`
gives the reference hosts, groups and variables, and `ansible -i INV PATTERN --list-hosts` the
reference selection of every pattern form; fleet's `load_inventory`, `--limit` and `fleet hosts
--json` must agree. Ansible runs with unparsed sources and unmatched patterns as errors, so a
source it skipped or a term it ignored cannot make the two agree by accident.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fleet.cli import cli
from fleet.inventory.loader import Inventory, load_inventory

ANSIBLE = shutil.which("ansible")
ANSIBLE_INVENTORY = shutil.which("ansible-inventory")
pytestmark = pytest.mark.skipif(
    ANSIBLE is None or ANSIBLE_INVENTORY is None,
    reason="needs Ansible as the reference (Debian: apt-get install ansible-core); CI installs it",
)

SITE = Path(__file__).resolve().parents[1] / "data" / "ansible" / "site"
INVENTORIES = {
    "ini": "inventories/prod/hosts",
    "yaml": "inventories/yaml/hosts.yml",
    "dir": "inventories/dir",
}

PATTERNS = {
    "ini": [
        "all",
        "*",
        "webservers",
        "ungrouped",
        "usa",
        "host1",
        "webservers:dbservers",
        "webservers,dbservers",
        "foo.example.com:bar.example.com",
        "webservers:!staging",
        "webservers:&staging",
        "webservers:dbservers:&staging:!phoenix",
        "production:&dbservers",
        "webservers:!nginx1*",
        "southeast:!host2",
        "!webservers",
        "&staging",
        "*.example.com",
        "*.com",
        "one*.com:dbservers",
        "192.0.*",
        "www*",
        "db-[ab].example.com",
        r"~(web|db).*\.example\.com",
        "~host[12]",
        "webservers[0]",
        "webservers[-1]",
        "webservers[0:2]",
        "webservers[1:]",
        "southeast[1]",
        # Separators with spaces, and a regex whose brackets hold what would separate.
        "webservers : dbservers",
        "webservers dbservers:!phoenix",
        "~host[12]:dbservers",
        "~host[^1]",
        "~host[:2]",
    ],
    "yaml": [
        "all",
        "webservers",
        "prod:&east",
        "east:west",
        "test,!bar.example.com",
        "usa",
        "atlanta[1]",
        "~web.*",
        "db-[!a]*",
        "aliases",
    ],
    "dir": [
        "all",
        "parent_group",
        "on_prem",
        "parent_group:!rack1*",
        "gpu",
        "cloud_hosts[0]",
        "*:!gpu",
    ],
}


@pytest.fixture(scope="module")
def ansible_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Ansible's environment: no config file, its own home, failures loud."""
    home = tmp_path_factory.mktemp("ansible-home")
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(home / "none.cfg"),
        "ANSIBLE_HOME": str(home),
        "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true",
        "ANSIBLE_HOST_PATTERN_MISMATCH": "error",
        "ANSIBLE_NOCOLOR": "1",
    }


def run_ansible(args: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


def reference_list(inventory: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """`ansible-inventory -i INV --list`, run where the playbook would be."""
    assert ANSIBLE_INVENTORY is not None
    out = run_ansible([ANSIBLE_INVENTORY, "-i", str(SITE / inventory), "--list"], env, cwd)
    data: dict[str, Any] = json.loads(out)
    return data


def closure(listing: dict[str, Any], group: str) -> set[str]:
    """A group's hosts, its children's included, from `--list` output."""
    entry = listing.get(group, {})
    found = set(entry.get("hosts", []))
    for child in entry.get("children", []):
        found |= closure(listing, child)
    return found


def fleet_inventory(inventory: str, playbook_dir: Path) -> Inventory:
    return load_inventory(SITE / inventory, playbook_dir=playbook_dir)


@pytest.fixture(params=["beside the playbook", "no playbook dir"])
def playbook_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The site directory (its group_vars/all.yml applies, as beside a playbook) or an empty one."""
    return SITE if request.param == "beside the playbook" else tmp_path


@pytest.mark.parametrize("name", sorted(INVENTORIES))
def test_hosts_groups_and_variables_match_ansible_inventory_list(
    name: str, playbook_dir: Path, ansible_home: dict[str, str]
) -> None:
    reference = reference_list(INVENTORIES[name], ansible_home, playbook_dir)
    inv = fleet_inventory(INVENTORIES[name], playbook_dir)
    hostvars = reference["_meta"]["hostvars"]
    everyone = closure(reference, "all")
    assert {h.name for h in inv.hosts} == everyone
    groups = [g for g in reference if g != "_meta"]
    for group in groups:
        assert set(inv.groups[group]) == closure(reference, group), group
    # Groups Ansible leaves out of --list are the empty ones.
    assert {g for g, members in inv.groups.items() if members} == set(groups)
    for host in inv.hosts:
        expected = hostvars.get(host.name, {})
        assert dict(host.vars) == expected, host.name
        assert set(host.groups) == {
            g
            for g in groups
            if g not in ("all", "ungrouped") and host.name in closure(reference, g)
        }, host.name


@pytest.mark.parametrize("name", sorted(INVENTORIES))
def test_fleet_hosts_json_has_ansibles_connection_settings(
    name: str, ansible_home: dict[str, str]
) -> None:
    """`fleet hosts --json` shows the address, port and user Ansible's vars give each host."""
    reference = reference_list(INVENTORIES[name], ansible_home, SITE)
    result = CliRunner().invoke(
        cli,
        ["hosts", "--json", "-i", str(SITE / INVENTORIES[name]), "--playbook-dir", str(SITE)],
    )
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    assert len(listed) == len(closure(reference, "all"))
    for entry in listed:
        want = reference["_meta"]["hostvars"].get(entry["name"], {})
        assert entry["address"] == want.get("ansible_host", entry["name"])
        assert entry["port"] == want.get("ansible_port", 22)
        assert entry["user"] == want.get("ansible_user")


def reference_hosts(inventory: str, pattern: str, env: dict[str, str]) -> set[str]:
    """`ansible -i INV PATTERN --list-hosts`."""
    assert ANSIBLE is not None
    out = run_ansible([ANSIBLE, "-i", str(SITE / inventory), pattern, "--list-hosts"], env, SITE)
    lines = out.splitlines()
    assert lines, out
    assert lines[0].strip().startswith("hosts ("), out
    return {line.strip() for line in lines[1:] if line.strip()}


@pytest.mark.parametrize(
    ("name", "pattern"), [(name, p) for name, patterns in PATTERNS.items() for p in patterns]
)
def test_patterns_select_what_ansible_list_hosts_selects(
    name: str, pattern: str, ansible_home: dict[str, str]
) -> None:
    expected = reference_hosts(INVENTORIES[name], pattern, ansible_home)
    inv = fleet_inventory(INVENTORIES[name], SITE)
    selected = inv.select(pattern)
    assert {h.name for h in selected} == expected
    # fleet keeps inventory order whatever the pattern's order (launch ranks depend on it).
    order = [h.name for h in inv.hosts]
    assert [h.name for h in selected] == [n for n in order if n in expected]


def test_the_ini_and_yaml_forms_of_the_guide_agree(ansible_home: dict[str, str]) -> None:
    """The guide's shared examples (ranges, groups of groups, group vars) read the same."""
    ini = fleet_inventory(INVENTORIES["ini"], SITE)
    yaml = fleet_inventory(INVENTORIES["yaml"], SITE)
    for group in ("southeast", "usa", "atlanta", "raleigh"):
        assert ini.groups[group] == yaml.groups[group]
    for host in ("host1", "host2", "host3"):
        for var in ("some_server", "self_destruct_countdown", "escape_pods"):
            assert ini.host(host).vars[var] == yaml.host(host).vars[var]
    assert ini.host("jumper").port == yaml.host("jumper").port == 5555
    assert ini.host("badwolf.example.com").port == yaml.host("badwolf.example.com").port == 5309
    www = [f"www{n:02d}.example.com" for n in (1, 11, 21, 31, 41)]
    assert [h for h in ini.groups["webservers"] if h.startswith("www")] == www
    assert [h for h in yaml.groups["webservers"] if h.startswith("www")] == www
