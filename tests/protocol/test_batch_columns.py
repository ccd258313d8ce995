"""protocol.batch_columns: record batches decoded into columns, against batches from two independent encoders
(kafka-python's DefaultRecordBatchBuilder, every codec and transactional batches; ksi's own column encoder), and
against bytes that are not record batches.
"""

from __future__ import annotations

import struct

import crc32c
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from ksi.lake.columns import Columns
from protocol.batch_columns import HEADERS_TYPE, UnsupportedMagic, decode_batches, split_batches
from protocol.errors import MalformedFrame
from protocol.records import encode_batches, encode_control_batch

Row = tuple[int, int, "bytes | None", "bytes | None", "list[tuple[str, bytes | None]]"]

rows_strategy = st.lists(
    st.tuples(
        st.integers(0, 3),                                   # offset gap before the record
        st.integers(-(10**6), 10**6),                        # timestamp delta
        st.one_of(st.none(), st.binary(max_size=300)),       # key
        st.one_of(st.none(), st.binary(max_size=3000)),      # value
        st.lists(st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=50))), max_size=4),
    ),
    min_size=1, max_size=60,
)


def built(rows: list[Row], base_offset: int, codec: int = 0, *, producer_id: int = -1, transactional: bool = False,
          log_append_time: int | None = None) -> bytes:
    """One batch by kafka-python's builder; ``rows`` are (offset, timestamp, key, value, headers)."""
    builder = DefaultRecordBatchBuilder(2, codec, transactional, producer_id, 0 if producer_id >= 0 else -1,
                                        0 if producer_id >= 0 else -1, batch_size=1 << 30)
    for offset, timestamp, key, value, headers in rows:
        assert builder.append(offset - base_offset, timestamp, key, value, headers) is not None
    out = bytearray(builder.build())
    struct.pack_into(">q", out, 0, base_offset)
    if log_append_time is not None:
        attributes = struct.unpack_from(">h", out, 21)[0] | 0x08
        struct.pack_into(">hiqq", out, 21, attributes, struct.unpack_from(">i", out, 23)[0], rows[0][1],
                         log_append_time)
        struct.pack_into(">I", out, 17, crc32c.crc32c(memoryview(out)[21:]))
    return bytes(out)


def decoded(data: bytes, aborted: tuple[tuple[int, int], ...] = ()) -> list[Row]:
    starts, end = split_batches(data)
    assert end == len(data)
    records = decode_batches(data, starts, aborted)
    return list(zip(records.offsets.tolist(), records.timestamps.tolist(), records.keys.to_pylist(),
                    records.values.to_pylist(), [[(h["key"], h["value"]) for h in hs] for hs in
                                                 records.headers.to_pylist()], strict=True))


def as_rows(draw: list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
            first_offset: int = 1000) -> list[Row]:
    rows, offset = [], first_offset
    for gap, delta, key, value, headers in draw:
        offset += gap
        rows.append((offset, 1_700_000_000_000 + delta, key, value, headers))
        offset += 1
    return rows


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(draw=rows_strategy)
def test_kafka_pythons_batches_decode_field_for_field(codec: int, draw: list) -> None:
    rows = as_rows(draw)
    half = len(rows) // 2
    parts = [rows[:half], rows[half:]] if half else [rows]
    data = b"".join(built(part, part[0][0], codec) for part in parts)
    assert decoded(data) == rows


@settings(max_examples=40, deadline=None)
@given(draw=rows_strategy)
def test_ksis_own_encoder_round_trips(draw: list) -> None:
    rows = as_rows(draw, first_offset=0)
    columns = Columns(np.array([r[0] for r in rows], np.int64), np.array([r[1] for r in rows], np.int64),
                      pa.array([r[2] for r in rows], pa.binary()), pa.array([r[3] for r in rows], pa.binary()),
                      pa.array([[{"key": k, "value": v} for k, v in r[4]] for r in rows], HEADERS_TYPE))
    data = b"".join(encode_batches(columns, max_batch_bytes=2000, compression="zstd"))
    assert decoded(data) == rows


def test_log_append_time_batches_give_every_record_the_append_time() -> None:
    rows: list[Row] = [(5, 100, b"k", b"v", []), (6, 200, None, b"w", [])]
    data = built(rows, 5, log_append_time=999)
    starts, _ = split_batches(data)
    records = decode_batches(data, starts)
    assert records.timestamps.tolist() == [999, 999]
    assert records.timestamp_types.tolist() == [1, 1]


