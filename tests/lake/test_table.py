"""One table read the way real writers leave them: one file mixing partitions, many small files, a retry's
duplicates, holes, hostile rows; read in windows, one read serving every partition it holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ksi.config import TopicConfig
from ksi.lake.files import Cursors
from ksi.lake.table import LakeError, LakeTable
from ksi.lake.values import ValueEncoder

from .tables import BASE_MS, Row, arrow_rows, catalog, interleaved, value_of, write


def lake_table(tmp_path: Path, name: str, files: list[list[Row]], row_group_rows: int = 1_000_000,
               window_rows: int = 40) -> LakeTable:
    lake = catalog(tmp_path)
    write(lake, name, files, row_group_rows)
    table = LakeTable(lake, TopicConfig(name=name, table=f"t.{name}", layout="redpanda"), window_rows=window_rows)
    table.offset_ranges()
    return table


def served(table: LakeTable, partition: int, offset: int = 0,
           caps: dict[int, int] | None = None) -> dict[int, list[int]]:
    """Offsets per partition of one read starting at ``partition``'s component holding ``offset``."""
    plan = table.plan
    component = plan.partitions[partition].locate(offset)
    assert component is not None
    result = table.read(plan, table.read_plan(plan, partition, component, caps), caps)
    out: dict[int, list[int]] = {}
    for span in result.spans:
        if span.records is not None:
            out.setdefault(span.partition, []).extend(int(o) for o in span.records.columns.offsets)
    return out


def test_one_file_mixing_partitions_is_read_once_for_all_of_them(tmp_path: Path) -> None:
    rows = interleaved(4, 100)  # 400 rows, one file, one row group; windows of 40 rows = 10 per partition
    table = lake_table(tmp_path, "onefile", [rows])
    assert {p: (r.first, r.last) for p, r in table.offset_ranges().items()} == dict.fromkeys(range(4), (0, 99))
    assert len(table.plan.files) == 1 and table.plan.partitions[0].components == 10
    first = served(table, 0)
    assert first == {p: list(range(20)) for p in range(4)}  # two windows: every partition's first 20 offsets
    # the next read goes on with the same stream (the cursor was kept at window 2)
    assert list(table.cursors._cursors) == [(table.plan.views[0].key, table.plan.files[0].path, 0, 2)]
    second = served(table, 2, 20)
    assert second == {p: list(range(20, 40)) for p in range(4)}


def test_many_small_files_partitions_interleaved(tmp_path: Path) -> None:
    rows = interleaved(3, 60)
    files = [rows[i:i + 12] for i in range(0, len(rows), 12)]  # 15 files of 4 offsets per partition
    table = lake_table(tmp_path, "streaming", files, window_rows=40)
    assert len(table.plan.files) == 15 and table.plan.partitions[1].components == 15
    got = served(table, 1)
    # a read takes about two windows' rows of files: 80 rows = 6 files of 12 rows (72)
    assert got[1] == list(range(24)) and got[0] == list(range(24)) and got[2] == list(range(24))


def test_duplicates_from_a_retry_are_served_once_and_differing_ones_are_counted(tmp_path: Path) -> None:
    first = [Row(0, o, value=value_of(0, o)) for o in range(30)]
    retry = [Row(0, o, value=value_of(0, o) if o != 25 else b"changed") for o in range(20, 40)]
    table = lake_table(tmp_path, "dups", [first, retry])
    plan = table.plan
    assert plan.partitions[0].components == 1 and plan.partitions[0].duplicates(0)
    result = table.read(plan, table.read_plan(plan, 0, 0, None), None)
    (span,) = result.spans
    assert list(span.records.columns.offsets) == list(range(40))
    values = span.records.columns.values.to_pylist()
    assert values[25] == value_of(0, 25)  # the first data file's row is served
    assert result.counts["duplicate"] == 10 and result.counts["differing_duplicate"] == 1
    assert result.differing == [(0, 25)]


def test_holes_are_spanned_by_the_component_after_them(tmp_path: Path) -> None:
    rows = [Row(0, o, value=value_of(0, o)) for o in [*range(10), *range(15, 20)]]
    table = lake_table(tmp_path, "holes", [rows[:10], rows[10:]])
    plan = table.plan
    assert plan.partitions[0].locate(12) == 1
    result = table.read(plan, table.read_plan(plan, 0, 1, None), None)
    (span,) = result.spans
    assert (span.start, span.stop) == (10, 20)  # covers the hole 10..14, so a fetch there is served past it
    assert list(span.records.columns.offsets) == list(range(15, 20))


def test_caps_keep_offsets_the_broker_holds_out_and_unknown_partitions_unserved(tmp_path: Path) -> None:
    table = lake_table(tmp_path, "caps", [interleaved(2, 30)], window_rows=100)
    got = served(table, 0, caps={0: 12})
    assert got == {0: list(range(12))}  # partition 1's log start is unknown: not served by this read
    got = served(table, 1, caps={0: 12, 1: 25})
    assert got == {0: list(range(12)), 1: list(range(25))}


