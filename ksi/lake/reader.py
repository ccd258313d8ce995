"""Cold reads for every consumer at once: one read per window, shared, cached, read ahead.

A consumer's Fetch for partition ``p`` at offset ``o`` becomes :meth:`ColdReader.read`: the cached
encoding holding ``o`` if there is one; else the plan's component holding ``o`` (or the next one, past a
hole) is read (:meth:`ksi.lake.table.LakeTable.read_plan` / :meth:`~ksi.lake.table.LakeTable.read`) in a
worker thread, encoded by the caller's ``encode`` (the Kafka side: record batches), and cached.

* **Shared**: a read registers every (partition, component) it will serve before it starts, so a
  consumer of another partition of the same window, or a second consumer of the same offsets, waits for
  that read instead of starting its own.
* **Its partition first**: a read a consumer waits for (a seek, a replay's start) hands that consumer its
  partition's records as soon as they are encoded; the other partitions its windows hold are made into
  records and encoded after, from the same decoded windows, and whoever waits for them waits for that.
* **Read ahead**: once a consumer is served, what comes after the chunk it is taking is read in the
  background, so a sequential replay finds its next data ready: the next chunks are read while the consumer
  takes the one before them, up to as many reads ahead of a partition at once as there are read threads
  (a table whose every window holds every partition is decoded on all of them), but never a read that
  would decode again the start of a row group another read is streaming: where the file has a page index,
  a read ahead starts at the pages holding its window, so two threads decode one huge row group; without
  one it waits for the other read's cursor.  Like a kernel's readahead it
  ramps up: after a fetch away from where the consumer's last one ended (a seek, a replay's
  start) it decodes a quarter window's rows, then twice as many each time the consumer comes back for
  more, up to ``READ_WINDOWS`` windows; a consumer that seeks, takes a few records and leaves costs
  little beyond them.
* **Kept until taken**: what a read brings for the consumer that asked (or read ahead for it) waits in the
  cache until that consumer takes it (:meth:`ksi.lake.cache.ChunkCache.release`); no read ahead starts
  while such chunks fill their share of the cache, so many streams reading ahead cannot evict each other's
  next data unused and read it twice.
* **Bounded in bytes**: reads in flight are bounded by the thread limiters, and each decodes at most about
  ``max_read_bytes`` (``history.max_read_bytes``): a row group's windows are cut to an eighth of it (see
  :class:`ksi.lake.files.OpenFile`), and a read's rows to what it holds at the bytes per row last read
  (``ksi_lake_reads_in_flight_bytes``); what reads produce is bounded by the cache.

The caller decides what may be served (``cap``: the first offset not to serve, the broker's log start;
None: the lake's end) and what the bytes are; this module knows nothing of Kafka's protocol.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from .. import allocator
from ..metrics import LAKE_READS, LAKE_READS_IN_FLIGHT_BYTES, LAKE_ROWS
from .cache import Cached, ChunkCache
from .index import TablePlan
from .spill import Evicted
from .table import READ_WINDOWS, LakeError, LakeTable, ReadPlan, ReadResult, Span

__all__ = ["ColdReader", "Encoded"]

log = logging.getLogger("ksi.lake")

RAMP_STEPS = (READ_WINDOWS * 4).bit_length() - 1  # doublings from a quarter window to READ_WINDOWS windows
RAMPS_KEPT = 4096                                   # (topic, partition, reader) ramps remembered
MAX_READ_BYTES = 64 << 20                           # a read decodes about this many bytes at most


class Encoded(Cached, Protocol):
    """What ``encode`` returns: the bytes of a span of offsets (:class:`ksi.history.chunks.Chunk`), cached."""

    def take(self, offset: int, max_bytes: int, isolation_level: int = 0,
             exact: bool = False) -> tuple[list[bytes], bool]:
        """Bytes from ``offset`` on within ``max_bytes`` (at least one unit), and whether they reach the end;
        ``isolation_level`` 1 (read_committed) without the records of aborted transactions; ``exact``: nothing
        when the unit holding ``offset`` starts below it."""


@dataclass(slots=True)
class _Read:
    """A read in flight: who waits for which (partition, component)."""

    partition: int = -1       # the partition it was started for
    done: trio.Event = field(default_factory=trio.Event)
    first: trio.Event = field(default_factory=trio.Event)   # ``partition``'s chunks are in (set by ``done`` too)
    chunks: dict[int, list[Any]] = field(default_factory=dict)   # partition -> encoded spans
    failed: dict[int, str] = field(default_factory=dict)
    error: LakeError | None = None
    ends: dict[int, int] = field(default_factory=dict)  # partition -> the first offset after what it brings


@dataclass(slots=True)
class _Ramp:
    """One consumer's reads ahead of one partition: how large the next is, and what it was last served."""

    step: int = RAMP_STEPS   # the next read ahead decodes (quarter window) << step rows
    served_from: int = -1    # its last fetch's offset ...
    served_to: int = -1      # ... and the end of the last span that answered it: a fetch in between is sequential


