"""Encoded cold reads kept for the next reader: byte-bounded and scan resistant.

Offsets that reached the lake never change, so what one consumer's replay read and encoded can serve every
other consumer that replays the same offsets.  What the cache holds is opaque to it: any value with
``start`` (first offset covered), ``stop`` (first offset not covered) and ``nbytes``.

A plain LRU lets one replay larger than the cache evict everything, including what several consumers
share.  So, as in 2Q: a new entry goes to *probation* (first in, first out; at most a quarter of the
capacity once the rest is in use); it is *protected* (least recently used goes first) once a second
reader takes it.  A replay passing through churns probation only.

A chunk read *ahead* for a consumer is held apart until that consumer takes it (:meth:`ChunkCache.release`):
it is never evicted to make room for other entries, so many consumers reading ahead at once cannot evict
each other's next data before they get to it (each chunk would be read twice).  Their bytes count in the
cache's; the reader starts no read ahead while they exceed a share of the capacity (:meth:`ChunkCache.
ahead_room`), and one its consumer has not come back for in ``AHEAD_KEEP_SECONDS`` (it left, or sought
elsewhere) joins probation.  A read ahead taken by another consumer first is protected at once.

With a :class:`ksi.lake.spill.Spill`, what is evicted is written there instead of dropped, and a lookup that
misses in memory is answered from it (the memory tier is always asked first).

Entries of one partition may overlap (a table compacted into files of other boundaries, a read capped at
an older log start): a lookup takes the entry with the greatest start at or below the offset that covers
it, and a new entry replaces the entries it contains.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from ..metrics import CACHE_BYTES, CACHE_EVICTIONS, CACHE_HITS, CACHE_MISSES
from .spill import Spill

__all__ = ["Cached", "ChunkCache"]

PROBATION_SHARE = 0.25
AHEAD_SHARE = 0.5          # reads ahead not yet taken: at most this share of the capacity is started
AHEAD_KEEP_SECONDS = 30.0  # ... and kept apart this long for their consumer (a fetch loop comes back sooner)
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
    since: float = 0.0   # when a read ahead was put (monotonic)


Key = tuple[str, int, int]  # topic, partition, start


class ChunkCache:
    def __init__(self, capacity: int, probation_share: float = PROBATION_SHARE,
                 ahead_share: float = AHEAD_SHARE, spill: Spill | None = None) -> None:
        self.capacity = capacity
        self.spill = spill
        self.probation_target = int(capacity * probation_share)
        self.ahead_budget = int(capacity * ahead_share)
        self._probation: OrderedDict[Key, _Entry] = OrderedDict()
        self._protected: OrderedDict[Key, _Entry] = OrderedDict()
        self._ahead: OrderedDict[Key, _Entry] = OrderedDict()   # read ahead, not yet taken by its consumer
        self._starts: dict[tuple[str, int], list[int]] = {}
        self.probation_bytes = 0
        self.protected_bytes = 0
        self.ahead_bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self.probation_bytes + self.protected_bytes + self.ahead_bytes

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected) + len(self._ahead)

    def find(self, topic: str, partition: int, offset: int, reader: int = 0, hit: bool = True,
             miss: bool = True) -> Any | None:
        """The cached value covering ``offset``; counts a ``hit`` or a ``miss`` (the caller says when it is not
        one: a value it has just read into the cache, a lookup that reads nothing from the lake if it fails)."""
        with self._lock:
            key = self._lookup(topic, partition, offset)
            if key is None:
                spilled = self.spill.find(topic, partition, offset, hit) if self.spill is not None else None
                if spilled is None and miss:
                    CACHE_MISSES.labels(topic).inc()
                return spilled
            if hit:
                CACHE_HITS.labels(topic).inc()
            entry = self._ahead.get(key)
            if entry is not None:
                if reader != entry.reader:  # another consumer got there first: shared
                    self._move(key, self._ahead, self._protected)
                return entry.value
            entry = self._probation.get(key)
            if entry is not None:
                if reader != entry.reader:
                    self._move(key, self._probation, self._protected)
            else:
                entry = self._protected[key]
                self._protected.move_to_end(key)
            return entry.value

    def covers(self, topic: str, partition: int, offset: int) -> bool:
        """Whether ``offset`` is cached, in memory or spilled (no hit or miss counted, nothing promoted)."""
        with self._lock:
            if self._lookup(topic, partition, offset) is not None:
                return True
        return self.spill is not None and self.spill.find(topic, partition, offset, hit=False) is not None

    def stop_of(self, topic: str, partition: int, offset: int) -> int | None:
        """The end (first offset not covered) of the cached value covering ``offset``, or None (no hit or miss
        counted, nothing promoted)."""
        with self._lock:
            key = self._lookup(topic, partition, offset)
            if key is not None:
                entry = self._get(key)
                assert entry is not None
                return int(entry.value.stop)
        spilled = self.spill.find(topic, partition, offset, hit=False) if self.spill is not None else None
        return None if spilled is None else int(spilled.stop)

    def _get(self, key: Key) -> _Entry | None:
        return self._probation.get(key) or self._protected.get(key) or self._ahead.get(key)

    def _lookup(self, topic: str, partition: int, offset: int) -> Key | None:
        starts = self._starts.get((topic, partition))
        if not starts:
            return None
        i = bisect.bisect_right(starts, offset) - 1
        for j in range(i, max(i - LOOK_BACK, -1), -1):  # overlaps are rare and short: look back a little
            key = (topic, partition, starts[j])
            entry = self._get(key)
            assert entry is not None
            if offset < entry.value.stop:
                return key
        return None

    def _segment_bytes(self, segment: OrderedDict[Key, _Entry], change: int) -> None:
        if segment is self._probation:
            self.probation_bytes += change
        elif segment is self._protected:
            self.protected_bytes += change
        else:
            self.ahead_bytes += change

    def _move(self, key: Key, source: OrderedDict[Key, _Entry], target: OrderedDict[Key, _Entry]) -> None:
        entry = source.pop(key)
        self._segment_bytes(source, -entry.value.nbytes)
        target[key] = entry
        self._segment_bytes(target, entry.value.nbytes)

    def put(self, topic: str, partition: int, value: Any, reader: int = 0, ahead: bool = False) -> bool:
        """Keep ``value``; ``ahead``: it was read ahead for ``reader``, and is kept apart until it takes it.
        False when it is not kept: the cache is off or smaller than the value."""
        if self.capacity <= 0 or value.nbytes > self.capacity:
            return False
        with self._lock:
            starts = self._starts.setdefault((topic, partition), [])
            lo = bisect.bisect_left(starts, value.start)
            hi = bisect.bisect_left(starts, value.stop)
            for start in starts[lo:hi]:  # entries starting inside the new one: drop those it contains
                key = (topic, partition, start)
                old = self._get(key)
                assert old is not None
                if old.value.stop <= value.stop:
                    self._remove(key)
                    starts.remove(start)
            key = (topic, partition, value.start)
            if self._get(key) is not None:
                return True  # an entry at this start reaching further is kept
            bisect.insort(starts, value.start)
            segment = self._ahead if ahead else self._probation
            segment[key] = _Entry(value, reader, time.monotonic())
            self._segment_bytes(segment, value.nbytes)
            self._evict()
            CACHE_BYTES.set(self.nbytes)
        return True

    def release(self, topic: str, partition: int, start: int, reader: int) -> None:
        """``reader`` has taken the read ahead at ``start`` to its end: it is an ordinary entry now (probation,
        promoted when a second reader takes it)."""
        with self._lock:
            key = (topic, partition, start)
            entry = self._ahead.get(key)
            if entry is not None and entry.reader == reader:
                self._move(key, self._ahead, self._probation)
                self._evict()

    def ahead_room(self, in_flight: int = 0) -> bool:
        """Whether a read ahead may start: the reads ahead not yet taken, with the ``in_flight`` bytes those
        being read are expected to bring, are within their budget (those kept longer than AHEAD_KEEP_SECONDS
        join probation first)."""
        with self._lock:
            old = time.monotonic() - AHEAD_KEEP_SECONDS
            for key in [k for k, e in self._ahead.items() if e.since < old]:
                self._move(key, self._ahead, self._probation)
            self._evict()
            return self.ahead_bytes + in_flight < self.ahead_budget

    def _remove(self, key: Key) -> None:
        for segment in (self._probation, self._protected, self._ahead):
            entry = segment.pop(key, None)
            if entry is not None:
                self._segment_bytes(segment, -entry.value.nbytes)
                return
        raise KeyError(key)

    def _evict(self) -> None:
        """Make room: probation first while it holds more than its share, then protected; reads ahead not yet
        taken only when nothing else is left (more was read ahead than the whole cache holds)."""
        while self.nbytes > self.capacity:
            if self._probation and (self.probation_bytes > self.probation_target or not self._protected):
                segment, name = self._probation, "probation"
            elif self._protected:
                segment, name = self._protected, "protected"
            else:
                segment, name = self._ahead, "ahead"
            key, entry = segment.popitem(last=False)
            self._segment_bytes(segment, -entry.value.nbytes)
            CACHE_EVICTIONS.labels(name).inc()
            self._starts[key[:2]].remove(key[2])
            if self.spill is not None:
                self.spill.put(key[0], key[1], entry.value)

    def forget(self, topic: str) -> None:
        """Drop a topic's entries (its table was replaced)."""
        if self.spill is not None:
            self.spill.forget(topic)
        with self._lock:
            for key in [k for k in (*self._probation, *self._protected, *self._ahead) if k[0] == topic]:
                self._remove(key)
            for start in [k for k in self._starts if k[0] == topic]:
                del self._starts[start]
            CACHE_BYTES.set(self.nbytes)
