"""What a talking login shell prints before a transfer's node command (a ~/.bashrc `echo`, a
`conda activate` message) is skipped, as it is for steps: before, every pull from such a node
failed (`bad listing from the node`), and a file's stream began with the banner's bytes."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from fleet.transfer import files, node

TOKEN = b"fleet-start-0123456789abcdef"
BANNER = b"Welcome to gpu01\nconda: base activated\n"


def talking(command: bytes) -> bytes:
    """stdout of `command` run as a login shell with a talking rc file would run it."""
    done = subprocess.run(
        ["/bin/sh", "-c", b"printf '%s' '" + BANNER + b"'; " + command],
        capture_output=True,
        check=True,
    )
    return done.stdout


def in_pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 3, 7, 4096])
def test_what_comes_before_the_mark_is_dropped_in_any_chunks(size: int) -> None:
    stream = BANNER + TOKEN + b"the data" + TOKEN
    got = b"".join(files.after_mark(in_pieces(stream, size), TOKEN))
    assert got == b"the data" + TOKEN  # only the first mark counts


def test_no_mark_is_no_output_and_a_flood_before_it_is_an_error() -> None:
    assert list(files.after_mark([BANNER, BANNER], TOKEN)) == []
    flood = [b"x" * 8192] * (files.MARK_WITHIN_BYTES // 8192 + 2)
    with pytest.raises(files.TransferError, match="login shell printed more than"):
        list(files.after_mark([*flood, TOKEN], TOKEN))


def test_a_listing_after_a_banner_is_the_nodes_listing(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x\n")
    out = talking(node.list_command(os.fsencode(tmp_path), TOKEN))
    entries = list(node.parse_listing(iter([b"".join(files.after_mark([out], TOKEN))]), 10))
    assert [(e.kind, e.rel) for e in entries] == [("d", b""), ("f", b"a")]


def test_a_file_read_after_a_banner_is_the_files_bytes(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    (tmp_path / "f").write_bytes(data)
    command = node.read_command(os.fsencode(tmp_path), b"", b"f", 0, len(data), TOKEN)
    got = b"".join(files.after_mark(in_pieces(talking(command), 65536), TOKEN))
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
