"""Avro schemas parsed into a small typed tree, and the Arrow / Iceberg columns that tree maps to.

An archived topic keeps each Avro value as typed table columns (one top-level column per field of the
value's record schema), so the decoder, the encoder and the table's schema must all agree on one
mapping from Avro types to columns.  This module is that mapping.  fastavro parses and validates the
schema (names, defaults, logical-type parameters); the result is walked once into frozen nodes that
keep only what the columns and the binary encoding depend on:

    boolean int long float double bytes string   -> :class:`Primitive` (with a known logical type or None)
    decimal on bytes or fixed                     -> :class:`Decimal`
    fixed / enum / record / array / map           -> :class:`Fixed` / :class:`Enum` / :class:`Record` ...
    ["null", T] or [T, "null"]                    -> :class:`Nullable` (remembering where null sits)

Anything typed columns cannot hold (a bare ``null``, a union of two non-null branches, a recursive
record, a decimal wider than 38 digits) becomes an :class:`Unsupported` node rather than an error, so a
schema can always be parsed; :func:`arrow_type`, :func:`iceberg_struct`, the decoder and the encoder
raise :class:`UnsupportedSchema` when they meet one, naming the field path.

Arrow types use the small string/binary/list layouts; the encoder accepts the large ones (and pyiceberg's
Arrow reads) too.  Iceberg field ids here are placeholders (1, 2, ...): callers merge the struct into a
table with ``UpdateSchema.union_by_name``, which assigns real ids.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import pyarrow as pa
from fastavro import parse_schema as _fastavro_parse
from pyiceberg import types as it

__all__ = [
    "NO_DEFAULT",
    "Array",
    "AvroDecodeError",
    "AvroEncodeError",
    "AvroSchema",
    "Decimal",
    "Enum",
    "Fixed",
    "Map",
    "Node",
    "Nullable",
    "Primitive",
    "Record",
    "RecordField",
    "Unsupported",
    "UnsupportedSchema",
    "arrow_type",
    "iceberg_struct",
    "node_arrow_type",
    "parse_schema",
    "require_supported",
]


class UnsupportedSchema(ValueError):
    """A schema that can't be represented as typed columns (or isn't valid Avro); names the field and why."""


class AvroEncodeError(ValueError):
    """Table columns can't supply what an Avro schema needs; names the field."""


class AvroDecodeError(ValueError):
    """An Avro body does not decode with its writer schema (``index`` is the row, when known)."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class _NoDefault:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()

# Logical types with their own columns, by the Avro type they annotate.  The *-nanos timestamps (Avro
# 1.12) keep the plain long column (Iceberg's nanosecond types need format v3) but the encoder accepts
# timestamp columns for them.
_LOGICAL: Mapping[str, frozenset[str]] = {
    "int": frozenset({"date", "time-millis"}),
    "long": frozenset(
        {
            "time-micros",
            "timestamp-millis",
            "timestamp-micros",
            "timestamp-nanos",
            "local-timestamp-millis",
            "local-timestamp-micros",
            "local-timestamp-nanos",
        }
    ),
    "string": frozenset({"uuid"}),
}
_PRIMITIVES = frozenset({"boolean", "int", "long", "float", "double", "bytes", "string"})
MAX_DECIMAL_PRECISION = 38


# -- the tree ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Primitive:
    type: str  # boolean int long float double bytes string
    logical: str | None = None  # a logical type of _LOGICAL, else None


@dataclass(frozen=True, slots=True)
class Decimal:
    precision: int
    scale: int
    size: int | None  # None: on bytes (minimal two's complement); else fixed(size)
    name: str | None = None  # the fixed type's full name


@dataclass(frozen=True, slots=True)
class Fixed:
    name: str
    size: int


@dataclass(frozen=True, slots=True)
class Enum:
    name: str
    symbols: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RecordField:
    name: str
    type: Node
    default: Any = NO_DEFAULT  # the JSON default, NO_DEFAULT when the field has none


@dataclass(frozen=True, slots=True)
class Record:
    name: str
    fields: tuple[RecordField, ...]


@dataclass(frozen=True, slots=True)
class Array:
    items: Node


@dataclass(frozen=True, slots=True)
class Map:
    values: Node


@dataclass(frozen=True, slots=True)
class Nullable:
    value: Node
    null_index: int  # 0 for ["null", T], 1 for [T, "null"]

    @property
    def value_index(self) -> int:
        return 1 - self.null_index


@dataclass(frozen=True, slots=True)
class Unsupported:
    reason: str  # names the field path


Node: TypeAlias = "Primitive | Decimal | Fixed | Enum | Record | Array | Map | Nullable | Unsupported"


@dataclass(frozen=True, slots=True)
class AvroSchema:
    """A parsed Avro schema.  Equal (and hashed) by its canonical JSON text.

    ``json`` is fastavro's parsed form (full names, no namespaces, later uses of a named type written as
    its name); ``root`` is the typed tree the columns follow; ``parsed`` is what fastavro reads with.
    """

    canonical: str
    json: Any = field(compare=False, repr=False)
    root: Node = field(compare=False, repr=False)
    parsed: Any = field(compare=False, repr=False)

    @property
    def record_name(self) -> str | None:
        """The top-level record's full name, None when the schema is not a record."""
        return self.root.name if isinstance(self.root, Record) else None

    @property
    def field_names(self) -> tuple[str, ...]:
        """The top-level record's field names (empty when the schema is not a record)."""
        return tuple(f.name for f in self.root.fields) if isinstance(self.root, Record) else ()


