"""Read a safetensors file's header: what an adapter holds, without loading a tensor.

The file starts with an 8-byte little-endian header length, then that many bytes of JSON: every
tensor's dtype, shape and data offsets, and an optional `__metadata__` of strings. An adapter
saved under ZeRO-3 without gathering (the seed's "saved nothing") has every tensor with zero
elements; `save_pretrained(state_dict={})` has none at all. Both show in the header alone.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

MAX_HEADER_BYTES = 16 * 1024 * 1024
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip


class HeaderFault(Exception):
    """Not a safetensors header this reader accepts."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Header:
    tensors: tuple[Tensor, ...]
    header_bytes: int  # the JSON's length (the data starts at 8 + header_bytes)

    @property
    def empty(self) -> bool:
        """No tensors, or only zero-element ones: the adapter saved nothing."""
        return all(t.elements == 0 for t in self.tensors)

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(sorted({t.dtype for t in self.tensors}))

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def header_length(first8: bytes, size: int) -> int:
    """The JSON header's length, checked against the file's size."""
    if len(first8) < 8 or size < 8:
        raise HeaderFault(f"{size} bytes: too short for a safetensors file")
    length: int = struct.unpack("<Q", first8[:8])[0]
    if length > MAX_HEADER_BYTES:
        raise HeaderFault(f"a header of {length} bytes (at most {MAX_HEADER_BYTES} are read)")
    if 8 + length > size:
        raise HeaderFault(f"a header of {length} bytes in a file of {size}: truncated")
    return length


def parse_header(raw: bytes, size: int) -> Header:
    """The tensors the JSON header names; `size` is the file's, to check every offset."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HeaderFault(f"header is not JSON: {str(exc)[:80]}") from None
    if not isinstance(doc, dict):
        raise HeaderFault("header is not a JSON object")
    data_size = size - 8 - len(raw)
    tensors = [
        _tensor(name, spec, data_size) for name, spec in doc.items() if name != "__metadata__"
    ]
    return Header(tuple(sorted(tensors, key=lambda t: t.name)), len(raw))


def _tensor(name: str, spec: object, data_size: int) -> Tensor:
    if not isinstance(spec, dict):
        raise HeaderFault(f"tensor {name[:80]!r}: not an object")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise HeaderFault(f"tensor {name[:80]!r}: unknown dtype {str(dtype)[:20]!r}")
    if not isinstance(shape, list) or not all(_count(d) for d in shape) or len(shape) > 64:
        raise HeaderFault(f"tensor {name[:80]!r}: bad shape")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)):
        raise HeaderFault(f"tensor {name[:80]!r}: bad data_offsets")
    begin, end = offsets
    if begin > end or end > data_size:
        raise HeaderFault(f"tensor {name[:80]!r}: data {begin}-{end} outside {data_size} bytes")
    if end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
        raise HeaderFault(f"tensor {name[:80]!r}: {end - begin} bytes for shape {shape[:8]}")
    return Tensor(name, dtype, tuple(shape), end - begin)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
