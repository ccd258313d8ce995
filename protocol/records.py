"""Kafka record batches (magic 2), encoded column-wise from Arrow/numpy arrays, sans-IO.

ksi's cold path: rows read from the Iceberg table come in as columns (:class:`RecordColumns`) and leave
as the bytes of one or more RecordBatches, the way the broker would have stored them.  Nothing here
loops over records in Python: varint sizes and bytes are computed with numpy over whole columns, and
the per-record byte strings are stitched together by Arrow's ``binary_join_element_wise`` kernel, whose
output data buffer *is* the records section of the batch.

See Kafka's DefaultRecordBatch.java / DefaultRecord.java and kafka-python's default_records.py.

RecordBatch =>                          bytes  written here as
  BaseOffset => Int64                      8   offsets[0] (the original Kafka offset)
  Length => Int32                          4   bytes that follow this field
  PartitionLeaderEpoch => Int32            4   -1 (not covered by the CRC)
  Magic => Int8                            1   2
  CRC => Uint32                            4   CRC-32C (Castagnoli) of Attributes .. end of batch
  Attributes => Int16                      2   see below
  LastOffsetDelta => Int32                 4   offsets[-1] - offsets[0]
  BaseTimestamp => Int64                   8   timestamps[0]
  MaxTimestamp => Int64                    8   max(timestamps)
  ProducerId => Int64                      8   -1
  ProducerEpoch => Int16                   2   -1
  BaseSequence => Int32                    4   -1
  Records => [Record]                      4   Int32 count, then the records; with compression the
                                               records (not the count) are one compressed stream
                                         ---
                                          61 = BATCH_OVERHEAD

Record =>
  Length => Varint                      zig-zag varint of the bytes after it
  Attributes => Int8                    0 (unused)
  TimestampDelta => Varlong             timestamp - BaseTimestamp (may be negative)
  OffsetDelta => Varint                 offset - BaseOffset (gaps kept)
  KeyLength => Varint                   -1 for a null key
  Key => Bytes
  ValueLength => Varint                 -1 for a null value (a tombstone)
  Value => Bytes
  Headers => [Header]                   Varint count, then each header:
    HeaderKeyLength => Varint
    HeaderKey => String (UTF-8, never null)
    HeaderValueLength => Varint         -1 for a null header value
    HeaderValue => Bytes

Every Varint/Varlong is zig-zag encoded ((n << 1) ^ (n >> 63)), then written 7 bits a byte, least
significant group first, the high bit set on every byte but the last.

Attributes:
  bits 0-2  compression codec: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd
  bit 3     timestamp type: 0 CreateTime, 1 LogAppendTime
  bit 4     transactional (never set here)
  bit 5     control batch (never set here)

Compressed record streams are those Kafka's Java client writes and every client reads: gzip members;
snappy in xerial's block framing (a 16-byte header, then big-endian int32 length + raw snappy block per
32 KiB of input); LZ4 frames with independent 64 KiB blocks and no checksums; zstd frames.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from typing import Any, Protocol, TypeAlias

import cramjam
import crc32c
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .varint import Const, Varint, join_rows, varint_sizes, write_uvarint, zigzag

__all__ = [
    "BATCH_OVERHEAD",
    "COMPRESSION_CODECS",
    "CONTROL_BATCH_SPAN",
    "RecordColumns",
    "encode_batch",
    "encode_batches",
    "encode_control_batch",
    "record_sizes",
    "timestamp_runs",
]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

# BaseOffset, Length, PartitionLeaderEpoch, Magic, CRC, Attributes, LastOffsetDelta, BaseTimestamp,
# MaxTimestamp, ProducerId, ProducerEpoch, BaseSequence, record count.
_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_OVERHEAD = _HEADER.size  # 61
_LENGTH_END = 12  # the Length field counts the bytes after this position
_CRC_AT = 17  # where the CRC goes ...
_ATTRIBUTES_AT = 21  # ... and what it covers: attributes to the end of the batch
_MAGIC = 2
_NO_PRODUCER_ID = -1
_NO_PRODUCER_EPOCH = -1
_NO_SEQUENCE = -1
_INT32_MAX = (1 << 31) - 1

COMPRESSION_CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_TIMESTAMP_TYPE_BIT = 0x08

# Group rows so that one Arrow join stays well inside binary's int32 offsets and the working set small.
_ROWS_BYTES_PER_JOIN = 32 << 20


class RecordColumns(Protocol):
    """The records of one partition, as columns, that the encoders read; row ``i`` is the record at
    ``offsets[i]``.  (The lake's :class:`ksi.lake.columns.Columns` is one.)

    ``offsets`` are the original Kafka offsets, strictly increasing (gaps allowed); ``timestamps`` are
    epoch milliseconds.  ``keys`` and ``values`` are binary or large_binary, nullable.  ``headers`` is a
    list<struct<key: string, value: binary>> array (a null list counts as no headers), or ``None``.
    """

    @property
    def offsets(self) -> I64: ...

    @property
    def timestamps(self) -> I64: ...

    @property
    def keys(self) -> pa.Array: ...

    @property
    def values(self) -> pa.Array: ...

    @property
    def headers(self) -> pa.Array | None: ...

    def __len__(self) -> int: ...

    def slice(self, start: int, stop: int) -> RecordColumns:
        """Rows ``start:stop`` (no copies)."""


# -- varints -------------------------------------------------------------------------------------


# A varint column of a record: (zig-zagged values, their sizes), or a constant's bytes.
_Varint: TypeAlias = "tuple[U64, I64] | bytes"
_Item: TypeAlias = "_Varint | pa.Array"


def _concat_rows(items: list[_Item], n: int) -> pa.Array:
    """A binary array whose row ``i`` is the concatenation of every item's row ``i`` (varint fields or
    binary arrays; nulls contribute nothing)."""
    return join_rows([Const(i) if isinstance(i, bytes) else Varint(*i) if isinstance(i, tuple) else i
                      for i in items], n)


# -- columns -------------------------------------------------------------------------------------


def _as_binary(array: pa.Array) -> pa.Array:
    """``array`` as binary or large_binary (strings are viewed as bytes, an all-null array as binary)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    t = array.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return array
    if pa.types.is_string(t):
        return array.cast(pa.binary())
    if pa.types.is_large_string(t):
        return array.cast(pa.large_binary())
    if pa.types.is_null(t):
        return pa.nulls(len(array), pa.binary())
    if pa.types.is_dictionary(t):
        return _as_binary(array.dictionary_decode())
    raise TypeError(f"expected a binary array, got {t}")


