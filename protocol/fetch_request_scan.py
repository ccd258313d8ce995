"""A Fetch request's partitions and session fields, read without the codec.

Decoding a Fetch request with the codec builds a Python object per topic and partition (about 41 us for
eight partitions); a proxy that only asks "which partitions, from which offsets, in which fetch session?"
to decide that the request goes on as its bytes needs a few integers.  :func:`scan_fetch_request` walks
the request body (Kafka's FetchRequest schema, v4-v18) and returns them, with the position of the session
fields so that they can be patched in place:

    FetchRequest => ReplicaId int32 (v0-14)  MaxWaitMs int32  MinBytes int32  MaxBytes int32 (v3+)
                    IsolationLevel int8 (v4+)  SessionId int32 (v7+)  SessionEpoch int32 (v7+)
                    [Topic string (v0-12) | TopicId uuid (v13+)
                     [Partition int32  CurrentLeaderEpoch int32 (v9+)  FetchOffset int64
                      LastFetchedEpoch int32 (v12+)  LogStartOffset int64 (v5+)  PartitionMaxBytes int32
                      _tagged (v12+)]
                     _tagged (v12+)]
                    [ForgottenTopic string (v7-12) | TopicId uuid (v13+)  [Partition int32]  _tagged (v12+)] (v7+)
                    RackId string (v11+)  _tagged (v12+)

Flexible versions (v12+) write lengths and counts as unsigned varints of n + 1; the others as int16
(strings) or int32 (arrays).  Sans-IO: bytes in, values out.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from .errors import MalformedFrame
from .fetch_scan import Truncated, read_topic_key
from .varint import read_uvarint, skip_tagged_fields

__all__ = ["SESSIONLESS", "FetchRequestScan", "patch_sessionless", "scan_fetch_request"]

SESSIONLESS = (0, -1)  # KIP-227: session id 0 and the final epoch, a full fetch that opens no session
FLEXIBLE_FROM = 12
SESSIONS_FROM = 7
TOPIC_IDS_FROM = 13
_SESSION = struct.Struct(">ii")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class FetchRequestScan:
    session_id: int                  # 0 before v7
    session_epoch: int               # -1 before v7
    session_at: int                  # position of SessionId in the body, -1 before v7
    forgotten: int                   # forgotten topics (an incremental session's), 0 before v7
    # (topic name, or topic id from v13, then [(partition, fetch offset)]) in request order
    topics: tuple[tuple[str | uuid.UUID, tuple[tuple[int, int], ...]], ...]

    @property
    def sessionless(self) -> bool:
        return (self.session_id, self.session_epoch) == SESSIONLESS and not self.forgotten


def _layout(version: int) -> tuple[int, struct.Struct, int]:
    """(size of the fixed fields before the topics, the struct of a partition's Partition and FetchOffset, the
    size of a partition's fixed fields) for a version, v4+."""
    fixed = (4 if version <= 14 else 0) + 13 + (8 if version >= SESSIONS_FROM else 0)
    partition = struct.Struct(">i4xq" if version >= 9 else ">iq")  # CurrentLeaderEpoch (v9+) skipped
    # Partition, [CurrentLeaderEpoch], FetchOffset, [LastFetchedEpoch (v12+)], [LogStartOffset (v5+)], PartitionMaxBytes
    entry = partition.size + (4 if version >= 12 else 0) + (8 if version >= 5 else 0) + 4
    return fixed, partition, entry


_LAYOUTS = {version: _layout(version) for version in range(4, 19)}


def scan_fetch_request(body: bytes | bytearray | memoryview, version: int) -> FetchRequestScan:
    """The partitions and session fields of a Fetch request body (after its request header), v4+;
    MalformedFrame if it is not one.

    Written for the pass-through's hot path: one pass with local variables, counts and lengths read in one
    step when they fit in one varint byte (they nearly always do), no call per field."""
    if version < 4:
        raise ValueError(f"Fetch v{version} is not scanned (v4+ only)")
    layout = _LAYOUTS.get(version)
    if layout is None:
        layout = _layout(version)
    fixed, partition_struct, entry = layout
    flexible = version >= FLEXIBLE_FROM
    by_id = version >= TOPIC_IDS_FROM
    end = len(body)
    try:
        if fixed > end:
            raise Truncated
        session_id, session_epoch, session_at = 0, -1, -1
        if version >= SESSIONS_FROM:
            session_at = fixed - 8
            session_id, session_epoch = _SESSION.unpack_from(body, session_at)
        pos = fixed
        if flexible:
            count = body[pos]
            if count < 0x80:
                pos += 1
            else:
                count, pos = read_uvarint(body, pos)
            count -= 1
        else:
            count = _INT32.unpack_from(body, pos)[0]
            pos += 4
        topics = []
        for _ in range(count):
            key, pos = read_topic_key(body, pos, end, by_id, flexible)
            if flexible:
                partitions_count = body[pos]
                if partitions_count < 0x80:
                    pos += 1
                else:
                    partitions_count, pos = read_uvarint(body, pos)
                partitions_count -= 1
            else:
                partitions_count = _INT32.unpack_from(body, pos)[0]
                pos += 4
            partitions = []
            for _ in range(partitions_count):
                if pos + entry > end:
                    raise Truncated
                partitions.append(partition_struct.unpack_from(body, pos))
                pos += entry
                if flexible:
                    if body[pos] == 0:  # no tagged fields
                        pos += 1
                    else:
                        pos = skip_tagged_fields(body, pos)
            if flexible:
                if body[pos] == 0:
                    pos += 1
                else:
                    pos = skip_tagged_fields(body, pos)
            topics.append((key, tuple(partitions)))
        forgotten = 0
        if version >= SESSIONS_FROM:
            if flexible:
                forgotten = body[pos]
                if forgotten < 0x80:
                    pos += 1
                else:
                    forgotten, pos = read_uvarint(body, pos)
                forgotten -= 1
            else:
                forgotten = _INT32.unpack_from(body, pos)[0]
                pos += 4
            forgotten = max(forgotten, 0)
            for _ in range(forgotten):
                if by_id:
                    pos += 16
                elif flexible:
                    n, pos = read_uvarint(body, pos)
                    pos += max(n - 1, 0)
                else:
                    pos += 2 + max(_INT16.unpack_from(body, pos)[0], 0)
                if flexible:
                    n, pos = read_uvarint(body, pos)
                    n -= 1
                else:
                    n = _INT32.unpack_from(body, pos)[0]
                    pos += 4
                pos += 4 * max(n, 0)
                if pos > end:
                    raise Truncated
                if flexible:
                    pos = skip_tagged_fields(body, pos)
        if version >= 11:  # RackId
            if flexible:
                n = body[pos]
                if n < 0x80:
                    pos += 1
                else:
                    n, pos = read_uvarint(body, pos)
                n -= 1
            else:
                n = _INT16.unpack_from(body, pos)[0]
                pos += 2
            pos += max(n, 0)
        if flexible:
            if body[pos] == 0:  # no tagged fields
                pos += 1
            else:
                pos = skip_tagged_fields(body, pos)
    except (Truncated, IndexError, struct.error):
        raise MalformedFrame(f"Fetch request v{version} is truncated") from None
    if pos != end:
        if pos > end:
            raise MalformedFrame(f"Fetch request v{version} is truncated")
        raise MalformedFrame(f"Fetch request v{version} has {end - pos} trailing byte(s)")
    return FetchRequestScan(session_id, session_epoch, session_at, forgotten, tuple(topics))


def patch_sessionless(body: bytearray | memoryview, scan: FetchRequestScan) -> None:
    """Make the scanned request sessionless in place (session id 0, epoch -1: fixed-width fields).  Only for
    a request that forgets no topics (an incremental session's request is not a full fetch)."""
    if scan.forgotten:
        raise ValueError("a Fetch that forgets topics belongs to an incremental session: it cannot be made"
                         " sessionless")
    if scan.session_at >= 0:
        _SESSION.pack_into(body, scan.session_at, *SESSIONLESS)
