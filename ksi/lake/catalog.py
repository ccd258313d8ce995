"""The lake's catalog session: the catalog opened, each topic's table loaded, its snapshots refreshed and
planned, every call bounded.

Time is trio's clock (``trio.current_time``): TTLs, backoffs and the waits for a call run in virtual time
under trio's ``MockClock`` in tests.

The catalog is asked in threads of its own (:class:`_Call`), one call at a time per purpose, and requests
wait for it only a bounded time: a catalog that is down or hangs never holds up a request for long (nor
ksi's start), never takes a read slot, and answers picked up by a later request once it does answer.
While it cannot be asked, the offsets of the snapshot planned before are served (snapshots are immutable
and their files are read without the catalog); :meth:`LakeCatalog.unavailable` and :meth:`~LakeCatalog.stale`
tell the Kafka side when the lake's view cannot be trusted, and ``on_ranges`` what each refresh found: what
a client is answered then is the Kafka side's business (``ksi.history``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from ..config import Config, TopicConfig
from ..metrics import LAKE_ERRORS
from ..registry.client import RegistryClient
from .files import Cursors
from .table import FIRST_READ_WINDOWS, LakeError, LakeTable, LakeUnavailable, OffsetRange, brief_error

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

__all__ = ["CATALOG_WAIT_SECONDS", "RANGES_TTL_SECONDS", "LakeCatalog", "load_catalog"]

log = logging.getLogger("ksi.lake")

RANGES_TTL_SECONDS = 2.0
CATALOG_WAIT_SECONDS = 5.0    # how long requests (and the start) wait for a catalog that has not answered yet
REFRESH_WAIT_SECONDS = 0.5    # ... and for a refresh of ranges already known (then the known ones are used)
REPEAT_LOG_SECONDS = 10.0     # a fault hit by every request is logged again at most this often per partition


def load_catalog(config: Config) -> Catalog:
    from pyiceberg.catalog import load_catalog as pyiceberg_load_catalog

    assert config.catalog is not None
    properties = dict(config.catalog.properties)
    uri = properties.get("uri", "")
    if "type" not in properties and uri.startswith(("sqlite", "postgresql", "mysql")):
        properties["type"] = "sql"
    return pyiceberg_load_catalog(config.catalog.name, **properties)


def _import_pyiceberg() -> None:
    """Seconds of imports, done before the catalog's time to answer is counted."""
    import pyiceberg.catalog.sql
    import pyiceberg.io.pyarrow  # noqa: F401


