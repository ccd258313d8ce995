"""A row group read from a row on, through the Parquet page index.

A consumer that seeks into the middle of a huge row group (Java writers make 128 MiB row groups: ~1M Kafka
records, every partition mixed) needs a few thousand rows of it.  ``ParquetFile.iter_batches`` decodes
every column chunk from its first page, so a seek waited while every window before the wanted one was
decoded and dropped.  pyarrow reads the page index but has no API to start decoding at a page
(apache/arrow#45284, open: the RowRanges work of apache/arrow#45234 is not merged), so this module does it
around pyarrow, with pyarrow still doing all the decoding:

1. The footer's OffsetIndex of each column chunk (per page: offset, size, first row; parquet-java, hence
   Iceberg's Java writers, AutoMQ, the Kafka Connect sink, Flink and Spark, writes it by default) is read
   with a small Thrift compact-protocol codec (:mod:`ksi.lake.thrift`, which keeps unknown fields when it
   writes a struct again).
2. Per leaf column, the page holding the start row is chosen; leaves whose chosen pages begin at the same
   row make a *group*.  A footer is synthesized with a row group per group whose column chunks begin at the
   chosen pages: the data pages stay where they are in the file; the chunk's dictionary page, if the pages
   kept need it, is laid just before the chosen page, over bytes of the same chunk this read skips; and a
   row group of *padding* rows (a page of nulls, or zeros, past the end of the file) comes first, so that
   the start row begins a batch of the stream pyarrow decodes and every window is one batch, never two
   joined (:class:`_Spliced` is that view of the file).  The footer keeps the file's schema and key-value
   metadata, so pyarrow gives the Arrow types it gives for the file itself.
3. pyarrow decodes each group; the rows before the start row are dropped, and a top-level column whose
   leaves fell in different groups (a struct such as AutoMQ's ``_kafka_metadata``, list<struct> headers, a
   map) is put together again into exactly the type ``iter_batches`` gives.

Starting at pages costs some fixed work (a reader per group, dictionaries read again): where the pages
skipped hold less than a window's bytes, :func:`read_from` returns None, as it does for anything unexpected,
and the caller decodes from the row group's start as before.  Unexpected: a leaf without an offset index;
pages that are not contiguous or not from row 0; bytes before the first page that are not one dictionary
page; a repeated leaf whose chosen page does not begin a record (the format requires it with an
OffsetIndex; Arrow before 12.0 did not always do it, apache/arrow#34142); an encrypted or split file; column
names with dots; a nested type this module cannot put together; a first window pyarrow cannot decode.
Never wrong data: a group that ends before its rows raises, a dictionary-encoded page after the kept pages
that were found to need none makes pyarrow raise.

The page bytes it reads and writes itself (page headers, repetition levels, padding pages) are
:mod:`ksi.lake.page_format`'s; a nested column is put together again by :mod:`ksi.lake.nested`.

Blocking; runs in worker threads.
"""

from __future__ import annotations

import io
import logging
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from .nested import merge, mergeable
from .page_format import (
    CHUNK_CRYPTO,
    CHUNK_ENCRYPTED_META,
    CHUNK_FILE_OFFSET,
    CHUNK_FILE_PATH,
    CHUNK_INDEXES,
    CHUNK_META,
    CHUNK_OFFSET_INDEX,
    CHUNK_OFFSET_INDEX_LENGTH,
    DATA_PAGE,
    DATA_PAGE_V2,
    DICTIONARY_ENCODINGS,
    DICTIONARY_PAGE,
    FILE_ENCRYPTION,
    FILE_NUM_ROWS,
    FILE_ROW_GROUPS,
    GROUP_COLUMNS,
    GROUP_NUM_ROWS,
    GROUP_ORDINAL,
    HEADER_COMPRESSED,
    HEADER_TYPE,
    HEADER_V1,
    HEADER_V2,
    MAGIC,
    META_CODEC,
    META_COMPRESSED,
    META_DATA_PAGE,
    META_DICTIONARY_PAGE,
    META_DROPPED,
    META_ENCODING_STATS,
    META_NUM_VALUES,
    META_PATH,
    Unusable,
    padding_page,
    page_header,
    starts_record,
)
from .thrift import I16, I64, LIST, STRUCT, ThriftError, TList, TStruct, decode, encode

