"""A table's rows as Kafka records: per partition, in offset order, each offset once.

A table's contents are untrusted input, like bytes off the network.  Per layout (:mod:`ksi.lake.layouts`)
the columns holding partition, offset, timestamp, key, headers and value become record columns
(:class:`ksi.lake.columns.Columns`), by these rules (Kafka's own conventions where a value has no
Kafka meaning):

==============================  ====================================================================
row                             record
==============================  ====================================================================
null partition or offset,       not served (it has no place in a log); counted as ``bad`` rows
negative offset or partition,
offset of 2**62 or more
null timestamp                  timestamp -1 (Kafka's "no timestamp")
null timestamp type, or not     CreateTime (0)
0/1
null key / null value           null key / null value (a tombstone)
null headers list               no headers
null aborted marker             not aborted (only ``true`` marks a record of an aborted transaction)
null header key                 the header with an empty key (Kafka header keys are never null);
                                counted as ``null_header_key`` adjustments
the same offset twice           served once: the row of the first data file in the snapshot's order
                                (then row order); counted as ``duplicate`` rows, and as
                                ``differing_duplicate`` when the rows differ (timestamp, key, value or
                                headers)
==============================  ====================================================================

Values are the stored bytes, or typed columns re-encoded as Avro with Schema Registry framing
(:mod:`ksi.lake.values`).  Everything is column-wise (Arrow kernels, numpy); blocking (registry calls).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .columns import Columns
from .files import column_of, whole
from .index import MAX_OFFSET, timestamps_ms
from .layouts import ResolvedLayout
from .values import ValueEncoder

__all__ = ["PartitionRecords", "Records", "member", "to_records"]

HEADER = pa.struct([pa.field("key", pa.binary()), pa.field("value", pa.binary())])


@dataclass(frozen=True, slots=True)
class PartitionRecords:
    """One partition's records in offset order, each offset once."""

    partition: int
    columns: Columns
    timestamp_types: npt.NDArray[np.int8] | None  # None: all CreateTime
    aborted: npt.NDArray[np.bool_] | None = None  # per record, of an aborted transaction; None: none is


@dataclass(slots=True)
class Records:
    """What :func:`to_records` made of some rows, and what it had to leave out or adjust."""

    partitions: dict[int, PartitionRecords] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)   # bad, duplicate, differing_duplicate, null_header_key
    differing: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset) of differing duplicates


def _binary(array: pa.Array) -> pa.Array:
    t = array.type
    if pa.types.is_binary(t):
        return array
    if pa.types.is_large_binary(t) or pa.types.is_string(t) or pa.types.is_large_string(t) \
            or pa.types.is_fixed_size_binary(t):
        return array.cast(pa.binary())  # a read's columns stay far below binary's 2 GiB
    if pa.types.is_null(t):
        return pa.nulls(len(array), pa.binary())
    raise TypeError(f"expected a binary or string column, got {t}")


