from __future__ import annotations

import numpy as np

from ksi.history.chunks import Chunk, ChunkCache


def chunk(start: int, stop: int, batches: list[tuple[int, int, int]]) -> Chunk:
    """batches: (base offset, last offset, size in bytes)."""
    return Chunk(start, stop, np.array([b for b, _, _ in batches], dtype=np.int64),
                 np.array([la for _, la, _ in batches], dtype=np.int64),
                 tuple(bytes([i]) * size for i, (_, _, size) in enumerate(batches)))


def test_take_starts_at_the_batch_holding_the_offset_and_honours_the_budget() -> None:
    c = chunk(100, 200, [(100, 109, 10), (110, 119, 10), (125, 140, 10)])  # 120..124 is a gap
    assert c.take(100, 1000) == b"\x00" * 10 + b"\x01" * 10 + b"\x02" * 10
    assert c.take(105, 15) == b"\x00" * 10  # the batch holding 105, then no room for the next
    assert c.take(105, 1) == b"\x00" * 10   # at least one whole batch (KIP-74)
    assert c.take(121, 100) == b"\x02" * 10  # in the gap: the first batch after it
    assert c.take(141, 100) == b""          # covered, but no record at or after it here
    assert c.nbytes == 30 and c.covers(199) and not c.covers(200)


def test_cache_finds_by_coverage_evicts_least_recently_used_and_tells_where_the_next_chunk_starts() -> None:
    cache = ChunkCache(capacity=25)
    cache.put("t", 0, chunk(0, 10, [(0, 9, 10)]))
    cache.put("t", 0, chunk(20, 30, [(20, 29, 10)]))
    assert cache.find("t", 0, 5) is not None and cache.find("t", 0, 15) is None
    assert cache.next_start("t", 0, 12) == 20 and cache.next_start("t", 0, 25) is None
    cache.find("t", 0, 0)  # touch 0..9: 20..29 is now the least recently used
    cache.put("t", 1, chunk(0, 10, [(0, 9, 10)]))
    assert cache.nbytes == 20
    assert cache.find("t", 0, 25) is None and cache.find("t", 0, 3) is not None
    cache.forget("t")
    assert cache.nbytes == 0 and cache.find("t", 1, 0) is None
    ChunkCache(0).put("t", 0, chunk(0, 10, [(0, 9, 10)]))  # a capacity of 0 caches nothing
