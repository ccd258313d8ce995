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
from .varint import read_uvarint, skip_tagged_fields

__all__ = ["SESSIONLESS", "FetchRequestScan", "patch_sessionless", "scan_fetch_request"]

SESSIONLESS = (0, -1)  # KIP-227: session id 0 and the final epoch, a full fetch that opens no session
FLEXIBLE_FROM = 12
SESSIONS_FROM = 7
TOPIC_IDS_FROM = 13
_SESSION = struct.Struct(">ii")


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


def scan_fetch_request(body: bytes | bytearray | memoryview, version: int) -> FetchRequestScan:
    """The partitions and session fields of a Fetch request body (after its request header), v4+;
    MalformedFrame if it is not one."""
    if version < 4:
        raise ValueError(f"Fetch v{version} is not scanned (v4+ only)")
    flexible = version >= FLEXIBLE_FROM
    data = body
    end = len(data)
    pos = 0

    def need(n: int) -> None:
        if pos + n > end:
            raise MalformedFrame(f"Fetch request truncated at byte {pos} (needs {n} more)")

    def count() -> int:
        nonlocal pos
        if flexible:
            n, pos = read_uvarint(data, pos)
            return n - 1
        need(4)
        n = int.from_bytes(data[pos:pos + 4], "big", signed=True)
        pos += 4
        return n

    def string() -> str:
        nonlocal pos
        if flexible:
            n, pos = read_uvarint(data, pos)
            n -= 1
        else:
            need(2)
            n = int.from_bytes(data[pos:pos + 2], "big", signed=True)
            pos += 2
        if n < 0:
            return ""
        need(n)
        text = bytes(data[pos:pos + n]).decode("utf-8", errors="replace")
        pos += n
        return text

    def topic_key() -> str | uuid.UUID:
        nonlocal pos
        if version >= TOPIC_IDS_FROM:
            need(16)
            key = uuid.UUID(bytes=bytes(data[pos:pos + 16]))
            pos += 16
            return key
        return string()

    fixed = (4 if version <= 14 else 0) + 13 + (8 if version >= SESSIONS_FROM else 0)
    need(fixed)
    session_id, session_epoch, session_at = 0, -1, -1
    if version >= SESSIONS_FROM:
        session_at = fixed - 8
        session_id, session_epoch = _SESSION.unpack_from(data, session_at)
    pos = fixed
    # Per partition: Partition, [CurrentLeaderEpoch], FetchOffset, then the rest up to its tagged fields.
    before_offset = 4 + (4 if version >= 9 else 0)
    # LastFetchedEpoch (v12+), LogStartOffset (v5+), PartitionMaxBytes
    after_offset = (4 if version >= 12 else 0) + (8 if version >= 5 else 0) + 4
    entry = before_offset + 8 + after_offset
    topics = []
    for _ in range(max(count(), 0)):
        key = topic_key()
        partitions = []
        for _ in range(max(count(), 0)):
            need(entry)
            partition = int.from_bytes(data[pos:pos + 4], "big", signed=True)
            offset = int.from_bytes(data[pos + before_offset:pos + before_offset + 8], "big", signed=True)
            partitions.append((partition, offset))
            pos += entry
            if flexible:
                pos = skip_tagged_fields(data, pos)
        if flexible:
            pos = skip_tagged_fields(data, pos)
        topics.append((key, tuple(partitions)))
    forgotten = 0
    if version >= SESSIONS_FROM:
        forgotten = max(count(), 0)
        for _ in range(forgotten):
            topic_key()
            n = max(count(), 0)
            need(4 * n)
            pos += 4 * n
            if flexible:
                pos = skip_tagged_fields(data, pos)
    if version >= 11:
        string()
    if flexible:
        pos = skip_tagged_fields(data, pos)
    if pos != end:
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
