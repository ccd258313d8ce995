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
from .varint import read_uvarint, skip_tagged_fields, write_uvarint

__all__ = [
    "NODE_ENDPOINTS_TAG",
    "FetchLayout",
    "NodeEndpoint",
    "PartitionLayout",
    "Truncated",
    "fetch_node_endpoints",
    "read_topic_key",
    "scan_fetch_response",
    "with_node_endpoints",
]

NODE_ENDPOINTS_TAG = 0
FLEXIBLE_FROM = 12
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


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


class Truncated(Exception):
    """A scanned message ends inside a field (the scanners turn it into MalformedFrame)."""


_PARTITION = struct.Struct(">ihq")  # PartitionIndex, ErrorCode, HighWatermark
_IDS: dict[bytes, uuid.UUID] = {}


def _topic_id(raw: bytes) -> uuid.UUID:
    """The UUID of 16 bytes, made once per id (``uuid.UUID(bytes=...)`` is a Python function of some length,
    and a connection names the same few topics in every request and response)."""
    found = _IDS.get(raw)
    if found is None:
        if len(_IDS) >= 10_000:
            _IDS.clear()
        found = _IDS[raw] = uuid.UUID(bytes=raw)
    return found


def read_topic_key(body: bytes | bytearray | memoryview, pos: int, end: int, by_id: bool,
                   flexible: bool) -> tuple[str | uuid.UUID, int]:
    """A Fetch request's or response's topic at ``pos``: its id (v13+) or its name ("" for a null name), and
    the position after it.  Raises :class:`Truncated` when it runs past ``end``."""
    if by_id:
        if pos + 16 > end:
            raise Truncated
        return _topic_id(bytes(body[pos:pos + 16])), pos + 16
    if flexible:
        n = body[pos]
        if n < 0x80:
            pos += 1
        else:
            n, pos = read_uvarint(body, pos)
        n -= 1
    else:
        n = _I16.unpack_from(body, pos)[0]
        pos += 2
    if n < 0:
        return "", pos
    if pos + n > end:
        raise Truncated
    return str(body[pos:pos + n], "utf-8", "replace"), pos + n


