"""Node sets and hostfiles, written from pdsh's, clush's, Slurm's, DeepSpeed's, OpenMPI's and
MPICH's own documentation examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.core.errors import InventoryError, UsageError
from fleet.inventory import hostlist


def _names(entries: list[hostlist.Entry]) -> list[str]:
    return [e.name for e in entries]


@pytest.mark.parametrize(
    ("nodeset", "expected"),
    [
        ("foo[01-05]", ["foo01", "foo02", "foo03", "foo04", "foo05"]),  # pdsh(1)
        ("foo[7,9-10]", ["foo7", "foo9", "foo10"]),  # pdsh(1)
        ("host1,host2", ["host1", "host2"]),
        ("node[1-5,10]", ["node1", "node2", "node3", "node4", "node5", "node10"]),  # clush(1)
        ("tux[0-3,8]", ["tux0", "tux1", "tux2", "tux3", "tux8"]),  # Slurm node list
        ("gpu-[01-04,09]", ["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-09"]),
        ("linux[1-2],dev[5,7]", ["linux1", "linux2", "dev5", "dev7"]),
        ("a1,a1,a2", ["a1", "a2"]),
    ],
)
def test_node_sets_from_the_tools_documentation(nodeset: str, expected: list[str]) -> None:
    entries = hostlist.parse_nodeset(nodeset)
    assert _names(entries) == expected
    assert {e.source for e in entries} == {"-w"}


def test_user_at_host_and_a_file_of_names(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("n1\nn2 # spare\n")
    entries = hostlist.parse_nodeset(f"root@gpu[1-2],^{hosts}")
    assert [(e.name, e.user) for e in entries] == [
        ("gpu1", "root"),
        ("gpu2", "root"),
        ("n1", None),
        ("n2", None),
    ]
    assert entries[3].source == f"{hosts}:2"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("", "empty node set"),
        ("a,,b", "empty item"),
        ("gpu[3-1]", "runs backwards"),
        ("gpu[01-04", "brackets"),
        ("bad user@n1", "bad user"),
    ],
)
def test_bad_node_sets_are_usage_errors(bad: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        hostlist.parse_nodeset(bad)
    assert info.value.hint


DEEPSPEED = "worker-1 slots=4\nworker-2 slots=4\n"  # DeepSpeed's "Resource Configuration"
OPENMPI = """\
# This is an example hostfile.  Comments begin with #
#
# The following node is a single processor machine:
foo.example.com

# The following node is a dual-processor machine:
bar.example.com slots=2

