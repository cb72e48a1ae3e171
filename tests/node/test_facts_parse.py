"""fleet/node/facts.py: facts.sh's line format, parsed without a shell. Whatever bytes a node
holds (newlines, tabs, NULs, escape sequences, invalid UTF-8) come back exactly as data; an
incomplete or malformed report is refused, never half-read."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.node.facts import (
    CMDLINE_MAX,
    FactsError,
    Link,
    Record,
    facts_args,
    facts_command,
    parse,
)


def block(records: list[bytes]) -> list[str]:
    """The `x` lines facts.sh prints for these text-block records (16 bytes a line)."""
    raw = b"".join(r + b"\0" for r in records)
    return [f"x {raw[i : i + 16].hex()}" for i in range(0, len(raw), 16)]


def report(*lines: str, text: tuple[bytes, ...] = (), self_pid: int = 10) -> list[str]:
    return ["facts 1", f"self {self_pid}", *lines, *block(list(text)), "end"]


def test_the_table_full_records_and_marks_parse() -> None:
    snap = parse(
        report(
            "t 1 0 1 1 5 S",
            "t 10 9 10 10 700 R",
            "t 20 1 20 20 800 S",
            "m 10",
            "p 20 1000 0 " + b"torchrun\0--nproc\x002\0".hex(),
            text=(b"comm 20 torchrun", b"user 1000 alice", b"boot abc-123"),
        )
    )
    assert snap.self_pid == 10
    assert set(snap.procs) == {1, 10, 20}
    assert (snap.procs[20].ppid, snap.procs[20].start, snap.procs[20].state) == (1, 800, "S")
    assert snap.helpers == frozenset({10})
    record = snap.records[20]
    assert (record.uid, record.user, record.comm) == (1000, "alice", b"torchrun")
    assert record.text == b"torchrun --nproc 2"
    assert snap.boot_id == "abc-123"


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=CMDLINE_MAX))
def test_any_command_line_round_trips_as_data(raw: bytes) -> None:
    snap = parse(report("t 20 1 20 20 8 S", f"p 20 0 0 {raw.hex() or '-'}"))
    record = snap.records[20]
    assert record.cmdline == raw
    assert b"\n" not in record.text
    assert b"\0" not in record.text
    assert "\n" not in record.shown()


@settings(max_examples=200, deadline=None)
@given(
    name=st.binary(min_size=1, max_size=300).filter(lambda b: b"\0" not in b),
    value=st.binary(max_size=300).filter(lambda b: b"\0" not in b),
)
def test_any_path_name_and_environment_value_round_trips(name: bytes, value: bytes) -> None:
    path = b"/tmp/" + name
    snap = parse(
        report(
            "t 30 1 30 30 9 S",
            text=(
                b"path 0 0 d " + path,
                b"real 0 " + path,
                b"fd 30 " + path,
                b"cwd 30 " + path + b"/x",
                b"env 30/environ:VAR=" + value,
                b"comm 30 " + name[:15],
            ),
        )
    )
    (match,) = snap.matches
    assert (match.path, match.real, match.kind) == (path, path, "d")
    assert Link(30, "fd", path) in snap.links
    assert Link(30, "cwd", path + b"/x") in snap.links
    assert Link(30, "env", value) in snap.links


def test_a_long_command_line_is_cut_and_says_so() -> None:
    raw = b"python\0" + b"x" * (CMDLINE_MAX - 7)
    snap = parse(report("t 20 1 20 20 8 S", f"p 20 0 1 {raw.hex()}"))
    record = snap.records[20]
    assert record.cut
    assert len(record.cmdline) == CMDLINE_MAX
    assert record.shown(50).endswith("...")
    assert Record(20, 0, b"short", cut=True).shown() == "short..."


def test_a_process_without_a_command_line_shows_its_comm() -> None:
    assert Record(5, 0, b"", comm=b"kworker").shown() == "[kworker]"


def test_invalid_utf8_is_shown_escaped_never_lost() -> None:
    assert Record(5, 0, b"train\xff.py").shown() == "train\\xff.py"


def test_a_socket_fd_resolves_to_the_path_it_is_bound_at() -> None:
    unix = b"unix 0000000000000000: 00000002 00000000 00010000 0001 01 4242 /tmp/pymp-a/listener"
    snap = parse(report("t 30 1 30 30 9 S", text=(unix, b"fd 30 socket:[4242]")))
    assert snap.unix == {4242: b"/tmp/pymp-a/listener"}
    assert snap.holders() == (Link(30, "unix", b"/tmp/pymp-a/listener"),)


def test_maps_lines_give_the_mapped_path() -> None:
    line = b"map 31/maps:7f00-7f01 rw-s 00000000 00:1a 77   /dev/shm/torch_1 (deleted)"
    snap = parse(report("t 31 1 31 31 9 S", text=(line,)))
    assert snap.links == (Link(31, "map", b"/dev/shm/torch_1"),)


def test_ports_gpus_mounts_and_free_space() -> None:
    snap = parse(
        report(
            "listen 39500 777",
            "smi 0",
            "app 4242",
            text=(
                b"mount tmpfs /mnt/with\\040space tmpfs rw,nosuid 0 0",
                b"df 0 /dev/vda 1000 10 990 2% /",
                b"smiout 4242",
            ),
        )
    )
    assert snap.listens == ((39500, 777),)
    assert (snap.smi_rc, snap.apps) == (0, frozenset({4242}))
    assert snap.mounts[0].point == b"/mnt/with space"
    assert (snap.df[0].total, snap.df[0].available, snap.df[0].point) == (1024000, 1013760, b"/")


def test_unknown_kinds_and_fields_past_the_known_ones_are_ignored() -> None:
    snap = parse(report("t 20 1 20 20 8 S extra", "newkind 1 2", text=(b"newtext anything",)))
    assert snap.procs[20].start == 8


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        ([], "no output"),
        (["hello"], "not facts.sh output"),
        (["facts 2", "self 1", "end"], "format version 2"),
        (["facts 1", "self 1"], "no 'end'"),
        (["facts 1", "end"], "no 'self'"),
        (["facts 1", "self 1", "t 1 0 1", "end"], "expected 7 fields"),
        (["facts 1", "self 1", "t x 0 1 1 1 S", "end"], "expected a number"),
        (["facts 1", "self 1", "p 1 0 0 zz", "end"], "expected hex"),
        (["facts 1", "self 1", f"p 1 0 0 {'00' * (CMDLINE_MAX + 1)}", "end"], "cap"),
        (["facts 1", "self 1", "x 0g", "end"], "expected hex"),
    ],
)
def test_a_malformed_or_incomplete_report_is_refused(lines: list[str], why: str) -> None:
    with pytest.raises(FactsError, match=why):
        parse(lines)


def test_facts_arguments_are_quoted_words() -> None:
    args = facts_args(["a b", "x'y"], ["~/.nv"], 29500, gpus=True, mounts=True, df=["/data"])
    assert args == [
        "--pattern", "a b", "--pattern", "x'y", "--path", "~/.nv", "--port", "29500",
        "--gpus", "--mounts", "--df", "/data",
    ]  # fmt: skip
    assert facts_command(["--pattern", "a b"]) == "--pattern 'a b'"
