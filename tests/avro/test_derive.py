"""avro_schema_for: a schema derived from a table's columns serves that table's rows."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg import types as it
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from ksi.avro import (
    UnsupportedSchema,
    arrow_type,
    avro_schema_for,
    decode_values,
    encode_values,
    iceberg_struct,
    parse_schema,
    unsupported_reason,
)

from . import avro_read, normalize

UTC = dt.UTC

ICEBERG = Schema(
    it.NestedField(1, "id", it.LongType(), required=True),
    it.NestedField(2, "flag", it.BooleanType(), required=False),
    it.NestedField(3, "small", it.IntegerType(), required=False),
    it.NestedField(4, "ratio", it.FloatType(), required=False),
    it.NestedField(5, "value", it.DoubleType(), required=True),
    it.NestedField(6, "price", it.DecimalType(12, 3), required=False),
    it.NestedField(7, "day", it.DateType(), required=False),
    it.NestedField(8, "clock", it.TimeType(), required=False),
    it.NestedField(9, "local", it.TimestampType(), required=False),
    it.NestedField(10, "at", it.TimestamptzType(), required=True),
    it.NestedField(11, "name", it.StringType(), required=False),
    it.NestedField(12, "key", it.UUIDType(), required=False),
    it.NestedField(13, "hash", it.FixedType(4), required=False),
    it.NestedField(14, "blob", it.BinaryType(), required=False),
    it.NestedField(
        15,
        "address",
        it.StructType(
            it.NestedField(16, "street", it.StringType(), required=True),
            it.NestedField(17, "zip", it.IntegerType(), required=False),
        ),
        required=False,
    ),
    it.NestedField(18, "tags", it.ListType(19, it.StringType(), element_required=False), required=False),
    it.NestedField(
        20, "attrs", it.MapType(21, it.StringType(), 22, it.LongType(), value_required=True), required=True
    ),
    it.NestedField(23, "ns", it.TimestamptzNanoType(), required=False),
)

ROWS: list[dict[str, Any]] = [
    {
        "id": 1,
        "flag": True,
        "small": -5,
        "ratio": 0.25,
        "value": -1e300,
        "price": Decimal("-123456789.125"),
        "day": dt.date(2024, 2, 29),
        "clock": dt.time(23, 59, 59, 999999),
        "local": dt.datetime(2001, 2, 3, 4, 5, 6, 7),
        "at": dt.datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
        "name": "ñame",
        "key": uuid.UUID("12345678-9abc-def0-1234-56789abcdef0").bytes,
        "hash": b"\x00\x01\x02\xff",
        "blob": b"",
        "address": {"street": "Main", "zip": None},
        "tags": ["a", None, ""],
        "attrs": [("x", 1), ("y", -(2**63))],
        "ns": 1_700_000_000_123_456_789,
    },
    {
        "id": 2,
        "flag": None,
        "small": None,
        "ratio": None,
        "value": float("inf"),
        "price": None,
        "day": None,
        "clock": None,
        "local": None,
        "at": dt.datetime(2030, 1, 1, tzinfo=UTC),
        "name": None,
        "key": None,
        "hash": None,
        "blob": None,
        "address": None,
        "tags": None,
        "attrs": [],
        "ns": None,
    },
]


def _table() -> pa.Table:
    arrow_schema = schema_to_pyarrow(ICEBERG, include_field_ids=False)
    rows = [
        {**row, "ns": pa.scalar(row["ns"], pa.int64()).cast(pa.timestamp("ns", tz="UTC"))} for row in ROWS
    ]
    return pa.Table.from_pylist(rows, schema=arrow_schema)


def test_derived_schema_shape() -> None:
    derived = avro_schema_for(ICEBERG.as_struct(), "Thing", "com.example")
    assert derived["name"] == "Thing" and derived["namespace"] == "com.example"
    fields = {f["name"]: f for f in derived["fields"]}
    assert fields["id"]["type"] == "long" and "default" not in fields["id"]
    assert fields["flag"] == {"name": "flag", "type": ["null", "boolean"], "default": None}
    assert fields["price"]["type"][1] == {
        "type": "bytes",
        "logicalType": "decimal",
        "precision": 12,
        "scale": 3,
    }
    assert fields["at"]["type"] == {"type": "long", "logicalType": "timestamp-micros"}
    assert fields["local"]["type"][1] == {"type": "long", "logicalType": "local-timestamp-micros"}
    assert fields["key"]["type"][1] == {"type": "string", "logicalType": "uuid"}
    assert fields["tags"]["type"][1] == {"type": "array", "items": ["null", "string"]}
    assert fields["attrs"]["type"] == {"type": "map", "values": "long"}
    parsed = parse_schema(derived)
    assert parsed.record_name == "com.example.Thing"
    # Iceberg -> Avro -> Iceberg keeps the columns but for uuid (Avro's uuid is a string column) and
    # nanosecond timestamps (a long column: Iceberg's nanosecond types need format v3)
    back = {f.name: f for f in iceberg_struct(parsed).fields}
    assert isinstance(back["key"].field_type, it.StringType) and isinstance(
        back["ns"].field_type, it.LongType
    )
    for f in ICEBERG.fields:
        if f.name not in ("ns", "key"):
            assert back[f.name].field_type == f.field_type, f.name
            assert back[f.name].required == f.required, f.name


def test_derived_schema_serves_the_table() -> None:
    table = _table()
    schema = parse_schema(avro_schema_for(ICEBERG, "Thing"))
    assert unsupported_reason(schema, table.schema) is None
    bodies = encode_values(table, schema).to_pylist()
    read = [avro_read(schema.json, body) for body in bodies]
    expected = table.drop_columns(["ns", "key"]).to_pylist()
    assert normalize([{k: v for k, v in r.items() if k not in ("ns", "key")} for r in read]) == normalize(
        expected
    )
    assert [r["key"] and str(r["key"]) for r in read] == ["12345678-9abc-def0-1234-56789abcdef0", None]
    assert b"\x4812345678-9abc-def0-1234-56789abcdef0" in bodies[0]  # the 36-character string
    assert [r["ns"] for r in read] == [1_700_000_000_123_456_789, None]
    # and decoding the bodies gives the table's values back
    decoded = decode_values(bodies, schema)
    assert decoded.type == arrow_type(schema)
    assert decoded.field("price").to_pylist() == [ROWS[0]["price"], None]


def test_arrow_struct() -> None:
    columns = pa.table(
        {
            "i8": pa.array([-1, 2], pa.int8()),
            "u32": pa.array([0, 2**32 - 1], pa.uint32()),
            "ms": pa.array([1, None], pa.timestamp("ms", tz="Europe/Paris")),
            "secs": pa.array([1, 2], pa.timestamp("s")),
            "t32": pa.array([1000, 2], pa.time32("ms")),
            "d64": pa.array([86_400_000, 0], pa.date64()),
            "cat": pa.array(["x", "y"]).dictionary_encode(),
            "ll": pa.array([[1.5], []], pa.large_list(pa.float32())),
            "fx": pa.array([b"ab", b"cd"], pa.binary(2)),
        }
    )
    derived = avro_schema_for(columns.schema, "Arrowy")
    types = {f["name"]: f["type"] for f in derived["fields"]}
    assert types["u32"] == ["null", "long"]
    assert types["ms"][1] == {"type": "long", "logicalType": "timestamp-millis"}
    assert types["secs"][1] == {"type": "long", "logicalType": "local-timestamp-millis"}
    assert types["t32"][1] == {"type": "int", "logicalType": "time-millis"}
    schema = parse_schema(derived)
    read = [avro_read(derived, b) for b in encode_values(columns, schema).to_pylist()]
    assert [r["u32"] for r in read] == [0, 2**32 - 1]
    assert [r["ms"] for r in read] == [dt.datetime(1970, 1, 1, 0, 0, 0, 1000, tzinfo=UTC), None]
    assert [r["secs"] for r in read] == [dt.datetime(1970, 1, 1, 0, 0, 1), dt.datetime(1970, 1, 1, 0, 0, 2)]
    assert [r["d64"] for r in read] == [dt.date(1970, 1, 2), dt.date(1970, 1, 1)]
    assert [r["cat"] for r in read] == ["x", "y"]
    assert [r["ll"] for r in read] == [[1.5], []]
    assert [r["t32"] for r in read] == [dt.time(0, 0, 1), dt.time(0, 0, 0, 2000)]


def test_unique_names_for_nested_types() -> None:
    columns = pa.struct(
        [
            pa.field("a", pa.struct([pa.field("x", pa.binary(3))])),
            pa.field("a-b", pa.struct([pa.field("x", pa.binary(3))])),
            pa.field("a_b", pa.struct([pa.field("x", pa.binary(3))])),
        ]
    )
    schema = parse_schema(avro_schema_for(columns, "Top"))  # fastavro rejects redefined names
    assert [f.name for f in arrow_type(schema)] == ["a", "a-b", "a_b"]


def test_unsupported_columns() -> None:
    with pytest.raises(UnsupportedSchema, match="field m: Avro maps need string keys"):
        avro_schema_for(pa.struct([pa.field("m", pa.map_(pa.int32(), pa.int32()))]), "T")
    with pytest.raises(UnsupportedSchema, match=r"field s\.u: Arrow type uint64"):
        avro_schema_for(pa.struct([pa.field("s", pa.struct([pa.field("u", pa.uint64())]))]), "T")
    iceberg_map = it.StructType(it.NestedField(1, "m", it.MapType(2, it.IntegerType(), 3, it.IntegerType())))
    with pytest.raises(UnsupportedSchema, match="field m: Avro maps need string keys"):
        avro_schema_for(iceberg_map, "T")
