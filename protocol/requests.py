"""Facts about a request that the proxy needs without decoding its body."""

from __future__ import annotations

import struct

from kafka.protocol.api_key import ApiKey

from . import _tagged_fields  # noqa: F401 - kafka-python's codec keeps unknown tagged fields
from .errors import MalformedFrame
from .header import RequestHeader
from .varint import read_uvarint

__all__ = ["expects_response", "produce_acks"]

_INT16 = struct.Struct(">h")


def produce_acks(frame: bytes | memoryview, header: RequestHeader) -> int:
    """The ``acks`` of a Produce request.

    Layout: v0-2 start with acks int16; v3+ put transactional_id (nullable string; compact in the
    flexible versions v9+) before it.
    """
    pos = header.body_offset
    if pos is None:
        raise MalformedFrame("Produce version unknown to ksi")
    if header.api_version >= 3:
        if header.flexible:
            length_plus_one, pos = read_uvarint(frame, pos)
            pos += max(length_plus_one - 1, 0)
        else:
            if pos + 2 > len(frame):
                raise MalformedFrame("Produce request truncated before transactional_id")
            (length,) = _INT16.unpack_from(frame, pos)
            pos += 2 + max(length, 0)
    if pos + 2 > len(frame):
        raise MalformedFrame("Produce request truncated before acks")
    return int(_INT16.unpack_from(frame, pos)[0])


def expects_response(frame: bytes | memoryview, header: RequestHeader) -> bool:
    """False only for Produce with acks=0, which brokers never answer."""
    if header.api_key == ApiKey.Produce:
        return produce_acks(frame, header) != 0
    return True
