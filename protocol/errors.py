"""Errors raised by the protocol layer.

Like h11's ``error_status_hint``, each error carries what the caller should do about it: the Kafka
error code to answer with where one exists, and whether the connection can continue.
"""

from __future__ import annotations

__all__ = [
    "ProtocolError",
    "MalformedFrame",
    "FrameTooLarge",
    "UnsupportedApi",
    "UNSUPPORTED_VERSION",
    "CORRUPT_MESSAGE",
    "INVALID_REQUEST",
]

# Kafka error codes used by the protocol layer (names as in Kafka's Errors.java).
CORRUPT_MESSAGE = 2
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42


class ProtocolError(Exception):
    """Base class. ``error_code`` is the Kafka error to answer with; ``fatal`` means close the connection."""

    error_code: int = INVALID_REQUEST
    fatal: bool = True


class MalformedFrame(ProtocolError):
    """The bytes are not a Kafka frame or header: the stream cannot be trusted any further."""

    error_code = CORRUPT_MESSAGE


class FrameTooLarge(ProtocolError):
    """A frame's size prefix exceeds the configured limit (or is negative)."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")


class UnsupportedApi(ProtocolError):
    """An API key or version the proxy cannot handle."""

    error_code = UNSUPPORTED_VERSION

    def __init__(self, api_key: int, api_version: int, message: str) -> None:
        self.api_key = api_key
        self.api_version = api_version
        super().__init__(message)