if TYPE_CHECKING:
    from pyiceberg.io import FileIO

__all__ = ["FilePages", "PageBatches", "Pages", "has_offset_index", "read_from"]

log = logging.getLogger("ksi.lake")


@dataclass(frozen=True, slots=True)
class Pages:
    """A column chunk's OffsetIndex: per data page, its offset in the file, size (with its header) and
    first row in the row group."""

    offset: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    first_row: npt.NDArray[np.int64]

    @classmethod
    def parse(cls, data: bytes) -> Pages:
        locations = decode(data)[0].get(1)
        rows = [(p.get(1), p.get(2), p.get(3)) for p in locations.items] if isinstance(locations, TList) else []
        if not rows or any(not isinstance(v, int) for row in rows for v in row):
            raise Unusable("an OffsetIndex without pages, or a PageLocation without offset, size or first row")
        array = np.array(rows, dtype=np.int64)
        return cls(array[:, 0].copy(), array[:, 1].copy(), array[:, 2].copy())


@dataclass(frozen=True, slots=True)
class _Leaf:
    """One leaf column's part in a read: where its kept pages begin."""

    index: int             # the column's position in the row group
    path: tuple[str, ...]  # path_in_schema
    max_repetition: int
    first_row: int         # the row the chosen page begins with
    page: int              # the chosen page's offset
    end: int               # the column chunk's end
    dictionary: bytes      # the chunk's dictionary page (header and body), or b""
    num_values: int        # values from the chosen page on (an upper bound for a repeated leaf)


class FilePages:
    """A data file's footer as Thrift values and the offset indexes read so far (data files never change;
    threads share one: a race reads an index twice, no harm)."""

    def __init__(self, io: FileIO, path: str, metadata: pq.FileMetaData) -> None:
        self.io, self.path, self.metadata = io, path, metadata
        self._footer: TStruct | None = None
        self._pages: dict[tuple[int, int], Pages] = {}
        self.failed: str | None = None  # why pyarrow could not read this file this way (then it is not tried again)

    @property
    def footer(self) -> TStruct:
        """The FileMetaData, as pyarrow serializes what it read (no I/O)."""
        if self._footer is None:
            out = pa.BufferOutputStream()
            self.metadata.write_metadata_file(out)
            data = out.getvalue().to_pybytes()
            self._footer, _ = decode(memoryview(data)[len(MAGIC):-8])
        return self._footer

    def offset_indexes(self, source: Any, row_group: int, chunks: list[tuple[int, TStruct]]) -> dict[int, Pages]:
        """The OffsetIndex of each chunk (column index, ColumnChunk), read in one go where they lie together
        (writers put a file's offset indexes side by side before its footer)."""
        found = {i: self._pages[row_group, i] for i, _ in chunks if (row_group, i) in self._pages}
        wanted = [(i, chunk.get(CHUNK_OFFSET_INDEX), chunk.get(CHUNK_OFFSET_INDEX_LENGTH))
                  for i, chunk in chunks if i not in found]
        if not wanted:
            return found
        for i, offset, length in wanted:
            if not isinstance(offset, int) or not isinstance(length, int) or offset <= 0 or length <= 0:
                raise Unusable(f"column {i} has no offset index")
        lo = min(w[1] for w in wanted)
        hi = max(w[1] + w[2] for w in wanted)
        together = hi - lo <= 4 * sum(w[2] for w in wanted) + (64 << 10)
        block = _read_at(source, lo, hi - lo) if together else b""
        for i, offset, length in wanted:
            data = block[offset - lo:offset - lo + length] if together else _read_at(source, offset, length)
            if len(data) != length:
                raise Unusable(f"column {i}: offset index past the end of the file")
            try:
                pages = Pages.parse(data)
            except ThriftError as exc:
                raise Unusable(f"column {i}: offset index: {exc}") from None
            self._pages[row_group, i] = found[i] = pages
        return found


