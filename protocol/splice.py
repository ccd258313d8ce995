"""Responses whose records are spliced in, not copied: the codec encodes everything else.

A Fetch response answered from the lake is mostly record batches that already exist as bytes (encoded
once, cached).  Encoding the response with the codec would copy every one of them into the codec's
buffer, and framing it would copy them again.  Instead each ``records`` field is given a unique
placeholder (:meth:`Splice.placeholder`), the message is encoded as usual, and :meth:`Splice.encode`
returns the encoded bytes cut at each placeholder with the real buffers in its place and its length
prefix rewritten: a list of buffers to send as they are.

    records (v0-v11):  INT32 length | bytes          (-1: null)
    records (v12+):    UNSIGNED_VARINT length + 1 | bytes   (0: null)

Placeholders are 16 bytes: 12 random bytes per response and a 4-byte counter, found in order, so nothing
else in a response (integers, topic names) can be taken for one.  Sans-IO.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import Any

from .apis import encode_body
from .errors import ProtocolError
from .varint import write_uvarint

__all__ = ["Splice"]

Buffer = bytes | bytearray | memoryview
_INT32 = struct.Struct(">i")
TOKEN_BYTES = 16


class Splice:
    def __init__(self) -> None:
        self._salt = os.urandom(TOKEN_BYTES - 4)
        self._parts: list[Sequence[Buffer]] = []

    def placeholder(self, buffers: Sequence[Buffer]) -> bytes:
        """The value to give a ``records`` field that is to hold ``buffers`` (in order)."""
        token = self._salt + _INT32.pack(len(self._parts))
        self._parts.append(buffers)
        return token

    def encode(self, message: Any, version: int, flexible: bool, head: bytes = b"") -> list[Buffer]:
        """``head`` (the response header), then ``message`` encoded at ``version`` with every placeholder's
        buffers in its place."""
        body = encode_body(message, version)
        out: list[Buffer] = [head] if head else []
        view = memoryview(body)
        at = 0
        prefix = 1 if flexible else 4  # what the placeholder's own length took
        for n, buffers in enumerate(self._parts):
            token = self._salt + _INT32.pack(n)
            found = body.find(token, at)
            if found < 0:
                raise ProtocolError(f"spliced response: placeholder {n} is not in the encoded message")
            size = sum(len(b) for b in buffers)
            out.append(view[at:found - prefix])
            out.append(write_uvarint(size + 1) if flexible else _INT32.pack(size))
            out += [b for b in buffers if len(b)]
            at = found + TOKEN_BYTES
        out.append(view[at:])
        return [part for part in out if len(part)]
