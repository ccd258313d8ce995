"""Avro -> Arrow / Iceberg types, and the schemas typed columns can't hold."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyiceberg import types as it

from ksi.avro import (
    AvroSchema,
    UnsupportedSchema,
    arrow_type,
    decode_values,
    encode_values,
    iceberg_struct,
    parse_schema,
    unsupported_reason,
)


def _record(*fields: tuple[str, object], name: str = "R") -> dict[str, object]:
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}


ALL = _record(
    ("b", "boolean"),
    ("i", "int"),
    ("l", "long"),
    ("f", "float"),
    ("d", "double"),
    ("y", "bytes"),
    ("s", "string"),
    ("x", {"type": "fixed", "name": "F", "size": 4}),
    ("e", {"type": "enum", "name": "E", "symbols": ["A", "B"]}),
    ("a", {"type": "array", "items": ["null", "long"]}),
    ("m", {"type": "map", "values": "F"}),  # a reference to the named fixed
    ("r", ["null", _record(("inner", "int"), name="Inner")]),
    ("t", ["string", "null"]),
    ("date", {"type": "int", "logicalType": "date"}),
    ("tm", {"type": "int", "logicalType": "time-millis"}),
    ("tu", {"type": "long", "logicalType": "time-micros"}),
    ("tsm", {"type": "long", "logicalType": "timestamp-millis"}),
    ("tsu", {"type": "long", "logicalType": "timestamp-micros"}),
    ("ltm", {"type": "long", "logicalType": "local-timestamp-millis"}),
    ("ltu", {"type": "long", "logicalType": "local-timestamp-micros"}),
    ("dec", {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}),
    (
        "fdec",
        {"type": "fixed", "name": "FD", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 0},
    ),
    ("u", {"type": "string", "logicalType": "uuid"}),
    ("odd", {"type": "long", "logicalType": "not-a-real-type"}),
)


def test_arrow_types() -> None:
    t = arrow_type(parse_schema(ALL))
    expected = {
        "b": pa.bool_(),
        "i": pa.int32(),
        "l": pa.int64(),
        "f": pa.float32(),
        "d": pa.float64(),
        "y": pa.binary(),
        "s": pa.string(),
        "x": pa.binary(4),
        "e": pa.string(),
        "a": pa.list_(pa.field("element", pa.int64(), nullable=True)),
        "m": pa.map_(
            pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary(4), nullable=False)
        ),
        "r": pa.struct([pa.field("inner", pa.int32(), nullable=False)]),
        "t": pa.string(),
        "date": pa.date32(),
        "tm": pa.time64("us"),
        "tu": pa.time64("us"),
        "tsm": pa.timestamp("us", tz="UTC"),
        "tsu": pa.timestamp("us", tz="UTC"),
        "ltm": pa.timestamp("us"),
        "ltu": pa.timestamp("us"),
        "dec": pa.decimal128(9, 2),
        "fdec": pa.decimal128(18, 0),
        "u": pa.string(),
        "odd": pa.int64(),
    }
    assert {f.name: f.type for f in t} == expected
    assert {f.name for f in t if f.nullable} == {"r", "t"}


def test_iceberg_types() -> None:
    s = iceberg_struct(parse_schema(ALL))
    by_name = {f.name: f for f in s.fields}
    assert isinstance(by_name["tsm"].field_type, it.TimestamptzType)
    assert isinstance(by_name["ltu"].field_type, it.TimestampType)
    assert isinstance(by_name["tm"].field_type, it.TimeType)
    assert by_name["dec"].field_type == it.DecimalType(9, 2)
    assert by_name["x"].field_type == it.FixedType(4)
    assert isinstance(by_name["e"].field_type, it.StringType)
    assert not by_name["r"].required and not by_name["t"].required and by_name["b"].required
    a = by_name["a"].field_type
    assert isinstance(a, it.ListType) and not a.element_required and isinstance(a.element_type, it.LongType)
    m = by_name["m"].field_type
    assert isinstance(m, it.MapType) and m.value_required and m.value_type == it.FixedType(4)
    ids = [f.field_id for f in s.fields]
    assert len(set(ids)) == len(ids)


def test_parse_forms_and_identity() -> None:
    text = json.dumps(ALL)
    a, b = parse_schema(text), parse_schema(ALL)
    assert a == b and hash(a) == hash(b)
    assert a.record_name == "R" and a.field_names[:3] == ("b", "i", "l")
    assert isinstance(a.json, dict) and a.json["name"] == "R"
    assert parse_schema(a) is a
    spaced = parse_schema(json.dumps(ALL, indent=4))
    assert spaced == a
    assert parse_schema('"string"').record_name is None
    namespaced = parse_schema({**_record(("a", "int")), "namespace": "com.example"})
    assert namespaced.record_name == "com.example.R"


@pytest.mark.parametrize(
    ("field_type", "message"),
    [
        (["null", "int", "string"], "field v: union with 2 non-null branches"),
        (["int", "string"], "field v: union with 2 non-null branches"),
        ("null", "field v: a null-only type"),
        (["null"], "field v: a null-only union"),
        ({"type": "array", "items": ["long", "double"]}, r"field v\[\]: union with 2 non-null branches"),
        ({"type": "map", "values": ["null", "long", "double"]}, r"field v\{\}: union with 2"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 0}, "precision 40 exceeds 38"),
        (_record(name="Empty"), "field v: an empty record"),
        (["long"], "field v: a union of 1 branches"),
    ],
)
def test_unsupported_schemas(field_type: object, message: str) -> None:
    schema = parse_schema(_record(("ok", "int"), ("v", field_type)))
    with pytest.raises(UnsupportedSchema, match=message):
        arrow_type(schema)
    with pytest.raises(UnsupportedSchema, match=message):
        iceberg_struct(schema)
    with pytest.raises(UnsupportedSchema, match=message):
        decode_values([], schema)
    with pytest.raises(UnsupportedSchema, match=message):
        encode_values(pa.table({"ok": pa.array([], pa.int32())}), schema)
    reason = unsupported_reason(schema, pa.struct([pa.field("ok", pa.int32()), pa.field("v", pa.int64())]))
    assert reason is not None and "field v" in reason


def test_recursive_record_is_unsupported() -> None:
    schema = parse_schema(
        {
            "type": "record",
            "name": "Node",
            "fields": [{"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"]}],
        }
    )
    with pytest.raises(UnsupportedSchema, match="field next: recursive type Node"):
        arrow_type(schema)


def test_top_level_must_be_a_record() -> None:
    for schema in ('"string"', {"type": "array", "items": "int"}, ["null", "string"]):
        with pytest.raises(UnsupportedSchema, match="not a record"):
            arrow_type(parse_schema(schema))  # type: ignore[arg-type]


def test_invalid_avro_is_reported() -> None:
    with pytest.raises(UnsupportedSchema, match="invalid Avro schema"):
        parse_schema(
            {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", "default": "x"}]}
        )
    with pytest.raises(UnsupportedSchema, match="invalid Avro schema"):
        parse_schema(_record(("a", "NoSuchType")))


def test_schema_value_is_frozen() -> None:
    schema = parse_schema(ALL)
    assert isinstance(schema, AvroSchema)
    with pytest.raises(AttributeError):
        schema.canonical = "x"  # type: ignore[misc]
