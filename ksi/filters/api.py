"""The filter API: one class per concern on the request path, in the manner of Kroxylicious's
``kroxylicious-api`` (``RequestFilter.shouldHandleRequest``/``onRequest``, ``ResponseFilter``...).

A filter declares the (API key, version) pairs it intercepts with :meth:`Filter.wants_request` and
:meth:`Filter.wants_response`; the chain asks once per pair and remembers, so a request no filter wants is
forwarded as its bytes with only the correlation id changed, and its response comes back the same way.

* :meth:`Filter.on_request` sees a :class:`Request`: the raw frame (``frame``, ``header``) always, the decoded
  message (``message``) only when it asks for it (decoded once, shared by the filters after it).  It returns
  ``None`` to pass the request on (a filter that changed it calls :meth:`Request.replace`), or an action:
  :class:`Answer` (ksi answers at once), :class:`Defer` (ksi answers when the request's turn comes, one at
  a time per connection, as a broker works) or :class:`Close` (the connection ends after the responses
  before it are written, where Kafka's broker would close it).
* :meth:`Filter.on_response` sees a :class:`Response` on its way back (the broker's, or a filter's answer,
  which passes back through the filters before the one that answered), and may change it in place, or
  hand the request to ksi instead (:class:`Defer`), as if the filter had deferred it on its way in.

Filters are built once, from the config, and shared by every connection; what a filter keeps per
connection lives in the :class:`Session` it is handed.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from kafka.protocol.api_key import ApiKey
from kafka.protocol.api_message import ApiMessage

from protocol import Api, RequestHeader, decode_body, response_body_offset
from protocol.fetch_walk import Walk
from protocol.sasl import SaslObserver

__all__ = ["Action", "Answer", "Close", "Defer", "Filter", "Forward", "Handler", "Request", "Response", "Session",
           "Spliced"]

_INT32 = struct.Struct(">i")


class Session(Protocol):
    """One client connection as the filters see it: its per-connection state and its broker connection
    (the history router's ``Upstream``)."""

    marks: dict[Hashable, object]  # the history router's watermarks and refusals, kept per connection
    denied: set[str]           # lake-only topics already refused to this connection (logged once)
    sasl: SaslObserver         # the SASL exchange the client is in, as far as ksi watched it

    @property
    def principal(self) -> str:
        """Who the broker accepted the client as."""

    @property
    def description(self) -> str:
        """"client 127.0.0.1:5555 (rdkafka) on bootstrap", for log lines."""

    async def call(self, payload: bytes, api: str) -> bytes | memoryview:
        """Send ksi's own request (a frame without size prefix) on the client's broker connection."""


class Spliced(tuple[bytes | bytearray | memoryview, ...]):
    """A response answered by ksi as several buffers (response header and body, no size prefix), sent as
    they are, without joining them: a Fetch answered from the lake carries its record batches this way.  A
    spliced response is final: it names no broker endpoint, so no response filter needs to see it."""

    __slots__ = ()

    @property
    def nbytes(self) -> int:
        return sum(len(part) for part in self)


@dataclass(frozen=True, slots=True)
class Forward:
    """What a :class:`Defer` handler returns when the broker is to answer the request after all, as if no filter
    had stopped it: ``frame`` (a whole request frame with the same header, no size prefix) goes to the broker at
    the request's turn, and the response comes back as a forwarded request's does, through every response filter
    of its route (relayed unread when they let it: :meth:`Filter.relays_unread`).  ``notes`` are added to the
    request's (:attr:`Request.notes`).  Only the last filter that wants the request may hand it back: the request
    filters after the one that deferred it do not see it.  The history router does this with a Fetch that turned
    out to be the broker's alone once it had learnt the log starts, so that its records are spliced on, not read."""

    frame: bytes | bytearray | memoryview
    notes: dict[str, Any]


Handler = Callable[[RequestHeader, bytes | memoryview, Any, str], Awaitable[bytes | memoryview | Spliced | Forward]]


class Request:
    """A client's request on its way through the chain: ``frame`` is the request without its size prefix."""

    __slots__ = ("_message", "api", "changed", "expects_response", "frame", "header", "notes")

    def __init__(self, frame: bytes | bytearray | memoryview, header: RequestHeader, entry: Api,
                 expects_response: bool = True) -> None:
        self.frame = frame
        self.header = header
        self.api = entry
        self.expects_response = expects_response  # False only for a Produce with acks=0
        self._message: ApiMessage | None = None
        self.changed = False
        # What a filter noted for its on_response, by filter name (seen there as Response.request.notes when
        # a response filter of the request's route defers responses: see Filter.defers_responses)
        self.notes: dict[str, Any] | None = None

    @property
    def message(self) -> ApiMessage:
        """The decoded request body (decoded on first use; :class:`protocol.ProtocolError` if it does not)."""
        if self._message is None:
            assert self.header.body_offset is not None
            self._message = decode_body(self.api.request, self.header.api_version,
                                        memoryview(self.frame)[self.header.body_offset:])
        return self._message

    @property
    def decoded(self) -> bool:
        return self._message is not None

    def replace(self, frame: bytes) -> None:
        """Forward ``frame`` (a whole request frame with the same header, no size prefix) instead."""
        self.frame, self._message, self.changed = frame, None, True


class Response:
    """A response on its way back to the client: ``frame`` is correlation id, header tagged fields (flexible
    versions) and body, without size prefix.  The correlation id is set by the connection at the end."""

    __slots__ = ("_message", "api", "body_offset", "frame", "from_broker", "header", "request")

    def __init__(self, frame: bytes | bytearray | memoryview, header: RequestHeader, entry: Api,
                 from_broker: bool, request: Request | None = None) -> None:
        self.frame = frame
        self.header = header
        self.api = entry
        self.body_offset = -1
        self._message: ApiMessage | None = None
        self.from_broker = from_broker
        self.request = request  # the request it answers, when the connection kept it (else None)

    @property
    def offset(self) -> int:
        """Where the body starts (after the response header)."""
        if self.body_offset < 0:
            header, flexible_from = self.header, self.api.flexible_from
            if flexible_from is None or header.api_version < flexible_from or header.api_key == ApiKey.ApiVersions:
                self.body_offset = 4  # response header v0 (ApiVersions always: KIP-511)
            elif len(self.frame) > 4 and self.frame[4] == 0:
                self.body_offset = 5  # v1 without tagged fields: the usual case
            else:
                self.body_offset = response_body_offset(memoryview(self.frame), 1)
        return self.body_offset

    @property
    def body(self) -> memoryview:
        return memoryview(self.frame)[self.offset:]

    @property
    def message(self) -> ApiMessage:
        """The decoded response body (decoded on first use)."""
        if self._message is None:
            self._message = decode_body(self.api.response, self.header.api_version, self.body)
        return self._message

    def replace_body(self, body: bytes) -> None:
        """Send ``body`` after the response header instead of the body as it was."""
        self.frame = bytes(memoryview(self.frame)[:self.offset]) + body
        self._message = None

    def error_code(self) -> int:
        """The int16 right after the header (the top-level error code of most responses)."""
        return int(struct.unpack_from(">h", self.frame, self.offset)[0])


@dataclass(frozen=True, slots=True)
class Answer:
    """ksi answers the request itself, now: ``payload`` is the response header and body (any correlation
    id: the connection writes the client's)."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class Defer:
    """ksi answers the request when its turn comes: ``handler(header, frame, session, client)`` returns the
    response header and body (or :class:`Forward`)."""

    handler: Handler


@dataclass(frozen=True, slots=True)
class Close:
    """End the connection once the responses to the requests before this one are written, as Kafka's broker
    does (``kind`` labels ``ksi_client_errors_total``; ``message`` is the log line)."""

    kind: str
    message: str
    after_forward: bool = False  # forward the (changed) request first: an acks=0 Produce, partly refused


Action = Answer | Defer | Close


class Filter:
    """One concern on the request path.  Override what you need; the defaults intercept nothing."""

    name = "filter"

    def wants_request(self, api_key: int, api_version: int) -> bool:
        return False

    def wants_response(self, api_key: int, api_version: int) -> bool:
        return False

    def on_request(self, request: Request, session: Session) -> Action | None:
        return None

    async def on_response(self, response: Response, session: Session) -> Defer | None:
        """Change ``response`` in place, or return a :class:`Defer`: the broker's response cannot go back
        as it is and ksi answers the request itself when its turn comes (the history filter, on a hot
        Fetch the broker answered OFFSET_OUT_OF_RANGE)."""
        return None

    # A filter whose on_response may return a Defer: the connection keeps such requests until their response.
    defers_responses = False

    # -- large frames relayed unread (splice(2): docs/passthrough.md) ------------------------------------

    def forwards_unread(self, header: RequestHeader) -> bool:
        """Whether :meth:`on_request` passes this request on unchanged without looking past its header (a
        Produce's acks are read by the connection), so that ksi may forward the body of a large one as it
        arrives, unread.  The default: no, the request is read whole."""
        return False

    def relays_unread(self, response: Response, rest: int) -> bool:
        """Whether the broker's response may go to the client as its bytes when only its first bytes have
        been read (``response.frame``; ``rest`` more are still in the broker's socket and would be spliced
        on unread).  The default: no, it is read whole and passed to :meth:`on_response`."""
        return False

    def walks_unread(self, response: Response, rest: int) -> Walk | None:
        """When :meth:`relays_unread` said no: a walk (:mod:`protocol.fetch_walk`) by which the response may go
        to the client in segments as it arrives, its fields looked at (and replaced, where the walk does) before
        they go and its records spliced on unread between them (:mod:`ksi.relay`); None: it is read whole."""
        return None

    # Observers (the metrics filter): called for every frame, never given a decoded message.
    observes = False

    def client_to_proxy(self, api_name: str, size: int) -> None: ...
    def proxy_to_server(self, api_name: str, size: int) -> None: ...
    def server_to_proxy(self, api_name: str, size: int, seconds: float) -> None: ...
    def proxy_to_client(self, api_name: str, size: int, seconds: float) -> None: ...
