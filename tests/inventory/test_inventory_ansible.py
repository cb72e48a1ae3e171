"""Ansible inventories that must work unchanged: INI files, group_vars/ and host_vars/, inventory
directories and several -i, host lists, Ansible's pattern syntax, Ansible's connection variables
(honoured, ignored or refused), and errors that name file and line without quoting the file.

tests/inventory/test_ansible_compat.py checks the same ground against Ansible itself where it is
installed; these tests pin fleet's side everywhere, including what Ansible does not refuse.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleet.cli import cli
from fleet.core.errors import ExitCode, InventoryError, UsageError
from fleet.inventory.ini_format import literal
from fleet.inventory.loader import Inventory, load_inventory
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import SSHTransport

SECRET = "Hs1kT0pSecr3t-value"


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    """Write files (dedented text, or bytes) below root; returns root."""
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(textwrap.dedent(content), encoding="utf-8")
    return root


def load(path: Path, playbook_dir: Path | None = None) -> Inventory:
    """Load with an empty playbook dir unless told (the test's cwd may hold group_vars)."""
    return load_inventory(path, playbook_dir=playbook_dir or path.parent / "no-playbook-dir")


def error(path: Path, limit: str | None = None) -> InventoryError:
    """The error loading `path` (and selecting `limit`) stops with."""

    def attempt() -> None:
        inv = load_inventory(path, playbook_dir=Path("/nonexistent"))
        if limit is not None:
            inv.select(limit)

    with pytest.raises(InventoryError) as info:
        attempt()
    assert info.value.exit_code is ExitCode.FLEET_ERROR
    assert info.value.hint.strip()
    return info.value


def names(hosts: object) -> list[str]:
    return [h.name for h in hosts]  # type: ignore[attr-defined]


# ---------------------------------------------------------------- INI

GUIDE_INI = """\
# the first lines are ungrouped hosts
mail.example.com
; a semicolon comment

[webservers]
foo.example.com
bar.example.com:2222  # a comment after a host
www[01:50:10].example.com

[dbservers]
db-[a:c].example.com ansible_user=dba

[atlanta]
host1 http_port=80 maxRequestsPerChild=808 note='two words' flag=True
host2 http_port=303 list="['a', 'b']" tuple=(1,2) octal=0644

[southeast:children]
atlanta

[southeast:vars]
some_server=foo.southeast.example.com  # stays part of the value, as in Ansible
escape_pods=2
"""


def test_ini_hosts_groups_ranges_and_ports(tmp_path: Path) -> None:
    inv = load(tree(tmp_path, {"hosts": GUIDE_INI}) / "hosts")
    assert names(inv.hosts) == [
        "mail.example.com",
        "foo.example.com",
        "bar.example.com",
        *[f"www{n}.example.com" for n in ("01", "11", "21", "31", "41")],
        "db-a.example.com",
        "db-b.example.com",
        "db-c.example.com",
        "host1",
        "host2",
    ]
    assert inv.groups["ungrouped"] == ("mail.example.com",)
    assert inv.groups["southeast"] == ("host1", "host2")
    assert inv.host("bar.example.com").port == 2222
    assert inv.host("db-b.example.com").user == "dba"
    assert inv.host("host1").groups == ("atlanta", "southeast")


def test_ini_values_are_python_literals_or_text_as_in_ansible(tmp_path: Path) -> None:
    inv = load(tree(tmp_path, {"hosts": GUIDE_INI}) / "hosts")
    one, two = inv.host("host1").vars, inv.host("host2").vars
    assert (one["http_port"], one["note"], one["flag"]) == (80, "two words", True)
    assert (two["list"], two["tuple"], two["octal"]) == (["a", "b"], [1, 2], "0644")
    assert (
        one["some_server"] == "foo.southeast.example.com  # stays part of the value, as in Ansible"
    )
    assert one["escape_pods"] == 2


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("30", 30),
        ("3.5", 3.5),
        ("None", None),
        ("yes", "yes"),
        ("'quoted'", "quoted"),
        ("{'a': [1, (2, 3)]}", {"a": [1, [2, 3]]}),
        ("{1, 2}", "{1, 2}"),
        ("b'x'", "b'x'"),
        ("1j", "1j"),
        ("(" * 300 + ")" * 300, "(" * 300 + ")" * 300),
        ("9" * 5000, "9" * 5000),
    ],
)
def test_ini_literal(text: str, value: object) -> None:
    assert literal(text) == value


def test_a_host_in_ungrouped_and_a_group_leaves_ungrouped(tmp_path: Path) -> None:
    inv = load(tree(tmp_path, {"hosts": "a\nb\n[g]\nb\n"}) / "hosts")
    assert inv.groups["ungrouped"] == ("a",)
    assert inv.host("b").groups == ("g",)


def test_ini_children_declared_after_use(tmp_path: Path) -> None:
    text = "[parent:children]\nkid\n[parent:vars]\nx=1\n[kid]\nk1\n"
    inv = load(tree(tmp_path, {"hosts": text}) / "hosts")
    assert inv.groups["parent"] == ("k1",)
    assert inv.host("k1").vars["x"] == 1


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        pytest.param("[usa:children]\nnortheast\n", 2, "never declared", id="undefined-child"),
        pytest.param("[g:vars]\nx=1\n", 1, "never declared", id="vars-undeclared"),
        pytest.param("[web]\na\n[web servers]\n", 3, "section header", id="space-in-section"),
        pytest.param("[web:hostz]\na\n", 1, "unknown section type 'hostz'", id="bad-type"),
        pytest.param("[g]\na\n[g:vars]\nnot a pair\n", 4, "key=value", id="vars-no-equals"),
        pytest.param("[g]\na b=1 c\n", 2, "key=value", id="host-var-no-equals"),
        pytest.param("[g]\na x='open\n", 2, "unbalanced", id="quotes"),
        pytest.param("[g]\nweb[09:01]\n", 2, "backwards", id="backward-range"),
        pytest.param("[g]\na:99999\n", 2, "not 1-65535", id="port"),
        pytest.param("[a:children]\nb\n[b:children]\na\n", 4, "contains itself", id="cycle"),
        pytest.param("[g]\na 9x=1\n", 2, "not a valid variable name", id="var-name"),
    ],
)
def test_ini_errors_name_file_and_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = tree(tmp_path, {"hosts": text}) / "hosts"
    problem = error(path)
    assert f"{path}:{line}" in problem.message
    assert words in problem.message


