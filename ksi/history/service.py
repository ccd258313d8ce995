"""History, the Kafka side: what the configured topics' history looks like to the clients that fetch it.

Shares, across every client connection: the topics' configuration and which of them exist only in the
lake, the lake itself (:class:`ksi.lake.catalog.LakeCatalog`: tables, snapshots, offsets; and the cold
reader with its cache), the highest log start seen per partition, and the log lines a fault every fetch
runs into (once, then at most every few seconds per partition).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING

import trio

from protocol.errors import error_name

from .. import allocator
from ..config import Config, TopicConfig
from ..lake.cache import ChunkCache
from ..lake.catalog import RANGES_TTL_SECONDS, LakeCatalog
from ..lake.reader import ColdReader
from ..lake.spill import Evicted, Spill
from ..lake.table import LakeError, LakeTable, OffsetRange
from ..metrics import LAKE_ERRORS, LAKE_GAPS, LAKE_READ_BYTES, LAKE_READ_SECONDS, LAKE_STEPS, record_seam
from .chunks import encode_span

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

__all__ = ["History"]

log = logging.getLogger("ksi.history")

# What the process holds besides the cache and a read: imports, the catalog, plans (172-204 MiB after imports,
# measured).  Below that plus the cache and a read's decode, freed memory is kept for reuse (ksi.allocator).
BASE_RESIDENT_BYTES = 256 << 20


def _record_seam(topic: str, ranges: dict[int, OffsetRange]) -> None:
    """The lake's side of each partition's seam, in the seam gauges, as a catalog refresh found it."""
    for partition, known in ranges.items():
        record_seam(topic, partition, lake_first=known.first, lake_next=known.next)


class History:
    def __init__(self, config: Config, catalog: Catalog | None = None) -> None:
        self.config = config
        allocator.tune(keep_bytes=BASE_RESIDENT_BYTES + config.history.cache_bytes
                       + config.history.max_read_bytes)
        self.lake = LakeCatalog(config, catalog, on_ranges=_record_seam)
        spill = None
        if config.history.spill_bytes > 0:
            try:
                spill = Spill(config.history.spill_bytes, config.history.spill_dir)
            except OSError as exc:
                log.warning("history.spill_dir: no spill file can be made in %s (%s): cold reads evicted from "
                            "memory are dropped", config.history.spill_dir or "the temporary directory", exc)
        self.cache = ChunkCache(config.history.cache_bytes, spill=spill)
        self.reader = ColdReader(self.cache, config.history.read_threads, prefetch=config.history.prefetch,
                                 max_read_bytes=config.history.max_read_bytes)
        self._log_starts: dict[str, dict[int, int]] = {}  # per topic and partition: the highest log start seen
        self._route_next: set[tuple[str, int]] = set()  # partitions whose next Fetch is the router's (see below)
        self._topic_configs = {t.name: t for t in config.topics}
        self.lake_only: frozenset[str] = frozenset()  # configured topics that do not exist in Kafka
        self.planned = trio.Event()  # every configured topic's table planned once (or failed to be) at the start

    # -- the lake, as the Kafka side asks it ---------------------------------------------------

    @property
    def topics(self) -> dict[str, LakeTable]:
        return self.lake.topics

    @property
    def problems(self) -> dict[str, str]:
        return self.lake.problems

    def config_for(self, topic: str) -> TopicConfig | None:
        return self._topic_configs.get(topic)

    async def start(self) -> None:
        await self.lake.start()

    async def ranges(self, topic: str, max_age: float = RANGES_TTL_SECONDS,
                     refresh_wait: float | None = None) -> dict[int, OffsetRange]:
        if refresh_wait is None:
            return await self.lake.ranges(topic, max_age)
        return await self.lake.ranges(topic, max_age, refresh_wait)

    def fresh_ranges(self, topic: str) -> dict[int, OffsetRange] | None:
        return self.lake.fresh_ranges(topic)

    def unavailable(self, topic: str) -> str | None:
        return self.lake.unavailable(topic)

    def stale(self, topic: str, after: float = 0.0) -> str | None:
        return self.lake.stale(topic, after)

    async def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> tuple[int, int] | None:
        return await self.lake.offset_for_timestamp(topic, partition, timestamp_ms)

    def partition_unavailable(self, topic: str, partition: int) -> str | None:
        """Why the lake cannot serve the partition's offsets whole right now (an unreadable data file holds some
        of them), or None."""
        lake = self.lake.topics.get(topic)
        return lake.unavailable(partition) if lake is not None else None

    def writer_next(self, topic: str, partition: int) -> int | None:
        """The next offset the table's writer would write for ``partition`` (None: it keeps no such record)."""
        lake = self.lake.topics.get(topic)
        return lake.writer_next(partition) if lake is not None else None

    def lost(self, topic: str, partition: int) -> list[tuple[int, int]]:
        """The ranges of offsets (first, last) the topic's archive recorded as lost (retention passed it)."""
        lake = self.lake.topics.get(topic)
        return lake.lost(partition) if lake is not None else []

    def held_from(self, topic: str, partition: int, offset: int) -> int | None:
        """The first offset at or after ``offset`` that the lake's plan holds for ``partition`` (None: none, or
        the plan does not know the partition).  Exact: the plan's components start at an offset a row holds."""
        lake = self.lake.topics.get(topic)
        wanted = lake.plan.partitions.get(partition) if lake is not None else None
        component = wanted.locate(offset) if wanted is not None else None
        if wanted is None or component is None:
            return None
        return max(offset, int(wanted.component_first[component]))

    def nothing_below(self, topic: str, partition: int, offset: int, cap: int, reader: int) -> bool:
        """Whether the cached reads prove that the lake holds no record from ``offset`` below ``cap``: after a
        read that found none, its encoded spans cover the range (a read that stopped short proves nothing)."""
        position = offset
        while position < cap:
            chunk = self.cache.find(topic, partition, position, reader)
            if chunk is None:
                return False
            try:
                taken = chunk.take(position, 1)[0]
            except Evicted:
                return False
            if taken and (int.from_bytes(taken[0][:8], "big", signed=True) < cap):
                return False  # not read, or a batch holding offsets below the cap
            position = chunk.stop
        return True

    def set_upstream_topics(self, names: set[str]) -> None:
        """The cluster's topic names (from discovery): configured topics missing there are lake-only."""
        lake_only = frozenset(name for name in self._topic_configs if name not in names)
        for name in sorted(lake_only - self.lake_only):
            config = self._topic_configs[name]
            log.info("topic %s does not exist in Kafka: serving it read-only from %s", name, config.table)
        for name in sorted(self.lake_only - lake_only):
            log.info("topic %s now exists in Kafka: its offsets at and above the log start come from the broker", name)
        self.lake_only = lake_only

    def note_log_start(self, topic: str, partition: int, log_start_offset: int) -> None:
        """The broker's log start of a partition, as some connection learnt it: a read that serves several
        partitions at once serves each below its log start (offsets only ever leave the log at its start)."""
        known = self._log_starts.setdefault(topic, {})
        if log_start_offset > known.get(partition, -1):
            known[partition] = log_start_offset

    def log_start(self, topic: str, partition: int) -> int:
        """The highest log start any connection saw for the partition (-1: none yet)."""
        return self._log_starts.get(topic, {}).get(partition, -1)

    def out_of_range_relayed(self, topic: str, partition: int) -> None:
        """The broker answered the partition OFFSET_OUT_OF_RANGE in a Fetch response ksi was already relaying
        unread (:meth:`ksi.filters.history.HistoryFilter.walks_unread`): too late to hand that Fetch to the
        router, so the client got a retriable KAFKA_STORAGE_ERROR for it instead, and the next Fetch of the
        partition, whichever connection sends it, goes to the router, which learns the log start again."""
        self._route_next.add((topic, partition))
        self.lake.log_repeated(
            logging.INFO, topic, partition, "relayed-out-of-range",
            "topic %s partition %d: the broker answered OFFSET_OUT_OF_RANGE (its log start moved) in a Fetch response"
            " already being relayed: answered KAFKA_STORAGE_ERROR (retriable) instead, and the next Fetch of it is"
            " routed by ksi", topic, partition)

    def routes_next(self, topic: str, partition: int) -> bool:
        """Whether the partition's next Fetch must go to the router (see :meth:`out_of_range_relayed`)."""
        return bool(self._route_next) and (topic, partition) in self._route_next

    def routing(self, topic: str, partition: int) -> None:
        """The router has the partition's Fetch: the next ones may take the fast path again."""
        if self._route_next:
            self._route_next.discard((topic, partition))

    # -- faults, as the clients meet them ------------------------------------------------------

    def report_gap(self, topic: str, partition: int, lake_next: int, log_start: int, client: str,
                   certain: bool = True, lake_last: int | None = None) -> None:
        """Offsets ``lake_next..log_start - 1`` are in neither the lake nor Kafka (the fetch gets
        KAFKA_STORAGE_ERROR).  ``certain``: the writer's commit state says it never read them (lost data);
        else the writer keeps no commit state and the topic's ``seam_holes`` is ``error``.  ``lake_last``: the
        lake's last offset when ``lake_next`` is where its writer stopped reading (past holes it read)."""
        if lake_last is None:
            lake_last = lake_next - 1
        problem = self.stale(topic)
        if problem is not None:
            # Not known to be lost: the lake cannot be asked whether a newer snapshot holds them.
            self.lake.log_repeated(
                logging.ERROR, topic, partition, "stale",
                "%s: topic %s partition %d: offsets %d..%d are no longer in Kafka (the log starts at %d) and not in"
                " the lake's last known snapshot (it ends at %d), and the lake cannot be asked for a newer one (%s):"
                " answering KAFKA_STORAGE_ERROR (retriable) until it can", client, topic, partition, lake_next,
                log_start - 1, log_start, lake_next - 1, problem)
            return
        LAKE_GAPS.labels(topic).inc()
        if certain:
            self.lake.log_repeated(
                logging.ERROR, topic, partition, "gap",
                "%s: topic %s partition %d: offsets %d..%d are in neither the lake nor Kafka (lake ends at %d, its"
                " writer read up to %d, the log starts at %d): refusing to skip them", client, topic, partition,
                lake_next, log_start - 1, lake_last, lake_next - 1, log_start)
        else:
            config = self.config_for(topic)
            self.lake.log_repeated(
                logging.ERROR, topic, partition, "gap",
                "%s: topic %s partition %d: offsets %d..%d are in neither the lake nor Kafka (lake ends at %d, the"
                " log starts at %d), and table %s keeps no record of which offsets its writer read, so they may be"
                " lost records or offsets that never held one (transaction markers, dropped tombstones): refusing"
                " to skip them; set seam_holes = \"skip\" for this topic in %s if its writer drops records",
                client, topic, partition, lake_next, log_start - 1, lake_last, log_start,
                config.table if config else "?", self.config.source)

    def report_lost(self, topic: str, partition: int, first: int, last: int, client: str) -> None:
        """Offsets ``first..last``, which ``ksi archive`` recorded as lost (retention deleted them before it
        read them), were fetched: KAFKA_STORAGE_ERROR, counted as a gap, logged."""
        LAKE_GAPS.labels(topic).inc()
        config = self.config_for(topic)
        self.lake.log_repeated(
            logging.ERROR, topic, partition, "gap",
            "%s: topic %s partition %d: offsets %d..%d were deleted from Kafka before ksi archive read them (table %s"
            " records them as lost, ksi.lost-offsets): refusing to skip them", client, topic, partition, first, last,
            config.table if config else "?")

    def report_writer_unknown(self, topic: str, partition: int, offset: int, group: str, error: int,
                              client: str) -> None:
        """A hole at the seam whose writer group's offsets the broker cannot give now (``error``: it is not the
        group's coordinator, or the coordinator is loading): KAFKA_STORAGE_ERROR (retriable), never a gap."""
        LAKE_ERRORS.labels(topic, "writer_group").inc()
        self.lake.log_repeated(
            logging.WARNING, topic, partition, "writer_group",
            "%s: topic %s partition %d: offset %d is in neither the lake nor Kafka, and the broker this client is"
            " connected to cannot say now which offsets the writer group %r read (%s; on a cluster only the"
            " group's coordinator can): answering KAFKA_STORAGE_ERROR (retriable), not a gap", client, topic,
            partition, offset, group, error_name(error))

    def report_step(self, topic: str, partition: int, offset: int, to: int, reason: str, client: str) -> None:
        """A fetch at ``offset`` answered with a step to ``to``: offsets ``offset..to - 1`` are in neither the
        lake nor Kafka, explained by ``reason`` (see :data:`ksi.metrics.LAKE_STEPS`).  Counted every time,
        logged once and then at most every few seconds per partition."""
        LAKE_STEPS.labels(topic, reason).inc()
        why = {"lake": "the lake holds later offsets, so its writer read these",
               "writer": "the writer's commit state says it read these",
               "seam_holes_skip": "the topic's seam_holes setting is \"skip\""}.get(reason, reason)
        self.lake.log_repeated(
            logging.INFO, topic, partition, "step",
            "%s: topic %s partition %d: stepping over offsets %d..%d, in neither the lake nor Kafka (%s: transaction"
            " markers, aborted records, dropped tombstones or compacted keys)", client, topic, partition, offset,
            to - 1, why)

    def report_unavailable(self, topic: str, partition: int, what: str, client: str) -> None:
        """A request the lake must answer for a topic whose lake offsets are unknown (see :meth:`unavailable`):
        ``what`` says which (an offset below the log start, an EARLIEST or timestamp lookup)."""
        LAKE_ERRORS.labels(topic, "unavailable").inc()
        self.lake.log_repeated(
            logging.ERROR, topic, partition, "unavailable",
            "%s: topic %s partition %d: %s, and the lake cannot be asked (%s): answering KAFKA_STORAGE_ERROR"
            " (retriable) until it can", client, topic, partition, what,
            self.partition_unavailable(topic, partition) or self.unavailable(topic)
            or self.problems.get(topic, "unknown"))

    def report_read_error(self, topic: str, partition: int, offset: int, error: LakeError, client: str) -> None:
        """A cold read failed (the fetch gets KAFKA_STORAGE_ERROR): logged once, then every few seconds while
        it keeps failing, so a long outage does not log every retry of every consumer."""
        self.lake.log_repeated(logging.ERROR, topic, partition, "read",
                               "%s: topic %s partition %d offset %d: %s; answering KAFKA_STORAGE_ERROR (retriable)",
                               client, topic, partition, offset, error)

    # -- cold reads ----------------------------------------------------------------------------

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the cold reader's background reads until cancelled; plan every table once at the start, so the
        first consumer does not wait for the tables' indexes."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.reader.serve)
            nursery.start_soon(self._plan_all)
            task_status.started()

    async def _plan_all(self) -> None:
        for topic in self._topic_configs:
            try:
                await self.lake.ranges(topic)
            except Exception as exc:  # any failure is that topic's: fetches ask again; never ends the process
                LAKE_ERRORS.labels(topic, "ranges").inc()
                log.error("topic %s: planning its table failed", topic, exc_info=exc)
        self.planned.set()

    async def read(self, topic: str, partition: int, offset: int, max_bytes: int, cap: int | None,
                   reader: int = 0, isolation_level: int = 0, wait: bool = True) -> list[bytes] | None:
        """Encoded record batches from ``offset`` on (a hole in the lake is stepped over), below ``cap`` (the
        broker's log start; None: up to the lake's end): within ``max_bytes`` but always one whole batch
        (KIP-74); the batch holding ``offset`` may start below it, as a broker's would.  Under read_committed
        (``isolation_level`` 1) records of aborted transactions are left out.  ``wait`` False: None at once
        when nothing at ``offset`` is read yet (the read is started; see :meth:`ColdReader.read`)."""
        lake = self.topics[topic]
        config = self._topic_configs[topic]
        encode = functools.partial(encode_span, compression=config.compression)
        caps = None if cap is None else self._log_starts.get(topic, {})
        started = time.perf_counter()
        try:
            data = await self.reader.read(lake, encode, partition, offset, cap, caps, max_bytes, reader,
                                          isolation_level, wait)
        except LakeError:
            LAKE_ERRORS.labels(topic, "read").inc()
            raise
        if data is None:
            return None
        if self.lake.recovered(topic, partition, "read"):
            log.info("topic %s partition %d: cold reads succeed again", topic, partition)
        LAKE_READ_SECONDS.labels(topic).observe(time.perf_counter() - started)
        LAKE_READ_BYTES.labels(topic).inc(sum(len(b) for b in data))
        return data
