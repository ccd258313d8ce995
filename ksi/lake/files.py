"""Iceberg data files, read a row group at a time, in windows of rows.

PyIceberg's ``ArrowScan`` reads a whole file per scan task and filters it afterwards (iceberg-python issue
3036), so a table whose one row group holds every Kafka partition is decoded whole again for every
offset window of every partition.  ksi plans with PyIceberg and reads row groups itself: a row group is
streamed with ``ParquetFile.iter_batches`` in *windows* of a fixed number of rows, without pre-buffering
(so a huge row group is never held whole), and each window is projected onto the table's current schema
with PyIceberg's own projection (field ids, or the table's name mapping for files written without them):
renamed, added and promoted columns read exactly as PyIceberg reads them.

A :class:`Cursor` is a row group being streamed; it is kept after a read while windows are left (see
:class:`Cursors`), so a replay that goes on where the last read stopped decodes each row group once.  A
cursor that starts at a later window (a seek) decodes from the pages holding that window's first row where
the file has a page index (:mod:`ksi.lake.pages`), else every window before it; with a page index a read
ahead starts so too while another read streams the row group (two streams of one row group, on two threads),
and a kept cursor whose next window the other stream has decoded is closed.  A small row group of one
window (a streaming sink's files) is read by one call, without a cursor (:meth:`OpenFile.whole_window`).

Blocking; runs in worker threads.  Parquet data files only (:mod:`ksi.lake.planner` says so for others).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .pages import FilePages, PageBatches, has_offset_index, read_from

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.schema import Schema
    from pyiceberg.table.name_mapping import NameMapping
    from pyiceberg.typedef import TableVersion

__all__ = ["WINDOW_ROWS", "Cursor", "Cursors", "DataFile", "OpenFile", "TableView", "column_of", "whole"]

# Rows per window: the unit in which a row group is streamed, indexed and encoded (~4 MiB of ~130-byte
# records) ...
WINDOW_ROWS = 32768
# ... and at most about this many bytes (uncompressed, as the row group's metadata says): a row group of
# 1 MiB values is streamed a few rows at a time, not 32 GiB at once.
WINDOW_BYTES = 8 << 20
# A row group whose column chunks take at most PRE_BUFFER_BYTES in the file is read in a few coalesced reads
# before decoding (Arrow's pre_buffer); a larger one is streamed through buffers of BUFFER_BYTES per column,
# so a huge row group is never held whole.  Decoding 1M rows of ksi's archive (16 files of 4 MiB) cost 0.34
# CPU-s streamed through buffers with Arrow's column threads, 0.21 pre-buffered on the reading thread.
PRE_BUFFER_BYTES = 16 << 20
BUFFER_BYTES = 1 << 20
# Cursors kept between reads hold what their reader buffered (a pre-buffered row group's column chunks, or
# a buffer per column): at most this many bytes of them are kept, the least recently used closed first.
# Measured with 8 consumers replaying ksi's archive layout at 10M rows: 32 streams kept ~32 pre-buffered
# 4 MiB row groups, Arrow's memory peaking at 170 MiB and ksi's RSS at 720 MiB.
PARKED_BYTES = 48 << 20
# A row group of one window taking at most this many bytes in the file is read whole by one call, without
# a cursor (OpenFile.whole_window): read in one piece it is held whole anyway.
SMALL_GROUP_BYTES = 4 << 20
# Reads of a row group remembered, per row group read by its pages, to find kept cursors left behind
DECODED_KEPT = 8


@dataclass(frozen=True, slots=True, eq=False)
class TableView:
    """What reading one snapshot's files needs: FileIO, the table schema, the projected schema (the
    columns a Kafka record is made of), the name mapping for files without field ids."""

    io: FileIO
    table_schema: Schema
    projected_schema: Schema           # the columns cold reads need
    name_mapping: NameMapping | None
    format_version: TableVersion
    index_field_ids: tuple[int, ...]   # partition, offset and (if any) timestamp: what the index reads
    key: tuple[str, int] = ("", 0)     # (table uuid, schema id): views with one key read files alike
    window_rows: int = WINDOW_ROWS

    @property
    def projected_field_ids(self) -> set[int]:
        """The field ids to read (lists and maps are selected through their elements), as PyIceberg's scan."""
        from pyiceberg.types import ListType, MapType

        schema = self.projected_schema
        return {i for i in schema.field_ids if not isinstance(schema.find_type(i), (MapType, ListType))}


