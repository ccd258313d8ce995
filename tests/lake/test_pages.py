"""ksi.lake.pages: a row group read from a row on through the Parquet page index gives exactly the windows
``iter_batches`` gives for those rows; a file it cannot read that way gives None (the caller decodes from the
row group's start), never other data.  And ksi.lake.thrift, the compact-protocol codec it reads the footer
and page headers with."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import PyArrowFileIO

from ksi.lake import thrift
from ksi.lake.nested import merge
from ksi.lake.page_format import starts_record
from ksi.lake.pages import FilePages, Pages, read_from
from ksi.lake.thrift import ThriftError, TList, TMap, TStruct, decode, encode

FILE_IO = PyArrowFileIO()
HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
META = pa.struct([pa.field("partition", pa.int32(), nullable=False), pa.field("offset", pa.int64()),
                  pa.field("timestamp", pa.timestamp("us", tz="UTC"))])
NESTED = pa.struct([pa.field("inner", pa.struct([pa.field("a", pa.int32()),
                                                 pa.field("b", pa.list_(pa.int64()))]))])


def kafka_like(n: int, seed: int = 0) -> pa.Table:
    """Rows with every kind of column a writer's table has: binaries of varying length (and large ones),
    strings that dictionary-encode, list<struct> headers with nulls and empty lists, a struct with a
    required field, a map, a struct of a struct of a list, plain int64s."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 60, n)
    value = [None if i % 11 == 5 else rng.bytes(int(lengths[i])) for i in range(n)]
    headers: list[Any] = []
    for i in range(n):
        if i % 9 == 0:
            headers.append(None)
        elif i % 9 == 1:
            headers.append([])
        else:
            headers.append([None if (i + j) % 13 == 0 else
                             {"key": f"h{j}", "value": None if (i + j) % 7 == 0 else b"v%d" % i}
                             for j in range(int(rng.integers(1, 4)))])
    meta = [None if i % 17 == 3 else {"partition": i % 4, "offset": i, "timestamp": 1_700_000_000_000_000 + i}
            for i in range(n)]
    attrs = [None if i % 10 == 4 else [(f"k{j}", b"x" * j) for j in range(i % 4)] for i in range(n)]
    nested = [None if i % 23 == 0 else {"inner": None if i % 19 == 0 else
                                        {"a": i, "b": None if i % 5 == 0 else list(range(i % 3))}}
              for i in range(n)]
    return pa.table({
        "value": pa.array(value, pa.binary()),
        "big": pa.array([None if v is None else v[:7] for v in value], pa.large_binary()),
        "text": pa.array([f"text-{i % 5}" for i in range(n)], pa.string()),
        "headers": pa.array(headers, pa.list_(HEADER)),
        "meta": pa.array(meta, META),
        "attrs": pa.array(attrs, pa.map_(pa.string(), pa.binary())),
        "nested": pa.array(nested, NESTED),
        "num": pa.array(rng.integers(-(1 << 40), 1 << 40, n), pa.int64()),
    })


def write(path: Path, table: pa.Table, row_group_rows: int, **options: Any) -> FilePages:
    options.setdefault("write_page_index", True)
    pq.write_table(table, path, row_group_size=row_group_rows, **options)
    return FilePages(FILE_IO, f"file://{path}", pq.read_metadata(path))


def expected(pages: FilePages, row_group: int, start: int, window: int, columns: list[str]) -> list[pa.RecordBatch]:
    """What the old path gives: iter_batches from the row group's start, sliced at ``start``, in windows."""
    parquet = pq.ParquetFile(pages.path.removeprefix("file://"))
    whole = pa.Table.from_batches(list(parquet.iter_batches(batch_size=window, row_groups=[row_group],
                                                            columns=columns, use_threads=False)))
    rest = whole.slice(start)
    return [rest.slice(i, window).combine_chunks().to_batches()[0] for i in range(0, rest.num_rows, window)]


def read(pages: FilePages, row_group: int, start: int, window: int, columns: list[str]) -> list[pa.RecordBatch] | None:
    reader = read_from(pages, row_group, start, columns, window, min_saved_windows=0)
    if reader is None:
        return None
    try:
        return list(reader)
    finally:
        reader.close()


def same(got: list[pa.RecordBatch], want: list[pa.RecordBatch]) -> bool:
    return len(got) == len(want) and all(g.schema == w.schema and g.equals(w) for g, w in zip(got, want, strict=True))


