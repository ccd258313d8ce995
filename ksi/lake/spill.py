"""The second tier of the cache: encoded reads evicted from memory, kept in a file and read back from the page
cache.

A broker serves many consumers of the same log from the operating system's page cache; ksi's memory cache
(:mod:`ksi.lake.cache`) is a few hundred MiB at most, and consumers replaying one table together drift further
apart than that: each then decodes the same row groups again (measured: 8 consumers of a 10M-row table read it
about five times over with 128 MiB of cache, and 0.7-0.8x the broker's rate; with the whole table in memory,
once, and 1.0x, at three times the RSS).  So what the memory cache evicts is written here instead of dropped,
and a lookup that misses in memory finds it here: a read of the page cache costs a copy, decoding the lake
costs some 10 CPU-s per GB.

One file, unlinked as soon as it is opened (its space goes back when ksi exits, however it exits), written as a
ring: entries are appended until ``capacity`` bytes, then writing starts again at the front, and every entry
the new one overwrites is forgotten (oldest first: a replay is a scan, first in is first out).  The pages are
the kernel's to keep or drop; nothing here is in ksi's RSS but the index.

What is kept is opaque here: a value offers :meth:`~Spillable.spill_parts` (its bytes) and
:meth:`~Spillable.spilled` (a stand-in answering from the file through a ``read(position, length)`` function
that raises :class:`Evicted` once the entry is overwritten).  Lookups go like the memory cache's: the entry
with the greatest start at or below the offset that covers it.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..metrics import SPILL_BYTES, SPILL_EVICTIONS, SPILL_HITS, SPILL_WRITES

__all__ = ["Evicted", "Spill", "Spillable"]

log = logging.getLogger("ksi.lake")

LOOK_BACK = 8
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024  # buffers one pwritev takes
Read = Callable[[int, int], bytes]
Key = tuple[str, int, int]  # topic, partition, start


class Evicted(Exception):
    """A spilled entry was overwritten before it was read: read the lake instead."""


class Spillable(Protocol):
    @property
    def start(self) -> int: ...

    @property
    def stop(self) -> int: ...

    def spill_parts(self) -> list[bytes]:
        """The bytes to keep, in order."""

    def spilled(self, read: Read) -> Any:
        """A stand-in for this value answering from the kept bytes: ``read(position, length)`` gives
        ``length`` bytes from ``position`` of what :meth:`spill_parts` gave, joined."""


@dataclass(slots=True)
class _Entry:
    key: Key
    at: int          # where in the file
    size: int
    value: Any       # the stand-in
    stop: int
    live: bool = True


class Spill:
    def __init__(self, capacity: int, directory: str | None = None) -> None:
        self.capacity = capacity
        fd, path = tempfile.mkstemp(prefix="ksi-spill-", dir=directory)
        os.unlink(path)  # the space is the kernel's to free when ksi exits, even after kill -9
        self._fd = fd
        self.where = directory or tempfile.gettempdir()
        self._pos = 0
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()  # in the order written
        self._ats: list[int] = []  # where each entry is in the file, in file order (entries never overlap) ...
        self._at: dict[int, _Entry] = {}  # ... and which it is
        self._starts: dict[tuple[str, int], list[int]] = {}
        self.nbytes = 0
        self._lock = threading.Lock()
        self._failed = False

    def close(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            os.close(self._fd)
            self._fd = -1

    def put(self, topic: str, partition: int, value: Spillable) -> bool:
        """Write ``value`` (evicted from memory); False when it is larger than the file or cannot be written."""
        if not hasattr(value, "spill_parts"):
            return False
        parts = value.spill_parts()
        size = sum(len(p) for p in parts)
        if size == 0 or size > self.capacity or self._failed:
            return False
        with self._lock:
            if self._pos + size > self.capacity:
                self._pos = 0
            at = self._pos
            for old in self._overlapping(at, at + size):
                self._drop(old)
                SPILL_EVICTIONS.inc()
            key = (topic, partition, value.start)
            if key in self._entries:
                self._drop(self._entries[key])
            try:
                written = 0
                for first in range(0, len(parts), IOV_MAX):  # a chunk of many small batches: more than one call
                    written += os.pwritev(self._fd, parts[first:first + IOV_MAX], at + written)
            except OSError as exc:
                self._failed = True  # a full disk: memory alone from here on, said once
                log.warning("the spill file in %s cannot be written (%s): cold reads evicted from memory are "
                            "dropped from now on", self.where, exc)
                return False
            if written != size:
                return False
            entry = _Entry(key, at, size, None, int(value.stop))
            entry.value = value.spilled(self._reader(entry))
            self._entries[key] = entry
            bisect.insort(self._starts.setdefault(key[:2], []), key[2])
            bisect.insort(self._ats, at)
            self._at[at] = entry
            self._pos = at + size
            self.nbytes += size
            SPILL_WRITES.inc()
            SPILL_BYTES.set(self.nbytes)
        return True

    def _reader(self, entry: _Entry) -> Read:
        def read(position: int, length: int) -> bytes:
            with self._lock:
                if not entry.live:
                    raise Evicted(entry.key)
                try:
                    data = os.pread(self._fd, length, entry.at + position)
                except OSError:
                    data = b""
                if len(data) != length or position < 0:  # never expected: forget it rather than serve it
                    self._drop(entry)
                    raise Evicted(entry.key)
            return data

        return read

    def _overlapping(self, start: int, stop: int) -> list[_Entry]:
        """The entries with bytes in [start, stop) of the file (found by where they are, not by a scan of all
        of them: a 1 GiB file holds thousands)."""
        ats = self._ats
        i = max(bisect.bisect_right(ats, start) - 1, 0)
        found = []
        while i < len(ats) and ats[i] < stop:
            entry = self._at[ats[i]]
            if entry.at + entry.size > start:
                found.append(entry)
            i += 1
        return found

    def _drop(self, entry: _Entry) -> None:
        entry.live = False
        del self._entries[entry.key]
        starts = self._starts[entry.key[:2]]
        starts.remove(entry.key[2])
        del self._ats[bisect.bisect_left(self._ats, entry.at)]
        del self._at[entry.at]
        self.nbytes -= entry.size

    def find(self, topic: str, partition: int, offset: int, hit: bool = True) -> Any | None:
        """The kept stand-in covering ``offset``, or None; ``hit``: count it as a hit when found."""
        with self._lock:
            starts = self._starts.get((topic, partition))
            if not starts:
                return None
            i = bisect.bisect_right(starts, offset) - 1
            for j in range(i, max(i - LOOK_BACK, -1), -1):
                entry = self._entries[(topic, partition, starts[j])]
                if offset < entry.stop:
                    if hit:
                        SPILL_HITS.inc()
                    return entry.value
            return None

    def forget(self, topic: str) -> None:
        with self._lock:
            for entry in [e for e in self._entries.values() if e.key[0] == topic]:
                self._drop(entry)
            SPILL_BYTES.set(self.nbytes)
