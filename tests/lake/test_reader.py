"""The cold reader's reads ahead: they ramp up from a quarter window while a consumer keeps coming back, and
start small again after a read it had to wait for (a seek), so a seek that takes a few records and leaves
costs little beyond them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from kafka.record.default_records import DefaultRecordBatch

from ksi.config import TopicConfig
from ksi.history.chunks import encode_span
from ksi.lake.cache import ChunkCache
from ksi.lake.reader import ColdReader
from ksi.lake.table import READ_WINDOWS, LakeTable

from .tables import catalog, interleaved, write

WINDOW = 40


def streaming_table(tmp_path: Path) -> LakeTable:
    rows = interleaved(2, 400)  # 800 rows in 80 files of 10: components of 5 offsets per partition
    lake = catalog(tmp_path)
    write(lake, "ramp", [rows[i:i + 10] for i in range(0, len(rows), 10)])
    table = LakeTable(lake, TopicConfig(name="ramp", table="t.ramp", layout="redpanda"), window_rows=WINDOW)
    table.offset_ranges()
    return table


async def test_reads_ahead_ramp_up_and_start_small_again_after_a_seek(tmp_path: Path, monkeypatch: Any) -> None:
    table = streaming_table(tmp_path)
    sizes: list[int | None] = []
    plan_read = table.read_plan

    def recording(plan: Any, partition: int, component: int, caps: Any, waited_for: bool = False,
                  ahead_rows: int | None = None) -> Any:
        if not waited_for:
            sizes.append(ahead_rows)
        return plan_read(plan, partition, component, caps, waited_for, ahead_rows)

    monkeypatch.setattr(table, "read_plan", recording)
    reader = ColdReader(ChunkCache(64 << 20), threads=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(reader.serve)

        async def read(offset: int, settle: bool = True) -> int:
            """Read partition 0 from ``offset`` as a consumer does; the next offset to fetch.  ``settle``: the
            read ahead finishes before this returns (else the next read may find it in flight)."""
            got = await reader.read(table, encode_span, 0, offset, None, None, 1 << 20, reader=1)
            assert got
            while settle and reader._ahead:  # the read ahead finishes first, as before a consumer's next fetch
                await trio.sleep(0.01)
            return max(record.offset for data in got for record in DefaultRecordBatch(data)) + 1

        offset = 0
        for _ in range(6):
            offset = await read(offset)
        quarter = WINDOW // 4
        assert sizes[:5] == [quarter, 2 * quarter, 4 * quarter, READ_WINDOWS * WINDOW, READ_WINDOWS * WINDOW]
        sizes.clear()
        offset = await read(300, settle=False)  # a seek: nothing was read ahead there
        offset = await read(offset)  # may catch its read ahead in flight: sequential still, the ramp goes on
        await read(offset)
        assert sizes[:2] == [quarter, 2 * quarter]
        nursery.cancel_scope.cancel()
