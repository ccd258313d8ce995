"""protocol.records against a plain per-record encoder written from the spec, and against real readers.

The reference below is deliberately naive (one record at a time, pure-Python CRC-32C); it is itself
checked against kafka-python's DefaultRecordBatchBuilder.  The fast encoder must match it byte for byte
uncompressed; compressed batches must match it everywhere but the compressed stream, which must inflate
to the reference's records, and kafka-python and aiokafka must read every field back.
"""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass, field

import lz4.frame
import numpy as np
import pyarrow as pa
import pytest
import snappy
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords
from kafka.record._crc32c import crc as crc32c_py
from kafka.record.default_records import DefaultRecordBatchBuilder

from ksi.lake.columns import Columns
from protocol.records import (
    BATCH_OVERHEAD,
    COMPRESSION_CODECS,
    encode_batch,
    encode_batches,
    record_sizes,
)

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
Header = tuple[str, "bytes | None"]


@dataclass
class Row:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header] | None = field(default_factory=list)  # None: a null list


# -- the reference ---------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    u = (n << 1) ^ (n >> 63)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def nullable_bytes(b: bytes | None) -> bytes:
    return varint(-1) if b is None else varint(len(b)) + b


def reference_record(row: Row, base_offset: int, base_timestamp: int) -> bytes:
    headers = row.headers or []
    body = (
        b"\x00"  # attributes
        + varint(row.timestamp - base_timestamp)
        + varint(row.offset - base_offset)
        + nullable_bytes(row.key)
        + nullable_bytes(row.value)
        + varint(len(headers))
        + b"".join(varint(len(k.encode())) + k.encode() + nullable_bytes(v) for k, v in headers)
    )
    return varint(len(body)) + body


def reference_records(rows: list[Row]) -> bytes:
    return b"".join(reference_record(r, rows[0].offset, rows[0].timestamp) for r in rows)


def reference_batch(
    rows: list[Row], *, timestamp_type: int = 0, partition_leader_epoch: int = -1, codec: int = 0,
    payload: bytes | None = None,
) -> bytes:
    """The batch, from the spec; ``payload`` stands in for the records section (a compressed one)."""
    after_crc = struct.pack(
        ">hiqqqhii",
        codec | (timestamp_type << 3),
        rows[-1].offset - rows[0].offset,
        rows[0].timestamp,
        max(r.timestamp for r in rows),
        -1, -1, -1,  # producer id, producer epoch, base sequence
        len(rows),
    ) + (reference_records(rows) if payload is None else payload)
    crc = crc32c_py(after_crc)
    length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, CRC, the rest
    return struct.pack(">qiibI", rows[0].offset, length, partition_leader_epoch, 2, crc) + after_crc


def kafka_python_batch(rows: list[Row], *, timestamp_type: int, partition_leader_epoch: int) -> bytes:
    """kafka-python's producer-side builder, then the fields a broker would set patched in."""
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, batch_size=1 << 30)
    for r in rows:
        assert builder.append(r.offset - rows[0].offset, r.timestamp, r.key, r.value, r.headers or []) is not None
    out = bytearray(builder.build())
    struct.pack_into(">q", out, 0, rows[0].offset)
    struct.pack_into(">i", out, 12, partition_leader_epoch)
    struct.pack_into(">h", out, 21, struct.unpack_from(">h", out, 21)[0] | (timestamp_type << 3))
    struct.pack_into(">I", out, 17, crc32c_py(bytes(out[21:])))
    return bytes(out)


