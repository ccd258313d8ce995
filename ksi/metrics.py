"""Every Prometheus metric ksi exports, defined once.

Names follow ``ksi_<thing>_<unit>``; directions follow Kroxylicious: ``client_to_proxy``,
``proxy_to_server``, ``server_to_proxy``, ``proxy_to_client``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

__all__ = [
    "ARCHIVE_COMMITS",
    "ARCHIVE_COMMIT_SECONDS",
    "ARCHIVE_ERRORS",
    "ARCHIVE_LAG_RECORDS",
    "ARCHIVE_LAG_SECONDS",
    "ARCHIVE_LAST_COMMIT",
    "ARCHIVE_RECORDS",
    "ARROW_BYTES",
    "BYTES",
    "CACHE_BYTES",
    "CACHE_EVICTIONS",
    "CACHE_HITS",
    "CACHE_MISSES",
    "CLIENT_ERRORS",
    "COLD_FETCHES",
    "CONNECTIONS",
    "CONNECTIONS_ACTIVE",
    "CONNECTIONS_AGED_OUT",
    "FRAMES",
    "LAKE_ERRORS",
    "LAKE_GAPS",
    "LAKE_READS",
    "LAKE_READS_IN_FLIGHT_BYTES",
    "LAKE_READ_BYTES",
    "LAKE_READ_SECONDS",
    "LAKE_ROWS",
    "LAKE_STEPS",
    "REGISTRY",
    "REQUEST_LATENCY",
    "SEAM_HIGH_WATERMARK",
    "SEAM_LAKE_FIRST",
    "SEAM_LAKE_NEXT",
    "SEAM_LOG_START",
    "SPILL_BYTES",
    "SPILL_EVICTIONS",
    "SPILL_HITS",
    "SPILL_WRITES",
    "SPLICED_TO_CLIENT",
    "SPLICED_TO_SERVER",
    "TRAFFIC",
    "UPSTREAM_ERRORS",
    "UPSTREAM_LATENCY",
    "record_seam",
    "start_metrics_server",
]

REGISTRY = CollectorRegistry(auto_describe=True)

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Traffic:
    """Frames, bytes and latencies per direction and API: counted by the event loop in plain Python numbers
    and read at scrape time by the collectors below.  prometheus_client's ``Counter.inc`` and
    ``Histogram.observe`` take a ``threading.Lock`` each; a pass-through round trip made ten such calls.
    Only the event loop's thread writes these; the scrape (another thread) copies each dict in one C call
    (``sorted``), under the GIL."""

    __slots__ = ("counts", "latencies")

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], list[int]] = {}  # (direction, api) -> [frames, bytes]
        # (direction, api) -> [count per bucket (not cumulative), then over the last bucket, then sum]
        self.latencies: dict[tuple[str, str], list[float]] = {}

    def counter(self, direction: str, api: str) -> list[int]:
        """The [frames, bytes] record to add to."""
        found = self.counts.get((direction, api))
        if found is None:
            found = self.counts[(direction, api)] = [0, 0]
        return found

    def histogram(self, direction: str, api: str) -> list[float]:
        """The record an observation adds to: 1 to the count of the first bucket whose bound is >= the
        value (``bisect_left(LATENCY_BUCKETS, value)``: a value on a bound counts in its bucket, as
        Prometheus's ``le``), and the value to the sum (the last entry)."""
        found = self.latencies.get((direction, api))
        if found is None:
            found = self.latencies[(direction, api)] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        return found


class _TrafficCounter:
    def __init__(self, traffic: Traffic, name: str, documentation: str, index: int) -> None:
        self._traffic, self._name, self._documentation, self._index = traffic, name, documentation, index

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._name, self._documentation, labels=["direction", "api"])
        for (direction, api), values in sorted(self._traffic.counts.items()):
            family.add_metric([direction, api], values[self._index])
        yield family


