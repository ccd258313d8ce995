"""The proxy server: listeners, connection handlers, cluster discovery, graceful shutdown.

Layout of tasks (hypercorn's trio worker is the model):

    root nursery
    ├── listener nursery   bootstrap listener + one listener per broker; cancelled first on shutdown
    ├── handler nursery    one ClientConnection.serve() per client; given a deadline on shutdown
    └── discovery          refreshes the broker list from the cluster, opening listeners for new nodes

Start-up binds before it serves: the bootstrap port, every pinned ``proxy.node_ports`` port, the metrics
port, then (after one discovery round) the ports of the brokers the cluster reports.  A configured port
that cannot be bound is a :class:`ListenError` naming the address, the key and the file, raised from
:meth:`Proxy.run` itself before any connection is accepted.  Several instances of one service must
advertise the same address for every broker, so ksi never listens somewhere else instead; only ``ksi
dev`` (``strict_ports=False``) falls back to a free port.  A broker that appears later and whose port is
taken is logged and advertised at its configured address all the same (other instances may serve it), and
ksi tries that port again at the next discovery.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse

from protocol import Node, ProtocolError, api, decode_body, response_body_offset

from .cluster import Cluster
from .config import Config, HostPort
from .connection import ClientConnection
from .context import ProxyContext
from .history.topic_ids import TopicIds
from .metrics import start_metrics_server
from .tls import server_context
from .upstream import UpstreamConnection, UpstreamError, connect, upstream_tls

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from .history.service import History

Listeners = list[trio.abc.Listener[trio.abc.Stream]]

__all__ = ["Bound", "ListenError", "Proxy", "discover_nodes"]

log = logging.getLogger("ksi.server")

# Metadata v1: every broker answers it; topics=[] asks for brokers only, None for all.  v12 (Kafka 2.8+)
# also names each topic's id, which a Fetch v13+ uses instead of its name: asked for when the broker offers it.
DISCOVERY_VERSION = 1
DISCOVERY_VERSION_WITH_IDS = 12
NO_TOPIC_ID = uuid.UUID(int=0)
STARTUP_DISCOVERY_SECONDS = 10.0  # the longest the first discovery holds the start (an unreachable cluster)


class ListenError(Exception):
    """A configured address ksi cannot listen on, in one line naming the address, the key and the file:
    ``cannot listen on HOST:PORT (KEY in FILE, what): why``."""

    def __init__(self, source: str, key: str, address: HostPort, what: str, error: OSError) -> None:
        reason = (error.strerror or str(error)).lower()
        super().__init__(f"cannot listen on {address} ({key} in {source}, {what}): {reason}")
        self.source, self.key, self.address, self.errno = source, key, address, error.errno


@dataclass
class Bound:
    """Where the proxy listens, once it does."""

    bootstrap: HostPort
    brokers: dict[int, int] = field(default_factory=dict)


async def discover_nodes(config: Config, with_topics: bool = False
                         ) -> tuple[list[Node], dict[str, uuid.UUID | None] | None]:
    """Ask the cluster for its brokers (and, ``with_topics``, its topics and their ids) on a short-lived
    connection.

    Topic names tell which configured history topics exist only in the lake; topic ids let every instance
    of a service route a Fetch by topic id before any client's Metadata passed through it.  Asking for all
    topics (a null list) never auto-creates one, unlike naming them.  Topic ids are None from brokers that
    do not offer Metadata v10+.
    """
    stream, address = await connect(config.upstream.bootstrap_servers, config.upstream.connect_timeout_seconds,
                                    upstream_tls(config))
    upstream = UpstreamConnection(stream, address, config.proxy.max_frame_bytes)
    timeout = config.upstream.connect_timeout_seconds * 2
    failure: Exception | None = None
    version = DISCOVERY_VERSION
    raw = b""
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_swallow_closed, upstream)
            try:
                with trio.fail_after(timeout):
                    if with_topics:
                        version = await _metadata_version(upstream)
                    fields: dict[str, Any] = {}
                    if version >= 4:
                        fields["allow_auto_topic_creation"] = False
                    if version >= 8:
                        fields["include_topic_authorized_operations"] = False
                    request = MetadataRequest(version=version, topics=None if with_topics else [], **fields)
                    request.with_header(correlation_id=0, client_id="ksi-discovery")
                    pending = await upstream.send(bytes(request.encode(version=version, header=True)), "Metadata")
                    assert pending is not None
                    raw = bytes(await pending.wait())
            except (UpstreamError, trio.TooSlowError) as exc:
                failure = exc  # raised below, outside the nursery, so callers see it and not a group
            nursery.cancel_scope.cancel()
    finally:
        await upstream.aclose()
    if isinstance(failure, trio.TooSlowError):
        raise UpstreamError(f"broker {address} did not answer Metadata within {timeout:g} s")
    if failure is not None:
        raise failure
    try:
        entry = api(MetadataRequest.API_KEY)
        assert entry is not None
        offset = response_body_offset(raw, entry.response_header_version(version))
        response = decode_body(MetadataResponse, version, raw[offset:])
    except (ProtocolError, ValueError, struct.error, EOFError, IndexError) as exc:
        raise UpstreamError(f"broker {address} sent an undecodable Metadata response: {exc}") from None
    nodes = [Node(b.node_id, b.host, b.port, b.rack) for b in response.brokers]
    topics = None
    if with_topics:
        topics = {}
        for t in response.topics:
            if t.error_code == 0 and t.name:
                topic_id = getattr(t, "topic_id", None) if version >= 10 else None
                topics[t.name] = topic_id if topic_id != NO_TOPIC_ID else None
    return nodes, topics


async def _metadata_version(upstream: UpstreamConnection) -> int:
    """Metadata v12 if the broker offers it (ApiVersions v0, which every broker answers), else v1."""
    request = ApiVersionsRequest(version=0)
    request.with_header(correlation_id=0, client_id="ksi-discovery")
    pending = await upstream.send(bytes(request.encode(version=0, header=True)), "ApiVersions")
    assert pending is not None
    raw = await pending.wait()
    try:
        response = decode_body(ApiVersionsResponse, 0, memoryview(raw)[4:])
    except (ProtocolError, ValueError, struct.error, EOFError, IndexError):
        return DISCOVERY_VERSION
    if response.error_code != 0:
        return DISCOVERY_VERSION
    for key in response.api_keys:
        if key.api_key == MetadataRequest.API_KEY and key.max_version >= DISCOVERY_VERSION_WITH_IDS:
            return DISCOVERY_VERSION_WITH_IDS
    return DISCOVERY_VERSION


async def _swallow_closed(upstream: UpstreamConnection) -> None:
    with contextlib.suppress(UpstreamError):  # the pending request fails with the same error; discover_nodes says so
        await upstream.run()


Targets = Callable[[], list[HostPort]]


class Proxy:
    def __init__(self, config: Config, *, strict_ports: bool = True) -> None:
        self.config = config
        # True: a configured port that cannot be bound is an error (a service); False: ksi listens on a free
        # port instead and advertises that (ksi dev, on a laptop where the port may be taken).
        self.strict_ports = strict_ports
        self.draining = trio.Event()
        self.cluster = Cluster(config.proxy, self._open_broker_listener)
        self.ctx = ProxyContext(config=config, cluster=self.cluster, draining=self.draining, connections=set(),
                                topic_ids=TopicIds())
        self.bound: Bound | None = None
        self._listener_nursery: trio.Nursery | None = None
        self._handler_nursery: trio.Nursery | None = None
        self._held: list[tuple[Listeners, str, Targets]] = []  # bound during start-up, served once it is done
        self._pinned: dict[int, int] = {}  # node id -> port of a proxy.node_ports listener bound at start-up
        self._bind_failed: dict[int, float] = {}  # node id -> when its port last could not be bound
        self._stop = trio.Event()
        self._metrics_server: WSGIServer | None = None
        self.history: History | None = None  # when topics are configured

    def stop(self) -> None:
        """Begin a graceful shutdown (safe to call from the event loop at any time)."""
        self._stop.set()

    async def run(self, *, task_status: trio.TaskStatus[Proxy] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind every configured port, then serve until :meth:`stop`.  A port that cannot be bound raises
        :class:`ListenError` from here, before anything is served (and outside any nursery)."""
        proxy = self.config.proxy
        try:
            discovered = await self._start_up()
        except BaseException:
            for listeners, _, _ in self._held:
                for listener in listeners:
                    await listener.aclose()
            self._held.clear()
            self._stop_metrics()
            raise
        try:
            async with trio.open_nursery() as root:
                if self.history is not None:
                    await root.start(self.history.serve)
                self._handler_nursery = await root.start(_nursery_forever)
                self._listener_nursery = await root.start(_nursery_forever)
                held, self._held = self._held, []
                for listeners, name, targets in held:
                    self._serve(listeners, name, targets)
                assert self.bound is not None
                log.info("ksi listening: bootstrap %s:%d (advertised as %s:%d) -> Kafka %s",
                         proxy.listen.host, self.bound.bootstrap.port, proxy.advertised_host,
                         self.bound.bootstrap.port, ",".join(map(str, self.config.upstream.bootstrap_servers)))
                root.start_soon(self._discovery_loop, discovered)
                task_status.started(self)
                await self._stop.wait()
                await self._shutdown(root)
        finally:
            self._stop_metrics()

    async def _start_up(self) -> bool:
        """Bind the configured ports, open the lake, learn the cluster once; True if discovery succeeded."""
        proxy = self.config.proxy
        bootstrap, port = await self._bind(proxy.listen, "proxy.listen", "the bootstrap listener")
        self.bound = Bound(HostPort(proxy.listen.host, port))
        self._held.append((bootstrap, "bootstrap", lambda: list(self.config.upstream.bootstrap_servers)))
        for node_id, pinned in sorted(proxy.node_ports.items()):
            # Every pinned port is bound now, seen or not: a port that is taken is found at start-up.
            address = HostPort(proxy.listen.host, pinned)
            listeners, _ = await self._bind(address, f"proxy.node_ports.{node_id}", f"broker {node_id}")
            self._held.append((listeners, f"broker-{node_id}", self._broker_targets(node_id)))
            self._pinned[node_id] = pinned
        if self.config.metrics.listen is not None:
            m = self.config.metrics.listen
            try:
                self._metrics_server, _ = start_metrics_server(m.host, m.port)
            except OSError as exc:
                raise ListenError(self.config.source, "metrics.listen", m, "Prometheus /metrics", exc) from None
            log.info("metrics at http://%s:%d/metrics", m.host, self._metrics_server.server_port)
        if self.config.topics:
            from .history.routing import HistoryRouter
            from .history.service import History

            history = History(self.config)
            await history.start()
            self.history = history
            self.ctx.router = HistoryRouter(history, self.ctx.topic_ids)
        log.debug("filter chain: %s", self.ctx.filter_chain())
        # One discovery round before serving: the brokers' ports are bound (or fail) now, and the topic ids
        # are known before the first Fetch by topic id arrives.  A cluster that does not answer holds the
        # start for at most STARTUP_DISCOVERY_SECONDS; ksi then serves and keeps trying.
        failure: Exception | None = trio.TooSlowError(f"no answer within {STARTUP_DISCOVERY_SECONDS:g} s")
        with trio.move_on_after(STARTUP_DISCOVERY_SECONDS):
            failure = await self._discover()
        if failure is not None:
            log.warning("cluster discovery failed, serving anyway and retrying with backoff: %s", failure)
        return failure is None

    def _stop_metrics(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None

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
            while self.ctx.connections:  # noqa: ASYNC110 - polled only during the grace period
                await trio.sleep(0.02)
        if waited.cancelled_caught:
            log.warning("%d connection(s) still busy after %g s; closing them", len(self.ctx.connections), grace)
        root.cancel_scope.cancel()
        log.info("ksi stopped")

    async def _bind(self, address: HostPort, key: str, what: str) -> tuple[Listeners, int]:
        """Listening sockets on ``address`` (not served yet) and the port bound; :class:`ListenError` naming
        ``key`` if it cannot be bound."""
        try:
            sockets = await trio.open_tcp_listeners(address.port, host=address.host)
        except OSError as exc:
            raise ListenError(self.config.source, key, address, what, exc) from None
        port = int(sockets[0].socket.getsockname()[1])
        if self.config.proxy.tls is not None:
            context = server_context(self.config.proxy.tls)
            return [trio.SSLListener(listener, context) for listener in sockets], port
        return list(sockets), port

    def _serve(self, listeners: Listeners, name: str, targets: Targets) -> None:
        async def handle(stream: trio.abc.Stream) -> None:
            await ClientConnection(stream, name, targets, self.ctx).serve()

        assert self._listener_nursery is not None and self._handler_nursery is not None
        self._listener_nursery.start_soon(
            functools.partial(trio.serve_listeners, handle, listeners, handler_nursery=self._handler_nursery))

    def _broker_targets(self, node_id: int) -> Targets:
        def targets() -> list[HostPort]:
            real = self.cluster.upstream_address(node_id)
            return [real] if real is not None else []
        return targets

    async def _open_broker_listener(self, node_id: int, port: int) -> int | None:
        """Listen for broker ``node_id`` on ``port`` (0: any); the port bound, or None if it could not be."""
        if node_id in self._pinned:
            bound: int | None = self._pinned[node_id]  # bound at start-up
        else:
            bound = await self._bind_broker(node_id, port)
        if bound is not None and self.bound is not None:
            self.bound.brokers[node_id] = bound
        return bound

    async def _bind_broker(self, node_id: int, port: int) -> int | None:
        config = self.config.proxy
        address = HostPort(config.listen.host, port)
        key = config.node_port_key(node_id)
        serving = self._listener_nursery is not None
        last = self._bind_failed.get(node_id)
        if last is not None and trio.current_time() - last < self.config.upstream.metadata_refresh_seconds:
            return None  # tried lately: again at the next discovery, not on every response that names it
        try:
            listeners, bound = await self._bind(address, key, f"broker {node_id}")
        except ListenError as exc:
            if self.strict_ports and not serving:
                raise
            if self.strict_ports:
                self._bind_failed[node_id] = trio.current_time()
                log.error("%s; clients are told %s:%s for it all the same (other instances may serve it), and ksi"
                          " tries again at the next discovery", exc, config.advertised_host,
                          self.cluster.advertised_port(node_id))
                return None
            log.error("cannot listen on %s for broker %d (%s); using a free port instead. Set proxy.node_ports"
                      " or proxy.broker_port_base in %s to choose free ports.", address, node_id, exc,
                      self.config.source)
            listeners, bound = await self._bind(HostPort(address.host, 0), key, f"broker {node_id}")
        if self._bind_failed.pop(node_id, None) is not None:
            log.info("listening on %s for broker %d now", address, node_id)
        if serving:
            self._serve(listeners, f"broker-{node_id}", self._broker_targets(node_id))
        else:
            self._held.append((listeners, f"broker-{node_id}", self._broker_targets(node_id)))
        return bound

    async def _discover(self) -> Exception | None:
        """One discovery round: brokers (their listeners opened), topic names and ids; the failure, if any."""
        try:
            nodes, topics = await discover_nodes(self.config, with_topics=self.history is not None)
        except (UpstreamError, trio.TooSlowError, OSError) as exc:
            return exc
        await self.cluster.learn(nodes)
        if self.history is not None and topics is not None:
            for name, topic_id in topics.items():
                self.ctx.topic_ids.learn(name, topic_id)
            self.history.set_upstream_topics(set(topics))
            if self.history.lake_only:
                from .history.lake_only import lake_topic_id

                for name in self.history.lake_only:
                    self.ctx.topic_ids.learn(name, lake_topic_id(name))
        return None

    async def _discovery_loop(self, discovered: bool) -> None:
        interval = self.config.upstream.metadata_refresh_seconds
        backoff = 0.5
        failing = not discovered
        if discovered:
            await trio.sleep(interval)
        while True:
            failure = await self._discover()
            if failure is not None:
                if not failing:
                    log.warning("cluster discovery failed, retrying with backoff: %s", failure)
                failing = True
                await trio.sleep(backoff)
                backoff = min(backoff * 2, interval)
                continue
            if failing:
                log.info("cluster reachable again: %d broker(s)", len(self.cluster.nodes))
            failing, backoff = False, 0.5
            await trio.sleep(interval)


async def _nursery_forever(task_status: trio.TaskStatus[trio.Nursery] = trio.TASK_STATUS_IGNORED) -> None:
    async with trio.open_nursery() as nursery:
        task_status.started(nursery)
        await trio.sleep(math.inf)
