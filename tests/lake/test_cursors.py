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
