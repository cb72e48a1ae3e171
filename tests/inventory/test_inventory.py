"""The inventory: Ansible's YAML layout, variable precedence, --limit selection, and errors that
say which file, where in it, and what to do next."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.core.errors import ExitCode, InventoryError, UsageError
from fleet.inventory.loader import Inventory, load_inventory

Load = Callable[[str], Inventory]

CLUSTER = """\
all:
  vars:
    level: all
    from_all: yes
  hosts:
    login:
      ansible_host: 10.0.0.9
  children:
    gpu:
      vars:
        level: gpu
        from_gpu: yes
      hosts:
        gpu[01:04]:
      children:
        a100:
          vars:
            level: a100
          hosts:
            gpu[03-04]:
            gpu09:
              level: host
        h100:
          hosts:
            gpu[05-06]:
    cpu:
      hosts:
        cpu[1-2]:
"""


def names(hosts: list) -> list[str]:
    return [h.name for h in hosts]


def assert_error(
    error: InventoryError, path: Path, *, place: str | None = None, line: int | None = None
) -> None:
    """A user-facing inventory error: file path, the place in it, and a non-empty hint."""
    assert str(path) in error.message
    if line is not None:
        assert f"{path}:{line}" in error.message, error.message
    if place is not None:
        assert place in error.message, error.message
    assert error.hint.strip()
    assert error.exit_code is ExitCode.FLEET_ERROR


# ---------------------------------------------------------------- layout


def test_hosts_keep_file_order_and_ranges_expand(inventory: Load) -> None:
    inv = inventory(CLUSTER)
    assert names(list(inv.hosts)) == [
        "login",
        "gpu01",
        "gpu02",
        "gpu03",
        "gpu04",
        "gpu09",
        "gpu05",
        "gpu06",
        "cpu1",
        "cpu2",
    ]


def test_group_members_include_those_of_child_groups(inventory: Load) -> None:
    inv = inventory(CLUSTER)
    assert inv.groups["a100"] == ("gpu03", "gpu04", "gpu09")
    assert inv.groups["gpu"] == ("gpu01", "gpu02", "gpu03", "gpu04", "gpu09", "gpu05", "gpu06")
    assert inv.groups["all"] == tuple(h.name for h in inv.hosts)


def test_host_lists_every_group_it_belongs_to_through_nesting(inventory: Load) -> None:
    inv = inventory(CLUSTER)
    assert set(inv.host("gpu09").groups) == {"gpu", "a100"}
    assert inv.host("login").groups == ()
    assert inv.host("cpu1").groups == ("cpu",)


def test_top_level_groups_without_all(inventory: Load) -> None:
    inv = inventory(
        """\
        gpu:
          vars: {role: train}
          hosts:
            gpu[1-2]:
        storage:
          hosts:
            nfs1:
        """
    )
    assert names(list(inv.hosts)) == ["gpu1", "gpu2", "nfs1"]
    assert inv.groups["gpu"] == ("gpu1", "gpu2")
    assert inv.groups["all"] == ("gpu1", "gpu2", "nfs1")
    assert inv.host("gpu1").vars["role"] == "train"
    assert "role" not in inv.host("nfs1").vars


def test_host_with_null_body_connects_to_its_own_name(inventory: Load) -> None:
    inv = inventory("all:\n  hosts:\n    gpu01:\n")
    host = inv.host("gpu01")
    assert (host.address, host.port, host.user, host.key_file) == ("gpu01", None, None, None)
    assert host.target == "gpu01"


def test_host_in_two_groups_is_listed_once(inventory: Load) -> None:
    inv = inventory(
        """\
        all:
          children:
            a: {hosts: {gpu01: , gpu02: }}
            b: {hosts: {gpu02: , gpu03: }}
        """
    )
    assert names(list(inv.hosts)) == ["gpu01", "gpu02", "gpu03"]
    assert set(inv.host("gpu02").groups) == {"a", "b"}


# ---------------------------------------------------------------- connection vars


def test_ansible_connection_vars(inventory: Load) -> None:
    inv = inventory(
        """\
        all:
          hosts:
            gpu01:
              ansible_host: 10.0.0.1
              ansible_port: 2222
              ansible_user: train
              ansible_ssh_private_key_file: /keys/id_ed25519
        """
    )
    host = inv.host("gpu01")
    assert (host.address, host.port, host.user, host.key_file) == (
        "10.0.0.1",
        2222,
        "train",
        "/keys/id_ed25519",
    )
    assert host.target == "train@10.0.0.1:2222"


def test_short_connection_vars(inventory: Load) -> None:
    inv = inventory(
        """\
        all:
          hosts:
            gpu01: {host: 10.0.0.1, port: "2200", user: ops, key: /k}
        """
    )
    host = inv.host("gpu01")
    assert (host.address, host.port, host.user, host.key_file) == ("10.0.0.1", 2200, "ops", "/k")


def test_long_form_wins_over_short_form(inventory: Load) -> None:
    inv = inventory("all:\n  hosts:\n    gpu01: {ansible_host: 10.0.0.1, host: 10.9.9.9}\n")
    assert inv.host("gpu01").address == "10.0.0.1"


def test_key_file_tilde_is_expanded(inventory: Load, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/op")
    inv = inventory("all:\n  hosts:\n    gpu01: {key: ~/.ssh/fleet}\n")
    assert inv.host("gpu01").key_file == "/home/op/.ssh/fleet"


def test_connection_vars_inherit_from_groups(inventory: Load) -> None:
    inv = inventory(
        """\
        all:
          vars: {ansible_user: root}
          children:
            gpu:
              vars: {ansible_port: 2222}
              hosts:
                gpu01:
                gpu02: {ansible_port: 22}
        """
    )
    assert (inv.host("gpu01").user, inv.host("gpu01").port) == ("root", 2222)
    assert inv.host("gpu02").port == 22


# ---------------------------------------------------------------- precedence


def test_var_precedence_all_then_parent_then_child_then_host(inventory: Load) -> None:
    inv = inventory(CLUSTER)
    assert inv.host("login").vars["level"] == "all"
    assert inv.host("gpu01").vars["level"] == "gpu"
    assert inv.host("gpu03").vars["level"] == "a100"
    assert inv.host("gpu09").vars["level"] == "host"
    assert inv.host("gpu05").vars["level"] == "gpu"  # h100 sets nothing: its parent's value


def test_vars_from_every_layer_are_merged(inventory: Load) -> None:
    v = inventory(CLUSTER).host("gpu03").vars
    assert v["from_all"] is True
    assert v["from_gpu"] is True


def test_child_group_wins_even_when_listed_before_its_parent_in_the_file(inventory: Load) -> None:
    inv = inventory(
        """\
        a100:
          vars: {level: a100}
          hosts:
            gpu01:
        gpu:
          vars: {level: gpu}
          children:
            a100:
        """
    )
    assert inv.host("gpu01").vars["level"] == "a100"


def test_top_level_vars_of_all_lose_to_groups_without_all_key(inventory: Load) -> None:
    inv = inventory(
        """\
        all:
          vars: {level: all}
        gpu:
          vars: {level: gpu}
          hosts:
            gpu01:
        """
    )
    assert inv.host("gpu01").vars["level"] == "gpu"


# ---------------------------------------------------------------- --limit

SELECT_CASES = [
    (
        None,
        ["login", "gpu01", "gpu02", "gpu03", "gpu04", "gpu09", "gpu05", "gpu06", "cpu1", "cpu2"],
    ),
    (
        "all",
        ["login", "gpu01", "gpu02", "gpu03", "gpu04", "gpu09", "gpu05", "gpu06", "cpu1", "cpu2"],
    ),
    ("gpu03", ["gpu03"]),
    ("a100", ["gpu03", "gpu04", "gpu09"]),
    ("gpu", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu09", "gpu05", "gpu06"]),
    ("gpu0[1-2]", ["gpu01", "gpu02"]),
    ("gpu0[1:2]", ["gpu01", "gpu02"]),
    ("gpu[02,05]", ["gpu02", "gpu05"]),
    ("cpu*", ["cpu1", "cpu2"]),
    ("gpu0?", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu09", "gpu05", "gpu06"]),
    ("h1*", ["gpu05", "gpu06"]),  # a glob matches group names too
    ("cpu2,login", ["login", "cpu2"]),  # inventory order, not limit order
    ("gpu[05-06],gpu01", ["gpu01", "gpu05", "gpu06"]),
    ("gpu,&a100", ["gpu03", "gpu04", "gpu09"]),
    ("gpu,!a100", ["gpu01", "gpu02", "gpu05", "gpu06"]),
    ("gpu, !a100, !gpu0[1]", ["gpu02", "gpu05", "gpu06"]),
    ("!gpu", ["login", "cpu1", "cpu2"]),
    ("&cpu", ["cpu1", "cpu2"]),
    ("all,!cpu,!gpu", ["login"]),
]


@pytest.mark.parametrize(("limit", "expected"), SELECT_CASES)
def test_limit_selects_in_inventory_order(
    inventory: Load, limit: str | None, expected: list[str]
) -> None:
    assert names(inventory(CLUSTER).select(limit)) == expected


def test_limit_range_keeps_only_hosts_that_exist(inventory: Load) -> None:
    assert names(inventory(CLUSTER).select("gpu0[1-8]")) == [
        "gpu01",
        "gpu02",
        "gpu03",
        "gpu04",
        "gpu05",
        "gpu06",
    ]


def test_limit_accepts_a_folded_host_set_from_a_message(inventory: Load) -> None:
    from fleet.core.nodeset import fold

    inv = inventory(CLUSTER)
    wanted = ["login", "gpu01", "gpu03", "gpu04", "cpu2"]
    assert names(inv.select(fold(wanted))) == wanted


def test_limit_matching_nothing_names_file_limit_and_groups(inventory: Load) -> None:
    inv = inventory(CLUSTER)
    with pytest.raises(InventoryError) as info:
        inv.select("tpu*")
    assert str(inv.path) in info.value.message
    assert "tpu*" in info.value.message
    assert "a100" in info.value.hint


def test_limit_whose_terms_exclude_everything_fails(inventory: Load) -> None:
    inv = inventory(CLUSTER)
    with pytest.raises(InventoryError) as info:
        inv.select("a100,&cpu")
    assert str(inv.path) in info.value.message
    assert "a100,&cpu" in info.value.message
    assert info.value.hint


def test_limit_with_bad_range_is_a_usage_error(inventory: Load) -> None:
    """As -w's bad range is: the command line is wrong, whatever the inventory holds (exit 2)."""
    with pytest.raises(UsageError) as info:
        inventory(CLUSTER).select("gpu[09-01]")
    assert "gpu[09-01]" in info.value.message
    assert info.value.exit_code is ExitCode.USAGE
    assert info.value.hint