@dataclass(frozen=True, slots=True)
class DataFile:
    """A data file of a planned snapshot."""

    path: str
    record_count: int
    missing_fields: dict[int, Any] = field(default_factory=dict, hash=False)  # identity partition values of
    # columns the file lacks (Iceberg's column projection rule)
    source: int = 0  # which of the topic's tables it belongs to (ksi.lake.planner.Source)


@dataclass(slots=True, eq=False)
class _Projection:
    """How files of one physical schema are read into one view's projection (worked out once)."""

    file_schema: Schema               # the file's
    project: Schema                   # the file schema pruned to the projected field ids
    columns: list[str]                # top-level columns to read
    index_paths: list[str]            # leaf paths of the index columns present
    index_ids: tuple[int, ...]        # their field ids
    # The output schema when PyIceberg's projection of a window only relabels it (same columns, order and
    # types: a file written with the table's current schema), so the per-window projection is skipped;
    # None: not known yet; False: it does more (renames, promotions, added columns, nested reordering).
    same: pa.Schema | bool | None = None


_PROJECTIONS: OrderedDict[tuple[tuple[str, int], bytes], _Projection] = OrderedDict()
_PROJECTIONS_LOCK = threading.Lock()
# The projection each data file was found to have, by (view key, path): a data file never changes, and a file
# opened again (past Cursors.max_files) then skips its schema's Arrow form and serialization, 70-120 us of the
# ~2 ms that opening and reading one of the streaming shape's 2,000-row files takes (in-process, 500 files).
_FILE_PROJECTIONS: OrderedDict[tuple[tuple[str, int], str], _Projection] = OrderedDict()
FILE_PROJECTIONS_KEPT = 1 << 15  # about 200 bytes each: the paths are the plan's own strings


def _projection(view: TableView, footer: pq.ParquetFile, path: str | None = None) -> _Projection:
    """How a file of this physical schema is read into the view.  A writer's files nearly always share one
    physical schema, so it is worked out once (the serialized schema carries the field ids, so files that
    differ only in those do not share).  Not keyed by the footer's ``ParquetSchema``, although that is
    cheaper: pyarrow's FileMetaData and the ParquetSchema it hands out refer to each other, so every footer
    asked for it waits for Python's cyclic collector (at 5,000 files, 75 MiB more RSS after planning).
    ``path``: the data file's, whose projection is then remembered by path as well."""
    from pyiceberg.io.pyarrow import pyarrow_to_schema
    from pyiceberg.schema import prune_columns

    if path is not None:
        with _PROJECTIONS_LOCK:
            known = _FILE_PROJECTIONS.get((view.key, path))
        if known is not None:
            return known
        known = _projection(view, footer)
        with _PROJECTIONS_LOCK:
            _FILE_PROJECTIONS[(view.key, path)] = known
            while len(_FILE_PROJECTIONS) > FILE_PROJECTIONS_KEPT:
                _FILE_PROJECTIONS.popitem(last=False)
        return known
    arrow_schema = footer.schema_arrow
    key = (view.key, arrow_schema.serialize().to_pybytes())
    with _PROJECTIONS_LOCK:
        known = _PROJECTIONS.get(key)
    if known is not None:
        return known
    file_schema = pyarrow_to_schema(arrow_schema, view.name_mapping, downcast_ns_timestamp_to_us=True,
                                    format_version=view.format_version)
    project = prune_columns(file_schema, view.projected_field_ids, select_full_types=False)
    present = tuple(i for i in view.index_field_ids if i in file_schema.field_ids)
    known = _Projection(file_schema, project, [c.name for c in project.columns],
                        [cast(str, file_schema.find_column_name(i)) for i in present], present)
    with _PROJECTIONS_LOCK:
        _PROJECTIONS[key] = known
        while len(_PROJECTIONS) > 256:
            _PROJECTIONS.popitem(last=False)
    return known


def column_of(batch: pa.RecordBatch | pa.Table, path: str) -> pa.Array | pa.ChunkedArray:
    """The column at a dotted path (a top-level column or a struct's child); a table's stays chunked (only
    the leaf is ever combined, by whoever needs it whole: combining a struct would copy every child)."""
    parts = path.split(".")
    column = batch.column(parts[0])
    for part in parts[1:]:
        column = pc.struct_field(column, part)
    return column