@pytest.mark.parametrize(
    "text",
    [
        f"[g]\nhost1 ansible_password={SECRET}\n[g:vars]\nbroken {SECRET}\n",
        f"[g]\nhost1 x='{SECRET}\n",
        f"{SECRET}:$x$y:1:2:::\n",
        f"[{SECRET} x]\n",
        f"[g:children]\n{SECRET}$\n",
    ],
)
def test_ini_errors_never_quote_the_line(tmp_path: Path, text: str) -> None:
    problem = error(tree(tmp_path, {"hosts": text}) / "hosts")
    assert SECRET not in problem.message + problem.hint


def test_ini_comment_lines_may_hold_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = tree(tmp_path, {"hosts": b"# caf\xe9\n[g]\na\n"}) / "hosts"
    assert names(load(path).hosts) == ["a"]
    path.write_bytes(b"[g]\ncaf\xe9\n")
    assert f"{path}:2: not UTF-8" in error(path).message


def test_an_ini_file_with_a_yaml_extension_is_read_as_ini(tmp_path: Path) -> None:
    """Ansible tries its yaml plugin, then its ini plugin, whatever the extension."""
    inv = load(tree(tmp_path, {"hosts.yml": "[g]\na\n"}) / "hosts.yml")
    assert inv.groups["g"] == ("a",)


def test_broken_yaml_without_extension_reports_the_yaml_error(tmp_path: Path) -> None:
    path = tree(tmp_path, {"hosts": "all:\n  hosts:\n    a: {x: 1\n"}) / "hosts"
    assert "invalid YAML" in error(path).message


# ---------------------------------------------------------------- YAML details


def test_yaml_sections_are_read_in_file_order_and_may_be_strings(tmp_path: Path) -> None:
    text = """\
    web:
      children:
        front: {hosts: f1}
      hosts: w1
    db:
      hosts:
        'db1:2200':
    """
    inv = load(tree(tmp_path, {"inv.yml": text}) / "inv.yml")
    assert names(inv.hosts) == ["f1", "w1", "db1"]  # children before hosts, as written
    assert inv.host("db1").port == 2200


def test_a_dynamic_inventory_plugin_config_is_refused(tmp_path: Path) -> None:
    path = tree(tmp_path, {"aws_ec2.yml": "plugin: amazon.aws.aws_ec2\nregions: [x]\n"})
    problem = error(path / "aws_ec2.yml")
    assert "dynamic inventory plugin" in problem.message
    assert "ansible-inventory" in problem.hint


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("#!/usr/bin/env python3\nprint('{}')\n", "inventory script"),
        ("$ANSIBLE_VAULT;1.1;AES256\n6162\n", "ansible-vault"),
    ],
)
def test_scripts_and_vaulted_inventories_are_refused(
    tmp_path: Path, content: str, words: str
) -> None:
    path = tree(tmp_path, {"inv": content}) / "inv"
    assert words in error(path).message


# ---------------------------------------------------------------- group_vars / host_vars


def test_group_vars_and_host_vars_beside_the_inventory(tmp_path: Path) -> None:
    """The issue's case: group_vars/webservers.yml sets the user, host_vars/<host> the port."""
    root = tree(
        tmp_path,
        {
            "hosts": "[webservers]\nweb1\nweb2 ansible_port=2200\n",
            "group_vars/webservers.yml": "ansible_user: deploy\n",
            "host_vars/web2.yml": "ansible_port: 2222\n",
        },
    )
    inv = load(root / "hosts")
    assert [(h.user, h.port) for h in inv.hosts] == [("deploy", None), ("deploy", 2222)]


def test_vars_file_precedence_as_in_ansible(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "inv/hosts": """\
                [g]
                h1 level=inventory-host
                h2
                [g:vars]
                level=inventory-group
                gonly=inventory-group
                [all:vars]
                level=inventory-all
                aonly=inventory-all
            """,
            "inv/group_vars/all.yml": "aonly: inv-group_vars-all\nlevel: inv-group_vars-all\n",
            "inv/group_vars/g.yml": "gonly: inv-group_vars-g\n",
            "inv/host_vars/h1.yml": "level: inv-host_vars\n",
            "play/group_vars/all.yml": "aonly: play-group_vars-all\n",
            "play/group_vars/g.yml": "gonly: play-group_vars-g\n",
        },
    )
    inv = load(root / "inv" / "hosts", playbook_dir=root / "play")
    h1, h2 = inv.host("h1").vars, inv.host("h2").vars
    assert h1["level"] == "inv-host_vars"
    # group_vars/all beats the inventory's group vars (Ansible's precedence, surprising but real)
    assert h2["level"] == "inv-group_vars-all"
    assert h2["aonly"] == "play-group_vars-all"
    assert h2["gonly"] == "play-group_vars-g"


