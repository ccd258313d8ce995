"""The cache of encoded cold reads: bounded in bytes, scan resistant (2Q), reads ahead kept for their consumer,
and the hit, miss and eviction counts it reports."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ksi.lake import cache as cache_module
from ksi.lake.cache import ChunkCache
from ksi.metrics import CACHE_BYTES, CACHE_EVICTIONS, CACHE_HITS, CACHE_MISSES


@dataclass(frozen=True)
class Value:
    start: int
    stop: int
    nbytes: int = 100


def counts(topic: str) -> tuple[float, float]:
    return CACHE_HITS.labels(topic)._value.get(), CACHE_MISSES.labels(topic)._value.get()


def evictions() -> dict[str, float]:
    return {s: CACHE_EVICTIONS.labels(s)._value.get() for s in ("probation", "protected", "ahead")}


def held(cache: ChunkCache, topic: str, partition: int, starts: range | list[int]) -> list[int]:
    return [s for s in starts if cache.covers(topic, partition, s)]


def test_a_lookup_finds_the_entry_covering_an_offset_and_counts_hits_and_misses() -> None:
    cache = ChunkCache(10_000)
    cache.put("lookup", 0, Value(0, 10))
    cache.put("lookup", 0, Value(10, 25))
    cache.put("lookup", 1, Value(0, 10))
    assert counts("lookup") == (0, 0)
    assert cache.find("lookup", 0, 0) == Value(0, 10)
    assert cache.find("lookup", 0, 9) == Value(0, 10)
    assert cache.find("lookup", 0, 24) == Value(10, 25)
    assert cache.find("lookup", 0, 25) is None
    assert cache.find("lookup", 2, 0) is None
    assert counts("lookup") == (3, 2)
    assert cache.find("lookup", 0, 3, hit=False) == Value(0, 10)  # the caller's own read: not a hit
    assert cache.find("lookup", 0, 30, miss=False) is None
    assert not cache.covers("lookup", 0, 30)
    assert counts("lookup") == (3, 2)


def test_a_new_entry_replaces_the_entries_it_contains() -> None:
    cache = ChunkCache(10_000)
    cache.put("overlap", 0, Value(0, 10))
    cache.put("overlap", 0, Value(10, 20))
    cache.put("overlap", 0, Value(0, 30, 250))   # a compaction's larger file: contains both
    assert len(cache) == 1 and cache.nbytes == 250
    cache.put("overlap", 0, Value(0, 20))        # an entry at that start reaching less far: not kept
    assert cache.find("overlap", 0, 25) == Value(0, 30, 250)
    assert len(cache) == 1


def test_bytes_stay_within_the_capacity_oldest_probation_first() -> None:
    cache = ChunkCache(1_000)
    before = evictions()
    for i in range(25):
        cache.put("bound", 0, Value(10 * i, 10 * i + 10))
        assert cache.nbytes <= 1_000
    assert cache.nbytes == 1_000
    assert held(cache, "bound", 0, range(0, 250, 10)) == list(range(150, 250, 10))  # first in, first out
    assert evictions()["probation"] - before["probation"] == 15
    assert CACHE_BYTES._value.get() == 1_000
    cache.put("bound", 0, Value(1_000, 1_010, 1_001))  # larger than the whole cache: not kept, nothing evicted
    assert cache.nbytes == 1_000 and not cache.covers("bound", 0, 1_000)


def test_a_replay_larger_than_the_cache_does_not_evict_what_several_consumers_share() -> None:
    cache = ChunkCache(2_000)   # 20 entries; probation's share 5
    for i in range(10):         # what consumers 1 and 2 both read: protected
        cache.put("shared", 0, Value(10 * i, 10 * i + 10), reader=1)
        assert cache.find("shared", 0, 10 * i, reader=2) is not None
    assert cache.protected_bytes == 1_000
    for i in range(100):        # a replay of 10,000 bytes of another partition by consumer 3, read once
        cache.put("shared", 1, Value(10 * i, 10 * i + 10), reader=3)
        cache.find("shared", 1, 10 * i, reader=3)   # its own reader again: not promoted
        assert cache.nbytes <= 2_000
    assert held(cache, "shared", 0, range(0, 100, 10)) == list(range(0, 100, 10))
    assert cache.protected_bytes == 1_000
    assert held(cache, "shared", 1, range(0, 1_000, 10)) == list(range(900, 1_000, 10))  # the replay's last ten


def test_protected_entries_go_least_recently_used_first_once_probation_is_within_its_share() -> None:
    cache = ChunkCache(1_000)   # probation's share: 250 bytes
    for i in range(9):
        cache.put("lru", 0, Value(10 * i, 10 * i + 10), reader=1)
        cache.find("lru", 0, 10 * i, reader=2)      # promoted: 900 protected bytes
    cache.find("lru", 0, 0, reader=1)               # 0 is the most recently used now; 10 the least
    before = evictions()
    cache.put("lru", 1, Value(0, 10), reader=1)     # full
    cache.put("lru", 1, Value(10, 20), reader=1)    # over; probation (200) within its share: protected's LRU goes
    after = evictions()
    assert (after["probation"] - before["probation"], after["protected"] - before["protected"]) == (0, 1)
    cache.put("lru", 1, Value(20, 30), reader=1)    # over, probation (300) beyond its share: its oldest goes
    after = evictions()
    assert (after["probation"] - before["probation"], after["protected"] - before["protected"]) == (1, 1)
    assert held(cache, "lru", 0, range(0, 90, 10)) == [0, 20, 30, 40, 50, 60, 70, 80]
    assert held(cache, "lru", 1, range(0, 30, 10)) == [10, 20]
    assert cache.nbytes == 1_000


def test_a_read_ahead_is_kept_until_its_consumer_takes_it() -> None:
    cache = ChunkCache(1_000)   # reads ahead may be started while they hold less than 500 bytes
    before = evictions()
    for reader in range(1, 5):  # four consumers' reads ahead: 400 bytes, kept apart
        cache.put("ahead", reader, Value(0, 10), reader=reader, ahead=True)
    assert cache.ahead_bytes == 400 and cache.ahead_room()
    for i in range(30):         # a replay through probation: evicts only probation
        cache.put("ahead", 9, Value(10 * i, 10 * i + 10), reader=9)
    assert held(cache, "ahead", 9, range(0, 300, 10)) == list(range(240, 300, 10))
    assert [p for p in range(1, 5) if cache.covers("ahead", p, 0)] == [1, 2, 3, 4]
    cache.put("ahead", 5, Value(0, 10), reader=5, ahead=True)
    assert cache.ahead_bytes == 500 and not cache.ahead_room()  # the budget is full: no more read ahead
    assert evictions()["ahead"] == before["ahead"]

    assert cache.find("ahead", 1, 0, reader=1) is not None   # its consumer takes part of it: still kept
    assert cache.ahead_bytes == 500
    cache.release("ahead", 1, 0, reader=7)                    # another's release does not count
    assert cache.ahead_bytes == 500
    cache.release("ahead", 1, 0, reader=1)                    # taken to its end: probation's now
    assert cache.ahead_bytes == 400 and cache.ahead_room()
    assert cache.find("ahead", 2, 0, reader=8) is not None    # another consumer took it first: shared
    assert cache.ahead_bytes == 300 and cache.protected_bytes == 100
    assert cache.nbytes <= 1_000


def test_a_read_ahead_its_consumer_does_not_come_back_for_joins_probation(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000.0]
    monkeypatch.setattr(cache_module.time, "monotonic", lambda: clock[0])
    cache = ChunkCache(1_000)
    for reader in range(1, 6):
        cache.put("left", reader, Value(0, 10), reader=reader, ahead=True)
    assert not cache.ahead_room()
    clock[0] += cache_module.AHEAD_KEEP_SECONDS + 1
    assert cache.ahead_room()
    assert cache.ahead_bytes == 0 and cache.probation_bytes == 500


def test_reads_ahead_beyond_the_whole_cache_are_evicted_last() -> None:
    cache = ChunkCache(300)
    before = evictions()
    cache.put("over", 0, Value(0, 10), reader=1)
    for i in range(4):
        cache.put("over", 1, Value(10 * i, 10 * i + 10), reader=2, ahead=True)
    assert cache.nbytes == 300 and cache.ahead_bytes == 300
    after = evictions()
    assert after["probation"] - before["probation"] == 1 and after["ahead"] - before["ahead"] == 1


def test_forget_drops_a_topics_entries() -> None:
    cache = ChunkCache(10_000)
    cache.put("gone", 0, Value(0, 10))
    cache.put("gone", 1, Value(0, 10), reader=1, ahead=True)
    cache.put("kept", 0, Value(0, 10))
    cache.forget("gone")
    assert cache.nbytes == 100 and len(cache) == 1
    assert cache.find("gone", 0, 0) is None and cache.find("kept", 0, 0) is not None
