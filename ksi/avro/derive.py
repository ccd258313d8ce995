"""An Avro record schema derived from table columns, for tables that other systems wrote.

A table written by Flink, Spark or Kafka Connect has typed columns but no Schema Registry ids, so the
proxy needs a writer schema to serve its rows as Avro.  :func:`avro_schema_for` derives one from the
Iceberg (or Arrow) columns, choosing for each column the Avro type whose column
(:func:`~ksi.avro.schema.arrow_type`) is the same type, so that the derived schema maps back onto the
table and :func:`~ksi.avro.encode.encode_values` can serve it:

    boolean int long float double string binary   -> the Avro primitive of that name (binary: bytes)
    decimal(p, s)                                    -> bytes, decimal(p, s)
    date / time / timestamp / timestamptz            -> int date / long time-micros /
                                                        long local-timestamp-micros / long timestamp-micros
    timestamp_ns / timestamptz_ns (format v3)        -> long local-timestamp-nanos / long timestamp-nanos
    uuid                                             -> string, uuid
    fixed(n)                                         -> fixed (named <record>_<field>)
    struct / list / map<string, V>                   -> record (named <record>_<field>) / array / map
    optional column (or element, or map value)       -> ["null", T], with default null for fields

Maps with non-string keys and Iceberg types Avro has no counterpart for raise UnsupportedSchema.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from pyiceberg import types as it
from pyiceberg.schema import Schema as IcebergSchema

from .schema import UnsupportedSchema

__all__ = ["avro_schema_for"]

_INVALID = re.compile(r"[^A-Za-z0-9_]")


def avro_schema_for(
    struct: it.StructType | IcebergSchema | pa.StructType | pa.Schema, name: str, namespace: str | None = None
) -> dict[str, Any]:
    """An Avro record schema (as JSON) named ``name`` whose fields are the columns of ``struct``."""
    deriver = _Deriver()
    if isinstance(struct, IcebergSchema):
        struct = struct.as_struct()
    if isinstance(struct, pa.Schema):
        struct = pa.struct(list(struct))
    if isinstance(struct, it.StructType):
        record = deriver.iceberg_record(struct, name, "")
    elif isinstance(struct, pa.StructType):
        record = deriver.arrow_record(struct, name, "")
    else:
        raise TypeError(f"expected an Iceberg or Arrow struct, got {type(struct).__name__}")
    if namespace:
        record = {
            "type": "record",
            "name": record["name"],
            "namespace": namespace,
            "fields": record["fields"],
        }
    return record


def _optional(t: Any) -> list[Any]:
    return ["null", t]


def _field(name: str, t: Any, optional: bool) -> dict[str, Any]:
    if optional:
        return {"name": name, "type": _optional(t), "default": None}
    return {"name": name, "type": t}


def _path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Deriver:
    """Keeps the names given to records and fixed types unique."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def name(self, base: str) -> str:
        base = _INVALID.sub("_", base) or "_"
        if base[0].isdigit():
            base = f"_{base}"
        candidate, number = base, 1
        while candidate in self.names:
            number += 1
            candidate = f"{base}{number}"
        self.names.add(candidate)
        return candidate

    # -- Iceberg --

    def iceberg_record(self, struct: it.StructType, name: str, path: str) -> dict[str, Any]:
        record_name = self.name(name)
        fields = [
            _field(
                f.name,
                self.iceberg(f.field_type, f"{record_name}_{f.name}", _path(path, f.name)),
                not f.required,
            )
            for f in struct.fields
        ]
        return {"type": "record", "name": record_name, "fields": fields}

    def iceberg(self, t: it.IcebergType, name: str, path: str) -> Any:
        simple = _ICEBERG_SIMPLE.get(type(t))
        if simple is not None:
            return dict(simple) if isinstance(simple, dict) else simple
        if isinstance(t, it.DecimalType):
            return {"type": "bytes", "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
        if isinstance(t, it.FixedType):
            return {"type": "fixed", "name": self.name(name), "size": len(t)}
        if isinstance(t, it.StructType):
            return self.iceberg_record(t, name, path)
        if isinstance(t, it.ListType):
            items = self.iceberg(t.element_type, name, f"{path}[]")
            return {"type": "array", "items": items if t.element_required else _optional(items)}
        if isinstance(t, it.MapType):
            if not isinstance(t.key_type, it.StringType):
                raise UnsupportedSchema(f"field {path}: Avro maps need string keys, not {t.key_type}")
            values = self.iceberg(t.value_type, name, f"{path}{{}}")
            return {"type": "map", "values": values if t.value_required else _optional(values)}
        raise UnsupportedSchema(f"field {path}: Iceberg type {t} has no Avro counterpart")

    # -- Arrow --

    def arrow_record(self, struct: pa.StructType, name: str, path: str) -> dict[str, Any]:
        record_name = self.name(name)
        fields = [
            _field(f.name, self.arrow(f.type, f"{record_name}_{f.name}", _path(path, f.name)), f.nullable)
            for f in _fields(struct)
        ]
        return {"type": "record", "name": record_name, "fields": fields}

    def arrow(self, t: pa.DataType, name: str, path: str) -> Any:
        if pa.types.is_dictionary(t):
            return self.arrow(t.value_type, name, path)
        if isinstance(t, pa.BaseExtensionType):
            if t.extension_name == "arrow.uuid":
                return {"type": "string", "logicalType": "uuid"}
            return self.arrow(t.storage_type, name, path)
        if pa.types.is_boolean(t):
            return "boolean"
        if pa.types.is_integer(t):
            if t in (pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16()):
                return "int"
            if t in (pa.int64(), pa.uint32()):
                return "long"
        if pa.types.is_float32(t):
            return "float"
        if pa.types.is_float64(t):
            return "double"
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return "string"
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            return "bytes"
        if pa.types.is_fixed_size_binary(t) and not pa.types.is_decimal(t):
            return {"type": "fixed", "name": self.name(name), "size": t.byte_width}
        if pa.types.is_decimal(t) and t.precision <= 38:
            return {"type": "bytes", "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
        if pa.types.is_date(t):
            return {"type": "int", "logicalType": "date"}
        if pa.types.is_time32(t):
            return {"type": "int", "logicalType": "time-millis"}
        if pa.types.is_time64(t):
            return {"type": "long", "logicalType": "time-micros"}
        if pa.types.is_timestamp(t):
            unit = {"s": "millis", "ms": "millis", "us": "micros", "ns": "nanos"}[t.unit]
            local = "" if t.tz is not None else "local-"
            return {"type": "long", "logicalType": f"{local}timestamp-{unit}"}
        if pa.types.is_struct(t):
            return self.arrow_record(t, name, path)
        if pa.types.is_map(t):
            if not (pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)):
                raise UnsupportedSchema(f"field {path}: Avro maps need string keys, not {t.key_type}")
            values = self.arrow(t.item_type, name, f"{path}{{}}")
            return {"type": "map", "values": _optional(values) if t.item_field.nullable else values}
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            items = self.arrow(t.value_type, name, f"{path}[]")
            return {"type": "array", "items": _optional(items) if t.value_field.nullable else items}
        raise UnsupportedSchema(f"field {path}: Arrow type {t} has no Avro counterpart")


def _fields(struct: pa.StructType) -> Iterable[pa.Field]:
    return (struct.field(i) for i in range(struct.num_fields))


_ICEBERG_SIMPLE: dict[type, Any] = {
    it.BooleanType: "boolean",
    it.IntegerType: "int",
    it.LongType: "long",
    it.FloatType: "float",
    it.DoubleType: "double",
    it.StringType: "string",
    it.BinaryType: "bytes",
    it.UUIDType: {"type": "string", "logicalType": "uuid"},
    it.DateType: {"type": "int", "logicalType": "date"},
    it.TimeType: {"type": "long", "logicalType": "time-micros"},
    it.TimestampType: {"type": "long", "logicalType": "local-timestamp-micros"},
    it.TimestamptzType: {"type": "long", "logicalType": "timestamp-micros"},
    it.TimestampNanoType: {"type": "long", "logicalType": "local-timestamp-nanos"},
    it.TimestamptzNanoType: {"type": "long", "logicalType": "timestamp-nanos"},
}
