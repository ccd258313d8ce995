"""The few messages the archive's Fetch client (``ksi/pipeline/fetcher.py``) exchanges, encoded and decoded by
hand, sans-IO: ApiVersions v0, Metadata v4 (one topic, never auto-created) and Fetch v4-v11 for one partition.

Everything else in ksi goes through kafka-python's codec; these do not, because importing that codec costs an
archive run 0.2-0.3 s before its first byte (measured: ``python -X importtime``), and the archive's small
incremental runs are mostly fixed cost.  All three are non-flexible versions (plain int16/int32 lengths, no
tagged fields), so their layouts are short; ``tests/protocol/test_fetch_client.py`` checks them against
kafka-python's codec.

    Request header v1 => ApiKey int16  ApiVersion int16  CorrelationId int32  ClientId string
    Response header v0 => CorrelationId int32

    ApiVersionsResponse v0 => ErrorCode int16  [ApiKey int16  MinVersion int16  MaxVersion int16]
    MetadataRequest v4 => [Name string]  AllowAutoTopicCreation bool
    MetadataResponse v4 => ThrottleTimeMs int32  [NodeId int32  Host string  Port int32  Rack string?]
                           ClusterId string?  ControllerId int32
                           [ErrorCode int16  Name string  IsInternal bool
                            [ErrorCode int16  PartitionIndex int32  LeaderId int32  [ReplicaNodes int32]
                             [IsrNodes int32]]]
    FetchRequest v4-v11 => ReplicaId int32  MaxWaitMs int32  MinBytes int32  MaxBytes int32
                           IsolationLevel int8  SessionId int32 (v7+)  SessionEpoch int32 (v7+)
                           [Topic string  [Partition int32  CurrentLeaderEpoch int32 (v9+)  FetchOffset int64
                                           LogStartOffset int64 (v5+)  PartitionMaxBytes int32]]
                           [ForgottenTopic ...] (v7+)  RackId string (v11+)

The Fetch response is read by the client field by field as it arrives (its records may be large):
:func:`fetch_response_head` and :func:`fetch_partition_head` give the sizes and offsets it reads by.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import MalformedFrame

__all__ = [
    "API_VERSIONS",
    "FETCH",
    "METADATA",
    "Metadata",
    "PartitionHead",
    "api_versions_request",
    "decode_api_versions",
    "decode_metadata",
    "fetch_partition_head",
    "fetch_partition_tail",
    "fetch_request",
    "fetch_response_head",
    "metadata_request",
]

FETCH, METADATA, API_VERSIONS = 1, 3, 18
METADATA_VERSION = 4
_HEADER = struct.Struct(">hhih")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def _string(value: str) -> bytes:
    raw = value.encode()
    return _I16.pack(len(raw)) + raw


def _framed(api_key: int, version: int, correlation_id: int, client_id: str, body: bytes) -> bytes:
    client = client_id.encode()
    payload = _HEADER.pack(api_key, version, correlation_id, len(client)) + client + body
    return _I32.pack(len(payload)) + payload


def api_versions_request(correlation_id: int, client_id: str) -> bytes:
    """An ApiVersions v0 request, framed (size first)."""
    return _framed(API_VERSIONS, 0, correlation_id, client_id, b"")


def metadata_request(correlation_id: int, client_id: str, topic: str) -> bytes:
    """A Metadata v4 request for ``topic`` that never creates it, framed."""
    return _framed(METADATA, METADATA_VERSION, correlation_id, client_id, _I32.pack(1) + _string(topic) + b"\x00")


def fetch_request(correlation_id: int, client_id: str, version: int, topic: str, partition: int, offset: int, *,
                  max_wait_ms: int, min_bytes: int, max_bytes: int, partition_max_bytes: int,
                  isolation_level: int) -> bytes:
    """A sessionless Fetch of ``version`` (4-11) for one partition at ``offset``, framed."""
    if not 4 <= version <= 11:
        raise ValueError(f"Fetch v{version}: this client speaks v4-v11")
    body = struct.pack(">iiiib", -1, max_wait_ms, min_bytes, max_bytes, isolation_level)
    if version >= 7:
        body += struct.pack(">ii", 0, -1)  # no session: a full fetch every time
    part = _I32.pack(partition) + (_I32.pack(-1) if version >= 9 else b"") + struct.pack(">q", offset)
    part += (struct.pack(">q", -1) if version >= 5 else b"") + _I32.pack(partition_max_bytes)
    body += _I32.pack(1) + _string(topic) + _I32.pack(1) + part
    if version >= 7:
        body += _I32.pack(0)  # forgotten topics
    if version >= 11:
        body += _string("")  # rack id
    return _framed(FETCH, version, correlation_id, client_id, body)


class _Reader:
    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data, self.pos = memoryview(data), 0

    def take(self, fmt: struct.Struct) -> tuple[int, ...]:
        if self.pos + fmt.size > len(self.data):
            raise MalformedFrame("a response ends inside a field")
        values = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return values

    def number(self, fmt: struct.Struct = _I32) -> int:
        return int(self.take(fmt)[0])

    def string(self) -> str | None:
        length = self.number(_I16)
        if length < 0:
            return None
        if self.pos + length > len(self.data):
            raise MalformedFrame("a response ends inside a string")
        raw = bytes(self.data[self.pos:self.pos + length])
        self.pos += length
        return raw.decode("utf-8", "replace")

    def count(self) -> int:
        n = self.number()
        if n > len(self.data) - self.pos:
            raise MalformedFrame(f"an array of {n} items in {len(self.data) - self.pos} bytes")
        return max(n, 0)


_API = struct.Struct(">hhh")
_BOOL = struct.Struct(">b")


def decode_api_versions(body: bytes | bytearray | memoryview) -> tuple[int, dict[int, tuple[int, int]]]:
    """An ApiVersions v0 response's body (after the correlation id): its error code, and API key ->
    (min version, max version)."""
    r = _Reader(body)
    error = r.number(_I16)
    versions = {}
    for _ in range(r.count()):
        key, low, high = r.take(_API)
        versions[key] = (low, high)
    return error, versions


@dataclass(frozen=True, slots=True)
class Metadata:
    """What a Metadata v4 response says of one topic: the brokers (node id -> host, port), the topic's
    error code, and per partition its error code and leader."""

    brokers: dict[int, tuple[str, int]]
    topic_error: int | None                    # None: the topic is not in the response
    partitions: dict[int, tuple[int, int]]     # partition -> (error code, leader id)


def decode_metadata(body: bytes | bytearray | memoryview, topic: str) -> Metadata:
    """A Metadata v4 response's body (after the correlation id), for ``topic``."""
    r = _Reader(body)
    r.number()  # throttle
    brokers = {}
    for _ in range(r.count()):
        node = r.number()
        host = r.string() or ""
        port = r.number()
        r.string()  # rack
        brokers[node] = (host, port)
    r.string()  # cluster id
    r.number()  # controller
    topic_error: int | None = None
    partitions: dict[int, tuple[int, int]] = {}
    for _ in range(r.count()):
        error = r.number(_I16)
        name = r.string()
        r.take(_BOOL)
        found = {}
        for _ in range(r.count()):
            p_error, index, leader = r.number(_I16), r.number(), r.number()
            for _ in range(r.count()):  # replicas
                r.number()
            for _ in range(r.count()):  # in-sync replicas
                r.number()
            found[index] = (p_error, leader)
        if name == topic:
            topic_error, partitions = error, found
    return Metadata(brokers, topic_error, partitions)


