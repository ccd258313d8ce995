"""Kafka framing, sans-IO: a 4-byte big-endian size, then that many bytes.

Feed bytes with :meth:`FrameReader.receive_data`, pull whole frames with :meth:`FrameReader.next_frame`.
The size limit is checked as soon as the 4-byte prefix arrives, so an oversized frame is refused before
its body is buffered.
"""

from __future__ import annotations

import struct

from .errors import FrameTooLarge

__all__ = ["DETACH_BYTES", "SIZE_PREFIX", "FrameReader", "frame"]

SIZE_PREFIX = struct.Struct(">i")

# Frames at least this large are handed out without a copy when they fill the buffer exactly.
DETACH_BYTES = 64 * 1024


def frame(payload: bytes | bytearray | memoryview) -> bytearray:
    """Prefix ``payload`` with its size, in one copy; the frame is a new bytearray, so that whoever sends it
    may patch it in place (a response's correlation id)."""
    out = bytearray(SIZE_PREFIX.size + len(payload))
    SIZE_PREFIX.pack_into(out, 0, len(payload))
    out[SIZE_PREFIX.size :] = payload
    return out


class FrameReader:
    """Accumulates bytes and yields whole frames (without their size prefix)."""

    __slots__ = ("_buffer", "_max_frame_bytes", "_next_size")

    def __init__(self, max_frame_bytes: int) -> None:
        self._buffer = bytearray()
        self._max_frame_bytes = max_frame_bytes
        self._next_size: int | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a frame."""
        return len(self._buffer)

    @property
    def partial_size(self) -> int | None:
        """The size (prefix excluded) of a frame whose prefix has arrived and the rest not yet, once
        :meth:`next_sized` or :meth:`next_frame` has returned None for it; else None."""
        return self._next_size

    def peek(self) -> bytearray:
        """The bytes received and not yet returned (not a copy: read them, do not keep them)."""
        return self._buffer

    def take_partial(self) -> tuple[bytearray, int]:
        """A frame that has not all arrived (:attr:`partial_size`): its bytes so far, size prefix included,
        and how many are still to come.  The reader is left empty, as if the frame had been returned: the
        caller takes its rest from the stream itself (a proxy splices it on), and what the stream brings
        after that is the next frame."""
        size = self._next_size
        assert size is not None and len(self._buffer) < 4 + size
        head, self._buffer, self._next_size = self._buffer, bytearray(), None
        return head, 4 + size - len(head)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._buffer:
            self._buffer += data
        else:
            self._buffer = bytearray(data)

    def _frame_end(self) -> int | None:
        """Where the next frame (its size prefix included) ends in the buffer, once it has all arrived."""
        if self._next_size is None:
            if len(self._buffer) < 4:
                return None
            (size,) = SIZE_PREFIX.unpack_from(self._buffer)
            if size < 0 or size > self._max_frame_bytes:
                raise FrameTooLarge(size, self._max_frame_bytes)
            self._next_size = size
        end = 4 + self._next_size
        return end if len(self._buffer) >= end else None

    def next_sized(self) -> bytearray | None:
        """The next whole frame *with* its 4-byte size prefix, as a buffer of its own that the caller may
        patch in place (a proxy rewrites the correlation id and sends the same buffer on): a frame that
        fills the buffer exactly (the usual case for a request or a response), or most of it, is handed over
        without a copy.
        Raises :class:`FrameTooLarge` as :meth:`next_frame` does.  (The proxy calls this twice per read, so
        it does its work inline.)"""
        buffer = self._buffer
        size = self._next_size
        if size is None:
            if len(buffer) < 4:
                return None
            (size,) = SIZE_PREFIX.unpack_from(buffer)
            if size < 0 or size > self._max_frame_bytes:
                raise FrameTooLarge(size, self._max_frame_bytes)
        end = 4 + size
        if len(buffer) < end:
            self._next_size = size
            return None
        self._next_size = None
        if len(buffer) == end:
            self._buffer = bytearray()
            return buffer
        if end > len(buffer) - end:
            # More of the buffer is this frame than what follows it (a large frame whose last read also
            # brought the start of the next): the frame keeps the buffer and what follows is copied out,
            # instead of the frame being copied out of it.
            self._buffer = buffer[end:]
            del buffer[end:]
            return buffer
        out = buffer[:end]
        del buffer[:end]
        return out

    def next_frame(self) -> bytes | memoryview | None:
        """The next whole frame, or ``None`` if more bytes are needed.

        A large frame that fills the buffer exactly (the usual case for a big Fetch response) comes
        back as a memoryview over the detached buffer: no copy.  Smaller ones come back as bytes.
        Raises :class:`FrameTooLarge` when the size prefix is negative or over the limit.
        """
        end = self._frame_end()
        if end is None:
            return None
        if len(self._buffer) == end and end >= DETACH_BYTES:
            whole, self._buffer = self._buffer, bytearray()
            self._next_size = None
            return memoryview(whole)[4:]
        payload = bytes(self._buffer[4:end])
        del self._buffer[:end]
        self._next_size = None
        return payload