def decompress(codec: int, data: bytes) -> bytes:
    """Independent decoders: stdlib gzip, python-snappy (xerial framing by hand), python-lz4, zstandard."""
    if codec == 1:
        return gzip.decompress(data)
    if codec == 2:
        assert data[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
        out, at = [], 16
        while at < len(data):
            (size,) = struct.unpack_from(">i", data, at)
            block = snappy.uncompress(data[at + 4 : at + 4 + size])
            assert len(block) <= 32 << 10
            out.append(block)
            at += 4 + size
        return b"".join(out)
    if codec == 3:
        assert data[:7] == bytes.fromhex("04224d18604082")  # independent 64 KiB blocks, no checksums
        return lz4.frame.decompress(data)
    assert codec == 4
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


# -- building columns ------------------------------------------------------------------------------


def columns_of(rows: list[Row], *, with_headers: bool = True, large: bool = False) -> Columns:
    binary = pa.large_binary() if large else pa.binary()
    headers = None
    if with_headers:
        headers = pa.array(
            [None if r.headers is None else [{"key": k, "value": v} for k, v in r.headers] for r in rows],
            HEADERS_TYPE,
        )
    return Columns(
        np.array([r.offset for r in rows], dtype=np.int64),
        np.array([r.timestamp for r in rows], dtype=np.int64),
        pa.array([r.key for r in rows], binary),
        pa.array([r.value for r in rows], binary),
        headers,
    )


def sized(n: int, seed: bytes) -> bytes:
    return (seed * (n // len(seed) + 1))[:n]


payloads = st.one_of(
    st.none(),
    st.binary(max_size=20),
    st.builds(sized, st.sampled_from([127, 128, 300, 16383, 16384, 20000]), st.binary(min_size=1, max_size=8)),
)
small_payloads = st.one_of(
    st.none(), st.binary(max_size=10), st.builds(sized, st.sampled_from([130]), st.binary(min_size=1))
)
headers = st.one_of(
    st.none(), st.lists(st.tuples(st.text(max_size=8), small_payloads), max_size=3)
)
timestamp_steps = st.one_of(st.integers(-1000, 1000), st.integers(-(2**40), 2**40))
offset_steps = st.one_of(st.just(1), st.integers(1, 300), st.integers(1, 2**24))


@st.composite
def row_lists(draw: st.DrawFn, max_rows: int = 30) -> list[Row]:
    n = draw(st.integers(1, max_rows))
    offset = draw(st.integers(0, 2**40))
    base_timestamp = draw(st.integers(0, 2**42))
    rows = []
    for _ in range(n):
        timestamp = base_timestamp + draw(timestamp_steps)
        rows.append(Row(offset, timestamp, draw(payloads), draw(payloads), draw(headers)))
        offset += draw(offset_steps)
    return rows


slow_ok = [HealthCheck.too_slow, HealthCheck.data_too_large]
examples = settings(max_examples=150, deadline=None, suppress_health_check=slow_ok)


# -- byte for byte ---------------------------------------------------------------------------------


@examples
@given(rows=row_lists(), with_headers=st.booleans(), large=st.booleans(), timestamp_type=st.sampled_from([0, 1]),
       partition_leader_epoch=st.sampled_from([-1, 0, 7]))
def test_matches_the_reference_byte_for_byte(
    rows: list[Row], with_headers: bool, large: bool, timestamp_type: int, partition_leader_epoch: int
) -> None:
    if not with_headers:
        for r in rows:
            r.headers = []
    columns = columns_of(rows, with_headers=with_headers, large=large)
    got = encode_batch(columns, timestamp_type=timestamp_type, partition_leader_epoch=partition_leader_epoch)
    assert got == reference_batch(
        rows, timestamp_type=timestamp_type, partition_leader_epoch=partition_leader_epoch
    )
    sizes = record_sizes(columns)
    assert sizes.tolist() == [len(reference_record(r, rows[0].offset, rows[0].timestamp)) for r in rows]
    assert int(sizes.sum()) + BATCH_OVERHEAD == len(got)


@settings(max_examples=60, deadline=None, suppress_health_check=slow_ok)
@given(rows=row_lists(), timestamp_type=st.sampled_from([0, 1]))
def test_reference_agrees_with_kafka_python(rows: list[Row], timestamp_type: int) -> None:
    assert reference_batch(rows, timestamp_type=timestamp_type, partition_leader_epoch=3) == kafka_python_batch(
        rows, timestamp_type=timestamp_type, partition_leader_epoch=3
    )


@examples
@given(rows=row_lists(max_rows=40), large=st.booleans(), data=st.data())
def test_slices_of_columns(rows: list[Row], large: bool, data: st.DataObject) -> None:
    """Arrow arrays with a non-zero offset (and numpy views) encode like fresh ones."""
    columns = columns_of(rows, large=large)
    start = data.draw(st.integers(0, len(rows) - 1))
    stop = data.draw(st.integers(start + 1, len(rows)))
    part = columns.slice(start, stop)
    assert len(part) == stop - start
    assert encode_batch(part) == reference_batch(rows[start:stop])
    base = rows[start]
    assert record_sizes(part).tolist() == [
        len(reference_record(r, base.offset, base.timestamp)) for r in rows[start:stop]
    ]


@examples
@given(rows=row_lists(max_rows=40), large=st.booleans(), max_batch_bytes=st.integers(1, 3000), data=st.data())
def test_records_of_exactly_one_header_each(rows: list[Row], large: bool, max_batch_bytes: int,
                                            data: st.DataObject) -> None:
    """Every record with one header (its pieces are joined with the record's own, no second join), sliced and
    split into batches anywhere: the reference's bytes; one record without a header among them: the same."""
    one = st.tuples(st.text(max_size=8), small_payloads).map(lambda h: [h])
    for r in rows:
        r.headers = data.draw(one)
    if data.draw(st.booleans()):
        data.draw(st.sampled_from(rows)).headers = data.draw(st.sampled_from([[], None]))
    columns = columns_of(rows, large=large)
    start = data.draw(st.integers(0, len(rows) - 1))
    part = columns.slice(start, len(rows))
    assert encode_batch(part) == reference_batch(rows[start:])
    at = start
    for batch in encode_batches(part, max_batch_bytes=max_batch_bytes):
        (count,) = struct.unpack_from(">i", batch, 57)
        assert batch == reference_batch(rows[at : at + count])
        at += count
    assert at == len(rows)


@examples
@given(rows=row_lists(max_rows=40), large=st.booleans(), widths=st.tuples(*[st.sampled_from([1, 8, 32, 33])] * 3),
       data=st.data())
def test_keys_values_and_headers_of_one_width(rows: list[Row], large: bool, widths: tuple[int, int, int],
                                              data: st.DataObject) -> None:
    """Keys, values and header values all of one width (up to 32 bytes they are copied as a byte matrix, past
    that joined as any other), sliced anywhere, a null among them or not: the reference's bytes."""
    key_width, value_width, header_width = widths
    for r in rows:
        r.key = data.draw(st.binary(min_size=key_width, max_size=key_width))
        r.value = data.draw(st.binary(min_size=value_width, max_size=value_width))
        r.headers = [("h", data.draw(st.binary(min_size=header_width, max_size=header_width)))]
    if data.draw(st.booleans()):
        data.draw(st.sampled_from(rows)).key = None
    columns = columns_of(rows, large=large)
    start = data.draw(st.integers(0, len(rows) - 1))
    assert encode_batch(columns.slice(start, len(rows))) == reference_batch(rows[start:])


def test_thousands_of_records() -> None:
    rng = np.random.default_rng(7)
    n = 5000
    offsets = 10**12 + np.cumsum(rng.integers(1, 4, n))
    timestamps = 1_700_000_000_000 + np.cumsum(rng.integers(-50, 100, n))
    lengths = rng.choice(
        [0, 5, 100, 127, 128, 1000, 16383, 16384, 17000], n, p=[.05, .2, .4, .05, .05, .1, .05, .05, .05]
    )
    rows = []
    for i in range(n):
        value = None if rng.random() < 0.05 else rng.integers(0, 256, int(lengths[i]), dtype=np.uint8).tobytes()
        key = None if rng.random() < 0.3 else rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
        hdrs = [("trace-id", rng.integers(0, 256, 16, dtype=np.uint8).tobytes())] * int(rng.integers(0, 3))
        rows.append(Row(int(offsets[i]), int(timestamps[i]), key, value, hdrs))
    columns = columns_of(rows)
    got = encode_batch(columns)
    assert got == reference_batch(rows)
    assert int(record_sizes(columns).sum()) + BATCH_OVERHEAD == len(got)
    batches = encode_batches(columns, max_batch_bytes=256 << 10)
    assert len(batches) > 5
    start = 0
    for batch in batches:
        assert len(batch) <= 256 << 10
        (count,) = struct.unpack_from(">i", batch, 57)
        assert batch == reference_batch(rows[start : start + count])
        start += count
    assert start == n


def test_batches_encoded_in_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """encode_batches encodes a few batches per pass; some passes may see no header at all."""
    import protocol.records

    monkeypatch.setattr(protocol.records, "_ROWS_BYTES_PER_JOIN", 300)
    rows = [Row(i, i, b"k", b"v" * 50, [("h", b"x")] if i < 20 else []) for i in range(60)]
    batches = encode_batches(columns_of(rows), max_batch_bytes=200)
    start = 0
    for batch in batches:
        (count,) = struct.unpack_from(">i", batch, 57)
        assert batch == reference_batch(rows[start : start + count])
        start += count
    assert start == len(rows)


def test_a_batch_at_exactly_the_limit_and_one_byte_under() -> None:
    rows = [Row(i, 1000 + i, b"k", b"v" * 10) for i in range(10)]
    whole = len(reference_batch(rows))
    assert len(encode_batches(columns_of(rows), max_batch_bytes=whole)) == 1
    assert len(encode_batches(columns_of(rows), max_batch_bytes=whole - 1)) == 2
    assert [len(b) for b in encode_batches(columns_of(rows), max_batch_bytes=1)] == [
        len(reference_batch([r])) for r in rows
    ]


@examples
@given(rows=row_lists(max_rows=40), max_batch_bytes=st.integers(1, 3000))
def test_encode_batches_splits_greedily(rows: list[Row], max_batch_bytes: int) -> None:
    columns = columns_of(rows)
    batches = encode_batches(columns, max_batch_bytes=max_batch_bytes, timestamp_type=1)
    start = 0
    for batch in batches:
        (count,) = struct.unpack_from(">i", batch, 57)
        assert count >= 1
        assert batch == reference_batch(rows[start : start + count], timestamp_type=1)
        assert len(batch) <= max_batch_bytes or count == 1
        if start + count < len(rows):  # one more record would not have fit
            assert len(reference_batch(rows[start : start + count + 1])) > max_batch_bytes
        start += count
    assert start == len(rows)


# -- compression, and real readers -----------------------------------------------------------------


def check_read_back(batch: bytes, rows: list[Row], timestamp_type: int) -> None:
    for reader in (MemoryRecords, aiokafka_records):
        records = reader(batch)
        read = records.next_batch()
        assert read.validate_crc()
        assert (read.base_offset, read.magic) == (rows[0].offset, 2)
        assert read.last_offset_delta == rows[-1].offset - rows[0].offset
        assert (read.producer_id, read.producer_epoch, read.base_sequence) == (-1, -1, -1)
        assert not read.is_transactional and not read.is_control_batch
        assert read.timestamp_type == timestamp_type
        assert read.max_timestamp == max(r.timestamp for r in rows)
        got = [(r.offset, r.timestamp, r.key, r.value, list(map(tuple, r.headers))) for r in read]
        assert got == [
            (r.offset, read.max_timestamp if timestamp_type else r.timestamp, r.key, r.value, r.headers or [])
            for r in rows
        ]
        assert records.next_batch() is None


def aiokafka_records(batch: bytes):  # type: ignore[no-untyped-def]
    from aiokafka.record.memory_records import MemoryRecords as AioMemoryRecords

    return AioMemoryRecords(batch)


@pytest.mark.parametrize("compression", list(COMPRESSION_CODECS))
@settings(max_examples=40, deadline=None, suppress_health_check=slow_ok)
@given(rows=row_lists(), timestamp_type=st.sampled_from([0, 1]))
def test_compressed_batches_read_back(compression: str, rows: list[Row], timestamp_type: int) -> None:
    codec = COMPRESSION_CODECS[compression]
    batch = encode_batch(columns_of(rows), compression=compression, timestamp_type=timestamp_type)
    payload = batch[BATCH_OVERHEAD:]
    if codec:
        assert decompress(codec, payload) == reference_records(rows)
    assert batch == reference_batch(rows, timestamp_type=timestamp_type, codec=codec, payload=payload)
    check_read_back(batch, rows, timestamp_type)


@pytest.mark.parametrize("compression", list(COMPRESSION_CODECS))
def test_large_compressed_batches_span_many_blocks(compression: str) -> None:
    rng = np.random.default_rng(1)
    def value(i: int) -> bytes:  # two in three compressible, one random
        return rng.choice(list(b"abcdefgh"), 3000).astype(np.uint8).tobytes() if i % 3 else rng.bytes(3000)

    rows = [Row(i * 2, 5000 - i, None, value(i)) for i in range(300)]
    batches = encode_batches(columns_of(rows), max_batch_bytes=400_000, compression=compression)
    assert len(batches) == 3
    done = 0
    for batch in batches:
        (count,) = struct.unpack_from(">i", batch, 57)
        part = rows[done : done + count]
        if COMPRESSION_CODECS[compression]:
            assert decompress(COMPRESSION_CODECS[compression], batch[BATCH_OVERHEAD:]) == reference_records(part)
        check_read_back(batch, part, 0)
        done += count
    assert done == len(rows)


# -- odd inputs ------------------------------------------------------------------------------------


def test_null_and_string_typed_columns() -> None:
    rows = [Row(5, 10, None, None, []), Row(6, 9, None, b"", [])]
    columns = Columns(
        np.array([5, 6], dtype=np.int64), np.array([10, 9], dtype=np.int64),
        pa.nulls(2), pa.array([None, ""], pa.string()), pa.array([None, []], HEADERS_TYPE),
    )
    assert encode_batch(columns) == reference_batch(rows)


def test_dictionary_columns_and_header_fields_by_name() -> None:
    rows = [Row(1, 5, b"a", b"x", [("k1", b"v")]), Row(3, 4, b"a", None, [("k2", None), ("k1", b"")])]
    value_first = pa.list_(pa.struct([("value", pa.binary()), ("key", pa.string())]))
    headers = pa.array([[{"key": k, "value": v} for k, v in r.headers or []] for r in rows], value_first)
    columns = Columns(
        np.array([1, 3], dtype=np.int64), np.array([5, 4], dtype=np.int64),
        pa.array([b"a", b"a"]).dictionary_encode(), pa.array([b"x", None]).dictionary_encode(), headers,
    )
    assert encode_batch(columns) == reference_batch(rows)


def test_all_empty_header_lists_and_null_header_values() -> None:
    rows = [Row(1, 1, b"a", b"b", []), Row(2, 2, b"a", b"b", None)]
    assert encode_batch(columns_of(rows)) == reference_batch(rows)
    rows = [Row(1, 1, b"a", b"b", [("é€", None), ("", b"")])]
    assert encode_batch(columns_of(rows)) == reference_batch(rows)


def test_rejects_what_kafka_cannot_carry() -> None:
    good = columns_of([Row(1, 1, b"a", b"b"), Row(2, 1, b"a", b"b")])
    with pytest.raises(ValueError):
        encode_batch(good.slice(0, 0))
    assert encode_batches(good.slice(0, 0)) == []
    with pytest.raises(ValueError, match="strictly increasing"):
        encode_batch(columns_of([Row(2, 1, b"a", b"b"), Row(2, 1, b"a", b"b")]))
    with pytest.raises(ValueError, match="compression"):
        encode_batch(good, compression="brotli")
    with pytest.raises(ValueError, match="differ in length"):
        Columns(good.offsets, good.timestamps[:1], good.keys, good.values)
    null_key = pa.array([[{"key": None, "value": b"x"}], []], HEADERS_TYPE)
    with pytest.raises(ValueError, match="header key"):
        encode_batch(Columns(good.offsets, good.timestamps, good.keys, good.values, null_key))
    with pytest.raises(ValueError, match="2\\*\\*31"):
        encode_batch(columns_of([Row(0, 1, None, None), Row(2**31, 1, None, None)]))
    split = encode_batches(columns_of([Row(0, 1, None, None), Row(2**31, 1, None, None)]))
    assert len(split) == 2


@pytest.mark.parametrize(
    ("compression", "level"), [("gzip", 1), ("gzip", 9), ("lz4", 9), ("zstd", 1), ("zstd", 19)]
)
def test_compression_levels(compression: str, level: int) -> None:
    rows = [Row(i, 7, b"key", b"value %d " % i * 20, [("h", b"v")]) for i in range(200)]
    codec = COMPRESSION_CODECS[compression]
    batch = encode_batch(columns_of(rows), compression=compression, compression_level=level)
    assert decompress(codec, batch[BATCH_OVERHEAD:]) == reference_records(rows)
    assert batch == reference_batch(rows, codec=codec, payload=batch[BATCH_OVERHEAD:])
    check_read_back(batch, rows, 0)


def test_timestamp_runs_split_types_and_log_append_times() -> None:
    from protocol.records import timestamp_runs

    types = np.array([0, 0, 1, 1, 1, 0, 1], dtype=np.int8)
    timestamps = np.array([5, 3, 10, 10, 11, 4, 11], dtype=np.int64)
    # CreateTime runs keep any timestamps together; LogAppendTime runs end where the append time changes.
    assert timestamp_runs(types, timestamps) == [(0, 2, 0), (2, 4, 1), (4, 5, 1), (5, 6, 0), (6, 7, 1)]
    assert timestamp_runs(np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.int64)) == []
