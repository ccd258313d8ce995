"""Edge cases of decode_values / encode_values, and the errors they raise."""

from __future__ import annotations

import struct
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import ksi.avro.pieces
import protocol.varint
from ksi.avro import (
    AvroDecodeError,
    AvroEncodeError,
    arrow_type,
    decode_values,
    encode_values,
    parse_schema,
    unsupported_reason,
)

from . import avro_bytes, avro_read


def _schema(*fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "R", "fields": [{"name": n, "type": t} for n, t in fields]}


def _roundtrip(schema_json: dict[str, Any], rows: list[Any]) -> pa.StructArray:
    """decode_values(fastavro bodies) re-encodes to the same bytes; returns the decoded columns."""
    schema = parse_schema(schema_json)
    bodies = [avro_bytes(schema_json, row) for row in rows]
    columns = decode_values(pa.array(bodies, pa.binary()), schema)
    assert encode_values(columns, schema).to_pylist() == bodies
    return columns


def test_zero_rows() -> None:
    schema_json = _schema(("a", "long"), ("s", ["null", "string"]), ("l", {"type": "array", "items": "int"}))
    schema = parse_schema(schema_json)
    columns = decode_values([], schema)
    assert len(columns) == 0 and columns.type == arrow_type(schema)
    out = encode_values(columns, schema)
    assert out.type == pa.binary() and len(out) == 0
    empty = pa.table(
        {
            "a": pa.array([], pa.int64()),
            "s": pa.array([], pa.string()),
            "l": pa.array([], pa.list_(pa.int32())),
        }
    )
    assert len(encode_values(empty, schema)) == 0
    assert len(encode_values(pa.RecordBatch.from_pylist([], schema=empty.schema), schema)) == 0
    assert (
        len(
            encode_values(
                pa.table({"a": pa.chunked_array([], pa.int64())}), parse_schema(_schema(("a", "long")))
            )
        )
        == 0
    )


def test_all_null_columns() -> None:
    inner = {"type": "record", "name": "In", "fields": [{"name": "x", "type": "int"}]}
    schema_json = _schema(
        ("s", ["null", "string"]),
        ("r", [inner, "null"]),
        ("l", ["null", {"type": "array", "items": "long"}]),
        ("d", ["null", {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 1}]),
    )
    rows = [{"s": None, "r": None, "l": None, "d": None}] * 3
    _roundtrip(schema_json, rows)
    # a column of Arrow's null type, and a missing nullable column without a default
    schema = parse_schema(schema_json)
    table = pa.table(
        {
            "s": pa.nulls(3),
            "r": pa.nulls(3, arrow_type(schema).field("r").type),
            "l": pa.nulls(3),
            "d": pa.nulls(3),
        }
    )
    assert encode_values(table, schema).to_pylist() == [avro_bytes(schema_json, row) for row in rows]


def test_empty_values_and_long_ones() -> None:
    schema_json = _schema(
        ("s", "string"),
        ("b", "bytes"),
        ("a", {"type": "array", "items": "string"}),
        ("m", {"type": "map", "values": {"type": "array", "items": "int"}}),
    )
    rows = [
        {"s": "", "b": b"", "a": [], "m": {}},
        {
            "s": "x" * 200,
            "b": bytes(range(256)) * 3,
            "a": [""] * 300,
            "m": {"": [], "k" * 70: list(range(-100, 100))},
        },
        {"s": "é✓😀\u0000", "b": b"\x00", "a": ["😀" * 50], "m": {"😀": [2**31 - 1, -(2**31)]}},
    ]
    _roundtrip(schema_json, rows)


def test_integer_extremes_and_floats_bit_exact() -> None:
    schema_json = _schema(("i", "int"), ("l", "long"), ("f", "float"), ("d", "double"))
    ints = [0, 1, -1, 63, -64, 64, -65, 2**31 - 1, -(2**31)]
    longs = [0, 2**63 - 1, -(2**63), 2**56, -(2**56) - 1, 2**35, 127, 128, -(2**35)]
    floats = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.5, 3.4028234663852886e38, 1e-45, -1.5]
    doubles = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 5e-324, 1.7976931348623157e308, -2.5, 0.1]
    rows = [{"i": i, "l": lo, "f": f, "d": d} for i, lo, f, d in zip(ints, longs, floats, doubles, strict=True)]
    _roundtrip(schema_json, rows)


def test_nan_payloads_are_kept() -> None:
    schema = parse_schema(_schema(("f", "float"), ("d", "double")))
    payloads = [
        (0x7FC00001, 0x7FF8000000000123),  # quiet NaNs with payloads
        (0xFFC00000, 0xFFF8000000000000),  # negative quiet NaNs
        (0x7FC00000, 0x7FF0000000000001),  # a signalling double NaN
    ]
    bodies = [struct.pack("<I", f) + struct.pack("<Q", d) for f, d in payloads]
    assert encode_values(decode_values(bodies, schema), schema).to_pylist() == bodies