# -- parsing -------------------------------------------------------------------------------------


def _clean(value: Any) -> Any:
    """fastavro's parsed schema without its private ``__fastavro_*`` / ``__named_schemas`` keys."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if not k.startswith("__")}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def parse_schema(schema: str | Mapping[str, Any] | list[Any] | AvroSchema) -> AvroSchema:
    """Parse an Avro schema given as JSON text or as its decoded JSON value.

    Invalid Avro raises :class:`UnsupportedSchema`; valid Avro that typed columns can't hold parses
    (its :class:`Unsupported` nodes make :func:`arrow_type` and the codecs raise).
    """
    if isinstance(schema, AvroSchema):
        return schema
    if isinstance(schema, str):
        try:
            value: Any = json.loads(schema)
        except ValueError:
            value = schema  # a bare name such as ``string`` (JSON would be ``"string"``)
    else:
        value = schema
    try:
        parsed = _fastavro_parse(value)
    except Exception as e:  # fastavro raises SchemaParseException, UnknownType, ValueError, KeyError ...
        raise UnsupportedSchema(f"invalid Avro schema: {e}") from e
    clean = _clean(parsed)
    root = _Walker().node(clean, "")
    text = json.dumps(clean, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return AvroSchema(text, clean, root, parsed)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Walker:
    """Builds nodes from fastavro's parsed JSON, resolving named-type references."""

    def __init__(self) -> None:
        self.named: dict[str, Node] = {}
        self.building: set[str] = set()

    def node(self, s: Any, path: str) -> Node:
        where = f"field {path}" if path else "the top level"
        if isinstance(s, str):
            if s == "null":
                return Unsupported(f"{where}: a null-only type can't be a column")
            if s in _PRIMITIVES:
                return Primitive(s)
            if s in self.building:
                return Unsupported(f"{where}: recursive type {s} can't be a column")
            if s in self.named:
                return self.named[s]
            return Unsupported(f"{where}: unknown type {s}")  # fastavro resolves these; defensive
        if isinstance(s, list):
            return self.union(s, path)
        t = s["type"]
        if isinstance(t, (dict, list)):  # {"type": {...}} wrapping
            return self.node(t, path)
        logical = s.get("logicalType")
        if t in _PRIMITIVES:
            if t == "bytes" and logical == "decimal":
                return self.decimal(s, None, None, where)
            return Primitive(t, logical if logical in _LOGICAL.get(t, ()) else None)
        if t == "null":
            return Unsupported(f"{where}: a null-only type can't be a column")
        if t == "fixed":
            name, size = s["name"], int(s["size"])
            node: Node = self.decimal(s, size, name, where) if logical == "decimal" else Fixed(name, size)
            self.named[name] = node
            return node
        if t == "enum":
            enum = Enum(s["name"], tuple(s["symbols"]))
            self.named[enum.name] = enum
            return enum
        if t == "array":
            return Array(self.node(s["items"], f"{path}[]"))
        if t == "map":
            return Map(self.node(s["values"], f"{path}{{}}"))
        if t in ("record", "error"):
            name = s["name"]
            self.building.add(name)
            fields = tuple(
                RecordField(
                    f["name"],
                    self.node(f["type"], _join(path, f["name"])),
                    f.get("default", NO_DEFAULT),
                )
                for f in s["fields"]
            )
            self.building.discard(name)
            if not fields and path:  # Parquet has no empty groups
                empty = Unsupported(f"{where}: an empty record can't be a nested column")
                self.named[name] = empty
                return empty
            record = Record(name, fields)
            self.named[name] = record
            return record
        if isinstance(t, str):  # {"type": "some.Named"}
            return self.node(t, path)
        return Unsupported(f"{where}: unknown type {t!r}")

    def decimal(self, s: Mapping[str, Any], size: int | None, name: str | None, where: str) -> Node:
        precision, scale = int(s["precision"]), int(s.get("scale", 0))
        if precision > MAX_DECIMAL_PRECISION:
            return Unsupported(
                f"{where}: decimal precision {precision} exceeds {MAX_DECIMAL_PRECISION} digits"
            )
        return Decimal(precision, scale, size, name)

    def union(self, branches: list[Any], path: str) -> Node:
        where = f"field {path}" if path else "the top level"
        nulls = [
            i
            for i, b in enumerate(branches)
            if b == "null" or (isinstance(b, dict) and b.get("type") == "null")
        ]
        others = [i for i in range(len(branches)) if i not in nulls]
        if not others:
            return Unsupported(f"{where}: a null-only union can't be a column")
        if len(others) > 1:
            return Unsupported(
                f"{where}: union with {len(others)} non-null branches can't be a typed column"
                " (only [null, T] or [T, null] can)"
            )
        value = self.node(branches[others[0]], path)
        if len(branches) != 2:  # [T] alone writes a branch index before T: rare enough to refuse
            return Unsupported(f"{where}: a union of {len(branches)} branches can't be a typed column")
        return Nullable(value, nulls[0])


