"""One connection from ksi to a Kafka broker.

Requests go out with ksi's own correlation ids; a reader task matches each response to its
:class:`Pending` by id.  Brokers answer in order, but matching by id keeps ksi correct if it ever
interleaves requests of its own.  When the broker closes the connection every pending request fails
with :class:`UpstreamError`, and the client connection that owns this upstream closes too: a Kafka
client reconnects and retries, which is exactly what it would do had the broker itself gone away.
"""

from __future__ import annotations

import logging
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from kafka.protocol.api_message import ApiMessage

from protocol import (
    FrameReader,
    MalformedFrame,
    ProtocolError,
    decode_body,
    reframe,
    response_body_offset,
)

from . import rawio
from .config import Config, HostPort
from .metrics import SPLICED_TO_SERVER, UPSTREAM_ERRORS
from .tls import client_context

__all__ = ["Backlog", "ConnectBackoff", "Pending", "UpstreamConnection", "UpstreamError", "connect", "decode_response"]

log = logging.getLogger("ksi.upstream")

READ_CHUNK = 256 * 1024


class UpstreamError(Exception):
    """The broker could not be reached, or went away with requests in flight."""


class ConnectBackoff:
    """Backoff for connections to one broker, shared by every client connection that needs it.

    ksi accepts a client's TCP connection before it connects upstream, so while the broker refuses
    connections a client sees "connected, then closed" instead of "refused", and reconnects at once
    (its own reconnect backoff restarts after every successful connect): a tight loop of client
    connections, each one a connection attempt to the broker and a log line.  So after a failed attempt
    the client connection is closed only after a delay, 100 ms doubling to 2 s while the broker stays
    unreachable, which bounds each client to about one reconnect per delay, as if it were backing off.
    """

    INITIAL_SECONDS = 0.1
    MAX_SECONDS = 2.0

    def __init__(self) -> None:
        self.failures = 0
        self._delay = 0.0

    def failed(self) -> float:
        """Record a failed attempt; the delay before the client connection closes."""
        self.failures += 1
        self._delay = min(max(self._delay * 2, self.INITIAL_SECONDS), self.MAX_SECONDS)
        return self._delay

    def succeeded(self) -> int:
        """Record a successful attempt; how many had failed before it."""
        failures, self.failures, self._delay = self.failures, 0, 0.0
        return failures


def decode_response(cls: type[ApiMessage], version: int, raw: bytes | memoryview,
                    header_version: int) -> ApiMessage:
    """Decode a broker's response frame (correlation id first).  Bytes that are not that response are the
    broker's fault: :class:`UpstreamError`, which closes the client connection it came on."""
    try:
        return decode_body(cls, version, raw[response_body_offset(raw, header_version):])
    except ProtocolError as exc:
        UPSTREAM_ERRORS.labels("protocol").inc()
        raise UpstreamError(f"cannot decode the broker's {cls.name} v{version}: {exc}") from None


class Pending:
    """A request sent to the broker, waiting for its response."""

    __slots__ = ("_error", "_event", "_value", "api", "internal", "sent_at", "size")

    def __init__(self, api: str, internal: bool = False) -> None:
        self._event = trio.Event()
        self._value: bytes | memoryview | None = None
        self._error: BaseException | None = None
        self.api = api
        self.sent_at = time.perf_counter()
        self.size = 0              # bytes of the response, once it arrived
        self.internal = internal   # ksi's own request (the history router's), not a client's

    def set(self, value: bytes | memoryview) -> None:
        self._value = value
        self.size = len(value)
        self._event.set()

    def fail(self, error: BaseException) -> None:
        if not self._event.is_set():
            self._error = error
            self._event.set()

    async def wait(self) -> bytes | memoryview:
        await self._event.wait()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


