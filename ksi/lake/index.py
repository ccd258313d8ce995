"""Where each Kafka partition's offsets are in a table: per data file, row group and window.

A table written by another system rarely keeps one Kafka partition per file: one translation or bulk load
puts every partition in one row group; a streaming sink interleaves them in thousands of small files; an
``hour(timestamp)`` spec spreads one partition over many files.  Manifest column bounds (when a writer
writes them at all: Redpanda's did not before 2026) and Parquet row-group statistics describe a file or a
row group as a whole, so for such tables they cannot say which offsets of *one* partition a row group
holds.  So ksi reads each data file's index columns (partition, offset and timestamp: a few bytes a row)
once, when the file first appears in a snapshot, and keeps the result: data files never change.

* :class:`FileIndex`: per (row group, window, partition) of one file: first and last offset, rows, the
  largest timestamp; and the rows that can never be served (a null or negative offset, a null partition).
* :class:`PartitionPlan`: one partition's pieces in a snapshot, sorted by offset and grouped into
  *components*: pieces whose offset ranges overlap (an at-least-once writer's duplicates) are read
  together, so a component's rows can be sorted and de-duplicated as a whole.
* :class:`TablePlan`: a snapshot's files and partition plans.

Pure numpy/Arrow over arrays; no I/O here (the index columns come from :mod:`ksi.lake.files`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .files import DataFile, TableView

__all__ = [
    "MAX_OFFSET",
    "NO_TIMESTAMP",
    "FileIndex",
    "IndexColumns",
    "PartitionPlan",
    "Piece",
    "TablePlan",
    "WindowIndex",
    "index_window",
    "piece_key",
    "unpack_piece",
]

NO_TIMESTAMP = np.iinfo(np.int64).min
MAX_OFFSET = 1 << 62  # offsets at or above this are not served: the offset after them would overflow a Kafka long
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]


# A window of a row group of a data file as one int64: file (23 bits), row group (20), window (20).
_FILE_SHIFT, _GROUP_SHIFT, _MASK = 40, 20, (1 << 20) - 1


def piece_key(file: npt.ArrayLike, row_group: npt.ArrayLike, window: npt.ArrayLike) -> I64:
    """Windows as single int64 keys (vectorized), ordered like (file, row group, window)."""
    return ((np.asarray(file, np.int64) << _FILE_SHIFT) | (np.asarray(row_group, np.int64) << _GROUP_SHIFT)
            | np.asarray(window, np.int64))


def unpack_piece(key: int) -> tuple[int, int, int]:
    return key >> _FILE_SHIFT, (key >> _GROUP_SHIFT) & _MASK, key & _MASK


@dataclass(frozen=True, slots=True)
class IndexColumns:
    """The field ids of the columns the index reads."""

    partition: int
    offset: int
    timestamps: tuple[int, ...]   # the timestamp column and its renames, newest first (coalesced)

    @property
    def all(self) -> tuple[int, ...]:
        return (self.partition, self.offset, *self.timestamps)


def timestamps_ms(array: pa.Array) -> pa.Array:
    """Epoch milliseconds (int64) of an Iceberg timestamp column (microseconds) or a long column (ms)."""
    if pa.types.is_timestamp(array.type):
        micros = array.cast(pa.timestamp("us", tz=array.type.tz), safe=False).cast(pa.int64())
        return pc.divide(micros, 1000)  # floor for negatives is irrelevant: Kafka timestamps are >= -1
    return array.cast(pa.int64())


def timestamp_column(columns: dict[int, pa.Array], ids: IndexColumns, n: int) -> pa.Array:
    """Epoch ms per row from the timestamp column and its renames (NO_TIMESTAMP where none has one)."""
    present = [timestamps_ms(columns[i]) for i in ids.timestamps if i in columns]
    if not present:
        return pa.array(np.full(n, NO_TIMESTAMP, dtype=np.int64))
    return pc.fill_null(pc.coalesce(*present) if len(present) > 1 else present[0], NO_TIMESTAMP)


def valid_rows(partitions: pa.Array, offsets: pa.Array) -> pa.Array:
    """Rows that can be served: a partition and an offset, both non-negative (and the offset below MAX_OFFSET)."""
    ok = pc.and_(pc.is_valid(partitions), pc.is_valid(offsets))
    ok = pc.and_(ok, pc.greater_equal(pc.fill_null(offsets, -1), 0))
    ok = pc.and_(ok, pc.less(pc.fill_null(offsets, -1), MAX_OFFSET))
    return pc.and_(ok, pc.greater_equal(pc.fill_null(partitions, -1), 0))


@dataclass(frozen=True, slots=True)
class WindowIndex:
    """One window's pieces: per partition present, its first and last offset, rows and largest timestamp."""

    partition: I32
    first: I64
    last: I64
    rows: I64
    max_timestamp: I64

    def __len__(self) -> int:
        return len(self.partition)


