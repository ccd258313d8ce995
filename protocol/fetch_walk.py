"""A Fetch response walked as its bytes arrive, sans-IO: its fields read as they come, its records passed over.

A proxy that must see every partition's error code before the client does (the history filter: a configured
topic's partition answered OFFSET_OUT_OF_RANGE is ksi's to answer) had to read a response whole when its
first bytes did not reach the last partition's fields: a Fetch response of several partitions, the usual
one, was held until its last byte arrived, and only then sent on.  :class:`FetchWalk` lets it pass the
response on as it arrives instead: it reads the fields between the partitions' records as they come and says
where each partition's records are, so that the proxy sends the fields (once read) and moves the records
unread (splice(2)).  A partition answered with the watched error code is offered to ``wanted`` before its
fields leave; when ``wanted`` takes it, its error code is set to NONE in place, so that the client sees an
empty partition and fetches it again (the bytes before it are gone already: the answer cannot be replaced).

The driver feeds bytes (:meth:`FetchWalk.feed`) and asks :meth:`FetchWalk.next` what to do:

* ``(SEND, n)``: the next ``n`` buffered bytes are fields, read (and patched): :meth:`FetchWalk.take` them;
* ``(RECORDS, n)``: the next ``n`` bytes of the body are records: :meth:`FetchWalk.take` those that are
  buffered (:attr:`FetchWalk.buffered`), move the rest unread and say so (:meth:`FetchWalk.passed`);
* ``(NEED, 0)``: feed more bytes;
* ``(DONE, 0)``: the body has been walked to its end, exactly.

The schema is the one :func:`protocol.fetch_scan.scan_fetch_response` reads (v0-v18).  A body that does not
follow it, or that ends before or after its size, raises MalformedFrame.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Generator

from .errors import MalformedFrame

__all__ = ["DONE", "NEED", "RECORDS", "SEND", "FetchWalk"]

SEND, RECORDS, NEED, DONE = range(4)
FLEXIBLE_FROM = 12
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION = struct.Struct(">ihq")  # PartitionIndex, ErrorCode, HighWatermark
_NONE = b"\x00\x00"

_Steps = Generator[None, None, None]


class FetchWalk:
    """One Fetch response body (after its response header) of ``size`` bytes, walked as it arrives.
    ``wanted(topic, partition)`` (the topic's name before v13, its id from v13) is asked about each partition
    answered with ``watch``; a partition it takes has its error code set to NONE before it is sent."""

    __slots__ = ("_buffer", "_done", "_pos", "_records", "_steps", "_taken", "patched", "size", "version",
                 "wanted", "watch")

    def __init__(self, version: int, size: int, watch: int,
                 wanted: Callable[[str | uuid.UUID, int], bool]) -> None:
        self.version = version
        self.size = size
        self.watch = watch
        self.wanted = wanted
        self.patched: list[tuple[str | uuid.UUID, int]] = []  # the partitions whose error code was set to NONE
        self._buffer = bytearray()  # bytes fed and not yet taken
        self._pos = 0               # how many of them are read fields
        self._taken = 0             # body bytes taken or passed before the buffer's first
        self._records = 0           # record bytes still to take or pass
        self._done = False
        self._steps = self._walk()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._taken + len(self._buffer) + len(data) > self.size:
            raise MalformedFrame(f"Fetch response v{self.version} runs past its size ({self.size} bytes)")
        self._buffer += data

    def next(self) -> tuple[int, int]:
        """What the driver does next (see the module's doc)."""
        while True:
            if self._pos:
                return SEND, self._pos
            if self._records:
                return RECORDS, self._records
            if self._done:
                return DONE, 0
            try:
                next(self._steps)
            except StopIteration:
                self._done = True
                continue
            except (IndexError, struct.error):
                raise MalformedFrame(f"Fetch response v{self.version} does not follow its schema") from None
            if not self._pos and not self._records:
                return NEED, 0

    def take(self, n: int) -> bytearray:
        """The next ``n`` buffered bytes: read fields (``n`` at most what SEND said) or records (at most what
        RECORDS said and is buffered)."""
        if self._pos:
            assert n <= self._pos
            self._pos -= n
        else:
            assert n <= min(self._records, len(self._buffer))
            self._records -= n
        out = self._buffer[:n]
        del self._buffer[:n]
        self._taken += n
        return out

    def passed(self, n: int) -> None:
        """``n`` record bytes that were not fed went to the client unread."""
        assert not self._buffer and not self._pos and n <= self._records
        self._records -= n
        self._taken += n

    # -- the walk ----------------------------------------------------------------------------------------------

    def _need(self, n: int) -> _Steps:
        """Until ``n`` bytes past the read fields are buffered."""
        if self._taken + self._pos + n > self.size:
            raise MalformedFrame(f"Fetch response v{self.version} is truncated")
        while len(self._buffer) - self._pos < n:
            yield

    def _uvarint(self) -> Generator[None, None, int]:
        result = shift = 0
        while True:
            yield from self._need(1)
            b = self._buffer[self._pos]
            self._pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise MalformedFrame("varint too long")

    def _count(self) -> Generator[None, None, int]:
        """An array's count (or a bytes field's length): -1 for null."""
        if self.version >= FLEXIBLE_FROM:
            return (yield from self._uvarint()) - 1
        yield from self._need(4)
        (count,) = _I32.unpack_from(self._buffer, self._pos)
        self._pos += 4
        return int(count)

    def _skip(self, n: int) -> _Steps:
        yield from self._need(n)
        self._pos += n

    def _tagged(self) -> _Steps:
        for _ in range((yield from self._uvarint())):
            yield from self._uvarint()
            yield from self._skip((yield from self._uvarint()))

    def _topic(self) -> Generator[None, None, str | uuid.UUID]:
        if self.version >= 13:
            yield from self._need(16)
            raw = bytes(self._buffer[self._pos:self._pos + 16])
            self._pos += 16
            return uuid.UUID(bytes=raw)
        if self.version >= FLEXIBLE_FROM:
            n = (yield from self._uvarint()) - 1
        else:
            yield from self._need(2)
            (n,) = _I16.unpack_from(self._buffer, self._pos)
            self._pos += 2
        if n < 0:
            return ""
        yield from self._need(n)
        name = str(self._buffer[self._pos:self._pos + n], "utf-8", "replace")
        self._pos += n
        return name

    def _walk(self) -> _Steps:
        version = self.version
        flexible = version >= FLEXIBLE_FROM
        # after PartitionIndex, ErrorCode, HighWatermark: LastStableOffset (v4+), LogStartOffset (v5+)
        after = (8 if version >= 4 else 0) + (8 if version >= 5 else 0)
        yield from self._skip((4 if version >= 1 else 0) + (6 if version >= 7 else 0))
        for _ in range(max((yield from self._count()), 0)):
            topic = yield from self._topic()
            for _ in range(max((yield from self._count()), 0)):
                yield from self._need(14 + after)
                index, error, _ = _PARTITION.unpack_from(self._buffer, self._pos)
                if error == self.watch and self.wanted(topic, index):
                    self._buffer[self._pos + 4:self._pos + 6] = _NONE
                    self.patched.append((topic, index))
                self._pos += 14 + after
                if version >= 4:  # AbortedTransactions: ProducerId, FirstOffset, tagged fields (v12+)
                    for _ in range(max((yield from self._count()), 0)):
                        yield from self._skip(16)
                        if flexible:
                            yield from self._tagged()
                if version >= 11:
                    yield from self._skip(4)  # PreferredReadReplica
                size = yield from self._count()
                if size > 0:
                    if self._taken + self._pos + size > self.size:
                        raise MalformedFrame(f"Fetch response v{version}: partition {index}'s records run past"
                                             " the response's end")
                    self._records = size
                    yield  # the fields up to here are sent, the records taken or passed
                if flexible:
                    yield from self._tagged()
            if flexible:
                yield from self._tagged()
        if flexible:
            yield from self._tagged()
        if self._taken + self._pos != self.size:
            raise MalformedFrame(f"Fetch response v{version} has"
                                 f" {self.size - self._taken - self._pos} trailing byte(s)")
