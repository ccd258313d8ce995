from __future__ import annotations

import numpy as np

from ksi.history.chunks import Chunk


def chunk(start: int, stop: int, batches: list[tuple[int, int, int]]) -> Chunk:
    """batches: (base offset, last offset, size in bytes)."""
    return Chunk(start, stop, np.array([b for b, _, _ in batches], dtype=np.int64),
                 np.array([la for _, la, _ in batches], dtype=np.int64),
                 tuple(bytes([i]) * size for i, (_, _, size) in enumerate(batches)))


def test_take_starts_at_the_batch_holding_the_offset_and_honours_the_budget() -> None:
    c = chunk(100, 200, [(100, 109, 10), (110, 119, 10), (125, 140, 10)])  # 120..124 is a gap
    a, b, d = b"\x00" * 10, b"\x01" * 10, b"\x02" * 10
    assert c.take(100, 1000) == ([a, b, d], True)
    assert c.take(105, 15) == ([a], False)   # the batch holding 105, then no room for the next
    assert c.take(105, 1) == ([a], False)    # at least one whole batch (KIP-74)
    assert c.take(121, 100) == ([d], True)   # in the gap: the first batch after it
    assert c.take(141, 100) == ([], True)    # covered, but no record at or after it here
    assert c.nbytes == 30 and c.covers(199) and not c.covers(200)