def has_offset_index(metadata: pq.FileMetaData, row_group: int, columns: Sequence[str]) -> bool:
    """Whether the footer names an OffsetIndex for every leaf of ``columns`` (top-level names) in the row group.
    (Paths from the column chunks, not ``metadata.schema``: pyarrow's FileMetaData and its ParquetSchema refer
    to each other, so a footer asked for it is freed only by Python's cyclic collector.)"""
    group = metadata.row_group(row_group)
    chunks = [group.column(i) for i in range(group.num_columns)]
    return all(c.has_offset_index for c in chunks if c.path_in_schema.split(".")[0] in columns)


def _read_at(source: Any, offset: int, length: int) -> bytes:
    read_at = getattr(source, "read_at", None)
    if read_at is not None:
        return bytes(read_at(length, offset))
    source.seek(offset)
    return bytes(source.read(length))


def _read_buffer(source: Any, offset: int, length: int) -> Any:
    """``length`` bytes at ``offset``, as a pa.Buffer where the source is a NativeFile (no copy)."""
    if hasattr(source, "read_buffer"):
        source.seek(offset)
        return source.read_buffer(length)
    return _read_at(source, offset, length)


def _size_of(source: Any) -> int:
    size = getattr(source, "size", None)
    if callable(size):
        return int(size())
    position = source.tell()
    end = int(source.seek(0, 2))
    source.seek(position)
    return end


class _Spliced(io.RawIOBase):
    """The data file as a synthesized footer sees it: its own bytes, except that a chunk's dictionary page
    lies just before the first data page kept (over bytes of the same chunk that the read skips), and padding
    pages lie past its end."""

    def __init__(self, source: Any, patches: list[tuple[int, bytes]]) -> None:
        super().__init__()
        self._source = source
        self._patches = sorted(patches)
        self._source_size = _size_of(source)
        self._size = max([self._source_size] + [o + len(p) for o, p in self._patches])
        self._pos = 0
        self._released: list[tuple[int, int]] = []

    def release(self) -> None:
        """Forget the patches (once every reader is past them: a dictionary page is read before the pages that
        use it, padding rows before the rows after them); reading them again raises."""
        self._released = [(o, o + len(p)) for o, p in self._patches]
        self._patches = []

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def read_buffer(self, size: int | None = -1) -> Any:
        """The next ``size`` bytes (pa.PythonFile asks for a buffer: none is copied outside a patch)."""
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        start, self._pos = self._pos, max(self._pos, end)
        if end <= start:
            return b""
        if any(lo < end and hi > start for lo, hi in self._released):
            raise OSError(f"bytes {start}-{end} of a released patch read again")
        hits = [(o, p) for o, p in self._patches if o < end and o + len(p) > start]
        if not hits:
            return _read_buffer(self._source, start, end - start)
        if len(hits) == 1 and hits[0][0] <= start and end <= hits[0][0] + len(hits[0][1]):  # inside a patch
            return memoryview(hits[0][1])[start - hits[0][0]:end - hits[0][0]]
        spliced = bytearray(end - start)
        if start < self._source_size:
            spliced[:min(end, self._source_size) - start] = _read_at(self._source, start,
                                                                     min(end, self._source_size) - start)
        for offset, patch in hits:
            lo, hi = max(offset, start), min(offset + len(patch), end)
            spliced[lo - start:hi - start] = patch[lo - offset:hi - offset]
        return bytes(spliced)

    def read(self, size: int | None = -1) -> Any:  # any buffer does for pa.PythonFile
        return self.read_buffer(size)


# ------------------------------------------------------------------------------------------------- the read

def _leaf(pages_of: Pages, index: int, path: tuple[str, ...], max_repetition: int, meta: TStruct, rg_rows: int,
          start: int) -> tuple[_Leaf, int]:
    """Where a leaf's read begins (the dictionary page still to be read: its offset is returned)."""
    offset, size, first_row = pages_of.offset, pages_of.size, pages_of.first_row
    data_page, dictionary, compressed = (meta.get(META_DATA_PAGE), meta.get(META_DICTIONARY_PAGE),
                                         meta.get(META_COMPRESSED))
    if not isinstance(data_page, int) or not isinstance(compressed, int):
        raise Unusable(f"{'.'.join(path)}: no data page offset or size")
    chunk_start = min(data_page, dictionary) if isinstance(dictionary, int) and dictionary > 0 else data_page
    end = chunk_start + compressed
    if (first_row[0] != 0 or (np.diff(first_row) <= 0).any() or first_row[-1] >= rg_rows or (size <= 0).any()
            or offset[0] < chunk_start or (offset[1:] != offset[:-1] + size[:-1]).any()
            or offset[-1] + size[-1] != end):
        raise Unusable(f"{'.'.join(path)}: pages not contiguous from row 0 to the chunk's end")
    k = int(np.searchsorted(first_row, start, side="right")) - 1
    num_values = rg_rows - int(first_row[k]) if max_repetition == 0 else int(meta.get(META_NUM_VALUES, 0))
    leaf = _Leaf(index, path, max_repetition, int(first_row[k]), int(offset[k]), end, b"", num_values)
    return leaf, chunk_start


