"""Encoded record batches for immutable cold ranges, in chunks, with a byte-bounded LRU cache.

Offsets that reached the lake never change (compaction rewrites files, not records), so once a range of
a partition is read and encoded, the batches can be served again to every consumer that replays it.  A
*chunk* is the encoded batches for the offsets ``[start, stop)`` of one partition (gaps kept: a chunk
covers the offsets it was asked for, whether or not each has a record).  A Fetch at offset ``o`` takes
the batches of the chunk covering ``o`` from the batch holding ``o`` on (a consumer skips the records
of that first batch below ``o``, as it does with a broker's batches), up to its byte budget and always
at least one batch (KIP-74).

Chunks of one partition never overlap: a new chunk stops where the next cached one starts.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["Chunk", "ChunkCache"]

Key = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True, slots=True, eq=False)
class Chunk:
    start: int                       # first offset covered
    stop: int                        # first offset not covered
    bases: npt.NDArray[np.int64]     # each batch's base offset
    lasts: npt.NDArray[np.int64]     # each batch's last offset
    batches: tuple[bytes, ...]
    ends: npt.NDArray[np.int64] = field(init=False)  # cumulative bytes after each batch

    def __post_init__(self) -> None:
        object.__setattr__(self, "ends", np.cumsum([len(b) for b in self.batches], dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return int(self.ends[-1]) if len(self.batches) else 0

    def covers(self, offset: int) -> bool:
        return self.start <= offset < self.stop

    def take(self, offset: int, max_bytes: int) -> bytes:
        """The batches from the one holding ``offset`` (or the first after it) on, within ``max_bytes``
        but at least one; empty when no record at or after ``offset`` is in this chunk."""
        first = int(np.searchsorted(self.lasts, offset, side="left"))
        if first >= len(self.batches):
            return b""
        before = int(self.ends[first - 1]) if first else 0
        last = int(np.searchsorted(self.ends, before + max_bytes, side="right"))
        return b"".join(self.batches[first:max(last, first + 1)])


class ChunkCache:
    """Chunks by partition, evicted least recently used first once their bytes exceed ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.nbytes = 0
        self._lru: OrderedDict[tuple[str, int, int], Chunk] = OrderedDict()
        self._starts: dict[Key, list[int]] = {}
        self._lock = threading.Lock()

    def find(self, topic: str, partition: int, offset: int) -> Chunk | None:
        with self._lock:
            starts = self._starts.get((topic, partition))
            if not starts:
                return None
            i = bisect.bisect_right(starts, offset) - 1
            if i < 0:
                return None
            key = (topic, partition, starts[i])
            chunk = self._lru[key]
            if not chunk.covers(offset):
                return None
            self._lru.move_to_end(key)
            return chunk

    def next_start(self, topic: str, partition: int, offset: int) -> int | None:
        """The start of the first cached chunk after ``offset`` (a new chunk must stop there)."""
        with self._lock:
            starts = self._starts.get((topic, partition)) or []
            i = bisect.bisect_right(starts, offset)
            return starts[i] if i < len(starts) else None

    def put(self, topic: str, partition: int, chunk: Chunk) -> None:
        if self.capacity <= 0 or chunk.nbytes > self.capacity:
            return
        with self._lock:
            key = (topic, partition, chunk.start)
            if key in self._lru:
                return
            self._lru[key] = chunk
            bisect.insort(self._starts.setdefault((topic, partition), []), chunk.start)
            self.nbytes += chunk.nbytes
            while self.nbytes > self.capacity:
                (t, p, start), old = self._lru.popitem(last=False)
                self._starts[(t, p)].remove(start)
                self.nbytes -= old.nbytes

    def forget(self, topic: str) -> None:
        """Drop a topic's chunks (its table was replaced)."""
        with self._lock:
            for key in [k for k in self._lru if k[0] == topic]:
                self.nbytes -= self._lru.pop(key).nbytes
            for key in [k for k in self._starts if k[0] == topic]:
                del self._starts[key]