def _offsets(array: pa.Array) -> npt.NDArray[np.signedinteger[Any]]:
    """The ``len + 1`` offsets of a (large_)binary array's rows, read from its offsets buffer."""
    dtype = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets: npt.NDArray[np.signedinteger[Any]]
    offsets = np.frombuffer(array.buffers()[1], dtype=dtype, count=array.offset + len(array) + 1)
    return offsets[array.offset :]


def _lengths(array: pa.Array) -> I64:
    """Byte length of each element of a binary array, -1 where null."""
    lengths = np.diff(_offsets(array)).astype(np.int64)
    if array.null_count:
        bits = np.frombuffer(array.buffers()[0], dtype=np.uint8)
        valid = np.unpackbits(bits, count=array.offset + len(array), bitorder="little")[array.offset :]
        lengths[valid == 0] = -1
    return lengths


def _varint(values: I64) -> tuple[U64, I64]:
    """Zig-zag ``values`` and size their varints."""
    u = zigzag(values)
    return u, varint_sizes(u)


class _Headers:
    """The headers column flattened: one row per header, and where each record's first header is."""

    __slots__ = ("first", "key", "key_varint", "value", "value_varint")

    def __init__(
        self,
        first: I64,
        key: pa.Array,
        value: pa.Array,
        key_varint: tuple[U64, I64],
        value_varint: tuple[U64, I64],
    ) -> None:
        self.first = first  # record i's headers are rows first[i]:first[i + 1]
        self.key, self.value = key, value
        self.key_varint, self.value_varint = key_varint, value_varint

    @classmethod
    def of(cls, headers: pa.Array) -> _Headers:
        if isinstance(headers, pa.ChunkedArray):
            headers = headers.combine_chunks()
        first = np.zeros(len(headers) + 1, dtype=np.int64)
        np.cumsum(pc.list_value_length(headers).fill_null(0).to_numpy(), out=first[1:])
        flat = headers.flatten()  # minds the slice offset and skips whatever sits under null lists
        if flat.null_count:
            raise ValueError("a record header must not be null")
        children = dict(zip((f.name for f in flat.type), flat.flatten(), strict=True))
        key, value = _as_binary(children["key"]), _as_binary(children["value"])
        if key.null_count:
            raise ValueError("a record header key must not be null")
        return cls(first, key, value, _varint(_lengths(key)), _varint(_lengths(value)))

    def sizes(self) -> I64:
        """Bytes of each record's headers, their count excluded."""
        key_u, key_n = self.key_varint
        value_u, value_n = self.value_varint
        # zig-zag: u = 2 * length, or 1 for a null value
        one = np.uint64(1)
        per_header = key_n + (key_u >> one).view(np.int64) + value_n + (value_u >> one).view(np.int64)
        total = np.zeros(len(per_header) + 1, dtype=np.int64)
        np.cumsum(per_header, out=total[1:])
        return total[self.first[1:]] - total[self.first[:-1]]

    def one_each(self) -> bool:
        """Whether every record has exactly one header (row ``i`` of the flattened columns is record ``i``'s)."""
        return len(self.key) == len(self.first) - 1 and bool((self.first[1:] - self.first[:-1] == 1).all())

    def entries(self) -> pa.Array:
        """Row ``i``: the encoded headers of record ``i``, their count excluded."""
        n = len(self.key)
        per_header = _concat_rows([self.key_varint, self.key, self.value_varint, self.value], n)
        offsets = np.frombuffer(per_header.buffers()[1], dtype=np.int32, count=per_header.offset + n + 1)
        row_offsets = offsets[per_header.offset :][self.first]
        return pa.Array.from_buffers(
            pa.binary(), len(self.first) - 1, [None, pa.py_buffer(row_offsets), per_header.buffers()[2]]
        )

    def slice(self, start: int, stop: int) -> _Headers:
        lo, hi = int(self.first[start]), int(self.first[stop])
        return _Headers(
            self.first[start : stop + 1] - lo,
            self.key.slice(lo, hi - lo),
            self.value.slice(lo, hi - lo),
            *((u[lo:hi], n[lo:hi]) for u, n in (self.key_varint, self.value_varint)),
        )