def test_vars_directories_first_match_wins_and_files_merge_in_name_order(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "hosts": "[g]\na\n",
            "group_vars/g/10-first.yml": "x: first\ny: first\n",
            "group_vars/g/20-second.json": '{"x": "second"}',
            "group_vars/g/sub/30-third": "z: third\n",
            "group_vars/g/.hidden.yml": "x: hidden\n",
            "group_vars/g/backup.yml~": "x: backup\n",
            "group_vars/g/notes.txt": "x: text\n",
            "group_vars/g/empty.yml": "# nothing\n",
            "group_vars/g.yml": "x: never, g/ came first\n",
        },
    )
    v = load(root / "hosts").host("a").vars
    assert (v["x"], v["y"], v["z"]) == ("second", "first", "third")


def test_a_dangling_vars_symlink_is_said_and_the_next_name_is_looked_for(
    tmp_path: Path, run_main: Callable[..., tuple[int, str, str]]
) -> None:
    """Ansible passes over a symlink to nothing in silence; a run would then go on without the
    vars the operator meant it to have, so fleet says which file it could not read."""
    root = tree(
        tmp_path,
        {
            "hosts": "[g]\na\n",
            "group_vars/all.yaml": "x: from-all-yaml\n",
            "group_vars/g/main.yml": "y: from-g\n",
        },
    )
    (root / "group_vars/all.yml").symlink_to(root / "moved-away.yml")  # looked for first
    (root / "group_vars/g/secrets.yml").symlink_to("/nonexistent/secrets.yml")
    inv = load(root / "hosts")
    assert (inv.host("a").vars["x"], inv.host("a").vars["y"]) == ("from-all-yaml", "from-g")
    assert inv.warnings == (
        f"{root}/group_vars/all.yml: a symlink to nothing (to {root}/moved-away.yml); "
        "its vars were not read",
        f"{root}/group_vars/g/secrets.yml: a symlink to nothing (to /nonexistent/secrets.yml); "
        "its vars were not read",
    )
    code, _, err = run_main("hosts", "-i", str(root / "hosts"), "--playbook-dir", str(root))
    assert code == 0
    assert f"fleet: warning: {root}/group_vars/all.yml: a symlink to nothing" in err


def test_group_priority_orders_groups_of_the_same_depth(tmp_path: Path) -> None:
    text = "[a]\nh\n[b]\nh\n[a:vars]\nx=a\nansible_group_priority=5\n[b:vars]\nx=b\n"
    inv = load(tree(tmp_path, {"hosts": text}) / "hosts")
    assert inv.host("h").vars["x"] == "a"  # b would win by name; a's priority is higher
    assert "ansible_group_priority" not in inv.host("h").vars


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("group_vars/all.yml", "- a\n- b\n", "expected a mapping of variables, got a list"),
        ("group_vars/all.yml", "ok: 1\nbad-name: 2\n", "not a valid variable name"),
        ("host_vars/a.yml", "x: [1\n", "invalid YAML"),
        ("host_vars/a", b"x: caf\xe9\n", "not UTF-8"),
    ],
)
def test_bad_vars_files_name_the_file(
    tmp_path: Path, name: str, content: str | bytes, words: str
) -> None:
    root = tree(tmp_path, {"hosts": "a\n", name: content})
    problem = error(root / "hosts")
    assert str(root / name) in problem.message
    assert words in problem.message


def test_a_vaulted_vars_file_is_skipped_with_a_warning(
    tmp_path: Path, run_main: Callable[..., tuple[int, str, str]]
) -> None:
    root = tree(
        tmp_path,
        {
            "hosts": "a\n",
            "group_vars/all/main.yml": "ansible_user: deploy\n",
            "group_vars/all/vault.yml": "$ANSIBLE_VAULT;1.1;AES256\n3132\n",
        },
    )
    inv = load(root / "hosts")
    assert inv.host("a").user == "deploy"
    assert len(inv.warnings) == 1
    assert "vault.yml: encrypted with ansible-vault" in inv.warnings[0]
    code, out, err = run_main("hosts", "-i", str(root / "hosts"), "--json")
    assert code == 0
    assert json.loads(out)[0]["user"] == "deploy"
    assert err.startswith("fleet: warning: ")
    assert "vault.yml" in err


def test_inline_vault_values_are_left_out_with_a_warning(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "hosts": "a\n",
            "group_vars/all.yml": """\
                ansible_user: deploy
                api_key: !vault |
                  $ANSIBLE_VAULT;1.1;AES256
                  6162
                tokens: [!vault "$ANSIBLE_VAULT;1.1;AES256 6364"]
                note: "a string with !vault in it"
            """,
        },
    )
    inv = load(root / "hosts")
    assert dict(inv.host("a").vars) == {
        "ansible_user": "deploy",
        "note": "a string with !vault in it",
    }
    assert [w.split(": ")[1] for w in inv.warnings] == ["api_key", "tokens"]
    assert all("ansible-vault value" in w for w in inv.warnings)


def test_an_inline_vaulted_password_is_refused_like_any_password(tmp_path: Path) -> None:
    vaulted = "ansible_become_password: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n"
    root = tree(tmp_path, {"hosts": "a\n", "group_vars/all.yml": vaulted})
    assert "fleet takes no passwords" in error(root / "hosts", limit="all").message


