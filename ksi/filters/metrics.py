"""Metrics: frames and bytes per direction and API, request and broker latency (ksi/metrics.py defines
them).  An observer: it sees every frame's size, never a decoded message, and adds to plain numbers that
the metrics' collectors read at scrape time, so counting a frame costs one call, a dictionary lookup by
the API's name and two additions, without a lock."""

from __future__ import annotations

from bisect import bisect_left

from ..metrics import LATENCY_BUCKETS, TRAFFIC
from .api import Filter

__all__ = ["MetricsFilter"]


class MetricsFilter(Filter):
    name = "metrics"
    observes = True

    def __init__(self) -> None:
        # per direction: API name -> [frames, bytes] (TRAFFIC's own records)
        self._client_to_proxy: dict[str, list[int]] = {}
        self._proxy_to_server: dict[str, list[int]] = {}
        self._server_to_proxy: dict[str, list[int]] = {}
        self._proxy_to_client: dict[str, list[int]] = {}
        # per direction: API name -> histogram record (see ksi.metrics.Traffic.histogram)
        self._upstream_latency: dict[str, list[float]] = {}
        self._request_latency: dict[str, list[float]] = {}

    def client_to_proxy(self, api_name: str, size: int) -> None:
        record = self._client_to_proxy.get(api_name)
        if record is None:
            record = self._client_to_proxy[api_name] = TRAFFIC.counter("client_to_proxy", api_name)
        record[0] += 1
        record[1] += size

    def proxy_to_server(self, api_name: str, size: int) -> None:
        record = self._proxy_to_server.get(api_name)
        if record is None:
            record = self._proxy_to_server[api_name] = TRAFFIC.counter("proxy_to_server", api_name)
        record[0] += 1
        record[1] += size

    def server_to_proxy(self, api_name: str, size: int, seconds: float) -> None:
        record = self._server_to_proxy.get(api_name)
        if record is None:
            record = self._server_to_proxy[api_name] = TRAFFIC.counter("server_to_proxy", api_name)
        record[0] += 1
        record[1] += size
        latency = self._upstream_latency.get(api_name)
        if latency is None:
            latency = self._upstream_latency[api_name] = TRAFFIC.histogram("server_to_proxy", api_name)
        latency[bisect_left(LATENCY_BUCKETS, seconds)] += 1  # le: a value on a bound counts in its bucket
        latency[-1] += seconds

    def proxy_to_client(self, api_name: str, size: int, seconds: float) -> None:
        record = self._proxy_to_client.get(api_name)
        if record is None:
            record = self._proxy_to_client[api_name] = TRAFFIC.counter("proxy_to_client", api_name)
        record[0] += 1
        record[1] += size
        latency = self._request_latency.get(api_name)
        if latency is None:
            latency = self._request_latency[api_name] = TRAFFIC.histogram("proxy_to_client", api_name)
        latency[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        latency[-1] += seconds