def _int64s(array: pa.Array) -> npt.NDArray[np.int64]:
    """An integer column as int64, nulls as -1 (without Arrow's kernels when it has no nulls: a window of a
    small file costs their call overhead more than its rows)."""
    if array.null_count == 0 and pa.types.is_integer(array.type):
        return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.asarray(pc.fill_null(array.cast(pa.int64()), -1))


def index_window(columns: dict[int, pa.Array], ids: IndexColumns) -> tuple[WindowIndex, int]:
    """One window's index columns -> per partition (first, last, rows, max timestamp), and its bad rows.
    Numpy (a sort and reductions over runs): windows are small and many, and Arrow's group_by costs a
    plan per call."""
    partitions = _int64s(columns[ids.partition])
    offsets = _int64s(columns[ids.offset])
    n = len(offsets)
    ts = np.asarray(timestamp_column(columns, ids, n))
    ok = (partitions >= 0) & (offsets >= 0) & (offsets < MAX_OFFSET)
    bad = n - int(ok.sum())
    if bad:
        partitions, offsets, ts = partitions[ok], offsets[ok], ts[ok]
    if not len(partitions):
        empty32, empty64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
        return WindowIndex(empty32, empty64, empty64, empty64, empty64), bad
    if (partitions[1:] == partitions[:-1]).all():  # one partition (ksi's own files, a per-partition writer)
        return WindowIndex(partitions[:1].astype(np.int32), offsets.min(keepdims=True), offsets.max(keepdims=True),
                           np.array([len(offsets)], np.int64), ts.max(keepdims=True)), bad
    order = np.argsort(partitions, kind="stable")
    p, o, t = partitions[order], offsets[order], ts[order]
    starts = np.concatenate(([0], np.flatnonzero(p[1:] != p[:-1]) + 1))
    return WindowIndex(p[starts].astype(np.int32), np.minimum.reduceat(o, starts), np.maximum.reduceat(o, starts),
                       np.diff(np.append(starts, len(p))).astype(np.int64), np.maximum.reduceat(t, starts)), bad


@dataclass(frozen=True, slots=True, eq=False)
class FileIndex:
    """One data file's pieces: row ``i`` of the arrays is one (row group, window, partition)."""

    path: str
    row_group: I32
    window: I32
    partition: I32
    first: I64
    last: I64
    rows: I64
    max_timestamp: I64
    bad_rows: int = 0

    @classmethod
    def build(cls, path: str, windows: Iterable[tuple[int, int, WindowIndex]], bad_rows: int = 0) -> FileIndex:
        """From ``(row group, window, pieces)`` triples as :func:`index_window` makes them."""
        parts: list[tuple[int, int, WindowIndex]] = [w for w in windows if len(w[2])]
        if not parts:
            empty32, empty64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
            return cls(path, empty32, empty32, empty32, empty64, empty64, empty64, empty64, bad_rows)
        lengths = [len(g) for _, _, g in parts]
        return cls(
            path,
            np.repeat(np.array([rg for rg, _, _ in parts], np.int32), lengths),
            np.repeat(np.array([w for _, w, _ in parts], np.int32), lengths),
            np.concatenate([g.partition for _, _, g in parts]),
            np.concatenate([g.first for _, _, g in parts]),
            np.concatenate([g.last for _, _, g in parts]),
            np.concatenate([g.rows for _, _, g in parts]),
            np.concatenate([g.max_timestamp for _, _, g in parts]),
            bad_rows,
        )

    def __len__(self) -> int:
        return len(self.partition)


