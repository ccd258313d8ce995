"""The history service: the configured topics' Iceberg tables, their offset ranges, the brokers'
watermarks, and encoded record batches, shared by every client connection.

Blocking PyIceberg/Arrow work runs in worker threads under one limiter; results that are immutable
(a table's offset ranges per snapshot) are cached, watermarks are cached briefly.
"""

from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import trio

from protocol.records import encode_batches, record_sizes, timestamp_runs

from ..config import Config, TopicConfig
from ..metrics import LAKE_ERRORS, LAKE_GAPS, LAKE_READ_BYTES, LAKE_READ_SECONDS
from ..registry.client import RegistryClient
from .chunks import Chunk, ChunkCache
from .lake import LakeError, LakeTopic, OffsetRange

__all__ = ["History", "Watermarks", "load_catalog"]

log = logging.getLogger("ksi.history")

RANGES_TTL_SECONDS = 2.0
CATALOG_RETRY_SECONDS = 10.0
BATCH_BYTES = 256 << 10   # records per served batch, before compression: a fetch's unit of bytes
MIN_CHUNK_ROWS = 1024
_BASE = struct.Struct(">q")        # a batch's base offset, at byte 0
_LAST_DELTA = struct.Struct(">i")  # its last offset delta, at byte 23


@dataclass(frozen=True, slots=True)
class Watermarks:
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int
    at: float


def load_catalog(config: Config) -> Any:
    from pyiceberg.catalog import load_catalog as pyiceberg_load_catalog

    assert config.catalog is not None
    properties = dict(config.catalog.properties)
    uri = properties.get("uri", "")
    if "type" not in properties and uri.startswith(("sqlite", "postgresql", "mysql")):
        properties["type"] = "sql"
    return pyiceberg_load_catalog(config.catalog.name, **properties)