# The following node is a quad-processor machine, and we absolutely
# want to disallow over-subscribing it:
yow.example.com slots=4 max-slots=4
"""
MPICH = "host1:2\nhost2:4\nhost3\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (DEEPSPEED, [("worker-1", 4), ("worker-2", 4)]),
        (OPENMPI, [("foo.example.com", None), ("bar.example.com", 2), ("yow.example.com", 4)]),
        (MPICH, [("host1", 2), ("host2", 4), ("host3", None)]),
        ("gpu[01-02] slots=8\n", [("gpu01", 8), ("gpu02", 8)]),
    ],
)
def test_hostfiles_are_recognised_and_slots_become_gpus(
    text: str, expected: list[tuple[str, int | None]], tmp_path: Path
) -> None:
    assert hostlist.looks_like_hostfile(text)
    entries = hostlist.parse_hostfile(text, tmp_path / "hostfile")
    assert [(e.name, e.gpus) for e in entries] == expected
    assert entries[0].source.startswith(f"{tmp_path / 'hostfile'}:")


@pytest.mark.parametrize(
    "text",
    [
        "all:\n  hosts:\n    a: {}\n",  # YAML inventory
        "[gpu]\nnode1\n",  # INI inventory with a group
        "node1 ansible_host=10.0.0.1\n",  # INI host with vars
        "",
        "# only a comment\n",
    ],
)
def test_inventories_are_not_taken_for_hostfiles(text: str) -> None:
    assert not hostlist.looks_like_hostfile(text)


def test_bad_hostfile_lines_name_file_and_line_without_echoing(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    with pytest.raises(InventoryError) as info:
        hostlist.parse_hostfile("worker-1 slots=8\nroot:x:0:0:secret\n", path)
    assert str(info.value) == f"{path}:2: not a hostfile line"
    assert "secret" not in str(info.value) + info.value.hint
    with pytest.raises(
        InventoryError, match=r":2: host worker-1 is listed twice \(first at .*:1\)"
    ):
        hostlist.parse_hostfile("worker-1 slots=8\nworker-1 slots=8\n", path)
    with pytest.raises(InventoryError, match="slots must be at least 1"):
        hostlist.parse_hostfile("worker-1 slots=0\n", path)


# ---------------------------------------------------------------- issue 17: hostfile tokens


@pytest.mark.parametrize(
    ("text", "token"),
    [
        ("node1 slots=8\nnode2 slots=x\n", "'slots=x'"),
        ("node1 slots=8\nnode2 slots=\n", "'slots='"),
        ("node1 slots=8\nnode2 slots=8.0\n", "'slots=8.0'"),
        ("node1 slots=8\nnode2 slot=4\n", "'slot'"),
        ("node1 slots=8\nnode2 slots=4 gpus=4\n", "'gpus'"),
    ],
)
def test_one_bad_slots_token_is_a_file_line_error_not_an_ini_inventory(
    text: str, token: str, tmp_path: Path
) -> None:
    """A DeepSpeed hostfile with one typo must not turn into an Ansible INI inventory with no
    slots at all (every host's gpus silently dropped)."""
    path = tmp_path / "hostfile"
    assert hostlist.looks_like_hostfile(text)
    with pytest.raises(InventoryError) as info:
        hostlist.parse_hostfile(text, path)
    assert str(info.value).startswith(f"{path}:2: ")
    assert token in str(info.value)
    assert "slots=8" in info.value.hint


def test_a_bad_token_shows_its_key_never_another_keys_value(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as info:
        hostlist.parse_hostfile("node1 slots=8\nnode2 password=hunter2\n", tmp_path / "h")
    assert "'password'" in str(info.value)
    assert "hunter2" not in str(info.value) + info.value.hint


def test_a_utf8_bom_at_the_start_of_a_hostfile_is_not_part_of_the_first_name(
    tmp_path: Path,
) -> None:
    text = "\ufeffworker-1 slots=4\nworker-2 slots=4\n"
    assert hostlist.looks_like_hostfile(text)
    entries = hostlist.parse_hostfile(text, tmp_path / "hostfile")
    assert [(e.name, e.gpus) for e in entries] == [("worker-1", 4), ("worker-2", 4)]
    names = tmp_path / "names"
    names.write_bytes(b"\xef\xbb\xbfn1\nn2\n")
    assert _names(hostlist.parse_nodeset(f"^{names}")) == ["n1", "n2"]


# ---------------------------------------------------------------- issue 17: ports and IPv6


@pytest.mark.parametrize(
    ("nodeset", "expected"),
    [
        ("gpu01:2222", [("gpu01", None, 2222)]),
        ("root@gpu01:2222", [("gpu01", "root", 2222)]),
        ("10.0.0.5:2200", [("10.0.0.5", None, 2200)]),
        (
            "gpu[01-02]:2222,cpu1",
            [("gpu01", None, 2222), ("gpu02", None, 2222), ("cpu1", None, None)],
        ),
        ("gpu[01:02]:2222", [("gpu01", None, 2222), ("gpu02", None, 2222)]),
        ("fd00::1", [("fd00::1", None, None)]),
        ("[fd00::1]", [("fd00::1", None, None)]),
        ("[fd00::1]:22", [("fd00::1", None, 22)]),
        ("user@[fd00::1]:2222", [("fd00::1", "user", 2222)]),
        (
            "fd00::1,[fd00::2]:2222,gpu[1-2]",
            [
                ("fd00::1", None, None),
                ("fd00::2", None, 2222),
                ("gpu1", None, None),
                ("gpu2", None, None),
            ],
        ),
    ],
)
def test_host_port_and_ipv6_addresses_in_a_node_set(
    nodeset: str, expected: list[tuple[str, str | None, int | None]]
) -> None:
    entries = hostlist.parse_nodeset(nodeset)
    assert [(e.name, e.user, e.port) for e in entries] == expected


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("gpu01:0", "port 0 is not 1-65535"),
        ("gpu01:70000", "port 70000 is not 1-65535"),
        ("gpu01:ssh", "'gpu01:ssh': a port is a number"),
        ("[fd00::zz]:22", "'[fd00::zz]' is not an IPv6 address"),
        ("[fd00::1]:x", "a port is a number"),
        ("gpu01:22,gpu01:2222", "gpu01 is given twice with different ports"),
    ],
)
def test_bad_ports_and_addresses_say_what_they_are(bad: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        hostlist.parse_nodeset(bad)
    assert message in str(info.value)
    assert "misplaced brackets" not in str(info.value)
    assert info.value.hint


# ---------------------------------------------------------------- issue 17: bounded expansion


@pytest.mark.parametrize(
    ("nodeset", "count"),
    [
        ("n[0-99999][0-99999]", "10,000,000,000"),
        ("n[" + ",".join(["0-99999"] * 12) + "]", "1,200,000"),
        (",".join(f"{c}[0-99999]" for c in "abcdefghijkl"), "1,200,000"),
        ("a[0-60000],b[0-60000]", "120,002"),
    ],
)
def test_a_node_set_past_the_host_limit_is_refused_with_its_count_before_expanding(
    nodeset: str, count: str
) -> None:
    with pytest.raises(UsageError) as info:
        hostlist.parse_nodeset(nodeset)
    assert f"{count} hosts" in str(info.value)
    assert f"{hostlist.MAX_HOSTS:,}" in str(info.value)


def test_a_hostfile_past_the_host_limit_is_refused_at_its_line(tmp_path: Path) -> None:
    text = "".join(f"r{i}n[0-59999] slots=8\n" for i in range(10))
    with pytest.raises(InventoryError) as info:
        hostlist.parse_hostfile(text, tmp_path / "hostfile")
    assert str(info.value).startswith(f"{tmp_path / 'hostfile'}:2: ")
    assert "120,000 hosts" in str(info.value)


def test_node_set_files_past_the_host_limit_are_refused_before_the_next_is_read(
    tmp_path: Path,
) -> None:
    names = tmp_path / "names"
    names.write_text("r[0-59999]\n")
    other = tmp_path / "other"
    other.write_text("s[0-59999]\n")
    with pytest.raises(UsageError, match="expands to 120,000 hosts, more than 100,000"):
        hostlist.parse_nodeset(f"^{names},^{other},^{tmp_path / 'missing'}")
