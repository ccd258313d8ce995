"""Per-row byte pieces and their assembly into one binary array: the encoder's vectorized backbone.

An Avro body is the concatenation of its fields' encodings, so the encoder turns each column into a few
*pieces*, each holding one short byte string per row, and joins the pieces row by row at the end:

    Varint   zig-zagged integers with their byte counts (0 = nothing in this row)
    Fixed    an (n, w) uint8 matrix, optionally with a presence mask (per row or per byte)
    Const    the same bytes in every row
    binary   a pa.BinaryArray (strings, bytes, an array's joined items ...)

Runs of adjacent non-binary pieces are written together into one (n, width) byte matrix, whose present
bytes read row by row are the run's data (numpy does the 7-bit groups of every varint of a column at
once; Arrow's filter drops the absent bytes).  What is left is a handful of binary arrays that Arrow's
``binary_join_element_wise`` concatenates per row.  Nothing loops over rows in Python.

Offsets are int32: when a piece or the result would pass 2 GiB, :class:`Overflow` is raised and the
encoder splits the rows.  The pieces and the matrix writer are ``protocol/varint.py``'s (record batches use
the same kernel).
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from protocol.varint import Const, Fixed, Overflow, Varint, join_rows

__all__ = [
    "Const",
    "Fixed",
    "Overflow",
    "Piece",
    "Varint",
    "as_binary",
    "binary_from",
    "binary_lengths",
    "binary_offsets",
    "join",
    "scatter",
    "slice_values",
]

I64: TypeAlias = npt.NDArray[np.int64]
Bools: TypeAlias = npt.NDArray[np.bool_]

_INT32_MAX = 2**31 - 1


Piece: TypeAlias = "Varint | Fixed | Const | pa.BinaryArray"


# -- binary arrays ---------------------------------------------------------------------------------


def as_binary(array: pa.Array) -> pa.BinaryArray:
    """A string/binary array viewed as ``pa.binary()`` (large layouts cast down; Overflow past 2 GiB)."""
    t = array.type
    if pa.types.is_binary(t):
        return array
    if pa.types.is_string(t):
        return array.view(pa.binary())
    if pa.types.is_large_string(t):
        array, t = array.view(pa.large_binary()), pa.large_binary()
    if pa.types.is_large_binary(t):
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int64, count=array.offset + len(array) + 1)
        if len(array) and int(offsets[-1]) - int(offsets[array.offset]) > _INT32_MAX:
            raise Overflow
    try:
        return array.cast(pa.binary())
    except (pa.ArrowInvalid, pa.ArrowCapacityError) as e:
        raise Overflow from e


def binary_offsets(array: pa.Array) -> npt.NDArray[np.int32]:
    """The ``len + 1`` offsets of a binary array's rows (into its data buffer, not rebased)."""
    offsets: npt.NDArray[np.int32] = np.frombuffer(
        array.buffers()[1], dtype=np.int32, count=array.offset + len(array) + 1
    )
    return offsets[array.offset :]


def binary_lengths(array: pa.Array) -> I64:
    """Byte length of each row of a binary array (without nulls: a null's slot may have any length)."""
    return np.diff(binary_offsets(array)).astype(np.int64)


def binary_from(offsets: npt.NDArray[Any], data: pa.Buffer | None) -> pa.BinaryArray:
    """A binary array over ``data`` from ``len + 1`` offsets (int64 checked to fit int32)."""
    n = len(offsets) - 1
    if offsets.dtype != np.int32:
        if int(offsets[-1]) > _INT32_MAX:
            raise Overflow
        offsets = offsets.astype(np.int32)
    if data is None:
        data = pa.py_buffer(b"")
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), data])


def slice_values(array: pa.Array, values: pa.Array) -> tuple[I64, pa.Array]:
    """A list-like array's offsets rebased to 0 and the matching slice of its child ``values``."""
    offsets = np.asarray(array.offsets, dtype=np.int64)
    start = int(offsets[0]) if len(offsets) else 0
    stop = int(offsets[-1]) if len(offsets) else 0
    return offsets - start, values.slice(start, stop - start)


# -- assembly --------------------------------------------------------------------------------------


def join(pieces: list[Piece], n: int) -> pa.BinaryArray:
    """A binary array whose row ``i`` is every piece's row ``i``, one after another."""
    return join_rows(list(pieces), n)


def scatter(pieces: list[Piece], valid: Bools) -> list[Piece]:
    """Pieces computed for the rows where ``valid`` is true, spread out to all rows (empty elsewhere)."""
    n = len(valid)
    out: list[Piece] = []
    for piece in pieces:
        if isinstance(piece, Const):
            row = np.frombuffer(piece.data, dtype=np.uint8)
            out.append(Fixed(np.broadcast_to(row, (n, len(row))), valid))
        elif isinstance(piece, Fixed):
            data = np.zeros((n, piece.data.shape[1]), dtype=np.uint8)
            data[valid] = piece.data
            if piece.present is None:
                present: Bools = valid
            else:
                present = np.zeros((n, *piece.present.shape[1:]), dtype=np.bool_)
                present[valid] = piece.present
            out.append(Fixed(data, present))
        elif isinstance(piece, Varint):
            u = np.zeros(n, dtype=np.uint64)
            sizes = np.zeros(n, dtype=np.int64)
            u[valid] = piece.u
            sizes[valid] = piece.sizes
            out.append(Varint(u, sizes))
        else:
            lengths = np.zeros(n, dtype=np.int64)
            lengths[valid] = binary_lengths(piece)
            offsets = np.empty(n + 1, dtype=np.int64)
            offsets[0] = binary_offsets(piece)[0] if len(piece) else 0
            np.cumsum(lengths, out=offsets[1:])
            offsets[1:] += offsets[0]
            out.append(binary_from(offsets, piece.buffers()[2]))
    return out