def _stripped(chunk: TStruct) -> TStruct:
    """A ColumnChunk without its statistics, page index and bloom filter (nothing reads them here)."""
    chunk, meta = chunk.copy(), chunk.get(CHUNK_META).copy()
    meta.drop(*META_DROPPED)
    chunk.set(CHUNK_META, STRUCT, meta)
    chunk.drop(*CHUNK_INDEXES)
    return chunk


def _moved(chunk: TStruct, begin: int, data_page: int, dictionary: bool, compressed: int, num_values: int) -> TStruct:
    """A (stripped) ColumnChunk whose pages are elsewhere."""
    chunk, meta = chunk.copy(), chunk.get(CHUNK_META).copy()
    meta.set(META_DATA_PAGE, I64, data_page)
    if dictionary:
        meta.set(META_DICTIONARY_PAGE, I64, begin)
    else:  # none, or the pages kept need none
        meta.drop(META_DICTIONARY_PAGE, META_ENCODING_STATS)
    meta.set(META_COMPRESSED, I64, compressed)
    meta.set(META_NUM_VALUES, I64, num_values)
    chunk.set(CHUNK_META, STRUCT, meta)
    if CHUNK_FILE_OFFSET in chunk.fields:
        chunk.set(CHUNK_FILE_OFFSET, I64, begin)
    return chunk


def _footer(pages: FilePages, row_group: int, groups: list[_Group], rg_rows: int) -> pq.FileMetaData:
    """The file's footer with, per group, a row group whose chunks begin at its chosen pages, after a row
    group of its padding rows if it has any."""
    footer = pages.footer.copy()
    original: TStruct = footer.get(FILE_ROW_GROUPS).items[row_group]
    chunks = [_stripped(chunk) for chunk in original.get(GROUP_COLUMNS).items]  # the others: not read
    out: list[TStruct] = []

    def add(kept: list[TStruct], rows: int) -> None:
        group = original.copy()
        group.set(GROUP_COLUMNS, LIST, TList(STRUCT, kept))
        group.set(GROUP_NUM_ROWS, I64, rows)
        if GROUP_ORDINAL in group.fields:
            group.set(GROUP_ORDINAL, I16, len(out))
        out.append(group)

    for group in groups:
        if group.padding:
            kept = list(chunks)
            for leaf in group.leaves:
                offset, page = group.pads[leaf.index]
                kept[leaf.index] = _moved(chunks[leaf.index], offset, offset, False, len(page), group.padding)
            add(kept, group.padding)
        kept = list(chunks)
        for leaf in group.leaves:
            if leaf.first_row > 0:  # else read from its start: the chunk as it is
                begin = leaf.page - len(leaf.dictionary)
                kept[leaf.index] = _moved(chunks[leaf.index], begin, leaf.page, bool(leaf.dictionary),
                                          leaf.end - begin, leaf.num_values)
        add(kept, rg_rows - group.first_row)
    footer.set(FILE_ROW_GROUPS, LIST, TList(STRUCT, out))
    footer.set(FILE_NUM_ROWS, I64, sum(g.padding + rg_rows - g.first_row for g in groups))
    data = encode(footer)
    return pq.read_metadata(pa.BufferReader(MAGIC + data + struct.pack("<I", len(data)) + MAGIC))


@dataclass(slots=True)
class _Group:
    """Leaves whose chosen pages begin at one row, read together after ``padding`` rows that put the
    start row on a window's boundary in the stream pyarrow decodes (so that every window it gives is one
    batch, no window joined from two)."""

    first_row: int
    leaves: list[_Leaf]
    padding: int = 0
    pads: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # leaf -> (offset past the file, page)


