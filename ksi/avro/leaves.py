"""Column encoders for Avro's leaf types: numbers, strings, bytes, fixed, enums, decimals, logical types.

Each takes a non-null Arrow column and returns its per-row byte :mod:`pieces <ksi.avro.pieces>`,
computed with numpy over the whole column.  A leaf accepts any column type that holds its values
exactly: the table's column may be wider than the writer's field after schema evolution (int <- long,
float <- double, millisecond logical types <- microsecond columns), or come from another system
(dictionary-encoded strings, Arrow's uuid, date64, time32, second timestamps ...).  Values are
narrowed back and must narrow exactly, or :class:`AvroEncodeError` says which field and value.

``bytes`` decimals are written in fastavro's length, ``(bit_length(|v|) + 8) // 8``: the minimal two's
complement, except for -2**(8k-1) (e.g. -128) which takes one byte more than Java's
``BigInteger.toByteArray()`` would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from protocol.varint import write_varint

from .pieces import Const, Fixed, Piece, Varint, as_binary, binary_lengths
from .schema import (
    Array,
    AvroEncodeError,
    Decimal,
    Enum,
    Map,
    Node,
    Nullable,
    Primitive,
    Record,
)
from .schema import Fixed as FixedNode

__all__ = [
    "Encoder",
    "describe",
    "field_label",
    "is_stringish",
    "leaf",
    "lengths_and_data",
    "mismatch",
    "uuid_strings",
]

Encoder: TypeAlias = Callable[[pa.Array], list[Piece]]
I64: TypeAlias = npt.NDArray[np.int64]

_INT32 = (-(2**31), 2**31 - 1)
_PER_SECOND = {"s": 1, "ms": 1000, "us": 10**6, "ns": 10**9}
_LOGICAL_UNIT = {
    "time-millis": "ms",
    "time-micros": "us",
    "timestamp-millis": "ms",
    "timestamp-micros": "us",
    "timestamp-nanos": "ns",
    "local-timestamp-millis": "ms",
    "local-timestamp-micros": "us",
    "local-timestamp-nanos": "ns",
}
_UUID_LENGTH = write_varint(36)
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def leaf(node: Primitive | Decimal | FixedNode | Enum, t: pa.DataType, path: str) -> Encoder:
    """The encoder of a leaf field from a non-null column of type ``t`` (AvroEncodeError if it can't)."""
    if isinstance(node, Primitive):
        return _primitive(node, t, path)
    if isinstance(node, Decimal):
        return _decimal(node, t, path)
    if isinstance(node, FixedNode):
        return _fixed(node, t, path)
    return _enum(node, t, path)


# -- messages --------------------------------------------------------------------------------------


def field_label(path: str) -> str:
    return f"field {path}" if path else "the top-level record"


def mismatch(node: Node, t: pa.DataType, path: str) -> AvroEncodeError:
    return AvroEncodeError(f"{field_label(path)}: a column of type {t} can't supply Avro {describe(node)}")


def describe(node: Node) -> str:
    if isinstance(node, Primitive):
        return f"{node.type} ({node.logical})" if node.logical else node.type
    if isinstance(node, Decimal):
        return f"decimal({node.precision}, {node.scale})"
    if isinstance(node, FixedNode):
        return f"fixed({node.size})"
    if isinstance(node, Enum):
        return f"enum {node.name}"
    if isinstance(node, Record):
        return f"record {node.name}"
    if isinstance(node, Array):
        return f"array of {describe(node.items)}"
    if isinstance(node, Map):
        return f"map of {describe(node.values)}"
    if isinstance(node, Nullable):
        return f"nullable {describe(node.value)}"
    return "an unsupported type"


# -- primitives ------------------------------------------------------------------------------------


def is_stringish(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


def _is_binaryish(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t))


def _primitive(node: Primitive, t: pa.DataType, path: str) -> Encoder:
    kind = node.type
    if kind == "boolean" and pa.types.is_boolean(t):
        return lambda a: [Fixed(a.to_numpy(zero_copy_only=False).view(np.uint8)[:, None])]
    if kind in ("int", "long"):
        values = _integers(node, t, path)
        if kind == "int":
            return lambda a: [Varint.of(_in_int32(values(a), path))]
        return lambda a: [Varint.of(values(a))]
    if kind == "float" and pa.types.is_floating(t) and t.bit_width in (32, 64):
        return lambda a: [Fixed(_float32(a, path).view(np.uint8).reshape(-1, 4))]
    if kind == "double" and pa.types.is_floating(t) and t.bit_width in (32, 64):
        return lambda a: [Fixed(_numpy(a, np.float64).view(np.uint8).reshape(-1, 8))]
    if (kind == "string" and is_stringish(t)) or (kind == "bytes" and _is_binaryish(t)):
        return lengths_and_data
    if (
        kind == "string"
        and node.logical == "uuid"
        and pa.types.is_fixed_size_binary(t)
        and t.byte_width == 16
    ):
        return uuid_strings
    raise mismatch(node, t, path)


def _numpy(a: pa.Array, dtype: Any) -> npt.NDArray[Any]:
    values = a.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(values, dtype=np.dtype(dtype).newbyteorder("<"))


def _float32(a: pa.Array, path: str) -> npt.NDArray[np.float32]:
    if a.type.bit_width == 32:
        return _numpy(a, np.float32)
    wide = _numpy(a, np.float64)
    narrow = wide.astype("<f4")
    inexact = (narrow.astype(np.float64) != wide) & ~np.isnan(wide)
    if inexact.any():
        value = float(wide[np.argmax(inexact)])
        raise AvroEncodeError(f"{field_label(path)}: {value!r} is not exactly a float, the schema's type")
    return narrow


def lengths_and_data(a: pa.Array) -> list[Piece]:
    data = as_binary(a)
    return [Varint.of(binary_lengths(data)), data]


def uuid_strings(a: pa.Array) -> list[Piece]:
    """16-byte UUIDs as their 36-character lower-case strings (Avro's uuid logical type on string)."""
    if isinstance(a.type, pa.BaseExtensionType):
        a = a.storage
    raw = _fixed_matrix(a, 16)
    hexes = np.empty((len(a), 32), dtype=np.uint8)
    hexes[:, 0::2], hexes[:, 1::2] = _HEX[raw >> 4], _HEX[raw & 15]
    text = np.full((len(a), 36), ord("-"), dtype=np.uint8)
    for src, dst in ((0, 0), (8, 9), (12, 14), (16, 19), (20, 24)):
        width = 12 if src == 20 else (8 if src == 0 else 4)
        text[:, dst : dst + width] = hexes[:, src : src + width]
    return [Const(_UUID_LENGTH), Fixed(text)]


def _integers(node: Primitive, t: pa.DataType, path: str) -> Callable[[pa.Array], npt.NDArray[np.int64]]:
    """The column's values as the int64s Avro writes, converted to the logical type's unit."""
    logical = node.logical
    if pa.types.is_integer(t):
        if t == pa.uint64():
            return lambda a: _checked_cast(a, path)
        return lambda a: _numpy(a, np.int64)
    if logical == "date" and pa.types.is_date32(t):
        return lambda a: _numpy(a.view(pa.int32()), np.int64)
    if logical == "date" and pa.types.is_date64(t):
        return lambda a: _rescale(_numpy(a.view(pa.int64()), np.int64), 86_400_000, 1, path, "days")
    unit = _LOGICAL_UNIT.get(logical or "")
    is_time = logical is not None and logical.startswith("time-")
    if unit is not None and (
        (is_time and (pa.types.is_time32(t) or pa.types.is_time64(t)))
        or (not is_time and pa.types.is_timestamp(t))
    ):
        storage = pa.int32() if pa.types.is_time32(t) else pa.int64()
        have, want = _PER_SECOND[t.unit], _PER_SECOND[unit]
        return lambda a: _rescale(_numpy(a.view(storage), np.int64), have, want, path, logical or "")
    raise mismatch(node, t, path)


def _checked_cast(a: pa.Array, path: str) -> npt.NDArray[np.int64]:
    try:
        return _numpy(a.cast(pa.int64()), np.int64)
    except pa.ArrowInvalid as e:
        raise AvroEncodeError(f"{field_label(path)}: a value passes the range of a long") from e


def _rescale(values: I64, have: int, want: int, path: str, what: str) -> I64:
    """``values`` counted in 1/have s, counted in 1/want s instead; exact or AvroEncodeError."""
    if have == want:
        return values
    if have > want:
        factor = have // want
        quotient, remainder = np.divmod(values, factor)
        if remainder.any():
            value = int(values[np.argmax(remainder != 0)])
            raise AvroEncodeError(
                f"{field_label(path)}: {value} (1/{have} s) is finer than the schema's {what}"
            )
        return quotient
    factor = want // have
    limit = np.iinfo(np.int64).max // factor
    if len(values) and (int(values.max()) > limit or int(values.min()) < -limit):
        raise AvroEncodeError(f"{field_label(path)}: a value overflows a long in the schema's {what}")
    return values * factor


def _in_int32(values: I64, path: str) -> I64:
    if len(values) and (int(values.min()) < _INT32[0] or int(values.max()) > _INT32[1]):
        bad = values[(values < _INT32[0]) | (values > _INT32[1])][0]
        raise AvroEncodeError(f"{field_label(path)}: {int(bad)} passes the range of the schema's int")
    return values


# -- decimal and fixed -------------------------------------------------------------------------------


def _fixed_matrix(a: pa.Array, width: int) -> npt.NDArray[np.uint8]:
    """A fixed-width array's values as an (n, width) uint8 view."""
    n = len(a)
    data = np.frombuffer(a.buffers()[1], dtype=np.uint8, count=(a.offset + n) * width)
    return data[a.offset * width :].reshape(n, width)


def _bit_length64(x: npt.NDArray[np.uint64]) -> I64:
    """Bit length of each uint64 (exact: halves of 32 bits convert to float64 without rounding)."""
    high = (x >> np.uint64(32)).astype(np.float64)
    low = (x & np.uint64(0xFFFFFFFF)).astype(np.float64)
    return np.where(high > 0, 32 + np.frexp(high)[1], np.frexp(low)[1]).astype(np.int64)


def _decimal(node: Decimal, t: pa.DataType, path: str) -> Encoder:
    if not pa.types.is_decimal(t):
        raise mismatch(node, t, path)
    if t.scale != node.scale:
        raise AvroEncodeError(
            f"{field_label(path)}: column scale {t.scale} differs from the schema's {node.scale}"
        )
    cast = t.bit_width != 128
    target = pa.decimal128(min(t.precision, 38), t.scale)

    def encode(a: pa.Array) -> list[Piece]:
        if cast:
            try:
                a = a.cast(target)
            except pa.ArrowInvalid as e:
                raise AvroEncodeError(f"{field_label(path)}: a value passes decimal128") from e
        n = len(a)
        words = np.frombuffer(a.buffers()[1], dtype="<u8", count=(a.offset + n) * 2)[a.offset * 2 :]
        low, high = words[0::2], words[1::2]
        big = _fixed_matrix(a, 16)[:, ::-1]  # big-endian two's complement
        negative = high >= np.uint64(1 << 63)
        if node.size is None:
            # fastavro: (bit length of |v|) + 8) // 8 bytes
            abs_low = np.where(negative, ~low + np.uint64(1), low)
            abs_high = np.where(negative, ~high + (negative & (abs_low == 0)).astype(np.uint64), high)
            bits = np.where(abs_high != 0, 64 + _bit_length64(abs_high), _bit_length64(abs_low))
            size = np.minimum((bits + 8) // 8, 16)
            present = np.arange(16)[None, :] >= (16 - size)[:, None]
            return [Varint.of(size), Fixed(big, present)]
        width = node.size
        sign = np.where(negative, np.uint8(0xFF), np.uint8(0))
        if width >= 16:
            return [Fixed(np.broadcast_to(sign[:, None], (n, width - 16))), Fixed(big)]
        head = big[:, : 16 - width]
        fits = (head == sign[:, None]).all(axis=1) & ((big[:, 16 - width] >= 0x80) == negative)
        if not fits.all():
            raise AvroEncodeError(
                f"{field_label(path)}: {a[int(np.argmin(fits))]} doesn't fit fixed({width})"
            )
        return [Fixed(big[:, 16 - width :])]

    return encode


def _fixed(node: FixedNode, t: pa.DataType, path: str) -> Encoder:
    if pa.types.is_fixed_size_binary(t) and t.byte_width == node.size:
        return lambda a: [Fixed(_fixed_matrix(a, node.size))]
    if _is_binaryish(t):

        def encode(a: pa.Array) -> list[Piece]:
            data = as_binary(a)
            lengths = binary_lengths(data)
            if len(data) and (lengths != node.size).any():
                bad = int(lengths[lengths != node.size][0])
                raise AvroEncodeError(f"{field_label(path)}: a {bad}-byte value for fixed({node.size})")
            return [data]

        return encode
    raise mismatch(node, t, path)


def _enum(node: Enum, t: pa.DataType, path: str) -> Encoder:
    if not is_stringish(t):
        raise mismatch(node, t, path)
    symbols = pa.array(node.symbols, pa.string()).cast(t)

    def encode(a: pa.Array) -> list[Piece]:
        index = pc.index_in(a, value_set=symbols)
        if index.null_count:
            bad = a[int(np.argmin(index.is_valid().to_numpy(zero_copy_only=False)))]
            raise AvroEncodeError(f"{field_label(path)}: {bad.as_py()!r} is not a symbol of enum {node.name}")
        return [Varint.of(_numpy(index, np.int64))]

    return encode
