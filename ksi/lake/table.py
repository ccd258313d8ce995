"""One topic's Iceberg table, as the cold reader uses it: loaded, planned once per snapshot, read in pieces.

* :meth:`LakeTable.offset_ranges` picks up the current snapshots and plans them (:mod:`ksi.lake.planner`),
  the topic's table and, for Redpanda, its ``<table>~dlq`` table of records it could not translate.
* :meth:`LakeTable.read` reads the windows that hold some partitions' components, and turns every component
  those windows hold completely, of any partition, into records: one read of a window serves every
  partition in it.  Records of several sources are merged per partition in offset order.
* :meth:`LakeTable.offset_for_timestamp` finds the first offset at or after a time from the index (the
  largest timestamp per piece) and the timestamp column of the few pieces that may hold it.

Blocking (catalog, files); the proxy calls it from worker threads.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..config import TopicConfig
from ..registry.client import RegistryClient
from .columns import Columns
from .commits import READS_TO_LOG_START
from .files import WINDOW_ROWS, Cursors, column_of
from .index import TablePlan, timestamp_column, unpack_piece, valid_rows
from .layouts import LayoutError, ResolvedLayout, resolve
from .planner import PlanError, Planner, Source, index_columns
from .records import PartitionRecords, Records, member, to_records
from .values import ValueEncoder, ValuesError

if TYPE_CHECKING:
    import numpy.typing as npt
    from pyiceberg.catalog import Catalog

__all__ = [
    "DLQ_SUFFIX",
    "LakeError",
    "LakeTable",
    "LakeUnavailable",
    "OffsetRange",
    "ReadPlan",
    "ReadResult",
    "Span",
    "brief_error",
]

log = logging.getLogger("ksi.lake")

READ_WINDOWS = 2  # a read decodes about this many windows' rows, beyond the first component asked for
FIRST_READ_WINDOWS = 8  # a read a consumer waits for (a seek, a replay's start) decodes at most this many windows
DLQ_SUFFIX = "~dlq"  # Redpanda's table of the records it could not translate


class LakeError(Exception):
    """The lake cannot answer for a topic: missing table, wrong layout, unsupported values, rows."""


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
class Span:
    """Records read for one partition: consecutive components of the plan, covering the offsets from
    ``start`` (just after the component before them, or the partition's first offset) to ``stop``
    (exclusive; capped): every record the snapshot holds in that range, each offset once."""

    partition: int
    start: int
    stop: int
    records: PartitionRecords | None   # None: no record in the range (all capped away)


@dataclass(frozen=True, slots=True)
class ReadPlan:
    windows: np.ndarray                  # piece keys of the windows to decode, in order
    served: dict[int, list[int]]         # partition -> the components the read serves


@dataclass(slots=True)
class ReadResult:
    spans: list[Span] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)       # see ksi.lake.records.Records
    differing: list[tuple[int, int]] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)        # partition -> why it could not be served


def _metadata_location(catalog: Catalog, identifier: str) -> str | None:
    """The table's current metadata file as a SQL catalog records it: one indexed query, no metadata file
    read (a table's metadata JSON grows with every snapshot kept; a streaming writer's thousand commits make
    it megabytes to parse on every refresh).  None for other catalogs: their refresh loads the table."""
    from pyiceberg.catalog.sql import IcebergTables, SqlCatalog

    if not isinstance(catalog, SqlCatalog):
        return None
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    with Session(catalog.engine) as session:
        location = session.scalar(select(IcebergTables.metadata_location).where(
            IcebergTables.catalog_name == catalog.name,
            IcebergTables.table_namespace == catalog.namespace_to_string(catalog.namespace_from(identifier)),
            IcebergTables.table_name == catalog.table_name_from(identifier)))
    return str(location) if location is not None else None


class LakeTable:
    """One configured topic's Iceberg table (and its dead letters)."""

    def __init__(self, catalog: Catalog, topic: TopicConfig, registry: RegistryClient | None = None,
                 cursors: Cursors | None = None, window_rows: int = WINDOW_ROWS) -> None:
        self.topic = topic
        self.window_rows = window_rows
        self._catalog = catalog
        self._registry = registry
        self.values = ValueEncoder(topic.name, topic.table, registry)
        self.cursors = cursors or Cursors()
        self._planner = Planner(topic.name, self.cursors, window_rows)
        self._sources: list[Source] = []
        self._snapshots: tuple[int | None, ...] = ()
        self.plan: TablePlan = TablePlan(None, (), ())
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.topic.name

    @property
    def layout(self) -> ResolvedLayout:
        if not self._sources:
            self.load()
        return self._sources[0].layout

    @property
    def snapshot_id(self) -> int | None:
        """The snapshot of the topic's table the last :meth:`offset_ranges` planned."""
        return self.plan.snapshot_id

    def _where(self) -> str:
        return f"topic {self.topic.name} (table {self.topic.table})"

    def _load_one(self, identifier: str, layout_name: str, values: ValueEncoder) -> Source:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = self._catalog.load_table(identifier)
        except NoSuchTableError:
            raise LakeError(f"topic {self.topic.name}: table {identifier} does not exist in the catalog") from None
        except Exception as exc:  # the catalog's own errors: connection refused, bad URI, ...
            raise LakeUnavailable(f"topic {self.topic.name}: cannot load table {identifier} from the"
                                  f" catalog: {brief_error(exc)}") from exc
        try:
            layout = resolve(layout_name, table.schema(), identifier)
        except LayoutError as exc:
            raise LakeError(f"topic {self.topic.name}: {exc}") from None
        return Source(identifier, table, layout, values)

    def load(self) -> None:
        """Load the table (and its dead letters) and check the layout; raise LakeError naming topic and table."""
        sources = [self._load_one(self.topic.table, self.topic.layout, self.values)]
        if self.topic.layout == "redpanda":
            dlq = self._dead_letters()
            if dlq is not None:
                sources.append(dlq)
        self._sources = sources

    def _dead_letters(self) -> Source | None:
        """Redpanda's ``<table>~dlq`` (records it could not translate, key_value layout), when it exists."""
        identifier = self.topic.table + DLQ_SUFFIX
        try:
            if not self._catalog.table_exists(identifier):
                return None
        except Exception:  # noqa: BLE001 - asked again at the next refresh
            return None
        try:
            return self._load_one(identifier, "redpanda", ValueEncoder(self.topic.name, identifier, self._registry))
        except LakeError as exc:
            log.warning("%s; its records are not merged in until it can be read", exc)
            return None

    def refresh(self) -> int | None:
        """Pick up new snapshots; returns the topic's table's current snapshot id."""
        with self._lock:
            if not self._sources:
                self.load()
            else:
                refreshed = []
                for source in self._sources:
                    try:
                        if _metadata_location(self._catalog, source.identifier) == source.table.metadata_location:
                            refreshed.append(source)  # no new snapshot: not the metadata file parsed again
                            continue
                        table = source.table.refresh()
                    except Exception as exc:
                        raise LakeUnavailable(f"topic {self.topic.name}: cannot refresh table {source.identifier}"
                                              f" from the catalog: {brief_error(exc)}") from exc
                    try:
                        layout = resolve(source.layout.name, table.schema(), source.identifier)
                    except LayoutError as exc:
                        raise LakeError(f"topic {self.topic.name}: {exc}") from None
                    refreshed.append(Source(source.identifier, table, layout, source.values))
                if self.topic.layout == "redpanda" and len(refreshed) == 1:
                    dlq = self._dead_letters()
                    if dlq is not None:
                        refreshed.append(dlq)
                self._sources = refreshed
            snapshot = self._sources[0].table.current_snapshot()
            return snapshot.snapshot_id if snapshot is not None else None

    # -- planning ------------------------------------------------------------------------------

    def offset_ranges(self) -> dict[int, OffsetRange]:
        """Per Kafka partition, the offsets the lake holds (as of the current snapshots, planned)."""
        snapshot_id = self.refresh()
        snapshots = tuple((s.table.current_snapshot() or _NoSnapshot).snapshot_id for s in self._sources)
        if snapshots != self._snapshots or not self.plan.views or self.plan.broken:
            try:
                plan = (self._planner.plan(self._sources, snapshot_id, self.topic.layout) if snapshot_id is not None
                        else TablePlan(None, (), ()))
            except PlanError as exc:
                raise LakeError(f"topic {self.topic.name}: {exc}") from None
            except LakeError:
                raise
            except Exception as exc:  # manifests or files unreadable: storage unreachable, files gone
                raise LakeUnavailable(f"topic {self.topic.name}: cannot plan table {self.topic.table} (snapshot"
                                      f" {snapshot_id}): {type(exc).__name__}: {brief_error(exc)}") from exc
            old = {v.key: v for v in self.plan.views}
            for key, view in old.items():
                if key not in {v.key for v in plan.views}:
                    self.cursors.forget(view)
            self.plan, self._snapshots = plan, snapshots
        return {p: OffsetRange(first, last) for p, (first, last) in self.plan.ranges().items()}

    def unavailable(self, partition: int) -> str | None:
        """Why the partition's lake offsets cannot be served whole right now (a data file holding some of them
        cannot be read), or None."""
        plan = self.plan
        return plan.all_unavailable or plan.unavailable.get(partition)

    def writer_next(self, partition: int) -> int | None:
        """The writer's next offset for ``partition`` as of the snapshot planned (None: it keeps none;
        ``sys.maxsize``: the writer reads every offset before retention may delete it)."""
        if self.topic.layout in READS_TO_LOG_START:
            return sys.maxsize
        state = self.plan.writer_next
        return None if state is None else state.get(partition)

    def lost(self, partition: int) -> list[tuple[int, int]]:
        """The offset ranges (first, last) of ``partition`` that ``ksi archive`` recorded as lost, as of the
        snapshot planned (:data:`ksi.lake.commits.LOST_OFFSETS`)."""
        return self.plan.lost.get(partition, [])

    # -- reading -------------------------------------------------------------------------------

    @staticmethod
    def read_plan(plan: TablePlan, partition: int, component: int, caps: dict[int, int] | None,
                  waited_for: bool = False, ahead_rows: int | None = None, max_rows: int | None = None) -> ReadPlan:
        """What a read of ``partition``'s ``component`` decodes: the windows holding it and the components after
        it (up to about READ_WINDOWS windows' rows), and what it serves: every component, of any partition,
        that those windows hold completely.  ``caps``: per partition the first offset not to serve (the
        broker's log start); partitions without a cap are not served, except all of them when ``caps`` is
        None (a topic whose lake is served whole).  ``waited_for``: a consumer waits for this read (a seek, the
        start of a replay): it decodes about a quarter window's rows, or FIRST_READ_WINDOWS windows, at most
        (the first record comes sooner; reads ahead of the consumer are the large ones).  ``ahead_rows``: the
        rows a read ahead decodes (default READ_WINDOWS windows' rows; :mod:`ksi.lake.reader` ramps it up).
        ``max_rows``: at most this many, either way (the reader's bound on bytes in flight)."""
        window_rows = plan.views[0].window_rows
        budget = (window_rows // 4 if waited_for
                  else ahead_rows if ahead_rows is not None else READ_WINDOWS * window_rows)
        if max_rows is not None:
            budget = min(budget, max_rows)
        wanted = plan.partitions[partition]
        windows: dict[int, None] = {}
        rows = 0
        for c in range(component, wanted.components):
            added = [k for k in wanted.piece_keys(c) if k not in windows]
            extra = sum(plan.window_rows[k] for k in added)
            if c > component and (rows + extra > budget or (waited_for and len(windows) + len(added)
                                                               > FIRST_READ_WINDOWS)):
                break
            windows.update(dict.fromkeys(added))
            rows += extra
        keys = np.array(sorted(windows), dtype=np.int64)
        covered = plan.complete_components(keys)
        covered[partition] = [c for c in covered.get(partition, []) if c >= component]
        served = {}
        for p, components in covered.items():
            if not components or (caps is not None
                                  and caps.get(p, 0) <= plan.partitions[p].component_first[components[0]]):
                continue
            served[p] = components
        return ReadPlan(keys, served)

    def starts_cheaply(self, plan: TablePlan, read_plan: ReadPlan) -> bool:
        """Whether a read reaches each of its row groups' first window without decoding the windows before it:
        the row group's first window, one a cursor waits at, or any window of a row group whose page index
        lets a cursor start at its pages (without one, a read that must start mid-row-group while another read
        streams that row group would decode its start again)."""
        firsts: dict[tuple[int, int], int] = {}
        for k in read_plan.windows:
            file, row_group, window = unpack_piece(int(k))
            firsts[(file, row_group)] = min(window, firsts.get((file, row_group), window))
        for (file, row_group), window in firsts.items():
            data_file = plan.files[file]
            view = plan.views[data_file.source]
            if window and not self.cursors.parked(view, data_file, row_group, window) and not (
                    self.cursors.starts_at_pages(view, data_file, row_group)):
                return False
        return True

    def read(self, plan: TablePlan, read_plan: ReadPlan, caps: dict[int, int] | None) -> ReadResult:
        """Decode the read plan's windows and turn the components it serves into records, per span of
        consecutive components (:meth:`decode`, then :meth:`records`)."""
        return self.records(plan, self.decode(plan, read_plan), read_plan.served, caps)

    def decode(self, plan: TablePlan, read_plan: ReadPlan) -> dict[int, pa.Table]:
        """The read plan's windows, decoded: per source table, its rows in the table's projection."""
        by_source: dict[int, list[pa.RecordBatch]] = {}
        for k in read_plan.windows:
            file, row_group, window = unpack_piece(int(k))
            by_source.setdefault(plan.files[file].source, []).append(self._window(plan, file, row_group, window))
        return {s: _concat(batches) for s, batches in by_source.items()}

    def records(self, plan: TablePlan, tables: dict[int, pa.Table], served: dict[int, list[int]],
                caps: dict[int, int] | None) -> ReadResult:
        """The components ``served`` (per partition) of decoded windows (:meth:`decode`) as records, per span
        of consecutive components.  A row that cannot become a record fails the partitions it is in: if that
        happens, each partition is done again on its own, so the others are still served."""
        try:
            return self._records(plan, tables, served, caps)
        except LakeError:
            if len(served) == 1:
                raise
        result = ReadResult()
        failed: LakeError | None = None
        for p, components in served.items():
            try:
                one = self._records(plan, tables, {p: components}, caps)
            except LakeError as exc:
                failed = failed or exc
                result.failed[p] = str(exc)
                continue
            result.spans += one.spans
            result.counts.update(one.counts)
            result.differing += one.differing
        if not result.spans and failed is not None:
            raise failed
        return result

    def _records(self, plan: TablePlan, tables: dict[int, pa.Table], served: dict[int, list[int]],
                 caps: dict[int, int] | None) -> ReadResult:
        parts: list[Records] = []
        for number, read in sorted(tables.items()):
            source = self._sources[number]
            table = _only_components(read, source.layout, plan, served)
            try:
                parts.append(to_records(table, source.layout, source.values, caps=caps, partitions=set(served)))
            except ValuesError as exc:
                raise LakeError(str(exc)) from None
            except (TypeError, ValueError, pa.ArrowException) as exc:
                raise LakeError(f"{self._where()}: rows of partition(s) {', '.join(map(str, sorted(served)))} of"
                                f" table {source.identifier} cannot be served as Kafka records:"
                                f" {type(exc).__name__}: {exc}") from None
        records = parts[0] if len(parts) == 1 else _merge(parts)
        result = ReadResult(counts=records.counts, differing=records.differing)
        for p in sorted(served):
            plan_p = plan.partitions[p]
            for first_c, last_c in _runs(served[p]):
                start = int(plan_p.component_last[first_c - 1]) + 1 if first_c else plan_p.first_offset
                stop = int(plan_p.component_last[last_c]) + 1
                if caps is not None:
                    stop = min(stop, caps[p])
                if stop > start:
                    result.spans.append(Span(p, start, stop, _between(records.partitions.get(p), start, stop)))
        return result

    def _window(self, plan: TablePlan, file: int, row_group: int, window: int) -> pa.RecordBatch:
        data_file = plan.files[file]
        view = plan.views[data_file.source]
        try:
            if window == 0:
                whole = self.cursors.whole_window(view, data_file, row_group)
                if whole is not None:
                    return whole
            cursor = self.cursors.take(view, data_file, row_group, window)
            try:
                batch = cursor.next_window()
            except BaseException:
                cursor.close()
                raise
        except LakeError:
            raise
        except Exception as exc:  # storage unreachable, file gone or corrupt
            raise LakeUnavailable(f"{self._where()}: cannot read data file {data_file.path} (row group {row_group}):"
                                  f" {type(exc).__name__}: {brief_error(exc)}") from exc
        if batch is None:
            cursor.close()
            raise LakeError(f"{self._where()}: data file {data_file.path} row group {row_group} has no window {window}")
        self.cursors.give_back(view, cursor)
        return batch

    # -- timestamps ----------------------------------------------------------------------------

    def offset_for_timestamp(self, partition: int, timestamp_ms: int) -> tuple[int, int] | None:
        """The first offset whose timestamp is >= ``timestamp_ms`` and that record's timestamp, in the
        snapshot last planned (no catalog call).  Kafka timestamps are not monotonic within a partition, so
        this is the smallest offset among all rows at or after the time: pieces are visited in offset order,
        skipping those whose largest timestamp is below it, until one holds such a row."""
        plan = self.plan
        if not plan.views or not self._sources or self.layout.timestamp is None:
            return None
        wanted = plan.partitions.get(partition)
        if wanted is None:
            return None
        best: tuple[int, int] | None = None
        for piece in wanted.by_timestamp(timestamp_ms):
            if best is not None and piece.first > best[0]:
                break
            try:
                found = self._first_at(plan, piece.file, piece.row_group, piece.window, partition, timestamp_ms)
            except LakeError:
                raise
            except Exception as exc:
                raise LakeUnavailable(f"{self._where()}: cannot look up timestamp {timestamp_ms} in partition"
                                      f" {partition}: {type(exc).__name__}: {brief_error(exc)}") from exc
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        return best

    def _first_at(self, plan: TablePlan, file: int, row_group: int, window: int, partition: int,
                  timestamp_ms: int) -> tuple[int, int] | None:
        data_file = plan.files[file]
        view = plan.views[data_file.source]
        ids = index_columns(view.table_schema, self._sources[data_file.source].layout)
        opened = self.cursors.file(view, data_file)
        for w, columns in enumerate(opened.index_windows(row_group)):
            if w != window:
                continue
            p = columns[ids.partition].cast(pa.int32())
            o = columns[ids.offset].cast(pa.int64())
            ts = timestamp_column(columns, ids, len(o))
            hit = pc.and_(valid_rows(p, o), pc.and_(pc.equal(p, partition), pc.greater_equal(ts, timestamp_ms)))
            hit = pc.fill_null(hit, False)
            if not pc.any(hit).as_py():
                return None
            offsets, stamps = o.filter(hit), ts.filter(hit)
            i = pc.index(offsets, pc.min(offsets)).as_py()
            return int(offsets[i].as_py()), int(stamps[i].as_py())
        return None


def _concat(batches: list[pa.RecordBatch]) -> pa.Table:
    """Windows of one source as one table.  Files written at different times may come out of the projection
    with different Arrow types for one column (``string`` and ``large_string``, nested in a struct): those
    are unified, the wider type winning."""
    if all(b.schema == batches[0].schema for b in batches[1:]):
        return pa.Table.from_batches(batches)
    return pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive")


class _NoSnapshot:
    snapshot_id = None


def _merge(parts: list[Records]) -> Records:
    """Records of several sources as one: per partition in offset order (an offset in two sources: the first
    source's record, as for duplicates within one)."""
    merged = Records()
    for part in parts:
        merged.counts.update(part.counts)
        merged.differing += part.differing
    for p in sorted({p for part in parts for p in part.partitions}):
        pieces = [part.partitions[p] for part in parts if p in part.partitions]
        if len(pieces) == 1:
            merged.partitions[p] = pieces[0]
            continue
        offsets = np.concatenate([x.columns.offsets for x in pieces])
        order = np.argsort(offsets, kind="stable")
        keep = np.ones(len(order), dtype=bool)
        keep[1:] = offsets[order][1:] != offsets[order][:-1]
        if not keep.all():
            merged.counts["duplicate"] += int((~keep).sum())
        order = order[keep]
        take = pa.array(order)

        def joined(name: str) -> pa.Array:
            return pa.concat_arrays([getattr(x.columns, name) for x in pieces]).take(take)  # noqa: B023 - called in this iteration

        headers = None
        if any(x.columns.headers is not None for x in pieces):
            header = pa.struct([pa.field("key", pa.binary()), pa.field("value", pa.binary())])
            empty = pa.array([None], pa.list_(header))
            headers = pa.concat_arrays([x.columns.headers if x.columns.headers is not None
                                        else empty.take(pa.array(np.zeros(len(x.columns), np.int64)))
                                        for x in pieces]).take(take)
        types = None
        if any(x.timestamp_types is not None for x in pieces):
            types = np.concatenate([x.timestamp_types if x.timestamp_types is not None
                                    else np.zeros(len(x.columns), np.int8) for x in pieces])[order]
        aborted = None
        if any(x.aborted is not None for x in pieces):
            aborted = np.concatenate([x.aborted if x.aborted is not None else np.zeros(len(x.columns), bool)
                                      for x in pieces])[order]
        merged.partitions[p] = PartitionRecords(p, Columns(
            offsets=offsets[order], timestamps=np.concatenate([x.columns.timestamps for x in pieces])[order],
            keys=joined("keys"), values=joined("values"), headers=headers), types, aborted)
    return merged


def _only_components(table: pa.Table, layout: ResolvedLayout, plan: TablePlan,
                     covered: dict[int, list[int]]) -> pa.Table:
    """The rows of ``table`` that belong to the covered components of ``partitions``: rows of a partition whose
    component was only partly read must not be served (its other rows are elsewhere)."""
    if table.num_rows == 0:
        return table
    p_np = np.asarray(pc.fill_null(column_of(table, layout.partition).cast(pa.int32()), -1))
    o_np = np.asarray(pc.fill_null(column_of(table, layout.offset).cast(pa.int64()), -1))
    keep = np.zeros(len(p_np), dtype=bool)
    for part, components in covered.items():
        pp = plan.partitions[part]
        ranges = _offset_ranges(pp.component_first, pp.component_last, components)
        mine = p_np == part
        if len(ranges) <= _RANGES_COMPARED:
            inside = np.zeros(len(o_np), dtype=bool)
            for lo, hi in ranges:
                inside |= (o_np >= lo) & (o_np <= hi)
            keep |= mine & inside
            continue
        idx = np.searchsorted(pp.component_last, o_np[mine], side="left")
        inside = idx < len(pp.component_last)
        ok = np.zeros(len(idx), dtype=bool)
        ok[inside] = member(idx[inside], components) & (o_np[mine][inside] >= pp.component_first[idx[inside]])
        keep[np.flatnonzero(mine)] = ok
    return table if keep.all() else table.filter(pa.array(keep))


# A partition's covered offsets, when they make at most this many ranges, are found by comparing each row's
# offset with the ranges (a few passes over the rows), else by looking up each row's component (a binary search).
_RANGES_COMPARED = 4


def _offset_ranges(first: npt.NDArray[np.int64], last: npt.NDArray[np.int64],
                   components: list[int]) -> list[tuple[int, int]]:
    """The offsets of ``components`` as inclusive ranges, components next to each other with no offset between
    them joined (components never overlap, so no offset between two covered ones belongs to a third)."""
    ranges: list[tuple[int, int]] = []
    for c in sorted(components):
        lo, hi = int(first[c]), int(last[c])
        if ranges and ranges[-1][1] + 1 == lo:
            ranges[-1] = (ranges[-1][0], hi)
        else:
            ranges.append((lo, hi))
    return ranges


def _between(records: PartitionRecords | None, start: int, stop: int) -> PartitionRecords | None:
    """The records with ``start <= offset < stop``."""
    if records is None:
        return None
    offsets = records.columns.offsets
    lo, hi = int(np.searchsorted(offsets, start)), int(np.searchsorted(offsets, stop))
    if lo == hi:
        return None
    if lo == 0 and hi == len(offsets):
        return records
    types = records.timestamp_types
    aborted = records.aborted[lo:hi] if records.aborted is not None and records.aborted[lo:hi].any() else None
    return PartitionRecords(records.partition, records.columns.slice(lo, hi), None if types is None else types[lo:hi],
                            aborted)


def _runs(components: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs in a sorted list: [1, 2, 3, 5] -> [(1, 3), (5, 5)]."""
    runs: list[tuple[int, int]] = []
    for c in components:
        if runs and c == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return runs