def fetch_response_head(version: int) -> tuple[int, int | None]:
    """The bytes of a Fetch response of ``version`` before its first topic's name (correlation id
    included), and where in them the top-level error code is (None before v7)."""
    size = 4 + (4 if version >= 1 else 0) + (6 if version >= 7 else 0) + 4
    return size, (8 if version >= 7 else None)


@dataclass(frozen=True, slots=True)
class PartitionHead:
    """A Fetch response partition's fields before its aborted transactions."""

    count: int       # partitions in the topic (1 for the client's one-partition fetches)
    index: int
    error: int
    high_watermark: int
    aborted: int     # aborted transactions that follow (-1: null)

    @staticmethod
    def size(version: int) -> int:
        """The bytes from the topic's partition count to the aborted transactions' count, included."""
        return 4 + 4 + 2 + 8 + 8 + (8 if version >= 5 else 0) + 4


def fetch_partition_head(data: bytes | bytearray | memoryview, version: int) -> PartitionHead:
    """:class:`PartitionHead` from its :meth:`PartitionHead.size` bytes."""
    count, index, error, high_watermark = struct.unpack_from(">iihq", data)
    (aborted,) = _I32.unpack_from(data, PartitionHead.size(version) - 4)
    return PartitionHead(count, index, error, high_watermark, aborted)


def fetch_partition_tail(version: int) -> int:
    """The bytes after the aborted transactions up to the records: preferred read replica (v11+), records size."""
    return (4 if version >= 11 else 0) + 4
