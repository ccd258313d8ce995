"""A broker's response relayed in segments: its fields read and checked as they arrive, its records spliced on
unread between them (docs/passthrough.md).

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

import trio

from protocol.errors import MalformedFrame
from protocol.fetch_walk import PASS, READ, WRITE, Walk

from . import rawio

__all__ = ["relay_segments"]

log = logging.getLogger("ksi.connection")

READ_BYTES = 64 * 1024  # a read for a walk's fields: a partition's fields, and what of its records follow them


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
