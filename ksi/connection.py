"""One client connection: read requests, run each through the filter chain, write responses in request order.

Each client connection owns one upstream connection to the broker its listener stands for (the
bootstrap listener: any bootstrap server).  That 1:1 pairing keeps SASL and per-connection broker state
(fetch sessions, authenticated principal) exactly as the broker would see it without the proxy.

The connection knows framing and order, nothing else; every concern is a filter (ksi/filters).  Requests
take a *slot* (ksi/slots.py) in an ordered queue as they are read.  A forwarded request's response is
delivered to its slot by the task that reads the broker's connection, and whoever completes the slot at
the head of the queue writes it and every completed slot behind it, so a relayed response goes from the
broker's socket to the client's in one task, without a hop.  Requests ksi answers itself (history) are
answered by a task of their own when their slot reaches the head, one at a time, as a broker works.

Where Kafka's broker closes a connection (a request it cannot read, an API or version it does not serve,
an oversized frame, an acks=0 Produce it refuses) ksi closes it too, after the responses to the requests
before it are written; where Kafka answers with an error code, so does ksi (docs/architecture.md has the
table).  The connection runs over any trio stream: the tests use memory streams.

A connection older than ``proxy.connection_max_age_seconds`` is closed between requests (see
:meth:`ClientConnection._aged_out`), so that clients behind a load balancer spread over the instances again
after one comes back: the client reconnects and the balancer picks an instance anew.
"""

from __future__ import annotations

import logging
import math
import random
import ssl
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING

import trio
from kafka.protocol.api_key import ApiKey

from protocol import (
    FrameReader,
    FrameTooLarge,
    ProtocolError,
    RequestHeader,
    api,
    encode_response_header,
    parse_request_header,
)
from protocol import frame as size_prefixed
from protocol.error_responses import error_response
from protocol.errors import UNKNOWN_SERVER_ERROR
from protocol.requests import produce_acks
from protocol.sasl import ANONYMOUS, SaslObserver, certificate_principal

from . import rawio
from .config import HostPort
from .filters import Answer, Close, Defer, Forward, Request, Response, Spliced
from .filters.api import Action
from .metrics import CLIENT_ERRORS, CONNECTIONS, CONNECTIONS_ACTIVE, CONNECTIONS_AGED_OUT, SPLICED_TO_CLIENT
from .relay import UnreadRelay
from .slots import AgedOut, ClientGone, Refused, Slot
from .upstream import Backlog, ConnectBackoff, UpstreamConnection, UpstreamError, upstream_tls

if TYPE_CHECKING:
    from .context import ProxyContext

__all__ = ["ClientConnection"]

log = logging.getLogger("ksi.connection")

READ_CHUNK = 256 * 1024
MAX_IN_FLIGHT = 128  # requests read ahead of their responses; beyond this the reader waits
# Broker responses read for a client and not yet written to it; past this ksi stops reading that client's
# broker connection (a client that does not read its socket costs ksi this much, plus one frame).
RESPONSE_BACKLOG_BYTES = 16 << 20
_INT32 = struct.Struct(">i")


