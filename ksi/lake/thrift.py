"""The Thrift compact protocol, generically: a struct read from bytes is a :class:`TStruct` of field id ->
(compact type, value), unknown fields included, and is written back as read (fields in the order read), so a
struct changed here keeps every field this code knows nothing of.  Enough for Parquet's footer, page headers
and page index (:mod:`ksi.lake.pages`); no schema, no service calls.

Encoding (apache/thrift, doc/specs/thrift-compact-protocol.md): a field is a byte of (id delta << 4 | type),
or the type byte then the id as a zigzag varint; booleans are the field's type (1 true, 2 false), a byte in
a collection; integers are zigzag varints; binary a varint length and bytes; a list or set a byte of
(size << 4 | element type), size 15 meaning a varint size follows; a map a varint size then, if not empty,
a byte of (key type << 4 | value type); a struct ends with a 0 byte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["BINARY", "BYTE", "DOUBLE", "FALSE", "I16", "I32", "I64", "LIST", "MAP", "SET", "STOP", "STRUCT", "TRUE",
           "TList", "TMap", "TStruct", "ThriftError", "decode", "encode", "varint", "varint_bytes"]


STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)
MAX_DEPTH = 64


class ThriftError(ValueError):
    """Bytes that are not the Thrift compact encoding of a struct."""


@dataclass(slots=True)
class TList:
    element: int           # the compact type of the elements
    items: list[Any]


@dataclass(slots=True)
class TMap:
    key: int
    value: int
    items: list[tuple[Any, Any]]


class TStruct:
    """A struct as read: field id -> (compact type, value), in the order read, unknown fields included
    (booleans have type TRUE whatever their value)."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[int, tuple[int, Any]] | None = None) -> None:
        self.fields: dict[int, tuple[int, Any]] = {} if fields is None else fields

    def get(self, field_id: int, default: Any = None) -> Any:
        found = self.fields.get(field_id)
        return default if found is None else found[1]

    def set(self, field_id: int, kind: int, value: Any) -> None:
        self.fields[field_id] = (kind, value)

    def drop(self, *field_ids: int) -> None:
        for field_id in field_ids:
            self.fields.pop(field_id, None)

    def copy(self) -> TStruct:
        return TStruct(dict(self.fields))

    def __repr__(self) -> str:
        return f"TStruct({self.fields!r})"


class _Decoder:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview, pos: int) -> None:
        self.data, self.pos = data, pos

    def byte(self) -> int:
        value = self.data[self.pos]
        self.pos += 1
        return value

    def varint(self) -> int:
        result = shift = 0
        while True:
            byte = self.byte()
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ThriftError("varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ThriftError(f"{n} bytes wanted at {self.pos}, {len(self.data) - self.pos} left")
        value = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return value

    def value(self, kind: int, depth: int) -> Any:
        if kind in (I16, I32, I64):
            return self.zigzag()
        if kind == BINARY:
            return self.take(self.varint())
        if kind == STRUCT:
            return self.struct(depth + 1)
        if kind in (TRUE, FALSE):  # an element of a collection: a byte
            return self.byte() == TRUE
        if kind == BYTE:
            return struct.unpack("<b", self.take(1))[0]
        if kind == DOUBLE:
            return struct.unpack("<d", self.take(8))[0]
        if kind in (LIST, SET):
            head = self.byte()
            size, element = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            return TList(element, [self.value(element, depth + 1) for _ in range(size)])
        if kind == MAP:
            size = self.varint()
            if size == 0:
                return TMap(0, 0, [])
            head = self.byte()
            k, v = head >> 4, head & 0x0F
            return TMap(k, v, [(self.value(k, depth + 1), self.value(v, depth + 1)) for _ in range(size)])
        raise ThriftError(f"unknown compact type {kind} at {self.pos}")

    def struct(self, depth: int = 0) -> TStruct:
        if depth > MAX_DEPTH:
            raise ThriftError("structs nested too deep")
        fields: dict[int, tuple[int, Any]] = {}
        last = 0
        while True:
            head = self.byte()
            if head == STOP:
                return TStruct(fields)
            kind, delta = head & 0x0F, head >> 4
            field_id = last + delta if delta else self.zigzag()
            if kind in (TRUE, FALSE):
                fields[field_id] = (TRUE, kind == TRUE)
            else:
                fields[field_id] = (kind, self.value(kind, depth))
            last = field_id


def decode(data: bytes | memoryview, pos: int = 0) -> tuple[TStruct, int]:
    """The struct encoded at ``pos`` and the position after it (ThriftError if the bytes are not one)."""
    decoder = _Decoder(data, pos)
    try:
        return decoder.struct(), decoder.pos
    except IndexError:
        raise ThriftError(f"truncated struct ({len(data) - pos} bytes)") from None


def varint(data: bytes | memoryview, pos: int = 0) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it."""
    decoder = _Decoder(data, pos)
    try:
        return decoder.varint(), decoder.pos
    except IndexError:
        raise ThriftError("truncated varint") from None


def varint_bytes(n: int) -> bytes:
    """An unsigned varint."""
    out = bytearray()
    _varint(out, n)
    return bytes(out)


def _varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(n: int) -> int:
    return n << 1 if n >= 0 else ((-n) << 1) - 1


def _write_value(out: bytearray, kind: int, value: Any) -> None:
    if kind in (I16, I32, I64):
        _varint(out, _zigzag(value))
    elif kind == BINARY:
        _varint(out, len(value))
        out += value
    elif kind == STRUCT:
        _write_struct(out, value)
    elif kind in (TRUE, FALSE):
        out.append(TRUE if value else FALSE)
    elif kind == BYTE:
        out += struct.pack("<b", value)
    elif kind == DOUBLE:
        out += struct.pack("<d", value)
    elif kind in (LIST, SET):
        n = len(value.items)
        if n < 15:
            out.append(n << 4 | value.element)
        else:
            out.append(0xF0 | value.element)
            _varint(out, n)
        for item in value.items:
            _write_value(out, value.element, item)
    elif kind == MAP:
        _varint(out, len(value.items))
        if value.items:
            out.append(value.key << 4 | value.value)
            for k, v in value.items:
                _write_value(out, value.key, k)
                _write_value(out, value.value, v)
    else:
        raise ThriftError(f"unknown compact type {kind}")


def _write_struct(out: bytearray, value: TStruct) -> None:
    last = 0
    for field_id, (kind, item) in value.fields.items():
        wire = (TRUE if item else FALSE) if kind in (TRUE, FALSE) else kind
        delta = field_id - last
        if 0 < delta <= 15:
            out.append(delta << 4 | wire)
        else:
            out.append(wire)
            _varint(out, _zigzag(field_id))
        if kind not in (TRUE, FALSE):
            _write_value(out, kind, item)
        last = field_id
    out.append(STOP)


def encode(value: TStruct) -> bytes:
    out = bytearray()
    _write_struct(out, value)
    return bytes(out)