class _Rows:
    """One group's decoded rows from its first row on, handed out a number at a time."""

    __slots__ = ("_batches", "_head")

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._head: pa.RecordBatch | None = None

    def take(self, n: int, keep: bool = True) -> pa.RecordBatch | None:
        parts: list[pa.RecordBatch] = []
        while n > 0:
            if self._head is None:
                self._head = next(self._batches, None)
                if self._head is None:
                    raise ValueError("a column ended before its row group's rows")
                continue
            head = self._head
            if head.num_rows <= n:
                parts.append(head)
                self._head, n = None, n - head.num_rows
            else:
                parts.append(head.slice(0, n))
                self._head, n = head.slice(n), 0
        if not keep or not parts:
            return None
        return parts[0] if len(parts) == 1 else pa.concat_batches(parts)

    def close(self) -> None:
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


class PageBatches:
    """A row group's rows from a start row on, in windows, decoded from the pages holding the start row.
    Owns the open input: :meth:`close` it."""

    def __init__(self, source: Any, groups: list[_Rows], schema: pa.Schema, rows: int, window_rows: int) -> None:
        self._source = source
        self._groups = groups
        self.schema = schema
        self.rows_left = rows
        self.window_rows = window_rows
        self._first: pa.RecordBatch | None = None

    def prime(self) -> pa.RecordBatch | None:
        """Decode the first window now (so that a file pyarrow cannot read this way is known at once)."""
        self._first = self._window()
        return self._first

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self

    def __next__(self) -> pa.RecordBatch:
        batch = self._first if self._first is not None else self._window()
        self._first = None
        if batch is None:
            raise StopIteration
        return batch

    def _window(self) -> pa.RecordBatch | None:
        n = min(self.window_rows, self.rows_left)
        if n <= 0:
            return None
        parts = [rows.take(n) for rows in self._groups]
        arrays = []
        for column in self.schema:
            found = [b.column(column.name) for b in parts
                     if b is not None and b.schema.get_field_index(column.name) >= 0]
            arrays.append(merge(column.type, found))
        self.rows_left -= n
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def close(self) -> None:
        groups, self._groups = self._groups, []
        for rows in groups:
            rows.close()
        self._first = None
        self._source.close()