def test_decimals_match_fastavro() -> None:
    schema_json = _schema(
        ("b", {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 2}),
        (
            "f",
            {"type": "fixed", "name": "F", "size": 5, "logicalType": "decimal", "precision": 9, "scale": 0},
        ),
        (
            "w",
            {
                "type": "fixed",
                "name": "W",
                "size": 20,
                "logicalType": "decimal",
                "precision": 38,
                "scale": 38,
            },
        ),
    )
    values = [
        0,
        1,
        -1,
        127,
        128,
        -128,
        -129,
        255,
        256,
        -32768,
        -32769,
        2**63,
        -(2**63),
        10**38 - 1,
        -(10**38 - 1),
    ]
    rows = [
        {"b": (Decimal(v).scaleb(-2, None) if abs(v) < 10**27
               else Decimal((int(v < 0), tuple(map(int, str(abs(v)))), -2))),
         "f": Decimal(max(min(v, 10**9 - 1), -(10**9 - 1))),
         "w": Decimal((int(v < 0), tuple(map(int, str(abs(v)))), -38))}
        for v in values
    ]  # fmt: skip
    columns = _roundtrip(schema_json, rows)
    assert columns.field("b").to_pylist()[5] == Decimal("-1.28")
    # fastavro writes -128 in two bytes (Java's BigInteger would write one); encode follows fastavro
    assert avro_bytes(schema_json, rows[5])[:3] == b"\x04\xff\x80"


def test_non_minimal_decimals_decode_to_their_value() -> None:
    schema = parse_schema(
        _schema(("b", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 0}))
    )
    bodies = [
        b"\x02\x80",
        b"\x06\xff\xff\x80",
        b"\x00",
        b"\x24" + b"\x00" * 17 + b"\x05",
    ]  # Java's -128, padded, empty, 18 bytes
    assert decode_values(bodies, schema).field("b").to_pylist() == [
        Decimal(-128),
        Decimal(-128),
        Decimal(0),
        Decimal(5),
    ]


def test_null_in_non_nullable_field() -> None:
    inner = {"type": "record", "name": "In", "fields": [{"name": "x", "type": "int"}]}
    schema = parse_schema(_schema(("r", ["null", inner]), ("l", {"type": "array", "items": "long"})))
    table = pa.table(
        {
            "r": pa.array([{"x": 1}, {"x": None}], pa.struct([("x", pa.int32())])),
            "l": pa.array([[1], [2]], pa.list_(pa.int64())),
        }
    )
    with pytest.raises(AvroEncodeError, match=r"field r\.x: a null, but Avro int is not nullable"):
        encode_values(table, schema)
    table = pa.table(
        {"r": pa.nulls(2, pa.struct([("x", pa.int32())])), "l": pa.array([[1], [None]], pa.list_(pa.int64()))}
    )
    with pytest.raises(AvroEncodeError, match=r"field l\[\]: a null, but Avro long"):
        encode_values(table, schema)
    table = pa.table(
        {"r": pa.nulls(2, pa.struct([("x", pa.int32())])), "l": pa.array([[1], None], pa.list_(pa.int64()))}
    )
    with pytest.raises(AvroEncodeError, match="field l: a null, but Avro array of long"):
        encode_values(table, schema)


def test_enum_symbols() -> None:
    enum = {"type": "enum", "name": "Suit", "symbols": ["HEARTS", "SPADES"]}
    schema_json = _schema(("e", enum), ("o", ["null", "Suit"]))
    rows = [{"e": "SPADES", "o": None}, {"e": "HEARTS", "o": "SPADES"}]
    _roundtrip(schema_json, rows)
    schema = parse_schema(schema_json)
    dictionary = pa.table(
        {"e": pa.array(["SPADES", "HEARTS"]).dictionary_encode(), "o": pa.array([None, "SPADES"])}
    )
    assert encode_values(dictionary, schema).to_pylist() == [avro_bytes(schema_json, r) for r in rows]
    with pytest.raises(AvroEncodeError, match="field e: 'CLUBS' is not a symbol of enum Suit"):
        encode_values(pa.table({"e": ["HEARTS", "CLUBS"], "o": pa.nulls(2, pa.string())}), schema)


