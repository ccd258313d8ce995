"""A broker's large response relayed to the client unread: spliced whole, or in segments, its fields read and
checked as they arrive and its records spliced on unread between them (docs/passthrough.md).

:class:`UnreadRelay` decides, on a response's first bytes, whether the response's filters let it go unread
(:meth:`ksi.filters.Filter.relays_unread`, :meth:`ksi.filters.Filter.walks_unread`), and relays it.  The
connection keeps the queue: it asks only for the response at the head of its queue, with nothing being written.

A response filter that must see fields spread through a large response (the history filter: every partition's
error code in a Fetch response, each after the previous partition's records) gives a walk of it
(:mod:`protocol.fetch_walk`): a generator of steps.  :func:`relay_segments` carries them out between the
broker's socket and the client's: what the walk reads is read from the broker (up to 64 KiB at a time, never
past the frame's end), what it writes is written to the client, and what it passes is spliced (or copied,
the part already read).  The frame's size went out first, so the client gets exactly the broker's frame
bytes, with only the fields the walk replaced changed: a walk that finds the frame is not what it expected
(:class:`~protocol.errors.MalformedFrame`), or ends before the frame does, has the rest relayed unread.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from protocol import ProtocolError, api
from protocol.errors import MalformedFrame
from protocol.fetch_walk import PASS, READ, WRITE, Walk

from . import rawio
from .filters import Response

if TYPE_CHECKING:
    from .slots import Slot

__all__ = ["UnreadRelay", "relay_segments"]

log = logging.getLogger("ksi.connection")

READ_BYTES = 64 * 1024  # a read for a walk's fields: a partition's fields, and what of its records follow them


class UnreadRelay:
    """Broker responses relayed unread to one client's stream, through a pipe of its own (opened on first use,
    closed by :meth:`close`)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._pipe: rawio.Pipe | None = None
        self._walk: Walk | None = None  # the walk accepts() chose for the response relay() relays next

    def accepts(self, slot: Slot, head: bytearray, rest: int) -> bool:
        """Whether the broker's response to ``slot``, of which ``head`` has been read (size prefix included)
        and ``rest`` bytes are still in the broker's socket, may go to the client with its rest unread: the
        client's stream is a socket, and every response filter of the slot lets it pass on its head
        (:meth:`Filter.relays_unread`), or one of them gives a walk to relay it by (:meth:`Filter.walks_unread`).
        Else it is read whole."""
        self._walk = None
        if not rawio.can_splice(self.stream):
            return False
        if self._pipe is None:
            self._pipe = rawio.Pipe.open()
            if self._pipe is None:
                return False  # no file descriptor for it: read whole
        if slot.filters:
            entry = api(slot.header.api_key)
            assert entry is not None
            response = Response(memoryview(head)[4:], slot.header, entry, True, slot.request)
            walks = []
            try:
                for _, response_filter in slot.filters:
                    if response_filter.relays_unread(response, rest):
                        continue
                    walk = response_filter.walks_unread(response, rest)
                    if walk is None:
                        return False
                    walks.append(walk)
            except (ProtocolError, ValueError, IndexError, struct.error):
                return False
            if len(walks) > 1:
                return False  # one walk per response: two filters' would have to be merged
            self._walk = walks[0] if walks else None
        return True

    async def relay(self, head: bytearray, rest: int, source: trio.abc.Stream, what: Callable[[], str]) -> int:
        """Write ``head`` (the response's first bytes, size prefix included), then the next ``rest`` bytes of
        ``source``, along the walk :meth:`accepts` chose if it chose one; the bytes spliced.  ``what()`` names
        the response for a walk's log (called only for a walk).  Raises as :func:`rawio.splice` does."""
        walk, self._walk = self._walk, None
        assert self._pipe is not None  # see accepts
        if walk is None:
            await rawio.send_all(self.stream, head)
            await rawio.splice(source, self.stream, rest, self._pipe)
            return rest
        await rawio.send_all(self.stream, head[:4])
        return await relay_segments(source, self.stream, memoryview(head)[4:], rest, walk, self._pipe, what())

    def close(self) -> None:
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None


async def relay_segments(source: trio.abc.Stream, destination: trio.abc.Stream,
                         buffered: bytes | bytearray | memoryview, rest: int, walk: Walk, pipe: rawio.Pipe,
                         what: str) -> int:
    """Relay a frame whose first bytes (``buffered``, after the size prefix, which the caller wrote) have been
    read and whose next ``rest`` bytes are in ``source``, along ``walk``; the bytes spliced.  ``what`` names the
    response for the log line of a walk that failed.  Raises :class:`rawio.SourceEnded` if ``source`` ends
    first and ``trio.BrokenResourceError`` if ``destination`` breaks, as :func:`rawio.splice` does."""
    buf = bytearray(buffered)
    pos = 0
    out: list[bytes | bytearray | memoryview] = []
    spliced = 0

    async def fill(n: int) -> None:
        """At least ``n`` unread bytes in ``buf`` (MalformedFrame past the frame's end)."""
        nonlocal buf, pos, rest
        if pos:
            del buf[:pos]
            pos = 0
        while len(buf) < n:
            if rest <= 0:
                raise MalformedFrame(f"{what}: the walk reads past the frame's end")
            data = await rawio.receive_some(source, min(rest, max(n - len(buf), READ_BYTES)))
            if not data:
                raise rawio.SourceEnded(f"the broker closed the connection with {rest} bytes of a frame to come")
            rest -= len(data)
            buf += data

    unwritten = bytearray()  # read by the walk, not written by it yet: relayed as they are if the walk fails
    try:
        step = next(walk)
        while True:
            op, arg = step
            if op == READ:
                if len(buf) - pos < arg:
                    await fill(arg)
                data = bytes(buf[pos:pos + arg])
                pos += arg
                unwritten += data
                step = walk.send(data)
            elif op == WRITE:
                if len(arg) != len(unwritten):
                    raise MalformedFrame(f"{what}: the walk wrote {len(arg)} bytes of the {len(unwritten)} it read")
                out.append(arg)
                unwritten.clear()
                step = next(walk)
            else:
                assert op == PASS
                held = min(arg, len(buf) - pos)
                if held:
                    out.append(bytes(buf[pos:pos + held]))
                    pos += held
                unread = arg - held
                if unread > rest:
                    raise MalformedFrame(f"{what}: records run past the frame's end")
                if unread >= rawio.SPLICE_MIN_BYTES:
                    if out:
                        await rawio.send_parts(destination, out)
                        out = []
                    await rawio.splice(source, destination, unread, pipe)
                    rest -= unread
                    spliced += unread
                elif unread:
                    await fill(unread)
                    out.append(bytes(buf[:unread]))
                    pos = unread
                step = next(walk)
    except StopIteration:
        pass
    except (MalformedFrame, ValueError) as exc:
        log.warning("%s: relayed as the broker sent it: %s", what, exc)
    # The frame's rest, as it is: what the walk did not reach (a frame that ends after its structure does, or
    # one the walk could not follow).
    if unwritten:
        out.append(bytes(unwritten))
    if len(buf) > pos:
        out.append(bytes(buf[pos:]))
    if out:
        await rawio.send_parts(destination, out)
    if rest:
        await rawio.splice(source, destination, rest, pipe)
        spliced += rest
    return spliced