class _Fields:
    """A record's parts that do not depend on its batch: key, value and header columns and sizes."""

    __slots__ = ("count", "fixed", "headers", "key", "keys", "value", "values")

    keys: pa.Array
    values: pa.Array
    headers: _Headers | None  # None when no record has any
    key: tuple[U64, I64]  # zig-zagged lengths and their varint sizes
    value: tuple[U64, I64]
    count: tuple[U64, I64]  # header count
    fixed: I64  # bytes of a record's body but for its two deltas

    @classmethod
    def of(cls, columns: RecordColumns) -> _Fields:
        self = cls()
        self.keys, self.values = _as_binary(columns.keys), _as_binary(columns.values)
        key_len, value_len = _lengths(self.keys), _lengths(self.values)
        self.key, self.value = _varint(key_len), _varint(value_len)
        # attributes, key, value
        fixed = 1 + self.key[1] + np.maximum(key_len, 0) + self.value[1] + np.maximum(value_len, 0)
        self.headers = None if columns.headers is None else _Headers.of(columns.headers)
        if self.headers is None or not len(self.headers.key):
            self.headers = None
            self.count = _varint(np.zeros(len(columns), dtype=np.int64))
        else:
            self.count = _varint(np.diff(self.headers.first))
            fixed += self.headers.sizes()
        self.fixed = fixed + self.count[1]
        return self

    def slice(self, start: int, stop: int) -> _Fields:
        sliced = _Fields()
        sliced.keys = self.keys.slice(start, stop - start)
        sliced.values = self.values.slice(start, stop - start)
        sliced.headers = None if self.headers is None else self.headers.slice(start, stop)
        sliced.key, sliced.value, sliced.count = (
            (u[start:stop], n[start:stop]) for u, n in (self.key, self.value, self.count)
        )
        sliced.fixed = self.fixed[start:stop]
        return sliced


def _check(columns: RecordColumns) -> None:
    offsets, timestamps = columns.offsets, columns.timestamps
    if offsets.dtype != np.int64 or timestamps.dtype != np.int64:
        raise TypeError("offsets and timestamps must be int64 arrays")
    if len(offsets) > 1 and not (offsets[1:] > offsets[:-1]).all():
        raise ValueError("offsets must be strictly increasing")


def _sizes(fixed: I64, timestamp_delta: U64, offset_delta: U64) -> tuple[I64, I64]:
    """Each record's body length (after its Length varint) and whole size."""
    body = fixed + varint_sizes(timestamp_delta) + varint_sizes(offset_delta)
    return body, body + varint_sizes(zigzag(body))


