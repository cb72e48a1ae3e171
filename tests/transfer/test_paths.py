"""fleet.transfer's pure parts: node names made safe (hypothesis), node command quoting through
a real sh, the listing parser's bounds, bandwidth caps."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.transfer import local, node, paths
from fleet.transfer.ratelimit import Bucket, Limiter, parse_rate

NAME_BYTES = st.binary(min_size=0, max_size=60).filter(lambda b: b"\0" not in b)
PIECES = st.lists(
    st.one_of(st.sampled_from([b"..", b".", b"", b"..foo", b"a\nb", b"/", b"\x1b[2J"]), NAME_BYTES),
    max_size=6,
)


@given(PIECES)
def test_an_accepted_name_always_resolves_under_the_base(pieces: list[bytes]) -> None:
    rel = b"/".join(pieces)
    base = Path("/srv/out/node01")
    try:
        parts = paths.local_parts(rel)
    except paths.BadName:
        return
    joined = os.path.normpath(os.path.join(base, *parts))
    assert joined.startswith(str(base) + "/")
    assert all(p not in ("", ".", "..") and "/" not in p for p in parts)


@given(NAME_BYTES)
def test_names_with_dotdot_or_absolute_are_refused(name: bytes) -> None:
    for bad in (b"../" + name, b"/" + name, name + b"/../x", b"a//" + name, b".", b".."):
        assert not paths.is_safe(bad)


@pytest.mark.parametrize(
    "name", [b"..foo", b"foo..", b"a\nb", b"\x1b]0;x\x07", b"a\tb", b"\xff\xfe"]
)
def test_odd_but_ordinary_names_are_kept_byte_for_byte(name: bytes) -> None:
    assert os.fsencode(paths.local_parts(name)[0]) == name


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=40).filter(lambda b: b"\0" not in b))
def test_quoted_words_reach_a_real_sh_byte_for_byte(word: bytes) -> None:
    out = subprocess.run(
        [b"sh", b"-c", b"printf %s " + node.q(word)], capture_output=True, check=False
    )
    assert out.stdout == word


def test_the_listing_parser_splits_on_nul_and_keeps_newlines() -> None:
    chunks = [b"d 4096 \0f 12 a\nb\0l 4 li", b"nk\0f 3 ..foo\0"]
    entries = list(node.parse_listing(iter(chunks), max_entries=10))
    assert [(e.kind, e.size, e.rel) for e in entries] == [
        ("d", 4096, b""),
        ("f", 12, b"a\nb"),
        ("l", 4, b"link"),
        ("f", 3, b"..foo"),
    ]


@pytest.mark.parametrize(
    "chunks",
    [[b"f 12 a\0" * 11], [b"x" * 9000], [b"f twelve a\0"], [b"f 1 cut-off"]],
)
def test_a_listing_that_is_too_long_or_malformed_is_refused(chunks: list[bytes]) -> None:
    with pytest.raises(ValueError, match=r"entries|record"):
        list(node.parse_listing(iter(chunks), max_entries=10))


def test_a_listing_of_more_bytes_than_allowed_is_refused_though_its_records_are_few() -> None:
    chunks = [b"f 1 " + b"n" * 8000 + b"\0"] * 200  # 1.6 MB in 200 records
    assert len(list(node.parse_listing(iter(chunks), max_entries=1000))) == 200
    with pytest.raises(ValueError, match=r"more than 1 MiB of names"):
        list(node.parse_listing(iter(chunks), max_entries=1000, max_bytes=1 << 20))


def test_local_writes_never_follow_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    base = tmp_path / "out" / "node01"
    base.mkdir(parents=True)
    (base / "ckpt").symlink_to(outside)
    fd = local.open_base(base)
    try:
        with pytest.raises(OSError, match=r"Too many levels|Not a directory"):
            local.open_dir(fd, ("ckpt", "sub"))
    finally:
        os.close(fd)
    assert list(outside.iterdir()) == []


def test_rates_parse_and_a_bucket_holds_its_rate() -> None:
    assert parse_rate("50M") == 50e6
    assert parse_rate("1Gi") == 2**30
    assert parse_rate("800k") == 8e5
    with pytest.raises(ValueError, match="not a rate"):
        parse_rate("fast")
    limiter = Limiter([Bucket(4_000_000)])
    started = time.monotonic()
    for _ in range(20):
        limiter.take(100_000)  # 2 MB at 4 MB/s, less the 1 MB burst
    assert time.monotonic() - started >= 0.2


def test_the_live_table_shows_bytes_rate_and_time_left_per_host_and_in_all() -> None:
    import io

    from rich.console import Console

    from fleet.core.events import HostConnected, RunStarted
    from fleet.transfer.events import TransferPlanned, TransferProgress
    from fleet.transfer.live import TransferLiveReporter

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, height=40, color_system=None)
    reporter = TransferLiveReporter(console, step_count=1)
    reporter.handle(
        RunStarted(run_id="r", playbook="pull", hosts=("gpu01",), forks=4, run_dir=None)
    )
    reporter.handle(HostConnected(host="gpu01", duration_s=0.1))
    reporter.handle(TransferPlanned(host="gpu01", files=1, total_bytes=4_000_000_000))
    reporter.handle(
        TransferProgress(
            host="gpu01",
            done_bytes=1_000_000_000,
            total_bytes=4_000_000_000,
            rate_bps=100e6,
            eta_s=30.0,
        )
    )
    console.print(reporter._render())
    reporter.close()
    text = out.getvalue()
    assert "all hosts: 1.0 GB of 4.0 GB  100.0 MB/s  left 0:30" in text
    assert "1.0 GB/4.0 GB" in text
    assert "100.0 MB/s" in text


def test_the_live_table_of_a_transfer_keeps_host_and_state_whole_on_60_columns() -> None:
    from rich.console import Console

    from fleet.core.events import HostConnected, RunStarted
    from fleet.transfer.events import TransferPlanned, TransferProgress
    from fleet.transfer.live import TransferLiveReporter

    hosts = ("gpu-node-a01", "gpu-node-a02")
    console = Console(width=60, height=40, record=True, highlight=False)
    reporter = TransferLiveReporter(console, step_count=1)
    reporter.handle(RunStarted(run_id="r", playbook="pull", hosts=hosts, forks=4, run_dir=None))
    for host in hosts:
        reporter.handle(HostConnected(host=host, duration_s=0.1))
        reporter.handle(TransferPlanned(host=host, files=1, total_bytes=4_000_000_000))
        reporter.handle(
            TransferProgress(
                host=host,
                done_bytes=1_000_000_000,
                total_bytes=4_000_000_000,
                rate_bps=100e6,
                eta_s=30.0,
            )
        )
    reporter.close()
    console.print(reporter._render())
    rows = console.export_text().splitlines()[-len(hosts) :]
    for host, row in zip(hosts, rows, strict=True):
        assert row.startswith(f"{host}  running"), row
        assert len(row) <= 60


class _LateChannel:
    """A channel whose node was slow: the first recv times out, and by then its data, EOF and
    close have all arrived (paramiko sets `closed`, and recv still returns the data)."""

    def __init__(self) -> None:
        self.closed = False
        self.calls = 0
        self.data = [b"f 5 name\0", b""]

    def recv(self, size: int) -> bytes:
        self.calls += 1
        if self.calls == 1:
            self.closed = True
            raise TimeoutError
        return self.data.pop(0)

    def recv_stderr_ready(self) -> bool:
        return False


def test_a_stream_whose_channel_closed_during_a_timeout_still_yields_its_data() -> None:
    import threading

    from fleet.transfer.channel import Exec

    ex = Exec.__new__(Exec)
    ex.channel = _LateChannel()
    ex.cancel = threading.Event()
    ex.stderr = bytearray()
    assert list(ex.chunks()) == [b"f 5 name\0"]
