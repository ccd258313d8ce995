"""The top-level tagged fields of a Produce response (v10+), read without the codec.

Produce v10+ responses may carry ``NodeEndpoints`` (tag 0, KIP-951) for partitions whose leader moved; a
proxy must rewrite those, and only those.  Decoding every acks=all response to find out costs more than the
produce round trip itself, so :func:`produce_response_tags` walks the structure (Kafka's ProduceResponse
schema, v9+ flexible) and lists the tags present:

    ProduceResponse => [Name compact_string (v9-12) | TopicId uuid (v13+)
                        [Index int32  ErrorCode int16  BaseOffset int64  LogAppendTimeMs int64
                         LogStartOffset int64  RecordErrors [BatchIndex int32  Message compact_nullable_string
                         _tagged]  ErrorMessage compact_nullable_string  _tagged (CurrentLeader is tag 0)]
                        _tagged]
                       ThrottleTimeMs int32  _tagged (NodeEndpoints is tag 0, v10+)

Sans-IO: bytes in, tags out.
"""

from __future__ import annotations

from .errors import MalformedFrame
from .varint import read_uvarint, skip_tagged_fields

__all__ = ["produce_response_tags"]

FLEXIBLE_FROM = 9
TOPIC_IDS_FROM = 13
_PARTITION_FIXED = 4 + 2 + 8 + 8 + 8  # Index, ErrorCode, BaseOffset, LogAppendTimeMs, LogStartOffset


def _skip_string(data: bytes | bytearray | memoryview, pos: int) -> int:
    n, pos = read_uvarint(data, pos)
    return pos + max(n - 1, 0)


def produce_response_tags(body: bytes | bytearray | memoryview, version: int) -> tuple[int, ...]:
    """The tags of a flexible (v9+) Produce response body's top-level tagged fields; MalformedFrame if the
    body is not one."""
    if version < FLEXIBLE_FROM:
        raise ValueError(f"Produce v{version} has no tagged fields")
    end = len(body)
    topics, pos = read_uvarint(body, 0)
    for _ in range(max(topics - 1, 0)):
        pos = pos + 16 if version >= TOPIC_IDS_FROM else _skip_string(body, pos)
        partitions, pos = read_uvarint(body, pos)
        for _ in range(max(partitions - 1, 0)):
            pos += _PARTITION_FIXED
            errors, pos = read_uvarint(body, pos)
            for _ in range(max(errors - 1, 0)):
                pos = skip_tagged_fields(body, _skip_string(body, pos + 4))
            pos = skip_tagged_fields(body, _skip_string(body, pos))
        pos = skip_tagged_fields(body, pos)
    pos += 4  # ThrottleTimeMs
    tags = []
    count, pos = read_uvarint(body, pos)
    for _ in range(count):
        tag, pos = read_uvarint(body, pos)
        size, pos = read_uvarint(body, pos)
        pos += size
        tags.append(tag)
    if pos != end:
        raise MalformedFrame(f"Produce response v{version}: {pos - end} byte(s) missing" if pos > end
                             else f"Produce response v{version} has {end - pos} trailing byte(s)")
    return tuple(tags)