@pytest.mark.parametrize("limit", ["gpu01,,gpu02", "", "  ", "gpu01:", "!"])
def test_limit_with_empty_term_is_a_usage_error(inventory: Load, limit: str) -> None:
    """An empty (or blank) --limit is refused, never every host: `-l "$UNSET"`."""
    with pytest.raises(UsageError) as info:
        inventory(CLUSTER).select(limit)
    assert "empty" in info.value.message
    assert info.value.exit_code is ExitCode.USAGE
    assert info.value.hint


# ---------------------------------------------------------------- errors


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, place="no such file")
    assert "-i" in info.value.hint


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory(tmp_path)
    assert_error(info.value, tmp_path, place="directory")


def test_default_path_comes_from_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "env-inventory.yaml"
    path.write_text("all:\n  hosts:\n    gpu01:\n", encoding="utf-8")
    monkeypatch.setenv("FLEET_INVENTORY", str(path))
    assert load_inventory().path == path


def test_malformed_yaml_names_line(write: Callable[[str, str], Path]) -> None:
    path = write("inv.yaml", "all:\n  hosts:\n    gpu01: {ansible_host: 10.0.0.1\n    gpu02:\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, place="invalid YAML")
    assert re.search(rf"{re.escape(str(path))}:\d+", info.value.message)


def test_tab_indentation_is_malformed_yaml(write: Callable[[str, str], Path]) -> None:
    path = write("inv.yaml", "all:\n\thosts:\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, line=2)


def test_duplicate_host_names_both_lines(write: Callable[[str, str], Path]) -> None:
    path = write("inv.yaml", "all:\n  hosts:\n    gpu01:\n    gpu02:\n    gpu01:\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, line=5, place="duplicate key 'gpu01'")
    assert "line 3" in info.value.message


def test_duplicate_group_key(write: Callable[[str, str], Path]) -> None:
    path = write(
        "inv.yaml",
        "all:\n  children:\n    gpu:\n      hosts: {a: }\n    gpu:\n      hosts: {b: }\n",
    )
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, line=5, place="duplicate key 'gpu'")


def test_merge_keys_are_refused(write: Callable[[str, str], Path]) -> None:
    path = write(
        "inv.yaml",
        "base: &b {vars: {x: 1}}\nall:\n  <<: *b\n  hosts:\n    gpu01:\n",
    )
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, line=3, place="merge")


@pytest.mark.parametrize(
    ("text", "line", "place"),
    [
        pytest.param(
            "all:\n  hosts:\n    gpu01:\n      ansible_port: x\n",
            4,
            "gpu01.ansible_port",
            id="port-not-a-number",
        ),
        pytest.param(
            "all:\n  hosts:\n    gpu01:\n      port: 70000\n", 4, "gpu01.port", id="port-range"
        ),
        pytest.param("all:\n  hosts:\n    gpu01:\n      user: 5\n", 4, "gpu01.user", id="user-int"),
        pytest.param(
            "all:\n  vars:\n    ansible_port: x\n  hosts:\n    gpu01:\n",
            3,
            "all.vars.ansible_port",
            id="group-var-port",
        ),
    ],
)
def test_wrong_type_of_connection_var_points_at_it(
    write: Callable[[str, str], Path], text: str, line: int, place: str
) -> None:
    """Style rule 7: `inventory.yaml: hosts.gpu03.port: expected an integer, got 'x'`."""
    path = write("inv.yaml", text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = info.value.message
    assert str(path) in message
    assert f"{path}:{line}:" in message or place in message, message
    assert info.value.hint


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ("{ansible_port: x}", "ansible_port"),
        ("{ansible_port: true}", "ansible_port"),
        ("{port: 0}", "port"),
        ("{port: 65536}", "port"),
        ("{ansible_user: 5}", "ansible_user"),
        ("{key: [a]}", "key"),
    ],
)
def test_wrong_types_of_connection_vars_are_refused(
    write: Callable[[str, str], Path], body: str, key: str
) -> None:
    path = write("inv.yaml", f"all:\n  hosts:\n    gpu00:\n    gpu01: {body}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, place="gpu01")
    assert key in info.value.message


def test_wrong_type_of_address_is_an_error(write: Callable[[str, str], Path]) -> None:
    path = write("inv.yaml", "all:\n  hosts:\n    gpu01:\n      ansible_host: 5\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, place="gpu01")
    assert "non-empty string" in info.value.message


@pytest.mark.parametrize(
    ("text", "line", "place"),
    [
        ("all:\n  vars:\n    - a\n  hosts:\n    gpu01:\n", 2, "all.vars"),
        ("all:\n  hosts:\n    gpu01: [a, b]\n", 3, "all.hosts.gpu01"),
        ("all:\n  hosts: [gpu01, gpu02]\n", 2, "all.hosts"),
        ("all:\n  children: [gpu]\n  hosts: {a: }\n", 2, "all.children"),
        ("all: [gpu01]\n", 1, "all"),
        ("all:\n  hosts:\n    gpu01: {9lives: 1}\n", 3, "all.hosts.gpu01.9lives"),
        ("all:\n  vars: {bad-name: 1}\n  hosts: {a: }\n", 2, "all.vars.bad-name"),
        ("all:\n  children:\n    'bad group':\n      hosts: {a: }\n", 3, "bad group"),
    ],
)
def test_wrong_shapes_name_file_line_and_dotted_path(
    write: Callable[[str, str], Path], text: str, line: int, place: str
) -> None:
    path = write("inv.yaml", text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, line=line, place=place)


def test_unknown_key_in_a_group_is_named_with_its_line(write: Callable[[str, str], Path]) -> None:
    path = write(
        "inv.yaml",
        """\
        all:
          children:
            gpu:
              host:
                gpu01:
        """,
    )
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, line=4, place="all.children.gpu.host")
    assert "unknown key 'host'" in info.value.message
    assert "hosts" in info.value.hint


@pytest.mark.parametrize("key", ["gpu[16-01]", "gpu[01-]", "gpu[01-04", "gpu[1-9999999]"])
def test_bad_range_as_host_key(write: Callable[[str, str], Path], key: str) -> None:
    path = write("inv.yaml", f"all:\n  hosts:\n    gpu00:\n    '{key}':\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, line=4, place=f"all.hosts.{key}")
    assert "gpu[01" in info.value.hint


def test_group_that_contains_itself(write: Callable[[str, str], Path]) -> None:
    path = write(
        "inv.yaml",
        "all:\n  children:\n    gpu:\n      hosts: {a: }\n      children:\n        gpu:\n",
    )
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, line=6, place="all.children.gpu.children.gpu")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_empty_file(write: Callable[[str, str], Path], text: str) -> None:
    path = write("inv.yaml", text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, place="empty")


def test_top_level_list_is_refused(write: Callable[[str, str], Path]) -> None:
    path = write("inv.yaml", "- gpu01\n- gpu02\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, place="mapping")
    assert "all:" in info.value.hint


@pytest.mark.parametrize(
    "text",
    [
        "all:\n  vars: {a: 1}\n",
        "all:\n",
        "all:\n  children:\n    gpu:\n      vars: {x: 1}\n",
    ],
)
def test_inventory_without_hosts(write: Callable[[str, str], Path], text: str) -> None:
    path = write("inv.yaml", text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, place="no hosts")


# ---------------------------------------------------------------- abuse: files that are not
# inventories, alias bombs, nesting; the loader must refuse them quickly and never echo them.

SHADOW = (
    "root:$y$j9T$Hs1kT0pSecr3tSalt$Hs1kT0pSecr3tHashValue0123456789abcdefgh:19700:0:99999:7:::\n"
    "daemon:*:19700:0:99999:7:::\n"
    "alice:abJnggxhB/yWI:19700:0:99999:7:::\n"
)
SECRETS = ("Hs1kT0pSecr3t", "abJnggxhB")


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(SHADOW, id="shadow"),
        pytest.param(SHADOW.replace(":::\n", "\n"), id="shadow-as-one-scalar"),
        pytest.param("api_token: Hs1kT0pSecr3t-abJnggxhB\n", id="secret-value"),
        pytest.param("all:\n  hosts:\n    gpu01: {ansible_host: [Hs1kT0pSecr3t]}\n", id="list"),
        pytest.param("all:\n  hosts:\n    gpu01: {ansible_user: *Hs1kT0pSecr3t}\n", id="alias"),
        pytest.param("all:\n  hosts:\n    gpu01: !Hs1kT0pSecr3t abJnggxhB\n", id="tag"),
        pytest.param("all:\n  hosts:\n    gpu01: {user: 'Hs1kT0pSecr3t\n", id="unterminated"),
        pytest.param("all:\n  hosts:\n    Hs1kT0pSecr3t$: {a: }\n", id="bad-host-name"),
        pytest.param("all:\n  children:\n    abJnggxhB/x: {hosts: {a: }}\n", id="bad-group"),
    ],
)
def test_errors_never_echo_what_the_file_says(write: Callable[[str, str], Path], text: str) -> None:
    """`-i /etc/shadow` printed root's hash: errors name the file, line and problem only."""
    path = write("not-an-inventory", text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert str(path) in info.value.message
    assert info.value.hint
    for secret in SECRETS:
        assert secret not in info.value.message
        assert secret not in info.value.hint


def test_a_binary_file_is_named_without_its_bytes(write: Callable[[str, str], Path]) -> None:
    path = write("inv.yaml", "")
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff Hs1kT0pSecr3t")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert f"{path}: not UTF-8 text" in info.value.message
    assert "Hs1kT0pSecr3t" not in info.value.message


def test_a_device_that_never_ends_is_refused_at_once() -> None:
    """`-i /dev/zero` is not a regular file: refused before a byte is read, never read until
    memory runs out."""
    with pytest.raises(InventoryError) as info:
        load_inventory(Path("/dev/zero"))
    assert "/dev/zero: not a regular file (a character device)" in info.value.message
    assert info.value.hint


def _fleet(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m fleet ARGV` in tmp_path, bounded: a read that blocks fails the test by
    timing out instead of hanging the suite."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "no-config")
    return subprocess.run(
        [sys.executable, "-m", "fleet", *argv],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("files", "argv", "fifo"),
    [
        ({}, ["-i", "inv.yaml"], "inv.yaml"),
        ({"inv.yaml": "gpu01\n"}, ["-i", "inv.yaml"], "group_vars/all.yaml"),
        ({"inv.yaml": "gpu01\n"}, ["-i", "inv.yaml"], "host_vars/gpu01.yml"),
        ({}, ["-w", "^nodes"], "nodes"),
    ],
)
def test_a_fifo_is_refused_at_once_not_waited_on(
    tmp_path: Path, files: dict[str, str], argv: list[str], fifo: str
) -> None:
    """Opening a FIFO blocks until someone writes to it: `fleet hosts -i FIFO` hung forever."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / fifo).parent.mkdir(exist_ok=True)
    os.mkfifo(tmp_path / fifo)
    proc = _fleet(tmp_path, "hosts", *argv)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert f"fleet: error: {fifo}: not a regular file (a FIFO)\n" in proc.stderr
    assert "hint: " in proc.stderr


@pytest.mark.parametrize(
    "argv", [["-i", "<(printf 'gpu01\\ngpu02\\n')"], ["-w", "^<(printf 'gpu01\\ngpu02\\n')"]]
)
def test_the_shells_process_substitution_is_read_though_it_is_a_pipe(
    tmp_path: Path, argv: list[str]
) -> None:
    """`-i <(command)` is the operator's own pipe (/dev/fd/N, inherited from the shell), not a
    FIFO someone left: read, as a file is."""
    script = f"exec {shlex.join([sys.executable, '-m', 'fleet', 'hosts', '--json'])} " + " ".join(
        [argv[0], argv[1]]
    )
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("FLEET_")},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert [h["name"] for h in json.loads(proc.stdout)] == ["gpu01", "gpu02"]


def _bomb(levels: int) -> str:
    """A 'billion laughs': each level is 9 aliases of the one before, under all.vars."""
    lines = ["all:", "  hosts: {gpu01: }", "  vars:", '    l0: &l0 ["lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_it_expands(write: Callable[[str, str], Path]) -> None:
    """12 lines of nested aliases took 24 s and 1.3 GB; one level more died of MemoryError.
    This one (3 x 9^6 = 1.6M strings) would load, slowly; it must be refused instead."""
    path = write("inv.yaml", _bomb(6))
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path)
    assert "aliases expand" in info.value.message
    assert re.search(rf"{re.escape(str(path))}:\d+: ", info.value.message)


def test_modest_alias_use_still_loads(write: Callable[[str, str], Path]) -> None:
    """Reusing one vars block per host is what aliases are for; it stays within the budget."""
    hosts = "".join(f"    gpu{i:03d}: *common\n" for i in range(300))
    text = "all:\n  vars:\n    common: &common {gpus: 8, rack: r1}\n  hosts:\n" + hosts
    inv = load_inventory(write("inv.yaml", text))
    assert len(inv.hosts) == 300
    assert inv.hosts[-1].vars["rack"] == "r1"
    assert inv.hosts[0].vars["common"] == {"gpus": 8, "rack": "r1"}


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        pytest.param("all: &a\n  hosts: {gpu01: }\n  vars: {x: *a}\n", 3, "recursive", id="self"),
        pytest.param("all: " + "[" * 5000 + "]" * 5000 + "\n", 1, "nested", id="deep-flow"),
        pytest.param("all:\n  vars: {when: 2001-13-45}\n", 2, "timestamp", id="bad-date"),
    ],
)
def test_structures_that_crashed_the_loader_are_errors(
    write: Callable[[str, str], Path], text: str, line: int, words: str
) -> None:
    """These ended in `internal error: RecursionError` / `ValueError` tracebacks."""
    path = write("inv.yaml", text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, line=line)
    assert words in info.value.message


def test_a_second_document_is_refused_at_its_line(write: Callable[[str, str], Path]) -> None:
    path = write("inv.yaml", "all:\n  hosts: {a: }\n---\nall: {}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert_error(info.value, path, line=3, place="more than one")