class History:
    def __init__(self, config: Config, catalog: Any = None) -> None:
        self.config = config
        self.limiter = trio.CapacityLimiter(config.history.read_threads)
        self.cache = ChunkCache(config.history.cache_bytes)
        self._loading: dict[tuple[str, int, int, int], _Loading] = {}
        self._row_bytes: dict[str, int] = {}
        self._nursery: trio.Nursery | None = None
        self._catalog_retry_at = 0.0
        self._catalog = catalog
        self.topics: dict[str, LakeTopic] = {}
        self.problems: dict[str, str] = {}
        self._ranges: dict[str, tuple[float, dict[int, OffsetRange]]] = {}
        self._topic_configs = {t.name: t for t in config.topics}
        url = config.schema_registry.url
        self.registry = RegistryClient(url) if url else None
        self.lake_only: frozenset[str] = frozenset()  # configured topics that do not exist in Kafka

    @property
    def enabled(self) -> bool:
        return bool(self._topic_configs)

    def config_for(self, topic: str) -> TopicConfig | None:
        return self._topic_configs.get(topic)

    async def start(self) -> None:
        """Open the catalog and every table; a topic whose table is unusable is logged and served hot only
        (and retried: a catalog that comes back later is picked up on the next fetch)."""
        if not self._topic_configs:
            return
        await self._open()

    async def _open(self) -> bool:
        """Open the catalog and load the tables not loaded yet; False when the catalog is unreachable."""
        if self._catalog is None:
            now = time.monotonic()
            if now < self._catalog_retry_at:
                return False
            try:
                self._catalog = await trio.to_thread.run_sync(load_catalog, self.config)
            except Exception as exc:
                self._catalog_retry_at = now + CATALOG_RETRY_SECONDS
                log.error("cannot open the Iceberg catalog %r (%s: [catalog]): %s; history topics are served from"
                          " Kafka only until it is reachable (retrying every %g s)",
                          self.config.catalog.name if self.config.catalog else "", self.config.source, exc,
                          CATALOG_RETRY_SECONDS)
                for topic in self._topic_configs.values():
                    self.problems[topic.name] = f"catalog unavailable: {exc}"
                return False
        for topic in self._topic_configs.values():
            if topic.name in self.topics:
                continue
            lake = LakeTopic(self._catalog, topic, self.registry)
            try:
                await trio.to_thread.run_sync(lake.load, limiter=self.limiter)
            except LakeError as exc:
                LAKE_ERRORS.labels(topic.name, "load").inc()
                log.error("%s; the topic is served from Kafka only", exc)
                self.problems[topic.name] = str(exc)
            else:
                self.problems.pop(topic.name, None)
                log.info("topic %s: history from %s (layout %s)", topic.name, topic.table, topic.layout)
                if lake.layout.value_columns and self.registry is None:
                    log.error("topic %s: table %s has typed value columns (%s); replaying them needs a Schema"
                              " Registry: set [schema_registry] url in %s", topic.name, topic.table,
                              ", ".join(lake.layout.value_columns), self.config.source)
            self.topics[topic.name] = lake
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

    async def ranges(self, topic: str) -> dict[int, OffsetRange]:
        """The lake's offset range per partition (empty when the lake cannot answer)."""
        lake = self.topics.get(topic)
        if lake is None:
            if topic not in self._topic_configs or not await self._open():
                return {}
            lake = self.topics[topic]
        cached = self._ranges.get(topic)
        now = time.monotonic()
        if cached is not None and now - cached[0] < RANGES_TTL_SECONDS:
            return cached[1]
        try:
            ranges = await trio.to_thread.run_sync(lake.offset_ranges, limiter=self.limiter)
        except LakeError as exc:
            LAKE_ERRORS.labels(topic, "ranges").inc()
            if self.problems.get(topic) != str(exc):
                log.warning("%s", exc)
            self.problems[topic] = str(exc)
            # Keep what was known (or nothing) for a while instead of asking the catalog on every fetch.
            ranges = cached[1] if cached is not None else {}
            self._ranges[topic] = (now, ranges)
            return ranges
        self.problems.pop(topic, None)
        self._ranges[topic] = (now, ranges)
        return ranges

    def report_gap(self, topic: str, partition: int, lake_next: int, log_start: int, client: str) -> None:
        LAKE_GAPS.labels(topic).inc()
        log.error("%s: topic %s partition %d: offsets %d..%d are in neither the lake nor Kafka (lake ends at %d, the"
                  " log starts at %d): refusing to skip them", client, topic, partition, lake_next, log_start - 1,
                  lake_next - 1, log_start)

    async def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> tuple[int, int] | None:
        lake = self.topics.get(topic)
        if lake is None:
            return None
        try:
            return await trio.to_thread.run_sync(lake.offset_for_timestamp, partition, timestamp_ms,
                                                 limiter=self.limiter)
        except LakeError as exc:
            LAKE_ERRORS.labels(topic, "timestamp").inc()
            log.warning("%s", exc)
            return None

    # -- cold reads ----------------------------------------------------------------------------

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run the background prefetches until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def read(self, topic: str, partition: int, offset: int, max_bytes: int, last: int,
                   compression: str = "none") -> bytes:
        """Encoded record batches from ``offset`` (up to ``last``): within ``max_bytes`` but always one
        whole batch (KIP-74); the batch holding ``offset`` may start below it, as a broker's would."""
        started = time.perf_counter()
        position = offset
        data = b""
        while not data and position <= last:
            chunk = self.cache.find(topic, partition, position)
            if chunk is None:
                # A miss (a seek, or the first read): read about what this fetch can take, so the first
                # record comes quickly; the prefetch below reads full chunks after it.
                first_bytes = min(self.config.history.chunk_bytes, max(2 * max_bytes, 1 << 20))
                chunk = await self._load(topic, partition, position, last, compression, first_bytes)
            data = chunk.take(position, max_bytes)
            if self.config.history.prefetch and chunk.stop <= last and self._nursery is not None:
                self._nursery.start_soon(self._prefetch, topic, partition, chunk.stop, last, compression)
            position = chunk.stop
        LAKE_READ_SECONDS.labels(topic).observe(time.perf_counter() - started)
        LAKE_READ_BYTES.labels(topic).inc(len(data))
        return data

    async def _prefetch(self, topic: str, partition: int, start: int, last: int, compression: str) -> None:
        if self.cache.find(topic, partition, start) is not None:
            return
        try:
            await self._load(topic, partition, start, last, compression)
        except LakeError as exc:
            log.debug("prefetch of topic %s partition %d at %d failed: %s", topic, partition, start, exc)

    async def _load(self, topic: str, partition: int, start: int, last: int, compression: str,
                    target_bytes: int | None = None) -> Chunk:
        """Read and encode the chunk starting at ``start``; concurrent callers share one read."""
        for (t, p, s, stop), waiting in list(self._loading.items()):
            if (t, p) == (topic, partition) and s <= start < stop:
                await waiting.done.wait()
                if waiting.chunk is None:
                    raise LakeError(waiting.error or f"topic {topic} partition {partition}: read failed")
                return waiting.chunk
        target = target_bytes or self.config.history.chunk_bytes
        rows = max(MIN_CHUNK_ROWS, target // self._row_bytes.get(topic, 256))
        stop = start + rows
        following = self.cache.next_start(topic, partition, start)
        stop = min(stop, last + 1, following if following is not None else stop)
        key = (topic, partition, start, stop)
        loading = _Loading()
        self._loading[key] = loading
        lake = self.topics[topic]
        try:
            chunk, row_bytes = await trio.to_thread.run_sync(_read_chunk, lake, partition, start, stop, compression,
                                                             limiter=self.limiter)
        except LakeError as exc:
            LAKE_ERRORS.labels(topic, "read").inc()
            loading.error = str(exc)
            raise
        finally:
            del self._loading[key]
            loading.done.set()
        if row_bytes:
            self._row_bytes[topic] = row_bytes
        loading.chunk = chunk
        self.cache.put(topic, partition, chunk)
        return chunk


@dataclass
class _Loading:
    done: trio.Event = field(default_factory=trio.Event)
    chunk: Chunk | None = None
    error: str | None = None


def _read_chunk(lake: LakeTopic, partition: int, start: int, stop: int, compression: str) -> tuple[Chunk, int]:
    """Blocking: read ``[start, stop)`` of a partition and encode it as record batches; also the
    average record size, to size the next chunk."""
    rows = lake.read_range(partition, start, stop)
    if rows is None or len(rows.columns) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Chunk(start, stop, empty, empty, ()), 0
    columns = rows.columns
    level = 1 if compression == "gzip" else None  # gzip's default level 6 costs 4x the CPU for ~10% size
    runs = ([(0, len(columns), 0)] if rows.timestamp_types is None
            else timestamp_runs(rows.timestamp_types, columns.timestamps))
    batches: list[bytes] = []
    for first, end, timestamp_type in runs:
        batches += encode_batches(columns.slice(first, end), max_batch_bytes=BATCH_BYTES,
                                  timestamp_type=timestamp_type, compression=compression, compression_level=level)
    bases = np.fromiter((_BASE.unpack_from(b, 0)[0] for b in batches), dtype=np.int64, count=len(batches))
    deltas = np.fromiter((_LAST_DELTA.unpack_from(b, 23)[0] for b in batches), dtype=np.int64, count=len(batches))
    row_bytes = max(1, int(record_sizes(columns).sum()) // len(columns))
    return Chunk(start, stop, bases, bases + deltas, tuple(batches)), row_bytes