COLUMNS = ["value", "big", "text", "headers", "meta", "attrs", "nested", "num"]
FILES = {  # name -> pyarrow writer options (small pages, many per chunk, their rows differing per column;
    # pyarrow checks a page's size every write_batch_size rows)
    "zstd-v1-dictionary": {"compression": "zstd", "data_page_size": 1024, "max_rows_per_page": 37},
    "snappy-v2-dictionary": {"compression": "snappy", "data_page_version": "2.0", "data_page_size": 700,
                             "max_rows_per_page": 45, "write_batch_size": 16},
    "uncompressed-v1-plain": {"compression": "none", "use_dictionary": False, "data_page_size": 512,
                              "write_batch_size": 10},
    "gzip-v2-some-dictionary": {"compression": "gzip", "data_page_version": "2.0", "data_page_size": 900,
                                "use_dictionary": ["text", "headers.list.element.key"], "write_batch_size": 24},
    "zstd-v1-small-dictionary": {"compression": "zstd", "data_page_size": 800, "dictionary_pagesize_limit": 300,
                                 "write_batch_size": 8},
}


@pytest.mark.parametrize("name", list(FILES))
def test_every_start_row_gives_the_windows_iter_batches_gives(tmp_path: Path, name: str) -> None:
    rows = 900
    pages = write(tmp_path / "f.parquet", kafka_like(rows, seed=len(name)), row_group_rows=400, **FILES[name])
    assert pages.metadata.num_row_groups == 3
    used = 0
    for row_group, starts in ((1, range(1, 400)), (0, range(1, 400, 7)), (2, range(1, 100))):
        for window in (64,) if row_group == 1 else (33, 500):
            for start in starts:
                got = read(pages, row_group, start, window, COLUMNS)
                if got is None:
                    continue
                used += 1
                assert same(got, expected(pages, row_group, start, window, COLUMNS)), (row_group, start, window)
    assert used > 300  # the page index was used for most start rows (not those whose first pages hold them)


def test_a_subset_of_columns_and_one_leaf_of_a_struct_in_another_group(tmp_path: Path) -> None:
    table = kafka_like(2000, seed=3)
    pages = write(tmp_path / "f.parquet", table, row_group_rows=2000, compression="zstd", data_page_size=300,
                  column_encoding={"meta.offset": "PLAIN", "meta.timestamp": "DELTA_BINARY_PACKED"},
                  use_dictionary=["meta.partition"], write_batch_size=10)
    index = pages.offset_indexes(FILE_IO.new_input(pages.path).open(), 0,
                                 [(i, pages.footer.get(4).items[0].get(1).items[i]) for i in (5, 6, 7)])
    assert len({tuple(p.first_row) for p in index.values()}) == 3  # the struct's leaves: pages cut apart
    used = 0
    for start in range(1, 2000, 13):
        got = read(pages, 0, start, 100, ["meta", "num"])
        if got is not None:
            used += 1
            assert same(got, expected(pages, 0, start, 100, ["meta", "num"])), start
    assert used > 100


def test_required_columns_of_every_physical_type(tmp_path: Path) -> None:
    """Required top-level columns have no definition levels: their padding rows are zeros of their type."""
    n = 1500
    rng = np.random.default_rng(2)
    schema = pa.schema([pa.field(name, kind, nullable=False) for name, kind in (
        ("b", pa.bool_()), ("i32", pa.int32()), ("i64", pa.int64()), ("f", pa.float32()), ("d", pa.float64()),
        ("bin", pa.binary()), ("s", pa.string()), ("fixed", pa.binary(5)), ("ts", pa.timestamp("ns")))])
    table = pa.table([
        pa.array(rng.integers(0, 2, n).astype(bool)), pa.array(rng.integers(-99, 99, n), pa.int32()),
        pa.array(rng.integers(-(1 << 50), 1 << 50, n)), pa.array(rng.random(n), pa.float32()), pa.array(rng.random(n)),
        pa.array([rng.bytes(int(k)) for k in rng.integers(0, 20, n)]), pa.array([f"s{i}" for i in range(n)]),
        pa.array([rng.bytes(5) for _ in range(n)], pa.binary(5)),
        pa.array(rng.integers(0, 1 << 60, n), pa.timestamp("ns")),
    ], schema=schema)
    for options in ({"use_deprecated_int96_timestamps": True, "compression": "snappy"},
                    {"data_page_version": "2.0", "compression": "zstd"}):
        pages = write(tmp_path / "f.parquet", table, row_group_rows=n, data_page_size=400, write_batch_size=16,
                      use_dictionary=False, **options)
        used = 0
        for start in range(1, n, 37):
            got = read(pages, 0, start, 128, schema.names)
            if got is not None:
                used += 1
                assert same(got, expected(pages, 0, start, 128, schema.names)), (options, start)
        assert used > 30