class _TrafficHistogram:
    def __init__(self, traffic: Traffic, name: str, documentation: str, direction: str) -> None:
        self._traffic, self._name, self._documentation, self._direction = traffic, name, documentation, direction

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=["api"])
        for (direction, api), record in sorted(self._traffic.latencies.items()):
            if direction != self._direction:
                continue
            values = list(record)
            cumulative, buckets = 0.0, []
            for bound, count in zip((*map(floatToGoString, LATENCY_BUCKETS), "+Inf"), values[:-1], strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric([api], buckets, values[-1])
        yield family


TRAFFIC = Traffic()
FRAMES = _TrafficCounter(TRAFFIC, "ksi_frames_total", "Kafka frames by direction and API.", 0)
BYTES = _TrafficCounter(TRAFFIC, "ksi_frame_bytes_total", "Bytes of Kafka frames by direction and API.", 1)
REQUEST_LATENCY = _TrafficHistogram(TRAFFIC, "ksi_request_latency_seconds",
                                    "From a request's arrival from the client to its response leaving for the"
                                    " client.", "proxy_to_client")
UPSTREAM_LATENCY = _TrafficHistogram(TRAFFIC, "ksi_upstream_latency_seconds",
                                     "From a request leaving for the broker to its response arriving.",
                                     "server_to_proxy")
for _collector in (FRAMES, BYTES, REQUEST_LATENCY, UPSTREAM_LATENCY):
    REGISTRY.register(_collector)
CONNECTIONS_ACTIVE = Gauge(
    "ksi_client_connections_active", "Client connections open now, by listener.", ["listener"], registry=REGISTRY
)
CONNECTIONS = Counter(
    "ksi_client_connections_total", "Client connections accepted, by listener.", ["listener"], registry=REGISTRY
)
CONNECTIONS_AGED_OUT = Counter(
    "ksi_client_connections_aged_out_total",
    "Client connections closed between requests at proxy.connection_max_age_seconds, by listener.",
    ["listener"],
    registry=REGISTRY,
)
UPSTREAM_ERRORS = Counter(
    "ksi_upstream_errors_total",
    "Failures talking to the Kafka cluster: connect, closed, timeout, protocol.",
    ["kind"],
    registry=REGISTRY,
)
CLIENT_ERRORS = Counter(
    "ksi_client_errors_total",
    "Client frames refused: malformed, too_large, unsupported_api, unsupported_version, idle.",
    ["kind"],
    registry=REGISTRY,
)
SPLICED_BYTES = Counter(
    "ksi_spliced_bytes_total",
    "Bytes of large frames moved from one socket to the other with splice(2), never read by ksi, by direction"
    " (docs/passthrough.md); the rest of ksi_frame_bytes_total was read.",
    ["direction"],
    registry=REGISTRY,
)
SPLICED_TO_SERVER = SPLICED_BYTES.labels("proxy_to_server")  # a request's records (Produce)
SPLICED_TO_CLIENT = SPLICED_BYTES.labels("proxy_to_client")  # a response's records (Fetch)

# The seam per partition, set where ksi learns each number: the lake's range when a table's offsets are
# (re)loaded, the log start and high watermark from the broker's ListOffsets and Fetch answers.  The lake's
# lag behind the log is ksi_high_watermark - ksi_lake_next_offset; lost offsets show as
# ksi_log_start_offset > ksi_lake_next_offset.
SEAM_LAKE_FIRST = Gauge(
    "ksi_lake_first_offset", "First offset the lake holds, by topic and partition.", ["topic", "partition"],
    registry=REGISTRY,
)
SEAM_LAKE_NEXT = Gauge(
    "ksi_lake_next_offset", "First offset the lake does not hold yet (its last + 1), by topic and partition.",
    ["topic", "partition"], registry=REGISTRY,
)
SEAM_LOG_START = Gauge(
    "ksi_log_start_offset", "The broker's log-start offset (ksi's hot watermark), by topic and partition.",
    ["topic", "partition"], registry=REGISTRY,
)
SEAM_HIGH_WATERMARK = Gauge(
    "ksi_high_watermark", "The broker's high watermark, by topic and partition.", ["topic", "partition"],
    registry=REGISTRY,
)


def record_seam(topic: str, partition: int, *, lake_first: int | None = None, lake_next: int | None = None,
                log_start: int | None = None, high_watermark: int | None = None) -> None:
    """Set the seam gauges of one partition; numbers not given keep their last value."""
    labels = (topic, str(partition))
    for gauge, value in ((SEAM_LAKE_FIRST, lake_first), (SEAM_LAKE_NEXT, lake_next), (SEAM_LOG_START, log_start),
                         (SEAM_HIGH_WATERMARK, high_watermark)):
        if value is not None:
            gauge.labels(*labels).set(value)


LAKE_READ_BYTES = Counter(
    "ksi_lake_read_bytes_total", "Record batch bytes served from the lake, by topic.", ["topic"], registry=REGISTRY
)
LAKE_READ_SECONDS = Histogram(
    "ksi_lake_read_seconds",
    "Time to read and encode one partition's cold fetch from the lake.",
    ["topic"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY,
)
LAKE_ERRORS = Counter(
    "ksi_lake_errors_total", "Failures reading the lake, by topic and stage (load, ranges, read).",
    ["topic", "stage"], registry=REGISTRY
)
LAKE_GAPS = Counter(
    "ksi_lake_gaps_total",
    "Fetches refused because the offsets lie between the lake's end and the log start (lost data).",
    ["topic"],
    registry=REGISTRY,
)
LAKE_STEPS = Counter(
    "ksi_lake_steps_total",
    "Fetches answered with a step over offsets held by neither the lake nor Kafka that are explained (not lost),"
    " by topic and reason: lake (the lake holds later offsets: a hole inside it, or where it runs past the log"
    " start), writer (the writer's commit state says it read them), seam_holes_skip (the topic's setting).",
    ["topic", "reason"], registry=REGISTRY,
)
COLD_FETCHES = Counter(
    "ksi_cold_fetches_total", "Partition fetches answered from the lake, by topic.", ["topic"], registry=REGISTRY
)

CACHE_HITS = Counter(
    "ksi_lake_cache_hits_total", "Cold reads answered from ksi's cache of encoded lake reads, by topic.", ["topic"],
    registry=REGISTRY,
)
CACHE_MISSES = Counter(
    "ksi_lake_cache_misses_total", "Cold reads the cache could not answer (the lake is read), by topic.", ["topic"],
    registry=REGISTRY,
)
CACHE_EVICTIONS = Counter(
    "ksi_lake_cache_evictions_total",
    "Encoded lake reads dropped from the cache to make room, by segment (probation: read once; protected:"
    " read by more than one reader; ahead: read ahead for a consumer that had not taken it yet).",
    ["segment"], registry=REGISTRY,
)
CACHE_BYTES = Gauge("ksi_lake_cache_bytes", "Bytes of encoded lake reads held in the cache.", registry=REGISTRY)
SPILL_HITS = Counter(
    "ksi_lake_spill_hits_total", "Cold reads the memory cache missed and its spill file answered.", registry=REGISTRY
)
SPILL_WRITES = Counter(
    "ksi_lake_spill_writes_total", "Encoded lake reads evicted from memory and written to the spill file.",
    registry=REGISTRY,
)
SPILL_EVICTIONS = Counter(
    "ksi_lake_spill_evictions_total", "Entries of the spill file overwritten by newer ones (first in, first out).",
    registry=REGISTRY,
)
SPILL_BYTES = Gauge("ksi_lake_spill_bytes", "Bytes of encoded lake reads kept in the spill file.", registry=REGISTRY)
ARROW_BYTES = Gauge(
    "ksi_lake_arrow_bytes",
    "Bytes Arrow holds for cold reads: row groups being decoded, records being encoded (pyarrow's memory pool).",
    registry=REGISTRY,
)


def _arrow_bytes() -> float:
    import sys

    pa = sys.modules.get("pyarrow")  # never imported for this: a pass-through-only ksi does not load Arrow
    # a scrape while another thread is still importing pyarrow finds the module without this function yet
    total = getattr(pa, "total_allocated_bytes", None)
    return float(total()) if total is not None else 0.0


ARROW_BYTES.set_function(_arrow_bytes)
LAKE_ROWS = Counter(
    "ksi_lake_rows_total",
    "Table rows not served as stored, by topic and reason: bad (no partition or offset, or a negative one),"
    " duplicate (an offset stored again), differing_duplicate (... with other contents), null_header_key"
    " (served with an empty header key).",
    ["topic", "reason"], registry=REGISTRY,
)
LAKE_READS_IN_FLIGHT_BYTES = Gauge(
    "ksi_lake_reads_in_flight_bytes",
    "Bytes the lake reads in flight are expected to decode (their rows at the bytes per row last read;"
    " history.max_read_bytes bounds each read).",
    registry=REGISTRY,
)
LAKE_READS = Counter(
    "ksi_lake_reads_total", "Reads of table data (windows of row groups decoded and encoded), by topic.", ["topic"],
    registry=REGISTRY,
)
# `ksi archive --follow` (its own process and /metrics; the proxy never sets these)
ARCHIVE_LAG_RECORDS = Gauge(
    "ksi_archive_lag_records",
    "Records in Kafka not yet in the lake: the partition's high watermark minus the lake's next offset.",
    ["topic", "partition"],
    registry=REGISTRY,
)
ARCHIVE_LAG_SECONDS = Gauge(
    "ksi_archive_lag_seconds",
    "How far the lake is behind the log: now minus the timestamp of the first record not yet archived "
    "(0 when everything is archived).",
    ["topic", "partition"],
    registry=REGISTRY,
)
ARCHIVE_RECORDS = Counter(
    "ksi_archive_records_total", "Records archived into the lake by this process, by topic.", ["topic"],
    registry=REGISTRY
)
ARCHIVE_COMMITS = Counter(
    "ksi_archive_commits_total", "Iceberg commits made by this process, by topic.", ["topic"], registry=REGISTRY
)
ARCHIVE_ERRORS = Counter(
    "ksi_archive_errors_total", "Archive rounds of a topic that failed (retried next interval).", ["topic"],
    registry=REGISTRY
)
ARCHIVE_COMMIT_SECONDS = Histogram(
    "ksi_archive_commit_seconds",
    "One archive round of a topic: planning, reading, writing and committing.",
    ["topic"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
    registry=REGISTRY,
)
ARCHIVE_LAST_COMMIT = Gauge(
    "ksi_archive_last_commit_timestamp_seconds", "Unix time of this process's last commit, by topic.", ["topic"],
    registry=REGISTRY
)


def start_metrics_server(host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` from a daemon thread (prometheus-client's own HTTP server)."""
    server, thread = start_http_server(port, addr=host, registry=REGISTRY)
    return server, thread
