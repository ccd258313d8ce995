"""Single Avro values in binary, from their JSON form: the defaults of fields the table has no column for.

A writer schema may have a field the table lacks (the table was derived from another system's columns,
or a column was never added); Avro readers fill such a field from its default, and the encoder writes
that default into every row.  Defaults are few and small, so this is plain per-value Python.
"""

from __future__ import annotations

import struct
from typing import Any

from protocol.varint import write_varint

from .leaves import field_label
from .schema import (
    NO_DEFAULT,
    Array,
    AvroEncodeError,
    Decimal,
    Enum,
    Map,
    Node,
    Nullable,
    Primitive,
    Record,
    UnsupportedSchema,
)
from .schema import Fixed as FixedNode

__all__ = ["encode_datum"]


def _join_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def encode_datum(node: Node, value: Any, path: str = "") -> bytes:
    """One value in Avro binary, from its JSON form (a field default): bytes and fixed are strings
    of code points 0-255, a union's value is its non-null branch's (or null)."""
    if isinstance(node, Nullable):
        if value is None:
            return write_varint(node.null_index)
        return write_varint(node.value_index) + encode_datum(node.value, value, path)
    if isinstance(node, Primitive):
        kind = node.type
        if kind == "boolean":
            return b"\x01" if value else b"\x00"
        if kind in ("int", "long"):
            return write_varint(int(value))
        if kind in ("float", "double"):
            number = float(value)  # also reads "NaN", "Infinity", "-Infinity"
            return struct.pack("<f" if kind == "float" else "<d", number)
        data = _json_bytes(value) if kind == "bytes" else str(value).encode("utf-8")
        return write_varint(len(data)) + data
    if isinstance(node, Decimal):
        data = _json_bytes(value)
        if node.size is None:
            return write_varint(len(data)) + data
        return _sized(data, node.size, path)
    if isinstance(node, FixedNode):
        return _sized(_json_bytes(value), node.size, path)
    if isinstance(node, Enum):
        if value not in node.symbols:
            raise AvroEncodeError(
                f"{field_label(path)}: default {value!r} is not a symbol of enum {node.name}"
            )
        return write_varint(node.symbols.index(value))
    if isinstance(node, Record):
        out = bytearray()
        for f in node.fields:
            inner = value.get(f.name, f.default) if isinstance(value, dict) else NO_DEFAULT
            if inner is NO_DEFAULT:
                raise AvroEncodeError(
                    f"{field_label(_join_path(path, f.name))}: the default has no value for it"
                )
            out += encode_datum(f.type, inner, _join_path(path, f.name))
        return bytes(out)
    if isinstance(node, Array):
        if not value:
            return b"\x00"
        body = b"".join(encode_datum(node.items, v, f"{path}[]") for v in value)
        return write_varint(len(value)) + body + b"\x00"
    if isinstance(node, Map):
        if not value:
            return b"\x00"
        body = b"".join(
            encode_datum(Primitive("string"), k, path) + encode_datum(node.values, v, f"{path}{{}}")
            for k, v in value.items()
        )
        return write_varint(len(value)) + body + b"\x00"
    raise UnsupportedSchema(node.reason)


def _json_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("latin-1")


def _sized(data: bytes, size: int, path: str) -> bytes:
    if len(data) != size:
        raise AvroEncodeError(
            f"{field_label(path)}: default has {len(data)} bytes, fixed({size}) needs {size}"
        )
    return data