def test_java_writer_pages(tmp_path: Path) -> None:
    """The settings tests.shapes gives Java writers (1 MiB pages, 20,000 rows, 2 MiB dictionary)."""
    table = kafka_like(60_000, seed=5)
    pages = write(tmp_path / "f.parquet", table, row_group_rows=60_000, compression="zstd", max_rows_per_page=20_000,
                  dictionary_pagesize_limit=2 << 20)
    for start in (1, 19_999, 20_000, 20_001, 32_768, 45_000, 59_999):
        got = read(pages, 0, start, 32_768, COLUMNS)
        want = expected(pages, 0, start, 32_768, COLUMNS)
        assert got is None if start < 20_000 else got is not None and same(got, want), start


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(2, 400), seed=st.integers(0, 1000), page=st.integers(64, 2048),
       page_rows=st.one_of(st.none(), st.integers(1, 60)), version=st.sampled_from(["1.0", "2.0"]),
       compression=st.sampled_from(["none", "snappy", "zstd"]), dictionary=st.booleans(),
       columns=st.lists(st.sampled_from(COLUMNS), min_size=1, max_size=4, unique=True),
       window=st.integers(1, 120), batch=st.integers(1, 64), data=st.data())
def test_property_random_tables(tmp_path: Path, rows: int, seed: int, page: int, page_rows: int | None,
                                version: str, compression: str, dictionary: bool, columns: list[str],
                                window: int, batch: int, data: st.DataObject) -> None:
    options: dict[str, Any] = {"data_page_size": page, "data_page_version": version, "compression": compression,
                               "use_dictionary": dictionary, "write_batch_size": batch}
    if page_rows is not None:
        options["max_rows_per_page"] = page_rows
    pages = write(tmp_path / f"p{seed}-{rows}.parquet", kafka_like(rows, seed), row_group_rows=rows, **options)
    start = data.draw(st.integers(1, rows - 1))
    got = read(pages, 0, start, window, columns)
    if got is not None:
        assert same(got, expected(pages, 0, start, window, columns))


# ------------------------------------------------------------------------------------------------ fallbacks

def test_no_page_index_no_page_read(tmp_path: Path) -> None:
    pages = write(tmp_path / "f.parquet", kafka_like(500), row_group_rows=500, data_page_size=256,
                  write_page_index=False)
    assert read_from(pages, 0, 300, COLUMNS, 50) is None


def test_nothing_to_skip_or_nothing_there(tmp_path: Path) -> None:
    pages = write(tmp_path / "f.parquet", kafka_like(500), row_group_rows=500)  # one page per chunk
    assert read_from(pages, 0, 300, COLUMNS, 50) is None
    small = write(tmp_path / "g.parquet", kafka_like(500), row_group_rows=500, data_page_size=256)
    assert read_from(small, 0, 0, COLUMNS, 50) is None      # row 0: the whole chunk anyway
    assert read_from(small, 0, 500, COLUMNS, 50) is None    # past the row group


def test_pages_that_skip_less_than_a_window_are_not_worth_it(tmp_path: Path) -> None:
    table = pa.table({"v": pa.array([b"%05d" % i * 20 for i in range(4000)], pa.binary())})
    pages = write(tmp_path / "f.parquet", table, row_group_rows=4000, use_dictionary=False, max_rows_per_page=100)
    near = read_from(pages, 0, 150, ["v"], 1000)        # skips one page of 100 rows: a tenth of a window
    far = read_from(pages, 0, 2050, ["v"], 1000)        # skips 20 pages, two windows
    assert near is None and far is not None
    far.close()
    reader = read_from(pages, 0, 150, ["v"], 1000, min_saved_windows=0.05)
    assert reader is not None
    reader.close()


