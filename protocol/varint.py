"""Kafka's unsigned varints and tagged-field sections, sans-IO: the one varint kernel of the request path.

(Record batches have their own, vectorized over whole columns with numpy: ``protocol/records.py``.)
"""

from __future__ import annotations

from .errors import MalformedFrame

__all__ = ["read_uvarint", "skip_tagged_fields", "write_uvarint"]


def read_uvarint(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise MalformedFrame("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise MalformedFrame("varint longer than 10 bytes")


def write_uvarint(value: int) -> bytes:
    """``value`` (>= 0) as an unsigned varint."""
    if value < 0:
        raise ValueError(f"an unsigned varint cannot hold {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def skip_tagged_fields(data: bytes | bytearray | memoryview, pos: int) -> int:
    """The position after the tagged-field section at ``pos``."""
    count, pos = read_uvarint(data, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(data, pos)
        size, pos = read_uvarint(data, pos)
        pos += size
        if pos > len(data):
            raise MalformedFrame("tagged field runs past the end of the frame")
    return pos