def read_from(pages: FilePages, row_group: int, start: int, columns: Sequence[str], window_rows: int,
              buffer_bytes: int = 1 << 20, min_saved_windows: float = 1.0) -> PageBatches | None:
    """Rows ``start`` onwards of a row group, as ``ParquetFile.iter_batches(batch_size=window_rows,
    row_groups=[row_group], columns=columns)`` gives them from there in windows of ``window_rows`` (window i
    is rows start + i * window_rows onwards); decoded from the page holding ``start`` in each leaf column
    (and the chunk's dictionary page), streamed through buffers of ``buffer_bytes`` per column.  None if the
    file's page index cannot be used (see the module's docstring), or if the pages it lets the read skip hold
    fewer bytes than ``min_saved_windows`` windows (on average) of the columns read: decode from the row
    group's start (starting at pages costs some fixed work: a few readers, dictionaries read again)."""
    metadata = pages.metadata
    rg_rows = int(metadata.row_group(row_group).num_rows)
    if not 0 < start < rg_rows or pages.failed is not None or not has_offset_index(metadata, row_group, columns):
        return None
    source = pages.io.new_input(pages.path).open()
    try:
        reader = _open(pages, source, row_group, start, list(columns), window_rows, buffer_bytes, rg_rows,
                       min_saved_windows)
    except (Unusable, ThriftError, AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        # anything this module did not expect of the footer or the index: decode from the start
        log.debug("%s: row group %d from row %d: page index not used: %s", pages.path, row_group, start, exc)
        source.close()
        return None
    except BaseException:
        source.close()
        raise
    return reader


def _open(pages: FilePages, source: Any, row_group: int, start: int, columns: list[str], window_rows: int,
          buffer_bytes: int, rg_rows: int, min_saved_windows: float) -> PageBatches:
    try:
        footer = pages.footer
    except ThriftError as exc:
        raise Unusable(f"footer: {exc}") from None
    if footer.get(FILE_ENCRYPTION) is not None:
        raise Unusable("encrypted file")
    arrow = pages.metadata.schema.to_arrow_schema()
    if len(set(arrow.names)) != len(arrow.names) or len(set(columns)) != len(columns) \
            or not set(columns) <= set(arrow.names):
        raise Unusable("top-level column names not unique, or not the file's")
    wanted = [arrow.field(name) for name in columns]  # in the order asked, as iter_batches
    chunks: list[TStruct] = footer.get(FILE_ROW_GROUPS).items[row_group].get(GROUP_COLUMNS).items
    needed: list[tuple[int, TStruct, tuple[str, ...]]] = []
    for i, chunk in enumerate(chunks):
        meta = chunk.get(CHUNK_META)
        if not isinstance(meta, TStruct):
            raise Unusable(f"column {i} without metadata")
        path = tuple(p.decode() for p in meta.get(META_PATH).items)
        if path[0] not in columns:
            continue
        if any("." in p for p in path):
            raise Unusable(f"a column name with a dot: {path}")
        if any(f in chunk.fields for f in (CHUNK_FILE_PATH, CHUNK_CRYPTO, CHUNK_ENCRYPTED_META)):
            raise Unusable(f"column {'.'.join(path)} is in another file or encrypted")
        needed.append((i, chunk, path))
    index = pages.offset_indexes(source, row_group, [(i, chunk) for i, chunk, _ in needed])
    chosen = [_leaf(index[i], i, path, int(pages.metadata.schema.column(i).max_repetition_level),
                    chunk.get(CHUNK_META), rg_rows, start) for i, chunk, path in needed]
    if all(leaf.first_row == 0 for leaf, _ in chosen):
        raise Unusable("every column's first page holds the row: nothing to skip")
    saved = sum(leaf.page - int(index[leaf.index].offset[0]) for leaf, _ in chosen)
    window_bytes = sum(leaf.end - chunk_start for leaf, chunk_start in chosen) * window_rows / rg_rows
    if saved < min_saved_windows * window_bytes:
        raise Unusable(f"the pages skipped hold {saved} bytes, {saved / max(window_bytes, 1):.1f} windows")
    leaves = [_prepare(source, leaf, chunk_start, index[leaf.index], chunks[leaf.index].get(CHUNK_META))
              if leaf.first_row > 0 else leaf for leaf, chunk_start in chosen]
    by_row: dict[int, list[_Leaf]] = {}
    for leaf in leaves:
        by_row.setdefault(leaf.first_row, []).append(leaf)
    groups = [_Group(r, by_row[r]) for r in sorted(by_row)]
    for column in wanted:  # a column whose leaves fell in different groups must be put together again
        owners = {g for g, group in enumerate(groups) for leaf in group.leaves if leaf.path[0] == column.name}
        if len(owners) > 1 and not mergeable(column.type):
            raise Unusable(f"column {column.name} of type {column.type} cannot be put together from its leaves")
    patches = [(leaf.page - len(leaf.dictionary), leaf.dictionary) for leaf in leaves if leaf.dictionary]
    end = _size_of(source)
    for group in groups:  # padding rows so that ``start`` falls on a batch's first row
        group.padding = -(start - group.first_row) % window_rows
        for leaf in group.leaves if group.padding else []:
            page = padding_page(pages.metadata.schema.column(leaf.index), group.padding,
                                int(chunks[leaf.index].get(CHUNK_META).get(META_CODEC, -1)))
            group.pads[leaf.index] = (end, page)
            patches.append((end, page))
            end += len(page)
    synthesized = _footer(pages, row_group, groups, rg_rows)
    spliced = _Spliced(source, patches) if patches or not isinstance(source, pa.NativeFile) else None
    parquet = pq.ParquetFile(source if spliced is None else pa.PythonFile(spliced, mode="r"), metadata=synthesized,
                             pre_buffer=False, buffer_size=buffer_bytes)
    rows: list[_Rows] = []
    schema = pa.schema(wanted)
    batches = PageBatches(source, rows, schema, rg_rows - start, window_rows)
    try:
        row_group_of = 0
        for group in groups:
            read = [row_group_of, row_group_of + 1] if group.padding else [row_group_of]
            row_group_of += len(read)
            rows.append(_Rows(parquet.iter_batches(batch_size=window_rows, row_groups=read, use_threads=False,
                                                   columns=[".".join(leaf.path) for leaf in group.leaves])))
            rows[-1].take(group.padding + start - group.first_row, keep=False)
        first = batches.prime()
    except (OSError, pa.ArrowException, ValueError, TypeError, KeyError) as exc:
        for r in rows:
            r.close()
        pages.failed = f"{type(exc).__name__}: {exc}"
        log.warning("%s: row group %d from row %d: a read through the page index failed, so this file's seeks decode"
                    " from the row group's start: %s", pages.path, row_group, start, pages.failed)
        raise Unusable(pages.failed) from None
    if first is None or not first.schema.equals(schema, check_metadata=True):
        for r in rows:
            r.close()
        raise Unusable("the decoded window's schema differs from the file's")
    if spliced is not None:
        spliced.release()  # a kept cursor holds no dictionary page twice
    return batches


def _prepare(source: Any, leaf: _Leaf, chunk_start: int, pages_of: Pages, meta: TStruct) -> _Leaf:
    """A leaf whose read begins at a later page: its dictionary page read, if the pages kept need it, and
    (for a repeated leaf) the chosen page checked to begin a record."""
    name = ".".join(leaf.path)
    k = int(np.searchsorted(pages_of.first_row, leaf.first_row))
    size = int(pages_of.size[k])
    page = _read_at(source, leaf.page, size if leaf.max_repetition > 0 else min(size, 16 << 10))
    try:
        header, _ = decode(page)
    except ThriftError:
        page = _read_at(source, leaf.page, size)
        header, _ = page_header(page)
    if leaf.max_repetition > 0 and not starts_record(page, int(meta.get(META_CODEC, -1)), leaf.max_repetition):
        raise Unusable(f"{name}: the page holding row {leaf.first_row} begins inside a record")
    if header.get(HEADER_TYPE) not in (DATA_PAGE, DATA_PAGE_V2):
        raise Unusable(f"{name}: page {k} is not a data page")
    first_page = int(pages_of.offset[0])
    if chunk_start == first_page or _plain_from(header, k, meta):  # no dictionary, or none needed
        return leaf
    dictionary = _read_at(source, chunk_start, first_page - chunk_start)  # one dictionary page, and only that
    header, at = page_header(dictionary)
    if header.get(HEADER_TYPE) != DICTIONARY_PAGE or at + header.get(HEADER_COMPRESSED) != len(dictionary):
        raise Unusable(f"{name}: the bytes before the first data page are not one dictionary page")
    return _Leaf(leaf.index, leaf.path, leaf.max_repetition, leaf.first_row, leaf.page, leaf.end, dictionary,
                 leaf.num_values)


def _plain_from(header: TStruct, k: int, meta: TStruct) -> bool:
    """Whether the chunk's data pages from the k-th on need no dictionary: the k-th is not dictionary-encoded
    and the chunk's encoding stats count at most k dictionary-encoded data pages, which come first (writers
    fall back from dictionary to plain once per chunk: parquet-java's FallbackValuesWriter, Arrow's
    fallback_).  A writer that went back to the dictionary would make pyarrow raise ("Dictionary page must
    be before data page"), never decode wrongly.  Without the stats: the dictionary is read."""
    v1 = header.get(HEADER_TYPE) == DATA_PAGE
    page = header.get(HEADER_V1 if v1 else HEADER_V2)
    encoding = page.get(2 if v1 else 4) if isinstance(page, TStruct) else None
    stats = meta.get(META_ENCODING_STATS)
    if not isinstance(encoding, int) or encoding in DICTIONARY_ENCODINGS or not isinstance(stats, TList):
        return False
    dictionary_pages = 0
    for entry in stats.items:
        count = entry.get(3) if isinstance(entry, TStruct) else None
        if not isinstance(count, int):
            return False
        if entry.get(1) in (DATA_PAGE, DATA_PAGE_V2) and entry.get(2) in DICTIONARY_ENCODINGS:
            dictionary_pages += count
    return dictionary_pages <= k