def test_a_file_pyarrow_cannot_read_this_way_is_not_tried_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    from ksi.lake import pages as module

    pages = write(tmp_path / "f.parquet", kafka_like(2000), row_group_rows=2000, data_page_size=256,
                  write_batch_size=10, use_dictionary=False)
    moved = module._moved

    def broken(chunk: TStruct, begin: int, data_page: int, *args: Any) -> TStruct:  # a page header off by one
        return moved(chunk, begin + 1, data_page + 1, *args)

    monkeypatch.setattr(module, "_moved", broken)
    assert read_from(pages, 0, 1500, COLUMNS, 100) is None
    assert pages.failed is not None and "decode from the row group's start" in caplog.text
    monkeypatch.setattr(module, "_moved", moved)
    assert read_from(pages, 0, 1500, COLUMNS, 100) is None  # not tried again


def test_a_column_name_with_a_dot(tmp_path: Path) -> None:
    table = pa.table({"a.b": pa.array(range(1000), pa.int64()), "c": pa.array(range(1000), pa.int64())})
    pages = write(tmp_path / "f.parquet", table, row_group_rows=1000, data_page_size=256, write_batch_size=10)
    assert read_from(pages, 0, 600, ["a.b", "c"], 50) is None
    got = read(pages, 0, 600, 50, ["c"])
    assert got is not None and same(got, expected(pages, 0, 600, 50, ["c"]))


