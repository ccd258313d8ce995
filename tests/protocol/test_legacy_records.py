"""protocol.legacy_records against kafka-python's legacy record reader (kafka.record.legacy_records, via
MemoryRecords): ksi's own batches, every codec and both timestamp types, converted to magic 0 and 1, must
read back with the same offsets, keys, values and (magic 1) timestamps, valid CRCs and no headers."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords
from kafka.record._crc32c import crc as crc32c_py
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from protocol.legacy_records import LegacyConversionError, convert_batches, message_format_for_fetch
from protocol.records import COMPRESSION_CODECS, encode_batches

from .test_records import Row, columns_of, row_lists

examples = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.data_too_large])


@st.composite
def small_rows(draw: st.DrawFn) -> list[Row]:
    """A few records with small payloads, for tests that convert every prefix of their bytes."""
    offset, timestamp = draw(st.integers(0, 2**40)), draw(st.integers(0, 2**42))
    rows = []
    for _ in range(draw(st.integers(1, 6))):
        rows.append(Row(offset, timestamp, draw(st.none() | st.binary(max_size=12)),
                        draw(st.none() | st.binary(max_size=40))))
        offset += draw(st.integers(1, 1000))
        timestamp += draw(st.integers(-5, 5))
    return rows


def read_legacy(data: bytes) -> list[tuple[int, int, int, bytes | None, bytes | None, list]]:  # type: ignore[type-arg]
    """(magic, offset, timestamp, key, value, headers) per message, every CRC checked."""
    records = MemoryRecords(data)
    out = []
    while (batch := records.next_batch()) is not None:
        assert batch.magic in (0, 1)
        assert batch.compression_type == 0
        assert batch.validate_crc()
        for r in batch:
            assert r.validate_crc()
            out.append((batch.magic, r.offset, r.timestamp, r.key, r.value, list(r.headers)))
    return out


def expected(rows: list[Row], magic: int, timestamp_type: int, batches: list[bytes]) -> list:  # type: ignore[type-arg]
    out = []
    at = 0
    for batch in batches:
        (count,) = struct.unpack_from(">i", batch, 57)
        group = rows[at:at + count]
        at += count
        max_timestamp = max(r.timestamp for r in group)
        for r in group:
            timestamp = None if magic == 0 else (max_timestamp if timestamp_type == 1 else r.timestamp)
            out.append((magic, r.offset, timestamp, r.key, r.value, []))
    return out


def test_message_format_for_each_fetch_version() -> None:
    assert [message_format_for_fetch(v) for v in range(6)] == [0, 0, 1, 1, None, None]
    assert message_format_for_fetch(17) is None


@pytest.mark.parametrize("compression", list(COMPRESSION_CODECS))
@examples
@given(rows=row_lists(), timestamp_type=st.sampled_from([0, 1]), magic=st.sampled_from([0, 1]),
       max_batch_bytes=st.integers(61, 3000))
def test_every_record_reads_back_in_the_old_formats(compression: str, rows: list[Row], timestamp_type: int,
                                                    magic: int, max_batch_bytes: int) -> None:
    batches = encode_batches(columns_of(rows), max_batch_bytes=max_batch_bytes, timestamp_type=timestamp_type,
                             compression=compression)
    converted = convert_batches(b"".join(batches), magic)
    assert read_legacy(converted) == expected(rows, magic, timestamp_type, batches)
    if magic == 1 and timestamp_type == 1:
        first = MemoryRecords(converted).next_batch()
        assert first is not None and first.timestamp_type == 1  # LogAppendTime kept in the attributes


@examples
@given(rows=row_lists(max_rows=20), magic=st.sampled_from([0, 1]), max_bytes=st.integers(1, 4000))
def test_max_bytes_keeps_whole_messages_and_at_least_one(rows: list[Row], magic: int, max_bytes: int) -> None:
    batches = encode_batches(columns_of(rows), max_batch_bytes=500)
    whole = convert_batches(b"".join(batches), magic)
    sizes, at = [], 0
    while at < len(whole):
        size = 12 + struct.unpack_from(">i", whole, at + 8)[0]
        sizes.append(size)
        at += size
    fit = 0  # the most whole messages within max_bytes, but at least one
    while fit < len(sizes) and sum(sizes[:fit + 1]) <= max_bytes:
        fit += 1
    assert convert_batches(b"".join(batches), magic, max_bytes=max_bytes) == whole[:sum(sizes[:max(fit, 1)])]


@examples
@given(rows=small_rows(), magic=st.sampled_from([0, 1]))
def test_a_partial_trailing_batch_is_left_out_at_every_cut(rows: list[Row], magic: int) -> None:
    batches = encode_batches(columns_of(rows), max_batch_bytes=120)
    data = b"".join(batches)
    ends = [sum(map(len, batches[:i + 1])) for i in range(len(batches))]
    for cut in range(len(data) + 1):
        whole = [b for b, end in zip(batches, ends, strict=True) if end <= cut]
        assert convert_batches(data[:cut], magic) == convert_batches(b"".join(whole), magic), cut


def test_control_batches_are_dropped_and_old_formats_copied() -> None:
    rows = [Row(10, 1000, b"k", b"v"), Row(11, 1001, None, None)]
    (batch,) = encode_batches(columns_of(rows))
    control = bytearray(batch)
    struct.pack_into(">h", control, 21, 0x20 | 0x10)  # control + transactional
    struct.pack_into(">I", control, 17, crc32c_py(bytes(control[21:])))
    assert convert_batches(bytes(control) + batch, 1) == convert_batches(batch, 1)

    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(5, timestamp=123, key=b"old", value=b"message")
    old = bytes(builder.build())
    assert convert_batches(old + batch, 1) == old + convert_batches(batch, 1)
    assert read_legacy(convert_batches(batch, 0)) == [(0, 10, None, b"k", b"v", []), (0, 11, None, None, None, [])]


def test_headers_are_dropped() -> None:
    rows = [Row(0, 5, b"k", b"v", [("h", b"1"), ("n", None)])]
    assert read_legacy(convert_batches(encode_batches(columns_of(rows))[0], 1)) == [(1, 0, 5, b"k", b"v", [])]


def test_unknown_codec_and_magic() -> None:
    (batch,) = encode_batches(columns_of([Row(0, 5, b"k", b"v")]))
    bad = bytearray(batch)
    struct.pack_into(">h", bad, 21, 7)
    with pytest.raises(LegacyConversionError, match="codec 7"):
        convert_batches(bytes(bad), 1)
    with pytest.raises(ValueError, match="magic"):
        convert_batches(batch, 2)
