"""The compression codecs of Kafka record batches, decompressing side, sans-IO (records.py compresses).

A batch's attributes name its codec in bits 0-2: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.  Snappy comes in
two shapes: xerial's block framing (Kafka's Java client: a 16-byte header, then big-endian int32 length + raw
snappy block, repeated) or one raw snappy block (librdkafka, some older clients); LZ4 as LZ4 frames (KIP-57);
gzip members; zstd frames.
"""

from __future__ import annotations

import gzip
import struct

import cramjam

__all__ = ["UnknownCodec", "decompress"]

_INT32 = struct.Struct(">i")
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


class UnknownCodec(ValueError):
    """A batch names a compression codec Kafka does not define."""


def decompress(codec: int, data: bytes | memoryview) -> bytes | memoryview:
    """The records section of a batch compressed with ``codec`` (0: returned as it is)."""
    if codec == 0:
        return data
    if codec == 1:
        return gzip.decompress(data)
    if codec == 2:
        if bytes(data[:8]) != _XERIAL_MAGIC:
            return bytes(cramjam.snappy.decompress_raw(data))
        out, pos = [], 16  # xerial framing: magic, version, compatible version; then length + raw block
        while pos < len(data):
            (size,) = _INT32.unpack_from(data, pos)
            out.append(bytes(cramjam.snappy.decompress_raw(data[pos + 4:pos + 4 + size])))
            pos += 4 + size
        return b"".join(out)
    if codec == 3:
        return bytes(cramjam.lz4.decompress(data))
    if codec == 4:
        return bytes(cramjam.zstd.decompress(data))
    raise UnknownCodec(f"unknown compression codec {codec} in a record batch")
