"""ksi.lake.spill: the cache's second tier, a ring file of what memory evicted, answering as memory did."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ksi.history.chunks import Chunk, SpilledChunk, encode_span
from ksi.lake.cache import ChunkCache
from ksi.lake.columns import Columns
from ksi.lake.records import PartitionRecords
from ksi.lake.spill import Evicted, Spill
from ksi.lake.table import Span


def chunk(start: int, stop: int, batches: list[tuple[int, int, int]], fill: int = 0) -> Chunk:
    """batches: (base offset, last offset, size in bytes)."""
    return Chunk(start, stop, np.array([b for b, _, _ in batches], dtype=np.int64),
                 np.array([la for _, la, _ in batches], dtype=np.int64),
                 tuple(bytes([fill + i]) * size for i, (_, _, size) in enumerate(batches)))


def joined(taken: tuple[list[bytes], bool]) -> tuple[bytes, bool]:
    return b"".join(taken[0]), taken[1]


def test_a_spilled_chunk_answers_every_take_as_the_chunk_did(tmp_path: os.PathLike[str]) -> None:
    offsets = np.arange(10, 60, dtype=np.int64)
    columns = Columns(offsets=offsets, timestamps=offsets * 1000, keys=pa.array([None] * 50, pa.binary()),
                      values=pa.array([b"v%d" % o * (o % 7) for o in offsets], pa.binary()))
    aborted = np.isin(offsets, [13, 14, 15, 40, 41])
    with_aborted = encode_span(Span(0, 10, 61, PartitionRecords(0, columns, None, aborted)))
    spill = Spill(1 << 20, str(tmp_path))
    plain = chunk(100, 200, [(100, 109, 10), (110, 119, 10), (125, 140, 10)])
    for value in (plain, with_aborted):
        assert spill.put("t", 0, value)
        stand_in = spill.find("t", 0, value.start)
        assert isinstance(stand_in, SpilledChunk) and stand_in.stop == value.stop and stand_in.nbytes == 0
        for offset in range(value.start - 1, value.stop + 1):
            for budget in (1, 15, 300, 1 << 20):
                for isolation in (0, 1):
                    for exact in (False, True):
                        assert joined(stand_in.take(offset, budget, isolation, exact)) == joined(
                            value.take(offset, budget, isolation, exact)), (offset, budget, isolation, exact)
    assert not os.listdir(tmp_path)  # unlinked at once: the space goes back when the process ends


def test_the_ring_forgets_the_oldest_entries_it_overwrites(tmp_path: os.PathLike[str]) -> None:
    spill = Spill(100, str(tmp_path))
    values = [chunk(i * 10, i * 10 + 10, [(i * 10, i * 10 + 9, 30)], fill=i) for i in range(5)]
    stand_ins = []
    for i, value in enumerate(values):
        assert spill.put("t", 0, value)
        stand_ins.append(spill.find("t", 0, i * 10))
    # 30 bytes each in 100: 0, 1, 2 at 0, 30, 60; 3 wraps to 0 (0 forgotten), 4 at 30 (1 forgotten)
    assert [spill.find("t", 0, i * 10) is not None for i in range(5)] == [False, False, True, True, True]
    assert spill.nbytes == 90
    with pytest.raises(Evicted):
        stand_ins[0].take(0, 100)
    assert stand_ins[4].take(40, 100) == ([bytes([4]) * 30], True)
    assert not spill.put("t", 0, chunk(100, 110, [(100, 109, 101)]))  # larger than the file: not kept


def test_a_chunk_of_more_batches_than_one_write_takes_is_kept_whole(tmp_path: os.PathLike[str]) -> None:
    """A span whose records alternate timestamp types is encoded as a batch per record: more buffers than one
    pwritev takes (IOV_MAX, 1024 on Linux), written in several calls and read back as they were."""
    spill = Spill(1 << 20, str(tmp_path))
    offsets = np.arange(3000, dtype=np.int64)
    value = Chunk(0, 3000, offsets, offsets, tuple(i.to_bytes(3, "big") for i in range(3000)))
    assert spill.put("t", 0, value)
    stand_in = spill.find("t", 0, 0)
    assert joined(stand_in.take(0, 1 << 20)) == joined(value.take(0, 1 << 20)) == (b"".join(value.batches), True)
    assert stand_in.take(2500, 9) == ([b"".join(value.batches[2500:2503])], False)


def test_the_cache_spills_what_it_evicts_and_finds_it_there(tmp_path: os.PathLike[str]) -> None:
    spill = Spill(1 << 20, str(tmp_path))
    cache = ChunkCache(100, spill=spill)
    for i in range(4):
        cache.put("t", 0, chunk(i * 10, i * 10 + 10, [(i * 10, i * 10 + 9, 40)], fill=i))
    assert cache.nbytes <= 100 and spill.nbytes == 80  # two evicted from memory, both spilled
    found = cache.find("t", 0, 5)
    assert isinstance(found, SpilledChunk) and found.take(5, 100) == ([b"\x00" * 40], True)
    assert isinstance(cache.find("t", 0, 35), Chunk)  # memory first
    assert cache.covers("t", 0, 12) and cache.stop_of("t", 0, 12) == 20
    cache.forget("t")
    assert cache.find("t", 0, 5) is None and spill.nbytes == 0


def test_a_spill_file_that_cannot_be_written_is_said_once_and_the_cache_goes_on(
        tmp_path: os.PathLike[str], caplog: pytest.LogCaptureFixture) -> None:
    """A write the kernel refuses (a full disk, here a descriptor open for reading only) loses nothing but the
    second tier: one warning naming the directory, then memory alone, evictions dropped as before."""
    spill = Spill(1 << 20, str(tmp_path))
    read_only = os.path.join(tmp_path, "read-only")
    open(read_only, "wb").close()
    os.close(spill._fd)
    spill._fd = os.open(read_only, os.O_RDONLY)
    cache = ChunkCache(100, spill=spill)
    with caplog.at_level("WARNING", logger="ksi.lake"):
        for i in range(4):
            assert cache.put("t", 0, chunk(i * 10, i * 10 + 10, [(i * 10, i * 10 + 9, 40)], fill=i))
    warnings = [r.getMessage() for r in caplog.records if "spill file" in r.getMessage()]
    assert len(warnings) == 1 and str(tmp_path) in warnings[0], warnings
    assert spill.nbytes == 0 and cache.find("t", 0, 5) is None  # evicted and dropped, not half kept
    assert cache.find("t", 0, 35).take(35, 100) == ([b"\x03" * 40], True)  # memory serves as before
    spill.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(1, 45)), min_size=1, max_size=60))
def test_the_ring_keeps_exactly_what_no_later_write_overwrote(tmp_path: os.PathLike[str],
                                                              puts: list[tuple[int, int]]) -> None:
    """Against a model of the ring: which entries live after any sequence of writes (some of one start again)
    and that each reads back its own bytes."""
    capacity = 100
    spill = Spill(capacity, str(tmp_path))
    model: dict[int, tuple[int, int, int]] = {}  # start -> (at, size, fill)
    position = 0
    for n, (start, size) in enumerate(puts):
        assert spill.put("t", 0, chunk(start * 10, start * 10 + 10, [(start * 10, start * 10 + 9, size)], fill=n))
        if position + size > capacity:
            position = 0
        model = {s: (at, n_bytes, fill) for s, (at, n_bytes, fill) in model.items()
                 if s != start and not (at < position + size and position < at + n_bytes)}
        model[start] = (position, size, n)
        position += size
        assert {k[2] // 10 for k in spill._entries} == set(model)
        assert spill.nbytes == sum(size for _, size, _ in model.values())
    for start, (_, size, fill) in model.items():
        stand_in = spill.find("t", 0, start * 10)
        assert stand_in is not None and stand_in.take(start * 10, 1 << 10) == ([bytes([fill % 256]) * size], True)