@dataclass(frozen=True, slots=True)
class Piece:
    """Where some of a partition's rows are: a window of a row group of a data file."""

    file: int          # index into TablePlan.files
    row_group: int
    window: int
    first: int
    last: int
    rows: int
    max_timestamp: int


@dataclass(frozen=True, slots=True, eq=False)
class PartitionPlan:
    """One partition's pieces in offset order, grouped into components (non-overlapping offset ranges)."""

    partition: int
    file: I32
    row_group: I32
    window: I32
    first: I64
    last: I64
    rows: I64
    max_timestamp: I64
    # components: pieces component_start[c]:component_start[c + 1] make component c
    component_start: I64
    component_first: I64
    component_last: I64

    @property
    def first_offset(self) -> int:
        return int(self.component_first[0])

    @property
    def last_offset(self) -> int:
        return int(self.component_last[-1])

    @property
    def components(self) -> int:
        return len(self.component_first)

    def locate(self, offset: int) -> int | None:
        """The first component holding ``offset`` or, if it falls in a hole, the next one (None: past the end)."""
        c = int(np.searchsorted(self.component_last, offset, side="left"))
        return c if c < len(self.component_last) else None

    def piece_keys(self, component: int) -> list[int]:
        """The windows holding the component, as :func:`piece_key` keys."""
        lo, hi = int(self.component_start[component]), int(self.component_start[component + 1])
        return [int(k) for k in piece_key(self.file[lo:hi], self.row_group[lo:hi], self.window[lo:hi])]

    def pieces(self, component: int) -> list[Piece]:
        lo, hi = int(self.component_start[component]), int(self.component_start[component + 1])
        return [Piece(int(self.file[i]), int(self.row_group[i]), int(self.window[i]), int(self.first[i]),
                      int(self.last[i]), int(self.rows[i]), int(self.max_timestamp[i])) for i in range(lo, hi)]

    def component_range(self, component: int) -> tuple[int, int]:
        return int(self.component_first[component]), int(self.component_last[component])

    def duplicates(self, component: int) -> bool:
        """Whether the component's pieces hold more rows than offsets could (an at-least-once writer's repeats)."""
        lo, hi = int(self.component_start[component]), int(self.component_start[component + 1])
        span = int(self.component_last[component]) - int(self.component_first[component]) + 1
        return hi - lo > 1 and int(self.rows[lo:hi].sum()) > span

    def by_timestamp(self, timestamp_ms: int) -> Iterator[Piece]:
        """Pieces that may hold a row at or after ``timestamp_ms``, in offset order (a piece whose largest
        timestamp is below it cannot; pieces without timestamps are candidates)."""
        maybe = np.flatnonzero((self.max_timestamp >= timestamp_ms) | (self.max_timestamp == NO_TIMESTAMP))
        for i in maybe:
            yield Piece(int(self.file[i]), int(self.row_group[i]), int(self.window[i]), int(self.first[i]),
                        int(self.last[i]), int(self.rows[i]), int(self.max_timestamp[i]))

    @classmethod
    def of(cls, partition: int, file: I32, row_group: I32, window: I32, first: I64, last: I64, rows: I64,
           max_timestamp: I64) -> PartitionPlan:
        order = np.lexsort((last, first))
        file, row_group, window = file[order], row_group[order], window[order]
        first, last, rows, max_timestamp = first[order], last[order], rows[order], max_timestamp[order]
        # A piece starts a new component when it begins after every piece before it has ended.
        reach = np.maximum.accumulate(last)
        starts = np.concatenate(([0], np.flatnonzero(first[1:] > reach[:-1]) + 1)).astype(np.int64)
        bounds = np.append(starts, len(first))
        component_last = np.maximum.reduceat(last, starts) if len(starts) else last[:0]
        return cls(partition, file, row_group, window, first, last, rows, max_timestamp, bounds,
                   first[starts], component_last)


