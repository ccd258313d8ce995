"""Kafka's error codes (one table for all of ksi, names as in Kafka's ``Errors.java``) and the errors the
protocol layer raises.

Like h11's ``error_status_hint``, each error carries what the caller should do about it: the Kafka
error code to answer with where one exists, and whether the connection can continue.
"""

from __future__ import annotations

__all__ = [
    "COORDINATOR_LOAD_IN_PROGRESS",
    "COORDINATOR_NOT_AVAILABLE",
    "CORRUPT_MESSAGE",
    "FETCH_SESSION_ID_NOT_FOUND",
    "INVALID_REQUEST",
    "INVALID_TOPIC_EXCEPTION",
    "KAFKA_STORAGE_ERROR",
    "LEADER_NOT_AVAILABLE",
    "NONE",
    "NOT_COORDINATOR",
    "NOT_LEADER_OR_FOLLOWER",
    "OFFSET_OUT_OF_RANGE",
    "SASL_AUTHENTICATION_FAILED",
    "TOPIC_AUTHORIZATION_FAILED",
    "UNKNOWN_SERVER_ERROR",
    "UNKNOWN_TOPIC_ID",
    "UNKNOWN_TOPIC_OR_PARTITION",
    "UNSUPPORTED_SASL_MECHANISM",
    "UNSUPPORTED_VERSION",
    "FrameTooLarge",
    "MalformedFrame",
    "ProtocolError",
    "UnsupportedApi",
    "error_name",
]

# Kafka's error codes that ksi answers with or acts on (org.apache.kafka.common.protocol.Errors).
UNKNOWN_SERVER_ERROR = -1
NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
INVALID_TOPIC_EXCEPTION = 17
TOPIC_AUTHORIZATION_FAILED = 29
UNSUPPORTED_SASL_MECHANISM = 33
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
KAFKA_STORAGE_ERROR = 56
SASL_AUTHENTICATION_FAILED = 58
FETCH_SESSION_ID_NOT_FOUND = 70
UNKNOWN_TOPIC_ID = 100

_NAMES = {value: name for name, value in globals().items() if name.isupper() and isinstance(value, int)}


def error_name(code: int) -> str:
    """Kafka's name for an error code (``KAFKA_STORAGE_ERROR``), or ``error <code>``."""
    return _NAMES.get(code, f"error {code}")


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
