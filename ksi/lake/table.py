"""One topic's Iceberg table, as the cold reader uses it: loaded, planned once per snapshot, read in pieces.

* :meth:`LakeTable.offset_ranges` picks up the current snapshot and plans it (:class:`~ksi.lake.index.TablePlan`):
  the data files from PyIceberg's planning, each file's index read once (:mod:`ksi.lake.index`; new
  files only, in parallel), so a plan costs the new files, not the table.
* :meth:`LakeTable.read` reads the windows that hold some partitions' components, and turns every
  component those windows hold completely, of any partition, into records: one read of a window serves
  every partition in it.
* :meth:`LakeTable.offset_for_timestamp` finds the first offset at or after a time from the index (the
  largest timestamp per piece) and the timestamp column of the few pieces that may hold it.

Blocking (catalog, files); the proxy calls it from worker threads.
"""

from __future__ import annotations

import logging
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..config import TopicConfig
from ..metrics import LAKE_ROWS
from ..registry.client import RegistryClient
from .commits import READS_TO_LOG_START, writer_next_offsets
from .files import WINDOW_ROWS, Cursors, DataFile, TableView
from .index import FileIndex, IndexColumns, TablePlan, index_window, timestamp_column, unpack_piece, valid_rows
from .layouts import LayoutError, ResolvedLayout, resolve
from .records import PartitionRecords, to_records
from .values import ValueEncoder, ValuesError

__all__ = ["LakeError", "LakeUnavailable", "LakeTable", "OffsetRange", "ReadPlan", "ReadResult", "Span", "brief_error"]

log = logging.getLogger("ksi.lake")

INDEX_THREADS = 4
READ_WINDOWS = 2  # a read decodes about this many windows' rows, beyond the first component asked for
FIRST_READ_WINDOWS = 8  # a read a consumer waits for (a seek, a replay's start) decodes at most this many windows


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


@dataclass(frozen=True, slots=True)
class _Entry:
    """A live data file of a manifest."""

    path: str
    record_count: int
    sequence_number: int
    spec_id: int
    data_file: Any   # pyiceberg DataFile: its partition values, for columns a file lacks


