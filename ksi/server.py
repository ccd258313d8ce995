"""The proxy server: listeners, connection handlers, cluster discovery, graceful shutdown.

Layout of tasks (hypercorn's trio worker is the model):

    root nursery
    ├── listener nursery   bootstrap listener + one listener per broker; cancelled first on shutdown
    ├── handler nursery    one ClientConnection.serve() per client; given a deadline on shutdown
    └── discovery          refreshes the broker list from the cluster, opening listeners for new nodes
"""

from __future__ import annotations

import logging
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import trio
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from protocol import Node, ProtocolError, decode_body

from .cluster import Cluster
from .config import Config, HostPort
from .connection import ClientConnection, ProxyContext
from .history.topic_ids import TopicIds
from .metrics import start_metrics_server
from .tls import server_context
from .upstream import UpstreamConnection, UpstreamError, connect, upstream_tls

__all__ = ["Proxy", "Bound", "discover_nodes"]

log = logging.getLogger("ksi.server")

DISCOVERY_VERSION = 1  # Metadata v1: every broker answers it; topics=[] asks for brokers only, None for all


@dataclass
class Bound:
    """Where the proxy listens, once it does."""

    bootstrap: HostPort
    brokers: dict[int, int] = field(default_factory=dict)


async def discover_nodes(config: Config, with_topics: bool = False) -> tuple[list[Node], set[str] | None]:
    """Ask the cluster for its brokers (and, ``with_topics``, its topic names) on a short-lived connection.

    Topic names tell which configured history topics exist only in the lake.  Asking for all topics
    (a null list) never auto-creates one, unlike naming them in Metadata v1.
    """
    stream, address = await connect(config.upstream.bootstrap_servers, config.upstream.connect_timeout_seconds,
                                    upstream_tls(config))
    upstream = UpstreamConnection(stream, address, config.proxy.max_frame_bytes)
    failure: Exception | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_swallow_closed, upstream)
            request = MetadataRequest(version=DISCOVERY_VERSION, topics=None if with_topics else [])
            request.with_header(correlation_id=0, client_id="ksi-discovery")
            pending = await upstream.send(bytes(request.encode(version=DISCOVERY_VERSION, header=True)), "Metadata")
            assert pending is not None
            try:
                with trio.fail_after(config.upstream.connect_timeout_seconds * 2):
                    raw = await pending.wait()
            except (UpstreamError, trio.TooSlowError) as exc:
                failure = exc  # raised below, outside the nursery, so callers see it and not a group
            nursery.cancel_scope.cancel()
    finally:
        await upstream.aclose()
    if isinstance(failure, trio.TooSlowError):
        raise UpstreamError(f"broker {address} did not answer Metadata within"
                            f" {config.upstream.connect_timeout_seconds * 2:g} s")
    if failure is not None:
        raise failure
    try:
        response = decode_body(MetadataResponse, DISCOVERY_VERSION, raw[4:])
    except (ProtocolError, ValueError, struct.error, EOFError, IndexError) as exc:
        raise UpstreamError(f"broker {address} sent an undecodable Metadata response: {exc}") from None
    nodes = [Node(b.node_id, b.host, b.port, b.rack) for b in response.brokers]
    topics = {t.name for t in response.topics if t.error_code == 0} if with_topics else None
    return nodes, topics


async def _swallow_closed(upstream: UpstreamConnection) -> None:
    try:
        await upstream.run()
    except UpstreamError:
        pass  # the pending request fails with the same error; discover_nodes reports it


