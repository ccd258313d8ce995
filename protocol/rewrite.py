"""Address rewriting: every broker endpoint a response names becomes one of ksi's listeners.

Metadata, FindCoordinator and DescribeCluster name brokers; Fetch v16+ and Produce v10+ carry
``node_endpoints`` for partitions whose leader moved (KIP-951).  A client that learned a real broker's
address would connect around the proxy, so each of those is rewritten.

Two steps, so the caller can act on the real addresses (open a listener for a new node) before the
rewritten bytes leave: :func:`parse_endpoints` decodes (Fetch and Produce: only when a scan finds node
endpoints) and lists the nodes, :meth:`Endpoints.encode` writes the body back with the proxy's addresses.
Pure functions over bytes; unknown tagged fields are kept by the codec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka.protocol.api_key import ApiKey

from . import _tagged_fields  # noqa: F401 - kafka-python's codec keeps unknown tagged fields
from .apis import api, decode_body, encode_body
from .fetch_scan import NODE_ENDPOINTS_TAG, scan_fetch_response
from .produce_scan import produce_response_tags

__all__ = ["REWRITTEN_APIS", "Endpoints", "Node", "needs_rewrite", "parse_endpoints"]


@dataclass(frozen=True, slots=True)
class Node:
    node_id: int
    host: str
    port: int
    rack: str | None = None


# API key -> first version whose response names broker endpoints.
REWRITTEN_APIS: dict[int, int] = {
    ApiKey.Metadata: 0,
    ApiKey.FindCoordinator: 0,
    ApiKey.DescribeCluster: 0,
    ApiKey.Fetch: 16,
    ApiKey.Produce: 10,
}


def needs_rewrite(api_key: int, api_version: int) -> bool:
    floor = REWRITTEN_APIS.get(api_key)
    return floor is not None and api_version >= floor


def _endpoint_objects(message: Any, api_key: int, version: int) -> list[tuple[Any, str]]:
    """(object, id attribute) pairs whose ``host``/``port`` fields name a broker."""
    if api_key == ApiKey.Metadata:
        return [(b, "node_id") for b in message.brokers]
    if api_key == ApiKey.DescribeCluster:
        return [(b, "broker_id") for b in message.brokers]
    if api_key == ApiKey.FindCoordinator:
        if version >= 4:
            return [(c, "node_id") for c in message.coordinators if c.error_code == 0 and c.node_id >= 0]
        return [(message, "node_id")] if message.error_code == 0 and message.node_id >= 0 else []
    if api_key in (ApiKey.Fetch, ApiKey.Produce):
        return [(n, "node_id") for n in (message.node_endpoints or [])]
    return []


@dataclass(slots=True)
class Endpoints:
    """A decoded response and the broker endpoints in it."""

    message: Any
    version: int
    objects: list[tuple[Any, str]]

    @property
    def nodes(self) -> list[Node]:
        return [Node(getattr(o, attr), o.host, o.port, getattr(o, "rack", None)) for o, attr in self.objects]

    def encode(self, proxy_address: Callable[[int], tuple[str, int]]) -> bytes:
        """The body with each endpoint replaced by ``proxy_address(node_id)``."""
        for obj, attr in self.objects:
            obj.host, obj.port = proxy_address(getattr(obj, attr))
        return encode_body(self.message, self.version)


def parse_endpoints(api_key: int, version: int, body: bytes | memoryview) -> Endpoints | None:
    """Decode a response body; ``None`` if it names no broker endpoint (forward it unchanged).  Fetch and
    Produce responses are scanned first and decoded only when they carry node endpoints (rarely: after a
    leader moved)."""
    if not needs_rewrite(api_key, version):
        return None
    if api_key == ApiKey.Fetch and not scan_fetch_response(body, version).node_endpoints:
        return None
    if api_key == ApiKey.Produce and NODE_ENDPOINTS_TAG not in produce_response_tags(body, version):
        return None
    entry = api(api_key)
    assert entry is not None
    message = decode_body(entry.response, version, body)
    objects = _endpoint_objects(message, api_key, version)
    if not objects:
        return None
    return Endpoints(message, version, objects)
