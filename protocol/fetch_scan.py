"""A Fetch response's layout, read without decoding its records: where each partition's fields and records
are, and whether the response carries node endpoints.

Decoding a Fetch response with the codec copies every record byte into Python objects, and encoding it
again copies them back: the cost of the records, paid to look at a few integers.  :func:`scan_fetch_response`
walks the response's structure (Kafka's FetchResponse schema, v0-v18) and skips each partition's records by
their length, so asking "is any partition OFFSET_OUT_OF_RANGE?", "does it name broker endpoints?" or "where
is the session id?" costs the number of partitions, not the bytes.

    FetchResponse =>  ThrottleTimeMs int32 (v1+)  ErrorCode int16 (v7+)  SessionId int32 (v7+)
                      [Topic string (v0-12) | TopicId uuid (v13+)
                       [PartitionIndex int32  ErrorCode int16  HighWatermark int64
                        LastStableOffset int64 (v4+)  LogStartOffset int64 (v5+)
                        AbortedTransactions [ProducerId int64  FirstOffset int64 _tagged (v12+)] (v4+, nullable)
                        PreferredReadReplica int32 (v11+)  Records records (nullable)  _tagged (v12+)]
                       _tagged (v12+)]
                      _tagged (v12+): NodeEndpoints is tag 0 (v16+)

Flexible versions (v12+) write lengths and counts as unsigned varints of n + 1 (0: null); the others as
int16 (strings) or int32 (arrays, bytes), -1 for null.  Sans-IO: bytes in, positions out.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from .errors import MalformedFrame
from .varint import read_uvarint, skip_tagged_fields

__all__ = ["NODE_ENDPOINTS_TAG", "FetchLayout", "PartitionLayout", "scan_fetch_response"]

NODE_ENDPOINTS_TAG = 0
FLEXIBLE_FROM = 12
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class PartitionLayout:
    topic: str | uuid.UUID          # the name (v0-12) or the topic id (v13+)
    partition_index: int
    error_code: int
    high_watermark: int
    records_start: int               # where the records' bytes start in the body (after their length)
    records_size: int                # -1: null records
    start: int                       # where the partition's entry starts
    end: int                         # ... and ends (after its tagged fields)


@dataclass(frozen=True, slots=True)
class FetchLayout:
    session_id_at: int               # position of SessionId in the body, -1 before v7
    partitions: tuple[PartitionLayout, ...]
    tagged_at: int                   # position of the top-level tagged fields (v12+), else the body's end
    tags: tuple[int, ...]            # the top-level tags present

    @property
    def node_endpoints(self) -> bool:
        return NODE_ENDPOINTS_TAG in self.tags


class _Reader:
    __slots__ = ("data", "flexible", "pos")

    def __init__(self, data: bytes | bytearray | memoryview, flexible: bool) -> None:
        self.data = data
        self.pos = 0
        self.flexible = flexible

    def need(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise MalformedFrame(f"Fetch response truncated at byte {self.pos} (needs {n} more)")

    def int16(self) -> int:
        self.need(2)
        value = _I16.unpack_from(self.data, self.pos)[0]
        self.pos += 2
        return int(value)

    def int32(self) -> int:
        self.need(4)
        value = _I32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return int(value)

    def int64(self) -> int:
        self.need(8)
        value = _I64.unpack_from(self.data, self.pos)[0]
        self.pos += 8
        return int(value)

    def length(self) -> int:
        """A count or a byte length: -1 for null."""
        if self.flexible:
            n, self.pos = read_uvarint(self.data, self.pos)
            return n - 1
        return self.int32()

    def string(self) -> str:
        if self.flexible:
            n, self.pos = read_uvarint(self.data, self.pos)
            n -= 1
        else:
            n = self.int16()
        if n < 0:
            return ""
        self.need(n)
        text = bytes(self.data[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def skip(self, n: int) -> None:
        self.need(n)
        self.pos += n

    def tagged(self) -> None:
        if self.flexible:
            self.pos = skip_tagged_fields(self.data, self.pos)


def scan_fetch_response(body: bytes | bytearray | memoryview, version: int,
                        error_code: int | None = None) -> FetchLayout:
    """The layout of a Fetch response body (after its response header); MalformedFrame if it is not one.
    With ``error_code``, only the partitions answered with that error are listed (the whole body is still
    checked): the pass-through asks only whether some partition is OFFSET_OUT_OF_RANGE."""
    r = _Reader(body, version >= FLEXIBLE_FROM)
    if version >= 1:
        r.int32()
    session_id_at = -1
    if version >= 7:
        r.int16()
        session_id_at = r.pos
        r.int32()
    partitions: list[PartitionLayout] = []
    topics = r.length()
    for _ in range(max(topics, 0)):
        if version >= 13:
            r.need(16)
            topic: str | uuid.UUID = uuid.UUID(bytes=bytes(body[r.pos:r.pos + 16]))
            r.pos += 16
        else:
            topic = r.string()
        count = r.length()
        for _ in range(max(count, 0)):
            start = r.pos
            index, partition_error, high_watermark = r.int32(), r.int16(), r.int64()
            if version >= 4:
                r.skip(8)
            if version >= 5:
                r.skip(8)
            if version >= 4:
                aborted = r.length()
                for _ in range(max(aborted, 0)):
                    r.skip(16)
                    r.tagged()
            if version >= 11:
                r.skip(4)
            size = r.length()
            records_start = r.pos
            if size > 0:
                r.skip(size)
            r.tagged()
            if error_code is None or error_code == partition_error:
                partitions.append(PartitionLayout(topic, index, partition_error, high_watermark, records_start,
                                                  size, start, r.pos))
        r.tagged()
    tagged_at = r.pos
    tags: list[int] = []
    if r.flexible:
        n, pos = read_uvarint(body, r.pos)
        for _ in range(n):
            tag, pos = read_uvarint(body, pos)
            size, pos = read_uvarint(body, pos)
            pos += size
            tags.append(tag)
        if pos > len(body):
            raise MalformedFrame("Fetch response's tagged fields run past its end")
        r.pos = pos
    if r.pos != len(body):
        raise MalformedFrame(f"Fetch response v{version} has {len(body) - r.pos} trailing byte(s)")
    return FetchLayout(session_id_at, tuple(partitions), tagged_at, tuple(tags))
