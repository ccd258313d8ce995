"""Request and response headers: read without decoding the body, patch the correlation id in place.

Request header (v1, v2):  api_key int16 | api_version int16 | correlation_id int32 |
                          client_id nullable string (int16 length, not compact even in v2) |
                          v2 only: tagged fields (uvarint count, then tag/size/bytes per field)
Response header (v0, v1): correlation_id int32 | v1 only: tagged fields

The correlation id sits at a fixed offset in both (4 in requests, 0 in responses), so a frame the proxy
does not decode is forwarded with only those four bytes rewritten.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .apis import api
from .errors import MalformedFrame
from .varint import read_uvarint, skip_tagged_fields

__all__ = [
    "RequestHeader",
    "encode_response_header",
    "parse_request_header",
    "read_uvarint",
    "reframe",
    "response_body_offset",
    "response_correlation_id",
    "skip_tagged_fields",
    "with_request_correlation_id",
    "with_response_correlation_id",
]

_HEAD = struct.Struct(">hhih")
_INT32 = struct.Struct(">i")


class RequestHeader(NamedTuple):
    """A request's header.  An immutable value: a named tuple, because a proxy parses one per request and a
    frozen dataclass costs four times as much to make (``object.__setattr__`` per field)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int | None  # None when the API is unknown, so the header's length is too
    flexible: bool = False   # a flexible version of its API (compact strings, tagged fields)


def parse_request_header(frame: bytes | bytearray | memoryview) -> RequestHeader:
    """Read a request frame's header (the frame without its size prefix)."""
    if len(frame) < 10:
        raise MalformedFrame(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id, client_id_len = _HEAD.unpack_from(frame)
    if api_version < 0 or api_key < 0:
        raise MalformedFrame(f"negative api key {api_key} or version {api_version}")
    pos = 10
    client_id: str | None = None
    if client_id_len >= 0:
        pos += client_id_len
        if pos > len(frame):
            raise MalformedFrame("client_id runs past the end of the frame")
        client_id = str(frame[10:pos], "utf-8", "replace")
    elif client_id_len != -1:
        raise MalformedFrame(f"invalid client_id length {client_id_len}")
    entry = api(api_key)
    if entry is None:
        return RequestHeader(api_key, api_version, correlation_id, client_id, None)
    flexible_from = entry.flexible_from
    if flexible_from is None or api_version < flexible_from:
        return RequestHeader(api_key, api_version, correlation_id, client_id, pos)
    if pos < len(frame) and frame[pos] == 0:  # no tagged fields: the usual case
        return RequestHeader(api_key, api_version, correlation_id, client_id, pos + 1, True)
    return RequestHeader(api_key, api_version, correlation_id, client_id, skip_tagged_fields(frame, pos), True)


def with_request_correlation_id(frame: bytes, correlation_id: int) -> bytes:
    return frame[:4] + _INT32.pack(correlation_id) + frame[8:]


def reframe(payload: bytes | memoryview, offset: int, correlation_id: int) -> list[bytes | memoryview]:
    """``payload`` framed for the wire with the correlation id at ``offset`` replaced, as buffers to
    send in order: the size prefix and header in a small new buffer, the rest as a view (no copy)."""
    head = struct.pack(">i", len(payload)) + bytes(payload[:offset]) + _INT32.pack(correlation_id)
    tail = memoryview(payload)[offset + 4:]
    if len(tail) < 64 * 1024:
        return [head + tail]
    return [head, tail]


def response_correlation_id(frame: bytes | memoryview) -> int:
    if len(frame) < 4:
        raise MalformedFrame(f"response of {len(frame)} bytes has no correlation id")
    return int(_INT32.unpack_from(frame)[0])


def with_response_correlation_id(frame: bytes, correlation_id: int) -> bytes:
    return _INT32.pack(correlation_id) + frame[4:]


def response_body_offset(frame: bytes | memoryview, header_version: int) -> int:
    return skip_tagged_fields(frame, 4) if header_version >= 1 else 4


def encode_response_header(correlation_id: int, header_version: int) -> bytes:
    return _INT32.pack(correlation_id) + (b"\x00" if header_version >= 1 else b"")