def test_type_mismatch_reasons() -> None:
    schema = parse_schema(
        _schema(
            ("n", "int"),
            ("s", {"type": "array", "items": "string"}),
            ("x", {"type": "fixed", "name": "X", "size": 2}),
        )
    )
    good = pa.struct(
        [
            ("n", pa.int64()),
            ("s", pa.large_list(pa.large_string())),
            ("x", pa.binary()),
            ("extra", pa.float16()),
        ]
    )
    assert unsupported_reason(schema, good) is None
    bad = pa.struct([("n", pa.string()), ("s", pa.list_(pa.string())), ("x", pa.binary(2))])
    assert unsupported_reason(schema, bad) == "field n: a column of type string can't supply Avro int"
    bad = pa.struct([("n", pa.int32()), ("s", pa.list_(pa.int32())), ("x", pa.binary(2))])
    assert unsupported_reason(schema, bad) == r"field s[]: a column of type int32 can't supply Avro string"
    bad = pa.struct([("n", pa.int32()), ("s", pa.list_(pa.string())), ("x", pa.binary(3))])
    assert (
        unsupported_reason(schema, bad)
        == "field x: a column of type fixed_size_binary[3] can't supply Avro fixed(2)"
    )
    with pytest.raises(AvroEncodeError, match="field x: a 3-byte value for fixed"):
        encode_values(pa.table({"n": [1], "s": [["a"]], "x": pa.array([b"abc"])}), schema)


def test_decode_errors_name_the_row() -> None:
    schema_json = _schema(("a", "long"), ("s", "string"))
    schema = parse_schema(schema_json)
    good = avro_bytes(schema_json, {"a": 1, "s": "xy"})
    with pytest.raises(AvroDecodeError, match="row 1: 1 bytes follow") as info:
        decode_values([good, good + b"\x00"], schema)
    assert info.value.index == 1
    with pytest.raises(AvroDecodeError, match="row 2: not Avro") as info:
        decode_values([good, good, good[:-1]], schema)
    assert info.value.index == 2


def test_widened_nested_columns() -> None:
    schema_json = _schema(
        ("l", {"type": "array", "items": "int"}), ("m", {"type": "map", "values": ["null", "float"]})
    )
    rows = [{"l": [1, -2, 2**31 - 1], "m": {"a": 0.5, "b": None}}, {"l": [], "m": {}}]
    columns = _roundtrip(schema_json, rows)
    wide = pa.table(
        {
            "l": columns.field("l").cast(pa.large_list(pa.int64())),
            "m": columns.field("m").cast(pa.map_(pa.large_string(), pa.float64())),
        }
    )
    assert encode_values(wide, parse_schema(schema_json)).to_pylist() == [
        avro_bytes(schema_json, r) for r in rows
    ]


def test_uuid_and_time_logical_types_from_other_columns() -> None:
    schema_json = _schema(
        ("u", {"type": "string", "logicalType": "uuid"}), ("t", {"type": "int", "logicalType": "time-millis"})
    )
    raw = bytes(range(16))
    table = pa.table({"u": pa.array([raw], pa.binary(16)), "t": pa.array([5_000_000], pa.time64("ns"))})
    [body] = encode_values(table, parse_schema(schema_json)).to_pylist()
    read = avro_read(
        {**schema_json, "fields": [{"name": "u", "type": "string"}, {"name": "t", "type": "int"}]}, body
    )
    assert read == {"u": "00010203-0405-0607-0809-0a0b0c0d0e0f", "t": 5}


def test_large_results_split_rather_than_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    schema_json = _schema(("s", "string"), ("n", ["null", "long"]))
    rows = [{"s": f"row {i} " + "x" * (i % 50), "n": i if i % 3 else None} for i in range(200)]
    bodies = [avro_bytes(schema_json, r) for r in rows]
    columns = decode_values(bodies, parse_schema(schema_json))
    monkeypatch.setattr(ksi.avro.pieces, "_INT32_MAX", 500)  # pretend 500 bytes is 2 GiB
    monkeypatch.setattr(protocol.varint, "INT32_MAX", 500)  # in the row writer too
    out = encode_values(columns, parse_schema(schema_json))
    assert out.type == pa.large_binary()
    assert out.to_pylist() == bodies


def test_vectorized_encode_agrees_with_fastavro_at_scale() -> None:
    rng = np.random.default_rng(7)
    n = 20_000
    schema_json = _schema(
        ("a", "long"), ("d", "double"), ("s", ["null", "string"]), ("l", {"type": "array", "items": "int"})
    )
    a = rng.integers(-(2**62), 2**62, n) >> rng.integers(0, 62, n)
    table = pa.table(
        {
            "a": a,
            "d": rng.standard_normal(n),
            "s": pa.array([None if i % 4 == 0 else "s" * (i % 200) for i in range(n)]),
            "l": pa.array([list(range(i % 150)) for i in range(n)], pa.list_(pa.int32())),
        }
    )
    out = encode_values(table, parse_schema(schema_json)).to_pylist()
    assert out == [avro_bytes(schema_json, row) for row in table.to_pylist()]
