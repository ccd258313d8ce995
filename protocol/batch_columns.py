"""Kafka record batches (magic 2) decoded into Arrow columns, sans-IO: the inverse of ``records.py``.

The archive reads a partition's log as the bytes of a Fetch response's records and needs them as columns
(offsets, timestamps, keys, values, headers) for Parquet.  A client library would make one object per record
and the archive a column out of each attribute; here the per-record work is one Python step per record, to
find where it starts (records are length-prefixed, so that walk is sequential), and everything else is numpy
over all the records of a chunk at once:

* batch heads: gathered into one structured numpy array (big-endian fields, no per-batch unpacking);
* each varint field of every record: one vectorized pass over the records whose varint is still going
  (most are one or two bytes), with the zig-zag undone over the whole column;
* keys, values, header keys and values: Arrow's ``take`` over a binary array whose offsets are the fields'
  spans in the records buffer, so their bytes are copied once, by Arrow, into the columns;
* every record is checked to end exactly where its length says, and every batch's records where the batch
  ends, so bytes that are not record batches are an error, never garbage rows.

Control batches (transaction markers) are not records: they are left out, as consumers leave them out.  With
the aborted transactions of a read_committed Fetch response (KIP-98), the records of aborted transactions are
found the way Kafka's consumers find them (a producer's transactional batches from an aborted transaction's
first offset up to its ABORT marker), and marked rather than dropped: the archive keeps them for
read_uncommitted readers (see ``ksi/pipeline/reader.py``).

A partial batch at the end of a buffer (a Fetch response may end with one) is left for the next read:
:func:`split_batches` returns where the complete batches end.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import crc32c
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .compression import UnknownCodec, decompress
from .errors import MalformedFrame

__all__ = [
    "BATCH_HEAD",
    "HEADERS_TYPE",
    "DecodedRecords",
    "UnsupportedMagic",
    "decode_batches",
    "split_batches",
]

I64: TypeAlias = "npt.NDArray[np.int64]"
U8: TypeAlias = "npt.NDArray[np.uint8]"

# BaseOffset, Length, PartitionLeaderEpoch, Magic, CRC, Attributes, LastOffsetDelta, BaseTimestamp,
# MaxTimestamp, ProducerId, ProducerEpoch, BaseSequence, record count (records.py draws the layout).
BATCH_HEAD = np.dtype([
    ("base_offset", ">i8"), ("length", ">i4"), ("leader_epoch", ">i4"), ("magic", "i1"), ("crc", ">u4"),
    ("attributes", ">i2"), ("last_offset_delta", ">i4"), ("base_timestamp", ">i8"), ("max_timestamp", ">i8"),
    ("producer_id", ">i8"), ("producer_epoch", ">i2"), ("base_sequence", ">i4"), ("count", ">i4"),
])
_HEAD_SIZE = BATCH_HEAD.itemsize  # 61
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_LENGTH_END = 12       # Length counts the bytes after it
_MAGIC_AT = 16
_CRC_FROM = 21         # the CRC covers Attributes .. the batch's end
_MIN_LENGTH = _HEAD_SIZE - _LENGTH_END
_CODEC_MASK = 0x07
_LOG_APPEND_TIME = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_ABORT_MARKER = 0      # a control record's key: version int16, type int16 (0 ABORT, 1 COMMIT)

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


class UnsupportedMagic(MalformedFrame):
    """A message set of the old formats (magic 0 or 1) where record batches were expected."""

    def __init__(self, offset: int, magic: int) -> None:
        super().__init__(f"offset {offset}: a magic-{magic} message set, not a record batch (magic 2)")
        self.offset, self.magic = offset, magic


@dataclass(frozen=True, slots=True)
class DecodedRecords:
    """The records of a run of batches, as columns; row ``i`` is the record at ``offsets[i]``.

    ``timestamps`` are epoch milliseconds as the batch gives them (LogAppendTime batches: the batch's append
    time for every record), ``timestamp_types`` 0 CreateTime or 1 LogAppendTime.  ``aborted`` is true for a
    record of an aborted transaction (all false when no aborted transactions were given).  ``next_offset``
    is the offset after the last batch, control batches included: where the next read starts;
    ``controls`` the offsets the control batches take, as (first, last) rows.  ``data_bytes`` counts the
    bytes of keys, values and headers."""

    offsets: I64
    timestamps: I64
    timestamp_types: npt.NDArray[np.int32]
    keys: pa.Array
    values: pa.Array
    headers: pa.Array
    aborted: npt.NDArray[np.bool_]
    next_offset: int
    data_bytes: int
    controls: I64

    def __len__(self) -> int:
        return len(self.offsets)


def split_batches(data: bytes | bytearray | memoryview, pos: int = 0) -> tuple[list[int], int]:
    """Where each complete batch in ``data`` from ``pos`` starts, and the position after the last of them
    (a batch cut short by the end of ``data`` is not listed).  Raises :class:`UnsupportedMagic` on an old
    message set and :class:`MalformedFrame` on a length no batch can have."""
    starts: list[int] = []
    end = len(data)
    unpack = _OFFSET_AND_LENGTH.unpack_from
    while pos + _LENGTH_END <= end:
        base_offset, length = unpack(data, pos)
        if pos + _MAGIC_AT < end and data[pos + _MAGIC_AT] != 2:
            raise UnsupportedMagic(base_offset, data[pos + _MAGIC_AT])
        if length < _MIN_LENGTH:
            raise MalformedFrame(f"offset {base_offset}: a record batch of {length} bytes")
        after = pos + _LENGTH_END + length
        if after > end:
            break
        starts.append(pos)
        pos = after
    return starts, pos


def heads_of(data: bytes | bytearray | memoryview, starts: Sequence[int]) -> npt.NDArray[Any]:
    """The heads of the batches at ``starts``, as one structured array of :data:`BATCH_HEAD`."""
    u8 = np.frombuffer(data, np.uint8)
    at = np.asarray(starts, np.int64)[:, None] + np.arange(_HEAD_SIZE)
    heads: npt.NDArray[Any] = u8[at].view(BATCH_HEAD).ravel()
    return heads


def decode_batches(data: bytes | bytearray | memoryview, starts: Sequence[int],
                   aborted_transactions: Sequence[tuple[int, int]] = (), verify_crc: bool = True) -> DecodedRecords:
    """Decode the complete batches of ``data`` at ``starts`` (from :func:`split_batches`).

    ``aborted_transactions``: (producer id, first offset) pairs of a read_committed Fetch response; the
    records they cover are marked in ``aborted``.  Raises :class:`MalformedFrame` naming the batch's offset
    when the bytes are not valid record batches (a CRC that does not match, a record that overruns its
    length, an unknown codec)."""
    if not starts:
        return _empty(0)
    heads = heads_of(data, starts)
    base = heads["base_offset"].astype(np.int64)
    last = base + heads["last_offset_delta"].astype(np.int64)
    attributes = heads["attributes"].astype(np.int64)
    lengths = heads["length"].astype(np.int64)
    ends = np.asarray(starts, np.int64) + _LENGTH_END + lengths
    view = memoryview(data)
    if verify_crc:
        crcs = heads["crc"].tolist()
        for b, start in enumerate(starts):
            if crc32c.crc32c(view[start + _CRC_FROM:int(ends[b])]) != crcs[b]:
                raise MalformedFrame(f"offset {int(base[b])}: the record batch's CRC does not match")
    control = (attributes & _CONTROL) != 0
    batch_aborted = _aborted_batches(view, starts, heads, control, aborted_transactions)
    data_batches = np.flatnonzero(~control)
    next_offset = int(last[-1]) + 1
    controls = np.stack([base[control], last[control]], axis=1)
    if not len(data_batches):
        return _empty(next_offset, controls)
    # The records sections: in place when no batch is compressed, else decompressed into one buffer.
    codecs = attributes[data_batches] & _CODEC_MASK
    sections: list[tuple[int, int]] = []
    if not codecs.any():
        buffer = data if isinstance(data, bytes) else bytes(data)
        sections = [(starts[b] + _HEAD_SIZE, int(ends[b])) for b in data_batches.tolist()]
    else:
        parts: list[bytes | memoryview] = []
        pos = 0
        for b in data_batches.tolist():
            section = view[starts[b] + _HEAD_SIZE:int(ends[b])]
            try:
                plain = decompress(int(attributes[b]) & _CODEC_MASK, section)
            except UnknownCodec as exc:
                raise MalformedFrame(f"offset {int(base[b])}: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - every codec library raises its own
                raise MalformedFrame(f"offset {int(base[b])}: the records do not decompress: {exc}") from None
            parts.append(plain)
            sections.append((pos, pos + len(plain)))
            pos += len(plain)
        buffer = b"".join(parts)
    counts = heads["count"].astype(np.int64)[data_batches]
    if (counts < 0).any():
        raise MalformedFrame(f"offset {int(base[data_batches[np.argmax(counts < 0)]])}: a negative record count")
    body_starts, body_lengths = _record_bodies(buffer, sections, counts.tolist(), base[data_batches].tolist())
    batch_of = np.repeat(data_batches, counts)
    return _fields(buffer, body_starts, body_lengths, batch_of, heads, base, batch_aborted, next_offset, controls)


def _empty(next_offset: int, controls: I64 | None = None) -> DecodedRecords:
    none = pa.array([], pa.binary())
    return DecodedRecords(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int32), none, none,
                          pa.array([], HEADERS_TYPE), np.zeros(0, bool), next_offset, 0,
                          np.zeros((0, 2), np.int64) if controls is None else controls)


def _aborted_batches(view: memoryview, starts: Sequence[int], heads: npt.NDArray[Any],
                     control: npt.NDArray[np.bool_], aborted_transactions: Sequence[tuple[int, int]]
                     ) -> npt.NDArray[np.bool_]:
    """Per batch, whether it belongs to an aborted transaction (Kafka's consumer: a transaction listed
    as aborted opens at its first offset for its producer and closes at that producer's ABORT marker)."""
    flags = np.zeros(len(starts), bool)
    if not aborted_transactions:
        return flags
    transactional = (heads["attributes"].astype(np.int64) & _TRANSACTIONAL) != 0
    pending = sorted(((first, pid) for pid, first in aborted_transactions), reverse=True)
    open_: set[int] = set()
    producers = heads["producer_id"].tolist()
    lasts = (heads["base_offset"].astype(np.int64) + heads["last_offset_delta"]).tolist()
    for b in np.flatnonzero(transactional).tolist():
        while pending and pending[-1][0] <= lasts[b]:
            open_.add(pending.pop()[1])
        pid = producers[b]
        if pid not in open_:
            continue
        if control[b]:
            if _control_type(view, starts[b]) == _ABORT_MARKER:
                open_.discard(pid)
        else:
            flags[b] = True
    return flags


def _control_type(view: memoryview, start: int) -> int:
    """The type of the control record in the (uncompressed) control batch at ``start``: 0 ABORT, 1 COMMIT."""
    from .varint import read_varint

    pos = start + _HEAD_SIZE
    _length, pos = read_varint(view, pos)
    pos += 1  # attributes
    _delta, pos = read_varint(view, pos)
    _delta, pos = read_varint(view, pos)
    key_length, pos = read_varint(view, pos)
    if key_length < 4:
        raise MalformedFrame("a control record without a key")
    _version, kind = struct.unpack_from(">hh", view, pos)
    return int(kind)


def _record_bodies(buffer: bytes, sections: list[tuple[int, int]], counts: list[int], bases: list[int]
                   ) -> tuple[I64, I64]:
    """Where each record's body starts (after its length) and its length: the one sequential walk."""
    body_starts: list[int] = []
    body_lengths: list[int] = []
    add_start, add_length = body_starts.append, body_lengths.append
    for (p, end), count, base in zip(sections, counts, bases, strict=True):
        try:
            p = _walk(buffer, p, end, count, base, add_start, add_length)
        except IndexError:
            raise MalformedFrame(f"offset {base}: the batch ends inside a record") from None
        if p != end:
            raise MalformedFrame(f"offset {base}: the batch's records do not end where the batch does")
    return np.array(body_starts, np.int64), np.array(body_lengths, np.int64)


def _walk(buffer: bytes, p: int, end: int, count: int, base: int, add_start: Any, add_length: Any) -> int:
    for _ in range(count):
        if p >= end:
            raise MalformedFrame(f"offset {base}: the batch ends before its {count} records")
        v = buffer[p]
        if v < 0x80:
            p += 1
        else:
            w = buffer[p + 1]
            if w < 0x80:
                v = (v & 0x7F) | (w << 7)
                p += 2
            else:
                v, p = _uvarint(buffer, p)
        length = (v >> 1) ^ -(v & 1)
        if length < 0:
            raise MalformedFrame(f"offset {base}: a record of {length} bytes")
        add_start(p)
        add_length(length)
        p += length
    return p


def _uvarint(buffer: bytes, p: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buffer[p]
        p += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, p
        shift += 7
        if shift > 63:
            raise MalformedFrame("a varint longer than 10 bytes")


def _varints(u8: U8, pos: I64, max_bytes: int = 10) -> tuple[I64, I64]:
    """The zig-zag varints at ``pos`` (all at once) and the position after each."""
    b = u8.take(pos, mode="clip").astype(np.uint64)
    value = b & np.uint64(0x7F)
    after = pos + 1
    going = np.flatnonzero(b >= 0x80)
    k = 1
    while going.size:
        if k == max_bytes:
            raise MalformedFrame(f"a varint longer than {max_bytes} bytes")
        b = u8.take(pos[going] + k, mode="clip").astype(np.uint64)
        value[going] |= (b & np.uint64(0x7F)) << np.uint64(7 * k)
        after[going] += 1
        going = going[b >= 0x80]
        k += 1
    signed = (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64)
    return signed, after


def _fields(buffer: bytes, body_starts: I64, body_lengths: I64, batch_of: I64, heads: npt.NDArray[Any],
            base: I64, batch_aborted: npt.NDArray[np.bool_], next_offset: int, controls: I64) -> DecodedRecords:
    u8 = np.frombuffer(buffer, np.uint8)
    limit = len(buffer)
    body_ends = body_starts + body_lengths
    if len(body_ends) and int(body_ends.max()) > limit:
        raise MalformedFrame("a record runs past its batch")
    # Attributes (1 byte, unused), TimestampDelta, OffsetDelta, KeyLength, Key, ValueLength, Value, Headers.
    timestamp_delta, p = _varints(u8, body_starts + 1)
    offset_delta, p = _varints(u8, np.minimum(p, limit), 5)
    key_length, p = _varints(u8, np.minimum(p, limit), 5)
    key_start = p
    p = p + np.maximum(key_length, 0)
    value_length, p = _varints(u8, np.minimum(p, limit), 5)
    value_start = p
    p = p + np.maximum(value_length, 0)
    header_count, p = _varints(u8, np.minimum(p, limit), 5)
    bad = (key_length < -1) | (value_length < -1) | (header_count < 0) | (p > body_ends) | (
        2 * header_count > body_ends - p)  # a header takes two bytes at least
    if bad.any():
        _fail(bad, batch_of, base, "a record's fields do not fit its length")
    # Headers: the h-th header of every record that has more than h, in one pass per h.
    n = len(body_starts)
    counts = header_count
    header_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=header_offsets[1:])
    total = int(header_offsets[-1])
    hk_start = np.zeros(total, np.int64)
    hk_length = np.zeros(total, np.int64)
    hv_start = np.zeros(total, np.int64)
    hv_length = np.zeros(total, np.int64)
    h = 0
    having = np.flatnonzero(counts > 0)
    while having.size:
        q = np.minimum(p[having], limit)
        kl, q = _varints(u8, q, 5)
        ks = q
        q = q + np.maximum(kl, 0)
        vl, q = _varints(u8, np.minimum(q, limit), 5)
        vs = q
        q = q + np.maximum(vl, 0)
        wrong = (kl < 0) | (vl < -1) | (q > body_ends[having])
        if wrong.any():
            _fail(wrong, batch_of[having], base, "a record's headers do not fit its length")
        at = header_offsets[having] + h
        hk_start[at], hk_length[at], hv_start[at], hv_length[at] = ks, kl, vs, vl
        p[having] = q
        h += 1
        having = having[counts[having] > h]
    if (p != body_ends).any():
        _fail(p != body_ends, batch_of, base, "a record's fields do not end where its length says")
    data = pa.py_buffer(buffer)
    keys = _spans(data, key_start, key_length)
    values = _spans(data, value_start, value_length)
    header_keys = _strings(_spans(data, hk_start, hk_length))
    header_values = _spans(data, hv_start, hv_length)
    entries = pa.StructArray.from_arrays([header_keys, header_values], fields=list(HEADERS_TYPE.value_type))
    headers = pa.ListArray.from_arrays(pa.array(header_offsets.astype(np.int32)), entries, type=HEADERS_TYPE)
    log_append = (heads["attributes"].astype(np.int64)[batch_of] & _LOG_APPEND_TIME) != 0
    timestamps = np.where(log_append, heads["max_timestamp"].astype(np.int64)[batch_of],
                          heads["base_timestamp"].astype(np.int64)[batch_of] + timestamp_delta)
    data_bytes = int(np.maximum(key_length, 0).sum() + np.maximum(value_length, 0).sum()
                     + hk_length.sum() + np.maximum(hv_length, 0).sum())
    return DecodedRecords(
        offsets=base[batch_of] + offset_delta,
        timestamps=timestamps,
        timestamp_types=log_append.astype(np.int32),
        keys=keys,
        values=values,
        headers=headers,
        aborted=batch_aborted[batch_of],
        next_offset=next_offset,
        data_bytes=data_bytes,
        controls=controls,
    )


def _fail(bad: npt.NDArray[np.bool_], batch_of: I64, base: I64, what: str) -> None:
    raise MalformedFrame(f"offset {int(base[batch_of[int(np.argmax(bad))]])}: {what}")


def _spans(data: pa.Buffer, starts: I64, lengths: I64) -> pa.Array:
    """A binary array of the bytes ``data[starts[i]:starts[i] + lengths[i]]``, null where the length is -1.
    The spans must follow each other in ``data`` (they do: a record's fields are in order)."""
    n = len(starts)
    present = np.maximum(lengths, 0)
    bounds = np.empty(2 * n + 1, np.int64)
    bounds[0] = 0
    bounds[1::2] = starts
    bounds[2::2] = starts + present
    large = len(data) >= 2**31 - 1
    segments = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), 2 * n,
                                     [None, pa.py_buffer(bounds if large else bounds.astype(np.int32)), data])
    taken = segments.take(pa.array(np.arange(1, 2 * n, 2, dtype=np.int64)))
    if large:
        taken = taken.cast(pa.binary())
    missing = lengths < 0
    if not missing.any():
        return taken
    validity = pa.py_buffer(np.packbits(~missing, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), n, [validity, *taken.buffers()[1:]], null_count=int(missing.sum()))


def _strings(array: pa.Array) -> pa.Array:
    """Header keys as strings (Kafka's are UTF-8); bytes that are not UTF-8 are replaced, not refused."""
    try:
        return array.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if b is None else b.decode("utf-8", "replace") for b in array.to_pylist()],
                        pa.string())