class _Call:
    """A blocking call to the catalog in a daemon thread of its own.  Requests wait for it a bounded time and
    may stop waiting; the call goes on and its outcome is picked up by whichever request comes next.  A
    catalog that hangs thus holds one thread per purpose, not a request, a read slot or ksi's shutdown."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.started = trio.current_time()
        self.done = trio.Event()
        self.result: Any = None
        self.error: Exception | None = None
        self.taken = False  # its outcome has been acted on
        token = trio.lowlevel.current_trio_token()

        def run() -> None:
            try:
                self.result = fn()
            except Exception as exc:  # noqa: BLE001 - the outcome, for the request that picks it up
                self.error = exc
            finally:
                with contextlib.suppress(trio.RunFinishedError):  # ksi stopped meanwhile
                    trio.from_thread.run_sync(self.done.set, trio_token=token)

        threading.Thread(target=run, name=name, daemon=True).start()

    def age(self) -> float:
        return trio.current_time() - self.started

    async def wait(self, budget: float) -> bool:
        """Wait until ``budget`` seconds after the call started (not after this request came): once a call is
        overdue, requests stop waiting for it at all.  True when it has finished."""
        remaining = self.started + budget - trio.current_time()
        if remaining > 0 and not self.done.is_set():
            with trio.move_on_after(remaining):
                await self.done.wait()
        return self.done.is_set()

    def take(self) -> bool:
        """True for the one caller that acts on the outcome."""
        if self.taken:
            return False
        self.taken = True
        return True


class LakeCatalog:
    """Every configured topic's table, through one catalog session."""

    def __init__(self, config: Config, catalog: Catalog | None = None, cursors: Cursors | None = None,
                 on_ranges: Callable[[str, dict[int, OffsetRange]], None] | None = None) -> None:
        """``on_ranges(topic, ranges)``: told the offsets of every snapshot a refresh plans."""
        self.config = config
        self._on_ranges = on_ranges
        self.limiter = trio.CapacityLimiter(config.history.read_threads)
        self.cursors = cursors or Cursors(max_cursors=config.history.max_cursors,
                                          window_bytes=max(1, config.history.max_read_bytes // FIRST_READ_WINDOWS))
        self._catalog_retry_at = 0.0
        self._catalog_retry_seconds = config.history.catalog_retry_seconds
        self._catalog = catalog
        self._catalog_call: _Call | None = None
        self._catalog_failed = False  # the last attempt to open the catalog failed or is overdue
        self._catalog_logged: str | None = None  # the last catalog fault logged as an error
        self._hung: set[tuple[str, str]] = set()  # catalog calls reported as not answering, until they do
        self._load_calls: dict[str, tuple[_Call, LakeTable]] = {}
        self._range_calls: dict[str, _Call] = {}
        self.topics: dict[str, LakeTable] = {}
        self.problems: dict[str, str] = {}
        # Topics whose lake offsets are unknown because the catalog or storage cannot be reached, and
        # nothing is known from before: their cold offsets get a retriable error, not the broker's answer.
        self._unavailable: dict[str, str] = {}
        self._logged: dict[tuple[str, int, str], float] = {}
        self._ranges: dict[str, tuple[float, dict[int, OffsetRange]]] = {}
        self._topic_configs = {t.name: t for t in config.topics}
        url = config.schema_registry.url
        self.registry = RegistryClient(url) if url else None

    def log_repeated(self, level: int, topic: str, partition: int, kind: str, message: str, *args: Any) -> bool:
        """Log a fault every request runs into: once, then at most every REPEAT_LOG_SECONDS per partition.
        True when it was logged."""
        key = (topic, partition, kind)
        now = trio.current_time()
        if now - self._logged.get(key, -REPEAT_LOG_SECONDS) >= REPEAT_LOG_SECONDS:
            self._logged[key] = now
            log.log(level, message, *args)
            return True
        return False

    def recovered(self, topic: str, partition: int, kind: str) -> bool:
        """Whether a fault of ``kind`` had been logged for the partition (and is now forgotten)."""
        return self._logged.pop((topic, partition, kind), None) is not None

    @property
    def _catalog_name(self) -> str:
        return self.config.catalog.name if self.config.catalog else ""

    async def start(self) -> None:
        """Open the catalog and every table; a topic whose table is unusable is logged and served hot only
        (and retried: a catalog that comes back later is picked up on the next fetch).  A catalog that does
        not answer within CATALOG_WAIT_SECONDS does not hold up the start."""
        if not self._topic_configs:
            return
        if self._catalog is None:
            await trio.to_thread.run_sync(_import_pyiceberg)
        await self._open()

    async def _open(self) -> bool:
        """Open the catalog and load the tables not loaded yet; False when the catalog cannot be used now."""
        if self._catalog is None and not await self._open_catalog():
            return False
        catalog = self._catalog
        assert catalog is not None  # _open_catalog opened it
        for topic in self._topic_configs.values():
            if topic.name in self.topics:
                continue
            found = self._load_calls.get(topic.name)
            if found is None:
                lake = LakeTable(catalog, topic, self.registry, self.cursors,
                                 window_rows=self.config.history.window_rows)
                found = self._load_calls[topic.name] = (_Call(f"ksi-load-{topic.name}", lake.load), lake)
            call, lake = found
            if not await call.wait(CATALOG_WAIT_SECONDS):
                reason = (f"topic {topic.name}: the catalog {self._catalog_name!r} has not answered loading table"
                          f" {topic.table} for {call.age():.0f} s")
                if ("load", topic.name) not in self._hung:
                    self._hung.add(("load", topic.name))
                    LAKE_ERRORS.labels(topic.name, "load").inc()
                    log.error("%s; the table's offsets are unknown until it does", reason)
                self.problems[topic.name] = self._unavailable[topic.name] = reason
                continue
            if call.take():
                self._hung.discard(("load", topic.name))
                self._loaded(topic, call, lake)
        return True

    async def _open_catalog(self) -> bool:
        call = self._catalog_call
        if call is None:
            if trio.current_time() < self._catalog_retry_at:
                return False
            config = self.config
            call = self._catalog_call = _Call("ksi-catalog", lambda: load_catalog(config))
        if not await call.wait(CATALOG_WAIT_SECONDS):
            self._catalog_down(f"the Iceberg catalog {self._catalog_name!r} has not answered for"
                               f" {call.age():.0f} s", kind="no answer")
            return False
        if call.take():
            self._catalog_call = None
            if call.error is not None:
                self._catalog_retry_at = trio.current_time() + self._catalog_retry_seconds
                self._catalog_down(f"cannot open the Iceberg catalog {self._catalog_name!r}:"
                                   f" {brief_error(call.error)}", kind=brief_error(call.error))
                return False
            self._catalog = call.result
            if self._catalog_failed:
                log.info("the Iceberg catalog %r is reachable again", self._catalog_name)
            self._catalog_failed, self._catalog_logged = False, None
        return self._catalog is not None

    def _catalog_down(self, reason: str, kind: str) -> None:
        """The catalog cannot be opened: an error logged once per kind of fault (every retry at debug)."""
        (log.debug if kind == self._catalog_logged else log.error)(
            "%s (%s: [catalog]); the lake of %s cannot be read until it answers (tried again every %g s)",
            reason, self.config.source,
            ", ".join(sorted(self._topic_configs)), self._catalog_retry_seconds)
        self._catalog_logged = kind
        self._catalog_failed = True
        for topic in self._topic_configs:
            if topic not in self.topics:
                self.problems[topic] = self._unavailable[topic] = reason

    def _loaded(self, topic: TopicConfig, call: _Call, lake: LakeTable) -> None:
        """Act on a finished table load."""
        del self._load_calls[topic.name]
        exc = _confined(topic.name, "loading", call.error)
        if isinstance(exc, LakeUnavailable):
            LAKE_ERRORS.labels(topic.name, "load").inc()
            log.error("%s; the table's offsets are unknown until it can be loaded", exc)
            self.problems[topic.name] = self._unavailable[topic.name] = str(exc)
        elif isinstance(exc, LakeError):
            LAKE_ERRORS.labels(topic.name, "load").inc()
            log.error("%s; the topic is served from Kafka only", exc)
            self.problems[topic.name] = str(exc)
            self._unavailable.pop(topic.name, None)
        else:
            self.problems.pop(topic.name, None)
            self._unavailable.pop(topic.name, None)
            log.info("topic %s: history from %s (layout %s)", topic.name, topic.table, topic.layout)
            if lake.layout.value_columns and self.registry is None:
                log.error("topic %s: table %s has typed value columns (%s); replaying them needs a Schema"
                          " Registry: set [schema_registry] url in %s", topic.name, topic.table,
                          ", ".join(lake.layout.value_columns), self.config.source)
        # Loaded or not, the topic has its table object now: refreshing its ranges loads it again if need be.
        self.topics[topic.name] = lake

    def unavailable(self, topic: str) -> str | None:
        """Why the lake's offsets for ``topic`` are unknown right now: the catalog or the storage cannot be
        reached and nothing is known from before (then :meth:`ranges` is empty, and does not mean that the
        lake holds nothing).  None when the offsets are known, or
        when the topic has no usable table by configuration (missing table, wrong layout: Kafka alone)."""
        return self._unavailable.get(topic)

    def stale(self, topic: str, after: float = 0.0) -> str | None:
        """Why the lake's known offsets for ``topic`` may be out of date (the catalog failed, or a refresh
        has not answered for more than ``after`` seconds), or None."""
        problem = self.problems.get(topic)
        if problem is not None:
            return problem
        call = self._range_calls.get(topic)
        if call is not None and call.age() > after:
            return f"a refresh of table {self._topic_configs[topic].table} from the catalog has been waiting for" \
                   f" {call.age():.1f} s"
        return None

    def fresh_ranges(self, topic: str) -> dict[int, OffsetRange] | None:
        """The ranges :meth:`ranges` would answer now without a refresh, or None when it would refresh (or
        open the table) first: the pass-through's fast path decides with these, without a task switch."""
        cached = self._ranges.get(topic)
        if cached is None or topic not in self.topics or trio.current_time() - cached[0] >= RANGES_TTL_SECONDS:
            return None
        return cached[1]

    async def ranges(self, topic: str, max_age: float = RANGES_TTL_SECONDS,
                     refresh_wait: float = REFRESH_WAIT_SECONDS) -> dict[int, OffsetRange]:
        """The lake's offset range per partition (empty when the lake cannot answer: see :meth:`unavailable`).

        Ranges are refreshed (new snapshots) once older than ``max_age``.  A refresh that takes longer than
        ``refresh_wait``, or fails, leaves the ranges known before in use: snapshots are immutable, so what
        they hold is still served (their files are read without the catalog)."""
        lake = self.topics.get(topic)
        if lake is None:
            if topic not in self._topic_configs or not await self._open():
                return {}
            lake = self.topics.get(topic)
            if lake is None:
                return {}  # its table is still loading: see unavailable()
        cached = self._ranges.get(topic)
        now = trio.current_time()
        if cached is not None and now - cached[0] < min(max_age, RANGES_TTL_SECONDS):
            return cached[1]
        call = self._range_calls.get(topic)
        if call is None:
            call = self._range_calls[topic] = _Call(f"ksi-ranges-{topic}", lake.offset_ranges)
        if not await call.wait(refresh_wait if cached is not None else CATALOG_WAIT_SECONDS):
            if cached is not None:
                if topic not in self.problems and call.age() > RANGES_TTL_SECONDS:
                    LAKE_ERRORS.labels(topic, "ranges").inc()
                    self.problems[topic] = reason = (f"topic {topic}: the catalog {self._catalog_name!r} has not"
                                                     f" answered a refresh of table {lake.topic.table} for"
                                                     f" {call.age():.0f} s")
                    log.warning("%s; serving the offsets of the snapshot loaded before until it answers", reason)
                return cached[1]
            reason = f"topic {topic}: the catalog {self._catalog_name!r} has not answered for table" \
                     f" {lake.topic.table} for {call.age():.0f} s"
            if ("ranges", topic) not in self._hung:
                self._hung.add(("ranges", topic))
                LAKE_ERRORS.labels(topic, "ranges").inc()
                log.warning("%s; offsets below the log start get a retriable error until it does", reason)
            self.problems[topic] = self._unavailable[topic] = reason
            return {}
        if call.take():
            del self._range_calls[topic]
            self._hung.discard(("ranges", topic))
            self._refreshed(topic, lake, call, cached)
        return self._ranges.get(topic, (0.0, {}))[1]

    def _refreshed(self, topic: str, lake: LakeTable, call: _Call,
                   cached: tuple[float, dict[int, OffsetRange]] | None) -> None:
        """Act on a finished refresh of a topic's ranges."""
        now = trio.current_time()
        exc = _confined(topic, "refreshing", call.error)
        if exc is not None:
            LAKE_ERRORS.labels(topic, "ranges").inc()
            # Keep what was known (or nothing) for a while instead of asking the catalog on every fetch.
            ranges = cached[1] if cached is not None else {}
            if isinstance(exc, LakeUnavailable) and not ranges:
                self._unavailable[topic] = str(exc)
            else:
                self._unavailable.pop(topic, None)
            if self.problems.get(topic) != str(exc):
                log.warning("%s; %s", exc, "serving the offsets of the snapshot loaded before until it answers"
                            if ranges else "its offsets are unknown until it answers"
                            if topic in self._unavailable else "the topic is served from Kafka only")
            self.problems[topic] = str(exc)
            self._ranges[topic] = (now, ranges)
            return
        if topic in self.problems:
            log.info("topic %s: the lake answers again (table %s)", topic, lake.topic.table)
        self.problems.pop(topic, None)
        self._unavailable.pop(topic, None)
        self._ranges[topic] = (now, call.result)
        if self._on_ranges is not None:
            self._on_ranges(topic, call.result)

    async def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> tuple[int, int] | None:
        """The lake's first offset at or after ``timestamp_ms`` and its timestamp; None when the lake holds
        none (or has no usable table).  Raises :class:`LakeUnavailable` when the lake cannot answer for sure:
        the caller then answers with an error, as the broker's answer might skip offsets only the lake holds.

        An offset found in the snapshot ksi has is the answer: archives only add offsets above those a
        snapshot holds, so a newer snapshot cannot hold a smaller one.  Finding none, ksi asks the catalog
        for a newer snapshot first (whatever the age of the ranges: the broker's answer is about to be used)."""
        lake = self.topics.get(topic)
        if lake is None:
            if topic in self._unavailable:
                raise LakeUnavailable(self._unavailable[topic])
            return None
        try:
            found = await trio.to_thread.run_sync(lake.offset_for_timestamp, partition, timestamp_ms,
                                                  limiter=self.limiter)
            if found is None:
                before = lake.snapshot_id
                await self.ranges(topic, max_age=0.0, refresh_wait=CATALOG_WAIT_SECONDS)
                stale = self.stale(topic)
                if stale is not None:
                    raise LakeUnavailable(f"topic {topic}: the lake's last known snapshot holds no offset at or after"
                                          f" timestamp {timestamp_ms} in partition {partition}, and a newer one cannot"
                                          f" be asked for ({stale})")
                if lake.snapshot_id != before:
                    found = await trio.to_thread.run_sync(lake.offset_for_timestamp, partition, timestamp_ms,
                                                          limiter=self.limiter)
            return found
        except LakeUnavailable as exc:
            LAKE_ERRORS.labels(topic, "timestamp").inc()
            self.log_repeated(logging.WARNING, topic, partition, "timestamp", "%s", exc)
            raise
        except LakeError as exc:
            LAKE_ERRORS.labels(topic, "timestamp").inc()
            log.warning("%s", exc)
            return None

    # -- cold reads ----------------------------------------------------------------------------


def _confined(topic: str, doing: str, exc: BaseException | None) -> LakeError | None:
    """A failure of a table load or refresh, as a LakeError: one that is not (a bug, a table no check
    foresaw) is logged with its traceback and answered as the lake being unavailable (a retriable error,
    tried again at the next refresh), never raised into the task that planned it (which would end ksi)."""
    if exc is None or isinstance(exc, LakeError):
        return exc
    log.error("topic %s: unexpected failure %s its table", topic, doing, exc_info=exc)
    return LakeUnavailable(f"topic {topic}: {doing} its table failed: {type(exc).__name__}: {exc}")