def test_the_current_directory_is_the_playbook_dir_by_default(
    trusted_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tree(
        trusted_tmp,
        {"inv/hosts": "a\n", "group_vars/all.yml": "ansible_user: from-playbook-dir\n"},
    )
    monkeypatch.chdir(root)
    assert load_inventory(root / "inv" / "hosts").host("a").user == "from-playbook-dir"
    result = CliRunner().invoke(
        cli, ["hosts", "--json", "-i", "inv/hosts", "--playbook-dir", str(root / "inv")]
    )
    assert json.loads(result.output)[0]["user"] is None


# ---------------------------------------------------------------- directories, several -i


def test_an_inventory_directory_is_read_in_name_order(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "inv/02-on-prem": "[on_prem]\nr1\n",
            "inv/01-cloud.yml": "cloud:\n  hosts:\n    c1:\n",
            "inv/03-parents": "[cloud]\n[on_prem]\n[site:children]\ncloud\non_prem\n",
            "inv/sub/04-more.yaml": "gpu:\n  hosts:\n    g1:\n",
            "inv/README.md": "not an inventory\n",
            "inv/old.ini": "[skipped]\nx1\n",
            "inv/hosts.bak": "[skipped]\nx2\n",
            "inv/.hidden": "[skipped]\nx3\n",
            "inv/group_vars/on_prem.yml": "dc: dc1\n",
        },
    )
    inv = load_inventory(root / "inv", playbook_dir=root)
    assert names(inv.hosts) == ["c1", "r1", "g1"]
    assert inv.groups["site"] == ("c1", "r1")
    assert inv.host("r1").vars["dc"] == "dc1"
    assert inv.host("r1").origin is not None
    assert str(inv.host("r1").origin) == f"{root / 'inv' / '02-on-prem'}:2"


def test_several_sources_merge_and_each_brings_its_group_vars(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "a/hosts": "[gpu]\ng1\n",
            "a/group_vars/gpu.yml": "ansible_user: from-a\nrack: a\n",
            "b/hosts.yml": "gpu:\n  hosts:\n    g2:\n",
            "b/group_vars/gpu.yml": "rack: b\n",
        },
    )
    inv = load_inventory([root / "a" / "hosts", root / "b" / "hosts.yml"], playbook_dir=root)
    assert inv.groups["gpu"] == ("g1", "g2")
    assert [(h.user, h.vars["rack"]) for h in inv.hosts] == [("from-a", "b"), ("from-a", "b")]
    assert inv.sources == (str(root / "a" / "hosts"), str(root / "b" / "hosts.yml"))


def test_a_host_list(tmp_path: Path) -> None:
    inv = load_inventory("gpu01, gpu02:2222,gpu[03-04],", playbook_dir=tmp_path)
    assert names(inv.hosts) == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert inv.host("gpu02").port == 2222
    assert inv.groups["ungrouped"] == ("gpu01", "gpu02", "gpu03", "gpu04")


def test_several_inventories_on_the_command_line_and_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tree(tmp_path, {"one": "[a]\nh1\n", "two.yml": "b:\n  hosts:\n    h2:\n"})
    args = ["hosts", "--json", "--playbook-dir", str(tmp_path)]
    result = CliRunner().invoke(cli, [*args, "-i", str(root / "one"), "-i", str(root / "two.yml")])
    assert [h["name"] for h in json.loads(result.output)] == ["h1", "h2"]
    monkeypatch.setenv("FLEET_INVENTORY", f"{root / 'two.yml'}:{root / 'one'}")
    result = CliRunner().invoke(cli, args)
    assert [h["name"] for h in json.loads(result.output)] == ["h2", "h1"]


@pytest.fixture
def shared_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A world-writable working directory (as /tmp is) where another user left an inventory
    (planted.yaml) and ./inventory.yaml; the test's own inventory is elsewhere."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "planted.yaml").write_text("all:\n  hosts:\n    planted01:\n")
    (shared / "inventory.yaml").write_text("all:\n  hosts:\n    planted02:\n")
    (tmp_path / "mine.yaml").write_text("all:\n  hosts:\n    mine01:\n")
    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    monkeypatch.chdir(shared)
    return tmp_path / "mine.yaml"


@pytest.mark.parametrize(
    ("env", "argv", "where"),
    [
        ("{mine}:", [], "FLEET_INVENTORY"),  # $A:$B with B empty
        (":{mine}", [], "FLEET_INVENTORY"),
        ("{mine}::{mine}", [], "FLEET_INVENTORY"),
        (":", [], "FLEET_INVENTORY"),
        (None, ["-i", ""], "-i"),
        (None, ["-i", "{mine}", "-i", ""], "-i"),
    ],
)
def test_an_empty_inventory_path_is_refused_never_read_as_the_current_directory(
    shared_cwd: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_main: Callable[..., tuple[int, str, str]],
    env: str | None,
    argv: list[str],
    where: str,
) -> None:
    """Path('') is '.': an empty item read the shared working directory as an inventory
    directory named by the operator, so unchecked, and its planted.yaml became hosts."""
    if env is not None:
        monkeypatch.setenv("FLEET_INVENTORY", env.format(mine=shared_cwd))
    for verb in (["hosts"], ["exec", "-n", "true"]):
        code, out, err = run_main(*verb, *[a.format(mine=shared_cwd) for a in argv])
        assert code == 2, err
        assert out == ""
        assert f"fleet: error: empty path in {where}\n" in err
        assert "hint: " in err
        assert "planted" not in out + err