def _control(base: int, producer_id: int, abort: bool) -> bytes:
    """A transaction marker of ``producer_id`` at ``base`` (ksi's encoder writes COMMIT for no producer; the
    type and producer are patched in, and the CRC made again)."""
    out = bytearray(encode_control_batch(base, base))
    key_at = out.index(b"\x00\x00\x00\x01", 61)  # the marker's key: version 0, type 1 (COMMIT)
    struct.pack_into(">h", out, key_at + 2, 0 if abort else 1)
    struct.pack_into(">hq", out, 21, 0x30, 0)  # attributes: transactional + control
    struct.pack_into(">q", out, 43, producer_id)
    struct.pack_into(">I", out, 17, crc32c.crc32c(memoryview(out)[21:]))
    return bytes(out)


def test_aborted_transactions_are_marked_and_markers_left_out() -> None:
    """Producer 7: a transaction at 0-2 aborted (marker 3), one at 4-5 committed (marker 6); producer 8: 7-8
    aborted (marker 10), with a plain record at 9 between; the answer lists (7, 0) and (8, 7)."""
    def txn(offsets: list[int], pid: int) -> bytes:
        return built([(o, 1000 + o, None, b"r%d" % o, []) for o in offsets], offsets[0], producer_id=pid,
                     transactional=True)

    data = (txn([0, 1, 2], 7) + _control(3, 7, abort=True) + txn([4, 5], 7) + _control(6, 7, abort=False)
            + txn([7, 8], 8) + built([(9, 1009, None, b"plain", [])], 9) + _control(10, 8, abort=True))
    starts, _ = split_batches(data)
    records = decode_batches(data, starts, aborted_transactions=[(7, 0), (8, 7)])
    assert records.offsets.tolist() == [0, 1, 2, 4, 5, 7, 8, 9]
    assert records.aborted.tolist() == [True, True, True, False, False, True, True, False]
    assert records.controls.tolist() == [[3, 3], [6, 6], [10, 10]]
    assert records.next_offset == 11
    unmarked = decode_batches(data, starts)  # read_uncommitted: nothing listed, nothing marked
    assert not unmarked.aborted.any()


def test_a_partial_last_batch_is_left_for_the_next_read() -> None:
    first = built([(0, 1, b"a", b"b", [])], 0)
    second = built([(1, 2, b"c", b"d", [])], 1)
    data = first + second[:-5]
    assert split_batches(data) == ([0], len(first))
    assert split_batches(data, len(first)) == ([], len(first))


def test_an_old_message_set_is_named_by_its_offset() -> None:
    legacy = struct.pack(">qiIbbqii", 42, 22, 0, 1, 0, 0, -1, -1)
    with pytest.raises(UnsupportedMagic, match="offset 42: a magic-1 message set") as caught:
        split_batches(built([(0, 1, None, b"x", [])], 0) + legacy)
    assert caught.value.offset == 42


def _corrupt(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value):]


@pytest.mark.parametrize("case", ["crc", "count", "record length", "codec"])
def test_bytes_that_are_not_batches_are_an_error_naming_the_offset(case: str) -> None:
    data = built([(77, 1, b"key", b"value", [("h", b"v")]), (78, 2, None, None, [])], 77)
    if case == "crc":
        data = _corrupt(data, len(data) - 1, b"\xff")
    elif case == "count":
        data = _corrupt(data, 57, struct.pack(">i", 3))
    elif case == "record length":
        data = _corrupt(data, 61, b"\x7e")  # the first record's length: 63 instead of its own
    else:
        data = _corrupt(data, 21, struct.pack(">h", 5))
    starts, _ = split_batches(data)
    with pytest.raises(MalformedFrame, match="offset 77"):
        decode_batches(data, starts, verify_crc=case == "crc")


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_batches_decode_or_raise_malformed_frame(data: st.DataObject) -> None:
    """Any byte changed (CRC checks off, so that the decoder itself meets the damage): the batch decodes or
    is refused with MalformedFrame, never another exception."""
    original = built([(10, 5, b"k1", b"v" * 200, [("a", b"1"), ("b", None)]), (12, 6, None, b"w", []),
                      (13, 9, b"", None, [("c", b"")])], 10, producer_id=3, transactional=True) + _control(14, 3, True)
    mutated = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        mutated[data.draw(st.integers(0, len(mutated) - 1))] = data.draw(st.integers(0, 255))
    try:
        starts, _ = split_batches(bytes(mutated))
        decode_batches(bytes(mutated), starts, [(3, 10)], verify_crc=False)
    except MalformedFrame:
        pass

