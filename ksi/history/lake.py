"""Reading a topic's history from its Iceberg table through PyIceberg, in bounded memory.

Everything here is blocking (PyIceberg and Arrow); the proxy calls it through
``trio.to_thread.run_sync`` with a limiter, never on the event loop.

* :meth:`LakeTopic.offset_ranges` answers "which offsets does the lake hold per partition" from the
  data files' column statistics (Iceberg metadata only), falling back to a two-column scan for files
  that mix partitions (foreign layouts that are not partitioned by Kafka partition).
* :meth:`LakeTopic.read_range` returns the rows of one partition in an offset window, sorted by offset,
  as record columns: only the files and row groups whose statistics overlap the window are read.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import from_bytes
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan

from protocol.records import RecordColumns

from ..config import TopicConfig
from ..registry.client import RegistryClient
from .layouts import LayoutError, ResolvedLayout, resolve
from .values import ValueEncoder, ValuesError

__all__ = ["LakeError", "LakeRows", "LakeTopic", "LakeUnavailable", "OffsetRange", "brief_error"]

log = logging.getLogger("ksi.history")


class LakeError(Exception):
    """The lake cannot answer for a topic: missing table, wrong layout, unsupported values, catalog down."""


class LakeUnavailable(LakeError):
    """The lake could not be asked (catalog or storage unreachable, failing): a fault that passes, unlike a
    missing table or a layout that does not match."""


def brief_error(exc: BaseException) -> str:
    """An exception in one line: SQLAlchemy's carry the SQL statement and a link on further lines."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@dataclass(frozen=True, slots=True)
class OffsetRange:
    first: int  # first offset the lake holds
    last: int   # last offset the lake holds

    @property
    def next(self) -> int:
        return self.last + 1


@dataclass(frozen=True, slots=True)
class LakeRows:
    """Rows read for one partition: the record columns and each row's timestamp type (None: CreateTime)."""

    columns: RecordColumns
    timestamp_types: np.ndarray | None = None


def _path_array(batch: pa.RecordBatch | pa.Table, path: str) -> pa.Array:
    parts = path.split(".")
    column = batch.column(parts[0])
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    for part in parts[1:]:
        column = pc.struct_field(column, part)
    return column