class LakeTable:
    """One configured topic's Iceberg table."""

    def __init__(self, catalog: Any, topic: TopicConfig, registry: RegistryClient | None = None,
                 cursors: Cursors | None = None, window_rows: int = WINDOW_ROWS) -> None:
        self.topic = topic
        self.window_rows = window_rows
        self._catalog = catalog
        self.values = ValueEncoder(topic.name, topic.table, registry)
        self.cursors = cursors or Cursors()
        self._table: Any = None
        self._layout: ResolvedLayout | None = None
        self._indexes: dict[str, FileIndex] = {}
        self._manifests: dict[str, list[_Entry]] = {}
        self.plan: TablePlan = TablePlan(None, None, ())
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

    def writer_next(self, partition: int) -> int | None:
        """The writer's next offset for ``partition`` as of the snapshot planned (None: it keeps none;
        ``sys.maxsize``: the writer reads every offset before retention may delete it)."""
        if self.topic.layout in READS_TO_LOG_START:
            return sys.maxsize
        state = self.plan.writer_next
        return None if state is None else state.get(partition)

    @property
    def snapshot_id(self) -> int | None:
        """The snapshot the last :meth:`offset_ranges` planned."""
        return self.plan.snapshot_id

    def _where(self) -> str:
        return f"topic {self.topic.name} (table {self.topic.table})"

    def load(self) -> None:
        """Load the table and check its layout; raise LakeError naming the topic and table."""
        from pyiceberg.exceptions import NoSuchTableError

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
                self._layout = resolve(self.topic.layout, self._table.schema(), self.topic.table)
            snapshot = self._table.current_snapshot()
            return snapshot.snapshot_id if snapshot is not None else None

    # -- planning ------------------------------------------------------------------------------

    def offset_ranges(self) -> dict[int, OffsetRange]:
        """Per Kafka partition, the offsets the lake holds (as of the current snapshot, planned)."""
        snapshot_id = self.refresh()
        if snapshot_id != self.plan.snapshot_id or self.plan.view is None:
            try:
                plan = self._plan(snapshot_id) if snapshot_id is not None else TablePlan(None, None, ())
            except LakeError:
                raise
            except Exception as exc:  # manifests or files unreadable: storage unreachable, files gone
                raise LakeUnavailable(f"topic {self.topic.name}: cannot plan table {self.topic.table} (snapshot"
                                      f" {snapshot_id}): {type(exc).__name__}: {brief_error(exc)}") from exc
            if self.plan.view is not None and (plan.view is None or plan.view.key != self.plan.view.key):
                self.cursors.forget(self.plan.view)
            self.plan = plan
        return {p: OffsetRange(first, last) for p, (first, last) in self.plan.ranges().items()}

    def _view(self) -> TableView:
        table, layout = self._table, self.layout
        schema = table.schema()
        ids = self._index_columns(schema, layout)
        return TableView(
            io=table.io, table_schema=schema, projected_schema=schema.select(*layout.selected_fields()),
            name_mapping=table.name_mapping(), format_version=table.format_version,
            index_field_ids=ids.all,
            key=(str(table.metadata.table_uuid), schema.schema_id), window_rows=self.window_rows,
        )

    @staticmethod
    def _index_columns(schema: Any, layout: ResolvedLayout) -> IndexColumns:
        return IndexColumns(schema.find_field(layout.partition).field_id, schema.find_field(layout.offset).field_id,
                            tuple(schema.find_field(path).field_id for path in layout.timestamps))

    def _plan(self, snapshot_id: int) -> TablePlan:
        """The snapshot's live data files, earliest committed first (their data sequence numbers: a row stored
        twice is served from the earliest commit), each with its index (read once per file)."""
        from pyiceberg.io.pyarrow import _get_column_projection_values

        table = self._table
        view = self._view()
        snapshot = table.snapshot_by_id(snapshot_id)
        specs = table.specs()
        entries: list[_Entry] = []
        live_manifests = set()
        for manifest in snapshot.manifests(table.io) if snapshot is not None else []:
            live_manifests.add(manifest.manifest_path)
            entries += self._manifest_entries(manifest)
        for path in [p for p in self._manifests if p not in live_manifests]:
            del self._manifests[path]
        entries.sort(key=lambda e: (e.sequence_number, e.path))
        files = tuple(DataFile(e.path, e.record_count, dict(_get_column_projection_values(
            e.data_file, view.projected_schema, view.table_schema, specs.get(e.spec_id), set()))) for e in entries)
        ids = self._index_columns(view.table_schema, self.layout)
        todo = [f for f in files if f.path not in self._indexes]
        if todo:
            with ThreadPoolExecutor(min(INDEX_THREADS, len(todo)), thread_name_prefix="ksi-index") as pool:
                for data_file, built in zip(todo, pool.map(lambda f: self._index_file(view, f, ids), todo),
                                            strict=True):
                    self._indexes[data_file.path] = built
                    if built.bad_rows:
                        LAKE_ROWS.labels(self.topic.name, "bad").inc(built.bad_rows)
                        log.warning("%s: data file %s holds %d row(s) without a partition or offset, or with a"
                                    " negative one: they are never served", self._where(), data_file.path,
                                    built.bad_rows)
        live = {f.path for f in files}
        for path in [p for p in self._indexes if p not in live]:
            del self._indexes[path]  # compacted away or expired
        return TablePlan.build(snapshot_id, view, files, [self._indexes[f.path] for f in files],
                               writer_next_offsets(self.topic.layout, table, snapshot_id))

    def _manifest_entries(self, manifest: Any) -> list[_Entry]:
        """A manifest's live data files (manifests never change: read once per manifest)."""
        from pyiceberg.manifest import FileFormat, ManifestContent

        found = self._manifests.get(manifest.manifest_path)
        if found is not None:
            return found
        entries = manifest.fetch_manifest_entry(self._table.io, discard_deleted=True)
        if manifest.content == ManifestContent.DELETES:
            if entries:
                raise LakeError(f"{self._where()}: the table has delete files (merge-on-read row deletes, e.g."
                                f" {entries[0].data_file.file_path}); ksi reads tables without them: compact the"
                                " table first (ksi compact, or Spark's rewrite_data_files)")
            found = []
        else:
            found = []
            for entry in entries:
                data_file = entry.data_file
                if data_file.file_format != FileFormat.PARQUET:
                    raise LakeError(f"{self._where()}: data file {data_file.file_path} is"
                                    f" {data_file.file_format.name}; ksi reads Parquet data files only")
                found.append(_Entry(data_file.file_path, data_file.record_count, entry.sequence_number or 0,
                                    data_file.spec_id, data_file))
        self._manifests[manifest.manifest_path] = found
        return found

    def _index_file(self, view: TableView, data_file: DataFile, ids: IndexColumns) -> FileIndex:
        opened = self.cursors.file(view, data_file)
        if ids.partition not in opened.index_ids or ids.offset not in opened.index_ids:
            raise LakeError(f"{self._where()}: data file {data_file.path} has no partition or offset column")
        windows, bad = [], 0
        for row_group in range(len(opened.row_group_rows)):
            for window, columns in enumerate(opened.index_windows(row_group)):
                grouped, dropped = index_window(columns, ids)
                windows.append((row_group, window, grouped))
                bad += dropped
        return FileIndex.build(data_file.path, windows, bad)

    # -- reading -------------------------------------------------------------------------------

    @staticmethod
    def read_plan(plan: TablePlan, partition: int, component: int, caps: dict[int, int] | None,
                  waited_for: bool = False) -> ReadPlan:
        """What a read of ``partition``'s ``component`` decodes: the windows holding it and the components after
        it (up to about READ_WINDOWS windows' rows), and what it serves: every component, of any partition,
        that those windows hold completely.  ``caps``: per partition the first offset not to serve (the
        broker's log start); partitions without a cap are not served, except all of them when ``caps`` is
        None (a topic whose lake is served whole).  ``waited_for``: a consumer waits for this read (a seek, the
        start of a replay): it decodes about a quarter window's rows, or FIRST_READ_WINDOWS windows, at most
        (the first record comes sooner; reads ahead of the consumer are the large ones)."""
        assert plan.view is not None
        budget = plan.view.window_rows // 4 if waited_for else READ_WINDOWS * plan.view.window_rows
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
            if not components or (caps is not None and caps.get(p, 0) <= plan.partitions[p].component_first[components[0]]):
                continue
            served[p] = components
        return ReadPlan(keys, served)

    def read(self, plan: TablePlan, read_plan: ReadPlan, caps: dict[int, int] | None) -> ReadResult:
        """Decode the read plan's windows and turn the components it serves into records, per span of
        consecutive components.  A row that cannot become a record fails the partitions it is in: if the read
        fails, each partition is read again on its own, so the others are still served."""
        batches = [self._window(plan, *unpack_piece(int(k))) for k in read_plan.windows]
        table = pa.Table.from_batches(batches) if batches else pa.table({})
        try:
            return self._records(plan, table, read_plan.served, caps)
        except LakeError:
            if len(read_plan.served) == 1:
                raise
        result = ReadResult()
        failed: LakeError | None = None
        for p, components in read_plan.served.items():
            try:
                one = self._records(plan, table, {p: components}, caps)
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

    def _records(self, plan: TablePlan, table: pa.Table, served: dict[int, list[int]],
                 caps: dict[int, int] | None) -> ReadResult:
        table = _only_components(table, self.layout, plan, served)
        try:
            records = to_records(table, self.layout, self.values, caps=caps, partitions=set(served))
        except ValuesError as exc:
            raise LakeError(str(exc)) from None
        except (TypeError, ValueError, pa.ArrowException) as exc:
            raise LakeError(f"{self._where()}: rows of partition(s) {', '.join(map(str, sorted(served)))} cannot be"
                            f" served as Kafka records: {type(exc).__name__}: {exc}") from None
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
        assert plan.view is not None
        data_file = plan.files[file]
        try:
            cursor = self.cursors.take(plan.view, data_file, row_group, window)
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
        self.cursors.give_back(plan.view, cursor)
        return batch

    # -- timestamps ----------------------------------------------------------------------------

    def offset_for_timestamp(self, partition: int, timestamp_ms: int) -> tuple[int, int] | None:
        """The first offset whose timestamp is >= ``timestamp_ms`` and that record's timestamp, in the
        snapshot last planned (no catalog call).  Kafka timestamps are not monotonic within a partition, so
        this is the smallest offset among all rows at or after the time: pieces are visited in offset order,
        skipping those whose largest timestamp is below it, until one holds such a row."""
        layout = self.layout
        plan = self.plan
        if layout.timestamp is None or plan.view is None:
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
        assert plan.view is not None
        ids = self._index_columns(plan.view.table_schema, self.layout)
        opened = self.cursors.file(plan.view, plan.files[file])
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


