"""Row-group cursors kept between reads: more streams in distinct positions of one large row group than the
old cap of 16 each go on where they stopped, without decoding the row group again from its start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ksi.config import TopicConfig, parse_config
from ksi.lake import files
from ksi.lake.files import Cursors
from ksi.lake.table import LakeTable

from .tables import catalog, interleaved, write

WINDOW = 20
STREAMS = 24          # more than the old cap of 16
WINDOWS = 2 * STREAMS  # one data file, one row group of 48 windows


def decoded_windows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that counts every window a cursor decodes."""
    count = [0]
    windows = files.OpenFile.windows

    def counting(self: files.OpenFile, parquet: Any, row_group: int) -> Iterator[pa.RecordBatch]:
        for batch in windows(self, parquet, row_group):
            count[0] += 1
            yield batch

    monkeypatch.setattr(files.OpenFile, "windows", counting)
    return count


@pytest.mark.parametrize("max_cursors", [STREAMS, 16])
def test_streams_in_distinct_positions_of_one_row_group_keep_their_cursors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_cursors: int) -> None:
    lake = catalog(tmp_path)
    write(lake, "big", [interleaved(1, WINDOW * WINDOWS)])
    table = LakeTable(lake, TopicConfig(name="big", table="t.big", layout="redpanda"),
                      cursors=Cursors(max_cursors=max_cursors), window_rows=WINDOW)
    table.offset_ranges()
    assert len(table.plan.files) == 1 and table.plan.files[0].record_count == WINDOW * WINDOWS
    decoded = decoded_windows(monkeypatch)
    for stream in range(STREAMS):  # each stream starts at its own window: decodes the windows before it once
        batch = table._window(table.plan, 0, 0, 2 * stream)
        assert batch.num_rows == WINDOW
    decoded[0] = 0
    for stream in range(STREAMS):  # ... then every stream reads its next window
        batch = table._window(table.plan, 0, 0, 2 * stream + 1)
        assert batch.column("redpanda").field("offset")[0].as_py() == (2 * stream + 1) * WINDOW
    if max_cursors >= STREAMS:
        assert decoded[0] == STREAMS  # one window each: every stream went on where it stopped
    else:
        assert decoded[0] > 10 * STREAMS  # the old cap: the streams evicted each other's cursors


def test_kept_cursors_are_bounded_by_the_bytes_their_readers_hold(tmp_path: Path) -> None:
    """Each kept cursor holds its reader's buffers (here: the pre-buffered row group); past ``max_bytes``
    the least recently used are closed, the one just kept never, and what is counted follows what is kept."""
    lake = catalog(tmp_path)
    write(lake, "big", [interleaved(1, WINDOW * WINDOWS)])
    cursors = Cursors(max_cursors=64)
    table = LakeTable(lake, TopicConfig(name="big", table="t.big", layout="redpanda"), cursors=cursors,
                      window_rows=WINDOW)
    table.offset_ranges()
    for stream in range(4):
        table._window(table.plan, 0, 0, 2 * stream)
    each = cursors.nbytes // 4
    assert len(cursors._cursors) == 4 and each > 0
    assert cursors.nbytes == sum(c.nbytes for c in cursors._cursors.values())
    cursors.max_bytes = 2 * each
    table._window(table.plan, 0, 0, 2 * 4)  # a fifth stream: the three oldest are closed
    assert len(cursors._cursors) == 2 and cursors.nbytes == 2 * each
    assert sorted(k[3] for k in cursors._cursors) == [7, 9]  # the newest two, each after its window
    cursors.max_bytes = 0
    table._window(table.plan, 0, 0, 9)  # taken and kept again: alone, even over the bound
    assert len(cursors._cursors) == 1 and cursors.nbytes == each


def test_max_cursors_is_configured() -> None:
    config = parse_config({"upstream": {"bootstrap_servers": "k:9092"}, "history": {"max_cursors": 300}})
    assert config.history.max_cursors == 300


