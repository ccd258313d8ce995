"""One client connection: read requests, forward or answer them, write responses in request order.

Each client connection owns one upstream connection to the broker its listener stands for (the
bootstrap listener: any bootstrap server).  That 1:1 pairing keeps SASL and per-connection broker state
(fetch sessions, authenticated principal) exactly as the broker would see it without the proxy.

Three tasks share a nursery: the reader turns client frames into *slots* and puts them on an ordered
channel; the writer awaits each slot in turn and writes its response, so responses leave in the order
requests arrived whatever order they complete in; the upstream task reads the broker's responses.
Frames ksi does not change are forwarded with only the correlation id touched.
"""

from __future__ import annotations

import logging
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio
from kafka.protocol.api_key import ApiKey
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from protocol import (
    FrameReader,
    FrameTooLarge,
    ProtocolError,
    RequestHeader,
    api,
    api_name,
    decode_body,
    encode_response_header,
    expects_response,
    frame,
    intersect_api_versions,
    max_api_versions_version,
    parse_endpoints,
    parse_request_header,
    reframe,
    response_body_offset,
    unsupported_version_response,
)

from protocol.sasl import ANONYMOUS, SaslObserver, certificate_principal

from .cluster import Cluster
from .config import Config, HostPort
from .history.topic_ids import TopicIds
from .metrics import BYTES, CLIENT_ERRORS, CONNECTIONS, CONNECTIONS_ACTIVE, FRAMES, REQUEST_LATENCY, UPSTREAM_LATENCY
from .upstream import Backlog, ConnectBackoff, Pending, UpstreamConnection, UpstreamError, connect, upstream_tls

if TYPE_CHECKING:
    from .history.routing import HistoryRouter

__all__ = ["ClientConnection", "ProxyContext"]

log = logging.getLogger("ksi.connection")

READ_CHUNK = 256 * 1024
MAX_IN_FLIGHT = 128  # requests read ahead of their responses; beyond this the reader waits
# Broker responses read for a client and not yet written to it; past this ksi stops reading that client's
# broker connection (a client that does not read its socket costs ksi this much, plus one frame).
RESPONSE_BACKLOG_BYTES = 16 << 20


@dataclass
class ProxyContext:
    """What every connection shares: config, the cluster view, and the shutdown switch."""

    config: Config
    cluster: Cluster
    draining: trio.Event
    connections: set[ClientConnection]
    topic_ids: TopicIds
    router: "HistoryRouter | None" = None
    backoffs: dict[tuple[HostPort, ...], ConnectBackoff] = field(default_factory=dict)


class _ClientGone(Exception):
    pass


class _Refused(Exception):
    """A client frame that ends the connection; the message is the log line."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class _Slot:
    """One request's place in the response order."""

    __slots__ = ("header", "pending", "local", "handler", "request", "arrived")

    def __init__(self, header: RequestHeader, pending: Pending | None = None, local: bytes | None = None,
                 handler: Any = None, request: bytes | memoryview | None = None) -> None:
        self.header = header
        self.pending = pending      # a forwarded request: the broker's raw response
        self.local = local          # answered by ksi at once: the response payload
        self.handler = handler      # answered by the history router when its turn comes: the handler
        self.request = request      # ... and the request it answers
        self.arrived = time.perf_counter()


class _OwnRequests:
    """Lets the history router send ksi's own requests on this client's upstream connection."""

    def __init__(self, connection: ClientConnection) -> None:
        self._connection = connection
        self.marks: dict[Any, Any] = {}  # the history router's per-connection watermarks and refusals
        self.sasl = SaslObserver()
        self.denied: set[str] = set()    # lake-only topics this client was refused (logged once each)

    @property
    def principal(self) -> str:
        """Who the broker accepted this client as: its SASL user, else its TLS certificate, else anonymous."""
        if self.sasl.principal is not None:
            return self.sasl.principal
        stream = self._connection.stream
        if isinstance(stream, trio.SSLStream):
            try:
                found = certificate_principal(stream.getpeercert())
            except (ValueError, trio.NeedHandshakeError):
                found = None
            if found is not None:
                return found
        return ANONYMOUS

    async def call(self, payload: bytes, api: str) -> bytes | memoryview:
        upstream = await self._connection._upstream_connection()
        pending = await upstream.send(payload, api, internal=True)
        assert pending is not None
        raw = await pending.wait()
        self._connection.backlog.release(pending.size)
        return raw