def _only_components(table: pa.Table, layout: ResolvedLayout, plan: TablePlan,
                     covered: dict[int, list[int]]) -> pa.Table:
    """The rows of ``table`` that belong to the covered components of ``partitions``: rows of a partition whose
    component was only partly read must not be served (its other rows are elsewhere)."""
    from .files import column_of

    if table.num_rows == 0:
        return table
    p = column_of(table, layout.partition).cast(pa.int32()).fill_null(-1)
    o = column_of(table, layout.offset).cast(pa.int64()).fill_null(-1)
    p_np, o_np = np.asarray(p), np.asarray(o)
    keep = np.zeros(len(p_np), dtype=bool)
    for part in covered:
        pp = plan.partitions[part]
        cs = np.array(covered[part], dtype=np.intp)
        mine = p_np == part
        idx = np.searchsorted(pp.component_last, o_np[mine], side="left")
        inside = idx < len(pp.component_last)
        ok = np.zeros(len(idx), dtype=bool)
        ok[inside] = np.isin(idx[inside], cs) & (o_np[mine][inside] >= pp.component_first[idx[inside]])
        keep[np.flatnonzero(mine)] = ok
    return table if keep.all() else table.filter(pa.array(keep))


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
    return PartitionRecords(records.partition, records.columns.slice(lo, hi), None if types is None else types[lo:hi])


def _runs(components: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs in a sorted list: [1, 2, 3, 5] -> [(1, 3), (5, 5)]."""
    runs: list[tuple[int, int]] = []
    for c in components:
        if runs and c == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return runs
