"""Every Prometheus metric ksi exports, defined once.

Names follow ``ksi_<thing>_<unit>``; directions follow Kroxylicious: ``client_to_proxy``,
``proxy_to_server``, ``server_to_proxy``, ``proxy_to_client``.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = [
    "REGISTRY",
    "FRAMES",
    "BYTES",
    "REQUEST_LATENCY",
    "UPSTREAM_LATENCY",
    "CONNECTIONS_ACTIVE",
    "CONNECTIONS",
    "CONNECTIONS_AGED_OUT",
    "UPSTREAM_ERRORS",
    "CLIENT_ERRORS",
    "LAKE_READ_BYTES",
    "LAKE_READ_SECONDS",
    "LAKE_ERRORS",
    "LAKE_GAPS",
    "COLD_FETCHES",
    "CACHE_HITS",
    "CACHE_MISSES",
    "CACHE_EVICTIONS",
    "CACHE_BYTES",
    "LAKE_ROWS",
    "LAKE_READS",
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
    " read by more than one reader).",
    ["segment"], registry=REGISTRY,
)
CACHE_BYTES = Gauge("ksi_lake_cache_bytes", "Bytes of encoded lake reads held in the cache.", registry=REGISTRY)
LAKE_ROWS = Counter(
    "ksi_lake_rows_total",
    "Table rows not served as stored, by topic and reason: bad (no partition or offset, or a negative one),"
    " duplicate (an offset stored again), differing_duplicate (... with other contents), null_header_key"
    " (served with an empty header key).",
    ["topic", "reason"], registry=REGISTRY,
)
LAKE_READS = Counter(
    "ksi_lake_reads_total", "Reads of table data (windows of row groups decoded and encoded), by topic.", ["topic"],
    registry=REGISTRY,
)


def start_metrics_server(host: str, port: int) -> tuple[Any, threading.Thread]:
    """Serve ``/metrics`` from a daemon thread (prometheus-client's own HTTP server)."""
    server, thread = start_http_server(port, addr=host, registry=REGISTRY)
    return server, thread