def test_fleet_inventory_read_without_the_cli_refuses_an_empty_path_too(
    shared_cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_INVENTORY", f"{shared_cwd}:")
    with pytest.raises(UsageError) as info:
        load_inventory()
    assert info.value.message == "empty path in FLEET_INVENTORY"
    assert info.value.exit_code is ExitCode.USAGE


@pytest.mark.parametrize(
    ("argument", "item"), [("a,,b", 2), (",", 1), (" , ", 1), ("a, ,", 2), (",a", 1)]
)
def test_an_empty_item_in_a_host_list_is_refused_as_in_limit_and_hosts(
    run_main: Callable[..., tuple[int, str, str]], argument: str, item: int
) -> None:
    code, out, err = run_main("hosts", "-i", argument)
    assert code == 2
    assert out == ""
    assert f"fleet: error: host list '{argument}': item {item} is empty\n" in err


def test_a_trailing_comma_still_makes_one_name_a_host_list(
    run_main: Callable[..., tuple[int, str, str]],
) -> None:
    """Ansible's `-i 'gpu01,'`: the comma says "a list", not a file named gpu01."""
    code, out, err = run_main("hosts", "--json", "-i", "gpu01,")
    assert code == 0, err
    assert [h["name"] for h in json.loads(out)] == ["gpu01"]


def test_the_project_config_names_an_inventory(
    trusted_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_main: Callable[..., tuple[int, str, str]],
) -> None:
    """`inventory:` in fleet.yaml is one path; -i, which may repeat, takes it as a list."""
    tmp_path = trusted_tmp
    tree(tmp_path, {"fleet.yaml": "inventory: inv/hosts\n", "inv/hosts": "[g]\nh1\n"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-user-config"))
    code, out, err = run_main("hosts", "--json")
    assert code == 0, err
    assert [h["name"] for h in json.loads(out)] == ["h1"]


def test_a_playbook_dir_that_does_not_exist_is_a_usage_error(
    tmp_path: Path, run_main: Callable[..., tuple[int, str, str]]
) -> None:
    code, _, err = run_main("hosts", "-i", "a,", "--playbook-dir", str(tmp_path / "x"))
    assert code == ExitCode.USAGE
    assert "--playbook-dir" in err


def test_an_empty_directory_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "inv").mkdir()
    assert "no hosts" in error(tmp_path / "inv").message


# ---------------------------------------------------------------- connection variables


def test_ansible_connection_variable_aliases(tmp_path: Path) -> None:
    text = """\
    [g]
    a ansible_host=10.0.0.1 ansible_ssh_host=10.0.0.2 ansible_private_key_file=~/k1
    b ansible_host=10.0.0.3 host=10.9.9.9 ansible_ssh_user=ops ansible_user=x
    c host=10.0.0.4 ansible_python_interpreter=/usr/bin/python3 ansible_become=yes
    """
    inv = load(tree(tmp_path, {"hosts": text}) / "hosts")
    a, b, c = inv.hosts
    assert a.address == "10.0.0.2"  # the ssh plugin reads ansible_ssh_host last
    assert a.key_file is not None
    assert a.key_file.endswith("/k1")
    assert "~" not in a.key_file
    assert (b.address, b.user) == ("10.0.0.3", "ops")
    assert c.address == "10.0.0.4"
    assert c.vars["ansible_become"] == "yes"
    assert inv.select("all") == list(inv.hosts)  # nothing refused


PASSWORDS = [
    "ansible_become_password",
    "ansible_become_pass",
    "ansible_password",
    "ansible_ssh_pass",
    "ansible_sudo_pass",
]


@pytest.mark.parametrize("var", PASSWORDS)
def test_passwords_are_refused_without_being_shown(
    tmp_path: Path, run_main: Callable[..., tuple[int, str, str]], var: str
) -> None:
    root = tree(
        tmp_path,
        {
            "hosts": "[web]\nw1\nw2\n[db]\nd1\n",
            "group_vars/web.yml": f"ansible_user: deploy\n{var}: {SECRET}\n",
        },
    )
    inv = load(root / "hosts")
    assert names(inv.select("db")) == ["d1"]  # only the hosts a run selects matter
    assert all(SECRET not in repr(h.vars) for h in inv.hosts)
    with pytest.raises(InventoryError) as info:
        inv.select("all")
    message = info.value.message
    assert message.startswith(f"{root / 'group_vars' / 'web.yml'}:2: {var}")
    assert "(applies to w[1-2])" in message
    assert "-K" in info.value.hint
    code, out, err = run_main("hosts", "-i", str(root / "hosts"), "--json")
    assert code == ExitCode.FLEET_ERROR
    assert f"{var}: fleet takes no passwords" in err
    assert SECRET not in out + err
    code, out, err = run_main("exec", "true", "-i", str(root / "hosts"), "--dry-run")
    assert code == ExitCode.FLEET_ERROR
    assert SECRET not in out + err


@pytest.mark.parametrize(
    ("args", "options"),
    [
        ("-o ProxyJump=bastion", [("proxyjump", "bastion")]),
        ("-J ops@jump1:2222,jump2", [("proxyjump", "ops@jump1:2222,jump2")]),
        ("-oProxyJump=none", [("proxyjump", "none")]),
        (
            '-o ProxyCommand="ssh -W %h:%p -q user@gateway.example.com"',
            [("proxycommand", "ssh -W %h:%p -q user@gateway.example.com")],
        ),
        (
            "-o 'ProxyCommand nc %h %p' -o ProxyJump=later",
            [("proxycommand", "nc %h %p"), ("proxyjump", "later")],
        ),
        ("-C -o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=30 -q", []),
        # what a strict Ansible inventory carries: honoured, as in an ssh config
        (
            "-o UserKnownHostsFile=/etc/fleet/known -o StrictHostKeyChecking=yes "
            "-o IdentitiesOnly=yes",
            [
                ("userknownhostsfile", "/etc/fleet/known"),
                ("stricthostkeychecking", "yes"),
                ("identitiesonly", "yes"),
            ],
        ),
        (
            "-i ~/.ssh/other -p 2222 -l ops",
            [("identityfile", "~/.ssh/other"), ("port", "2222"), ("user", "ops")],
        ),
        ("-4 -o 'ConnectTimeout 5' -Mv", [("addressfamily", "inet"), ("connecttimeout", "5")]),
        ("-o StrictHostKeyChecking=no", [("stricthostkeychecking", "no")]),
        (
            "-o KnownHostsCommand=none -o CertificateFile=~/c.pub",
            [("knownhostscommand", "none"), ("certificatefile", "~/c.pub")],
        ),
    ],
)
def test_ssh_args_options_are_taken_as_from_an_ssh_config(
    tmp_path: Path, args: str, options: list[tuple[str, str]]
) -> None:
    text = f"all:\n  vars:\n    ansible_ssh_common_args: {json.dumps(args)}\n  hosts:\n    a:\n"
    host = load(tree(tmp_path, {"inv.yml": text}) / "inv.yml").select("a")[0]
    assert list(host.ssh_options) == options


def test_extra_args_come_after_common_args(tmp_path: Path) -> None:
    text = "[g]\na\n[g:vars]\nansible_ssh_extra_args=-J two\nansible_ssh_common_args=-J one\n"
    host = load(tree(tmp_path, {"hosts": text}) / "hosts").host("a")
    assert host.ssh_options == (("proxyjump", "one"), ("proxyjump", "two"))
    transport = SSHTransport(SshSettings(ssh_config=Path("/dev/null")))
    assert transport.target(host).proxy_jump == ("one",)


def test_ssh_args_win_over_the_ssh_config_and_lose_to_the_inventory(tmp_path: Path) -> None:
    config = (
        tree(
            tmp_path,
            {
                "config": "Host *\n  UserKnownHostsFile /config/known\n  IdentityFile /config/key\n"
                "  Port 2200\n  StrictHostKeyChecking no\n  IdentityAgent /other/agent.sock\n"
            },
        )
        / "config"
    )
    args = (
        "-o UserKnownHostsFile=/inv/known -i /inv/key -p 2300 -o StrictHostKeyChecking=yes "
        "-o IdentitiesOnly=yes -o IdentityAgent=none"
    )
    text = f"a ansible_ssh_common_args='{args}'\n"
    text += f"b ansible_port=2400 ansible_ssh_common_args='{args}'\n"
    inv = load(tree(tmp_path, {"hosts": text}) / "hosts")
    transport = SSHTransport(SshSettings(ssh_config=config))
    a, b = transport.target(inv.host("a")), transport.target(inv.host("b"))
    assert a.known_hosts[-1] == Path("/inv/known")
    assert a.key_files == ("/inv/key", "/config/key")
    assert (a.port, b.port) == (2300, 2400)
    assert a.policy == "strict"
    assert a.identities_only
    assert not a.allow_agent  # IdentityAgent none from the inventory: the config's is not used


def test_the_inventory_proxy_wins_over_the_ssh_config(tmp_path: Path) -> None:
    config = tree(tmp_path, {"config": "Host *\n  ProxyJump config-bastion\n"}) / "config"
    text = "a ansible_ssh_common_args='-o ProxyJump=ops@inv-bastion:2200'\nb\n"
    inv = load(tree(tmp_path, {"hosts": text}) / "hosts")
    transport = SSHTransport(SshSettings(ssh_config=config))
    assert transport.target(inv.host("a")).proxy_jump == ("ops@inv-bastion:2200",)
    assert transport.target(inv.host("b")).proxy_jump == ("config-bastion",)
    command = "a ansible_ssh_common_args='-o ProxyCommand=\"nc %h %p\"'\n"
    inv = load(tree(tmp_path, {"hosts": command}) / "hosts")
    target = transport.target(inv.host("a"))
    assert (target.proxy_command, target.proxy_jump) == ("nc a 22", ())


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ("-o KnownHostsCommand=/bin/true", "-o KnownHostsCommand: fleet cannot honour it"),
        ("-o IdentityAgent=/tmp/agent.sock", "-o IdentityAgent: fleet cannot honour it"),
        ("-I /usr/lib/opensc-pkcs11.so", "-o PKCS11Provider: fleet cannot honour it"),
        ("-F ~/.ssh/other_config", "ssh option -F: fleet cannot take it"),
        ("-W %h:%p", "ssh option -W"),
        ("-N", "ssh option -N"),
        ("-p 99999", "Port: expected a number"),
        ("-o Host=x", "not an OpenSSH client option"),
        ("-o CanonicalizeHostname=yes", "only in an ssh config"),
        ("-o IdentityFile=%d/.ssh/id", "does not expand %-tokens"),
        ("-o NoSuchOption=1", "not an OpenSSH client option"),
        ("-o ProxyJump=a:99999", "ProxyJump: a hop's port"),
        ("-o ProxyCommand='nc %h %z'", "unknown token %z"),
        ("-o 'ProxyCommand=unbalanced", "unbalanced quotes"),
        ("-o", "without 'Option=value'"),
        ("stray", "ssh option an argument"),
    ],
)
def test_other_ssh_args_are_refused_naming_where(tmp_path: Path, args: str, words: str) -> None:
    text = f"[g]\na\nb\n[g:vars]\nansible_ssh_common_args={args}\n"
    path = tree(tmp_path, {"hosts": text}) / "hosts"
    problem = error(path, limit="a")
    assert problem.message.startswith(f"{path}:5: ansible_ssh_common_args")
    assert words in problem.message
    assert "(applies to a)" in problem.message


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (
            "localhost ansible_connection=local",
            "ansible_connection: is 'local': fleet connects over SSH",
        ),
        ("a ansible_connection=docker", "over SSH only"),
        ("a ansible_become_method=su", "ansible_become_method: is 'su'"),
        ("a ansible_become_user=postgres", "ansible_become_user: is 'postgres'"),
        ("a ansible_host='{{ inventory_hostname }}.mgmt'", "ansible_host: is a Jinja template"),
        ("a ansible_ssh_common_args='{{ jump_args }}'", "ansible_ssh_common_args: is a Jinja"),
    ],
)
def test_settings_fleet_cannot_follow_are_refused(tmp_path: Path, line: str, words: str) -> None:
    path = tree(tmp_path, {"hosts": f"[g]\n{line}\nok\n"}) / "hosts"
    assert names(load(path).select("ok")) == ["ok"]
    problem = error(path, limit="g")
    assert problem.message.startswith(f"{path}:2: ")
    assert words in problem.message


