"""Every Prometheus metric ksi exports, defined once.

Names follow ``ksi_<thing>_<unit>``; directions follow Kroxylicious: ``client_to_proxy``,
``proxy_to_server``, ``server_to_proxy``, ``proxy_to_client``.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

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
    "REGISTRY",
    "REQUEST_LATENCY",
    "SEAM_HIGH_WATERMARK",
    "SEAM_LAKE_FIRST",
    "SEAM_LAKE_NEXT",
    "SEAM_LOG_START",
    "UPSTREAM_ERRORS",
    "UPSTREAM_LATENCY",
    "record_seam",
    "start_metrics_server",
]

REGISTRY = CollectorRegistry(auto_describe=True)

FRAMES = Counter(
    "ksi_frames_total", "Kafka frames by direction and API.", ["direction", "api"], registry=REGISTRY
)
BYTES = Counter(
    "ksi_frame_bytes_total", "Bytes of Kafka frames by direction and API.", ["direction", "api"], registry=REGISTRY
)
REQUEST_LATENCY = Histogram(
    "ksi_request_latency_seconds",
    "From a request's arrival from the client to its response leaving for the client.",
    ["api"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
UPSTREAM_LATENCY = Histogram(
    "ksi_upstream_latency_seconds",
    "From a request leaving for the broker to its response arriving.",
    ["api"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
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
ARROW_BYTES = Gauge(
    "ksi_lake_arrow_bytes",
    "Bytes Arrow holds for cold reads: row groups being decoded, records being encoded (pyarrow's memory pool).",
    registry=REGISTRY,
)


def _arrow_bytes() -> float:
    import sys

    pa = sys.modules.get("pyarrow")  # never imported for this: a pass-through-only ksi does not load Arrow
    return float(pa.total_allocated_bytes()) if pa is not None else 0.0


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
