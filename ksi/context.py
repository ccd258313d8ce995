"""What every client connection of one proxy shares."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from .cluster import Cluster
from .config import Config, HostPort
from .filters import FilterChain, build_chain
from .history.topic_ids import TopicIds
from .upstream import ConnectBackoff, connect

if TYPE_CHECKING:
    from .connection import ClientConnection
    from .history.routing import HistoryRouter

__all__ = ["ProxyContext"]


@dataclass
class ProxyContext:
    """What every connection shares: config, the cluster view, the filter chain and the shutdown switch."""

    config: Config
    cluster: Cluster
    draining: trio.Event
    connections: set[ClientConnection]
    topic_ids: TopicIds
    router: HistoryRouter | None = None
    backoffs: dict[tuple[HostPort, ...], ConnectBackoff] = field(default_factory=dict)
    chain: FilterChain | None = None
    connect: Callable[..., Awaitable[tuple[trio.abc.Stream, HostPort]]] = connect  # tests: memory streams

    def filter_chain(self) -> FilterChain:
        if self.chain is None:
            self.chain = build_chain(self.cluster, self.topic_ids, self.router)
        return self.chain
