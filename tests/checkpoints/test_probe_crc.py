"""fleet/checkpoints/probe.sh's `crc` mode, run by a local sh with this machine's python3 as a
node's: every member's CRC checked, a changed byte found, and a zip whose end record claims more
members than a checkpoint ever has judged bad without building an object per member."""

from __future__ import annotations

import io
import struct
import subprocess
import zipfile
from pathlib import Path

PROBE = Path(__file__).resolve().parents[2] / "fleet" / "checkpoints" / "probe.sh"


def crc(*paths: Path) -> list[str]:
    done = subprocess.run(
        ["sh", str(PROBE), "crc", *map(str, paths)], capture_output=True, text=True, check=True
    )
    return done.stdout.split("\n")[:-1]


def a_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", b"x" * 1000)
    return buf.getvalue()


def claiming(members: int, data: bytes) -> bytes:
    """`data` with a zip64 end record that claims `members` members (its real central
    directory, of one, unchanged)."""
    body, end = data[:-22], data[-22:]
    size, offset = struct.unpack("<II", end[12:20])
    record = struct.pack(
        "<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, members, members, size, offset
    )
    locator = struct.pack("<IIQI", 0x07064B50, 0, len(body), 1)
    last = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return body + record + locator + last


def test_good_changed_and_unreadable_zips(tmp_path: Path) -> None:
    good, changed, junk = tmp_path / "good.pt", tmp_path / "changed.pt", tmp_path / "junk.pt"
    data = a_zip()
    good.write_bytes(data)
    at = data.index(b"x" * 1000)
    changed.write_bytes(data[:at] + b"y" + data[at + 1 :])
    junk.write_bytes(b"not a zip")
    assert crc(good, changed, junk, tmp_path / "missing.pt") == [
        "0 ok",
        "1 bad",
        "2 error",
        "3 error",
    ]


def test_a_zip_claiming_more_members_than_a_checkpoint_has_is_bad_unread(tmp_path: Path) -> None:
    fine, hostile = tmp_path / "fine.pt", tmp_path / "hostile.pt"
    fine.write_bytes(claiming(1, a_zip()))
    hostile.write_bytes(claiming(262_145, a_zip()))
    with zipfile.ZipFile(hostile) as z:  # what the probe did before: read, checked and passed
        assert z.testzip() is None
    assert crc(fine, hostile) == ["0 ok", "1 bad"]