@pytest.mark.parametrize(
    "line",
    [
        "a ansible_connection=ssh ansible_become_method=sudo ansible_become_user=root",
        "a ansible_connection=paramiko ansible_become=true ansible_become_flags='-H -S'",
        "a ansible_password='' ansible_shell_type=sh",
    ],
)
def test_settings_that_agree_with_fleet_pass(tmp_path: Path, line: str) -> None:
    assert names(load(tree(tmp_path, {"hosts": line + "\n"}) / "hosts").select("a")) == ["a"]


# ---------------------------------------------------------------- patterns

PATTERNED = """\
[gpu]
gpu[01:06]
[a100]
gpu[01:03]
[h100]
gpu[04:06]
[staging]
gpu02
gpu05
[cpu]
cpu1
cpu2
"""


@pytest.fixture
def patterned(tmp_path: Path) -> Inventory:
    return load(tree(tmp_path, {"hosts": PATTERNED}) / "hosts")


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("gpu:cpu", "gpu01 gpu02 gpu03 gpu04 gpu05 gpu06 cpu1 cpu2"),
        ("gpu:!staging", "gpu01 gpu03 gpu04 gpu06"),
        ("gpu:&staging:!a100", "gpu05"),
        ("a100 h100", "gpu01 gpu02 gpu03 gpu04 gpu05 gpu06"),
        ("~gpu0[12]", "gpu01 gpu02"),
        ("~^c", "cpu1 cpu2"),
        ("gpu[0]", "gpu01"),
        ("gpu[-1]", "gpu06"),
        ("h100[1:]", "gpu05 gpu06"),
        ("gpu0[1-2],cpu1", "gpu01 gpu02 cpu1"),
        ("gpu[01,05]", "gpu01 gpu05"),
        ("staging[0:1]", "gpu02 gpu05"),  # no host is named staging0: Ansible's subscript
        ("gpu[1]", "gpu02"),  # no host gpu1 either
        ("gpu0[1:2]", "gpu01 gpu02"),  # nothing is called gpu0: fleet's range
        ("!gpu", "cpu1 cpu2"),
        ("*", "gpu01 gpu02 gpu03 gpu04 gpu05 gpu06 cpu1 cpu2"),
        # Separators as Ansible reads them: ':' with spaces around it, spaces alone, padding.
        ("gpu : cpu", "gpu01 gpu02 gpu03 gpu04 gpu05 gpu06 cpu1 cpu2"),
        ("gpu,  cpu", "gpu01 gpu02 gpu03 gpu04 gpu05 gpu06 cpu1 cpu2"),
        ("  gpu  ", "gpu01 gpu02 gpu03 gpu04 gpu05 gpu06"),
        (" !gpu", "cpu1 cpu2"),
        ("all:!gpu", "cpu1 cpu2"),
        ("gpu,&staging,!a100", "gpu05"),
        # A regex keeps its brackets, and a ':' inside them: only a ':' outside one separates.
        ("~gpu0[1-3]", "gpu01 gpu02 gpu03"),
        ("~gpu0[^1]", "gpu02 gpu03 gpu04 gpu05 gpu06"),
        ("~gpu0[:12]", "gpu01 gpu02"),
        ("~gpu0[12]:cpu1", "gpu01 gpu02 cpu1"),
        ("~(gpu|cpu)1", "cpu1"),
        ("~.*", "gpu01 gpu02 gpu03 gpu04 gpu05 gpu06 cpu1 cpu2"),
        # Subscripts and ranges next to ':' separators and ','.
        ("h100[0]:a100[0]", "gpu01 gpu04"),
        ("gpu[2:]", "gpu03 gpu04 gpu05 gpu06"),
        ("gpu[1-3]", "gpu02 gpu03 gpu04"),
        ("gpu0[1-3]:cpu1", "gpu01 gpu02 gpu03 cpu1"),
        ("gpu[01-03,05]", "gpu01 gpu02 gpu03 gpu05"),
        ("gpu0[!1]*", "gpu02 gpu03 gpu04 gpu05 gpu06"),
    ],
)
def test_ansible_and_fleet_pattern_forms(patterned: Inventory, pattern: str, expected: str) -> None:
    assert names(patterned.select(pattern)) == expected.split()


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("gpu[01:02]", "ambiguous: as host names it is gpu[01-02], as Ansible reads it gpu[02-03]"),
        ("cpu[1:2]", "as host names it is cpu[1-2], as Ansible reads it cpu2"),
        ("gpu,!gpu07", "'gpu07' matches no host or group"),
        ("gpu:!nosuch*", "'nosuch*' matches no host or group"),
        ("gpu[9]", "there is no [9]"),
        ("staging,&cpu", "selects no hosts"),
    ],
)
def test_pattern_errors(patterned: Inventory, pattern: str, words: str) -> None:
    """What this inventory makes of a well-formed pattern: a fleet error (exit 1)."""
    with pytest.raises(InventoryError) as info:
        patterned.select(pattern)
    assert words in info.value.message, info.value.message
    assert info.value.exit_code is ExitCode.FLEET_ERROR
    assert info.value.hint


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("gpu,,cpu", "empty term"),
        ("gpu:a100,cpu", "mixes ','"),
        ("~gpu(", "not a valid regular expression"),
        ("gpu[09-01]", "runs backwards"),
    ],
)
def test_malformed_patterns_are_usage_errors(
    patterned: Inventory, pattern: str, words: str
) -> None:
    """A pattern that cannot be read is a bad command line, as a bad -w is (exit 2)."""
    with pytest.raises(UsageError) as info:
        patterned.select(pattern)
    assert words in info.value.message, info.value.message
    assert info.value.exit_code is ExitCode.USAGE
    assert info.value.hint


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("", "--limit: empty pattern"),
        (" ", "--limit: empty pattern"),
        (":", "--limit ':' has an empty term"),
        ("::", "--limit '::' has an empty term"),
        (":::", "has an empty term"),
        (",", "--limit ',' has an empty term"),
        ("gpu01,", "has an empty term"),
        ("gpu:", "--limit 'gpu:' has an empty term"),
        (":gpu", "has an empty term"),
        ("gpu::cpu", "has an empty term"),
        ("gpu: :cpu", "has an empty term"),
        ("!", "--limit '!' has an empty term"),
        ("&", "has an empty term"),
        ("all,!", "has an empty term"),
        ("all:!", "has an empty term"),
        ("~", "'~' has no regular expression after '~'"),
        ("!~", "'!~' has no regular expression"),
        ("~[", "unbalanced bracket in '~['"),
        ("~gpu0[", "unbalanced bracket in '~gpu0['"),
        ("~[a", "unbalanced bracket in '~[a'"),
        ("gpu01]", "unbalanced bracket in 'gpu01]'"),
        ("cpu:gpu01]", "unbalanced bracket in 'gpu01]'"),
        ("gpu[01-03,cpu1", "unbalanced bracket in 'gpu[01-03'"),
        ("gpu[5-1]", "range '[5-1]' in 'gpu[5-1]' runs backwards"),
        ("~(gpu", "'~(gpu' is not a valid regular expression"),
    ],
)
def test_unreadable_patterns_are_usage_errors_naming_the_bad_part(
    patterned: Inventory, pattern: str, words: str
) -> None:
    """Ansible's splitter drops what it cannot read (`:`, a lone bracket), and an empty pattern
    was no pattern: each of these selected every host. Now: refused, naming what is wrong."""
    with pytest.raises(UsageError) as info:
        patterned.select(pattern)
    assert words in info.value.message, info.value.message
    assert info.value.exit_code is ExitCode.USAGE
    assert info.value.hint