class Proxy:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.draining = trio.Event()
        self.cluster = Cluster(config.proxy, self._open_broker_listener)
        self.ctx = ProxyContext(config=config, cluster=self.cluster, draining=self.draining, connections=set(),
                                topic_ids=TopicIds())
        self.bound: Bound | None = None
        self._listener_nursery: trio.Nursery | None = None
        self._handler_nursery: trio.Nursery | None = None
        self._stop = trio.Event()
        self._metrics_server: Any = None
        self.history: Any = None  # ksi.history.service.History when topics are configured

    def stop(self) -> None:
        """Begin a graceful shutdown (safe to call from the event loop at any time)."""
        self._stop.set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        proxy = self.config.proxy
        if self.config.metrics.listen is not None:
            m = self.config.metrics.listen
            self._metrics_server, _ = start_metrics_server(m.host, m.port)
            log.info("metrics at http://%s:%d/metrics", m.host, self._metrics_server.server_port)
        if self.config.topics:
            from .history.routing import HistoryRouter
            from .history.service import History

            history = History(self.config)
            await history.start()
            self.history = history
            self.ctx.router = HistoryRouter(history, self.ctx.topic_ids)
        log.debug("filter chain: %s", self.ctx.filter_chain())
        try:
            async with trio.open_nursery() as root:
                if self.history is not None:
                    await root.start(self.history.serve)
                self._handler_nursery = await root.start(_nursery_forever)
                self._listener_nursery = await root.start(_nursery_forever)
                port = await self._serve(proxy.listen, "bootstrap",
                                         lambda: list(self.config.upstream.bootstrap_servers))
                self.bound = Bound(HostPort(proxy.listen.host, port))
                log.info("ksi listening: bootstrap %s:%d (advertised as %s:%d) -> Kafka %s",
                         proxy.listen.host, port, proxy.advertised_host, port,
                         ",".join(map(str, self.config.upstream.bootstrap_servers)))
                root.start_soon(self._discovery_loop)
                task_status.started(self)
                await self._stop.wait()
                await self._shutdown(root)
        finally:
            if self._metrics_server is not None:
                self._metrics_server.shutdown()
                self._metrics_server.server_close()

    async def _shutdown(self, root: trio.Nursery) -> None:
        grace = self.config.proxy.shutdown_grace_seconds
        open_connections = len(self.ctx.connections)
        log.info("shutting down: no new connections; %d open connection(s) get %g s to finish in-flight requests",
                 open_connections, grace)
        assert self._listener_nursery is not None and self._handler_nursery is not None
        self._listener_nursery.cancel_scope.cancel()
        self.draining.set()
        for connection in list(self.ctx.connections):
            connection.read_scope.cancel()
        with trio.move_on_after(grace) as waited:
            while self.ctx.connections:
                await trio.sleep(0.02)
        if waited.cancelled_caught:
            log.warning("%d connection(s) still busy after %g s; closing them", len(self.ctx.connections), grace)
        root.cancel_scope.cancel()
        log.info("ksi stopped")

    async def _serve(self, address: HostPort, name: str, targets: Any) -> int:
        listeners: list[Any] = await trio.open_tcp_listeners(address.port, host=address.host)
        port = int(listeners[0].socket.getsockname()[1])
        if self.config.proxy.tls is not None:
            context = server_context(self.config.proxy.tls)
            listeners = [trio.SSLListener(listener, context) for listener in listeners]

        async def handle(stream: trio.abc.Stream) -> None:
            await ClientConnection(stream, name, targets, self.ctx).serve()

        assert self._listener_nursery is not None and self._handler_nursery is not None
        self._listener_nursery.start_soon(
            lambda: trio.serve_listeners(handle, listeners, handler_nursery=self._handler_nursery)
        )
        return port

    async def _open_broker_listener(self, node_id: int, port: int) -> int:
        address = HostPort(self.config.proxy.listen.host, port)

        def targets() -> list[HostPort]:
            real = self.cluster.upstream_address(node_id)
            return [real] if real is not None else []

        try:
            bound = await self._serve(address, f"broker-{node_id}", targets)
        except OSError as exc:
            log.error("cannot listen on %s for broker %d (%s); using a free port instead. Set proxy.node_ports"
                      " or proxy.broker_port_base in %s to choose free ports.", address, node_id, exc.strerror,
                      self.config.source)
            bound = await self._serve(HostPort(address.host, 0), f"broker-{node_id}", targets)
        if self.bound is not None:
            self.bound.brokers[node_id] = bound
        return bound

    async def _discovery_loop(self) -> None:
        interval = self.config.upstream.metadata_refresh_seconds
        backoff = 0.5
        failing = False
        while True:
            try:
                nodes, topics = await discover_nodes(self.config, with_topics=self.history is not None)
            except (UpstreamError, trio.TooSlowError, OSError) as exc:
                if not failing:
                    log.warning("cluster discovery failed, retrying with backoff: %s", exc)
                failing = True
                await trio.sleep(backoff)
                backoff = min(backoff * 2, interval)
                continue
            if failing:
                log.info("cluster reachable again: %d broker(s)", len(nodes))
            failing, backoff = False, 0.5
            await self.cluster.learn(nodes)
            if self.history is not None and topics is not None:
                self.history.set_upstream_topics(topics)
            await trio.sleep(interval)


async def _nursery_forever(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async with trio.open_nursery() as nursery:
        task_status.started(nursery)
        await trio.sleep(math.inf)
