"""The readers `fleet checkpoints` runs on node bytes: data.pkl (never unpickled), a zip's
directory from byte ranges, a safetensors header; on real-shaped, synthetic and hostile input."""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.checkpoints import pickled, safetensors, zipdir
from fleet.checkpoints.node import shard_meta

plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4)
    | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


@given(plain, st.integers(3, 5))
def test_plain_data_reads_back_as_pickle_wrote_it(value: Any, protocol: int) -> None:
    """Protocols 3+ write bytes natively; older ones call a builtin, which stays a call."""
    assert pickled.read_pickle(pickle.dumps(value, protocol=protocol)) == value


class Boom:
    """Runs a command under the default loader."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_pickle_that_runs_code_is_read_as_a_placeholder(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "ran"
    data = pickle.dumps({"dp_world_size": 4, "evil": Boom(str(marker))}, protocol=protocol)
    value = pickled.read_pickle(data)
    assert not marker.exists()
    assert value["dp_world_size"] == 4
    evil = value["evil"]
    assert isinstance(evil, pickled.Opaque)
    assert evil.func.name == "system"
    assert evil.func.module in ("os", "posix")
    assert evil.args == (f"touch {marker}",)


def test_an_ordered_dict_and_an_enum_are_read_without_their_classes() -> None:
    import enum

    class Stage(enum.IntEnum):
        three = 3

    state = collections.OrderedDict(a=1, b=2)
    data = pickle.dumps({"module": state, "zero_stage": 3, "partition_count": [4]}, protocol=2)
    value = pickled.read_pickle(data)
    assert isinstance(value["module"], pickled.Opaque)
    assert value["module"].items == {"a": 1, "b": 2}
    assert pickled.plain(pickled.Opaque(pickled.Global("x", "Stage"), (3,))) == 3


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_never_do_more_than_fail(data: bytes) -> None:
    with contextlib.suppress(pickled.PickleFault):
        pickled.read_pickle(data)


@given(plain)
def test_a_truncated_pickle_fails_cleanly(value: Any) -> None:
    data = pickle.dumps(value, protocol=2)
    with pytest.raises(pickled.PickleFault):
        pickled.read_pickle(data[:-1])


DEEP = 200_000  # levels: a few bytes each, far past what crashed CPython's tuple hash
NESTED = {
    # a dict whose key is a tuple nested DEEP deep: hash() recursed in C and segfaulted
    "tuple key": b"\x80\x02}" + b")" + b"\x85" * DEEP + b"Ns.",
    "list": b"\x80\x02" + b"(" * DEEP + b"]" + b"l" * DEEP + b".",
    "dict value": b"\x80\x02" + b"(K\x00" * DEEP + b"}" + b"d" * DEEP + b".",
    "call": b"\x80\x02" + b"cos\nsystem\n" * DEEP + b"N" + b"\x85R" * DEEP + b".",
    "persistent id": b"\x80\x02N" + b"Q" * DEEP + b".",
    # lists made empty and memoized, then put one inside the next through the memo: each
    # looks 2 deep when filled, the chain is DEEP deep
    "filled after placed": b"\x80\x02"
    + b"".join(b"]r" + struct.pack("<I", i) + b"0" for i in range(DEEP))
    + b"".join(b"j" + struct.pack("<I", i) + b"j" + struct.pack("<I", i + 1) + b"a0"
               for i in range(DEEP - 1))
    + b"j\x00\x00\x00\x00.",
}  # fmt: skip


def _read_in_child(data: bytes) -> subprocess.CompletedProcess[str]:
    """read_pickle in a child process: a regression that crashes the interpreter (the C stack
    overflowing) fails the test instead of killing pytest."""
    code = (
        "import sys\n"
        "from fleet.checkpoints import pickled\n"
        "try:\n"
        "    value = pickled.read_pickle(sys.stdin.buffer.read())\n"
        "except pickled.PickleFault as exc:\n"
        "    print('fault:', exc)\n"
        "else:\n"
        "    print('read:', len(repr(value)), hash(repr(value)) and 'ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    return subprocess.run(
        [sys.executable, "-c", code], check=False, input=data.decode("latin-1"), env=env,
        capture_output=True, text=True, encoding="latin-1", timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("shape", sorted(NESTED))
def test_a_deeply_nested_pickle_is_refused_not_a_crash(shape: str) -> None:
    assert len(NESTED[shape]) <= pickled.MAX_PICKLE_BYTES
    done = _read_in_child(NESTED[shape])
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == f"fault: nests deeper than {pickled.MAX_DEPTH} levels"


def test_nesting_up_to_the_limit_reads_and_hashes() -> None:
    """MAX_DEPTH levels in all (the dict, then the key tuple) read back whole."""
    depth = pickled.MAX_DEPTH - 1
    data = b"\x80\x02}" + b")" + b"\x85" * (depth - 1) + b"Ns."
    value = pickled.read_pickle(data)
    (key,) = value
    for _ in range(depth - 1):
        (key,) = key
    assert key == ()
    assert repr(value).count("(") == depth


def test_a_self_holding_list_is_read_as_pickle_makes_it() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    value = pickled.read_pickle(pickle.dumps({"a": loop, "b": [loop]}, protocol=2))
    assert value["a"][1] is value["a"]
    assert value["b"][0] is value["a"]


def test_a_torch_like_state_dict_counts_its_tensors() -> None:
    rebuild = pickled.Opaque(pickled.Global("torch._utils", "_rebuild_tensor_v2"), ())
    assert pickled.tensor_count({"a": rebuild, "b": rebuild, "c": 1}) == 2


def _zip(members: dict[str, bytes], **kw: Any) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", **kw) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _reader(data: bytes) -> zipdir.ReadAt:
    return lambda offset, length: data[offset : offset + length]


@given(
    st.dictionaries(st.text("abc/", min_size=1, max_size=6), st.binary(max_size=300), min_size=1)
)
def test_the_directory_read_from_ranges_matches_zipfile(members: dict[str, bytes]) -> None:
    data = _zip({"archive/" + k: v for k, v in members.items()})
    got = list(zipdir.members(_reader(data), len(data)))
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert [(m.name, m.crc32, m.size) for m in got] == [
            (i.filename, i.CRC, i.file_size) for i in z.infolist()
        ]
        for m in got:
            assert zipdir.read_member(_reader(data), m) == z.read(m.name)


def test_a_deflated_member_is_inflated_and_checked() -> None:
    data = _zip({"a/data.pkl": pickle.dumps({"x": 1})}, compression=zipfile.ZIP_DEFLATED)
    d = zipdir.read_directory(_reader(data), len(data))
    member = d.find("data.pkl")
    assert member is not None
    assert pickled.read_pickle(zipdir.read_member(_reader(data), member)) == {"x": 1}


@given(st.integers(1, 200))
def test_a_cut_zip_reads_as_truncated(cut: int) -> None:
    data = _zip({"a/data.pkl": b"x" * 150, "a/data/0": b"y" * 100})
    short = data[: len(data) - cut]
    with pytest.raises(zipdir.ZipFault) as err:
        zipdir.read_directory(_reader(short), len(short))
    assert err.value.kind in ("truncated", "corrupt")


def test_a_changed_byte_in_a_member_fails_its_crc() -> None:
    data = bytearray(_zip({"a/data.pkl": pickle.dumps({"dp_world_size": 4})}))
    m = next(zipdir.members(_reader(bytes(data)), len(data)))
    data[m.header_offset + 30 + len(m.name) + 3] ^= 0xFF
    with pytest.raises(zipdir.ZipFault, match="CRC"):
        zipdir.read_member(_reader(bytes(data)), m)


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_random_bytes_are_no_zip(data: bytes) -> None:
    try:
        for m in zipdir.members(_reader(data), len(data)):
            zipdir.read_member(_reader(data), m)
    except zipdir.ZipFault:
        pass


def test_a_zip64_directory_is_read() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", allowZip64=True) as z:
        with z.open("a/data.pkl", "w", force_zip64=True) as fh:
            fh.write(pickle.dumps({"dp_world_size": 2}))
    data = buf.getvalue()
    d = zipdir.read_directory(_reader(data), len(data))
    member = d.find("data.pkl")
    assert member is not None
    meta = shard_meta(pickled.read_pickle(zipdir.read_member(_reader(data), member)))
    assert meta.dp_world_size == 2


def test_a_directory_is_read_in_chunks_of_bounded_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """However large the directory, no read of it is larger than a chunk (the whole of what
    reading one holds in memory, with the one member kept)."""
    monkeypatch.setattr(zipdir, "DIRECTORY_CHUNK_BYTES", 100)
    names = {f"archive/data/{i}": bytes([i % 256]) * i for i in range(300)}
    names["archive/" + "n" * 400] = b"a long name: an entry larger than a chunk"
    names["archive/data.pkl"] = pickle.dumps({"dp_world_size": 8})
    data = _zip(names)
    reads: list[int] = []

    def read_at(offset: int, length: int) -> bytes:
        reads.append(length)
        return data[offset : offset + length]

    d = zipdir.read_directory(read_at, len(data))
    assert d.count == len(names)
    assert [m.name for m in d.members] == ["archive/data.pkl"]  # only what was asked for
    assert max(reads[1:]) <= 100  # reads[0]: the tail
    member = d.find("data.pkl")
    assert member is not None
    assert pickled.read_pickle(zipdir.read_member(_reader(data), member)) == {"dp_world_size": 8}


def _many_entries(n: int, said: int) -> bytes:
    """A zip64 whose directory has `n` empty entries and whose end record says `said`."""
    entry = zipdir.CENTRAL + bytes(42)  # 46 bytes: no name, nothing stored, header at 0
    assert len(entry) == 46
    local = zipdir.LOCAL + bytes(26)  # the 30 bytes every entry's header offset points at
    directory = entry * n
    record = struct.pack(
        "<4sQHHIIQQQQ", zipdir.ZIP64_EOCD, 44, 45, 45, 0, 0, said, said, len(directory), 30
    )
    locator = struct.pack("<4sIQI", zipdir.ZIP64_LOCATOR, 0, 30 + len(directory), 1)
    end = struct.pack("<4sHHHHIIH", zipdir.EOCD, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return local + directory + record + locator + end


def test_a_directory_of_too_many_members_is_refused_unread() -> None:
    data = _many_entries(10, zipdir.MAX_MEMBERS + 1)
    reads: list[tuple[int, int]] = []

    def read_at(offset: int, length: int) -> bytes:
        reads.append((offset, length))
        return data[offset : offset + length]

    with pytest.raises(zipdir.ZipFault, match=f"{zipdir.MAX_MEMBERS + 1} members") as err:
        zipdir.read_directory(read_at, len(data))
    assert err.value.kind == "corrupt"
    assert len(reads) == 2  # the tail and the zip64 end record: nothing of the directory


def test_more_entries_than_the_end_record_says_stops_at_the_first_extra() -> None:
    data = _many_entries(5000, 3)
    seen, fault = 0, None
    try:
        for _ in zipdir.members(_reader(data), len(data)):
            seen += 1
    except zipdir.ZipFault as exc:
        fault = exc
    assert seen == 3
    assert fault is not None
    assert str(fault) == "corrupt: more members than the end record's 3"


def test_the_member_cap_holds_what_a_full_data_pkl_can_name() -> None:
    """torch names each storage in data.pkl with >= ~72 bytes: the largest data.pkl read
    names ~58k, a quarter of the cap."""
    assert zipdir.MAX_MEMBERS >= 4 * pickled.MAX_PICKLE_BYTES // 72


def _safetensors(header: dict[str, Any], data: bytes = b"") -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _parse(blob: bytes) -> safetensors.Header:
    n = safetensors.header_length(blob[:8], len(blob))
    return safetensors.parse_header(blob[8 : 8 + n], len(blob))


def test_a_header_with_tensors_counts_them() -> None:
    blob = _safetensors(
        {"__metadata__": {"format": "pt"},
         "a": {"dtype": "F32", "shape": [4, 16], "data_offsets": [0, 256]},
         "b": {"dtype": "BF16", "shape": [2], "data_offsets": [256, 260]}},
        b"\0" * 260,
    )  # fmt: skip
    h = _parse(blob)
    assert len(h.tensors) == 2
    assert h.dtypes == ("BF16", "F32")
    assert h.data_bytes == 260
    assert not h.empty


def test_zero_element_and_tensorless_adapters_are_empty() -> None:
    zero = {"a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}
    assert _parse(_safetensors(zero)).empty
    only_meta = _safetensors({"__metadata__": {"format": "pt"}})
    assert len(only_meta) == 40
    assert _parse(only_meta).empty


@pytest.mark.parametrize(
    "spec",
    [
        {"dtype": "F32", "shape": [4], "data_offsets": [0, 99]},
        {"dtype": "F32", "shape": [4], "data_offsets": [0, 17]},
        {"dtype": "XX", "shape": [1], "data_offsets": [0, 1]},
        {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]},
        {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]},
        [1, 2],
    ],
)
def test_a_lying_header_is_refused(spec: Any) -> None:
    with pytest.raises(safetensors.HeaderFault):
        _parse(_safetensors({"t": spec}, b"\0" * 16))


def test_a_huge_header_length_is_not_read() -> None:
    blob = struct.pack("<Q", 2**62) + b"{}"
    with pytest.raises(safetensors.HeaderFault):
        safetensors.header_length(blob[:8], len(blob))


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_random_bytes_are_no_header(data: bytes) -> None:
    with contextlib.suppress(safetensors.HeaderFault):
        _parse(struct.pack("<Q", len(data)) + data)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("pytorch_model.bin", b"PK\x05\x06 not a zip at all"),
        ("model.safetensors", b"\xff" * 16),
    ],
)
def test_what_consolidation_made_that_cannot_be_read_is_a_fleet_error(
    name: str, data: bytes
) -> None:
    """zero_to_fp32.py's output is read like any checkpoint file: a broken one is said, never
    a traceback."""
    from fleet.checkpoints.consolidate import _tensors
    from fleet.core.errors import FleetError

    with pytest.raises(FleetError, match=r"what zero_to_fp32\.py wrote cannot be read"):
        _tensors(io.BytesIO(data), name, len(data))


class _NoSftp:
    """An SFTP whose files cannot be opened: the rank file's metadata is unreadable."""

    def open(self, path: str, mode: str = "rb") -> None:
        raise OSError(13, "Permission denied")


def test_a_crc_check_with_no_answer_is_recorded_as_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The node's CRC probe answers "-" for a file it could not check (node.indexed_probe is the
    # seam: its real run is in tests/checkpoints/test_probe_crc.py). What fleet records, and
    # --json shows, is "error", not the probe's raw "-".
    from fleet.checkpoints import node

    monkeypatch.setattr(node, "indexed_probe", lambda client, probe, paths: ["-", "ok"])
    files = {
        "global_step1/zero_pp_rank_0_mp_rank_00_optim_states.pt": node.Entry(
            "global_step1/zero_pp_rank_0_mp_rank_00_optim_states.pt", "file", 10, 1.0
        ),
        "global_step1/zero_pp_rank_1_mp_rank_00_optim_states.pt": node.Entry(
            "global_step1/zero_pp_rank_1_mp_rank_00_optim_states.pt", "file", 10, 1.0
        ),
    }
    got = node._rank_files(None, _NoSftp(), "/out", files, crc=True)
    assert [f.crc for f in got] == ["error", "ok"]