@pytest.mark.parametrize("consumers", [1, 4])
async def test_a_sequential_replay_of_a_one_file_table_decodes_each_window_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, consumers: int) -> None:
    """One file, one row group, four partitions mixed in every window: replayed partition by partition by one
    consumer, or by four at once (one per partition), every window is decoded once."""
    import trio

    from ksi.history.chunks import encode_span
    from ksi.lake.cache import ChunkCache
    from ksi.lake.reader import ColdReader

    from .tables import offsets

    lake = catalog(tmp_path)
    write(lake, "mixed", [interleaved(4, 400)])  # 1,600 rows: 80 windows of 20, each holding every partition
    table = LakeTable(lake, TopicConfig(name="mixed", table="t.mixed", layout="redpanda"), window_rows=WINDOW)
    table.offset_ranges()
    windows = 1_600 // WINDOW
    decoded = decoded_windows(monkeypatch)
    reader = ColdReader(ChunkCache(64 << 20), threads=2)

    async def replay(partition: int, consumer: int) -> None:
        offset = 0
        while offset < 400:
            got = offsets(await reader.read(table, encode_span, partition, offset, None, None, 2_000,
                                            reader=consumer))
            assert got and got[0] == offset and got == list(range(offset, offset + len(got)))
            offset = got[-1] + 1

    async with trio.open_nursery() as nursery:
        await nursery.start(reader.serve)
        if consumers == 1:
            for partition in range(4):
                await replay(partition, 1)
        else:
            async with trio.open_nursery() as replays:
                for partition in range(4):
                    replays.start_soon(replay, partition, partition + 1)
        while reader._ahead:
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert decoded[0] == windows


def paged_table(tmp_path: Path, rows: list[Any], page_rows: int) -> Any:
    """A table of one data file, one row group, with a page index and pages of ``page_rows`` rows (as
    parquet-java writes them: Iceberg's Java writers, AutoMQ, the Kafka Connect sink), added to the table as
    a file written elsewhere (no field ids: read through the table's name mapping)."""
    import pyarrow.parquet as pq

    from .tables import REDPANDA, arrow_rows

    lake = catalog(tmp_path)
    table = lake.create_table("t.paged", schema=REDPANDA)
    data = arrow_rows(table, rows)
    plain = pa.schema([pa.field(f.name, f.type, f.nullable) for f in data.schema])  # no field ids
    path = tmp_path / "paged.parquet"
    pq.write_table(data.cast(plain), path, row_group_size=len(rows), write_page_index=True,
                   max_rows_per_page=page_rows, compression="zstd")
    table.add_files([f"file://{path}"])
    return lake


