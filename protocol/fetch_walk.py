"""A Fetch response walked as it arrives, so that a proxy can relay it in segments: its fields read (and an
error code replaced, where the proxy must), its records passed on unread.

:func:`~protocol.fetch_scan.scan_fetch_response` needs every partition's fields before any byte goes on,
and a partition's fields follow the records of the partition before it: a response of several partitions
must then be held whole before a proxy may look at its last partition's error code.  :func:`walk_fetch_response`
instead gives the response's bytes back in order, as steps, once the fields before them have been looked
at: a partition's records can go on before the next partition's fields have arrived.  What it cannot do is
take back what went on before: a partition found in error can only have its error code replaced.

Sans-IO: a generator of steps that the caller carries out on its streams.

* ``(READ, n)``: send the next ``n`` bytes of the response into the generator;
* ``(WRITE, data)``: relay ``data`` (what was read, fields replaced where ``replace`` said so);
* ``(PASS, n)``: relay the next ``n`` bytes of the response unread (a partition's records).

It ends when the response's structure ends; the caller checks that its frame ended there too.  A response
that is not a Fetch response of ``version`` raises :class:`~protocol.errors.MalformedFrame` (what was
written so far was the broker's own bytes: the caller may relay the rest unread).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Generator
from typing import Any

from .errors import MalformedFrame

__all__ = ["PASS", "READ", "WRITE", "Replace", "Step", "first_records_size", "walk_fetch_response"]

READ, WRITE, PASS = 0, 1, 2
FLEXIBLE_FROM = 12
TOPIC_IDS_FROM = 13
MAX_NAME_BYTES = 1 << 15
MAX_COUNT = 1 << 20

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION = struct.Struct(">ih")  # PartitionIndex, ErrorCode

Step = tuple[int, Any]
# (topic name or id, partition index, error code) -> the error code to send instead, or None: as it is
Replace = Callable[[str | uuid.UUID, int, int], int | None]
Walk = Generator[Step, bytes | None, None]


def walk_fetch_response(version: int, header_size: int, replace: Replace) -> Walk:
    """The steps that relay a Fetch response of ``version`` (v4-v15: the layout in protocol.fetch_scan), its
    response header ``header_size`` bytes (correlation id and, flexible versions, tagged fields).  ``replace``
    is asked for every partition's error code before that partition's fields are written."""
    if not 4 <= version < 16:
        raise ValueError(f"Fetch v{version} is not walked (v4-v15 are)")
    flexible = version >= FLEXIBLE_FROM
    out = bytearray()

    def read(n: int) -> Generator[Step, bytes | None, bytes]:
        data = yield READ, n
        assert data is not None and len(data) == n
        out.extend(data)
        return data

    def uvarint() -> Generator[Step, bytes | None, int]:
        value, shift = 0, 0
        while True:
            byte = (yield from read(1))[0]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 28:
                raise MalformedFrame(f"Fetch response v{version}: a varint longer than 5 bytes")

    def count() -> Generator[Step, bytes | None, int]:
        n = (yield from uvarint()) - 1 if flexible else _I32.unpack((yield from read(4)))[0]
        if n > MAX_COUNT:
            raise MalformedFrame(f"Fetch response v{version}: a count of {n}")
        return n

    def tagged() -> Generator[Step, bytes | None, None]:
        for _ in range((yield from uvarint())):
            yield from uvarint()  # the tag
            size = yield from uvarint()
            if size:
                yield from read(size)

    yield from read(header_size)
    yield from read(4 + (6 if version >= 7 else 0))  # ThrottleTimeMs; ErrorCode, SessionId (v7+)
    fixed = 14 + 8 + (8 if version >= 5 else 0)  # PartitionIndex .. LastStableOffset, LogStartOffset (v5+)
    for _ in range((yield from count())):
        topic: str | uuid.UUID
        if version >= TOPIC_IDS_FROM:
            topic = uuid.UUID(bytes=bytes((yield from read(16))))
        else:
            size = (yield from uvarint()) - 1 if flexible else _I16.unpack((yield from read(2)))[0]
            if size > MAX_NAME_BYTES:
                raise MalformedFrame(f"Fetch response v{version}: a topic name of {size} bytes")
            topic = str((yield from read(size)), "utf-8", "replace") if size > 0 else ""
        for _ in range((yield from count())):
            at = len(out)
            fields = yield from read(fixed)
            index, error = _PARTITION.unpack_from(fields)
            instead = replace(topic, index, error)
            if instead is not None:
                _I16.pack_into(out, at + 4, instead)
            for _ in range((yield from count())):  # AbortedTransactions: ProducerId, FirstOffset
                yield from read(16)
                if flexible:
                    yield from tagged()
            if version >= 11:
                yield from read(4)  # PreferredReadReplica
            size = (yield from uvarint()) - 1 if flexible else _I32.unpack((yield from read(4)))[0]
            if size > 0:
                yield WRITE, bytes(out)
                out.clear()
                yield PASS, size
            if flexible:
                yield from tagged()
        if flexible:
            yield from tagged()
    if flexible:
        yield from tagged()
    if out:
        yield WRITE, bytes(out)


def first_records_size(frame: bytes | bytearray | memoryview, version: int, header_size: int,
                       seen: Replace | None = None) -> int | None:
    """The size of the first records a walk of the response whose first bytes are ``frame`` would pass (the
    first partition's with any), or None if ``frame`` ends before them.  A relay walks a response only when
    that is large: a walk costs about a microsecond and a half per field, so a response of many small
    partitions is cheaper read whole.  ``seen`` is told of every partition's error code up to there (what it
    returns is not used)."""
    walk = walk_fetch_response(version, header_size, seen or (lambda topic, partition, error: None))
    pos = 0
    try:
        step = next(walk)
        while True:
            op, arg = step
            if op == PASS:
                return int(arg)
            if op == READ:
                if pos + arg > len(frame):
                    return None
                data, pos = bytes(frame[pos:pos + arg]), pos + arg
                step = walk.send(data)
            else:
                step = next(walk)
    except StopIteration:
        return None
    finally:
        walk.close()