def test_hostile_rows_are_dropped_and_counted(tmp_path: Path) -> None:
    lake = catalog(tmp_path)
    table = write(lake, "hostile", [[Row(0, o, value=value_of(0, o)) for o in range(5)]])
    # a second file: a negative offset (Redpanda's schema cannot forbid it), a duplicate that differs
    bad = [Row(0, -3, value=b"negative"), Row(1, 4, value=b"ok"), Row(0, 2, value=b"dup")]
    table.append(arrow_rows(table, bad))
    lake_t = LakeTable(lake, TopicConfig(name="hostile", table="t.hostile", layout="redpanda"), window_rows=40)
    ranges = lake_t.offset_ranges()
    assert {p: (r.first, r.last) for p, r in ranges.items()} == {0: (0, 4), 1: (4, 4)}
    assert lake_t.plan.bad_rows == 1
    result = lake_t.read(lake_t.plan, lake_t.read_plan(lake_t.plan, 0, 0, None), None)
    assert result.counts["differing_duplicate"] == 1  # the bad row never reaches a read: counted when indexed
    spans = {s.partition: s for s in result.spans}
    assert spans[0].records.columns.values.to_pylist() == [value_of(0, o) for o in range(5)]


def test_timestamp_lookup_finds_the_smallest_offset_at_or_after_the_time(tmp_path: Path) -> None:
    # timestamps go 20 ms back in time at offset 30: the first offset at or after BASE+25 is 25, not 45
    rows = [Row(0, o, timestamp=BASE_MS + (o if o < 30 else o - 20), value=b"v") for o in range(60)]
    table = lake_table(tmp_path, "ts", [rows[:20], rows[20:40], rows[40:]], window_rows=10)
    assert table.offset_for_timestamp(0, BASE_MS + 25) == (25, BASE_MS + 25)
    assert table.offset_for_timestamp(0, BASE_MS + 35) == (55, BASE_MS + 35)  # offsets 30.. are 20 ms back
    assert table.offset_for_timestamp(0, BASE_MS + 1000) is None
    assert table.offset_for_timestamp(7, BASE_MS) is None


def test_a_file_that_cannot_be_read_fails_the_read_not_the_plan(tmp_path: Path) -> None:
    table = lake_table(tmp_path, "gone", [interleaved(2, 10)])
    Path(table.plan.files[0].path.removeprefix("file://")).unlink()
    with pytest.raises(LakeError, match="cannot read data file"):
        served(table, 0)
    assert table.offset_ranges()  # the plan (and its index) is still known


def test_values_that_cannot_be_encoded_fail_only_their_partition(tmp_path: Path, monkeypatch: Any) -> None:
    table = lake_table(tmp_path, "values", [interleaved(2, 10)], window_rows=100)
    real = ValueEncoder.values

    def refuse_partition_one(self: ValueEncoder, raw: Any, ids: Any, typed: Any) -> Any:
        if raw is not None and any(v is not None and v.startswith(b"p1-") for v in raw.to_pylist()):
            from ksi.lake.values import ValuesError

            raise ValuesError("partition 1's values do not encode")
        return real(self, raw, ids, typed)

    monkeypatch.setattr(ValueEncoder, "values", refuse_partition_one)
    plan = table.plan
    result = table.read(plan, table.read_plan(plan, 0, 0, None), None)
    assert [s.partition for s in result.spans] == [0] and "do not encode" in result.failed[1]


def test_cursors_are_closed_when_their_row_group_is_read(tmp_path: Path) -> None:
    table = lake_table(tmp_path, "cursors", [interleaved(1, 30)], window_rows=10)
    assert isinstance(table.cursors, Cursors)
    served(table, 0)
    assert len(table.cursors._cursors) == 1  # at window 2 of 3
    served(table, 0, 20)
    assert table.cursors._cursors == {}  # read to its end: closed, not kept


def test_an_unreadable_file_makes_only_its_partitions_unavailable(tmp_path: Path) -> None:
    """A data file that cannot be read when ksi indexes it: the partitions its manifest bounds name are
    unavailable (their offsets cannot be served whole), the others are served; once it is readable again the
    next refresh picks it up."""
    from tests.shapes import synthetic, write_table

    lake = catalog(tmp_path)
    report = write_table(lake, "t.broken", synthetic(600, 3, seed=9), layout="ksi", shape="archive")
    victim = next(f for f in report.data_files if f.partition[0] == 1).file_path
    local = Path(victim.removeprefix("file://"))
    aside = local.with_name(local.name + ".away")
    local.rename(aside)
    table = LakeTable(lake, TopicConfig(name="broken", table="t.broken"), window_rows=100)
    ranges = table.offset_ranges()
    assert sorted(ranges) == [0, 2]
    assert table.unavailable(1) is not None and "cannot be read" in table.unavailable(1)
    assert table.unavailable(0) is None and table.unavailable(2) is None
    aside.rename(local)
    assert sorted(table.offset_ranges()) == [0, 1, 2] and table.unavailable(1) is None


