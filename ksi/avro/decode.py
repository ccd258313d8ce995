"""Avro binary bodies -> typed Arrow columns (the archive side).

The archive job turns each Kafka value's Avro body into one row of typed columns, of the type
:func:`~ksi.avro.schema.arrow_type` gives.  Archiving runs once per record and off the read path, so
fastavro's C reader decodes each body; what this module adds is the columnar part around it:

* fastavro reads with the logical types stripped, so it returns the raw ints and bytes rather than
  datetimes and Decimals (faster, and exact: no datetime range limits, no float rounding);
* Arrow builds the raw columns from those values in one call, and the logical types are then applied
  column-wise: days -> date32, millis -> microsecond time64/timestamps, two's complement bytes ->
  decimal128 (numpy, no per-value Python);
* a body with bytes left over after its value is an error, not silently truncated (its re-encoding
  would not be the same bytes).

Re-encoding a decoded row gives back the same body for anything Avro's Java writer or fastavro writes,
with two known exceptions a caller that needs byte-exact replay should check by re-encoding: a ``float``
signalling NaN (quieted on the way through a Python float) and Java's shorter ``bytes`` decimal for
-2**(8k-1) (see :mod:`ksi.avro.encode`).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fastavro import parse_schema as fastavro_parse_schema
from fastavro import schemaless_reader

from .pieces import as_binary, binary_lengths, binary_offsets
from .schema import (
    Array,
    AvroDecodeError,
    AvroSchema,
    Decimal,
    Map,
    Node,
    Nullable,
    Primitive,
    Record,
    node_arrow_type,
    parse_schema,
    require_supported,
)

__all__ = ["decode_values"]

_RAW_LOGICAL = {
    "date": pa.int32(),
    "time-millis": pa.int32(),
    "time-micros": pa.int64(),
    "timestamp-millis": pa.int64(),
    "timestamp-micros": pa.int64(),
    "local-timestamp-millis": pa.int64(),
    "local-timestamp-micros": pa.int64(),
}


def decode_values(
    bodies: Sequence[bytes] | pa.BinaryArray | pa.ChunkedArray, schema: AvroSchema | str | dict[str, Any]
) -> pa.StructArray:
    """The typed columns of Avro ``bodies`` written with record ``schema``: type ``arrow_type(schema)``.

    Raises :class:`AvroDecodeError` (with the row's ``index``) for a body that doesn't decode, or that
    has bytes after its value, and :class:`UnsupportedSchema` for a schema typed columns can't hold.
    """
    schema = parse_schema(schema)
    record = require_supported(schema)
    reader = _reader_schema(schema)
    values: Iterable[bytes | None] = bodies.to_pylist() if isinstance(bodies, (pa.Array, pa.ChunkedArray)) else bodies
    rows: list[Any] = []
    for index, body in enumerate(values):
        if body is None:
            raise AvroDecodeError(f"row {index}: no body (null)", index)
        stream = io.BytesIO(body)
        try:
            rows.append(schemaless_reader(stream, reader, None))
        except Exception as e:  # EOFError, UnicodeDecodeError, IndexError (enum, union index) ...
            raise AvroDecodeError(
                f"row {index}: not Avro of this schema ({type(e).__name__}: {e})", index
            ) from e
        if stream.tell() != len(body):
            extra = len(body) - stream.tell()
            raise AvroDecodeError(f"row {index}: {extra} bytes follow the Avro value", index)
    raw = pa.array(rows, type=_raw_type(record))
    converted = _convert(record, raw)
    assert isinstance(converted, pa.StructArray)
    return converted


@lru_cache(maxsize=256)
def _reader_schema(schema: AvroSchema) -> Any:
    """The schema fastavro reads with: the same, minus every logicalType."""
    return fastavro_parse_schema(_strip_logical(schema.json))


def _strip_logical(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_logical(v) for k, v in value.items() if k != "logicalType"}
    if isinstance(value, list):
        return [_strip_logical(v) for v in value]
    return value


# -- raw columns and their conversion -----------------------------------------------------------------


def _plain(node: Node) -> bool:
    """True when fastavro's raw values already have the node's final Arrow type."""
    if isinstance(node, Nullable):
        return _plain(node.value)
    if isinstance(node, Primitive):
        return node.logical not in _RAW_LOGICAL
    if isinstance(node, Decimal):
        return False
    if isinstance(node, Record):
        return all(_plain(f.type) for f in node.fields)
    if isinstance(node, Array):
        return _plain(node.items)
    if isinstance(node, Map):
        return _plain(node.values)
    return True


def _raw_type(node: Node) -> pa.DataType:
    if _plain(node):
        return node_arrow_type(node)
    if isinstance(node, Nullable):
        return _raw_type(node.value)
    if isinstance(node, Primitive):
        return _RAW_LOGICAL[node.logical or ""]
    if isinstance(node, Decimal):
        return pa.binary() if node.size is None else pa.binary(node.size)
    if isinstance(node, Record):
        return pa.struct([_raw_field(f.name, f.type) for f in node.fields])
    if isinstance(node, Array):
        return pa.list_(_raw_field("element", node.items))
    if isinstance(node, Map):
        return pa.map_(pa.field("key", pa.string(), nullable=False), _raw_field("value", node.values))
    raise AssertionError(node)


def _raw_field(name: str, node: Node) -> pa.Field:
    return pa.field(name, _raw_type(node), nullable=isinstance(node, Nullable))


def _convert(node: Node, raw: pa.Array) -> pa.Array:
    """A raw column as the node's final Arrow type (nulls kept)."""
    if _plain(node):
        return raw
    if isinstance(node, Nullable):
        return _convert(node.value, raw)
    final = node_arrow_type(node)
    mask = raw.is_null() if raw.null_count else None
    if isinstance(node, Primitive):
        logical = node.logical
        if logical == "date":
            return raw.view(final)
        if logical in ("time-millis", "timestamp-millis", "local-timestamp-millis"):
            try:
                micros = pc.multiply_checked(raw.cast(pa.int64()), 1000)
            except pa.ArrowInvalid as e:
                raise AvroDecodeError(f"a {logical} value overflows microseconds") from e
            return micros.view(final)
        return raw.view(final)
    if isinstance(node, Decimal):
        return _decimals(raw, final, node.size)
    if isinstance(node, Record):
        children = [_convert(f.type, raw.field(i)) for i, f in enumerate(node.fields)]
        return pa.StructArray.from_arrays(children, fields=list(final), mask=mask)
    if isinstance(node, Array):
        values = _convert(node.items, raw.values)
        return pa.ListArray.from_arrays(raw.offsets, values, type=final, mask=mask)
    if isinstance(node, Map):
        items = _convert(node.values, raw.items)
        return pa.MapArray.from_arrays(raw.offsets, raw.keys, items, type=final, mask=mask)
    raise AssertionError(node)


def _decimals(raw: pa.Array, final: pa.DataType, size: int | None) -> pa.Array:
    """Big-endian two's complement values (Avro's decimal) as decimal128."""
    n = len(raw)
    out = np.zeros((n, 16), dtype=np.uint8)  # big-endian, sign-extended to 16 bytes
    if size is None:
        data = as_binary(raw)
        lengths = binary_lengths(data)
        offsets = binary_offsets(data).astype(np.int64)
        buffer = data.buffers()[2]
        flat = np.frombuffer(buffer, dtype=np.uint8) if buffer is not None else np.zeros(0, np.uint8)
        if len(flat) == 0:
            flat = np.zeros(1, np.uint8)
        first = flat[np.minimum(offsets[:-1], len(flat) - 1)]
        out[(lengths > 0) & (first >= 0x80)] = 0xFF
        wide = lengths > 16
        if wide.any():  # longer than 16 bytes: fine only if the extra leading bytes are sign extension
            for row in np.flatnonzero(wide):
                value = int.from_bytes(flat[offsets[row] : offsets[row + 1]].tobytes(), "big", signed=True)
                try:
                    out[row] = np.frombuffer(value.to_bytes(16, "big", signed=True), dtype=np.uint8)
                except OverflowError as e:
                    raise AvroDecodeError(f"a decimal of {lengths[row]} bytes passes decimal128", None) from e
            lengths = np.where(wide, 0, lengths)
        rows = np.repeat(np.arange(n), lengths)
        starts = np.repeat(offsets[:-1], lengths)
        position = np.arange(len(rows)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[rows, 16 - lengths[rows] + position] = flat[starts + position] if len(rows) else 0
    else:
        matrix = np.frombuffer(raw.buffers()[1], dtype=np.uint8, count=(raw.offset + n) * size)
        matrix = matrix[raw.offset * size :].reshape(n, size)
        if size <= 16:
            out[matrix[:, 0] >= 0x80] = 0xFF
            out[:, 16 - size :] = matrix
        else:
            value_bytes = matrix[:, size - 16 :]
            sign = np.where(value_bytes[:, 0] >= 0x80, 0xFF, 0).astype(np.uint8)
            if not (matrix[:, : size - 16] == sign[:, None]).all():
                raise AvroDecodeError(f"a fixed({size}) decimal passes decimal128")
            out[:] = value_bytes
    little = np.ascontiguousarray(out[:, ::-1])
    decimals = pa.Array.from_buffers(final, n, [None, pa.py_buffer(little)])
    if raw.null_count:
        decimals = pc.if_else(raw.is_valid(), decimals, pa.scalar(None, final))
    return decimals
