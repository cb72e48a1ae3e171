"""Read a zip's directory and one small member from byte ranges, never the whole file.

A torch `.pt` file is a zip (stored, not deflated) of `data.pkl` plus one member per tensor
storage; a shard may be tens of GB on a node across the network. The end-of-central-directory
record (and, past 4 GiB or 65535 members, its zip64 form) sits in the last bytes; it says where
the central directory is; that names every member with its size, CRC and local header offset.
So an audit fetches the tail, the directory and `data.pkl`: a few KB. A file cut short loses its
tail first, so "no end record" reads as truncated; a directory whose members run past where the
directory starts (or past the end) is corrupt.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

ReadAt = Callable[[int, int], bytes]  # (offset, length) -> at most length bytes

EOCD = b"PK\x05\x06"
ZIP64_LOCATOR = b"PK\x06\x07"
ZIP64_EOCD = b"PK\x06\x06"
CENTRAL = b"PK\x01\x02"
LOCAL = b"PK\x03\x04"
TAIL_BYTES = 22 + 65535 + 20  # the end record, its longest comment, the zip64 locator
MAX_DIRECTORY_BYTES = 64 * 1024 * 1024
MAX_MEMBER_BYTES = 4 * 1024 * 1024  # a member read whole (data.pkl); larger ones are refused


class ZipFault(Exception):
    """The file is not a whole zip: `kind` is "truncated" or "corrupt"."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass(frozen=True)
class Member:
    """One central-directory entry."""

    name: str
    method: int
    crc32: int
    compressed_size: int
    size: int
    header_offset: int


@dataclass(frozen=True)
class Directory:
    members: tuple[Member, ...]
    directory_offset: int  # where the central directory starts: every member ends before it

    def find(self, suffix: str) -> Member | None:
        """The first member whose name is `suffix` or ends with `/suffix` (torch prefixes
        every member with the archive's name)."""
        for m in self.members:
            if m.name == suffix or m.name.endswith("/" + suffix):
                return m
        return None


def read_directory(read_at: ReadAt, size: int) -> Directory:
    """The central directory, from the file's tail and the directory's own bytes."""
    if size < 22:
        raise ZipFault("truncated", f"{size} bytes: too short for a zip")
    tail_start = max(0, size - TAIL_BYTES)
    tail = read_at(tail_start, size - tail_start)
    at = tail.rfind(EOCD)
    while at >= 0 and len(tail) - at < 22:
        at = tail.rfind(EOCD, 0, at)
    if at < 0:
        raise ZipFault("truncated", "no end-of-central-directory record: the file ends early")
    count, cd_size, cd_offset = _eocd(tail[at : at + 22])
    eocd_pos = tail_start + at
    if 0xFFFF in (count,) or 0xFFFFFFFF in (cd_size, cd_offset):
        count, cd_size, cd_offset = _zip64(read_at, tail, at, tail_start, size)
        eocd_pos = min(eocd_pos, cd_offset + cd_size)
    if cd_offset + cd_size > eocd_pos:
        raise ZipFault("truncated", "the central directory runs past the end record")
    if cd_size > MAX_DIRECTORY_BYTES:
        raise ZipFault("corrupt", f"a central directory of {cd_size} bytes")
    raw = read_at(cd_offset, cd_size)
    if len(raw) != cd_size:
        raise ZipFault("truncated", "the central directory is cut short")
    members = _members(raw, count)
    for m in members:
        if m.header_offset + 30 + m.compressed_size > cd_offset:
            raise ZipFault("corrupt", f"member {m.name!r} runs into the central directory")
    return Directory(members, cd_offset)


def _eocd(record: bytes) -> tuple[int, int, int]:
    _sig, _disk, _cd_disk, _here, count, cd_size, cd_offset, _clen = struct.unpack(
        "<4sHHHHIIH", record
    )
    return count, cd_size, cd_offset


