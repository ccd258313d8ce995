"""Encoded cold reads kept for the next reader: byte-bounded and scan resistant.

Offsets that reached the lake never change, so what one consumer's replay read and encoded can serve every
other consumer that replays the same offsets.  What the cache holds is opaque to it: any value with
``start`` (first offset covered), ``stop`` (first offset not covered) and ``nbytes``.

A plain LRU lets one replay larger than the cache evict everything, including what several consumers
share.  So, as in 2Q: a new entry goes to *probation* (first in, first out; at most a quarter of the
capacity once the rest is in use); it is *protected* (least recently used goes first) once a second
reader takes it.  A replay passing through churns probation only.

Entries of one partition may overlap (a table compacted into files of other boundaries, a read capped at
an older log start): a lookup takes the entry with the greatest start at or below the offset that covers
it, and a new entry replaces the entries it contains.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from ..metrics import CACHE_BYTES, CACHE_EVICTIONS, CACHE_HITS, CACHE_MISSES

__all__ = ["Cached", "ChunkCache"]

PROBATION_SHARE = 0.25
LOOK_BACK = 8


class Cached(Protocol):
    @property
    def start(self) -> int: ...

    @property
    def stop(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


@dataclass(slots=True)
class _Entry:
    value: Any
    reader: int          # the first reader


Key = tuple[str, int, int]  # topic, partition, start


class ChunkCache:
    def __init__(self, capacity: int, probation_share: float = PROBATION_SHARE) -> None:
        self.capacity = capacity
        self.probation_target = int(capacity * probation_share)
        self._probation: OrderedDict[Key, _Entry] = OrderedDict()
        self._protected: OrderedDict[Key, _Entry] = OrderedDict()
        self._starts: dict[tuple[str, int], list[int]] = {}
        self.probation_bytes = 0
        self.protected_bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self.probation_bytes + self.protected_bytes

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    def find(self, topic: str, partition: int, offset: int, reader: int = 0) -> Any | None:
        """The cached value covering ``offset``; counts a hit or a miss."""
        with self._lock:
            key = self._lookup(topic, partition, offset)
            if key is None:
                CACHE_MISSES.labels(topic).inc()
                return None
            CACHE_HITS.labels(topic).inc()
            entry = self._probation.get(key)
            if entry is not None:
                if reader != entry.reader:
                    del self._probation[key]
                    self.probation_bytes -= entry.value.nbytes
                    self._protected[key] = entry
                    self.protected_bytes += entry.value.nbytes
            else:
                entry = self._protected[key]
                self._protected.move_to_end(key)
            return entry.value

    def covers(self, topic: str, partition: int, offset: int) -> bool:
        """Whether ``offset`` is cached (no hit or miss counted, nothing promoted)."""
        with self._lock:
            return self._lookup(topic, partition, offset) is not None

    def _lookup(self, topic: str, partition: int, offset: int) -> Key | None:
        starts = self._starts.get((topic, partition))
        if not starts:
            return None
        i = bisect.bisect_right(starts, offset) - 1
        for j in range(i, max(i - LOOK_BACK, -1), -1):  # overlaps are rare and short: look back a little
            key = (topic, partition, starts[j])
            entry = self._probation.get(key) or self._protected.get(key)
            assert entry is not None
            if offset < entry.value.stop:
                return key
        return None

    def put(self, topic: str, partition: int, value: Any, reader: int = 0) -> None:
        if self.capacity <= 0 or value.nbytes > self.capacity:
            return
        with self._lock:
            starts = self._starts.setdefault((topic, partition), [])
            lo = bisect.bisect_left(starts, value.start)
            hi = bisect.bisect_left(starts, value.stop)
            for start in starts[lo:hi]:  # entries starting inside the new one: drop those it contains
                key = (topic, partition, start)
                old = self._probation.get(key) or self._protected.get(key)
                assert old is not None
                if old.value.stop <= value.stop:
                    self._remove(key)
                    starts.remove(start)
            key = (topic, partition, value.start)
            if key in self._probation or key in self._protected:
                return  # an entry at this start reaching further is kept
            bisect.insort(starts, value.start)
            self._probation[key] = _Entry(value, reader)
            self.probation_bytes += value.nbytes
            self._evict()
            CACHE_BYTES.set(self.nbytes)

    def _remove(self, key: Key) -> None:
        entry = self._probation.pop(key, None)
        if entry is not None:
            self.probation_bytes -= entry.value.nbytes
            return
        entry = self._protected.pop(key)
        self.protected_bytes -= entry.value.nbytes

    def _evict(self) -> None:
        while self.nbytes > self.capacity:
            if self._probation and (self.probation_bytes > self.probation_target or not self._protected):
                key, entry = self._probation.popitem(last=False)
                self.probation_bytes -= entry.value.nbytes
                CACHE_EVICTIONS.labels("probation").inc()
            else:
                key, entry = self._protected.popitem(last=False)
                self.protected_bytes -= entry.value.nbytes
                CACHE_EVICTIONS.labels("protected").inc()
            self._starts[key[:2]].remove(key[2])

    def forget(self, topic: str) -> None:
        """Drop a topic's entries (its table was replaced)."""
        with self._lock:
            for key in [k for k in (*self._probation, *self._protected) if k[0] == topic]:
                self._remove(key)
            for start in [k for k in self._starts if k[0] == topic]:
                del self._starts[start]
            CACHE_BYTES.set(self.nbytes)