class ColdReader:
    def __init__(self, cache: ChunkCache, threads: int, prefetch: bool = True,
                 max_read_bytes: int = MAX_READ_BYTES) -> None:
        self.cache = cache
        self.max_read_bytes = max_read_bytes
        # A read a consumer waits for never queues behind reads ahead: they have slots of their own.
        self.limiter = trio.CapacityLimiter(threads)
        # Reads ahead of one partition run up to as many at once as there are threads, each for the offsets
        # after the one before: a replay of a table whose every window holds every partition (one read serves
        # them all) decodes on all threads, not on one.
        self.ahead_depth = max(1, threads)
        self.ahead_limiter = trio.CapacityLimiter(self.ahead_depth)
        self.prefetch = prefetch
        self._reads: dict[tuple[str, int, int], _Read] = {}   # (topic, partition, component) in flight
        self._ahead: dict[tuple[str, int], int] = {}           # reads ahead in flight, per partition
        self._ramps: OrderedDict[tuple[str, int, int], _Ramp] = OrderedDict()  # (topic, partition, reader)
        self._row_bytes: dict[str, float] = {}   # per topic: encoded bytes per decoded row, as last read
        # Per (topic, partition): why its last read failed, until a fetch that does not wait is told (a read
        # started for such a fetch, or ahead of the consumer, fails with nobody waiting for it)
        self._failed: dict[tuple[str, int], LakeError] = {}
        # Per (topic, partition): the chunks its last read brought that the cache did not keep (the cache is
        # off, or too small for them), handed to its next fetch; without them a fetch that does not wait
        # would start the same read again and again
        self._handed: dict[tuple[str, int], tuple[_Read, list[Any]]] = {}
        self.ahead_reserved = 0                  # bytes the reads ahead in flight are expected to bring
        self.in_flight_bytes = 0                 # ... and all reads in flight
        self._nursery: trio.Nursery | None = None

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the background reads until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def read(self, table: LakeTable, encode: Callable[[Span], Any], partition: int, offset: int,
                   cap: int | None, caps: dict[int, int] | None, max_bytes: int, reader: int = 0,
                   isolation_level: int = 0, wait: bool = True) -> list[bytes] | None:
        """The encoded data from the first record at or after ``offset`` on (a hole is stepped over), within
        ``max_bytes`` but at least one unit of ``encode``'s (KIP-74); empty when the lake holds nothing at or
        after ``offset`` below ``cap``.  ``caps``: what other partitions may be served by the same read (see
        :meth:`LakeTable.read_plan`).  ``isolation_level``: the Fetch's (one cache entry holds both views of a
        span with aborted records; see :class:`ksi.history.chunks.Chunk`).  ``wait`` False: when nothing at
        ``offset`` is cached, start reading it and return None at once (a broker answers a fetch with the
        partitions that have data, without waiting for the others).  Raises :class:`LakeError` when the lake
        cannot be read."""
        topic = table.name
        plan = table.plan
        wanted = plan.partitions.get(partition)
        out: list[bytes] = []
        size = 0
        position = offset
        served_to = offset
        while wanted is not None and (cap is None or position < cap) and size < max_bytes:
            chunk = self.cache.find(topic, partition, position, reader, miss=not out)
            if chunk is None and self._handed:
                chunk = self._take_handed(topic, partition, position)
            if chunk is None:
                if out:
                    break  # answer with what is ready; the read ahead brings the rest
                component = wanted.locate(position)
                if component is None:
                    break
                if not wait:
                    failed = self._failed.pop((topic, partition), None)
                    if failed is not None:
                        raise failed  # told once; the next fetch reads again
                    self._begin(table, encode, partition, component, position, cap, caps, reader)
                    return None
                chunk = await self._load(table, encode, partition, component, position, cap, caps, reader)
                if chunk is None:
                    break
            # Going on from another chunk, this one must start where that one ended: chunks of one partition
            # may overlap (reads in parallel over windows that hold every partition, compactions), and a
            # client given offsets twice in one response delivers them twice.
            try:
                taken, whole = chunk.take(position, max_bytes - size if out else max(max_bytes, 1), isolation_level,
                                          exact=bool(out))
            except Evicted:
                continue  # spilled, and overwritten since: the next lookup misses and the lake is read
            if not taken and not whole:
                break  # it starts below: the next fetch goes on from here
            out += taken
            size += sum(len(b) for b in taken)
            served_to = chunk.stop
            if not whole:
                break  # the budget ended inside this chunk: the next fetch goes on from there
            self.cache.release(topic, partition, chunk.start, reader)  # taken whole: no longer kept apart for it
            position = chunk.stop
        if out:
            ramp = self._ramp(topic, partition, reader)
            ramp.served_from, ramp.served_to = offset, served_to
        if self.prefetch and wanted is not None and (cap is None or position < cap):
            self._read_ahead(table, encode, partition, position, cap, caps, reader)
        return out

    async def _load(self, table: LakeTable, encode: Callable[[Span], Any], partition: int, component: int,
                    position: int, cap: int | None, caps: dict[int, int] | None, reader: int) -> Any | None:
        """The encoded span holding ``position`` after reading ``component`` (or waiting for the read that has
        it in flight); None when the read served nothing there."""
        topic = table.name
        pending = self._begin(table, encode, partition, component, position, cap, caps, reader)
        await (pending.first if pending.partition == partition else pending.done).wait()
        if self._handed.get((topic, partition), (None,))[0] is pending:
            del self._handed[(topic, partition)]  # this fetch takes them
        if partition in pending.failed:
            raise LakeError(pending.failed[partition])
        if pending.error is not None:
            raise pending.error
        for chunk in pending.chunks.get(partition, []):
            if chunk.stop > position:
                return chunk
        return self.cache.find(topic, partition, position, reader, hit=False, miss=False)  # the miss was counted

    def _begin(self, table: LakeTable, encode: Callable[[Span], Any], partition: int, component: int,
               position: int, cap: int | None, caps: dict[int, int] | None, reader: int) -> _Read:
        """The read in flight that brings ``component``, started if none is."""
        ramp = self._ramp(table.name, partition, reader)
        if not ramp.served_from <= position <= ramp.served_to:
            ramp.step = 0  # not where this consumer's last fetch ended: a seek (or a start), small reads first
        pending = self._reads.get((table.name, partition, component))
        if pending is None:
            pending = self._start(table, encode, partition, component, _caps(partition, cap, caps), reader,
                                  waited_for=True)
        return pending

    def _take_handed(self, topic: str, partition: int, position: int) -> Any | None:
        """The chunk holding ``position`` among those handed on by the partition's last read, if any (the
        chunks before it are dropped: a consumer goes forward)."""
        chunks = self._handed.get((topic, partition), (None, []))[1]
        while chunks:
            chunk = chunks[0]
            if chunk.stop <= position:
                chunks.pop(0)
                continue
            if chunk.start > position:
                return None
            if len(chunks) == 1:
                del self._handed[(topic, partition)]
            return chunk
        self._handed.pop((topic, partition), None)
        return None

    def _ramp(self, topic: str, partition: int, reader: int) -> _Ramp:
        """A consumer's read-ahead state for a partition (the least recently used are forgotten)."""
        key = (topic, partition, reader)
        ramp = self._ramps.get(key)
        if ramp is None:
            ramp = self._ramps[key] = _Ramp()
            if len(self._ramps) > RAMPS_KEPT:
                self._ramps.popitem(last=False)
        else:
            self._ramps.move_to_end(key)
        return ramp

    def _plan(self, table: LakeTable, partition: int, component: int, caps: dict[int, int] | None,
              waited_for: bool = False, ahead_rows: int | None = None) -> ReadPlan:
        row_bytes = self._row_bytes.get(table.name)
        max_rows = None if not row_bytes else max(1, int(self.max_read_bytes / row_bytes))
        return table.read_plan(table.plan, partition, component, caps, waited_for, ahead_rows, max_rows)

    def _start(self, table: LakeTable, encode: Callable[[Span], Any], partition: int, component: int,
               caps: dict[int, int] | None, reader: int, waited_for: bool = False,
               ahead_rows: int | None = None, ahead: bool = False, read_plan: ReadPlan | None = None) -> _Read:
        """Plan a read (unless ``read_plan`` is), register what it serves, and run it in a worker thread in the
        background nursery (``waited_for``: a consumer waits for it, so it is a small one; ``ahead_rows``: a
        read ahead's size)."""
        topic = table.name
        plan = table.plan
        row_bytes = self._row_bytes.get(topic)
        if read_plan is None:
            read_plan = self._plan(table, partition, component, caps, waited_for, ahead_rows)
        pending = _Read(partition=partition, ends=_ends(plan, read_plan.served, caps))
        keys = [(topic, p, c) for p, components in read_plan.served.items() for c in components]
        keys = [k for k in keys if k not in self._reads]
        for key in keys:
            self._reads[key] = pending
        rows = sum(plan.window_rows.get(int(k), 0) for k in read_plan.windows)
        expected = int((row_bytes or 0.0) * rows)
        reserved = expected if ahead else 0
        self.ahead_reserved += reserved
        self.in_flight_bytes += expected
        LAKE_READS_IN_FLIGHT_BYTES.set(self.in_flight_bytes)
        # A read a consumer waits for (a seek, a replay's start) serves its partition first: the window it
        # decodes holds every partition of a table that mixes them, and making records of and encoding all of
        # them took about half of a seek's time (bench/cold.py's one-file table: 31-47 of 59-100 ms); the
        # others follow in a second step, from the same decoded windows.
        others = {p: c for p, c in read_plan.served.items() if p != partition}
        split = waited_for and bool(others) and partition in read_plan.served

        def encode_all(result: ReadResult) -> dict[int, list[Any]]:
            encoded: dict[int, list[Any]] = {}
            for span in result.spans:
                encoded.setdefault(span.partition, []).append(encode(span))
            result.spans.clear()  # the decoded columns are freed now, and their pages handed back
            return encoded

        def work() -> tuple[dict[int, Any] | None, ReadResult, dict[int, list[Any]]]:
            if not split:
                result = table.read(plan, read_plan, caps)
                encoded = encode_all(result)
                allocator.trim()
                return None, result, encoded
            tables = table.decode(plan, read_plan)
            try:
                result = table.records(plan, tables, {partition: read_plan.served[partition]}, caps)
            except LakeError as exc:
                result = ReadResult(failed={partition: str(exc)})
            return tables, result, encode_all(result)

        def work_others(tables: dict[int, Any]) -> tuple[ReadResult, dict[int, list[Any]]]:
            try:
                result = table.records(plan, tables, others, caps)
            except LakeError as exc:
                result = ReadResult(failed=dict.fromkeys(others, str(exc)))
            encoded = encode_all(result)
            allocator.trim()
            return result, encoded

        def publish(result: ReadResult, encoded: dict[int, list[Any]]) -> int:
            for reason, count in result.counts.items():
                LAKE_ROWS.labels(topic, reason).inc(count)
            if result.differing:
                log.warning("topic %s: the table holds differing rows for the same offset; serving the first"
                            " data file's (partition, offset): %s", topic,
                            ", ".join(f"{p}/{o}" for p, o in result.differing[:10]))
            pending.failed.update(result.failed)
            for p, why in result.failed.items():
                self._failed[(topic, p)] = LakeError(why)
            for p in encoded:
                self._failed.pop((topic, p), None)
            for p, chunks in encoded.items():
                unkept = [chunk for chunk in chunks  # the consumer's own are kept for it until it takes them
                          if not self.cache.put(topic, p, chunk, reader, ahead=p == partition)]
                if unkept and p == partition:
                    self._handed[(topic, p)] = (pending, unkept)
            pending.chunks.update(encoded)
            return sum(chunk.nbytes for chunks in encoded.values() for chunk in chunks)

        async def run() -> None:
            limiter = self.limiter if waited_for else self.ahead_limiter
            try:
                tables, result, encoded = await trio.to_thread.run_sync(work, limiter=limiter)
                LAKE_READS.labels(topic).inc()
                nbytes = publish(result, encoded)
                whole = True  # every partition's records made (else its bytes per row are not the read's)
                if tables is not None:
                    pending.first.set()  # the consumer that waits is served; the other partitions follow
                    result, encoded = await trio.to_thread.run_sync(work_others, tables, limiter=limiter)
                    del tables
                    nbytes += publish(result, encoded)
                    whole = not result.failed
                if whole:
                    self._row_bytes[topic] = nbytes / max(rows, 1)
            except LakeError as exc:
                pending.error = exc
            except Exception as exc:  # any failure of a read is that read's, never the process's
                pending.error = LakeError(f"topic {topic}: reading partition {partition} failed:"
                                          f" {type(exc).__name__}: {exc}")
                log.error("topic %s: unexpected failure reading the lake", topic, exc_info=exc)
            finally:
                if pending.error is not None:
                    for p in read_plan.served:
                        if p not in pending.chunks:
                            self._failed[(topic, p)] = pending.error
                self.ahead_reserved -= reserved
                self.in_flight_bytes -= expected
                LAKE_READS_IN_FLIGHT_BYTES.set(self.in_flight_bytes)
                for key in keys:
                    if self._reads.get(key) is pending:
                        del self._reads[key]
                if ahead:  # before anyone waiting is woken: a consumer served now may start the next one
                    left = self._ahead.pop((topic, partition), 1) - 1
                    if left > 0:
                        self._ahead[(topic, partition)] = left
                pending.first.set()
                pending.done.set()

        if self._nursery is not None:
            self._nursery.start_soon(run)
        else:  # no background nursery (tests): the first waiter's task cannot run it, so run it inline
            raise RuntimeError("ColdReader.serve() is not running")
        return pending

    def _read_ahead(self, table: LakeTable, encode: Callable[[Span], Any], partition: int, position: int,
                    cap: int | None, caps: dict[int, int] | None, reader: int) -> None:
        """Start reading what comes after ``position`` and after what is cached or being read from there on,
        unless that is ``ahead_depth`` reads ahead of the chunk the consumer takes already, or that many reads
        ahead of this partition are running: the next chunks are read while the consumer takes this one."""
        topic = table.name
        wanted = table.plan.partitions.get(partition)
        if wanted is None or self._ahead.get((topic, partition), 0) >= self.ahead_depth:
            return
        for _ in range(self.ahead_depth + 1):  # the chunk being taken, then what is read (or being read) ahead
            if cap is not None and position >= cap:
                return
            stop = self.cache.stop_of(topic, partition, position)
            if stop is not None:
                position = stop
                continue
            component = wanted.locate(position)
            if component is None:
                return
            pending = self._reads.get((topic, partition, component))
            if pending is None:
                break
            end = pending.ends.get(partition)
            if end is None or end <= position:
                return
            position = end
        else:
            return  # far enough ahead
        if not self.cache.ahead_room(self.ahead_reserved):
            return  # what was read ahead for consumers is not taken yet: reading more would evict it unused
        ramp = self._ramp(topic, partition, reader)
        rows = (table.plan.views[0].window_rows // 4) << ramp.step
        merged = _caps(partition, cap, caps)
        read_plan = self._plan(table, partition, component, merged, ahead_rows=rows)
        if not table.starts_cheaply(table.plan, read_plan):
            return  # it would decode again the start of a row group another read is streaming (no page index)
        ramp.step = min(ramp.step + 1, RAMP_STEPS)
        self._ahead[(topic, partition)] = self._ahead.get((topic, partition), 0) + 1
        self._start(table, encode, partition, component, merged, reader, ahead_rows=rows, ahead=True,
                    read_plan=read_plan)

def _ends(plan: TablePlan, served: dict[int, list[int]], caps: dict[int, int] | None) -> dict[int, int]:
    """Per partition a read serves, the first offset after the run of components it serves from its first
    (capped)."""
    ends = {}
    for p, components in served.items():
        last = components[0]
        for c in components[1:]:
            if c != last + 1:
                break
            last = c
        end = int(plan.partitions[p].component_last[last]) + 1
        ends[p] = end if caps is None or p not in caps else min(end, caps[p])
    return ends


def _caps(partition: int, cap: int | None, caps: dict[int, int] | None) -> dict[int, int] | None:
    """The caps of a read for ``partition``: its own, with what is known of the others."""
    if cap is None:
        return None
    merged = dict(caps or {})
    merged[partition] = cap
    return merged
