"""ksi's view of the upstream cluster: which brokers exist, where they really are, and which ksi port
stands in for each (Kroxylicious's port-per-broker scheme).

The bootstrap listener forwards to any of ``upstream.bootstrap_servers``; each broker (node id) gets a
listener of its own, opened the first time ksi sees the node in a response.  Ports come from
``proxy.node_ports`` when pinned, else ``proxy.broker_port_base`` + n for the n-th node seen (nodes seen
together are numbered in node-id order, so a stable cluster gets stable ports), or an ephemeral port when
the base is 0.  No sockets here: the server passes in the coroutine that opens a listener.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from protocol import Node

from .config import HostPort, ProxyConfig

__all__ = ["Cluster"]

log = logging.getLogger("ksi.cluster")


class Cluster:
    def __init__(self, proxy: ProxyConfig, open_listener: Callable[[int, int], Awaitable[int]]) -> None:
        self._proxy = proxy
        self._open_listener = open_listener
        self._nodes: dict[int, Node] = {}
        self._ports: dict[int, int] = {}
        self._lock = trio.Lock()

    @property
    def nodes(self) -> dict[int, Node]:
        return dict(self._nodes)

    @property
    def ports(self) -> dict[int, int]:
        """Node id -> the ksi port that stands in for it."""
        return dict(self._ports)

    def upstream_address(self, node_id: int) -> HostPort | None:
        node = self._nodes.get(node_id)
        return HostPort(node.host, node.port) if node is not None else None

    def proxy_address(self, node_id: int) -> tuple[str, int]:
        port = self._ports.get(node_id)
        if port is None:
            # learn() runs before any rewrite, so this only happens for a node it failed to open.
            raise KeyError(f"no ksi listener for node {node_id}")
        return self._proxy.advertised_host, port

    def _wanted_port(self, node_id: int) -> int:
        if node_id in self._proxy.node_ports:
            return self._proxy.node_ports[node_id]
        if not self._proxy.broker_port_base:
            return 0
        taken = set(self._ports.values()) | set(self._proxy.node_ports.values())
        port = self._proxy.broker_port_base + len([n for n in self._ports if n not in self._proxy.node_ports])
        while port in taken:
            port += 1
        return port

    async def learn(self, nodes: list[Node]) -> None:
        """Record real addresses; open a ksi listener for every node not seen before."""
        for node in nodes:
            known = self._nodes.get(node.node_id)
            if known is not None and (known.host, known.port) != (node.host, node.port):
                log.info("broker %d moved from %s:%d to %s:%d", node.node_id, known.host, known.port,
                         node.host, node.port)
            self._nodes[node.node_id] = node
        new = sorted({n.node_id for n in nodes} - set(self._ports))
        if not new:
            return
        async with self._lock:
            for node_id in new:
                if node_id in self._ports:
                    continue
                wanted = self._wanted_port(node_id)
                port = await self._open_listener(node_id, wanted)
                self._ports[node_id] = port
                node = self._nodes[node_id]
                log.info("broker %d (%s:%d) is served at %s:%d", node_id, node.host, node.port,
                         self._proxy.advertised_host, port)
