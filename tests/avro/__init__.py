"""Shared helpers for ksi.avro's tests: fastavro as the reference writer/reader, and hypothesis strategies
for random Avro record schemas with data that conforms to them."""

from __future__ import annotations

import io
import struct
import uuid
from decimal import Decimal
from typing import Any

from fastavro import parse_schema as fastavro_parse_schema
from fastavro import schemaless_reader, schemaless_writer
from hypothesis import strategies as st

# -- fastavro, the reference -----------------------------------------------------------------------


def avro_bytes(schema: Any, datum: Any) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, fastavro_parse_schema(schema), datum)
    return out.getvalue()


def avro_read(schema: Any, body: bytes) -> Any:
    return schemaless_reader(io.BytesIO(body), fastavro_parse_schema(schema), None)


def normalize(value: Any) -> Any:
    """A value in one comparable form, whether fastavro read it or Arrow's to_pylist made it: maps
    as dicts, UUIDs as strings, floats by their bits (NaN == NaN), tuples of a map's entries as dicts."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()} or []
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) for v in value):
            return {k: normalize(v) for k, v in value}
        return [normalize(v) for v in value]
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


# -- random schemas --------------------------------------------------------------------------------

PRIMITIVES = ["boolean", "int", "long", "float", "double", "bytes", "string"]
LOGICAL = [
    {"type": "int", "logicalType": "date"},
    {"type": "int", "logicalType": "time-millis"},
    {"type": "long", "logicalType": "time-micros"},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-millis"},
    {"type": "long", "logicalType": "local-timestamp-micros"},
    {"type": "string", "logicalType": "uuid"},
    {"type": "long", "logicalType": "some-custom-type"},  # unknown: the plain long
]
SYMBOLS = ["A", "B", "C_2", "d"]


def _fixed_size_for(precision: int) -> int:
    """The fewest bytes whose two's complement holds every ``precision``-digit number."""
    size = 1
    while (1 << (8 * size - 1)) <= 10**precision - 1:
        size += 1
    return size


@st.composite
def decimals(draw: st.DrawFn) -> dict[str, Any]:
    precision = draw(st.integers(1, 38))
    scale = draw(st.integers(0, precision))
    if draw(st.booleans()):
        return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}
    size = _fixed_size_for(precision) + draw(st.integers(0, 2))
    return {
        "type": "fixed",
        "name": "?",
        "size": size,
        "logicalType": "decimal",
        "precision": precision,
        "scale": scale,
    }


LEAVES = st.one_of(
    st.sampled_from(PRIMITIVES),
    st.sampled_from(LOGICAL),
    decimals(),
    st.integers(1, 20).map(lambda n: {"type": "fixed", "name": "?", "size": n}),
    st.lists(st.sampled_from(SYMBOLS), min_size=1, max_size=4, unique=True).map(
        lambda s: {"type": "enum", "name": "?", "symbols": s}
    ),
)


def _nullable(t: Any, null_first: bool) -> Any:
    return ["null", t] if null_first else [t, "null"]


def _records(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(children, min_size=1, max_size=4).map(
        lambda ts: {
            "type": "record",
            "name": "?",
            "fields": [{"name": f"f{i}", "type": t} for i, t in enumerate(ts)],
        }
    )


def _non_union(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return children.filter(lambda t: not isinstance(t, list))


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        children.map(lambda t: {"type": "array", "items": t}),
        children.map(lambda t: {"type": "map", "values": t}),
        _records(children),
        st.builds(_nullable, _non_union(children), st.booleans()),
    )


TYPES = st.recursive(LEAVES, _extend, max_leaves=10)


def _name(schema: Any, counter: list[int]) -> Any:
    """Named types renamed T0, T1 ... so every name is unique."""
    if isinstance(schema, list):
        return [_name(s, counter) for s in schema]
    if isinstance(schema, dict):
        out = {k: _name(v, counter) for k, v in schema.items()}
        if out.get("name") == "?":
            out["name"] = f"T{counter[0]}"
            counter[0] += 1
        if out.get("type") == "record":
            out["fields"] = [{**f, "type": _name(f["type"], counter)} for f in schema["fields"]]
        return out
    return schema


record_schemas = st.lists(TYPES, min_size=1, max_size=6).map(
    lambda ts: _name(
        {
            "type": "record",
            "name": "Top",
            "namespace": "test",
            "fields": [{"name": f"c{i}", "type": t} for i, t in enumerate(ts)],
        },
        [0],
    )
)


# -- data conforming to a schema -------------------------------------------------------------------

_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)  # no lone surrogates (not UTF-8)
_DAY_RANGE = (-719_162, 2_932_896)  # 0001-01-01 .. 9999-12-31, datetime's range
_MILLIS_RANGE = (-62_135_596_800_000, 253_402_300_799_999)


def _decimal_value(unscaled: int, scale: int) -> Decimal:
    digits = tuple(int(c) for c in str(abs(unscaled)))
    return Decimal((1 if unscaled < 0 else 0, digits, -scale))


def data(schema: Any, named: dict[str, Any] | None = None) -> st.SearchStrategy[Any]:
    """Values fastavro can write with ``schema`` (logical types in fastavro's Python form)."""
    named = {} if named is None else named
    if isinstance(schema, list):
        value = next(s for s in schema if s != "null")
        return st.one_of(st.none(), data(value, named))
    if isinstance(schema, str):
        if schema in named:
            return data(named[schema], named)
        return {
            "boolean": st.booleans(),
            "int": st.integers(-(2**31), 2**31 - 1),
            "long": st.integers(-(2**63), 2**63 - 1),
            "float": st.floats(width=32),
            "double": st.floats(),
            "bytes": st.binary(max_size=12),
            "string": _TEXT,
        }[schema]
    t, logical = schema["type"], schema.get("logicalType")
    if "name" in schema:
        named[schema["name"]] = schema
    if logical == "decimal":
        bound = 10 ** schema["precision"] - 1
        scale = schema.get("scale", 0)
        return st.integers(-bound, bound).map(lambda u: _decimal_value(u, scale))
    if logical == "date":
        return st.integers(*_DAY_RANGE)
    if logical == "time-millis":
        return st.integers(0, 86_399_999)
    if logical == "time-micros":
        return st.integers(0, 86_399_999_999)
    if logical in ("timestamp-millis", "local-timestamp-millis"):
        return st.integers(*_MILLIS_RANGE)
    if logical in ("timestamp-micros", "local-timestamp-micros"):
        return st.integers(_MILLIS_RANGE[0] * 1000, _MILLIS_RANGE[1] * 1000 + 999)
    if logical == "uuid":
        return st.uuids().map(str)
    if t == "fixed":
        return st.binary(min_size=schema["size"], max_size=schema["size"])
    if t == "enum":
        return st.sampled_from(schema["symbols"])
    if t == "array":
        return st.lists(data(schema["items"], named), max_size=3)
    if t == "map":
        return st.dictionaries(_TEXT, data(schema["values"], named), max_size=3)
    if t == "record":
        return st.fixed_dictionaries({f["name"]: data(f["type"], named) for f in schema["fields"]})
    return data(t, named)