class ClientConnection:
    """A client connection, and the :class:`ksi.filters.Session` its filters see (marks, denied, sasl,
    principal, call)."""

    def __init__(self, stream: trio.abc.Stream, listener: str, targets: Callable[[], list[HostPort]],
                 ctx: ProxyContext, peer: str | None = None) -> None:
        self.stream = stream
        rawio.relay_socket(stream)
        self.listener = listener
        self._targets = targets
        self.ctx = ctx
        self.chain = ctx.filter_chain()
        self._observers = self.chain.observers
        self.client_id: str | None = None
        self.peer = peer or self._peer_name(stream)
        self._upstream: UpstreamConnection | None = None
        self.backlog = Backlog(RESPONSE_BACKLOG_BYTES)
        self._nursery: trio.Nursery | None = None
        self._error: BaseException | None = None
        self.read_scope = trio.CancelScope()
        self._quiet = False  # the upstream error that ends this connection is a repeat: log it at debug
        self._slots: deque[Slot] = deque()
        self._writing = False
        self._reading_done = False
        self._turn = trio.Event()       # set when the head slot is one ksi answers itself
        self._room: trio.Event | None = None
        # The clock's own method: trio.current_time() looks the run and its clock up on every call, and the
        # relay reads the time a few times per round trip (MockClock in the tests).
        self._now = trio.lowlevel.current_clock().current_time
        self._last_seen = self._opened = self._now()
        # Connection max age: each connection's limit is drawn from 90-100% of the setting (gRPC's
        # MAX_CONNECTION_AGE jitter), so connections opened together do not all close together.
        max_age = ctx.config.proxy.connection_max_age_seconds
        self._max_age = max_age * random.uniform(0.9, 1.0) if max_age > 0 else math.inf
        self._reader: FrameReader | None = None
        self._unread = UnreadRelay(stream)  # large responses relayed unread (spliced)
        self._handling = False  # the reader is routing a request that has no slot yet
        # What the filters keep per connection (the history router's Upstream protocol).
        self.marks: dict[Hashable, object] = {}
        self.denied: set[str] = set()
        self.sasl = SaslObserver()

    @staticmethod
    def _peer_name(stream: trio.abc.Stream) -> str:
        try:
            raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
            # a SocketStream has .socket, other streams do not (AttributeError below)
            host, port = raw.socket.getpeername()[:2]  # type: ignore[attr-defined,union-attr,unused-ignore]
            return f"{host}:{port}"
        except (OSError, AttributeError):
            return "?"

    def __str__(self) -> str:
        return f"client {self.peer} ({self.client_id or 'no client id'}) on {self.listener}"

    @property
    def description(self) -> str:
        return str(self)

    @property
    def principal(self) -> str:
        """Who the broker accepted this client as: its SASL user, else its TLS certificate, else anonymous."""
        if self.sasl.principal is not None:
            return self.sasl.principal
        if isinstance(self.stream, trio.SSLStream):
            try:
                found = certificate_principal(self.stream.getpeercert())
            except (ValueError, trio.NeedHandshakeError):
                found = None
            if found is not None:
                return found
        return ANONYMOUS

    async def call(self, payload: bytes, api: str) -> bytes | memoryview:
        """ksi's own request on this client's broker connection (the history router's forwarded parts and
        probes), counted by the observers like the client's own traffic."""
        upstream = await self._upstream_connection()
        sent_at = self._now()
        pending = await upstream.send(payload, api, internal=True)
        assert pending is not None
        for observer in self._observers:
            observer.proxy_to_server(api, len(payload) + 4)
        raw = await pending.wait()
        self.backlog.release(pending.size)
        for observer in self._observers:
            observer.server_to_proxy(api, len(raw) + 4, self._now() - sent_at)
        return raw

    # -- lifecycle ---------------------------------------------------------------------------

    async def serve(self) -> None:
        CONNECTIONS.labels(self.listener).inc()
        CONNECTIONS_ACTIVE.labels(self.listener).inc()
        self.ctx.connections.add(self)
        log.debug("%s connected", self)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._guard, self._answer_loop)
                nursery.start_soon(self._guard, self._watchdog)
                await self._guard(self._read_loop)
        finally:
            self.ctx.connections.discard(self)
            CONNECTIONS_ACTIVE.labels(self.listener).dec()
            if self._upstream is not None:
                await self._upstream.aclose()
            self._unread.close()
            with trio.CancelScope(shield=True):
                await self.stream.aclose()
            self._log_end()

    def _log_end(self) -> None:
        error = self._error
        if error is None or isinstance(error, ClientGone):
            log.debug("%s disconnected", self)
        elif isinstance(error, AgedOut):
            log.debug("%s: %s; closed between requests so the client reconnects", self, error)
        elif isinstance(error, Refused):
            log.warning("%s: %s; closing the connection", self, error)
        elif isinstance(error, UpstreamError):
            # While a broker stays unreachable only the first refused connection is a warning; the
            # reconnects that follow are debug lines until a connection succeeds (logged with a count).
            (log.debug if self._quiet else log.warning)("%s: %s; closing the client connection so it reconnects",
                                                        self, error)
        else:
            log.error("%s: closing the connection after an unexpected error", self, exc_info=error)

    async def _guard(self, task: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run a task; its first failure is recorded and ends the whole connection."""
        try:
            await task(*args)
        except Exception as exc:  # noqa: BLE001 - the first failure of either task ends the connection; run() reports it
            if self._error is None:
                self._error = exc
                if isinstance(exc, Refused):
                    CLIENT_ERRORS.labels(exc.kind).inc()
            self._end()

    def _end(self) -> None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    # -- reading requests ----------------------------------------------------------------------

    async def _read_loop(self) -> None:
        config = self.ctx.config.proxy
        reader = self._reader = FrameReader(config.max_frame_bytes)
        try:
            with self.read_scope:
                if self.ctx.draining.is_set():
                    return
                stream, now = self.stream, self._now
                drained = False  # the last read was short: wait for the socket before the next one
                splices = rawio.can_splice(stream)
                while True:
                    # Between frames, a read no larger than a frame's head when large frames may be spliced:
                    # the rest of a large one is then left in the socket for the splice.
                    chunk = READ_CHUNK if not splices or reader.buffered else rawio.SPLICE_MIN_BYTES
                    try:
                        data = await rawio.receive_some(stream, chunk, wait_first=drained)
                    except trio.BrokenResourceError as exc:
                        if isinstance(exc.__cause__, ssl.SSLError):
                            raise Refused("tls", f"TLS failed: {exc.__cause__}") from None
                        raise ClientGone(str(exc)) from None
                    except (trio.ClosedResourceError, OSError) as exc:
                        raise ClientGone(str(exc)) from None
                    if not data:
                        if reader.buffered:
                            raise ClientGone(f"client closed mid-request ({reader.buffered} bytes unread)")
                        return
                    drained = len(data) < chunk
                    arrived = self._last_seen = now()
                    reader.receive_data(data)
                    while True:
                        try:
                            frame = reader.next_sized()
                        except FrameTooLarge as exc:
                            await self._close_after(Refused("too_large", f"{exc} (proxy.max_frame_bytes)"))
                            return
                        rest = 0
                        if frame is None:
                            if not splices or reader.partial_size is None or not self._forwards_unread(reader):
                                break
                            frame, rest = reader.take_partial()
                            drained = False  # what follows the frame may be in the socket already
                        self._handling = True
                        try:
                            if not await self._handle(frame, arrived, rest):
                                return
                        except rawio.SourceEnded as exc:
                            raise ClientGone(f"client closed mid-request: {exc}") from None
                        finally:
                            self._handling = False
                        while len(self._slots) >= MAX_IN_FLIGHT:
                            self._room = trio.Event()
                            await self._room.wait()
            # Draining: the read scope was cancelled; responses already queued still go out.
        finally:
            self._reading_done = True
            if not self._slots:
                self._end()

    async def _close_after(self, refusal: Refused) -> None:
        """End the connection once the requests before this point are answered (Kafka answers them first:
        it reads the next request only after answering the last)."""
        slot = Slot(RequestHeader(-1, -1, -1, None, None), "-", self._now())
        slot.error = refusal
        self._slots.append(slot)
        await self._drain()

    def _forwards_unread(self, reader: FrameReader) -> bool:
        """Whether the request whose first bytes ``reader`` holds may go to the broker with its rest spliced on
        unread: the rest is at least ``rawio.SPLICE_MIN_BYTES``, the broker connection is open and a socket,
        and every filter on the request's route passes it on without reading it (see
        :meth:`Filter.forwards_unread`), none of them looking at its response to hand it to ksi."""
        head = reader.peek()
        assert reader.partial_size is not None
        if 4 + reader.partial_size - len(head) < rawio.SPLICE_MIN_BYTES:
            return False
        upstream = self._upstream
        if upstream is None or not upstream.splices_from(self.stream):
            return False
        view = memoryview(head)[4:]
        try:
            header = parse_request_header(view)
            entry = api(header.api_key)
            if entry is None or not entry.min_version <= header.api_version <= entry.max_version:
                return False  # refused: read whole, as before
            if header.api_key == ApiKey.Produce:
                produce_acks(view, header)
        except (ProtocolError, IndexError, struct.error):
            return False
        finally:
            view.release()
        route = self.chain.route(header.api_key, header.api_version)
        if route.untouched:
            return True
        return not route.response_defers and all(f.forwards_unread(header) for _, f in route.request)

    async def _handle(self, frame: bytearray, now: float, rest: int = 0) -> bool:
        """Route one request frame (size prefix included), read at ``now``; False when it ends the connection.
        ``rest``: ``frame`` is the request's first bytes, and the next ``rest`` bytes in the client's stream are
        spliced on after them (see :meth:`_forwards_unread`)."""
        view = memoryview(frame)[4:]
        try:
            header = parse_request_header(view)
        except ProtocolError as exc:
            await self._close_after(Refused("malformed", f"malformed request header: {exc}"))
            return False
        self.client_id = header.client_id
        entry = api(header.api_key)
        name = entry.name if entry is not None else "unknown"  # one series for all unknown keys
        for observer in self._observers:
            observer.client_to_proxy(name, len(frame) + rest)
        if entry is None:
            await self._close_after(Refused("unsupported_api", f"API key {header.api_key} v{header.api_version}"
                                             " is not supported by ksi (it is not offered in ApiVersions)"))
            return False
        version = header.api_version
        if not entry.min_version <= version <= entry.max_version and header.api_key != ApiKey.ApiVersions:
            await self._close_after(Refused("unsupported_version", f"{name} v{version} is newer than ksi"
                                             f" supports (max v{entry.max_version})"))
            return False
        expects_response = True
        if header.api_key == ApiKey.Produce:
            try:
                expects_response = produce_acks(view, header) != 0
            except ProtocolError as exc:
                await self._close_after(Refused("malformed", f"malformed {name} v{version} request: {exc}"))
                return False
        route = self.chain.route(header.api_key, version)
        if route.untouched or rest:
            # No filter wants it (or none needs to read it: _forwards_unread): the bytes go on with only the
            # correlation id changed.
            slot = None
            if expects_response:
                slot = Slot(header, name, now)
                slot.filters = route.response
                self._slots.append(slot)
            await self._forward(frame, slot, name, rest)
            return True

        request = Request(view, header, entry, expects_response)
        action: Action | None = None
        position = len(self.chain.filters)
        for position, request_filter in route.request:  # noqa: B007 - read after the loop: who answered
            try:
                action = request_filter.on_request(request, self)
            except ProtocolError as exc:  # the body does not decode: Kafka closes the connection
                action = Close("malformed", f"malformed {name} v{version} request: {exc}")
            except Exception:  # a filter's fault: Kafka answers UNKNOWN_SERVER_ERROR
                log.exception("%s: the %s filter failed on %s v%d", self, request_filter.name, name, version)
                payload = self._error_answer(request, UNKNOWN_SERVER_ERROR)
                action = Answer(payload) if payload is not None else Close("internal", f"{name} v{version}"
                                                                           " could not be handled")
            if action is not None:
                break
        if action is None or (isinstance(action, Close) and action.after_forward):
            if request.changed:
                frame = size_prefixed(request.frame)
            slot = None
            if expects_response:
                slot = Slot(header, name, now)
                slot.filters = route.response
                if route.response_defers:
                    slot.request = request  # a response filter may hand it to ksi instead (see _redo)
                self._slots.append(slot)
            await self._forward(frame, slot, name)
        if action is None:
            return True
        if isinstance(action, Close):
            await self._close_after(Refused(action.kind, action.message))
            return False
        slot = Slot(header, name, now)
        slot.filters = route.response_before(position)
        self._slots.append(slot)
        if isinstance(action, Defer):
            slot.handler, slot.request = action.handler, request
            await self._drain()  # starts it at once if it is at the head
        else:
            await self._complete(slot, action.payload, from_broker=False)
        return True

    def _error_answer(self, request: Request, code: int) -> bytes | None:
        """Kafka's error response to ``request`` (``code`` per partition or topic), or None if there is none."""
        header = request.header
        try:
            body = error_response(header.api_key, header.api_version, request.message, code)
        except ProtocolError:
            return None
        if body is None:
            return None
        return encode_response_header(0, request.api.response_header_version(header.api_version)) + body

    async def _forward(self, frame: bytearray, slot: Slot | None, name: str, rest: int = 0) -> None:
        """Send ``frame`` to the broker (and the next ``rest`` bytes of the client's stream, spliced).  The
        broker's latency is measured from the request's arrival (the microseconds of routing are not worth a
        clock read per request), or from when the broker connection was made if this request made it."""
        upstream = self._upstream
        if upstream is None:
            upstream = await self._upstream_connection()
            if slot is not None:
                slot.sent_at = self._now()
        for observer in self._observers:
            observer.proxy_to_server(name, len(frame) + rest)
        if rest:
            await upstream.forward(frame, slot, name, rest, self.stream)
        else:
            await upstream.forward(frame, slot, name)

    async def _upstream_connection(self) -> UpstreamConnection:
        if self._upstream is None:
            targets = self._targets()
            if not targets:
                raise UpstreamError(f"no address known for the broker behind {self.listener}")
            backoff = self.ctx.backoffs.setdefault(tuple(targets), ConnectBackoff())
            try:
                stream, address = await self.ctx.connect(targets, self.ctx.config.upstream.connect_timeout_seconds,
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
            self._upstream = UpstreamConnection(stream, address, self.ctx.config.proxy.max_frame_bytes, self.backlog,
                                                self._deliver, self._relays_unread, self._relay)
            assert self._nursery is not None
            self._nursery.start_soon(self._guard, self._upstream.run)
            log.debug("%s: connected upstream to %s", self, address)
        return self._upstream

    # -- responses -------------------------------------------------------------------------------

    async def _deliver(self, slot: Slot, frame: bytearray) -> None:
        """The broker's response to a forwarded request (size prefix included), in the broker reader's task."""
        slot.size = size = len(frame)
        if self._observers:
            seconds = self._now() - slot.sent_at
            for observer in self._observers:
                observer.server_to_proxy(slot.name, size, seconds)
        if slot.filters:
            await self._complete(slot, memoryview(frame)[4:], from_broker=True, framed=frame)
            return
        _INT32.pack_into(frame, 4, slot.header.correlation_id)
        slot.out = frame
        if self._slots and self._slots[0] is slot:
            await self._drain()

    def _relays_unread(self, slot: Slot, head: bytearray, rest: int) -> bool:
        """Whether the broker's response to ``slot`` (``head`` read, ``rest`` bytes to come) may go to the client
        now with its rest unread: its slot is at the head of the queue, nothing is being written, and the
        relay accepts it (:meth:`UnreadRelay.accepts`).  Else it is read whole."""
        if self._writing or not self._slots or self._slots[0] is not slot:
            return False
        return self._unread.accepts(slot, head, rest)

    async def _relay(self, slot: Slot, head: bytearray, rest: int, source: trio.abc.Stream) -> None:
        """Write the broker's response to ``slot`` (at the head of the queue: :meth:`_relays_unread`): ``head``
        with the client's correlation id, then the next ``rest`` bytes of the broker's ``source``, unread.  In
        the broker reader's task, as :meth:`_deliver`; a broken broker stream raises rawio.SourceEnded (the
        reader turns it into UpstreamError), a broken client stream ClientGone."""
        size = len(head) + rest
        observers = self._observers
        if observers:
            seconds = self._now() - slot.sent_at
            for observer in observers:
                observer.server_to_proxy(slot.name, size, seconds)
        _INT32.pack_into(head, 4, slot.header.correlation_id)
        slot.request = None
        self._writing = True
        try:
            try:
                spliced = await self._unread.relay(  # the name only for a walk's log, as before the split
                    head, rest, source, lambda: f"{self}: {slot.name} v{slot.header.api_version} response")
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise ClientGone(str(exc)) from None
            SPLICED_TO_CLIENT.inc(spliced)
            self._written(slot, size, None)
        finally:
            self._writing = False
        await self._drain()  # the completed slots behind it, and the connection's end if it was the last

    async def _complete(self, slot: Slot, payload: bytes | bytearray | memoryview | Spliced,
                        from_broker: bool, framed: bytearray | None = None) -> None:
        """Pass a response (no size prefix) back through the slot's response filters, then queue it.
        ``framed``: the broker's frame ``payload`` is a view of, sent as it is (correlation id patched) if no
        filter changed the response."""
        if isinstance(payload, Spliced):  # final (see Spliced): framed as its buffers, the first one patched
            head = bytearray(_INT32.pack(payload.nbytes)) + payload[0]
            _INT32.pack_into(head, 4, slot.header.correlation_id)
            slot.out = [head, *payload[1:]]
            if self._slots and self._slots[0] is slot:
                await self._drain()
            return
        if slot.filters:
            entry = api(slot.header.api_key)
            assert entry is not None
            response = Response(payload, slot.header, entry, from_broker, slot.request)
            try:
                for position, response_filter in slot.filters:
                    deferred = await response_filter.on_response(response, self)
                    if deferred is not None:
                        await self._redo(slot, deferred, position)
                        return
            except (ProtocolError, ValueError, IndexError, EOFError, struct.error) as exc:
                raise UpstreamError(f"cannot decode the broker's {slot.name} v{slot.header.api_version}"
                                    f" response: {exc}") from None
            if response.frame is not payload:
                framed, payload = None, response.frame
        out = framed if framed is not None else size_prefixed(payload)
        _INT32.pack_into(out, 4, slot.header.correlation_id)
        slot.out = out
        if self._slots and self._slots[0] is slot:
            await self._drain()

    async def _redo(self, slot: Slot, action: Defer, position: int) -> None:
        """The filter at ``position`` handed a forwarded request to ksi on seeing the broker's response (see
        :meth:`Filter.on_response`): that response is dropped, and ksi answers the request when its slot's
        turn comes, its answer passing back through the filters in front of that one."""
        assert slot.request is not None and slot.handler is None
        if slot.size:
            self.backlog.release(slot.size)
            slot.size = 0
        slot.handler = action.handler
        slot.filters = tuple(item for item in slot.filters if item[0] < position)
        if self._slots and self._slots[0] is slot:
            await self._drain()

    def _written(self, slot: Slot, size: int, now: float | None) -> float | None:
        """``slot``'s response (``size`` bytes, counted for the observers) is out, written whole or spliced:
        the slot leaves the queue, its share of the backlog is released, the observers are told and a reader
        waiting for room is woken.  ``now``: the clock as read for this drain (once per drain: the slots it
        writes leave together), read here when an observer needs it and it is None; returned."""
        self._slots.popleft()
        if slot.size:
            backlog = self.backlog
            backlog.bytes -= slot.size
            if backlog.waiting is not None:
                backlog.wake()
        observers = self._observers
        if observers:
            if now is None:
                now = self._now()
            for observer in observers:
                observer.proxy_to_client(slot.name, size, now - slot.arrived)
        if self._room is not None:
            self._room.set()
            self._room = None
        return now

    async def _drain(self) -> None:
        """Write the completed slots at the head of the queue, in order.  One task writes at a time; a slot
        completed meanwhile is picked up by the writing task before it stops."""
        if self._writing:
            return
        self._writing = True
        slots, observers = self._slots, self._observers
        now = None
        try:
            while slots:
                slot = slots[0]
                out = slot.out
                if out is None:
                    if slot.error is not None:
                        raise slot.error
                    if slot.handler is not None and not slot.started:
                        slot.started = True
                        self._turn.set()
                    break
                try:
                    if isinstance(out, list):
                        await rawio.send_parts(self.stream, out)
                    else:
                        await rawio.send_all(self.stream, out)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    raise ClientGone(str(exc)) from None
                size = (sum(len(part) for part in out) if isinstance(out, list) else len(out)) if observers else 0
                now = self._written(slot, size, now)
        finally:
            self._writing = False
        if not slots and self._reading_done:
            self._end()  # the reader finished and every queued response is out
        elif not slots and self._max_age != math.inf and self._aged_out():
            self._retire()

    async def _answer_loop(self) -> None:
        """Answer the requests ksi answers itself, each when its slot reaches the head of the queue."""
        while True:
            await self._turn.wait()
            self._turn = trio.Event()
            slot = self._slots[0]
            request = slot.request
            assert request is not None and slot.handler is not None
            header = request.header
            try:
                payload = await slot.handler(header, request.frame, self, str(self))
            except ProtocolError as exc:  # the request did not decode: Kafka closes the connection
                slot.error = Refused("malformed", f"malformed {slot.name} v{header.api_version} request: {exc}")
                await self._drain()
                continue
            except (UpstreamError, trio.Cancelled):
                raise
            except Exception:  # what Kafka's KafkaApis.handle does: answer UNKNOWN_SERVER_ERROR
                log.exception("%s: %s v%d failed", self, slot.name, header.api_version)
                answer = self._error_answer(request, UNKNOWN_SERVER_ERROR)
                if answer is None:
                    raise
                payload = answer
            finally:
                slot.request = None
            if isinstance(payload, Forward):
                await self._forward_after_all(slot, request, payload)
                continue
            await self._complete(slot, payload, from_broker=False)

    async def _forward_after_all(self, slot: Slot, request: Request, forward: Forward) -> None:
        """A deferred request its handler handed back (:class:`Forward`): sent to the broker now, at the head of
        the queue, and its response comes back as a forwarded request's, through its route's response filters
        (so that it may be relayed unread)."""
        header = request.header
        if forward.frame is not request.frame:
            request.replace(bytes(forward.frame))
        request.notes = {**(request.notes or {}), **forward.notes}
        route = self.chain.route(header.api_key, header.api_version)
        slot.handler, slot.started = None, False  # a response filter's Defer starts it again (see _redo)
        slot.filters = route.response
        if route.response_defers:
            slot.request = request  # a response filter may hand it to ksi again (see _redo)
        slot.sent_at = self._now()
        await self._forward(size_prefixed(request.frame), slot, slot.name)

    # -- connection max age (proxy.connection_max_age_seconds) ---------------------------------------

    def _aged_out(self) -> bool:
        """Older than its max age and between requests: no response owed (no slot), no request being
        routed, no partial frame read and no unread bytes in the socket, so closing loses nothing.  Checked
        as the last owed response is written (the client cannot have sent a request that depends on it
        yet) and by the watchdog (a connection with no traffic)."""
        if self._reading_done or self._slots or self._handling:
            return False
        if self._now() - self._opened < self._max_age:
            return False
        if self._reader is not None and self._reader.buffered:
            return False
        return not rawio.unread_bytes(self.stream)

    def _retire(self) -> None:
        if self._error is None:
            self._error = AgedOut(f"connection open for {self._now() - self._opened:.0f} s"
                                   " (proxy.connection_max_age_seconds)")
            CONNECTIONS_AGED_OUT.labels(self.listener).inc()
        self._end()

    async def _watchdog(self) -> None:
        """Close a connection whose oldest request has waited past ``proxy.request_timeout_seconds``, or that
        sent nothing for ``proxy.idle_timeout_seconds`` with nothing in flight (Kafka's
        ``connections.max.idle.ms``), or that is past its max age between requests.  Checked every eighth
        of the shortest one, not per request."""
        config = self.ctx.config.proxy
        timeout, idle = config.request_timeout_seconds, config.idle_timeout_seconds
        period = max(min(timeout, idle, self._max_age) / 8, 0.001)
        while True:
            await trio.sleep(period)
            now = self._now()
            if self._slots:
                head = self._slots[0]
                if now - head.arrived > timeout and head.error is None:
                    raise UpstreamError(f"no response to {head.name} within {timeout:g} s"
                                        " (proxy.request_timeout_seconds)")
            elif not self._reading_done and now - self._last_seen > idle:
                raise Refused("idle", f"no request for {idle:g} s")
            elif self._aged_out():
                self._retire()
