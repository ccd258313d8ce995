"""Varints, sans-IO: the one varint kernel of ksi, scalar and vectorized.

* Unsigned varints (Kafka's flexible-version lengths and tagged fields): :func:`read_uvarint`,
  :func:`write_uvarint`, :func:`skip_tagged_fields`.
* Zig-zag varints (Kafka record fields, Avro's int and long): :func:`read_varint`, :func:`write_varint`.
* Whole columns at once, with numpy (record batches in ``protocol/records.py``, Avro bodies in
  ``ksi/avro``): :func:`zigzag`, :func:`varint_sizes`, and :func:`write_run`, which writes runs of
  :class:`Varint`, :class:`Fixed` and :class:`Const` pieces row by row into one binary array, and
  :func:`join_rows`, which joins such runs and binary arrays row by row (a binary array whose rows are all
  one small width joins the runs as a :class:`Fixed` piece).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from .errors import MalformedFrame

if TYPE_CHECKING:  # imported by the column functions themselves: the request path never loads them
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

__all__ = [
    "Const",
    "Fixed",
    "Overflow",
    "Varint",
    "join_rows",
    "read_uvarint",
    "read_varint",
    "skip_tagged_fields",
    "varint_sizes",
    "write_run",
    "write_uvarint",
    "write_varint",
    "zigzag",
]

I64: TypeAlias = "npt.NDArray[np.int64]"
U64: TypeAlias = "npt.NDArray[np.uint64]"
U8: TypeAlias = "npt.NDArray[np.uint8]"
Bools: TypeAlias = "npt.NDArray[np.bool_]"

INT32_MAX = 2**31 - 1


def read_uvarint(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise MalformedFrame("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise MalformedFrame("varint longer than 10 bytes")


def write_uvarint(value: int) -> bytes:
    """``value`` (>= 0) as an unsigned varint."""
    if value < 0:
        raise ValueError(f"an unsigned varint cannot hold {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def skip_tagged_fields(data: bytes | bytearray | memoryview, pos: int) -> int:
    """The position after the tagged-field section at ``pos``."""
    count, pos = read_uvarint(data, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(data, pos)
        size, pos = read_uvarint(data, pos)
        pos += size
        if pos > len(data):
            raise MalformedFrame("tagged field runs past the end of the frame")
    return pos


# -- zig-zag varints, one at a time ----------------------------------------------------------------


def read_varint(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """The zig-zag varint at ``pos`` and the position after it."""
    if pos < len(data) and data[pos] < 0x80:  # the common one-byte case
        b = data[pos]
        return (b >> 1) ^ -(b & 1), pos + 1
    u, pos = read_uvarint(data, pos)
    return (u >> 1) ^ -(u & 1), pos


def write_varint(value: int) -> bytes:
    """``value`` (a signed 64-bit integer) as a zig-zag varint."""
    return write_uvarint(((value << 1) ^ (value >> 63)) & ((1 << 64) - 1))


# -- whole columns ---------------------------------------------------------------------------------


class Overflow(Exception):
    """Offsets would pass int32: write fewer rows at a time."""


def zigzag(v: I64) -> U64:
    import numpy as np

    v = np.asarray(v, dtype=np.int64)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def varint_sizes(u: U64) -> I64:
    """Bytes each unsigned (already zig-zagged) value takes as a varint."""
    import numpy as np

    n = np.ones(len(u), dtype=np.int64)
    if len(u):
        top, threshold = int(u.max()), 1 << 7
        while threshold <= top:
            n += u >= np.uint64(threshold)
            threshold <<= 7
    return n


@dataclass(frozen=True, slots=True)
class Varint:
    """A column of varints: zig-zagged values and their sizes (0 where a row has none)."""

    u: U64
    sizes: I64

    @classmethod
    def of(cls, values: I64) -> Varint:
        u = zigzag(values)
        return cls(u, varint_sizes(u))


@dataclass(frozen=True, slots=True)
class Fixed:
    """An (n, w) byte matrix, optionally with a presence mask per row (n,) or per byte (n, w)."""

    data: U8  # may be a broadcast or strided view
    present: Bools | None = None  # None = all


@dataclass(frozen=True, slots=True)
class Const:
    """The same bytes in every row."""

    data: bytes


def _width(piece: Varint | Fixed | Const) -> int:
    if isinstance(piece, Const):
        return len(piece.data)
    if isinstance(piece, Fixed):
        return int(piece.data.shape[1])
    return int(piece.sizes.max()) if len(piece.sizes) else 0


def write_run(run: list[Varint | Fixed | Const], n: int) -> pa.BinaryArray:
    """A binary array whose row ``i`` is the run's pieces at row ``i``, one after another.

    Each piece gets as many columns of one (n, width) uint8 matrix as its widest row (a varint one 7-bit
    group a column, numpy doing a whole column at once), and a mask marks the bytes that exist; the
    present bytes, read row by row, are the data.  :class:`Overflow` if it would pass 2 GiB.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    widths = [_width(p) for p in run]
    total = sum(widths)
    matrix = np.empty((n, total), dtype=np.uint8)
    present: Bools | None = None
    lengths = np.zeros(n, dtype=np.int64)

    def mask() -> Bools:
        nonlocal present
        if present is None:
            present = np.ones((n, total), dtype=np.bool_)
        return present

    column = 0
    for piece, width in zip(run, widths, strict=True):
        if width == 0:
            continue
        end = column + width
        if isinstance(piece, Const):
            matrix[:, column:end] = np.frombuffer(piece.data, dtype=np.uint8)
            lengths += width
        elif isinstance(piece, Fixed):
            matrix[:, column:end] = piece.data
            if piece.present is None:
                lengths += width
            elif piece.present.ndim == 1:
                mask()[:, column:end] = piece.present[:, None]
                lengths += piece.present * width
            else:
                mask()[:, column:end] = piece.present
                lengths += piece.present.sum(axis=1)
        else:
            u, sizes = piece.u, piece.sizes
            shortest = int(sizes.min())
            if width == 1 and shortest == 1:
                matrix[:, column] = u  # < 0x80
            else:
                for group in range(width):
                    byte = (u >> np.uint64(7 * group)).astype(np.uint8) & np.uint8(0x7F)
                    if group + 1 < shortest:
                        byte |= np.uint8(0x80)
                    elif group + 1 < width:
                        byte |= (sizes > group + 1).view(np.uint8) << np.uint8(7)
                    if group >= shortest:
                        mask()[:, column + group] = sizes > group
                    matrix[:, column + group] = byte
            lengths += sizes
        column = end
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if int(offsets[-1]) > INT32_MAX:
        raise Overflow
    if present is None:
        data = pa.py_buffer(matrix)
    else:  # Arrow's filter takes a bitmap and beats numpy's boolean indexing by about 2x
        bits = np.packbits(present.ravel(), bitorder="little")
        bitmap = pa.Array.from_buffers(pa.bool_(), present.size, [None, pa.py_buffer(bits)])
        kept = pc.filter(pa.array(matrix.ravel()), bitmap)
        data = kept.buffers()[1].slice(kept.offset, len(kept))
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)), data])


