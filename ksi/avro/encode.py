"""Typed table columns -> Avro binary bodies, vectorized, byte-identical to what the writer produced.

The cold read path replays archived rows as Kafka values, so each row's Avro body is rebuilt from the
table's typed columns with the row's writer schema, and must equal the original bytes.  This runs for
millions of rows a second, so nothing loops over rows in Python: each schema field compiles, against its
column's Arrow type, into a function from a column to per-row byte :mod:`pieces <ksi.avro.pieces>`
(varints, fixed-width bytes, binary arrays), and the pieces are joined per row once at the end.  This
module does the structure (records, [null, T] unions, arrays, maps); :mod:`~ksi.avro.leaves` the values.

The table's columns are the union of every writer schema's fields, so a column may be wider than the
field it feeds; the leaves narrow values back exactly or fail.  Extra columns are ignored; a field
without a column encodes its default (:mod:`~ksi.avro.defaults`).

Byte layout follows Avro's Java writer and fastavro: a nullable value is its branch index then (if not
null) the value; a non-empty array or map is one block (count, items, 0), an empty one a single 0.  An
array's items are encoded once for the whole column and each row's bytes are then a slice of them, so
no per-row join is needed for the nesting.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from protocol.varint import write_varint

from .defaults import encode_datum
from .leaves import (
    Encoder,
    describe,
    field_label,
    is_stringish,
    leaf,
    lengths_and_data,
    mismatch,
    uuid_strings,
)
from .pieces import (
    Const,
    Fixed,
    Overflow,
    Piece,
    Varint,
    binary_from,
    binary_offsets,
    join,
    scatter,
    slice_values,
)
from .schema import (
    NO_DEFAULT,
    Array,
    AvroEncodeError,
    AvroSchema,
    Decimal,
    Enum,
    Map,
    Node,
    Nullable,
    Primitive,
    Record,
    Unsupported,
    UnsupportedSchema,
    parse_schema,
    require_supported,
)
from .schema import Fixed as FixedNode

__all__ = ["encode_values", "unsupported_reason"]

I64: TypeAlias = npt.NDArray[np.int64]


# -- public ----------------------------------------------------------------------------------------


def encode_values(
    columns: pa.StructArray | pa.ChunkedArray | pa.RecordBatch | pa.Table,
    schema: AvroSchema | str | dict[str, Any],
) -> pa.BinaryArray:
    """Each row's Avro body under the record ``schema``, from typed columns matched by field name.

    Returns ``pa.binary()`` (``pa.large_binary()`` only when the bodies pass 2 GiB in total).  Raises
    :class:`AvroEncodeError` when a column can't supply its field (missing without default, wrong
    type, a null in a non-nullable field, a value that doesn't narrow exactly, an unknown enum symbol)
    and :class:`UnsupportedSchema` when the schema can't be typed columns at all.
    """
    schema = parse_schema(schema)
    rows = _as_struct(columns, schema)
    return _encode_rows(_compiled(schema, rows.type), rows)


@lru_cache(maxsize=1024)
def _compiled(schema: AvroSchema, columns: pa.StructType) -> Encoder:
    """The encoder of ``schema`` for columns of this type (compiled once: replies are often small)."""
    record = require_supported(schema)
    return _required(record, _record(record, columns, ""), "")


def unsupported_reason(
    schema: AvroSchema | str | dict[str, Any], columns: pa.StructType | pa.Schema
) -> str | None:
    """None if :func:`encode_values` can encode columns of this type with ``schema``, else why not.

    Data can still fail later (nulls in a non-nullable field, values that don't narrow, enum symbols).
    """
    try:
        record = require_supported(parse_schema(schema))
        _record(record, _struct_type(columns), "")
    except (UnsupportedSchema, AvroEncodeError) as e:
        return str(e)
    return None


def _struct_type(columns: pa.StructType | pa.Schema) -> pa.StructType:
    if isinstance(columns, pa.Schema):
        return pa.struct(list(columns))
    return columns


def _as_struct(columns: Any, schema: AvroSchema) -> pa.StructArray:
    if isinstance(columns, pa.Table):  # combine only the chunks of the columns the schema reads
        wanted = set(schema.field_names)
        keep = [i for i, name in enumerate(columns.column_names) if name in wanted]
        columns = columns.select(keep).combine_chunks().to_struct_array()
    elif isinstance(columns, pa.RecordBatch):
        return columns.to_struct_array()
    if isinstance(columns, pa.ChunkedArray):
        columns = columns.combine_chunks() if columns.num_chunks != 1 else columns.chunk(0)
        if isinstance(columns, pa.ChunkedArray):  # no chunks at all
            columns = pa.array([], columns.type)
    if not isinstance(columns, pa.StructArray):
        raise TypeError(f"expected a StructArray, RecordBatch or Table, got {type(columns).__name__}")
    return columns


def _encode_rows(encoder: Encoder, rows: pa.StructArray) -> pa.Array:
    """Encode, halving the rows while offsets would pass 2 GiB."""
    try:
        return join(encoder(rows), len(rows))
    except Overflow:
        if len(rows) <= 1:
            raise AvroEncodeError("one row's Avro body would pass 2 GiB") from None
        half = len(rows) // 2
        parts = [_encode_rows(encoder, rows.slice(0, half)), _encode_rows(encoder, rows.slice(half))]
        return pa.concat_arrays([p.cast(pa.large_binary()) for p in parts])


# -- compiling a schema against column types ---------------------------------------------------------


def _compile(node: Node, t: pa.DataType, path: str) -> Encoder:
    """The encoder of a field of type ``node`` from a column of type ``t``."""
    if isinstance(node, Nullable):
        return _nullable(node, t, path)
    if isinstance(node, Unsupported):
        raise UnsupportedSchema(node.reason)
    if pa.types.is_null(t):
        raise AvroEncodeError(
            f"{field_label(path)}: the column has the null type but the field is not nullable"
        )
    return _required(node, _value(node, t, path), path)


def _required(node: Node, body: Encoder, path: str) -> Encoder:
    def encode(a: pa.Array) -> list[Piece]:
        if a.null_count:
            raise AvroEncodeError(f"{field_label(path)}: a null, but Avro {describe(node)} is not nullable")
        return body(a)

    return encode


def _nullable(node: Nullable, t: pa.DataType, path: str) -> Encoder:
    null, value = write_varint(node.null_index), write_varint(node.value_index)
    if pa.types.is_null(t):
        return lambda a: [Const(null)]
    inner = _value(node.value, t, path)

    def encode(a: pa.Array) -> list[Piece]:
        nulls = a.null_count
        if nulls == 0:
            return [Const(value), *inner(a)]
        if nulls == len(a):
            return [Const(null)]
        valid = a.is_valid().to_numpy(zero_copy_only=False)
        index = np.where(valid, np.uint8(value[0]), np.uint8(null[0])).astype(np.uint8)
        return [Fixed(index[:, None]), *scatter(inner(a.filter(pa.array(valid))), valid)]

    return encode


def _value(node: Node, t: pa.DataType, path: str) -> Encoder:
    """The encoder of a non-null column; its callers have dealt with nulls."""
    if pa.types.is_dictionary(t):
        inner = _value(node, t.value_type, path)
        return lambda a: inner(a.dictionary_decode())
    if isinstance(t, pa.BaseExtensionType):
        if t.extension_name == "arrow.uuid" and isinstance(node, Primitive) and node.type == "string":
            return uuid_strings
        storage = _value(node, t.storage_type, path)
        return lambda a: storage(a.storage)
    if isinstance(node, Unsupported):
        raise UnsupportedSchema(node.reason)
    if isinstance(node, (Primitive, Decimal, FixedNode, Enum)):
        return leaf(node, t, path)
    if isinstance(node, Record):
        if not pa.types.is_struct(t):
            raise mismatch(node, t, path)
        return _record(node, t, path)
    if isinstance(node, Array):
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            raise mismatch(node, t, path)
        return _array(node, t, path)
    if isinstance(node, Map):
        return _map(node, t, path)
    raise mismatch(node, t, path)  # Nullable inside a union is not valid Avro


# -- records, arrays, maps ---------------------------------------------------------------------------


def _join_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _record(node: Record, t: pa.StructType, path: str) -> Encoder:
    parts: list[tuple[int, Encoder] | Const] = []
    for f in node.fields:
        where = _join_path(path, f.name)
        indices = t.get_all_field_indices(f.name)
        if len(indices) > 1:
            raise AvroEncodeError(f"{field_label(where)}: {len(indices)} columns have this name")
        if indices:
            parts.append((indices[0], _compile(f.type, t.field(indices[0]).type, where)))
        elif f.default is not NO_DEFAULT:
            parts.append(Const(encode_datum(f.type, f.default, where)))
        else:
            raise AvroEncodeError(f"{field_label(where)}: no column holds this field and it has no default")

    def encode(a: pa.Array) -> list[Piece]:
        pieces: list[Piece] = []
        for part in parts:
            if isinstance(part, Const):
                pieces.append(part)
            else:
                pieces.extend(part[1](a.field(part[0])))
        return pieces

    return encode


def _blocks(counts: I64, items: pa.Array, offsets: I64) -> list[Piece]:
    """An array or map from its joined items: count, the row's items, a 0 terminator when count > 0."""
    if not len(items):
        return [Const(b"\x00")]
    item_offsets = binary_offsets(items)
    joined = binary_from(item_offsets[offsets], items.buffers()[2])
    terminator = np.zeros((len(counts), 1), dtype=np.uint8)
    return [Varint.of(counts), joined, Fixed(terminator, counts > 0)]


def _array(node: Array, t: pa.ListType | pa.LargeListType, path: str) -> Encoder:
    items = _compile(node.items, t.value_type, f"{path}[]")

    def encode(a: pa.Array) -> list[Piece]:
        offsets, values = slice_values(a, a.values)
        return _blocks(np.diff(offsets), join(items(values), len(values)), offsets)

    return encode


def _map(node: Map, t: pa.DataType, path: str) -> Encoder:
    if not (isinstance(t, pa.MapType) and is_stringish(t.key_type)):
        raise mismatch(node, t, path)
    values = _compile(node.values, t.item_type, f"{path}{{}}")

    def encode(a: pa.Array) -> list[Piece]:
        offsets, keys = slice_values(a, a.keys)
        _, items = slice_values(a, a.items)
        entries = join([*lengths_and_data(keys), *values(items)], len(keys))
        return _blocks(np.diff(offsets), entries, offsets)

    return encode