def whole(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as one array (a copy only when it has several chunks)."""
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


class OpenFile:
    """A data file's footer and its projection onto the table schema, read once.  Every read opens the file
    anew (:meth:`parquet`), so a file that stops being readable fails the reads that come after, as it
    would on an object store, instead of being read through a handle kept open."""

    def __init__(self, view: TableView, data_file: DataFile, window_bytes: int = WINDOW_BYTES,
                 footer: pq.ParquetFile | None = None) -> None:
        """``footer``: the file opened already (:meth:`Cursors.whole_window`, the planner), else it is opened
        here for its footer and closed."""
        self.view = view
        self.data_file = data_file
        self.window_bytes = window_bytes
        with contextlib.ExitStack() as opened:
            if footer is None:
                footer = pq.ParquetFile(opened.enter_context(view.io.new_input(data_file.path).open()),
                                        pre_buffer=False)
            self.metadata, self.projection = footer.metadata, _projection(view, footer, data_file.path)
        known = self.projection
        self.file_schema, self._columns, self._index_paths, self.index_ids = (
            known.file_schema, known.columns, known.index_paths, known.index_ids)
        self._pages: FilePages | None = None  # the footer as Thrift values and the offset indexes read so far
        self._refused: set[int] = set()  # row groups a start at pages further in than window 1 was refused in

    @classmethod
    def opening(cls, view: TableView, data_file: DataFile, window_bytes: int = WINDOW_BYTES,
                buffer_size: int = 0) -> tuple[OpenFile, pq.ParquetFile, Any]:
        """The file opened once for its footer and a read right after (a small file read whole, the planner's
        index): the OpenFile, the ParquetFile to read through (column chunks read whole, or through buffers of
        ``buffer_size``), and the input to close after it."""
        source = view.io.new_input(data_file.path).open()
        try:
            parquet = pq.ParquetFile(source, pre_buffer=False, buffer_size=buffer_size)
            return cls(view, data_file, window_bytes, parquet), parquet, source
        except BaseException:
            source.close()
            raise

    @property
    def row_group_rows(self) -> list[int]:
        return [int(self.metadata.row_group(i).num_rows) for i in range(self.metadata.num_row_groups)]

    def window_rows(self, row_group: int) -> int:
        """Rows per window of a row group: the view's, fewer where that many rows would pass ``window_bytes``
        (the index and every read of the row group use this one figure, so their windows are the same)."""
        metadata = self.metadata.row_group(row_group)
        rows, size = int(metadata.num_rows), int(metadata.total_byte_size)
        if rows <= 0 or size <= 0:
            return self.view.window_rows
        return max(1, min(self.view.window_rows, self.window_bytes * rows // size))

    def windows_in(self, row_group: int) -> int:
        return -(-int(self.metadata.row_group(row_group).num_rows) // self.window_rows(row_group))

    def parquet(self, row_group: int | None = None) -> tuple[pq.ParquetFile, Any]:
        """The file opened for one read (the footer is not read again), and the input to close after it;
        pre-buffered when ``row_group`` is small enough (see PRE_BUFFER_BYTES)."""
        source = self.view.io.new_input(self.data_file.path).open()
        small = row_group is not None and self.compressed_bytes(row_group) <= PRE_BUFFER_BYTES
        try:
            return pq.ParquetFile(source, metadata=self.metadata, pre_buffer=small,
                                  buffer_size=0 if small else BUFFER_BYTES), source
        except BaseException:
            source.close()
            raise

    def compressed_bytes(self, row_group: int) -> int:
        """What a row group's column chunks take in the file."""
        metadata = self.metadata.row_group(row_group)
        return sum(int(metadata.column(i).total_compressed_size) for i in range(metadata.num_columns))

    def index_windows(self, row_group: int, parquet: pq.ParquetFile | None = None) -> Iterator[dict[int, pa.Array]]:
        """The index columns of a row group (field id -> values), a window at a time.  Leaf columns read by
        their paths in this file (found by field id, so renames are followed); integer and timestamp types
        are what the index reads, whatever the file's widths.  Columns the file lacks are absent.
        ``parquet``: read through the file as :meth:`opening` opened it (else it is opened for this)."""
        if not self.index_ids:
            return
        source = None
        if parquet is None:
            parquet, source = self.parquet()
        try:
            for batch in parquet.iter_batches(batch_size=self.window_rows(row_group), row_groups=[row_group],
                                              columns=self._index_paths, use_threads=False):
                yield {i: whole(column_of(batch, path)) for i, path in zip(self.index_ids, self._index_paths,
                                                                           strict=True)}
        finally:
            if source is not None:
                source.close()

    def whole_window(self, row_group: int, parquet: pq.ParquetFile | None = None) -> pa.RecordBatch | None:
        """A row group that is one window, decoded at once without a :class:`Cursor`, in the table's
        projection; None for a row group of several windows (a cursor streams those) or above
        SMALL_GROUP_BYTES.  A streaming sink's files are thousands of such row groups: the cursor's reader set
        up for a stream and Arrow's pre-buffering (a read on its I/O threads, handed back) cost as much as
        decoding their few thousand rows (bench/cold.py's streaming table, 500 files of 2,000 rows: 0.40 CPU-s
        decoded through cursors, 0.36 so; a replay of it in-process, 1.21-1.30 CPU-s before, 1.15-1.22
        after).  ``parquet``: read through the file as :meth:`opening` opened it (else it is opened for this)."""
        if self.windows_in(row_group) != 1 or self.compressed_bytes(row_group) > SMALL_GROUP_BYTES:
            return None
        with contextlib.ExitStack() as opened:
            if parquet is None:
                source = opened.enter_context(self.view.io.new_input(self.data_file.path).open())
                parquet = pq.ParquetFile(source, metadata=self.metadata, pre_buffer=False, buffer_size=0)
            table = parquet.read_row_group(row_group, columns=self._columns, use_threads=False)
        batches = table.combine_chunks().to_batches()
        return self.project(batches[0]) if len(batches) == 1 else None  # (a row group of no rows)

    def windows(self, parquet: pq.ParquetFile, row_group: int) -> Iterator[pa.RecordBatch]:
        """The row group's rows as stored, a window at a time (:meth:`project` turns one into the table's
        projection)."""
        batches: Iterator[pa.RecordBatch] = parquet.iter_batches(
            batch_size=self.window_rows(row_group), row_groups=[row_group], columns=self._columns, use_threads=False)
        return batches

    def starts_at_pages(self, row_group: int) -> bool:
        """Whether :meth:`windows_from` can start mid-row-group (as far as the footer says; no I/O)."""
        if row_group in self._refused or (self._pages is not None and self._pages.failed is not None):
            return False
        return has_offset_index(self.metadata, row_group, self._columns)

    def windows_from(self, row_group: int, window: int) -> PageBatches | None:
        """The row group's windows from ``window`` on, as :meth:`windows` gives them, decoded from the pages
        holding the window's first row (ksi.lake.pages); None where the file's page index cannot say where
        those are (the caller decodes from the row group's start)."""
        if self._pages is None:
            self._pages = FilePages(self.view.io, self.data_file.path, self.metadata)
        rows = self.window_rows(row_group)
        found = read_from(self._pages, row_group, window * rows, self._columns, rows, buffer_bytes=BUFFER_BYTES)
        if found is None and window >= 2:  # a page index this module cannot use: reads ahead no longer start
            self._refused.add(row_group)   # here while another read streams the row group (:meth:`starts_at_pages`)
        return found

    def project(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A window in the table's projection: PyIceberg's (field ids or name mapping, promotions, added
        columns, identity partition values), or, for a physical schema whose projection was seen to only
        relabel a window, that relabelling (PyIceberg's schema visitor costs about a millisecond a window,
        which on a table of thousands of small files was the cold read's largest cost)."""
        from pyiceberg.io.pyarrow import _to_requested_schema

        known = self.projection
        missing = self.data_file.missing_fields
        if isinstance(known.same, pa.Schema) and not missing:
            return pa.RecordBatch.from_arrays(batch.columns, schema=known.same)
        projected = _to_requested_schema(self.view.projected_schema, known.project, batch,
                                         downcast_ns_timestamp_to_us=True, projected_missing_fields=missing,
                                         allow_timestamp_tz_mismatch=True)
        if known.same is None and not missing:
            known.same = _relabelled(batch, projected)
        return projected


def _relabelled(batch: pa.RecordBatch, projected: pa.RecordBatch) -> pa.Schema | bool:
    """``projected``'s schema if relabelling ``batch`` with it gives ``projected`` exactly, else False."""
    if batch.num_columns != projected.num_columns or any(
            a.type != b.type for a, b in zip(batch.schema, projected.schema, strict=True)):
        return False
    try:
        relabelled = pa.RecordBatch.from_arrays(batch.columns, schema=projected.schema)
    except (pa.ArrowException, ValueError, TypeError):
        return False
    return projected.schema if relabelled.equals(projected) else False


class Cursor:
    """A row group being streamed, positioned at its ``position``-th window; owns an open input.  Made at a
    later ``window`` (a seek), it starts there if the file's page index says where (ksi.lake.pages), else at
    the row group's start (:meth:`skip_to` then decodes the windows before it)."""

    __slots__ = ("_source", "_windows", "began", "file", "nbytes", "position", "row_group", "windows")

    def __init__(self, file: OpenFile, row_group: int, window: int = 0) -> None:
        self.file = file
        self.row_group = row_group
        self.position = 0
        self.began = window  # where the read that holds it took it (Cursors.take)
        self.windows = file.windows_in(row_group)
        seek = file.windows_from(row_group, window) if 0 < window < self.windows else None
        # what its reader holds while it is kept: the pre-buffered chunks, else a buffer per column chunk
        compressed = file.compressed_bytes(row_group)
        self.nbytes = min(compressed, BUFFER_BYTES * file.metadata.num_columns) if (
            seek is not None or compressed > PRE_BUFFER_BYTES) else compressed
        if seek is not None:
            self.position = window
            self._source: Any = seek
            self._windows: Iterator[pa.RecordBatch] = seek
            return
        parquet, self._source = file.parquet(row_group)
        self._windows = file.windows(parquet, row_group)

    @property
    def exhausted(self) -> bool:
        return self.position >= self.windows

    def next_window(self) -> pa.RecordBatch | None:
        """The next window, in the table's projection."""
        batch = next(self._windows, None)
        if batch is None:
            return None
        self.position += 1
        return self.file.project(batch)

    def skip_to(self, window: int) -> None:
        """Decode and drop windows up to ``window`` (Parquet has no random access into a row group)."""
        while self.position < window:
            if next(self._windows, None) is None:
                raise IndexError(f"{self.file.data_file.path}: row group {self.row_group} has no window {window}")
            self.position += 1

    def close(self) -> None:
        close = getattr(self._windows, "close", None)
        if close is not None:
            close()
        with contextlib.suppress(Exception):  # closing a read-only input loses nothing
            self._source.close()


class Cursors:
    """Open files and row-group cursors kept between reads (least recently used closed first): a replay
    that goes on where the last read stopped continues the same stream instead of decoding the row group
    again from its start.  One cursor per stream replaying a large row group at once (each holds about a
    megabyte of Parquet reader buffers per column, or its pre-buffered row group): more streams than
    ``max_cursors`` (``history.max_cursors``), or cursors holding more than ``max_bytes`` (PARKED_BYTES),
    evict each other's and decode their row groups again from the start."""

    def __init__(self, max_files: int = 1024, max_cursors: int = 64, window_bytes: int = WINDOW_BYTES,
                 max_bytes: int = PARKED_BYTES) -> None:
        self.max_files = max_files
        self.max_cursors = max_cursors
        self.max_bytes = max_bytes
        self.nbytes = 0  # what the kept cursors hold (Cursor.nbytes)
        self.window_bytes = window_bytes
        self._files: OrderedDict[tuple[tuple[str, int], str], OpenFile] = OrderedDict()
        self._cursors: OrderedDict[tuple[tuple[str, int], str, int, int], Cursor] = OrderedDict()
        # per row group read by pages: the windows the last reads decoded, [began, position)
        self._decoded: OrderedDict[tuple[tuple[str, int], str, int], list[tuple[int, int]]] = OrderedDict()
        self._lock = threading.Lock()

    def file(self, view: TableView, data_file: DataFile) -> OpenFile:
        found = self.kept(view, data_file)
        if found is not None:
            return found
        opened = OpenFile(view, data_file, self.window_bytes)
        self.keep(opened)
        return opened

    def kept(self, view: TableView, data_file: DataFile) -> OpenFile | None:
        """The file if it is open (now the most recently used)."""
        key = (view.key, data_file.path)
        with self._lock:
            found = self._files.get(key)
            if found is not None:
                self._files.move_to_end(key)
            return found

    def keep(self, opened: OpenFile, evict: bool = True) -> None:
        """Keep a file opened; ``evict=False``: only while fewer than ``max_files`` are (the planner indexing
        a table of more files than that keeps the first it indexes, the ones a replay from the start reads
        first, instead of evicting them for the last: a replay of 5,000 files opened every one again)."""
        with self._lock:
            if not evict and len(self._files) >= self.max_files:
                return
            self._files[(opened.view.key, opened.data_file.path)] = opened
            while len(self._files) > self.max_files:
                self._files.popitem(last=False)

    def whole_window(self, view: TableView, data_file: DataFile, row_group: int) -> pa.RecordBatch | None:
        """:meth:`OpenFile.whole_window` of the file; one not open yet is opened once, for its footer and this
        read (a streaming sink's table is thousands of such files, each read once in a replay)."""
        found = self.kept(view, data_file)
        if found is not None:
            return found.whole_window(row_group)
        opened, parquet, source = OpenFile.opening(view, data_file, self.window_bytes)
        try:
            self.keep(opened)
            return opened.whole_window(row_group, parquet)
        finally:
            source.close()

    def take(self, view: TableView, data_file: DataFile, row_group: int, window: int) -> Cursor:
        """A cursor at ``window`` of the row group: an open one positioned there, else a new one (which
        starts at the pages holding the window through the file's page index, or decodes the windows before
        it)."""
        key = (view.key, data_file.path, row_group, window)
        with self._lock:
            cursor = self._cursors.pop(key, None)
            if cursor is not None:
                self.nbytes -= cursor.nbytes
                cursor.began = window
        if cursor is None:
            cursor = Cursor(self.file(view, data_file), row_group, window)
            try:
                cursor.skip_to(window)
            except BaseException:
                cursor.close()
                raise
        return cursor

    def starts_at_pages(self, view: TableView, data_file: DataFile, row_group: int) -> bool:
        """Whether a cursor made mid-row-group would start at the pages holding its window: the file is open
        already, has a page index for every column read, and reading it that way has not failed (no I/O)."""
        with self._lock:
            opened = self._files.get((view.key, data_file.path))
        return opened is not None and opened.starts_at_pages(row_group)

    def parked(self, view: TableView, data_file: DataFile, row_group: int, window: int) -> bool:
        """Whether a cursor waits at ``window`` of the row group (a read from there decodes nothing before it)."""
        with self._lock:
            return (view.key, data_file.path, row_group, window) in self._cursors

    def give_back(self, view: TableView, cursor: Cursor) -> None:
        """Keep ``cursor`` for the read that continues where it stopped (if any window is left)."""
        group = (view.key, cursor.file.data_file.path, cursor.row_group)
        key = (*group, cursor.position)
        pages = cursor.file.starts_at_pages(cursor.row_group)
        with self._lock:
            evicted = []
            stale = False  # this cursor's next window was decoded by the other stream
            if pages:
                # Two streams of one row group (a read ahead started at its pages while another read streamed
                # it): a kept cursor whose next window the other has decoded would never be taken again, and
                # its reader buffers would stay until evicted.
                done = self._decoded.setdefault(group, [])
                done.append((cursor.began, cursor.position))
                del done[:-DECODED_KEPT]
                self._decoded.move_to_end(group)
                while len(self._decoded) > self.max_cursors:
                    self._decoded.popitem(last=False)
                for k in [k for k in self._cursors if k[:3] == group and cursor.began <= k[3] < cursor.position]:
                    evicted.append(self._cursors.pop(k))
                    self.nbytes -= evicted[-1].nbytes
                stale = any(a <= cursor.position < b for a, b in done[:-1])
            replaced = None
            if stale or cursor.exhausted:
                evicted.append(cursor)
            else:
                replaced = self._cursors.pop(key, None)
                if replaced is not None:
                    self.nbytes -= replaced.nbytes
                self._cursors[key] = cursor
                self.nbytes += cursor.nbytes
            while len(self._cursors) > 1 and (len(self._cursors) > self.max_cursors or self.nbytes > self.max_bytes):
                old = self._cursors.popitem(last=False)[1]
                self.nbytes -= old.nbytes
                evicted.append(old)
        for old in ([replaced] if replaced is not None else []) + evicted:
            old.close()

    def forget(self, view: TableView) -> None:
        """Close what was opened for a snapshot no longer served."""
        with self._lock:
            closed = [self._cursors.pop(k) for k in [k for k in self._cursors if k[0] == view.key]]
            for group in [g for g in self._decoded if g[0] == view.key]:
                del self._decoded[group]
            self.nbytes -= sum(c.nbytes for c in closed)
            for key in [k for k in self._files if k[0] == view.key]:
                del self._files[key]
        for cursor in closed:
            cursor.close()