def _data_size(array: pa.Array) -> int:
    """Bytes between a binary or large_binary array's first and last offsets."""
    import numpy as np
    import pyarrow as pa

    dtype = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets = np.frombuffer(array.buffers()[1], dtype=dtype, count=array.offset + len(array) + 1)
    return int(offsets[-1]) - int(offsets[array.offset])


# A binary array whose rows all have one width up to this many bytes is written into the run's byte matrix
# (a numpy view of its data) instead of being joined by Arrow: a fixed-width key or header costs a column
# copy, not a join.  Wider rows stay Arrow's: the matrix is filtered byte by byte where varints vary in size.
FIXED_MAX_BYTES = 32


def _as_fixed(array: pa.Array) -> pa.Array | Fixed:
    """``array`` as a :class:`Fixed` piece when no row is null and every row is 1 to ``FIXED_MAX_BYTES``
    bytes long, all alike; else as it is."""
    import numpy as np
    import pyarrow as pa

    n = len(array)
    if not n or array.null_count or not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
        return array
    dtype = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets = np.frombuffer(array.buffers()[1], dtype=dtype, count=array.offset + n + 1)[array.offset :]
    first, last = int(offsets[0]), int(offsets[-1])
    width, rest = divmod(last - first, n)
    if rest or not 0 < width <= FIXED_MAX_BYTES or not (np.diff(offsets) == width).all():
        return array
    data = np.frombuffer(array.buffers()[2], dtype=np.uint8, count=last - first, offset=first)
    return Fixed(data.reshape(n, width))


def join_rows(items: list[Varint | Fixed | Const | pa.Array], n: int) -> pa.BinaryArray:
    """A binary array whose row ``i`` is every item's row ``i``, one after another.

    Runs of adjacent pieces are written by :func:`write_run`; binary arrays holding no bytes are dropped
    (a null row contributes nothing); Arrow joins what is left.  :class:`Overflow` past 2 GiB.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays: list[pa.Array] = []
    run: list[Varint | Fixed | Const] = []
    for item in items:
        if not isinstance(item, (Varint, Fixed, Const)):
            item = _as_fixed(item)
        if isinstance(item, (Varint, Fixed, Const)):
            run.append(item)
        elif _data_size(item):
            if pa.types.is_large_binary(item.type):
                if _data_size(item) > INT32_MAX:
                    raise Overflow
                item = item.cast(pa.binary())
            if run:
                arrays.append(write_run(run, n))
                run = []
            arrays.append(item)
    if run:
        arrays.append(write_run(run, n))
    if not arrays:
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.zeros(n + 1, dtype=np.int32)),
                                                      pa.py_buffer(b"")])
    if len(arrays) == 1:
        return arrays[0]
    if sum(_data_size(a) for a in arrays) > INT32_MAX:
        raise Overflow
    try:
        return pc.binary_join_element_wise(*arrays, b"", null_handling="replace", null_replacement="")
    except (pa.ArrowCapacityError, pa.ArrowInvalid) as e:
        if "overflow" in str(e).lower() or "capacity" in str(e).lower():
            raise Overflow from e
        raise