class LakeTopic:
    """One configured topic's Iceberg table."""

    def __init__(self, catalog: Catalog, topic: TopicConfig, registry: RegistryClient | None = None) -> None:
        self.topic = topic
        self._catalog = catalog
        self._values_encoder = ValueEncoder(topic.name, topic.table, registry)
        self._table: Any = None
        self._layout: ResolvedLayout | None = None
        self._ranges: dict[int, OffsetRange] | None = None
        self._ranges_snapshot: int | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.topic.name

    @property
    def layout(self) -> ResolvedLayout:
        if self._layout is None:
            self.load()
        assert self._layout is not None
        return self._layout

    def load(self) -> None:
        """Load the table and check its layout; raise LakeError naming the topic and table."""
        try:
            table = self._catalog.load_table(self.topic.table)
        except NoSuchTableError:
            raise LakeError(f"topic {self.topic.name}: table {self.topic.table} does not exist in the catalog") from None
        except Exception as exc:  # the catalog's own errors: connection refused, bad URI, ...
            raise LakeUnavailable(f"topic {self.topic.name}: cannot load table {self.topic.table} from the"
                                  f" catalog: {brief_error(exc)}") from exc
        try:
            layout = resolve(self.topic.layout, table.schema(), self.topic.table)
        except LayoutError as exc:
            raise LakeError(f"topic {self.topic.name}: {exc}") from None
        self._table, self._layout = table, layout

    def refresh(self) -> int | None:
        """Pick up new snapshots; returns the current snapshot id."""
        with self._lock:
            if self._table is None:
                self.load()
            else:
                try:
                    self._table = self._table.refresh()
                except Exception as exc:
                    raise LakeUnavailable(f"topic {self.topic.name}: cannot refresh table {self.topic.table}"
                                          f" from the catalog: {brief_error(exc)}") from exc
            snapshot = self._table.current_snapshot()
            return snapshot.snapshot_id if snapshot is not None else None

    @property
    def snapshot_id(self) -> int | None:
        """The snapshot the last :meth:`offset_ranges` answered from."""
        return self._ranges_snapshot

    # -- offsets -------------------------------------------------------------------------------

    def offset_ranges(self) -> dict[int, OffsetRange]:
        """Per Kafka partition, the offsets the lake holds (as of the current snapshot)."""
        snapshot_id = self.refresh()
        if self._ranges is not None and snapshot_id == self._ranges_snapshot:
            return self._ranges
        try:
            ranges = self._compute_ranges() if snapshot_id is not None else {}
        except LakeError:
            raise
        except Exception as exc:  # the manifests could not be read: storage unreachable, files gone
            raise LakeUnavailable(f"topic {self.topic.name}: cannot read the offsets of table {self.topic.table}"
                                  f" (snapshot {snapshot_id}): {type(exc).__name__}: {brief_error(exc)}") from exc
        self._ranges, self._ranges_snapshot = ranges, snapshot_id
        return ranges

    def _compute_ranges(self) -> dict[int, OffsetRange]:
        layout = self.layout
        schema = self._table.schema()
        partition_field = schema.find_field(layout.partition)
        offset_field = schema.find_field(layout.offset)
        lows: dict[int, int] = {}
        highs: dict[int, int] = {}
        mixed = False
        for task in self._table.scan().plan_files():
            data_file = task.file
            if task.delete_files:
                mixed = True
                break
            bounds = [data_file.lower_bounds or {}, data_file.upper_bounds or {}]
            try:
                p_lo, p_hi = (from_bytes(partition_field.field_type, b[partition_field.field_id]) for b in bounds)
                o_lo, o_hi = (from_bytes(offset_field.field_type, b[offset_field.field_id]) for b in bounds)
            except KeyError:
                mixed = True  # no statistics for these columns
                break
            if p_lo != p_hi:
                mixed = True
                break
            lows[p_lo] = min(lows.get(p_lo, o_lo), o_lo)
            highs[p_lo] = max(highs.get(p_lo, o_hi), o_hi)
        if mixed:
            return self._scan_ranges()
        return {p: OffsetRange(lows[p], highs[p]) for p in lows}

    def _scan_ranges(self) -> dict[int, OffsetRange]:
        layout = self.layout
        roots = tuple(dict.fromkeys([layout.partition.split(".")[0], layout.offset.split(".")[0]]))
        ranges: dict[int, OffsetRange] = {}
        for batch in self._table.scan(selected_fields=roots).to_arrow_batch_reader():
            if batch.num_rows == 0:
                continue
            table = pa.table({"p": _path_array(batch, layout.partition), "o": _path_array(batch, layout.offset)})
            grouped = table.group_by("p").aggregate([("o", "min"), ("o", "max")])
            for p, lo, hi in zip(*(grouped.column(c).to_pylist() for c in ("p", "o_min", "o_max")), strict=True):
                known = ranges.get(p)
                ranges[p] = OffsetRange(lo, hi) if known is None else OffsetRange(min(lo, known.first),
                                                                                  max(hi, known.last))
        return ranges

    def offset_for_timestamp(self, partition: int, timestamp_ms: int) -> tuple[int, int] | None:
        """The first offset whose timestamp is >= ``timestamp_ms`` and that record's timestamp, in the
        snapshot the last :meth:`offset_ranges` answered from (no catalog call: the offsets and the lookups
        served agree, and a catalog that is down or hangs does not hold a lookup).

        Kafka timestamps are not monotonic within a partition, so this is the smallest offset among all
        rows at or after the time, not a binary search.  Files are pruned by their timestamp statistics.
        """
        layout = self.layout
        if layout.timestamp is None:
            return None
        if self._table is None:
            raise LakeUnavailable(f"topic {self.topic.name}: table {self.topic.table} is not loaded")
        return self._offset_for_timestamp(partition, timestamp_ms)

    def _offset_for_timestamp(self, partition: int, timestamp_ms: int) -> tuple[int, int] | None:
        try:
            return self._scan_for_timestamp(partition, timestamp_ms)
        except LakeError:
            raise
        except Exception as exc:  # storage unreachable, files gone
            raise LakeUnavailable(f"topic {self.topic.name}: cannot look up timestamp {timestamp_ms} in partition"
                                  f" {partition} of table {self.topic.table}: {type(exc).__name__}: {brief_error(exc)}"
                                  ) from exc

    def _scan_for_timestamp(self, partition: int, timestamp_ms: int) -> tuple[int, int] | None:
        layout = self.layout
        assert layout.timestamp is not None
        field = self._table.schema().find_field(layout.timestamp)
        bound: Any = timestamp_ms
        if "timestamp" in str(field.field_type):
            bound = timestamp_ms * 1000  # Iceberg timestamps are microseconds
        expression = And(EqualTo(layout.partition, partition), GreaterThanOrEqual(layout.timestamp, bound))
        roots = tuple(dict.fromkeys(p.split(".")[0] for p in (layout.offset, layout.timestamp)))
        best: tuple[int, int] | None = None
        for batch in self._table.scan(row_filter=expression, selected_fields=roots).to_arrow_batch_reader():
            if batch.num_rows == 0:
                continue
            offsets = _path_array(batch, layout.offset)
            i = pc.index(offsets, pc.min(offsets)).as_py()
            candidate = int(offsets[i].as_py())
            if best is None or candidate < best[0]:
                ts = _path_array(batch, layout.timestamp)[i]
                value = ts.value if hasattr(ts, "value") else ts.as_py()
                ts_ms = int(value) // 1000 if pa.types.is_timestamp(ts.type) else int(value)
                best = (candidate, ts_ms)
        return best

    # -- records -------------------------------------------------------------------------------

    def _filter(self, partition: int, start: int, stop: int | None) -> Any:
        layout = self.layout
        expression: Any = And(EqualTo(layout.partition, partition), GreaterThanOrEqual(layout.offset, start))
        if stop is not None:
            expression = And(expression, LessThan(layout.offset, stop))
        return expression

    def _scan(self, partition: int, start: int, stop: int | None) -> pa.Table:
        scan = self._table.scan(row_filter=self._filter(partition, start, stop),
                                selected_fields=self.layout.selected_fields())
        batches = list(scan.to_arrow_batch_reader())
        if not batches:
            return pa.table({})
        table = pa.Table.from_batches(batches).combine_chunks()
        offsets = np.asarray(_path_array(table, self.layout.offset).cast(pa.int64()))
        if len(offsets) < 2 or bool((offsets[1:] > offsets[:-1]).all()):
            return table  # ksi tables are written sorted by offset: no reordering copy
        return table.take(pa.array(np.argsort(offsets, kind="stable")))

    def read_range(self, partition: int, start: int, stop: int) -> LakeRows | None:
        """The rows of ``partition`` with ``start <= offset < stop``, sorted by offset (None: no rows).

        One scan: PyIceberg prunes to the data files, and Arrow to the row groups, whose statistics
        overlap the partition and the offset window.  Files that cannot be read (storage unreachable, a
        file gone) raise :class:`LakeUnavailable`: the fetch gets a retriable error, and the next one reads
        again."""
        try:
            rows = self._scan(partition, start, stop)
        except LakeError:
            raise
        except Exception as exc:
            raise LakeUnavailable(f"topic {self.topic.name}: cannot read partition {partition} offsets"
                                  f" {start}..{stop - 1} from table {self.topic.table}: {type(exc).__name__}:"
                                  f" {brief_error(exc)}") from exc
        if rows.num_rows == 0:
            return None
        timestamp_types = None
        if self.layout.timestamp_type is not None:
            types = _path_array(rows, self.layout.timestamp_type)
            if pc.any(pc.fill_null(pc.not_equal(types, 0), False)).as_py():
                timestamp_types = np.asarray(types.cast(pa.int8()).fill_null(0))
        return LakeRows(self._columns(rows), timestamp_types)

    def _columns(self, rows: pa.Table) -> RecordColumns:
        layout = self.layout
        offsets = np.asarray(_path_array(rows, layout.offset).cast(pa.int64()))
        if layout.timestamp is not None:
            ts = _path_array(rows, layout.timestamp)
            if pa.types.is_timestamp(ts.type):
                ts = pc.divide(ts.cast(pa.timestamp("us", tz=ts.type.tz)).cast(pa.int64()), 1000)
            timestamps = np.asarray(ts.cast(pa.int64()).fill_null(-1))
        else:
            timestamps = np.full(len(offsets), -1, dtype=np.int64)
        keys = _path_array(rows, layout.key) if layout.key else pa.nulls(len(offsets), pa.binary())
        headers = _path_array(rows, layout.headers) if layout.headers else None
        if headers is not None and pa.types.is_map(headers.type):
            headers = pa.ListArray.from_arrays(headers.offsets, pa.StructArray.from_arrays(
                [headers.keys, headers.items], names=["key", "value"]), mask=headers.is_null())
        values = self._values(rows)
        return RecordColumns(offsets=offsets, timestamps=timestamps, keys=keys, values=values, headers=headers)

    def _values(self, rows: pa.Table) -> pa.Array:
        layout = self.layout
        raw = _path_array(rows, layout.raw_value) if layout.raw_value else None
        schema_ids = _path_array(rows, layout.schema_id) if layout.schema_id else None
        typed = None
        if layout.value_columns:
            typed = pa.StructArray.from_arrays([_path_array(rows, c) for c in layout.value_columns],
                                               names=list(layout.value_columns))
        try:
            return self._values_encoder.values(raw, schema_ids, typed)
        except ValuesError as exc:
            raise LakeError(str(exc)) from None