def _headers(array: pa.Array, counts: Counter[str]) -> pa.Array | None:
    """list<struct<key: binary, value: binary>> with null keys made empty; map<string, binary> becomes a
    list of its entries."""
    if not (pa.types.is_map(array.type) or pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        raise TypeError(f"expected a list or map of (key, value) headers, got {array.type}")
    if array.null_count == len(array):
        return None
    # The entries the rows point at (a list's or a map's values, from the first row's start to the last
    # row's end), so the offsets stay valid; entries under null rows are kept and stay unreachable.
    offsets = np.asarray(array.offsets, dtype=np.int64)
    entries = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    if not pa.types.is_struct(entries.type):
        raise TypeError(f"expected headers as (key, value) pairs, got {array.type}")
    children = dict(zip((f.name for f in entries.type), entries.flatten(), strict=True))  # null entries: null
    names = list(children)
    if pa.types.is_map(array.type):
        key_names, value_name = [names[0]], names[1]
    else:
        # "key", then a migration's renames of it ("key_v1": Redpanda v25.3), newest first
        key_names = ["key"] + sorted((n for n in names if re.fullmatch(r"key_v\d+", n)),
                                     key=lambda n: -int(n[5:]))
        key_names = [n for n in key_names if n in children]
        value_name = "value"
        if not key_names or value_name not in children:
            raise TypeError(f"expected headers as (key, value) pairs, got {array.type}")
    key_columns = [_binary(children[n]) for n in key_names]
    keys = key_columns[0] if len(key_columns) == 1 else pc.coalesce(*key_columns)  # one: no copy
    values = _binary(children[value_name])
    if keys.null_count:
        missing = pc.is_null(keys)
        counts["null_header_key"] += int(pc.sum(missing.cast(pa.int64())).as_py() or 0)
        keys = pc.fill_null(keys, pa.scalar(b"", pa.binary()))
    rebuilt = pa.StructArray.from_arrays([keys, values], fields=list(HEADER))
    return pa.ListArray.from_arrays(pa.array(offsets - offsets[0], pa.int32()), rebuilt, mask=array.is_null())


def _timestamp_types(types: pa.Array) -> npt.NDArray[np.int8] | None:
    log_append = pc.fill_null(pc.equal(types.cast(pa.int64()), 1), False)
    if not pc.any(log_append).as_py():
        return None
    return np.asarray(log_append.cast(pa.int8()))


def _ints(column: pa.Array | pa.ChunkedArray, kind: pa.DataType, fill: int) -> npt.NDArray[np.int64]:
    return np.asarray(whole(pc.fill_null(column.cast(kind), fill)))


def to_records(rows: pa.Table, layout: ResolvedLayout, values: ValueEncoder, caps: dict[int, int] | None = None,
               partitions: set[int] | None = None) -> Records:
    """Rows of a table (any partitions, any order) as records per partition.

    ``partitions``: keep only these; ``caps``: per partition, the first offset not to serve (the broker's
    log start, when the lake must not answer for offsets the broker holds; None: no caps).

    Only the columns a record needs are copied, once, into offset order; nothing else of the rows is."""
    out = Records()
    if rows.num_rows == 0:
        return out
    p_column, o_column = column_of(rows, layout.partition), column_of(rows, layout.offset)
    p = _ints(p_column, pa.int64(), -1)
    o = _ints(o_column, pa.int64(), -1)
    ok = (p >= 0) & (o >= 0) & (o < MAX_OFFSET)
    bad = len(ok) - int(ok.sum())
    if bad:
        out.counts["bad"] += bad
    if partitions is not None:
        ok &= member(p, partitions)
    for partition, cap in (caps or {}).items():
        ok &= (p != partition) | (o < cap)
    chosen = np.flatnonzero(ok)
    if not len(chosen):
        return out
    order, p_sorted, o_sorted = _offset_order(p, o, chosen)
    same = (p_sorted[1:] == p_sorted[:-1]) & (o_sorted[1:] == o_sorted[:-1])
    take = order
    dup = np.flatnonzero(same) + 1 if same.any() else None
    if dup is not None:
        out.counts["duplicate"] += len(dup)
        keep = np.ones(len(order), dtype=bool)
        keep[dup] = False
        take = order[keep]
    gather = _Gather(take)

    def leaf(path: str) -> pa.Array:
        return gather(column_of(rows, path))

    raw = leaf(layout.raw_value) if layout.raw_value else None
    schema_ids = leaf(layout.schema_id) if layout.schema_id else None
    typed = (pa.StructArray.from_arrays([leaf(c) for c in layout.value_columns], names=list(layout.value_columns))
             if layout.value_columns else None)
    value_bytes = values.values(raw, schema_ids, typed)
    n = len(take)
    if layout.timestamps:
        stamps = pc.coalesce(*(timestamps_ms(leaf(path)) for path in layout.timestamps))
        timestamps = np.asarray(pc.fill_null(stamps, -1))
    else:
        timestamps = np.full(n, -1, dtype=np.int64)
    keys = _binary(leaf(layout.key)) if layout.key else pa.nulls(n, pa.binary())
    headers = _headers(leaf(layout.headers), out.counts) if layout.headers else None
    types = _timestamp_types(leaf(layout.timestamp_type)) if layout.timestamp_type is not None else None
    aborted = _aborted(leaf(layout.aborted)) if layout.aborted is not None else None
    if dup is not None:
        _count_differing(rows, layout, values, order, dup, out)
    p_kept, o_kept = p[take], o[take]
    bounds = np.flatnonzero(np.diff(p_kept)) + 1
    for lo, hi in zip(np.concatenate(([0], bounds)).tolist(), np.concatenate((bounds, [n])).tolist(), strict=True):
        columns = Columns(
            offsets=o_kept[lo:hi], timestamps=timestamps[lo:hi], keys=keys.slice(lo, hi - lo),
            values=value_bytes.slice(lo, hi - lo), headers=None if headers is None else headers.slice(lo, hi - lo))
        mask = None if aborted is None or not aborted[lo:hi].any() else aborted[lo:hi]
        out.partitions[int(p_kept[lo])] = PartitionRecords(
            int(p_kept[lo]), columns, None if types is None else types[lo:hi], mask)
    return out


SMALL_PARTITIONS = 1 << 15  # partition numbers below this are sorted as int16 (numpy's radix sort)
MIN_RUN_ROWS = 16  # rows per run in offset order (on average) below which _run_order sorts the rows instead


def member(values: npt.NDArray[np.int64], wanted: set[int] | list[int]) -> npt.NDArray[np.bool_]:
    """``np.isin(values, wanted)`` for small non-negative ``wanted`` (partitions, component numbers), through a
    lookup table: np.isin sorts, about 1 ms for a read's 65k rows against a few partitions, 20x the lookup."""
    top = max(wanted, default=-1)
    if top < 0 or top >= 1 << 24 or min(wanted) < 0:
        return np.isin(values, np.fromiter(wanted, np.int64))
    table = np.zeros(top + 2, dtype=bool)  # the last slot: every value outside 0..top
    table[np.fromiter(wanted, np.int64)] = True
    return table[np.where((values >= 0) & (values <= top), values, top + 1)]


def _offset_order(p: npt.NDArray[np.int64], o: npt.NDArray[np.int64], chosen: npt.NDArray[np.intp],
                  ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The ``chosen`` rows in (partition, offset) order, rows of one offset in the table's order (the
    snapshot's file order first), and their partitions and offsets.  Rows nearly always come in offset
    order within each partition (writers append a partition's records in order), so a stable sort by
    partition alone (a radix sort on int16) is tried first, and np.lexsort only where that leaves some
    offsets out of order.  Where it does, the rows of each partition are nearly always a few runs in offset
    order (a streaming sink's files, each holding a stretch of every partition, read in the snapshot's file
    order): the runs are put in order (:func:`_run_order`) before a whole sort is tried."""
    p_chosen, o_chosen = p[chosen], o[chosen]
    if int(p_chosen.max()) < SMALL_PARTITIONS:
        by_partition = np.argsort(p_chosen.astype(np.int16), kind="stable")
        p_sorted, o_sorted = p_chosen[by_partition], o_chosen[by_partition]
        if ((o_sorted[1:] >= o_sorted[:-1]) | (p_sorted[1:] != p_sorted[:-1])).all():
            return chosen[by_partition], p_sorted, o_sorted
        runs = _run_order(p_sorted, o_sorted)
        if runs is not None:
            order, p_order, o_order = runs
            return chosen[by_partition[order]], p_order, o_order
    by_offset = np.lexsort((o_chosen, p_chosen))
    return chosen[by_offset], p_chosen[by_offset], o_chosen[by_offset]


def _run_order(p: npt.NDArray[np.int64], o: npt.NDArray[np.int64],
               ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """The order that sorts rows already grouped by partition by (partition, offset), and their partitions and
    offsets in that order, found by sorting their runs (stretches of consecutive offsets) by first offset
    instead of sorting the rows.  A run ends where the next offset is not the one after (two files'
    stretches that follow each other in the rows can leave a gap that a third fills).  None unless that
    gives every partition's offsets strictly increasing: where runs overlap or an offset comes twice, the
    caller's np.lexsort keeps rows of one offset in the table's order.  np.lexsort of int64 keys is two merge
    sorts of the rows: 5 ms for 64k rows of 32 files of four partitions interleaved, and about a third of the
    instructions a streaming table's read took more than a one-file table's (bench/cold.py's shapes)."""
    n = len(o)
    starts = np.flatnonzero((o[1:] != o[:-1] + 1) | (p[1:] != p[:-1])) + 1
    if len(starts) + 1 > max(1, n // MIN_RUN_ROWS):
        return None  # many short runs: sorting the rows is as cheap
    starts = np.concatenate(([0], starts))
    lengths = np.diff(np.append(starts, n))
    ranked = np.lexsort((o[starts], p[starts]))
    taken = lengths[ranked]
    order = np.repeat(starts[ranked] - (np.cumsum(taken) - taken), taken) + np.arange(n)
    p_order, o_order = p[order], o[order]
    if not ((o_order[1:] > o_order[:-1]) | (p_order[1:] != p_order[:-1])).all():
        return None
    return order, p_order, o_order


class _Gather:
    """Rows of a table's columns, by row number, as one array each.

    Where the row numbers run consecutively (files already in partition and offset order: ksi's archive, a
    file per partition, a sorted compaction) the runs are sliced, without a copy when there is one run in one
    chunk; else Arrow's ``take`` runs on the column combined first: on a chunked column (a read's windows) it
    resolves every index across the chunks and measured 3-7x slower than combining and taking (a binary
    column of 250k rows in 8 chunks: 49 ms against 7 ms)."""

    RUNS_PER_ROW = 1 / 16  # slices while there are at most this many runs per row

    def __init__(self, rows: npt.NDArray[np.int64]) -> None:
        self.rows = rows
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        n = len(rows)
        self.runs: list[tuple[int, int]] | None = None
        if len(breaks) + 1 <= max(1.0, n * self.RUNS_PER_ROW):
            bounds = np.concatenate(([0], breaks, [n])).tolist()
            self.runs = [(int(rows[a]), b - a) for a, b in itertools.pairwise(bounds)]
        self._indices: pa.Array | None = None

    def __call__(self, column: pa.Array | pa.ChunkedArray) -> pa.Array:
        if self.runs is not None:
            pieces = [whole(column.slice(start, length)) for start, length in self.runs]
            return pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)
        if self._indices is None:
            self._indices = pa.array(self.rows)
        return whole(column).take(self._indices)


def _aborted(column: pa.Array) -> npt.NDArray[np.bool_] | None:
    """The aborted-transaction marker as a numpy mask (null: not aborted); None when no row is marked."""
    marked = np.asarray(pc.fill_null(column.cast(pa.bool_()), False), dtype=bool)
    return marked if marked.any() else None


def _count_differing(rows: pa.Table, layout: ResolvedLayout, values: ValueEncoder, order: npt.NDArray[np.intp],
                     dup: npt.NDArray[np.intp], out: Records) -> None:
    """Count (and note a few of) the duplicates whose contents differ from the row before them in served
    order (the row served, or a duplicate equal to it)."""
    pairs = np.unique(np.concatenate((dup, dup - 1)))
    indices = pa.array(order[pairs])
    position = {int(i): k for k, i in enumerate(pairs)}
    local = np.array([position[int(i)] for i in dup])

    def leaf(path: str) -> pa.Array:
        return whole(column_of(rows, path).take(indices))

    raw = leaf(layout.raw_value) if layout.raw_value else None
    schema_ids = leaf(layout.schema_id) if layout.schema_id else None
    typed = (pa.StructArray.from_arrays([leaf(c) for c in layout.value_columns], names=list(layout.value_columns))
             if layout.value_columns else None)
    try:
        compared = [values.values(raw, schema_ids, typed)]
    except Exception:  # noqa: BLE001 - values that cannot be encoded are compared as stored
        compared = [c for c in (raw, schema_ids, typed) if c is not None]
    compared += [leaf(path) for path in (layout.timestamp, layout.key, layout.headers) if path is not None]
    differ = np.zeros(len(dup), dtype=bool)
    for column in compared:
        a, b = column.take(pa.array(local)), column.take(pa.array(local - 1))
        if pa.types.is_nested(a.type):
            differ |= np.array([x != y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)], dtype=bool)
        else:
            same = pc.fill_null(pc.equal(a, b), False)
            differ |= ~np.asarray(pc.or_(same, pc.and_(pc.is_null(a), pc.is_null(b))))
    if differ.any():
        out.counts["differing_duplicate"] += int(differ.sum())
        p = whole(column_of(rows, layout.partition).take(pa.array(order[dup[differ][:20]])))
        o = whole(column_of(rows, layout.offset).take(pa.array(order[dup[differ][:20]])))
        out.differing += list(zip(p.to_pylist(), o.to_pylist(), strict=True))