@dataclass(frozen=True, slots=True, eq=False)
class TablePlan:
    """A snapshot as the cold reader sees it."""

    snapshot_id: int | None
    views: tuple[TableView, ...]     # per source (ksi.lake.planner.Source): how its files are read
    files: tuple[DataFile, ...]
    partitions: dict[int, PartitionPlan] = field(default_factory=dict)
    bad_rows: int = 0
    window_rows: dict[int, int] = field(default_factory=dict)  # piece key -> rows of every partition in it
    writer_next: dict[int, int] | None = None  # the writer's next offset per partition (ksi.lake.commits)
    lost: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # offsets ksi's archive recorded lost
    unavailable: dict[int, str] = field(default_factory=dict)  # partition -> why (an unreadable data file)
    all_unavailable: str | None = None                          # ... every partition (the file's are unknown)

    @property
    def broken(self) -> bool:
        return bool(self.unavailable) or self.all_unavailable is not None

    @classmethod
    def build(cls, snapshot_id: int | None, views: tuple[TableView, ...], files: tuple[DataFile, ...],
              indexes: list[FileIndex], writer_next: dict[int, int] | None = None,
              lost: dict[int, list[tuple[int, int]]] | None = None) -> TablePlan:
        if not indexes or not sum(len(i) for i in indexes):
            return cls(snapshot_id, views, files, {}, sum(i.bad_rows for i in indexes), {}, writer_next, lost or {})
        numbers = np.concatenate([np.full(len(ix), n, np.int32) for n, ix in enumerate(indexes)])
        columns = {name: np.concatenate([getattr(ix, name) for ix in indexes])
                   for name in ("row_group", "window", "partition", "first", "last", "rows", "max_timestamp")}
        keys = piece_key(numbers, columns["row_group"], columns["window"])
        unique, inverse = np.unique(keys, return_inverse=True)
        window_rows = dict(zip(unique.tolist(), np.bincount(inverse, weights=columns["rows"]).astype(np.int64).tolist(),
                               strict=True))
        plans = {}
        for p in np.unique(columns["partition"]):
            mine = columns["partition"] == p
            plans[int(p)] = PartitionPlan.of(int(p), numbers[mine], columns["row_group"][mine],
                                             columns["window"][mine], columns["first"][mine],
                                             columns["last"][mine], columns["rows"][mine],
                                             columns["max_timestamp"][mine])
        return cls(snapshot_id, views, files, plans, sum(i.bad_rows for i in indexes), window_rows, writer_next,
                   lost or {})

    def complete_components(self, windows: I64) -> dict[int, list[int]]:
        """Per partition, the components all of whose pieces lie in ``windows`` (piece keys)."""
        out: dict[int, list[int]] = {}
        for p, plan in self.partitions.items():
            present = np.isin(piece_key(plan.file, plan.row_group, plan.window), windows)
            if not present.any():
                continue
            complete = np.flatnonzero(np.logical_and.reduceat(present, plan.component_start[:-1].astype(np.intp)))
            if len(complete):
                out[p] = complete.tolist()
        return out

    def ranges(self) -> dict[int, tuple[int, int]]:
        """Per partition: the first and last offset the snapshot holds."""
        return {p: (plan.first_offset, plan.last_offset) for p, plan in self.partitions.items()}