def test_a_plain_term_naming_a_host_and_a_group_is_the_host(tmp_path: Path) -> None:
    """As in Ansible: `x` is the host x; `&x`/`!x` resolve x as the group."""
    inv = load(tree(tmp_path, {"hosts": "x\ny\n[x]\ny\n"}) / "hosts")
    assert names(inv.select("x")) == ["x"]
    assert names(inv.select("all:!x")) == ["x"]


def test_inline_vault_values_in_the_inventory_itself_are_left_out_with_a_warning(
    tmp_path: Path, run_main: Callable[..., tuple[int, str, str]]
) -> None:
    """As in host_vars: docs/guides/from-ansible-pdsh.md promises `!vault` values are skipped
    with a warning, not that one of them rejects the whole inventory."""
    root = tree(
        tmp_path,
        {
            "inventory.yaml": """\
                all:
                  vars:
                    ansible_user: deploy
                    wandb_key: !vault |
                      $ANSIBLE_VAULT;1.1;AES256
                      6162
                  hosts:
                    gpu01:
                      ansible_host: 10.0.0.1
                      hf_token: !vault "$ANSIBLE_VAULT;1.1;AES256 6364"
                      output_dir: /ckpt
                  children:
                    h100:
                      hosts:
                        gpu02:
                      vars:
                        tokens: [!vault "$ANSIBLE_VAULT;1.1;AES256 6364"]
                        note: "a string with !vault in it"
            """,
        },
    )
    inv = load(root / "inventory.yaml")
    assert sorted(inv.host("gpu01").vars) == ["ansible_host", "ansible_user", "output_dir"]
    assert inv.host("gpu01").address == "10.0.0.1"
    assert dict(inv.host("gpu02").vars) == {
        "ansible_user": "deploy",
        "note": "a string with !vault in it",
    }
    path = root / "inventory.yaml"
    assert [w.split(": ")[0:2] for w in inv.warnings] == [
        [f"{path}:4", "all.vars.wandb_key"],
        [f"{path}:10", "all.hosts.gpu01.hf_token"],
        [f"{path}:17", "all.children.h100.vars.tokens"],
    ]
    assert all("ansible-vault value" in w for w in inv.warnings)
    assert not any("6162" in w or "6364" in w for w in inv.warnings)
    code, out, err = run_main("hosts", "-i", str(path), "--json")
    assert code == 0, err
    assert [h["name"] for h in json.loads(out)] == ["gpu01", "gpu02"]
    assert err.count("fleet: warning: ") == 3


def test_an_inline_vaulted_password_in_the_inventory_is_refused_like_any_password(
    tmp_path: Path,
) -> None:
    vaulted = "all:\n  hosts:\n    a:\n      ansible_password: !vault |\n        $ANSIBLE_VAULT;1\n"
    root = tree(tmp_path, {"inventory.yaml": vaulted})
    assert "fleet takes no passwords" in error(root / "inventory.yaml", limit="all").message
