"""Read a zip's directory and one small member from byte ranges, never the whole file.

A torch `.pt` file is a zip (stored, not deflated) of `data.pkl` plus one member per tensor
storage; a shard may be tens of GB on a node across the network. The end-of-central-directory
record (and, past 4 GiB or 65535 members, its zip64 form) sits in the last bytes; it says where
the central directory is; that names every member with its size, CRC and local header offset.
So an audit fetches the tail, the directory and `data.pkl`: a few KB. A file cut short loses its
tail first, so "no end record" reads as truncated; a directory whose members run past where the
directory starts (or past the end) is corrupt.

The directory is untrusted and may be 64 MiB of tiny entries: it is read in chunks and checked
entry by entry, and only the members asked for by name are kept, so reading one costs a chunk of
memory, not an object per entry (`fleet checkpoints` reads up to --forks files at once).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

ReadAt = Callable[[int, int], bytes]  # (offset, length) -> at most length bytes

EOCD = b"PK\x05\x06"
ZIP64_LOCATOR = b"PK\x06\x07"
ZIP64_EOCD = b"PK\x06\x06"
CENTRAL = b"PK\x01\x02"
LOCAL = b"PK\x03\x04"
TAIL_BYTES = 22 + 65535 + 20  # the end record, its longest comment, the zip64 locator
MAX_DIRECTORY_BYTES = 64 * 1024 * 1024
# torch writes one member per tensor storage plus 6 of its own, and names every storage in
# data.pkl with >= ~72 bytes (measured: torch.save of 10k tensors, no names, 728 KB), so the
# MAX_PICKLE_BYTES (4 MiB) data.pkl it reads can name ~58k; 4x that covers any real .pt file.
MAX_MEMBERS = 256 * 1024
DIRECTORY_CHUNK_BYTES = 1024 * 1024  # of the directory read at once
ENTRY_MAX_BYTES = 46 + 3 * 0xFFFF  # one directory entry: its fixed part, name, extra, comment
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
    """What `read_directory` kept: the members asked for by name, and where the directory is."""

    members: tuple[Member, ...]
    directory_offset: int  # where the central directory starts: every member ends before it
    count: int  # members in the directory, all of them checked

    def find(self, suffix: str) -> Member | None:
        """The first member whose name is `suffix` or ends with `/suffix` (torch prefixes
        every member with the archive's name); only the names asked for were kept."""
        for m in self.members:
            if _named(m, suffix):
                return m
        return None


def _named(member: Member, suffix: str) -> bool:
    return member.name == suffix or member.name.endswith("/" + suffix)


def read_directory(read_at: ReadAt, size: int, names: tuple[str, ...] = ("data.pkl",)) -> Directory:
    """The central directory, every entry checked; kept: the first member for each of `names`."""
    cd_offset, cd_size, count = _locate(read_at, size)
    kept: dict[str, Member] = {}
    for m in _checked(read_at, cd_offset, cd_size, count):
        for suffix in names:
            if suffix not in kept and _named(m, suffix):
                kept[suffix] = m
    return Directory(tuple(kept[n] for n in names if n in kept), cd_offset, count)


def members(read_at: ReadAt, size: int) -> Iterator[Member]:
    """Every central-directory entry in order, each checked as it is read; the directory is
    fetched a chunk at a time and no more than MAX_MEMBERS entries are ever read."""
    return _checked(read_at, *_locate(read_at, size))


def _checked(read_at: ReadAt, cd_offset: int, cd_size: int, count: int) -> Iterator[Member]:
    seen = 0
    for m in _entries(read_at, cd_offset, cd_size):
        seen += 1
        if seen > count:
            raise ZipFault("corrupt", f"more members than the end record's {count}")
        if m.header_offset + 30 + m.compressed_size > cd_offset:
            raise ZipFault("corrupt", f"member {m.name!r} runs into the central directory")
        yield m
    if seen != count:
        raise ZipFault("corrupt", f"the end record says {count} members, the directory has {seen}")


def _locate(read_at: ReadAt, size: int) -> tuple[int, int, int]:
    """(offset, size, member count) of the central directory, from the file's tail."""
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
    if count > MAX_MEMBERS:
        raise ZipFault("corrupt", f"{count} members (a checkpoint has at most {MAX_MEMBERS})")
    return cd_offset, cd_size, count


def _entries(read_at: ReadAt, cd_offset: int, cd_size: int) -> Iterator[Member]:
    """The directory's entries, parsed from chunks: a buffer never holds more than a chunk
    plus one entry, whatever the directory's size."""
    buf = b""
    fetched = 0  # directory bytes read so far
    pos = 0  # in buf
    while pos < len(buf) or fetched < cd_size:
        while len(buf) - pos < ENTRY_MAX_BYTES and fetched < cd_size:
            want = min(DIRECTORY_CHUNK_BYTES, cd_size - fetched)
            chunk = read_at(cd_offset + fetched, want)
            if len(chunk) != want:
                raise ZipFault("truncated", "the central directory is cut short")
            buf, pos = buf[pos:] + chunk, 0
            fetched += want
        member, pos = _entry(buf, pos, fetched - len(buf))
        yield member


def _entry(buf: bytes, pos: int, base: int) -> tuple[Member, int]:
    """The entry at buf[pos:] (byte `base + pos` of the directory) and where the next starts."""
    if buf[pos : pos + 4] != CENTRAL or pos + 46 > len(buf):
        raise ZipFault("corrupt", f"bad central directory entry at byte {base + pos}")
    f = struct.unpack("<4sHHHHHHIIIHHHHHII", buf[pos : pos + 46])
    name_len, extra_len, comment_len = f[10], f[11], f[12]
    end = pos + 46 + name_len + extra_len + comment_len
    if end > len(buf):
        raise ZipFault("corrupt", "a central directory entry runs past the directory")
    name = buf[pos + 46 : pos + 46 + name_len].decode("utf-8", "replace")
    extra = buf[pos + 46 + name_len : pos + 46 + name_len + extra_len]
    csize, usize, offset = _zip64_extra(extra, f[8], f[9], f[16])
    return Member(name, f[4], f[7], csize, usize, offset), end


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