class Backlog:
    """Bytes of broker responses that a client connection has read from its broker connection and not yet
    written to its client (or handed to ksi's own requests).  While over ``limit``, ksi reads no more from
    that broker connection, so a client that does not read leaves its responses in the broker's socket
    buffers, not in ksi's memory.  (Kafka brokers bound a connection the same way: one request at a time.)

    The hot path adds to and subtracts from ``bytes`` itself and calls :meth:`wake` only when ``waiting``."""

    __slots__ = ("bytes", "limit", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self.waiting: trio.Event | None = None  # only while the reader waits: no Event per release

    @property
    def over(self) -> bool:
        return self.bytes > self.limit

    def add(self, size: int) -> None:
        self.bytes += size

    def release(self, size: int) -> None:
        self.bytes -= size
        if self.waiting is not None:
            self.wake()

    def wake(self) -> None:
        if self.waiting is not None:
            self.waiting.set()
            self.waiting = None

    async def changed(self) -> None:
        if self.waiting is None:
            self.waiting = trio.Event()
        await self.waiting.wait()


def upstream_tls(config: Config) -> ssl.SSLContext | None:
    """The TLS context for connections to the cluster (``[upstream.tls]``), or None for plaintext."""
    return client_context(config.upstream.tls) if config.upstream.tls is not None else None


async def connect(addresses: tuple[HostPort, ...] | list[HostPort], timeout: float,  # noqa: ASYNC109 - per address
                  ssl_context: ssl.SSLContext | None = None) -> tuple[trio.abc.Stream, HostPort]:
    """Open a TCP (or, with ``ssl_context``, TLS) stream to the first of ``addresses`` that answers."""
    errors = []
    for address in addresses:
        try:
            with trio.fail_after(timeout):
                stream: trio.abc.Stream = await trio.open_tcp_stream(address.host, address.port)
                if ssl_context is not None:
                    tls = trio.SSLStream(stream, ssl_context, server_hostname=address.host)
                    try:
                        await tls.do_handshake()
                    except BaseException:
                        await trio.aclose_forcefully(stream)
                        raise
                    stream = tls
            return stream, address
        except trio.BrokenResourceError as exc:
            errors.append(f"{address}: TLS handshake failed: {exc.__cause__ or exc}")
        except (OSError, trio.TooSlowError) as exc:
            errors.append(f"{address}: {exc or 'timed out'}")
    UPSTREAM_ERRORS.labels("connect").inc()
    raise UpstreamError("cannot reach the Kafka cluster (" + "; ".join(errors) + ")")


_INT32 = struct.Struct(">i")

# A client's forwarded request: gets the broker's response frame (size prefix included, correlation id
# still ksi's) or the error that ended the broker connection.
Deliver = Callable[[Any, bytearray], Awaitable[None]]
# A large response only partly read (``head``, size prefix included; ``rest`` bytes still in the socket):
# ``relays(target, head, rest)`` says whether the client connection takes it so now, and ``relay(target, head,
# rest, stream)`` writes the head and splices the rest from ``stream`` (in the reading task).
Relays = Callable[[Any, bytearray, int], bool]
Relay = Callable[[Any, bytearray, int, trio.abc.Stream], Awaitable[None]]


class UpstreamConnection:
    """Owns a stream to one broker; run :meth:`run` in a nursery to read responses.

    Two kinds of request share it: ksi's own (:meth:`send`, answered through a :class:`Pending`) and the
    client's forwarded frames (:meth:`forward`, whose responses go to ``deliver`` with the target the
    caller gave, in the reading task: no hop to another task)."""

    def __init__(self, stream: trio.abc.Stream, address: HostPort, max_frame_bytes: int,
                 backlog: Backlog | None = None, deliver: Deliver | None = None,
                 relays: Relays | None = None, relay: Relay | None = None) -> None:
        self.stream = stream
        rawio.relay_socket(stream)
        # Large frames relayed unread, through a pipe (rawio.splice): responses when the client connection
        # says so (``relays``), requests when ``forward`` is given the stream to take the rest from.
        self._relays = relays if relay is not None and rawio.can_splice(stream) else None
        self._relay = relay
        self._pipe: rawio.Pipe | None = None  # requests' pipe, opened on first use
        self.address = address
        self._reader = FrameReader(max_frame_bytes)
        self._backlog = backlog
        self._deliver = deliver
        self._internal = 0  # ksi's own requests awaiting an answer: never held back by the backlog
        self._pending: dict[int, Any] = {}  # correlation id -> Pending, or a forwarded request's target
        self._next_id = 0
        # One frame is written at a time (a write that blocks must not be interleaved with another): the
        # task whose turn it is has ``_sending``; the others park and are handed the turn in order.  (trio's
        # StrictFIFOLock does the same with a parking-lot breaker and an owner check per acquire: eight
        # calls on every forwarded request.)
        self._sending = False
        self._send_turn = trio.lowlevel.ParkingLot()
        self._closed: UpstreamError | None = None

    def _allocate_id(self) -> int:
        self._next_id = (self._next_id + 1) & 0x7FFFFFFF
        return self._next_id

    async def send(self, request: bytes | memoryview, api: str, expect_response: bool = True,
                   internal: bool = False) -> Pending | None:
        """Send a request frame (without size prefix); its correlation id is replaced by ksi's own.

        ``internal``: ksi's own request, whose answer a client's response waits for; the responses ahead
        of it are read whatever the backlog, or the connection would wait on itself."""
        if self._closed is not None:
            raise self._closed
        correlation_id = self._allocate_id()
        pending = Pending(api, internal) if expect_response else None
        if pending is not None:
            self._pending[correlation_id] = pending
            if internal:
                self._internal += 1
                if self._backlog is not None:
                    self._backlog.wake()
        await self._send(b"".join(reframe(request, 4, correlation_id)), api)
        return pending

    def splices_from(self, stream: trio.abc.Stream) -> bool:
        """Whether :meth:`forward` can splice a request's rest from ``stream`` to the broker (its pipe is opened
        on first use; without one, requests are read whole)."""
        if self._closed is not None or not rawio.can_splice(stream, self.stream):
            return False
        if self._pipe is None:
            self._pipe = rawio.Pipe.open()
        return self._pipe is not None

    async def forward(self, frame: bytearray, target: Any, api: str, rest: int = 0,
                      source: trio.abc.Stream | None = None) -> None:
        """Send a client's request ``frame`` (size prefix included) with ksi's correlation id written into it
        in place; ``target`` (None: no response expected) is handed to ``deliver`` with the response.
        ``rest``: ``frame`` is only the request's first bytes, and the next ``rest`` bytes of ``source`` (see
        :meth:`splices_from`) are spliced after it, unread; :class:`rawio.SourceEnded` if ``source`` ends
        first."""
        if self._closed is not None:
            raise self._closed
        correlation_id = self._next_id = (self._next_id + 1) & 0x7FFFFFFF
        if target is not None:
            self._pending[correlation_id] = target
        _INT32.pack_into(frame, 8, correlation_id)
        await self._send(frame, api, rest, source)

    async def _send(self, data: bytes | bytearray | memoryview, api: str, rest: int = 0,
                    source: trio.abc.Stream | None = None) -> None:
        if self._sending:
            await self._send_turn.park()  # woken with the turn (``_sending`` stays set)
        else:
            self._sending = True
        try:
            await rawio.send_all(self.stream, data)
            if rest:
                assert source is not None and self._pipe is not None  # see splices_from
                try:
                    await rawio.splice(source, self.stream, rest, self._pipe)
                    SPLICED_TO_SERVER.inc(rest)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    raise
                except BaseException:
                    # The client's stream ended (SourceEnded), or the splice was cancelled, part way: the
                    # broker has part of a frame, so nothing more may be written on this connection.
                    self._close_all(UpstreamError(f"connection to broker {self.address}: {api} request cut off"
                                                  " mid-frame"), "closed")
                    raise
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            error = UpstreamError(f"broker {self.address} connection lost while sending {api}: {exc}")
            self._close_all(error, "closed")
            raise error from None
        finally:
            if self._send_turn:
                self._send_turn.unpark()  # the turn passes to the task that waited longest
            else:
                self._sending = False

    async def run(self) -> None:
        """Read responses until the broker closes the connection (then raise UpstreamError)."""
        error: UpstreamError
        drained = False  # the last read was short: the socket is empty, wait for it before reading again
        backlog, reader, deliver = self._backlog, self._reader, self._deliver
        try:
            while True:
                while backlog is not None and backlog.bytes > backlog.limit and not self._internal:
                    await backlog.changed()
                # Between frames, a read no larger than a frame's head when large responses may be spliced.
                chunk = READ_CHUNK if self._relays is None or reader.buffered else rawio.SPLICE_MIN_BYTES
                data = await rawio.receive_some(self.stream, chunk, wait_first=drained)
                drained = len(data) < chunk
                if not data:
                    error = UpstreamError(f"broker {self.address} closed the connection"
                                          f" with {len(self._pending)} request(s) in flight")
                    break
                reader.receive_data(data)
                while True:
                    response = reader.next_sized()
                    if response is None:
                        if self._relays is not None and reader.partial_size is not None \
                                and await self._relayed(reader):
                            drained = False  # the next frame may be in the socket already
                        break
                    if len(response) < 8:
                        raise MalformedFrame(f"response of {len(response) - 4} bytes has no correlation id")
                    target = self._pending.pop(_INT32.unpack_from(response, 4)[0], None)
                    if type(target) is Pending:
                        self._arrived(target, memoryview(response)[4:])
                    elif target is None:
                        unknown = _INT32.unpack_from(response, 4)[0]
                        raise MalformedFrame(f"response with unknown correlation id {unknown}")
                    else:
                        assert deliver is not None
                        if backlog is not None:
                            backlog.bytes += len(response)
                        await deliver(target, response)
        except ProtocolError as exc:
            error = UpstreamError(f"broker {self.address} sent an invalid frame: {exc}")
            UPSTREAM_ERRORS.labels("protocol").inc()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, rawio.SourceEnded) as exc:
            error = UpstreamError(f"broker {self.address} connection lost: {exc}")
        self._close_all(error, "closed")
        raise error

    async def _relayed(self, reader: FrameReader) -> bool:
        """A response whose first bytes have been read: relayed to its client with the rest spliced on unread,
        when the rest is at least ``rawio.SPLICE_MIN_BYTES`` and the client connection takes it so now
        (True); else False, and it is read whole."""
        head = reader.peek()
        assert reader.partial_size is not None and self._relay is not None and self._relays is not None
        rest = 4 + reader.partial_size - len(head)
        if rest < rawio.SPLICE_MIN_BYTES or len(head) < 8:
            return False
        correlation_id = _INT32.unpack_from(head, 4)[0]
        target = self._pending.get(correlation_id)
        if target is None or type(target) is Pending or not self._relays(target, head, rest):
            return False
        del self._pending[correlation_id]
        head, rest = reader.take_partial()
        await self._relay(target, head, rest, self.stream)
        return True

    def _arrived(self, pending: Pending, response: bytes | memoryview) -> None:
        if pending.internal:
            self._internal -= 1
        if self._backlog is not None:
            self._backlog.add(len(response))
        pending.set(response)

    def _close_all(self, error: UpstreamError, kind: str) -> None:
        if self._closed is None:
            self._closed = error
            if self._pending:
                UPSTREAM_ERRORS.labels(kind).inc()
        pending, self._pending = self._pending, {}
        for item in pending.values():
            item.fail(error)

    async def aclose(self) -> None:
        self._close_all(UpstreamError(f"connection to broker {self.address} closed by ksi"), "closed")
        if self._pipe is not None:
            self._pipe.close()
        await self.stream.aclose()