def record_sizes(columns: RecordColumns) -> I64:
    """Bytes each record takes in a batch whose base offset and timestamp are the first row's.

    ``record_sizes(c).sum() + BATCH_OVERHEAD == len(encode_batch(c))`` without compression; a prefix
    sum of it tells how many rows fit a byte budget.
    """
    _check(columns)
    if not len(columns):
        return np.zeros(0, dtype=np.int64)
    timestamp_delta = zigzag(columns.timestamps - columns.timestamps[0])
    offset_delta = zigzag(columns.offsets - columns.offsets[0])
    return _sizes(_Fields.of(columns).fixed, timestamp_delta, offset_delta)[1]


# -- batches -------------------------------------------------------------------------------------


def _records(columns: RecordColumns, fields: _Fields, starts: I64) -> tuple[pa.Buffer, I64]:
    """The records sections of batches starting at rows ``starts``: one buffer and each row's end in it."""
    n = len(columns)
    counts = np.diff(starts, append=n)
    timestamp_delta = zigzag(columns.timestamps - np.repeat(columns.timestamps[starts], counts))
    offset_delta = zigzag(columns.offsets - np.repeat(columns.offsets[starts], counts))
    body, sizes = _sizes(fields.fixed, timestamp_delta, offset_delta)
    items: list[_Item] = [
        (zigzag(body), sizes - body),  # Length
        b"\x00",  # Attributes
        (timestamp_delta, varint_sizes(timestamp_delta)),
        (offset_delta, varint_sizes(offset_delta)),
        fields.key,
        fields.keys,
        fields.value,
        fields.values,
    ]
    headers = fields.headers
    if headers is None or not len(headers.key):
        items.append(b"\x00")  # no record here has headers
    elif headers.one_each():  # the header's pieces join the record's: no second join
        items += [b"\x02", headers.key_varint, headers.key, headers.value_varint, headers.value]
    else:
        items += [fields.count, headers.entries()]
    joined = _concat_rows(items, n)
    ends = np.cumsum(sizes)
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32, count=joined.offset + n + 1)[joined.offset :]
    if int(offsets[-1]) - int(offsets[0]) != int(ends[-1]):
        raise AssertionError("record sizes disagree with the encoded records")
    return joined.buffers()[2].slice(int(offsets[0]), int(ends[-1])), ends


def _xerial_snappy(data: memoryview, block: int = 32 << 10) -> bytes:
    out: list[bytes | memoryview | cramjam.Buffer] = [b"\x82SNAPPY\x00", struct.pack(">ii", 1, 1)]
    for at in range(0, len(data), block):
        compressed = cramjam.snappy.compress_raw(data[at : at + block])
        out += [struct.pack(">i", len(compressed)), compressed]
    return b"".join(out)


# LZ4 frame magic, FLG 0x60 (version 1, independent blocks, no checksums, no content size), BD 0x40
# (64 KiB blocks), header checksum 0x82 = second byte of xxh32(FLG BD).
_LZ4_FRAME_HEADER = bytes.fromhex("04224d18604082")
_LZ4_END_MARK = b"\x00\x00\x00\x00"


def _lz4_frame(data: memoryview, level: int | None, block: int = 64 << 10) -> bytes:
    out: list[bytes | memoryview | cramjam.Buffer] = [_LZ4_FRAME_HEADER]
    for at in range(0, len(data), block):
        chunk = data[at : at + block]
        if level is None:
            compressed = cramjam.lz4.compress_block(chunk, store_size=False)
        else:
            compressed = cramjam.lz4.compress_block(
                chunk, mode="high_compression", compression=level, store_size=False
            )
        if len(compressed) < len(chunk):
            out += [struct.pack("<I", len(compressed)), compressed]
        else:  # stored: high bit of the block size set
            out += [struct.pack("<I", len(chunk) | 0x80000000), chunk]
    out.append(_LZ4_END_MARK)
    return b"".join(out)


def _compress(codec: int, data: memoryview, level: int | None) -> bytes | memoryview | cramjam.Buffer:
    if codec == 0:
        return data
    if codec == 1:
        # zlib, as under Java's GZIPOutputStream: faster than cramjam's gzip and smaller at level 6
        return zlib.compress(data, 6 if level is None else level, wbits=31)
    if codec == 2:
        return _xerial_snappy(data)
    if codec == 3:
        return _lz4_frame(data, level)
    return cramjam.zstd.compress(data, level=3 if level is None else level)


