"""A request's place in its connection's response order, and the ways a connection ends.

Kafka answers a connection's requests in the order they came.  ksi reads requests ahead of their responses,
so each takes a :class:`Slot` in its connection's queue as it is read; the slot holds the framed response once
it is complete, or the error that ends the connection when the slot reaches the head of the queue (a
refused frame ends it only after the responses before it are written, as Kafka's broker does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from protocol import RequestHeader

    from .filters import Request
    from .filters.api import Filter

__all__ = ["AgedOut", "ClientGone", "Refused", "Slot"]


class ClientGone(Exception):
    """The client closed its connection, or its socket broke."""


class AgedOut(Exception):
    """The connection reached ``proxy.connection_max_age_seconds`` with nothing in flight."""


class Refused(Exception):
    """A client frame that ends the connection; the message is the log line."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class Slot:
    """One request's place in the response order."""

    __slots__ = (
        "arrived",
        "error",
        "filters",
        "handler",
        "header",
        "name",
        "out",
        "request",
        "sent_at",
        "size",
        "started",
    )

    def __init__(self, header: RequestHeader, name: str, arrived: float) -> None:
        self.header = header
        self.name = name
        self.arrived = arrived
        self.sent_at = arrived
        self.out: bytearray | list[bytes | bytearray | memoryview] | None = None  # the framed response, once complete
        self.error: BaseException | None = None  # raised when the slot reaches the head (ends the connection)
        self.filters: tuple[tuple[int, Filter], ...] = ()  # response filters it passes back through
        self.handler: Any = None                 # ksi answers it when its turn comes (a Defer's handler)
        self.request: Request | None = None      # ... and the request it answers
        self.started = False
        self.size = 0                            # bytes of the broker's response held in the backlog

    def fail(self, error: BaseException) -> None:
        """The broker connection ended before the response came (called by the upstream connection)."""
        if self.out is None and self.error is None:
            self.error = error