def _zip64(read_at: ReadAt, tail: bytes, at: int, tail_start: int, size: int) -> tuple[int, ...]:
    loc = at - 20
    if loc < 0 or tail[loc : loc + 4] != ZIP64_LOCATOR:
        raise ZipFault("corrupt", "zip64 sizes without a zip64 locator")
    (_sig, _disk, record_at, _disks) = struct.unpack("<4sIQI", tail[loc : loc + 20])
    if record_at + 56 > size:
        raise ZipFault("truncated", "the zip64 end record lies past the end of the file")
    record = read_at(record_at, 56)
    if len(record) != 56 or record[:4] != ZIP64_EOCD:
        raise ZipFault("corrupt", "no zip64 end record where the locator points")
    fields = struct.unpack("<4sQHHIIQQQQ", record)
    return fields[7], fields[8], fields[9]


def _members(raw: bytes, count: int) -> tuple[Member, ...]:
    out: list[Member] = []
    pos = 0
    while pos < len(raw):
        if raw[pos : pos + 4] != CENTRAL or pos + 46 > len(raw):
            raise ZipFault("corrupt", f"bad central directory entry at byte {pos}")
        f = struct.unpack("<4sHHHHHHIIIHHHHHII", raw[pos : pos + 46])
        name_len, extra_len, comment_len = f[10], f[11], f[12]
        end = pos + 46 + name_len + extra_len + comment_len
        if end > len(raw):
            raise ZipFault("corrupt", "a central directory entry runs past the directory")
        name = raw[pos + 46 : pos + 46 + name_len].decode("utf-8", "replace")
        extra = raw[pos + 46 + name_len : pos + 46 + name_len + extra_len]
        csize, usize, offset = _zip64_extra(extra, f[8], f[9], f[16])
        out.append(Member(name, f[4], f[7], csize, usize, offset))
        pos = end
    if len(out) != count:
        raise ZipFault(
            "corrupt", f"the end record says {count} members, the directory has {len(out)}"
        )
    return tuple(out)


def _zip64_extra(extra: bytes, csize: int, usize: int, offset: int) -> tuple[int, int, int]:
    """Sizes and offset, from the zip64 extra field where the 32-bit ones are saturated."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack("<HH", extra[pos : pos + 4])
        body = extra[pos + 4 : pos + 4 + length]
        if tag == 1:
            values = list(struct.unpack(f"<{len(body) // 8}Q", body[: len(body) // 8 * 8]))
            if usize == 0xFFFFFFFF and values:
                usize = values.pop(0)
            if csize == 0xFFFFFFFF and values:
                csize = values.pop(0)
            if offset == 0xFFFFFFFF and values:
                offset = values.pop(0)
        pos += 4 + length
    return csize, usize, offset


def read_member(read_at: ReadAt, member: Member) -> bytes:
    """One member's bytes, checked against its CRC (stored or deflated; small members only)."""
    if member.size > MAX_MEMBER_BYTES or member.compressed_size > MAX_MEMBER_BYTES:
        raise ZipFault("corrupt", f"member {member.name!r} of {member.size} bytes is too large")
    header = read_at(member.header_offset, 30)
    if len(header) != 30 or header[:4] != LOCAL:
        raise ZipFault("corrupt", f"no local header for {member.name!r}")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    start = member.header_offset + 30 + name_len + extra_len
    raw = read_at(start, member.compressed_size)
    if len(raw) != member.compressed_size:
        raise ZipFault("truncated", f"member {member.name!r} is cut short")
    data = _inflate(raw, member)
    if zlib.crc32(data) != member.crc32:
        raise ZipFault("corrupt", f"CRC mismatch in {member.name!r}")
    return data


def _inflate(raw: bytes, member: Member) -> bytes:
    if member.method == 0:
        return raw
    if member.method != 8:
        raise ZipFault("corrupt", f"member {member.name!r}: compression method {member.method}")
    inflater = zlib.decompressobj(-15)
    try:
        data = inflater.decompress(raw, MAX_MEMBER_BYTES + 1)
    except zlib.error as exc:
        raise ZipFault("corrupt", f"member {member.name!r}: {exc}") from None
    if len(data) != member.size:
        raise ZipFault("corrupt", f"member {member.name!r} inflates to the wrong size")
    return data