def scan_fetch_response(body: bytes | bytearray | memoryview, version: int,
                        error_code: int | None = None, whole_size: int = -1) -> FetchLayout:
    """The layout of a Fetch response body (after its response header); MalformedFrame if it is not one.
    With ``error_code``, only the partitions answered with that error are listed (the whole body is still
    checked): the pass-through asks only whether some partition is OFFSET_OUT_OF_RANGE.

    With ``whole_size``, ``body`` is the first bytes of a body that long (the rest is still in the broker's
    socket): the layout is that of every partition when they reach into the last partition's records and
    what follows those can only be the records and the tagged fields after them (``tagged_at`` -1, no
    tags); otherwise MalformedFrame, and the caller reads the body whole.

    Written for the pass-through's hot path: one pass with local variables, counts and lengths read in one
    step when they fit in one varint byte, no call per field."""
    flexible = version >= FLEXIBLE_FROM
    end = len(body)
    # after PartitionIndex, ErrorCode, HighWatermark: LastStableOffset (v4+), LogStartOffset (v5+)
    after = (8 if version >= 4 else 0) + (8 if version >= 5 else 0)
    try:
        pos = 4 if version >= 1 else 0  # ThrottleTimeMs
        session_id_at = -1
        if version >= 7:
            session_id_at = pos + 2  # after ErrorCode
            pos += 6
        partitions: list[PartitionLayout] = []
        if flexible:
            topics = body[pos]
            if topics < 0x80:
                pos += 1
            else:
                topics, pos = read_uvarint(body, pos)
            topics -= 1
        else:
            topics = _I32.unpack_from(body, pos)[0]
            pos += 4
        for t in range(topics):
            topic, pos = read_topic_key(body, pos, end, version >= 13, flexible)
            if flexible:
                count = body[pos]
                if count < 0x80:
                    pos += 1
                else:
                    count, pos = read_uvarint(body, pos)
                count -= 1
            else:
                count = _I32.unpack_from(body, pos)[0]
                pos += 4
            for p in range(count):
                start = pos
                index, partition_error, high_watermark = _PARTITION.unpack_from(body, pos)
                pos += 14 + after
                if version >= 4:  # AbortedTransactions: ProducerId, FirstOffset, tagged fields (v12+)
                    if flexible:
                        aborted = body[pos]
                        if aborted < 0x80:
                            pos += 1
                        else:
                            aborted, pos = read_uvarint(body, pos)
                        aborted -= 1
                    else:
                        aborted = _I32.unpack_from(body, pos)[0]
                        pos += 4
                    for _ in range(aborted):
                        pos += 16
                        if flexible:
                            pos = skip_tagged_fields(body, pos)
                if version >= 11:
                    pos += 4  # PreferredReadReplica
                if flexible:
                    size = body[pos]
                    if size < 0x80:
                        pos += 1
                    else:
                        size, pos = read_uvarint(body, pos)
                    size -= 1
                else:
                    size = _I32.unpack_from(body, pos)[0]
                    pos += 4
                records_start = pos
                if size > 0:
                    pos += size
                    if pos > end:
                        if whole_size < 0 or t != topics - 1 or p != count - 1 \
                                or whole_size - pos < (3 if flexible else 0) or (not flexible and pos != whole_size):
                            raise Truncated
                        # The head of a response: the rest is the last partition's records, then (flexible
                        # versions) its, its topic's and the response's tagged fields.
                        if error_code is None or error_code == partition_error:
                            partitions.append(PartitionLayout(topic, index, partition_error, high_watermark,
                                                              records_start, size, start, -1))
                        return FetchLayout(session_id_at, tuple(partitions), -1, ())
                if flexible:
                    if body[pos] == 0:  # no tagged fields
                        pos += 1
                    else:
                        pos = skip_tagged_fields(body, pos)
                if error_code is None or error_code == partition_error:
                    partitions.append(PartitionLayout(topic, index, partition_error, high_watermark, records_start,
                                                      size, start, pos))
            if flexible:
                if body[pos] == 0:
                    pos += 1
                else:
                    pos = skip_tagged_fields(body, pos)
        tagged_at = pos
        tags: list[int] = []
        if flexible:
            n = body[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = read_uvarint(body, pos)
            for _ in range(n):
                tag, pos = read_uvarint(body, pos)
                size, pos = read_uvarint(body, pos)
                pos += size
                tags.append(tag)
    except (Truncated, IndexError, struct.error):
        raise MalformedFrame(f"Fetch response v{version} is truncated") from None
    if pos != end:
        if pos > end:
            raise MalformedFrame(f"Fetch response v{version} is truncated")
        raise MalformedFrame(f"Fetch response v{version} has {end - pos} trailing byte(s)")
    return FetchLayout(session_id_at, tuple(partitions), tagged_at, tuple(tags))


# -- the top-level NodeEndpoints of Fetch v16+ (KIP-951), read and replaced without decoding the rest ------------
#
#    NodeEndpoints (tag 0) => [NodeId int32  Host compact_string  Port int32  Rack compact_nullable_string  _tagged]
#
# A proxy rewrites them to its own addresses; decoding the whole response for that would decode every record
# batch (the codec's bytes fields) and encode them again.  Only the top-level tagged-field section changes.


@dataclass(frozen=True, slots=True)
class NodeEndpoint:
    node_id: int
    host: str
    port: int
    rack: str | None
    tagged: bytes = b"\x00"  # the endpoint's own tagged fields, kept as they were


def _tagged_section(body: bytes | bytearray | memoryview, layout: FetchLayout) -> list[tuple[int, int, int]]:
    """(tag, start of its value, end of its value) of each top-level tagged field."""
    out = []
    count, pos = read_uvarint(body, layout.tagged_at)
    for _ in range(count):
        tag, pos = read_uvarint(body, pos)
        size, pos = read_uvarint(body, pos)
        out.append((tag, pos, pos + size))
        pos += size
    return out


def fetch_node_endpoints(body: bytes | bytearray | memoryview, layout: FetchLayout) -> tuple[NodeEndpoint, ...]:
    """The NodeEndpoints of a Fetch v16+ response body that ``layout`` scanned (empty if it has none);
    MalformedFrame if the field is not one."""
    for tag, start, end in _tagged_section(body, layout):
        if tag != NODE_ENDPOINTS_TAG:
            continue
        try:
            count, pos = read_uvarint(body, start)
            endpoints = []
            for _ in range(count - 1):
                (node_id,) = _I32.unpack_from(body, pos)
                n, pos = read_uvarint(body, pos + 4)
                if n == 0:
                    raise MalformedFrame("Fetch response's NodeEndpoints name a null host")
                host = str(body[pos:pos + n - 1], "utf-8")
                pos += n - 1
                (port,) = _I32.unpack_from(body, pos)
                n, pos = read_uvarint(body, pos + 4)
                rack = None if n == 0 else str(body[pos:pos + n - 1], "utf-8")
                pos += max(n - 1, 0)
                tagged_start = pos
                pos = skip_tagged_fields(body, pos)
                endpoints.append(NodeEndpoint(node_id, host, port, rack, bytes(body[tagged_start:pos])))
        except (struct.error, UnicodeDecodeError) as exc:
            raise MalformedFrame(f"Fetch response's NodeEndpoints do not decode: {exc}") from None
        if pos != end:
            raise MalformedFrame("Fetch response's NodeEndpoints do not fill their tagged field")
        return tuple(endpoints)
    return ()


def _compact_string(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode()
    return write_uvarint(len(raw) + 1) + raw


def with_node_endpoints(body: bytes | bytearray | memoryview, layout: FetchLayout,
                        endpoints: tuple[NodeEndpoint, ...] | list[NodeEndpoint]) -> bytes:
    """The body with its NodeEndpoints replaced by ``endpoints``: everything before the top-level tagged fields,
    and the other tagged fields, byte for byte."""
    value = write_uvarint(len(endpoints) + 1) + b"".join(
        _I32.pack(e.node_id) + _compact_string(e.host) + _I32.pack(e.port) + _compact_string(e.rack) + e.tagged
        for e in endpoints)
    fields = []
    for tag, start, end in _tagged_section(body, layout):
        data = value if tag == NODE_ENDPOINTS_TAG else bytes(body[start:end])
        fields.append(write_uvarint(tag) + write_uvarint(len(data)) + data)
    return bytes(body[:layout.tagged_at]) + write_uvarint(len(fields)) + b"".join(fields)
