"""Planning a topic's table for cold reads: its snapshot's data files, each indexed once, as a TablePlan.

A topic's records may come from more than one table, its *sources*: the topic's table, and for Redpanda the
``<table>~dlq`` table of the records it could not translate (key_value layout), whose records belong in the
same offset order.  Each source has its own schema, layout and value encoding; their files are planned
together (the topic's table first, each source's files earliest commit first: their data sequence numbers),
so a read can serve records of both.

* Manifests never change: each is read once and kept by path, so planning a new snapshot costs its new
  manifests.  Data files never change: each is indexed once (:mod:`ksi.lake.index`), new files in parallel.
* A data file that cannot be indexed (gone, unreadable, corrupt) leaves out the partitions its manifest
  bounds name (every partition when it has none): they are *unavailable* (a retriable error on the Kafka
  side, never a hole stepped over), and the file is tried again at the next plan.

Blocking (files, manifests); run from the catalog session's threads.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..metrics import LAKE_ROWS
from .commits import lost_offsets, writer_next_offsets
from .files import BUFFER_BYTES, Cursors, DataFile, OpenFile, TableView
from .index import FileIndex, IndexColumns, TablePlan, index_window
from .layouts import ResolvedLayout
from .manifests import live_entries
from .values import ValueEncoder

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile as IcebergDataFile
    from pyiceberg.manifest import ManifestFile
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

__all__ = ["INDEX_THREADS", "Planner", "Source", "index_columns"]

log = logging.getLogger("ksi.lake")

INDEX_THREADS = max(1, min(4, os.cpu_count() or 1))  # more threads than cores planned slower, with more memory
MAX_NAMED_PARTITIONS = 1 << 16  # an unreadable file's partition bounds wider than this mark every partition


class PlanError(Exception):
    """A table cannot be planned at all (not Parquet, row-level deletes): the lake cannot serve the topic."""


@dataclass(frozen=True, slots=True)
class Source:
    """A table whose rows are records of the topic."""

    identifier: str
    table: Table               # as loaded or refreshed
    layout: ResolvedLayout
    values: ValueEncoder


@dataclass(frozen=True, slots=True)
class _Entry:
    """A live data file of a manifest."""

    path: str
    record_count: int
    sequence_number: int
    spec_id: int
    data_file: IcebergDataFile   # its partition values and column bounds


def index_columns(schema: Schema, layout: ResolvedLayout) -> IndexColumns:
    return IndexColumns(schema.find_field(layout.partition).field_id, schema.find_field(layout.offset).field_id,
                        tuple(schema.find_field(path).field_id for path in layout.timestamps))


class Planner:
    """One topic's planning state: manifests read and files indexed so far, kept across snapshots."""

    def __init__(self, topic: str, cursors: Cursors, window_rows: int) -> None:
        self.topic = topic
        self.cursors = cursors
        self.window_rows = window_rows
        self._manifests: dict[str, list[_Entry]] = {}
        self._indexes: dict[str, FileIndex] = {}

    def view(self, source: Source) -> TableView:
        table, layout = source.table, source.layout
        schema = table.schema()
        return TableView(
            io=table.io, table_schema=schema, projected_schema=schema.select(*layout.selected_fields()),
            name_mapping=table.name_mapping(), format_version=table.format_version,
            index_field_ids=index_columns(schema, layout).all,
            key=(str(table.metadata.table_uuid), schema.schema_id), window_rows=self.window_rows)

    def plan(self, sources: list[Source], snapshot_id: int | None, layout_name: str) -> TablePlan:
        """The plan of the sources' current snapshots (``snapshot_id``: the topic's table's, which names it)."""
        from pyiceberg.io.pyarrow import _get_column_projection_values

        views = tuple(self.view(s) for s in sources)
        files: list[DataFile] = []
        entries: dict[str, tuple[_Entry, int]] = {}
        live_manifests: set[str] = set()
        for number, (source, view) in enumerate(zip(sources, views, strict=True)):
            snapshot = source.table.current_snapshot()
            found: list[_Entry] = []
            for manifest in snapshot.manifests(source.table.io) if snapshot is not None else []:
                live_manifests.add(manifest.manifest_path)
                found += self._manifest_entries(source, manifest)
            found.sort(key=lambda e: (e.sequence_number, e.path))
            specs = source.table.specs()
            for e in found:
                missing = _get_column_projection_values(e.data_file, view.projected_schema, view.table_schema,
                                                        specs.get(e.spec_id), set())
                files.append(DataFile(e.path, e.record_count, dict(missing), number))
                entries[e.path] = (e, number)
        for path in [p for p in self._manifests if p not in live_manifests]:
            del self._manifests[path]
        broken = self._index(sources, views, [f for f in files if f.path not in self._indexes])
        live = {f.path for f in files}
        for path in [p for p in self._indexes if p not in live]:
            del self._indexes[path]  # compacted away or expired
        readable = tuple(f for f in files if f.path not in broken)
        plan = TablePlan.build(snapshot_id, views, readable, [self._indexes[f.path] for f in readable],
                               writer_next_offsets(layout_name, sources[0].table, snapshot_id),
                               lost_offsets(sources[0].table, snapshot_id) if layout_name == "ksi" else None)
        if broken:
            plan = self._with_broken(plan, {path: (why, self._partitions_of(sources[entries[path][1]],
                                                                            entries[path][0], views[entries[path][1]]))
                                            for path, why in broken.items()})
        return plan

    def _index(self, sources: list[Source], views: tuple[TableView, ...], todo: list[DataFile]) -> dict[str, str]:
        """Index the files not indexed yet, in parallel; the ones that cannot be read, with why."""
        broken: dict[str, str] = {}
        if not todo:
            return broken

        def index(data_file: DataFile) -> tuple[FileIndex, OpenFile | None] | str:
            source = sources[data_file.source]
            try:
                return self._index_file(views[data_file.source], data_file,
                                        index_columns(views[data_file.source].table_schema, source.layout))
            except Exception as exc:  # noqa: BLE001 - confined to the partitions the file holds (_with_broken)
                text = str(exc).strip().splitlines()
                return f"{type(exc).__name__}: {text[0] if text else ''}"

        with ThreadPoolExecutor(min(INDEX_THREADS, len(todo)), thread_name_prefix="ksi-index") as pool:
            for data_file, done in zip(todo, pool.map(index, todo), strict=True):
                if isinstance(done, str):
                    broken[data_file.path] = done
                    continue
                built, opened = done
                if opened is not None:  # in the plan's order: the files kept are the first, whichever thread
                    self.cursors.keep(opened, evict=False)  # finished first
                self._indexes[data_file.path] = built
                if built.bad_rows:
                    LAKE_ROWS.labels(self.topic, "bad").inc(built.bad_rows)
                    log.warning("topic %s: data file %s holds %d row(s) without a partition or offset, or with a"
                                " negative one: they are never served", self.topic, data_file.path, built.bad_rows)
        return broken

    def _index_file(self, view: TableView, data_file: DataFile,
                    ids: IndexColumns) -> tuple[FileIndex, OpenFile | None]:
        """A data file's index, read through the handle its footer was read from, and the file opened for it
        (None: it was open already), which :meth:`_index` keeps open for the reads while fewer than the
        Cursors' ``max_files`` are (:meth:`Cursors.keep`)."""
        opened = self.cursors.kept(view, data_file)
        parquet, source = None, None
        if opened is None:
            opened, parquet, source = OpenFile.opening(view, data_file, self.cursors.window_bytes, BUFFER_BYTES)
        try:
            if ids.partition not in opened.index_ids or ids.offset not in opened.index_ids:
                raise PlanError(f"data file {data_file.path} has no partition or offset column")
            windows, bad = [], 0
            for row_group in range(len(opened.row_group_rows)):
                for window, columns in enumerate(opened.index_windows(row_group, parquet)):
                    grouped, dropped = index_window(columns, ids)
                    windows.append((row_group, window, grouped))
                    bad += dropped
        finally:
            if source is not None:
                source.close()
        return FileIndex.build(data_file.path, windows, bad), opened if parquet is not None else None

    def _manifest_entries(self, source: Source, manifest: ManifestFile) -> list[_Entry]:
        """A manifest's live data files (manifests never change: read once per manifest)."""
        from pyiceberg.manifest import FileFormat, ManifestContent

        found = self._manifests.get(manifest.manifest_path)
        if found is not None:
            return found
        entries = live_entries(manifest, source.table.io)
        if manifest.content == ManifestContent.DELETES:
            if entries:
                raise PlanError(f"table {source.identifier} has delete files (merge-on-read row deletes, e.g."
                                f" {entries[0].data_file.file_path}); ksi reads tables without them: compact the"
                                " table first (ksi compact, or Spark's rewrite_data_files)")
            found = []
        else:
            found = []
            for entry in entries:
                data_file = entry.data_file
                if data_file.file_format != FileFormat.PARQUET:
                    raise PlanError(f"table {source.identifier}: data file {data_file.file_path} is"
                                    f" {data_file.file_format.name}; ksi reads Parquet data files only")
                found.append(_Entry(data_file.file_path, data_file.record_count, entry.sequence_number or 0,
                                    data_file.spec_id, data_file))
        self._manifests[manifest.manifest_path] = found
        return found

    @staticmethod
    def _partitions_of(source: Source, entry: _Entry, view: TableView) -> tuple[int, int] | None:
        """The Kafka partitions a data file holds, from its manifest entry's column bounds (None: unknown)."""
        from pyiceberg.conversions import from_bytes
        from pyiceberg.types import PrimitiveType

        field = view.table_schema.find_field(source.layout.partition)
        if not isinstance(field.field_type, PrimitiveType):
            return None  # from_bytes reads primitives only
        data_file = entry.data_file
        try:
            low = from_bytes(field.field_type, (data_file.lower_bounds or {})[field.field_id])
            high = from_bytes(field.field_type, (data_file.upper_bounds or {})[field.field_id])
        except (KeyError, TypeError, ValueError):
            return None
        return int(low), int(high)

    def _with_broken(self, plan: TablePlan, broken: dict[str, tuple[str, tuple[int, int] | None]]) -> TablePlan:
        """The plan with the partitions that unreadable files hold marked unavailable."""
        unavailable: dict[int, str] = {}
        everything: str | None = None
        for path, (why, bounds) in sorted(broken.items()):
            reason = f"topic {self.topic}: data file {path} cannot be read ({why})"
            # No bounds, or bounds no topic has (a statistic of 2**31 - 1): every partition.
            partitions = bounds if bounds is not None and bounds[1] - max(bounds[0], 0) < MAX_NAMED_PARTITIONS else None
            log.error("%s; %s get a retriable error until it can", reason,
                      "all partitions" if partitions is None else f"partition(s) {partitions[0]}..{partitions[1]}")
            if partitions is None:
                everything = everything or reason
            else:
                for p in range(max(partitions[0], 0), partitions[1] + 1):
                    unavailable.setdefault(p, reason)
        return dataclasses.replace(plan, unavailable=unavailable, all_unavailable=everything)
