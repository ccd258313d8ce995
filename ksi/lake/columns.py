"""One partition's records as columns: what the lake reads out of a table's rows, in offset order.

The Kafka side encodes these into record batches (``protocol.records.encode_batches`` takes any value of
this shape, its :class:`protocol.records.RecordColumns`); the lake side only builds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["Columns"]

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Columns:
    """The records of one partition, as columns; row ``i`` is the record at ``offsets[i]``.

    ``offsets`` are the original Kafka offsets, strictly increasing (gaps allowed); ``timestamps`` are
    epoch milliseconds.  ``keys`` and ``values`` are binary or large_binary, nullable.  ``headers`` is a
    list<struct<key: string, value: binary>> array (a null list counts as no headers), or ``None``.
    """

    offsets: I64
    timestamps: I64
    keys: pa.Array
    values: pa.Array
    headers: pa.Array | None = None

    def __post_init__(self) -> None:
        n = len(self.offsets)
        if len(self.timestamps) != n or len(self.keys) != n or len(self.values) != n or (
            self.headers is not None and len(self.headers) != n
        ):
            raise ValueError("Columns: columns differ in length")

    def __len__(self) -> int:
        return len(self.offsets)

    def slice(self, start: int, stop: int) -> Columns:
        """Rows ``start:stop`` (no copies)."""
        start, stop, _ = slice(start, stop).indices(len(self))
        stop = max(start, stop)
        return Columns(
            self.offsets[start:stop],
            self.timestamps[start:stop],
            self.keys.slice(start, stop - start),
            self.values.slice(start, stop - start),
            None if self.headers is None else self.headers.slice(start, stop - start),
        )