def test_a_read_may_start_mid_row_group_at_its_pages_and_the_cursor_it_leaves_behind_is_closed(
        tmp_path: Path) -> None:
    """With a page index a cursor starts at any window for the cost of a few pages, so a second stream of a row
    group another read streams starts cheaply (two threads decode one huge row group); a kept cursor whose
    next window the other stream has decoded is closed, not kept until evicted (its reader holds buffers)."""
    lake = paged_table(tmp_path, interleaved(1, WINDOW * 12), page_rows=WINDOW // 2)
    cursors = Cursors(max_cursors=64)
    table = LakeTable(lake, TopicConfig(name="paged", table="t.paged", layout="redpanda"), cursors=cursors,
                      window_rows=WINDOW)
    table.offset_ranges()
    plan = table.plan
    assert len(plan.files) == 1
    for window in range(3):  # stream A: windows 0-2, then kept at 3
        table._window(plan, 0, 0, window)
    assert [k[3] for k in cursors._cursors] == [3]
    assert table.starts_cheaply(plan, table.read_plan(plan, 0, 6, None, ahead_rows=WINDOW))
    batch = table._window(plan, 0, 0, 6)  # stream B, started at its pages: kept at 7, A kept at 3 still
    assert batch.column("redpanda").field("offset")[0].as_py() == 6 * WINDOW
    assert sorted(k[3] for k in cursors._cursors) == [3, 7]
    for window in (3, 4, 5):  # A goes on up to where B started: B decoded window 6, so A is closed
        table._window(plan, 0, 0, window)
    assert sorted(k[3] for k in cursors._cursors) == [7]
    assert cursors.nbytes == sum(c.nbytes for c in cursors._cursors.values())


def test_without_a_page_index_a_second_stream_of_a_row_group_is_not_started(tmp_path: Path) -> None:
    lake = catalog(tmp_path)
    write(lake, "big", [interleaved(1, WINDOW * 12)])
    table = LakeTable(lake, TopicConfig(name="big", table="t.big", layout="redpanda"), window_rows=WINDOW)
    table.offset_ranges()
    plan = table.plan
    table._window(plan, 0, 0, 0)
    assert not table.starts_cheaply(plan, table.read_plan(plan, 0, 6, None, ahead_rows=WINDOW))
    assert table.starts_cheaply(plan, table.read_plan(plan, 0, 1, None, ahead_rows=WINDOW))  # a cursor waits there


async def test_a_replay_of_a_paged_row_group_decodes_each_window_once_on_two_streams(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four partitions mixed in one page-indexed row group, replayed by four consumers at once: reads ahead
    start at the row group's pages while another read streams it, and still no window is decoded twice."""
    import trio

    from ksi.history.chunks import encode_span
    from ksi.lake.cache import ChunkCache
    from ksi.lake.reader import ColdReader

    from .tables import offsets

    lake = paged_table(tmp_path, interleaved(4, 400), page_rows=WINDOW // 2)  # 80 windows of 20 rows
    table = LakeTable(lake, TopicConfig(name="paged", table="t.paged", layout="redpanda"), window_rows=WINDOW)
    table.offset_ranges()
    decoded: list[int] = []
    window = LakeTable._window

    def counting(self: LakeTable, plan: Any, file: int, row_group: int, w: int) -> pa.RecordBatch:
        decoded.append(w)
        return window(self, plan, file, row_group, w)

    monkeypatch.setattr(LakeTable, "_window", counting)
    started_at_pages = [0]
    windows_from = files.OpenFile.windows_from

    def counting_starts(self: files.OpenFile, row_group: int, w: int) -> Any:
        found = windows_from(self, row_group, w)
        started_at_pages[0] += found is not None
        return found

    monkeypatch.setattr(files.OpenFile, "windows_from", counting_starts)
    reader = ColdReader(ChunkCache(64 << 20), threads=2)

    async def replay(partition: int) -> None:
        offset = 0
        while offset < 400:
            got = offsets(await reader.read(table, encode_span, partition, offset, None, None, 2_000,
                                            reader=partition + 1))
            assert got and got[0] == offset and got == list(range(offset, offset + len(got)))
            offset = got[-1] + 1

    async with trio.open_nursery() as nursery:
        await nursery.start(reader.serve)
        async with trio.open_nursery() as replays:
            for partition in range(4):
                replays.start_soon(replay, partition)
        while reader._ahead:
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert sorted(decoded) == list(range(80))
    assert started_at_pages[0] > 0


def test_a_page_index_that_cannot_be_used_stops_second_streams_after_one_try(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page index ksi.lake.pages refuses (a layout it does not expect) makes a cursor decode from the row
    group's start: that happens once, then reads ahead wait for the streaming cursor again, as without one."""
    lake = paged_table(tmp_path, interleaved(1, WINDOW * 12), page_rows=WINDOW // 2)
    table = LakeTable(lake, TopicConfig(name="paged", table="t.paged", layout="redpanda"), window_rows=WINDOW)
    table.offset_ranges()
    plan = table.plan
    table._window(plan, 0, 0, 0)
    ahead = table.read_plan(plan, 0, 6, None, ahead_rows=WINDOW)
    assert table.starts_cheaply(plan, ahead)
    monkeypatch.setattr(files, "read_from", lambda *args, **kwargs: None)
    batch = table._window(plan, 0, 0, 6)  # decoded from the row group's start
    assert batch.column("redpanda").field("offset")[0].as_py() == 6 * WINDOW
    assert not table.starts_cheaply(plan, table.read_plan(plan, 0, 9, None, ahead_rows=WINDOW))


def test_a_file_opened_again_past_max_files_keeps_its_projection(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``max_files`` a replay opens each small file again for its footer (``Cursors.whole_window``); its
    projection, found when the planner indexed it, is taken by path instead of from its schema's Arrow form
    again (a data file never changes), and the windows read are the same."""
    lake = catalog(tmp_path)
    write(lake, "small", [interleaved(2, 10 * (n + 1))[20 * n:] for n in range(6)])
    table = LakeTable(lake, TopicConfig(name="small", table="t.small", layout="redpanda"),
                      cursors=Cursors(max_files=2))
    table.offset_ranges()
    plan = table.plan
    assert len(plan.files) == 6
    first = [table._window(plan, n, 0, 0) for n in range(6)]
    assert all(batch is not None and batch.num_rows == 20 for batch in first)

    def not_again(self: Any) -> Any:
        raise AssertionError("the file's schema was read again")

    monkeypatch.setattr(files.pq.ParquetFile, "schema_arrow", property(not_again))
    again = [table._window(plan, n, 0, 0) for n in range(6)]  # four of them opened again
    assert [batch.to_pylist() for batch in again] == [batch.to_pylist() for batch in first]
