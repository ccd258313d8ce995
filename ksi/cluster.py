"""ksi's view of the upstream cluster: which brokers exist, where they really are, which ksi port stands in
for each (Kroxylicious's port-per-broker scheme), and which address clients are told for each.

The bootstrap listener forwards to any of ``upstream.bootstrap_servers``; each broker (node id) gets a
listener of its own, opened the first time ksi sees the node in a response.  Ports come from
``proxy.node_ports`` when pinned, else ``proxy.broker_port_base`` + n for the n-th node seen (nodes seen
together are numbered in node-id order, so a stable cluster gets stable ports), or an ephemeral port when
the base is 0.

What clients are told (Metadata, FindCoordinator, DescribeCluster, node endpoints) is
``proxy.advertised_host`` and, per node, ``proxy.advertised_ports`` when pinned, else
``proxy.advertised_port_base`` + n for a node numbered from ``broker_port_base``, else the port ksi listens
on.  The advertised address depends on the configuration alone, never on what could be bound, so every
instance of a service configured alike tells clients the same addresses.

No sockets here: the server passes in the coroutine that opens a listener.  It returns the port it bound,
or None when it could not bind the wanted one; the node is then advertised at its configured address
anyway, and the listener is tried again the next time the node is seen.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from protocol import Node

from .config import HostPort, ProxyConfig

__all__ = ["Cluster"]

log = logging.getLogger("ksi.cluster")

OpenListener = Callable[[int, int], Awaitable[int | None]]


class Cluster:
    def __init__(self, proxy: ProxyConfig, open_listener: OpenListener) -> None:
        self._proxy = proxy
        self._open_listener = open_listener
        self._nodes: dict[int, Node] = {}
        self._wanted: dict[int, int] = {}   # node id -> the port it was given (0: ephemeral), bound or not
        self._ports: dict[int, int] = {}    # node id -> the port ksi listens on for it
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

    def advertised_port(self, node_id: int) -> int | None:
        """The port clients are told for ``node_id`` (None: the node has no port yet)."""
        proxy = self._proxy
        if node_id in proxy.advertised_ports:
            return proxy.advertised_ports[node_id]
        wanted = self._wanted.get(node_id)
        if wanted is None:
            return None
        if proxy.advertised_port_base and node_id not in proxy.node_ports:
            return proxy.advertised_port_base + (wanted - proxy.broker_port_base)
        return self._ports.get(node_id, wanted) or None

    def proxy_address(self, node_id: int) -> tuple[str, int]:
        port = self.advertised_port(node_id)
        if port is None:
            # learn() runs before any rewrite, so this only happens for a node it failed to open.
            raise KeyError(f"no ksi listener for node {node_id}")
        return self._proxy.advertised_host, port

    def _wanted_port(self, node_id: int) -> int:
        if node_id in self._proxy.node_ports:
            return self._proxy.node_ports[node_id]
        if not self._proxy.broker_port_base:
            return 0
        taken = set(self._wanted.values()) | set(self._proxy.node_ports.values())
        port = self._proxy.broker_port_base + len([n for n in self._wanted if n not in self._proxy.node_ports])
        while port in taken:
            port += 1
        return port

    async def learn(self, nodes: list[Node]) -> None:
        """Record real addresses; open a ksi listener for every node that has none yet."""
        for node in nodes:
            known = self._nodes.get(node.node_id)
            if known is not None and (known.host, known.port) != (node.host, node.port):
                log.info("broker %d moved from %s:%d to %s:%d", node.node_id, known.host, known.port,
                         node.host, node.port)
            self._nodes[node.node_id] = node
        missing = sorted({n.node_id for n in nodes} - set(self._ports))
        if not missing:
            return
        async with self._lock:
            for node_id in missing:
                if node_id in self._ports:
                    continue
                if node_id not in self._wanted:
                    self._wanted[node_id] = self._wanted_port(node_id)
                port = await self._open_listener(node_id, self._wanted[node_id])
                if port is None:
                    continue  # advertised at its configured address all the same; tried again next time
                self._ports[node_id] = port
                node = self._nodes[node_id]
                advertised = self.advertised_port(node_id)
                log.info("broker %d (%s:%d) is served at port %d, advertised as %s:%d", node_id, node.host,
                         node.port, port, self._proxy.advertised_host, advertised)
