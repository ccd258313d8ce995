"""protocol/varint.py, the one varint kernel: scalar zig-zag varints against kafka-python's, and the column
writer against the scalar one, row by row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.util import decode_varint, encode_varint

from protocol.errors import MalformedFrame
from protocol.varint import Const, Fixed, Varint, join_rows, read_varint, varint_sizes, write_run, write_varint

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@settings(deadline=None)  # a loaded machine; no timed assertions
@given(INT64)
def test_zigzag_varint_matches_kafka_python(value: int) -> None:
    expected = bytearray()
    encode_varint(value, expected.append)
    assert write_varint(value) == bytes(expected)
    assert read_varint(expected + b"\xff", 0) == (value, len(expected))
    assert decode_varint(bytearray(write_varint(value)), 0) == (value, len(expected))


def test_truncated_varint_is_malformed() -> None:
    with pytest.raises(MalformedFrame):
        read_varint(write_varint(1 << 40)[:-1], 0)


@settings(deadline=None)
@given(st.lists(INT64, min_size=1, max_size=50))
def test_varint_column_is_the_scalar_varints(values: list[int]) -> None:
    piece = Varint.of(np.array(values, dtype=np.int64))
    assert list(piece.sizes) == [len(write_varint(v)) for v in values]
    assert write_run([piece], len(values)).to_pylist() == [write_varint(v) for v in values]


def test_run_of_pieces_and_binary_arrays_row_by_row() -> None:
    values = np.array([0, -1, 300, -(2**40)], dtype=np.int64)
    absent = Varint(Varint.of(values).u, np.where(values == 300, 0, varint_sizes(Varint.of(values).u)))
    fixed = Fixed(np.array([[1, 2], [3, 4], [5, 6], [7, 8]], dtype=np.uint8), np.array([True, False, True, True]))
    binary = pa.array([b"a", None, b"", b"xyz"], pa.large_binary())
    rows = join_rows([Const(b"\x00"), Varint.of(values), binary, absent, fixed], 4).to_pylist()
    fixed_rows = [b"\x01\x02", b"", b"\x05\x06", b"\x07\x08"]
    expected = [b"\x00" + write_varint(int(v)) + (b or b"") + (b"" if v == 300 else write_varint(int(v))) + f
                for v, b, f in zip(values, binary.to_pylist(), fixed_rows, strict=True)]
    assert rows == expected
    assert join_rows([pa.array([b"", b""])], 2).to_pylist() == [b"", b""]