def _codec(compression: str) -> int:
    try:
        return COMPRESSION_CODECS[compression]
    except KeyError:
        known = ", ".join(COMPRESSION_CODECS)
        raise ValueError(f"unknown compression {compression!r}, expected one of {known}") from None


def _batch(
    columns: RecordColumns,
    start: int,
    stop: int,
    records: memoryview,
    *,
    codec: int,
    timestamp_type: int,
    partition_leader_epoch: int,
    compression_level: int | None,
) -> bytes:
    base_offset = int(columns.offsets[start])
    last_offset_delta = int(columns.offsets[stop - 1]) - base_offset
    if last_offset_delta > _INT32_MAX:
        raise ValueError("a batch cannot span more than 2**31 - 1 offsets")
    body = _compress(codec, records, compression_level)
    header = bytearray(
        _HEADER.pack(
            base_offset,
            BATCH_OVERHEAD - _LENGTH_END + len(body),
            partition_leader_epoch,
            _MAGIC,
            0,  # CRC, below
            codec | (_TIMESTAMP_TYPE_BIT if timestamp_type else 0),
            last_offset_delta,
            int(columns.timestamps[start]),
            int(columns.timestamps[start:stop].max()),
            _NO_PRODUCER_ID,
            _NO_PRODUCER_EPOCH,
            _NO_SEQUENCE,
            stop - start,
        )
    )
    crc = crc32c.crc32c(body, crc32c.crc32c(memoryview(header)[_ATTRIBUTES_AT:]))
    struct.pack_into(">I", header, _CRC_AT, crc)
    return b"".join((header, body))


def encode_batch(
    columns: RecordColumns,
    *,
    timestamp_type: int = 0,
    compression: str = "none",
    partition_leader_epoch: int = -1,
    compression_level: int | None = None,
) -> bytes:
    """All rows of ``columns`` as one RecordBatch (see the module docstring for the layout).

    ``compression_level`` overrides the codec's default: gzip 6 (1-9), zstd 3 (1-22), lz4 fast mode (a
    level 1-12 selects LZ4HC, as Kafka's compression.lz4.level does); snappy has none.
    """
    _check(columns)
    if not len(columns):
        raise ValueError("a record batch needs at least one record")
    codec = _codec(compression)
    records, _ = _records(columns, _Fields.of(columns), np.zeros(1, dtype=np.int64))
    return _batch(
        columns, 0, len(columns), memoryview(records),
        codec=codec, timestamp_type=timestamp_type, partition_leader_epoch=partition_leader_epoch,
        compression_level=compression_level,
    )


def _split(columns: RecordColumns, fields: _Fields, max_batch_bytes: int) -> tuple[I64, I64]:
    """First row and records bytes of each batch: greedily as many rows as fit ``max_batch_bytes``
    (at least one), each batch's sizes computed against its own base offset and timestamp."""
    n, budget = len(columns), max_batch_bytes - BATCH_OVERHEAD
    window = max(16, int(budget / (float(fields.fixed.mean()) + 3.0) * 1.25))
    starts: list[int] = []
    nbytes: list[int] = []
    start = 0
    while start < n:
        while True:
            stop = min(n, start + window)
            offsets = columns.offsets[start:stop]
            timestamp_delta = zigzag(columns.timestamps[start:stop] - columns.timestamps[start])
            offset_delta = zigzag(offsets - offsets[0])
            ends = np.cumsum(_sizes(fields.fixed[start:stop], timestamp_delta, offset_delta)[1])
            fit = int(np.searchsorted(ends, budget, side="right"))
            fit = min(fit, int(np.searchsorted(offsets, offsets[0] + _INT32_MAX, side="right")))
            if fit < stop - start or stop == n:
                break
            window *= 2
        fit = max(1, fit)
        starts.append(start)
        nbytes.append(int(ends[fit - 1]))
        start += fit
    return np.asarray(starts, dtype=np.int64), np.asarray(nbytes, dtype=np.int64)


def timestamp_runs(timestamp_types: npt.NDArray[np.integer[Any]], timestamps: I64) -> list[tuple[int, int, int]]:
    """Split rows into runs that each fit one batch's timestamp type: ``(start, stop, timestamp_type)``.

    A batch carries one timestamp type.  Under LogAppendTime (1) a consumer gives every record of a batch
    the batch's max timestamp, so a LogAppendTime run also ends wherever the timestamp changes (each run
    is then one original append); CreateTime (0) runs only end where the type changes.
    """
    n = len(timestamp_types)
    if n == 0:
        return []
    types = np.asarray(timestamp_types, dtype=np.int64)
    cut = types[1:] != types[:-1]
    cut |= (types[1:] == 1) & (timestamps[1:] != timestamps[:-1])
    bounds = np.concatenate(([0], np.flatnonzero(cut) + 1, [n]))
    return [(int(a), int(b), int(types[a])) for a, b in itertools.pairwise(bounds)]


