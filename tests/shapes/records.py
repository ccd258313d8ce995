"""Kafka records as Arrow columns: what a topic held, before any writer touched it.

:class:`KafkaRecords` is the input of every builder in this package (and what a table is compared
against when read back).  :func:`synthetic` makes a topic's records vectorized (numpy, no Python loop
per record); :func:`synthetic_slices` yields a large topic slice by slice so a 10M-row build never holds
more than one slice of records.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "HEADERS_TYPE",
    "HEADER_TYPE",
    "KafkaRecords",
    "as_slices",
    "synthetic",
    "synthetic_slices",
    "typed_values",
]

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE))

CREATE_TIME, LOG_APPEND_TIME = 0, 1


def _array(values: object, kind: pa.DataType) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values if values.type == kind else values.cast(kind)
    return pa.array(values, type=kind)


@dataclass(frozen=True)
class KafkaRecords:
    """One topic's records, one Arrow array per field, all the same length, in any order.

    ``headers`` null and an empty list mean the same (a Kafka record always has a header array);
    ``timestamp_type`` None means all CreateTime; ``typed`` is the decoded value (a StructArray, null
    where the value is null) for layouts that keep typed columns."""

    partition: pa.Array                 # int32
    offset: pa.Array                    # int64
    timestamp_ms: pa.Array              # int64, ms since the epoch
    key: pa.Array                       # binary, nullable
    value: pa.Array                     # binary, nullable (null = tombstone)
    headers: pa.Array                   # list<struct<key: string, value: binary>>, nullable
    timestamp_type: pa.Array | None = None   # int8: 0 CreateTime, 1 LogAppendTime
    typed: pa.StructArray | None = None      # the decoded value, nullable
    topic: str = "topic"

    def __post_init__(self) -> None:
        object.__setattr__(self, "partition", _array(self.partition, pa.int32()))
        object.__setattr__(self, "offset", _array(self.offset, pa.int64()))
        object.__setattr__(self, "timestamp_ms", _array(self.timestamp_ms, pa.int64()))
        object.__setattr__(self, "key", _array(self.key, pa.binary()))
        object.__setattr__(self, "value", _array(self.value, pa.binary()))
        object.__setattr__(self, "headers", _array(self.headers, HEADERS_TYPE))
        if self.timestamp_type is not None:
            object.__setattr__(self, "timestamp_type", _array(self.timestamp_type, pa.int8()))
        if self.typed is not None and isinstance(self.typed, pa.ChunkedArray):
            object.__setattr__(self, "typed", self.typed.combine_chunks())
        n = len(self.partition)
        for name in ("offset", "timestamp_ms", "key", "value", "headers", "timestamp_type", "typed"):
            column = getattr(self, name)
            if column is not None and len(column) != n:
                raise ValueError(f"KafkaRecords.{name} has {len(column)} rows, partition has {n}")

    def __len__(self) -> int:
        return len(self.partition)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._columns().values())

    def _columns(self) -> dict[str, pa.Array]:
        columns = {"partition": self.partition, "offset": self.offset, "timestamp_ms": self.timestamp_ms,
                   "key": self.key, "value": self.value, "headers": self.headers}
        if self.timestamp_type is not None:
            columns["timestamp_type"] = self.timestamp_type
        if self.typed is not None:
            columns["typed"] = self.typed
        return columns

    def timestamp_types(self) -> pa.Array:
        """``timestamp_type`` with the default (all CreateTime) filled in."""
        if self.timestamp_type is not None:
            return self.timestamp_type
        return pa.array(np.zeros(len(self), dtype=np.int8))

    def to_table(self) -> pa.Table:
        return pa.table(self._columns())

    def take(self, indices: object) -> KafkaRecords:
        idx = _array(indices, pa.int64())
        return self._map(lambda c: c.take(idx))

    def filter(self, mask: object) -> KafkaRecords:
        m = _array(mask, pa.bool_())
        return self._map(lambda c: c.filter(m))

    def slice(self, start: int, length: int | None = None) -> KafkaRecords:
        return self._map(lambda c: c.slice(start, length))

    def _map(self, fn: object) -> KafkaRecords:
        cols = {name: fn(col) for name, col in self._columns().items()}  # type: ignore[operator]
        return replace(self, **cols)

    def sorted(self) -> KafkaRecords:
        """Sorted by (partition, offset), stable (duplicates keep their order)."""
        order = pc.sort_indices(pa.table({"p": self.partition, "o": self.offset}),
                                sort_keys=[("p", "ascending"), ("o", "ascending")])
        return self.take(order)

    @classmethod
    def concat(cls, parts: Sequence[KafkaRecords]) -> KafkaRecords:
        if not parts:
            raise ValueError("KafkaRecords.concat needs at least one part")
        first = parts[0]
        with_tt = any(p.timestamp_type is not None for p in parts)
        cols: dict[str, object] = {}
        for name in ("partition", "offset", "timestamp_ms", "key", "value", "headers"):
            cols[name] = pa.concat_arrays([getattr(p, name) for p in parts])
        if with_tt:
            cols["timestamp_type"] = pa.concat_arrays([p.timestamp_types() for p in parts])
        if first.typed is not None:
            if any(p.typed is None for p in parts):
                raise ValueError("KafkaRecords.concat: some parts have typed values and some do not")
            cols["typed"] = pa.concat_arrays([p.typed for p in parts])  # type: ignore[misc]
        return cls(topic=first.topic, **cols)  # type: ignore[arg-type]

    def rows(self) -> list[tuple[object, ...]]:
        """Python tuples (partition, offset, timestamp_ms, timestamp_type, key, value, headers), headers
        normalised (null -> []): for comparing small tables in tests."""
        tt = self.timestamp_types().to_pylist()
        headers = [[(h["key"], h["value"]) for h in hs] if hs else [] for hs in self.headers.to_pylist()]
        return list(zip(self.partition.to_pylist(), self.offset.to_pylist(), self.timestamp_ms.to_pylist(), tt,
                        self.key.to_pylist(), self.value.to_pylist(), headers, strict=True))


def as_slices(records: KafkaRecords | Iterable[KafkaRecords]) -> Iterator[KafkaRecords]:
    if isinstance(records, KafkaRecords):
        yield records
    else:
        yield from records


# ---------------------------------------------------------------------------------------------- synthetic

def _fixed_width(data: np.ndarray, width: int) -> pa.Array:
    """n values of ``width`` bytes each from a flat uint8 buffer of n * width bytes (zero copy)."""
    n = len(data) // width if width else 0
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32) if width else np.zeros(1, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def typed_values(n: int, rng: np.random.Generator, timestamp_ms: np.ndarray, first_id: int = 0) -> pa.StructArray:
    """A small decoded value per record: id long, name string, amount double, ts timestamptz (the
    event time, equal to the record timestamp: the column time-partitioned writers use)."""
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    names = pa.array(np.char.add("user-", (ids % 1000).astype("U4")).astype(object), pa.string())
    amounts = rng.random(n) * 1000.0
    ts = pa.array(timestamp_ms.astype("datetime64[ms]").astype("datetime64[us]"), pa.timestamp("us", tz="UTC"))
    return pa.StructArray.from_arrays(
        [pa.array(ids), names, pa.array(amounts), ts],
        fields=[pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
                pa.field("amount", pa.float64()), pa.field("ts", pa.timestamp("us", tz="UTC"))])


def synthetic(n: int, partitions: int = 4, *, seed: int = 0, value_bytes: int = 100, key_bytes: int = 8,
              header_value_bytes: int = 8, start_ms: int = 1_767_225_600_000, ms_per_record: float = 1.0,
              typed: bool = False, first_offsets: Sequence[int] | None = None, first_row: int = 0,
              topic: str = "topic") -> KafkaRecords:
    """``n`` records spread at random over ``partitions`` (arrival order: partitions interleaved), offsets
    contiguous per partition from ``first_offsets`` (default 0), timestamps rising ``ms_per_record`` per
    record from ``start_ms`` (2026-01-01T00:00Z), a ``key_bytes`` key, one header ``h`` and a
    ``value_bytes`` value of random bytes: about 130 bytes a record with the defaults."""
    rng = np.random.default_rng(seed)
    part = rng.integers(0, partitions, size=n, dtype=np.int32)
    offsets = np.empty(n, dtype=np.int64)
    starts = np.asarray(first_offsets if first_offsets is not None else [0] * partitions, dtype=np.int64)
    for p in range(partitions):  # a loop per partition, not per record
        mask = part == p
        offsets[mask] = starts[p] + np.arange(int(mask.sum()), dtype=np.int64)
    ts = (start_ms + (np.arange(first_row, first_row + n, dtype=np.float64) * ms_per_record)).astype(np.int64)
    keys = _fixed_width(rng.integers(0, 256, size=n * key_bytes, dtype=np.uint8), key_bytes)
    values = _fixed_width(rng.integers(0, 256, size=n * value_bytes, dtype=np.uint8), value_bytes)
    header_values = _fixed_width(rng.integers(0, 256, size=n * header_value_bytes, dtype=np.uint8),
                                 header_value_bytes)
    header_keys = pa.array(np.full(n, "h", dtype=object), pa.string())
    header_structs = pa.StructArray.from_arrays([header_keys, header_values], fields=list(HEADER_TYPE))
    headers = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), header_structs,
                                       type=HEADERS_TYPE)
    return KafkaRecords(partition=pa.array(part), offset=pa.array(offsets), timestamp_ms=pa.array(ts), key=keys,
                        value=values, headers=headers,
                        typed=typed_values(n, rng, ts, first_row) if typed else None, topic=topic)


def synthetic_slices(n: int, partitions: int = 4, *, slice_rows: int = 500_000, seed: int = 0,
                     **kwargs: object) -> Iterator[KafkaRecords]:
    """:func:`synthetic` for ``n`` records, ``slice_rows`` at a time (offsets continue across slices)."""
    next_offsets = [0] * partitions
    done = 0
    index = 0
    while done < n:
        rows = min(slice_rows, n - done)
        part = synthetic(rows, partitions, seed=seed + index, first_offsets=next_offsets, first_row=done,
                         **kwargs)  # type: ignore[arg-type]
        counts = np.bincount(part.partition.to_numpy(), minlength=partitions)
        next_offsets = [o + int(c) for o, c in zip(next_offsets, counts, strict=True)]
        yield part
        done += rows
        index += 1
