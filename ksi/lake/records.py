"""A table's rows as Kafka records: per partition, in offset order, each offset once.

A table's contents are untrusted input, like bytes off the network.  Per layout (:mod:`ksi.lake.layouts`)
the columns holding partition, offset, timestamp, key, headers and value become record columns
(:class:`protocol.records.RecordColumns`), by these rules (Kafka's own conventions where a value has no
Kafka meaning):

==============================  ====================================================================
row                             record
==============================  ====================================================================
null partition or offset,       not served (it has no place in a log); counted as ``bad`` rows
negative offset or partition
null timestamp                  timestamp -1 (Kafka's "no timestamp")
null timestamp type, or not     CreateTime (0)
0/1
null key / null value           null key / null value (a tombstone)
null headers list               no headers
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

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from protocol.records import RecordColumns

from .files import column_of
from .index import timestamps_ms, valid_rows
from .layouts import ResolvedLayout
from .values import ValueEncoder

__all__ = ["PartitionRecords", "Records", "to_records"]

HEADER = pa.struct([pa.field("key", pa.binary()), pa.field("value", pa.binary())])


@dataclass(frozen=True, slots=True)
class PartitionRecords:
    """One partition's records in offset order, each offset once."""

    partition: int
    columns: RecordColumns
    timestamp_types: npt.NDArray[np.int8] | None  # None: all CreateTime


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
    if not pa.types.is_struct(entries.type) or entries.type.num_fields != 2:
        raise TypeError(f"expected headers as (key, value) pairs, got {array.type}")
    key, value = entries.flatten()  # a null entry's key and value are null
    keys, values = _binary(key), _binary(value)
    if keys.null_count:
        missing = pc.is_null(keys)
        counts["null_header_key"] += int(pc.sum(missing.cast(pa.int64())).as_py() or 0)
        keys = pc.fill_null(keys, pa.scalar(b"", pa.binary()))
    rebuilt = pa.StructArray.from_arrays([keys, values], fields=list(HEADER))
    return pa.ListArray.from_arrays(pa.array(offsets - offsets[0], pa.int32()), rebuilt, mask=array.is_null())


def _timestamp_types(rows: pa.Table, layout: ResolvedLayout) -> npt.NDArray[np.int8] | None:
    if layout.timestamp_type is None:
        return None
    types = column_of(rows, layout.timestamp_type).cast(pa.int64())
    log_append = pc.fill_null(pc.equal(types, 1), False)
    if not pc.any(log_append).as_py():
        return None
    return np.asarray(log_append.cast(pa.int8()))


def _differing(rows: pa.Table, dup: npt.NDArray[np.intp], layout: ResolvedLayout, values: pa.Array) -> npt.NDArray[np.bool_]:
    """For each duplicate row ``i`` (same partition and offset as row ``i - 1``): does it differ from it?"""
    before = dup - 1
    differ = np.zeros(len(dup), dtype=bool)
    picks = [values]
    for path in (layout.timestamp, layout.key, layout.headers):
        if path is not None:
            picks.append(column_of(rows, path))
    for column in picks:
        a, b = column.take(pa.array(dup)), column.take(pa.array(before))
        if pa.types.is_list(column.type) or pa.types.is_map(column.type) or pa.types.is_struct(column.type):
            differ |= np.array([x != y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)], dtype=bool)
        else:
            same = pc.fill_null(pc.equal(a, b), False)
            both_null = pc.and_(pc.is_null(a), pc.is_null(b))
            differ |= ~np.asarray(pc.or_(same, both_null))
    return differ


def to_records(rows: pa.Table, layout: ResolvedLayout, values: ValueEncoder, caps: dict[int, int] | None = None,
               partitions: set[int] | None = None) -> Records:
    """Rows of a table (any partitions, any order) as records per partition.

    ``partitions``: keep only these; ``caps``: per partition, the first offset not to serve (the broker's
    log start, when the lake must not answer for offsets the broker holds; None: no caps)."""
    out = Records()
    if rows.num_rows == 0:
        return out
    p = column_of(rows, layout.partition).cast(pa.int32())
    o = column_of(rows, layout.offset).cast(pa.int64())
    ok = valid_rows(p, o)
    bad = rows.num_rows - int(pc.sum(ok.cast(pa.int64())).as_py() or 0)
    if bad:
        out.counts["bad"] += bad
    if partitions is not None:
        ok = pc.and_(ok, pc.is_in(p, pa.array(sorted(partitions), pa.int32())))
    if caps:
        cap = pc.fill_null(pc.index_in(p, pa.array(list(caps), pa.int32())), -1)
        limits = pa.array(np.append(np.array(list(caps.values()), np.int64), np.iinfo(np.int64).max))
        ok = pc.and_(ok, pc.less(o, pc.take(limits, pc.if_else(pc.equal(cap, -1), len(caps), cap))))
    if not pc.all(ok).as_py():
        rows, p, o = rows.filter(ok), p.filter(ok), o.filter(ok)
    if rows.num_rows == 0:
        return out
    # Sort by (partition, offset), stable: rows of the same offset keep their order (file order first).
    order = pc.sort_indices(pa.table({"p": p, "o": o}), sort_keys=[("p", "ascending"), ("o", "ascending")])
    p_sorted = np.asarray(p.take(order))
    o_sorted = np.asarray(o.take(order))
    if not (np.all(order.to_numpy()[1:] > order.to_numpy()[:-1])):
        rows = rows.take(order)
    value_bytes = values.values(
        column_of(rows, layout.raw_value) if layout.raw_value else None,
        column_of(rows, layout.schema_id) if layout.schema_id else None,
        pa.StructArray.from_arrays([column_of(rows, c) for c in layout.value_columns], names=list(layout.value_columns))
        if layout.value_columns else None,
    )
    same = (p_sorted[1:] == p_sorted[:-1]) & (o_sorted[1:] == o_sorted[:-1])
    if same.any():
        dup = np.flatnonzero(same) + 1
        differ = _differing(rows, dup, layout, value_bytes)
        out.counts["duplicate"] += len(dup)
        if differ.any():
            out.counts["differing_duplicate"] += int(differ.sum())
            out.differing += [(int(p_sorted[i]), int(o_sorted[i])) for i in dup[differ][:20]]
        keep = np.ones(len(p_sorted), dtype=bool)
        keep[dup] = False
        mask = pa.array(keep)
        rows, value_bytes = rows.filter(mask), value_bytes.filter(mask)
        p_sorted, o_sorted = p_sorted[keep], o_sorted[keep]
    n = rows.num_rows
    if layout.timestamp is not None:
        timestamps = np.asarray(pc.fill_null(timestamps_ms(column_of(rows, layout.timestamp)), -1))
    else:
        timestamps = np.full(n, -1, dtype=np.int64)
    keys = _binary(column_of(rows, layout.key)) if layout.key else pa.nulls(n, pa.binary())
    headers = _headers(column_of(rows, layout.headers), out.counts) if layout.headers else None
    types = _timestamp_types(rows, layout)
    bounds = np.flatnonzero(np.diff(p_sorted)) + 1
    for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [n])), strict=True):
        lo, hi = int(lo), int(hi)
        columns = RecordColumns(
            offsets=o_sorted[lo:hi], timestamps=timestamps[lo:hi], keys=keys.slice(lo, hi - lo),
            values=value_bytes.slice(lo, hi - lo), headers=None if headers is None else headers.slice(lo, hi - lo))
        out.partitions[int(p_sorted[lo])] = PartitionRecords(
            int(p_sorted[lo]), columns, None if types is None else types[lo:hi])
    return out
