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
from ksi.metrics import CACHE_HITS, CACHE_MISSES

from .tables import catalog, interleaved, offsets, write

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
                  ahead_rows: int | None = None, max_rows: int | None = None) -> Any:
        if not waited_for:
            sizes.append(ahead_rows)
        return plan_read(plan, partition, component, caps, waited_for, ahead_rows, max_rows)

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


def recorded_reads(table: LakeTable, monkeypatch: Any) -> list[dict[int, list[int]]]:
    """What each lake read of ``table`` served: partition -> components (every read decodes its windows once)."""
    served: list[dict[int, list[int]]] = []
    decode = table.decode

    def recording(plan: Any, read_plan: Any) -> Any:
        served.append({p: list(c) for p, c in read_plan.served.items()})
        return decode(plan, read_plan)

    monkeypatch.setattr(table, "decode", recording)
    return served


async def test_a_read_a_consumer_waits_for_serves_its_partition_before_the_others(tmp_path: Path,
                                                                                  monkeypatch: Any) -> None:
    """A seek into windows that hold every partition: the consumer is answered once its own partition's records
    are encoded; the other partitions the same windows hold are made from the same decode after it (before,
    a seek waited for all of them: about half of its time on a table that mixes four partitions)."""
    import threading

    table = streaming_table(tmp_path)
    reads = recorded_reads(table, monkeypatch)
    release = threading.Event()
    encoded: list[int] = []

    def encode(span: Any) -> Any:
        if span.partition != 0:
            release.wait(10)  # the other partition's encoding waits until the consumer of partition 0 has its answer
        encoded.append(span.partition)
        return encode_span(span)

    reader = ColdReader(ChunkCache(64 << 20), threads=2, prefetch=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(reader.serve)
        try:
            with trio.fail_after(5):
                got = await reader.read(table, encode, 0, 200, None, None, 1 << 20, reader=1)
            assert offsets(got)[0] == 200 and set(encoded) == {0}
            assert len(reads) == 1 and 1 in reads[0]  # the read serves partition 1 too
        finally:
            release.set()
        with trio.fail_after(5):
            other = await reader.read(table, encode, 1, 200, None, None, 1 << 20, reader=2)
        assert offsets(other)[0] == 200
        assert len(reads) == 1  # partition 1's records came from the same decoded windows
        nursery.cancel_scope.cancel()


def single_partition_table(tmp_path: Path, name: str, lake: Any = None) -> LakeTable:
    rows = interleaved(1, 400)  # 400 rows in 40 files of 10: components of 10 offsets, ~250 bytes encoded
    lake = lake or catalog(tmp_path)
    write(lake, name, [rows[i:i + 10] for i in range(0, len(rows), 10)])
    table = LakeTable(lake, TopicConfig(name=name, table=f"t.{name}", layout="redpanda"), window_rows=WINDOW)
    table.offset_ranges()
    return table


async def test_a_read_in_flight_is_shared_by_two_consumers(tmp_path: Path, monkeypatch: Any) -> None:
    table = single_partition_table(tmp_path, "inflight")
    reads = recorded_reads(table, monkeypatch)
    reader = ColdReader(ChunkCache(64 << 20), threads=2, prefetch=False)
    got: dict[int, list[bytes]] = {}
    hits, misses = CACHE_HITS.labels("inflight")._value.get(), CACHE_MISSES.labels("inflight")._value.get()
    async with trio.open_nursery() as nursery:
        await nursery.start(reader.serve)

        async def consume(consumer: int) -> None:
            got[consumer] = await reader.read(table, encode_span, 0, 0, None, None, 1 << 20, reader=consumer)

        async with trio.open_nursery() as consumers:  # both ask before the read finishes
            consumers.start_soon(consume, 1)
            consumers.start_soon(consume, 2)
        assert len(reads) == 1                        # one lake read served both
        assert got[1] == got[2] and offsets(got[1]) == list(range(10))
        assert (CACHE_HITS.labels("inflight")._value.get() - hits,
                CACHE_MISSES.labels("inflight")._value.get() - misses) == (0, 2)
        await consume(3)                              # a third consumer later: from the cache
        assert len(reads) == 1 and got[3] == got[1]
        assert (CACHE_HITS.labels("inflight")._value.get() - hits,
                CACHE_MISSES.labels("inflight")._value.get() - misses) == (1, 2)
        nursery.cancel_scope.cancel()


async def test_many_streams_reading_ahead_beyond_the_cache_read_each_chunk_once(tmp_path: Path,
                                                                              monkeypatch: Any) -> None:
    """Eight consumers replay eight topics at once; their reads ahead (up to READ_WINDOWS windows, ~2 KB each)
    together exceed the cache (6 KB): none is evicted before its consumer takes it, so no component is read
    twice, and the cache stays within its bytes."""
    lake = catalog(tmp_path)
    tables = [single_partition_table(tmp_path, f"stream{i}", lake) for i in range(8)]
    reads = {t.name: recorded_reads(t, monkeypatch) for t in tables}
    cache = ChunkCache(6_000)
    reader = ColdReader(cache, threads=2)
    positions = {t.name: 0 for t in tables}
    received: dict[str, list[int]] = {t.name: [] for t in tables}
    async with trio.open_nursery() as nursery:
        await nursery.start(reader.serve)
        while any(p < 400 for p in positions.values()):
            for consumer, table in enumerate(tables, 1):
                if positions[table.name] >= 400:
                    continue
                got = offsets(await reader.read(table, encode_span, 0, positions[table.name], None, None, 300,
                                                reader=consumer))
                received[table.name] += got
                if got:
                    positions[table.name] = got[-1] + 1
                assert cache.nbytes <= cache.capacity
            while reader._ahead:  # every read ahead lands before the consumers come back: the most cache pressure
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    for table in tables:
        assert received[table.name] == list(range(400))
        components = [c for served in reads[table.name] for c in served[0]]
        assert sorted(components) == list(range(40)), table.name  # each of the 40 components read once


async def test_an_answer_never_repeats_offsets_when_cached_chunks_overlap(tmp_path: Path) -> None:
    """Chunks of one partition may overlap (reads in parallel over windows holding every partition): an answer
    that goes on from one chunk into the next stops where the next one's batch holding the position starts
    below it, so no offset comes twice in one answer (a client delivers such a repeat: it skips only what lies
    below its fetch offset); the next fetch from there gets that batch, as a broker's first batch may start
    below the fetch offset."""
    import numpy as np
    import pyarrow as pa

    from ksi.lake.columns import Columns
    from ksi.lake.records import PartitionRecords
    from ksi.lake.table import Span

    def chunk(start: int, stop: int) -> Any:
        offsets = np.arange(start, stop, dtype=np.int64)
        values = pa.array([b"x" * 100] * len(offsets), pa.binary())
        columns = Columns(offsets=offsets, timestamps=offsets.copy(), keys=pa.nulls(len(offsets), pa.binary()),
                          values=values)
        return encode_span(Span(0, start, stop, PartitionRecords(0, columns, None)))

    table = streaming_table(tmp_path)
    cache = ChunkCache(64 << 20)
    first, second = chunk(0, 5000), chunk(3000, 9000)  # batches of 256 KiB: ~2,200 records each
    assert second.bases[0] == 3000 and second.lasts[0] >= 5000  # the batch holding 5000 starts below it
    cache.put("ramp", 0, first)
    cache.put("ramp", 0, second)
    reader = ColdReader(cache, threads=2, prefetch=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(reader.serve)
        seen: list[int] = []
        offset = 1000  # in the first chunk only: an answer goes on into the second at 5000
        for _ in range(3):
            got = await reader.read(table, encode_span, 0, offset, None, None, 4 << 20, reader=1)
            assert got is not None
            records = [record.offset for data in got for record in DefaultRecordBatch(data)]
            served = [o for o in records if o >= offset]  # what a client delivers from this answer
            assert served == sorted(set(served))
            seen += served
            offset = max(records) + 1
            if offset >= 9000:
                break
        nursery.cancel_scope.cancel()
    assert seen == list(range(1000, 9000))