def _walk(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(offset, size with header, page type, values) of every page in [start, end)."""
    out = []
    pos = start
    while pos < end:
        header, at = decode(data, pos)
        size = at - pos + header.get(3)
        kind = header.get(1)
        values = header.get(5).get(1) if kind == 0 else header.get(8).get(1) if kind == 3 else 0
        out.append((pos, size, kind, values))
        pos += size
    assert pos == end
    return out


def _hybrid(levels: list[int], width: int) -> bytes:
    """Levels in the RLE/bit-packed hybrid encoding, bit-packed throughout (groups of 8, LSB first)."""
    padded = levels + [0] * (-len(levels) % 8)
    bits = sum(level << (i * width) for i, level in enumerate(padded))
    return bytes([(len(padded) // 8) << 1 | 1]) + bits.to_bytes(len(padded) * width // 8, "little")


def split_records_file(path: Path, records: int, elements: int, page_levels: int) -> pa.Table:
    """A file of one list<int64> column whose v1 pages hold ``page_levels`` values each, so most begin inside
    a record, with an OffsetIndex whose first rows count the records begun before each page (as a writer
    that splits records across pages, Arrow before 12.0 with the page index on, leaves it)."""
    I32, I64 = thrift.I32, thrift.I64

    def s(**fields: tuple[int, Any]) -> TStruct:
        return TStruct({int(k[1:]): v for k, v in fields.items()})

    values = [r * 100 + e for r in range(records) for e in range(elements)]
    out = bytearray(b"PAR1")
    locations, first_value = [], 0
    while first_value < len(values):
        chunk = values[first_value:first_value + page_levels]
        rep = _hybrid([0 if (first_value + i) % elements == 0 else 1 for i in range(len(chunk))], 1)
        definition = _hybrid([3] * len(chunk), 2)
        body = (struct.pack("<I", len(rep)) + rep + struct.pack("<I", len(definition)) + definition
                + struct.pack(f"<{len(chunk)}q", *chunk))
        header = encode(s(f1=(I32, 0), f2=(I32, len(body)), f3=(I32, len(body)),
                          f5=(thrift.STRUCT, s(f1=(I32, len(chunk)), f2=(I32, 0), f3=(I32, 3), f4=(I32, 3)))))
        locations.append(s(f1=(I64, len(out)), f2=(I32, len(header) + len(body)),
                           f3=(I64, -(-first_value // elements))))
        out += header + body
        first_value += len(chunk)
    chunk_size = len(out) - 4
    index = encode(s(f1=(thrift.LIST, TList(thrift.STRUCT, locations))))
    index_at = len(out)
    out += index
    schema = [s(f4=(thrift.BINARY, b"schema"), f5=(I32, 1)),
              s(f3=(I32, 1), f4=(thrift.BINARY, b"tags"), f5=(I32, 1), f6=(I32, 3)),
              s(f3=(I32, 2), f4=(thrift.BINARY, b"list"), f5=(I32, 1)),
              s(f1=(I32, 2), f3=(I32, 1), f4=(thrift.BINARY, b"element"))]
    meta = s(f1=(I32, 2), f2=(thrift.LIST, TList(I32, [0, 3])),
             f3=(thrift.LIST, TList(thrift.BINARY, [b"tags", b"list", b"element"])), f4=(I32, 0),
             f5=(I64, len(values)), f6=(I64, chunk_size), f7=(I64, chunk_size), f9=(I64, 4))
    column = s(f2=(I64, 4), f3=(thrift.STRUCT, meta), f4=(I64, index_at), f5=(I32, len(index)))
    group = s(f1=(thrift.LIST, TList(thrift.STRUCT, [column])), f2=(I64, chunk_size), f3=(I64, records))
    footer = encode(s(f1=(I32, 1), f2=(thrift.LIST, TList(thrift.STRUCT, schema)), f3=(I64, records),
                      f4=(thrift.LIST, TList(thrift.STRUCT, [group])), f6=(thrift.BINARY, b"a hand-made writer")))
    path.write_bytes(bytes(out) + footer + struct.pack("<I", len(footer)) + b"PAR1")
    return pa.table({"tags": pa.array([values[r * elements:(r + 1) * elements] for r in range(records)],
                                      pa.list_(pa.int64()))})


def test_pages_that_split_records_are_not_started_inside_a_record(tmp_path: Path) -> None:
    elements, levels = 7, 30
    path = tmp_path / "split.parquet"
    table = split_records_file(path, 100, elements, levels)
    assert pq.read_table(path).column(0).to_pylist() == table.column(0).to_pylist()  # pyarrow reads it whole
    pages = FilePages(FILE_IO, f"file://{path}", pq.read_metadata(path))
    fallbacks = reads = 0
    for start in range(1, 100):
        page = max(p for p in range(-(-100 * elements // levels)) if -(-p * levels // elements) <= start)
        got = read(pages, 0, start, 10, ["tags"])
        if page == 0:  # the first page holds the row: nothing to skip
            assert got is None
        elif page * levels % elements:  # the page holding the row begins inside a record
            assert got is None, start
            fallbacks += 1
        else:
            assert got is not None and same(got, expected(pages, 0, start, 10, ["tags"])), start
            reads += 1
    assert fallbacks and reads


def test_starts_record_reads_the_first_repetition_level() -> None:
    def page(levels: bytes, v2: bool) -> bytes:
        if v2:
            header = TStruct({1: (thrift.I32, 3), 2: (thrift.I32, len(levels)), 3: (thrift.I32, len(levels)),
                              8: (thrift.STRUCT, TStruct({1: (thrift.I32, 1), 2: (thrift.I32, 0),
                                                          3: (thrift.I32, 1), 4: (thrift.I32, 0),
                                                          5: (thrift.I32, 0), 6: (thrift.I32, len(levels))}))})
            return encode(header) + levels
        body = struct.pack("<I", len(levels)) + levels
        header = TStruct({1: (thrift.I32, 0), 2: (thrift.I32, len(body)), 3: (thrift.I32, len(body)),
                          5: (thrift.STRUCT, TStruct({1: (thrift.I32, 1), 2: (thrift.I32, 0), 3: (thrift.I32, 3),
                                                      4: (thrift.I32, 3)}))})
        return encode(header) + body

    for v2 in (False, True):
        assert starts_record(page(bytes([2 << 1, 0]), v2), 0, 1)        # an RLE run of 0s
        assert not starts_record(page(bytes([2 << 1, 1]), v2), 0, 1)    # an RLE run of 1s
        assert starts_record(page(bytes([1 << 1 | 1, 0b11111110]), v2), 0, 1)  # bit-packed 0, 1, 1, ...
        assert not starts_record(page(bytes([1 << 1 | 1, 0b00000001]), v2), 0, 1)
        assert not starts_record(page(bytes([1 << 1 | 1, 0b110]), v2), 0, 3)  # 2-bit levels: 2, 1, ...


# ------------------------------------------------------------------------------------------------------ merge

def test_merge_puts_parts_of_nested_columns_together() -> None:
    full = kafka_like(300, seed=9)
    for name in ("headers", "meta", "attrs", "nested"):
        column = full.column(name).combine_chunks().slice(17, 200)
        buffer = pa.BufferOutputStream()
        pq.write_table(pa.table({name: column}), buffer)
        parquet = pq.ParquetFile(pa.BufferReader(buffer.getvalue()))
        leaves = [parquet.metadata.schema.column(i).path for i in range(parquet.metadata.num_columns)]
        parts = [parquet.read(columns=[leaf]).column(0).combine_chunks().slice(5) for leaf in leaves]
        assert len(parts) > 1
        merged = merge(column.type, parts)
        assert merged.type == column.type and merged.equals(column.slice(5)), name


# ----------------------------------------------------------------------------------------------------- thrift

def test_thrift_round_trips_footers_and_page_headers_byte_for_byte(tmp_path: Path) -> None:
    for version in ("1.0", "2.0"):
        path = tmp_path / f"f{version}.parquet"
        pages = write(path, kafka_like(700), row_group_rows=300, data_page_size=512, data_page_version=version)
        data = path.read_bytes()
        length = struct.unpack("<I", data[-8:-4])[0]
        raw = data[-8 - length:-8]
        footer, end = decode(raw)
        assert end == len(raw) and encode(footer) == raw
        assert encode(pages.footer) == raw  # pyarrow's own serialization of what it read: the same bytes
        for group in footer.get(4).items:
            for chunk in group.get(1).items:
                meta = chunk.get(3)
                begin = min(v for v in (meta.get(9), meta.get(11)) if v is not None)
                for offset, *_ in _walk(data, begin, begin + meta.get(7)):
                    header, at = decode(data, offset)
                    assert encode(header) == data[offset:at]
                oi = data[chunk.get(4):chunk.get(4) + chunk.get(5)]
                index, _ = decode(oi)
                assert encode(index) == oi and len(Pages.parse(oi).offset) >= 1


def every_kind() -> TStruct:
    inner = TStruct({1: (thrift.BINARY, b"x"), 3: (thrift.TRUE, False)})
    return TStruct({
        1: (thrift.I32, -5), 2: (thrift.I64, 1 << 60), 3: (thrift.TRUE, True), 4: (thrift.TRUE, False),
        5: (thrift.BYTE, -3), 6: (thrift.DOUBLE, 2.5), 7: (thrift.BINARY, b"\x00\xff" * 10),
        8: (thrift.LIST, TList(thrift.I32, list(range(-20, 20)))),  # more than 14 items: a varint size
        9: (thrift.SET, TList(thrift.BINARY, [b"a", b"b"])),
        10: (thrift.LIST, TList(thrift.TRUE, [True, False, True])),
        11: (thrift.MAP, TMap(thrift.BINARY, thrift.STRUCT, [(b"k", inner), (b"l", TStruct())])),
        12: (thrift.MAP, TMap(0, 0, [])),
        30: (thrift.I16, 7),                                   # a delta over 15: the long field header
        29: (thrift.STRUCT, inner),                            # ids out of order: kept as read
        -2: (thrift.I32, 1),
        32767: (thrift.LIST, TList(thrift.STRUCT, [inner, inner])),
    })


def test_thrift_keeps_unknown_fields_and_every_type() -> None:
    data = encode(every_kind())
    value, end = decode(data)
    assert end == len(data) and encode(value) == data
    assert value.get(3) is True and value.get(4) is False and value.get(8).items == list(range(-20, 20))


def test_thrift_decoders_whole_byte_by_byte_and_with_trailing_bytes() -> None:
    data = encode(every_kind())
    for cut in range(len(data)):
        with pytest.raises(ThriftError):
            decode(data[:cut])
    value, end = decode(data + b"trailing")
    assert end == len(data) and encode(value) == data
    value, end = decode(b"xx" + data, 2)
    assert end == len(data) + 2
    with pytest.raises(ThriftError):
        decode(bytes([0x0D]))  # compact type 13 does not exist


thrift_values = st.deferred(lambda: st.one_of(
    st.tuples(st.just(thrift.I64), st.integers(-(1 << 63), (1 << 63) - 1)),
    st.tuples(st.just(thrift.I32), st.integers(-(1 << 31), (1 << 31) - 1)),
    st.tuples(st.just(thrift.TRUE), st.booleans()),
    st.tuples(st.just(thrift.BINARY), st.binary(max_size=40)),
    st.tuples(st.just(thrift.DOUBLE), st.floats(allow_nan=False)),
    st.tuples(st.just(thrift.LIST), st.lists(st.integers(-1000, 1000), max_size=20).map(
        lambda items: TList(thrift.I32, items))),
    st.tuples(st.just(thrift.STRUCT), thrift_structs),
))
thrift_structs = st.dictionaries(st.integers(-300, 300), thrift_values, max_size=6).map(TStruct)


@settings(max_examples=200, deadline=None)
@given(thrift_structs)
def test_property_thrift_round_trip(value: TStruct) -> None:
    data = encode(value)
    decoded, end = decode(data)
    assert end == len(data) and encode(decoded) == data


# -------------------------------------------------------------------------------- through ksi.lake.files

def java_written_table(tmp_path: Path, rows: int = 60_000, row_group_rows: int = 30_000) -> Any:
    """AutoMQ's one-file table as its Java writer leaves it (tests.shapes: the page index, pages of at most
    20,000 rows, a 2 MiB dictionary), two row groups."""
    from tests.shapes import synthetic, write_table

    from .tables import catalog

    lake = catalog(tmp_path)
    write_table(lake, "t.topic", synthetic(rows, 4, seed=7), layout="automq", shape="one-file", key_type="raw",
                row_group_rows=row_group_rows)
    return lake


def counting_page_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """[reads through the page index, reads that fell back]."""
    from ksi.lake import files

    count = [0, 0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        reader = read_from(*args, **kwargs)
        count[reader is None] += 1
        return reader

    monkeypatch.setattr(files, "read_from", counted)
    return count


def test_a_cursor_made_at_a_window_reads_on_as_one_made_at_the_start(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from ksi.config import TopicConfig
    from ksi.lake.files import Cursors
    from ksi.lake.table import LakeTable

    lake = java_written_table(tmp_path)
    table = LakeTable(lake, TopicConfig(name="topic", table="t.topic", layout="automq"), window_rows=1000)
    table.offset_ranges()
    plan = table.plan
    (data_file,) = plan.files
    view = plan.views[data_file.source]
    reference = {}
    for row_group in (0, 1):
        cursor = Cursors().take(view, data_file, row_group, 0)
        reference[row_group] = [cursor.next_window() for _ in range(cursor.windows)]
        assert cursor.exhausted
        cursor.close()
    counts = counting_page_reads(monkeypatch)
    for row_group, windows in ((1, range(1, 30)), (0, range(3, 30, 4))):
        for window in windows:
            cursors = Cursors()
            cursor = cursors.take(view, data_file, row_group, window)
            assert cursor.position == window
            got = [cursor.next_window() for _ in range(window, cursor.windows)]
            assert cursor.exhausted and cursor.next_window() is None
            cursor.close()
            assert all(g is not None and g.equals(w) for g, w in zip(got, reference[row_group][window:], strict=True))
    assert counts[0] >= 10  # every seek past the first pages (20,000 rows) started at the pages holding it


def test_a_seek_through_the_lake_reads_the_records_it_read_before(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from ksi.config import TopicConfig
    from ksi.lake import files
    from ksi.lake.table import LakeTable

    lake = java_written_table(tmp_path)
    topic = TopicConfig(name="topic", table="t.topic", layout="automq")

    def seek(partition: int, offset: int) -> list[tuple[int, int, Any, Any, Any]]:
        table = LakeTable(lake, topic, window_rows=1000)  # a fresh table: no cursor open anywhere
        table.offset_ranges()
        plan = table.plan
        component = plan.partitions[partition].locate(offset)
        assert component is not None
        result = table.read(plan, table.read_plan(plan, partition, component, None), None)
        out = []
        for span in result.spans:
            if span.records is not None:
                c = span.records.columns
                out += zip([span.partition] * len(c), c.offsets.tolist(), c.timestamps.tolist(), c.keys.to_pylist(),
                           c.values.to_pylist(), strict=True)
        return out

    # 4 partitions interleaved: offsets 5,000-7,499 are in rows 20,000-29,999 of the first row group (its
    # second pages), 12,500-14,999 in the second's; 10,000 is in the second's first pages (decoded from the start)
    targets = [(1, 7_000), (3, 13_000), (0, 14_000), (2, 5_500), (2, 10_000)]
    counts = counting_page_reads(monkeypatch)
    through_pages = [seek(p, o) for p, o in targets]
    assert counts[0] >= 4
    monkeypatch.setattr(files, "read_from", lambda *args, **kwargs: None)  # the old way: decode from the start
    assert through_pages == [seek(p, o) for p, o in targets]
    assert all(any(p == partition and o == offset for p, o, *_ in got)
               for (partition, offset), got in zip(targets, through_pages, strict=True))