def encode_batches(
    columns: RecordColumns,
    *,
    max_batch_bytes: int = 1 << 20,
    timestamp_type: int = 0,
    compression: str = "none",
    partition_leader_epoch: int = -1,
    compression_level: int | None = None,
) -> list[bytes]:
    """Rows of ``columns`` as consecutive RecordBatches of at most ``max_batch_bytes`` each before
    compression (a batch always holds at least one record, however large)."""
    _check(columns)
    codec = _codec(compression)
    if not len(columns):
        return []
    fields = _Fields.of(columns)
    starts, nbytes = _split(columns, fields, max_batch_bytes)
    bounds = np.append(starts, len(columns))
    done = np.append(0, np.cumsum(nbytes))  # records bytes before each batch
    out: list[bytes] = []
    first = 0
    while first < len(starts):
        # Batches first..last-1 are encoded in one pass over their rows.
        limit = done[first] + _ROWS_BYTES_PER_JOIN
        last = max(first + 1, int(np.searchsorted(done, limit, side="right")) - 1)
        lo, hi = int(bounds[first]), int(bounds[last])
        part = columns.slice(lo, hi)
        records, ends = _records(part, fields.slice(lo, hi), starts[first:last] - lo)
        view = memoryview(records)
        for b in range(first, last):
            start, stop = int(bounds[b]) - lo, int(bounds[b + 1]) - lo
            out.append(
                _batch(
                    part, start, stop, view[int(ends[start - 1]) if start else 0 : int(ends[stop - 1])],
                    codec=codec, timestamp_type=timestamp_type, partition_leader_epoch=partition_leader_epoch,
                    compression_level=compression_level,
                )
            )
        first = last
    return out


_CONTROL_BITS = 0x10 | 0x20  # transactional, control
CONTROL_BATCH_SPAN = _INT32_MAX + 1  # the most offsets one control batch spans (its last offset delta is an Int32)
_COMMIT_MARKER_KEY = struct.pack(">hh", 0, 1)     # version 0, type COMMIT
_COMMIT_MARKER_VALUE = struct.pack(">hi", 0, 0)   # version 0, coordinator epoch 0


def encode_control_batch(base_offset: int, last_offset: int, timestamp: int = -1) -> bytes:
    """A control batch spanning ``base_offset..last_offset`` whose one record, at ``last_offset``, is a
    transaction COMMIT marker of no producer (producer id -1).

    Consumers never return control records, and move their position past a control batch, as they do past
    the markers a transactional producer leaves in a real log: ksi answers a fetch inside offsets that hold
    no records (explained holes: markers, aborted records, dropped tombstones) with one of these, so the
    consumer steps over them to ``last_offset + 1``.  No producer means no transaction for read_committed
    consumers to track."""
    if last_offset < base_offset or last_offset - base_offset > _INT32_MAX:
        raise ValueError("a control batch spans 1 to 2**31 offsets")
    delta = last_offset - base_offset
    zig = ((delta << 1) ^ (delta >> 63)) & 0xFFFFFFFFFFFFFFFF
    offset_delta = write_uvarint(zig)
    body = (b"\x00" + b"\x00" + offset_delta + write_uvarint(len(_COMMIT_MARKER_KEY) << 1) + _COMMIT_MARKER_KEY
            + write_uvarint(len(_COMMIT_MARKER_VALUE) << 1) + _COMMIT_MARKER_VALUE + b"\x00")
    record = write_uvarint(len(body) << 1) + body
    header = bytearray(_HEADER.pack(base_offset, BATCH_OVERHEAD - _LENGTH_END + len(record), -1, _MAGIC, 0,
                                    _CONTROL_BITS, delta, timestamp, timestamp, _NO_PRODUCER_ID, _NO_PRODUCER_EPOCH,
                                    _NO_SEQUENCE, 1))
    crc = crc32c.crc32c(record, crc32c.crc32c(memoryview(header)[_ATTRIBUTES_AT:]))
    struct.pack_into(">I", header, _CRC_AT, crc)
    return bytes(header) + record
