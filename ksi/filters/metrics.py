"""Metrics: frames and bytes per direction and API, request and broker latency (ksi/metrics.py defines
them).  An observer: it sees every frame's size, never a decoded message, and adds to plain numbers that
the metrics' collectors read at scrape time, so counting costs a dictionary lookup and two additions,
without a lock."""

from __future__ import annotations

from ..metrics import TRAFFIC, observe
from .api import Filter

__all__ = ["MetricsFilter"]


class MetricsFilter(Filter):
    name = "metrics"
    observes = True

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], list[int]] = {}
        self._latencies: dict[str, list[float]] = {}

    def _count(self, direction: str, api: str, size: int) -> None:
        key = (direction, api)
        record = self._counts.get(key)
        if record is None:
            record = self._counts[key] = TRAFFIC.counter(direction, api)
        record[0] += 1
        record[1] += size

    def _latency(self, direction: str, api: str, seconds: float) -> None:
        key = direction + api
        record = self._latencies.get(key)
        if record is None:
            record = self._latencies[key] = TRAFFIC.histogram(direction, api)
        observe(record, seconds)

    def client_to_proxy(self, api_name: str, size: int) -> None:
        self._count("client_to_proxy", api_name, size)

    def proxy_to_server(self, api_name: str, size: int) -> None:
        self._count("proxy_to_server", api_name, size)

    def server_to_proxy(self, api_name: str, size: int, seconds: float) -> None:
        self._count("server_to_proxy", api_name, size)
        self._latency("server_to_proxy", api_name, seconds)

    def proxy_to_client(self, api_name: str, size: int, seconds: float) -> None:
        self._count("proxy_to_client", api_name, size)
        self._latency("proxy_to_client", api_name, seconds)