def test_a_refresh_reads_the_metadata_file_only_when_the_catalog_points_at_a_new_one(tmp_path: Path,
                                                                                      monkeypatch: Any) -> None:
    from pyiceberg.serializers import FromInputFile

    rows = interleaved(2, 30)
    table = lake_table(tmp_path, "refresh", [rows[:20], rows[20:40]])
    reads = []
    parse = FromInputFile.table_metadata
    monkeypatch.setattr(FromInputFile, "table_metadata",
                        staticmethod(lambda input_file, *a, **k: reads.append(input_file.location) or
                                     parse(input_file, *a, **k)))
    before = table.offset_ranges()
    assert table.refresh() == table.snapshot_id and reads == []  # nothing new: one catalog query, no file read
    appended = table._catalog.load_table("t.refresh")
    appended.append(arrow_rows(appended, rows[40:]))
    reads.clear()
    after = table.offset_ranges()
    assert len(reads) == 1  # the new metadata file, once
    assert {p: r.last for p, r in before.items()} == {0: 19, 1: 19}
    assert {p: r.last for p, r in after.items()} == {0: 29, 1: 29}


def test_rows_are_gathered_alike_by_runs_and_by_take() -> None:
    """to_records' gather: row numbers that run consecutively are sliced (no copy for one run in one chunk),
    others taken from the combined column; both give the rows asked for, in the order asked, chunks or not."""
    import numpy as np
    import pyarrow as pa

    from ksi.lake.records import _Gather

    values = pa.chunked_array([pa.array([b"a", None, b"c"], pa.large_binary()),
                               pa.array([b"d", b"e"], pa.large_binary()), pa.array([b"f"], pa.large_binary())])
    headers = pa.chunked_array([pa.array([[{"key": "k", "value": b"1"}], None, []],
                                         pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
                                pa.array([[{"key": "x", "value": None}], None, [{"key": "y", "value": b"2"}]],
                                         pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))])
    for rows in ([0, 1, 2, 3, 4, 5], [1, 2], [3, 4, 5, 0, 1, 2], [2, 0, 5, 1], [4]):
        wanted = np.array(rows, np.int64)
        gather = _Gather(wanted)
        for column in (values, headers):
            assert gather(column).to_pylist() == [column.combine_chunks()[i].as_py() for i in rows]
    assert _Gather(np.arange(1, 3, dtype=np.int64)).runs == [(1, 2)]
    one = _Gather(np.arange(0, 3, dtype=np.int64))(values)
    assert one.buffers()[2].address == values.chunk(0).buffers()[2].address  # a slice, not a copy
    assert _Gather(np.array([2, 0, 5, 1], np.int64)).runs is None  # interleaved: taken


def test_a_replay_of_more_files_than_are_kept_open_parses_each_footer_at_most_once_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner indexes every file; it keeps open the first ``max_files`` (those a replay from the start
    reads first) instead of evicting them for the last, and a file read whole that is not open is opened once
    for its footer and the read."""
    from ksi.lake import files

    parsed: list[str] = []
    init = files.OpenFile.__init__

    def counting(self: files.OpenFile, view: Any, data_file: Any, *args: Any, **kwargs: Any) -> None:
        parsed.append(data_file.path)
        init(self, view, data_file, *args, **kwargs)

    monkeypatch.setattr(files.OpenFile, "__init__", counting)
    rows = interleaved(2, 60)
    lake = catalog(tmp_path)
    write(lake, "many", [rows[i:i + 8] for i in range(0, len(rows), 8)])  # 15 files of 4 offsets per partition
    table = LakeTable(lake, TopicConfig(name="many", table="t.many", layout="redpanda"),
                      cursors=Cursors(max_files=5), window_rows=40)
    table.offset_ranges()
    paths = [f.path for f in table.plan.files]
    assert len(paths) == 15 and sorted(parsed) == sorted(paths)  # each footer once to plan
    assert [k[1] for k in table.cursors._files] == paths[:5]  # the first five kept, not the last
    parsed.clear()
    offsets: dict[int, list[int]] = {0: [], 1: []}
    while len(offsets[0]) < 60:  # a replay from the start: each read goes on where the last one stopped
        for partition, records in served(table, 0, len(offsets[0])).items():
            offsets[partition] += [o for o in records if o not in offsets[partition]]
    assert offsets == {0: list(range(60)), 1: list(range(60))}
    assert sorted(parsed) == sorted(paths[5:])  # the replay parsed only the footers not kept, once each
    assert len(table.cursors._files) == 5


def test_files_of_one_physical_schema_share_a_projection_and_other_field_ids_do_not(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ksi.lake import files

    table = lake_table(tmp_path, "ids", [interleaved(1, 4)])
    view = table.plan.views[0]
    written = table.plan.files[0].path.removeprefix("file://")
    rows = pq.read_table(written)
    same, other = tmp_path / "same.parquet", tmp_path / "other.parquet"
    pq.write_table(rows, same)
    renumbered = pa.schema([f.with_metadata({b"PARQUET:field_id": b"99"}) if f.name == "value" else f
                            for f in rows.schema])
    pq.write_table(rows.cast(renumbered), other)
    first = files._projection(view, pq.ParquetFile(written))
    assert files._projection(view, pq.ParquetFile(same)) is first
    moved = files._projection(view, pq.ParquetFile(other))
    assert moved is not first and "value" in first.columns and "value" not in moved.columns