class ClientConnection:
    def __init__(self, stream: trio.abc.Stream, listener: str, targets: Callable[[], list[HostPort]],
                 ctx: ProxyContext) -> None:
        self.stream = stream
        self.listener = listener
        self._targets = targets
        self.ctx = ctx
        self.client_id: str | None = None
        try:
            raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
            host, port = raw.socket.getpeername()[:2]  # type: ignore[attr-defined]
            self.peer = f"{host}:{port}"
        except OSError:
            self.peer = "?"
        self._upstream: UpstreamConnection | None = None
        self.backlog = Backlog(RESPONSE_BACKLOG_BYTES)
        self._nursery: trio.Nursery | None = None
        self._error: BaseException | None = None
        self.read_scope = trio.CancelScope()
        self._own_requests = _OwnRequests(self)
        self._quiet = False  # the upstream error that ends this connection is a repeat: log it at debug

    def __str__(self) -> str:
        return f"client {self.peer} ({self.client_id or 'no client id'}) on {self.listener}"

    # -- lifecycle ---------------------------------------------------------------------------

    async def serve(self) -> None:
        CONNECTIONS.labels(self.listener).inc()
        CONNECTIONS_ACTIVE.labels(self.listener).inc()
        self.ctx.connections.add(self)
        log.debug("%s connected", self)
        try:
            send, receive = trio.open_memory_channel[_Slot](MAX_IN_FLIGHT)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._guard, self._write_loop, receive)
                await self._guard(self._read_loop, send)
        finally:
            self.ctx.connections.discard(self)
            CONNECTIONS_ACTIVE.labels(self.listener).dec()
            if self._upstream is not None:
                await self._upstream.aclose()
            with trio.CancelScope(shield=True):
                await self.stream.aclose()
            self._log_end()

    def _log_end(self) -> None:
        error = self._error
        if error is None or isinstance(error, _ClientGone):
            log.debug("%s disconnected", self)
        elif isinstance(error, _Refused):
            log.warning("%s: %s; closing the connection", self, error)
        elif isinstance(error, UpstreamError):
            # While a broker stays unreachable only the first refused connection is a warning; the
            # reconnects that follow are debug lines until a connection succeeds (logged with a count).
            (log.debug if self._quiet else log.warning)("%s: %s; closing the client connection so it reconnects",
                                                        self, error)
        else:
            log.error("%s: closing the connection after an unexpected error", self, exc_info=error)

    async def _guard(self, task: Any, *args: Any) -> None:
        """Run a task; its first failure is recorded and ends the whole connection."""
        try:
            await task(*args)
        except (_ClientGone, _Refused, UpstreamError, ProtocolError, Exception) as exc:
            if self._error is None:
                self._error = exc
                if isinstance(exc, _Refused):
                    CLIENT_ERRORS.labels(exc.kind).inc()
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()

    # -- reading requests ----------------------------------------------------------------------

    async def _read_loop(self, send: trio.MemorySendChannel[_Slot]) -> None:
        config = self.ctx.config.proxy
        reader = FrameReader(config.max_frame_bytes)
        async with send:
            with self.read_scope:
                if self.ctx.draining.is_set():
                    return
                while True:
                    with trio.move_on_after(config.idle_timeout_seconds) as idle:
                        data = await self._receive()
                    if idle.cancelled_caught:
                        raise _Refused("idle", f"no request for {config.idle_timeout_seconds:g} s")
                    if not data:
                        if reader.buffered:
                            raise _ClientGone(f"client closed mid-request ({reader.buffered} bytes unread)")
                        return
                    reader.receive_data(data)
                    while True:
                        try:
                            request = reader.next_frame()
                        except FrameTooLarge as exc:
                            raise _Refused("too_large", f"{exc} (proxy.max_frame_bytes)") from None
                        if request is None:
                            break
                        slot = await self._handle(request)
                        if slot is not None:
                            try:
                                await send.send(slot)
                            except trio.BrokenResourceError:
                                # The writer already ended the connection (its error is the one logged).
                                raise _ClientGone("the response writer has stopped") from None
            # Draining: the read scope was cancelled; responses already queued still go out.

    async def _receive(self) -> bytes:
        try:
            return bytes(await self.stream.receive_some(READ_CHUNK))
        except trio.BrokenResourceError as exc:
            if isinstance(exc.__cause__, ssl.SSLError):
                raise _Refused("tls", f"TLS failed: {exc.__cause__}") from None
            raise _ClientGone(str(exc)) from None
        except (trio.ClosedResourceError, OSError) as exc:
            raise _ClientGone(str(exc)) from None

    async def _handle(self, request: bytes | memoryview) -> _Slot | None:
        try:
            header = parse_request_header(request)
        except ProtocolError as exc:
            raise _Refused("malformed", f"malformed request header: {exc}") from None
        self.client_id = header.client_id
        name = api_name(header.api_key)
        entry = api(header.api_key)
        label = name if entry is not None else "unknown"  # one series for all unknown keys: clients cannot mint them
        FRAMES.labels("client_to_proxy", label).inc()
        BYTES.labels("client_to_proxy", label).inc(len(request) + 4)
        if entry is None:
            raise _Refused("unsupported_api", f"API key {header.api_key} ({name}) v{header.api_version} is not"
                                              " supported by ksi (it is not offered in ApiVersions)")
        if header.api_key == ApiKey.ApiVersions and header.api_version > max_api_versions_version():
            # KIP-511: answer with UNSUPPORTED_VERSION and a v0 body so the client can downgrade.
            CLIENT_ERRORS.labels("unsupported_version").inc()
            log.info("%s: ApiVersions v%d is newer than ksi's v%d; answering UNSUPPORTED_VERSION", self,
                     header.api_version, max_api_versions_version())
            body = unsupported_version_response()
            return _Slot(header, local=encode_response_header(header.correlation_id, 0) + body)
        if not entry.supports(header.api_version):
            raise _Refused("unsupported_version", f"{name} v{header.api_version} is newer than ksi supports"
                                                  f" (max v{entry.max_version})")
        try:
            wants_response = expects_response(request, header)
        except ProtocolError as exc:
            raise _Refused("malformed", f"malformed {name} v{header.api_version} request: {exc}") from None
        if header.api_key in (ApiKey.SaslHandshake, ApiKey.SaslAuthenticate):
            self._watch_sasl(header, request)
        router = self.ctx.router
        handler = self._history_handler(router, header, request, wants_response) if router is not None else None
        if handler is not None:
            # Run when the writer reaches it (see _response), so responses the client has not read yet
            # are never built ahead of it.
            return _Slot(header, handler=handler, request=request)
        if router is not None and not wants_response and header.api_key == ApiKey.Produce \
                and router.lake_only.names and router.lake_only.named_in(request):
            try:
                _, refused, forward = router.lake_only.split_produce(header, request)
            except ProtocolError as exc:
                raise _Refused("malformed", f"malformed {name} v{header.api_version} request: {exc}") from None
            log.warning("%s: acks=0 Produce to read-only lake topic(s) %s dropped", self,
                        ", ".join(str(getattr(t, "name", None) or t.topic_id) for t in refused))
            if forward is None:
                return None
            request = forward
        upstream = await self._upstream_connection()
        pending = await upstream.send(request, name, wants_response)
        FRAMES.labels("proxy_to_server", name).inc()
        BYTES.labels("proxy_to_server", name).inc(len(request) + 4)
        if pending is None:
            return None  # Produce acks=0: the broker sends nothing back, and neither do we
        return _Slot(header, pending=pending)

    def _watch_sasl(self, header: RequestHeader, request: bytes | memoryview) -> None:
        """Note the mechanism and the claimed user name (never the secret) of a SASL exchange the broker
        is about to judge; the principal counts only once the broker accepts it (see _transform)."""
        assert header.body_offset is not None
        body = request[header.body_offset:]
        try:
            if header.api_key == ApiKey.SaslHandshake:
                self._own_requests.sasl.handshake(decode_body(SaslHandshakeRequest, header.api_version, body).mechanism)
            else:
                self._own_requests.sasl.request(
                    bytes(decode_body(SaslAuthenticateRequest, header.api_version, body).auth_bytes or b""))
        except ProtocolError:
            pass  # the broker judges the malformed request and answers it

    @staticmethod
    def _history_handler(router: HistoryRouter, header: RequestHeader, request: bytes | memoryview,
                         wants_response: bool) -> Any:
        """The history router's handler for this request, or None when it goes straight to the broker."""
        key = header.api_key
        if key == ApiKey.Fetch:
            return router.fetch
        if key == ApiKey.ListOffsets and header.api_version >= 1:
            return router.list_offsets
        if router.lake_only.names:
            if key == ApiKey.Metadata:
                return router.lake_only.metadata
            if key == ApiKey.Produce and wants_response and router.lake_only.named_in(request):
                return router.lake_only.produce
        return None

    async def _history(self, slot: _Slot) -> bytes | memoryview:
        """Run a slot's history handler: its response frame (body after a response header)."""
        header = slot.header
        assert slot.request is not None
        try:
            return await slot.handler(header, slot.request, self._own_requests, str(self))  # type: ignore[no-any-return]
        except ProtocolError as exc:
            # The request itself did not decode (the router decodes Fetch, ListOffsets, Metadata and Produce;
            # a broker's bad response is an UpstreamError): the client's fault, like a malformed header.
            raise _Refused("malformed", f"malformed {api_name(header.api_key)} v{header.api_version}"
                                        f" request: {exc}") from None
        finally:
            slot.request = None

    async def _upstream_connection(self) -> UpstreamConnection:
        if self._upstream is None:
            targets = self._targets()
            if not targets:
                raise UpstreamError(f"no address known for the broker behind {self.listener}")
            backoff = self.ctx.backoffs.setdefault(tuple(targets), ConnectBackoff())
            try:
                stream, address = await connect(targets, self.ctx.config.upstream.connect_timeout_seconds,
                                                upstream_tls(self.ctx.config))
            except UpstreamError:
                delay = backoff.failed()
                self._quiet = backoff.failures > 1
                await trio.sleep(delay)  # then close: the client reconnects no faster than it would back off
                raise
            failed = backoff.succeeded()
            if failed:
                log.info("%s: connected to %s again after %d failed connection attempt(s)", self,
                         ",".join(map(str, targets)), failed)
            self._upstream = UpstreamConnection(stream, address, self.ctx.config.proxy.max_frame_bytes, self.backlog)
            assert self._nursery is not None
            self._nursery.start_soon(self._guard, self._upstream.run)
            log.debug("%s: connected upstream to %s", self, address)
        return self._upstream

    # -- writing responses ---------------------------------------------------------------------

    async def _write_loop(self, receive: trio.MemoryReceiveChannel[_Slot]) -> None:
        timeout = self.ctx.config.proxy.request_timeout_seconds
        async with receive:
            async for slot in receive:
                with trio.move_on_after(timeout) as waited:
                    parts = await self._response(slot)
                if waited.cancelled_caught:
                    raise UpstreamError(f"no response to {api_name(slot.header.api_key)} within"
                                        f" {timeout:g} s (proxy.request_timeout_seconds)")
                name = api_name(slot.header.api_key)
                try:
                    for part in parts:
                        await self.stream.send_all(part)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    raise _ClientGone(str(exc)) from None
                if slot.pending is not None:
                    self.backlog.release(slot.pending.size)
                FRAMES.labels("proxy_to_client", name).inc()
                BYTES.labels("proxy_to_client", name).inc(sum(len(p) for p in parts))
                REQUEST_LATENCY.labels(name).observe(time.perf_counter() - slot.arrived)
        # Reader finished and every queued response is out: end the connection.
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    async def _response(self, slot: _Slot) -> list[bytes | memoryview]:
        """The framed response for a slot, as buffers to send in order."""
        if slot.local is not None:
            return [frame(slot.local)]
        if slot.handler is not None:
            # Answered by the history router: still the client's correlation id and ksi's addresses
            # (Fetch v16+ node endpoints), like any forwarded response.
            return await self._transform(slot.header, await self._history(slot))
        assert slot.pending is not None
        raw = await slot.pending.wait()
        header = slot.header
        name = slot.pending.api
        FRAMES.labels("server_to_proxy", name).inc()
        BYTES.labels("server_to_proxy", name).inc(len(raw) + 4)
        UPSTREAM_LATENCY.labels(name).observe(time.perf_counter() - slot.pending.sent_at)
        return await self._transform(header, raw)

    async def _transform(self, header: RequestHeader, raw: bytes | memoryview) -> list[bytes | memoryview]:
        """The broker's response as the client must see it: its correlation id, ksi's addresses."""
        entry = api(header.api_key)
        assert entry is not None
        version = header.api_version
        header_version = entry.response_header_version(version)
        try:
            if header.api_key == ApiKey.ApiVersions:
                body = intersect_api_versions(raw[4:], version)
                return [frame(encode_response_header(header.correlation_id, 0) + body)]
            offset = response_body_offset(raw, header_version)
            endpoints = parse_endpoints(header.api_key, version, memoryview(raw)[offset:])
        except (ProtocolError, ValueError, IndexError, EOFError) as exc:
            raise UpstreamError(f"cannot decode the broker's {entry.name} v{version} response: {exc}") from None
        if header.api_key == ApiKey.SaslAuthenticate and len(raw) >= offset + 2:
            principal = self._own_requests.sasl.response(struct.unpack_from(">h", raw, offset)[0])
            if principal is not None:
                log.info("%s: the broker authenticated the client as %s", self, principal)
        if endpoints is None:
            return reframe(raw, 0, header.correlation_id)
        if header.api_key == ApiKey.Metadata:
            for topic in endpoints.message.topics:
                self.ctx.topic_ids.learn(topic.name, getattr(topic, "topic_id", None))
        await self.ctx.cluster.learn(endpoints.nodes)
        body = endpoints.encode(self.ctx.cluster.proxy_address)
        return [frame(struct.pack(">i", header.correlation_id) + bytes(raw[4:offset]) + body)]
