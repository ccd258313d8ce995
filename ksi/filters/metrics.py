"""Metrics: frames and bytes per direction and API, request and broker latency (ksi/metrics.py defines
them).  An observer: it sees every frame's size, never a decoded message, and keeps the labelled children
it has used, so counting costs a dictionary lookup and an addition."""

from __future__ import annotations

from typing import Any

from ..metrics import BYTES, FRAMES, REQUEST_LATENCY, UPSTREAM_LATENCY
from .api import Filter

__all__ = ["MetricsFilter"]


class MetricsFilter(Filter):
    name = "metrics"
    observes = True

    def __init__(self) -> None:
        self._children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    def _child(self, direction: str, api: str) -> tuple[Any, Any, Any]:
        key = (direction, api)
        found = self._children.get(key)
        if found is None:
            latency = (REQUEST_LATENCY.labels(api) if direction == "proxy_to_client" else
                       UPSTREAM_LATENCY.labels(api) if direction == "server_to_proxy" else None)
            found = self._children[key] = (FRAMES.labels(direction, api), BYTES.labels(direction, api), latency)
        return found

    def client_to_proxy(self, api_name: str, size: int) -> None:
        frames, nbytes, _ = self._child("client_to_proxy", api_name)
        frames.inc()
        nbytes.inc(size)

    def proxy_to_server(self, api_name: str, size: int) -> None:
        frames, nbytes, _ = self._child("proxy_to_server", api_name)
        frames.inc()
        nbytes.inc(size)

    def server_to_proxy(self, api_name: str, size: int, seconds: float) -> None:
        frames, nbytes, latency = self._child("server_to_proxy", api_name)
        frames.inc()
        nbytes.inc(size)
        latency.observe(seconds)

    def proxy_to_client(self, api_name: str, size: int, seconds: float) -> None:
        frames, nbytes, latency = self._child("proxy_to_client", api_name)
        frames.inc()
        nbytes.inc(size)
        latency.observe(seconds)
