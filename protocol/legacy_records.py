"""Record batches (magic 2) converted down to the message sets of Fetch v0-v3 (magic 0 and 1), sans-IO.

A Fetch below v4 may carry only the old message formats: v0 and v1 the magic-0 format, v2 and v3 the
magic-1 format (KIP-32 added timestamps with v2).  Kafka 3.x brokers convert their stored batches down for
such fetches; ksi does the same for the batches it builds from the lake (see the README, "Old clients").
Clients that read only these formats (segmentio kafka-go 0.2, old librdkafka and Java clients) otherwise
fail on the first lake batch.

Message set => [Message] one after another, no count

Message (magic 0 and 1) =>                 bytes
  Offset => Int64                              8   the record's own (absolute) offset
  MessageSize => Int32                         4   bytes that follow this field
  CRC => Uint32                                4   CRC-32 (IEEE, zlib's) of Magic .. end of message
  Magic => Int8                                1   0 or 1
  Attributes => Int8                           1   bits 0-2 codec (0 here: ksi sends these uncompressed);
                                                   bit 3 (magic 1 only): timestamp type, 1 = LogAppendTime
  Timestamp => Int64                           8   magic 1 only: epoch milliseconds
  Key => Bytes                               4+n   Int32 length, -1 for a null key
  Value => Bytes                             4+n   Int32 length, -1 for a null value (a tombstone)

What the old formats cannot carry is lost, as it is when Kafka converts down: record headers (both), the
timestamp and its type (magic 0), producer id, epoch and sequence (idempotence and transactions).  Control
batches (transaction markers) are dropped, as Kafka drops them.  Converted messages go out uncompressed
whatever the batch's codec: every old client reads them, and a compressed magic-0/1 wrapper would need
the client's support for the codec (zstd has none before Fetch v10).

The input is trusted (ksi's own encoder, see records.py); a batch cut short at the end of the buffer is
ignored, as consumers ignore a partial trailing batch.
"""

from __future__ import annotations

import struct
import zlib

from .compression import UnknownCodec, decompress
from .varint import read_varint

__all__ = ["LegacyConversionError", "convert_batches", "for_fetch_version", "message_format_for_fetch"]

# BaseOffset, Length, PartitionLeaderEpoch, Magic, CRC, Attributes, LastOffsetDelta, BaseTimestamp,
# MaxTimestamp, ProducerId, ProducerEpoch, BaseSequence, record count (see records.py).
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
_LENGTH_END = 12
_MAGIC_AT = 16
_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_CONTROL_BIT = 0x20
_MESSAGE_HEAD = struct.Struct(">qiI")  # offset, size, crc
_V0_PREFIX = struct.Struct(">bb")       # magic, attributes
_V1_PREFIX = struct.Struct(">bbq")      # magic, attributes, timestamp
_OFFSET = struct.Struct(">q")  # a message's offset, first in it
_INT32 = struct.Struct(">i")
_NULL = _INT32.pack(-1)


class LegacyConversionError(ValueError):
    """The bytes are not record batches this module can convert (a codec it does not know)."""


def message_format_for_fetch(version: int) -> int | None:
    """The message format (magic) a Fetch of ``version`` allows, or None when record batches are fine."""
    if version >= 4:
        return None
    return 0 if version < 2 else 1


def _messages(batch: memoryview, magic: int, out: list[bytes]) -> None:
    """Append one message per record of the magic-2 ``batch``."""
    (base_offset, _, _, _, _, attributes, _, base_timestamp, max_timestamp, _, _, _,
     count) = _BATCH_HEADER.unpack_from(batch)
    if attributes & _CONTROL_BIT:
        return
    try:
        records = decompress(attributes & _CODEC_MASK, batch[_BATCH_HEADER.size:])
    except UnknownCodec as exc:
        raise LegacyConversionError(str(exc)) from None
    log_append_time = bool(attributes & _TIMESTAMP_TYPE_BIT)
    timestamp_attribute = _TIMESTAMP_TYPE_BIT if log_append_time and magic == 1 else 0
    pos = 0
    pack_prefix = _V1_PREFIX.pack if magic == 1 else None
    for _ in range(count):
        length, pos = read_varint(records, pos)
        end = pos + length
        pos += 1  # record attributes: unused
        timestamp_delta, pos = read_varint(records, pos)
        offset_delta, pos = read_varint(records, pos)
        key_length, pos = read_varint(records, pos)
        if key_length < 0:
            key = _NULL
        else:
            key = _INT32.pack(key_length) + records[pos:pos + key_length]
            pos += key_length
        value_length, pos = read_varint(records, pos)
        value = _NULL if value_length < 0 else _INT32.pack(value_length) + records[pos:pos + value_length]
        pos = end  # headers: the old formats have none
        if pack_prefix is not None:
            timestamp = max_timestamp if log_append_time else base_timestamp + timestamp_delta
            body = pack_prefix(1, timestamp_attribute, timestamp) + key + value
        else:
            body = _V0_PREFIX.pack(0, 0) + key + value
        out.append(_MESSAGE_HEAD.pack(base_offset + offset_delta, len(body) + 4, zlib.crc32(body)) + body)


def convert_batches(records: bytes | memoryview, magic: int, max_bytes: int | None = None,
                    first_offset: int = 0) -> bytes:
    """The magic-2 batches in ``records`` as a message set of ``magic`` (0 or 1), one message per record,
    offsets and (magic 1) timestamps kept, from ``first_offset`` on (a magic-2 batch may start below the
    offset fetched, and its consumer skips those records; an old message set starts at that offset, as a
    broker's does).  With ``max_bytes``, only whole messages that fit are kept, but always at least one
    (KIP-74's rule, which old clients need: they cannot read a partial message that is the only one).
    Batches already in an old format are copied as they are."""
    if magic not in (0, 1):
        raise ValueError(f"magic must be 0 or 1, got {magic}")
    view = memoryview(records)
    out: list[bytes] = []
    pos = produced = done = 0
    while pos + _LENGTH_END <= len(view):
        (length,) = _INT32.unpack_from(view, pos + 8)
        end = pos + _LENGTH_END + length
        if end > len(view):
            break  # a partial trailing batch
        if view[pos + _MAGIC_AT] == 2:
            converted: list[bytes] = []
            _messages(view[pos:end], magic, converted)
            out += [m for m in converted if _OFFSET.unpack_from(m, 0)[0] >= first_offset]
        else:
            out.append(bytes(view[pos:end]))
        pos = end
        if max_bytes is not None:
            produced += sum(len(m) for m in out[done:])
            done = len(out)
            if produced >= max_bytes:
                break  # the next batches would not be sent
    if max_bytes is not None:
        total, kept = 0, 0
        for message in out:
            if kept and total + len(message) > max_bytes:
                break
            total += len(message)
            kept += 1
        del out[kept:]
    return b"".join(out)


def for_fetch_version(records: bytes, version: int, max_bytes: int, fetch_offset: int = 0) -> bytes:
    """``records`` (magic-2 batches) as a Fetch of ``version`` at ``fetch_offset`` may carry them: unchanged
    from v4 on, else converted to that version's message format from ``fetch_offset`` on, whole messages
    within ``max_bytes`` (at least one)."""
    magic = message_format_for_fetch(version)
    if magic is None or not records:
        return records
    return convert_batches(records, magic, max_bytes, fetch_offset)
