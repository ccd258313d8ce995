"""Schema evolution: rows written with an old schema, read back from the wider columns of a newer one."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from ksi.avro import (
    AvroEncodeError,
    decode_values,
    encode_values,
    parse_schema,
    unsupported_reason,
)

from . import avro_bytes, avro_read

V1 = {
    "type": "record",
    "name": "Reading",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "score", "type": "float"},
        {"name": "name", "type": "string"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "gone", "type": ["null", "string"], "default": None},  # dropped in v2
    ],
}
V2 = {
    "type": "record",
    "name": "Reading",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "score", "type": "double"},
        {"name": "name", "type": "string"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "level", "type": "int", "default": 3},
    ],
}
ROWS_V1 = [
    {"id": 0, "score": 0.0, "name": "", "at": 0, "gone": None},
    {"id": -(2**31), "score": 1.1, "name": "é", "at": 1_700_000_000_123, "gone": "x"},
    {"id": 2**31 - 1, "score": float("nan"), "name": "z" * 40, "at": -1, "gone": None},
    {"id": 7, "score": float("-inf"), "name": "üñí", "at": -62_135_596_800_000, "gone": None},
]


def _wide_table(v1_bodies: list[bytes]) -> pa.Table:
    """The table as a v2-era reader sees it: v1's columns widened, v2's extra columns, v1's ``gone`` kept."""
    narrow = decode_values(v1_bodies, parse_schema(V1))
    n = len(narrow)
    return pa.table(
        {
            "id": narrow.field("id").cast(pa.int64()),
            "score": narrow.field("score").cast(pa.float64()),
            "name": narrow.field("name").cast(pa.large_string()),
            "at": narrow.field("at"),  # already microseconds
            "gone": narrow.field("gone"),
            "note": pa.array(["extra"] * n, pa.string()),
            "level": pa.array(np.arange(n), pa.int32()),
        }
    )


def test_v1_rows_from_v2_columns_are_the_v1_bytes() -> None:
    bodies = [avro_bytes(V1, row) for row in ROWS_V1]
    table = _wide_table(bodies)
    v1 = parse_schema(V1)
    assert unsupported_reason(v1, table.schema) is None
    assert encode_values(table, v1).to_pylist() == bodies


def test_v2_rows_encode_from_the_same_table() -> None:
    bodies = [avro_bytes(V1, row) for row in ROWS_V1]
    table = _wide_table(bodies)
    out = encode_values(table, parse_schema(V2)).to_pylist()
    read = [avro_read(V2, body) for body in out]
    assert [r["id"] for r in read] == [row["id"] for row in ROWS_V1]
    assert [r["note"] for r in read] == ["extra"] * len(ROWS_V1)
    assert read[1]["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.UTC)


def test_missing_columns_take_defaults() -> None:
    """A table without v2's new columns serves v2 with their defaults (v1 rows read as v2)."""
    bodies = [avro_bytes(V1, row) for row in ROWS_V1]
    table = _wide_table(bodies).drop_columns(["note", "level"])
    out = encode_values(table, parse_schema(V2)).to_pylist()
    read = [avro_read(V2, body) for body in out]
    assert [r["note"] for r in read] == [None] * len(ROWS_V1)
    assert [r["level"] for r in read] == [3] * len(ROWS_V1)


def test_defaults_of_every_kind() -> None:
    schema = {
        "type": "record",
        "name": "D",
        "fields": [
            {"name": "k", "type": "long"},
            {"name": "b", "type": "boolean", "default": True},
            {"name": "f", "type": "float", "default": 1.5},
            {"name": "d", "type": "double", "default": "NaN"},
            {"name": "s", "type": "string", "default": "héllo"},
            {"name": "y", "type": "bytes", "default": "\u00ff\u0000"},
            {"name": "x", "type": {"type": "fixed", "name": "F2", "size": 2}, "default": "ab"},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["P", "Q"]}, "default": "Q"},
            {"name": "a", "type": {"type": "array", "items": "int"}, "default": [1, 2]},
            {"name": "m", "type": {"type": "map", "values": "string"}, "default": {"k": "v"}},
            {"name": "u", "type": ["string", "null"], "default": "first"},
            {
                "name": "r",
                "type": {
                    "type": "record",
                    "name": "In",
                    "fields": [{"name": "z", "type": "int", "default": 9}],
                },
                "default": {},
            },
        ],
    }
    out = encode_values(pa.table({"k": pa.array([5], pa.int64())}), parse_schema(schema)).to_pylist()
    datum = {
        "k": 5, "b": True, "f": 1.5, "d": float("nan"), "s": "héllo", "y": b"\xff\x00", "x": b"ab", "e": "Q",
        "a": [1, 2], "m": {"k": "v"}, "u": "first", "r": {"z": 9},
    }  # fmt: skip
    assert out == [avro_bytes(schema, datum)]


def test_missing_column_without_default_is_an_error() -> None:
    table = pa.table({"id": pa.array([1], pa.int64())})
    with pytest.raises(AvroEncodeError, match="field score: no column"):
        encode_values(table, parse_schema(V1))
    reason = unsupported_reason(parse_schema(V1), table.schema)
    assert reason is not None and "score" in reason


def test_narrowing_that_loses_information_is_an_error() -> None:
    v1 = parse_schema(V1)
    base = {
        "id": pa.array([1], pa.int64()),
        "score": pa.array([0.5], pa.float64()),
        "name": ["a"],
        "at": pa.array([1000], pa.timestamp("us", tz="UTC")),
    }
    assert encode_values(pa.table(base), v1).to_pylist() == [
        avro_bytes(V1, {**ROWS_V1[0], "id": 1, "score": 0.5, "name": "a", "at": 1})
    ]
    with pytest.raises(AvroEncodeError, match="field id: 2147483648 passes the range"):
        encode_values(pa.table({**base, "id": pa.array([2**31], pa.int64())}), v1)
    with pytest.raises(AvroEncodeError, match=r"field score: 0\.1 is not exactly a float"):
        encode_values(pa.table({**base, "score": pa.array([0.1], pa.float64())}), v1)
    with pytest.raises(AvroEncodeError, match=r"field at: 1001 .* finer"):
        encode_values(pa.table({**base, "at": pa.array([1001], pa.timestamp("us", tz="UTC"))}), v1)


def test_widened_decimal_precision() -> None:
    """Iceberg widens decimal precision (same scale); the body depends on the value only."""
    schema_json = {
        "type": "record",
        "name": "Money",
        "fields": [
            {"name": "b", "type": {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2}},
            {
                "name": "f",
                "type": {
                    "type": "fixed",
                    "name": "F3",
                    "size": 3,
                    "logicalType": "decimal",
                    "precision": 5,
                    "scale": 2,
                },
            },
        ],
    }
    rows = [{"b": Decimal(v), "f": Decimal(v)} for v in ("-999.99", "-1.28", "0.00", "1.27", "999.99")]
    bodies = [avro_bytes(schema_json, row) for row in rows]
    narrow = decode_values(bodies, parse_schema(schema_json))
    wide = pa.table(
        {"b": narrow.field("b").cast(pa.decimal128(30, 2)), "f": narrow.field("f").cast(pa.decimal128(38, 2))}
    )
    assert encode_values(wide, parse_schema(schema_json)).to_pylist() == bodies
    with pytest.raises(AvroEncodeError, match=r"field f: .* doesn't fit fixed"):
        encode_values(
            pa.table({"b": wide["b"], "f": pa.array([Decimal("99999999.99")] * 5, pa.decimal128(38, 2))}),
            parse_schema(schema_json),
        )