def iter_unsupported(node: Node) -> Iterator[Unsupported]:
    """Every :class:`Unsupported` node under ``node``."""
    if isinstance(node, Unsupported):
        yield node
    elif isinstance(node, Record):
        for f in node.fields:
            yield from iter_unsupported(f.type)
    elif isinstance(node, Array):
        yield from iter_unsupported(node.items)
    elif isinstance(node, Map):
        yield from iter_unsupported(node.values)
    elif isinstance(node, Nullable):
        yield from iter_unsupported(node.value)


def require_supported(schema: AvroSchema) -> Record:
    """The schema's top-level record, or :class:`UnsupportedSchema` saying what can't be a column."""
    root = schema.root
    if not isinstance(root, Record):
        kind = root.reason if isinstance(root, Unsupported) else f"a {type(root).__name__.lower()}"
        raise UnsupportedSchema(f"the schema is {kind}, not a record; typed columns need a record schema")
    for bad in iter_unsupported(root):
        raise UnsupportedSchema(bad.reason)
    return root


# -- Arrow -----------------------------------------------------------------------------------------

_ARROW_PRIMITIVE: Mapping[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
_ARROW_LOGICAL: Mapping[str, pa.DataType] = {
    "date": pa.date32(),
    "time-millis": pa.time64("us"),
    "time-micros": pa.time64("us"),
    "timestamp-millis": pa.timestamp("us", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("us"),
    "local-timestamp-micros": pa.timestamp("us"),
    "uuid": pa.string(),
}


def node_arrow_type(node: Node) -> pa.DataType:
    """The Arrow type of one node's column (nullability lives on the enclosing field)."""
    if isinstance(node, Nullable):
        return node_arrow_type(node.value)
    if isinstance(node, Primitive):
        if node.logical is not None and node.logical in _ARROW_LOGICAL:
            return _ARROW_LOGICAL[node.logical]
        return _ARROW_PRIMITIVE[node.type]
    if isinstance(node, Decimal):
        return pa.decimal128(node.precision, node.scale)
    if isinstance(node, Fixed):
        return pa.binary(node.size)
    if isinstance(node, Enum):
        return pa.string()
    if isinstance(node, Record):
        return pa.struct([_arrow_field(f.name, f.type) for f in node.fields])
    if isinstance(node, Array):
        return pa.list_(_arrow_field("element", node.items))
    if isinstance(node, Map):
        return pa.map_(pa.field("key", pa.string(), nullable=False), _arrow_field("value", node.values))
    raise UnsupportedSchema(node.reason)


def _arrow_field(name: str, node: Node) -> pa.Field:
    return pa.field(name, node_arrow_type(node), nullable=isinstance(node, Nullable))


def arrow_type(schema: AvroSchema) -> pa.StructType:
    """The typed columns of a top-level record schema: one field per Avro field, nullable iff [null, T]."""
    struct: pa.StructType = node_arrow_type(require_supported(schema))
    return struct


# -- Iceberg ---------------------------------------------------------------------------------------

_ICEBERG_PRIMITIVE: Mapping[str, it.IcebergType] = {
    "boolean": it.BooleanType(),
    "int": it.IntegerType(),
    "long": it.LongType(),
    "float": it.FloatType(),
    "double": it.DoubleType(),
    "bytes": it.BinaryType(),
    "string": it.StringType(),
}
_ICEBERG_LOGICAL: Mapping[str, it.IcebergType] = {
    "date": it.DateType(),
    "time-millis": it.TimeType(),
    "time-micros": it.TimeType(),
    "timestamp-millis": it.TimestamptzType(),
    "timestamp-micros": it.TimestamptzType(),
    "local-timestamp-millis": it.TimestampType(),
    "local-timestamp-micros": it.TimestampType(),
    "uuid": it.StringType(),
}


def _iceberg(node: Node, ids: Iterator[int]) -> it.IcebergType:
    if isinstance(node, Nullable):
        return _iceberg(node.value, ids)
    if isinstance(node, Primitive):
        if node.logical is not None and node.logical in _ICEBERG_LOGICAL:
            return _ICEBERG_LOGICAL[node.logical]
        return _ICEBERG_PRIMITIVE[node.type]
    if isinstance(node, Decimal):
        return it.DecimalType(node.precision, node.scale)
    if isinstance(node, Fixed):
        return it.FixedType(node.size)
    if isinstance(node, Enum):
        return it.StringType()
    if isinstance(node, Record):
        return _iceberg_struct(node, ids)
    if isinstance(node, Array):
        element_id = next(ids)
        return it.ListType(
            element_id, _iceberg(node.items, ids), element_required=not isinstance(node.items, Nullable)
        )
    if isinstance(node, Map):
        key_id, value_id = next(ids), next(ids)
        return it.MapType(
            key_id,
            it.StringType(),
            value_id,
            _iceberg(node.values, ids),
            value_required=not isinstance(node.values, Nullable),
        )
    raise UnsupportedSchema(node.reason)


def _iceberg_struct(record: Record, ids: Iterator[int]) -> it.StructType:
    fields = []
    for f in record.fields:
        field_id = next(ids)
        fields.append(
            it.NestedField(field_id, f.name, _iceberg(f.type, ids), required=not isinstance(f.type, Nullable))
        )
    return it.StructType(*fields)


def iceberg_struct(schema: AvroSchema) -> it.StructType:
    """:func:`arrow_type` as Iceberg types, with placeholder field ids; optional iff [null, T]."""
    return _iceberg_struct(require_supported(schema), itertools.count(1))
