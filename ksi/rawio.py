"""Socket reads and writes for the relay without trio's scheduling round trip per call.

trio's ``SocketStream.send_all`` and ``receive_some`` yield to the scheduler on every call, even when the
kernel takes or has the bytes at once (a full pass of the run loop, an ``epoll_wait`` included).  A proxy
makes four such calls per request and response, so for plain TCP streams these try the non-blocking
system call first and wait for the socket (``trio.lowlevel.wait_readable``/``wait_writable``) only when it
would block.  Cancellation is still honoured at every call (``checkpoint_if_cancelled``), and after
``YIELD_EVERY`` calls in a row that did not wait the task yields anyway, so a busy connection cannot
starve the others.  TLS and in-memory streams use trio's own methods.

``KSI_TRIO_IO=1`` in the environment turns this off (trio's methods everywhere), for comparison.

:func:`splice` moves bytes from one socket to another through a pipe (splice(2)): they never reach user
space.  The relay uses it for the body of a large frame (docs/passthrough.md); ``KSI_SPLICE=0`` in the
environment turns it off (frames are read whole, as before).
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import termios

import trio

__all__ = ["Pipe", "SourceEnded", "can_splice", "receive_some", "relay_socket", "send_all", "send_parts", "splice",
           "unread_bytes"]

YIELD_EVERY = 16
_IOV_MAX = 512  # buffers per writev (Linux allows 1024)
_DISABLED = os.environ.get("KSI_TRIO_IO", "") not in ("", "0")
_SPLICE = not _DISABLED and os.environ.get("KSI_SPLICE", "") != "0" and hasattr(os, "splice")
# A frame whose unread rest is at least this large is spliced from one socket to the other (docs/passthrough.md).
SPLICE_MIN_BYTES = 64 * 1024
PIPE_BYTES = 1 << 20  # a splice's pipe: the most an unprivileged process may ask for by default (pipe-max-size)
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
_streak = 0


def relay_socket(stream: trio.abc.Stream) -> None:
    """Socket options for a relay's socket: TCP_NOTSENT_LOWAT back to the system's default (no limit).

    trio sets it to 16 KiB on every SocketStream, so that a sender keeps little data queued in the kernel;
    then a write accepts at most about 16 KiB more than the peer's window takes, and relaying a 1 MB Fetch
    response to a consumer that reads slower than ksi writes costs a wakeup, an ``epoll_ctl`` and a write
    per 16 KiB.  ksi writes whole frames and has nothing to reorder behind them."""
    raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    if type(raw) is trio.SocketStream and hasattr(trio.socket, "TCP_NOTSENT_LOWAT"):
        with contextlib.suppress(OSError):
            raw.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NOTSENT_LOWAT, 0)  # 0: the sysctl's value


def _raw(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    if _DISABLED or type(stream) is not trio.SocketStream:
        return None
    return stream.socket


async def _maybe_yield() -> None:
    global _streak  # noqa: PLW0603 - one counter per process: the event loop is one thread
    _streak += 1
    if _streak >= YIELD_EVERY:
        _streak = 0
        await trio.lowlevel.cancel_shielded_checkpoint()


async def send_all(stream: trio.abc.Stream, data: bytes | bytearray | memoryview) -> None:
    """``stream.send_all(data)``; raises what it raises (``trio.BrokenResourceError`` on a broken socket).
    The usual case, one write that takes everything, makes no call beyond the system call's."""
    global _streak  # noqa: PLW0603 - see _maybe_yield
    if _DISABLED or type(stream) is not trio.SocketStream:
        await stream.send_all(data)
        return
    sock = stream.socket
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        sent = os.write(sock.fileno(), data)
    except BlockingIOError:
        sent = 0
    except OSError as exc:
        raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
    if sent < len(data):
        await _send_rest(sock, data, sent)
    _streak += 1
    if _streak >= YIELD_EVERY:
        _streak = 0
        await trio.lowlevel.cancel_shielded_checkpoint()


async def _send_rest(sock: trio.socket.SocketType, data: bytes | bytearray | memoryview, sent: int) -> None:
    """The rest of ``data`` after its first ``sent`` bytes, waiting for the socket between writes."""
    view = memoryview(data)[sent:]
    try:
        while view:
            await trio.lowlevel.wait_writable(sock)
            try:
                sent = os.write(sock.fileno(), view)
            except BlockingIOError:
                continue
            view = view[sent:]
    except OSError as exc:
        raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
    finally:
        view.release()


async def send_parts(stream: trio.abc.Stream, parts: list[bytes | bytearray | memoryview]) -> None:
    """Send buffers in order, as one write each time the socket takes them (``os.writev``): a response
    spliced from several buffers is sent without joining them."""
    sock = _raw(stream)
    if sock is None or len(parts) == 1:
        for part in parts:
            await send_all(stream, part)
        return
    await trio.lowlevel.checkpoint_if_cancelled()
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    fd = sock.fileno()
    try:
        while views:
            try:
                sent = os.writev(fd, views[:_IOV_MAX])
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)
                continue
            while views and sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            if sent:
                views[0] = views[0][sent:]
    except OSError as exc:
        raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
    await _maybe_yield()


async def receive_some(stream: trio.abc.Stream, max_bytes: int, wait_first: bool = False) -> bytes | bytearray:
    """``stream.receive_some(max_bytes)``: b"" at the end of the stream.  ``wait_first``: the caller's last
    read was short (it emptied the socket), so wait for the socket before the system call instead of
    trying one that would fail with EAGAIN."""
    global _streak  # noqa: PLW0603 - see _maybe_yield
    if _DISABLED or type(stream) is not trio.SocketStream:
        return await stream.receive_some(max_bytes)
    sock = stream.socket
    if wait_first:
        await trio.lowlevel.wait_readable(sock)
    else:
        await trio.lowlevel.checkpoint_if_cancelled()
    while True:
        try:
            data = os.read(sock.fileno(), max_bytes)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        except OSError as exc:
            raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
        _streak += 1
        if _streak >= YIELD_EVERY:
            _streak = 0
            await trio.lowlevel.cancel_shielded_checkpoint()
        return data


# -- splice(2) --------------------------------------------------------------------------------------------


class SourceEnded(Exception):
    """The stream :func:`splice` reads from ended, or failed, before the count of bytes had come (a broken
    destination is ``trio.BrokenResourceError``, as for :func:`send_all`)."""


def can_splice(*streams: trio.abc.Stream) -> bool:
    """Whether :func:`splice` may move bytes between these streams: plain TCP sockets, where the system has
    splice(2) and it is not turned off.  TLS and in-memory streams are read and written instead."""
    return _SPLICE and all(type(stream) is trio.SocketStream for stream in streams)


class Pipe:
    """The pipe a connection splices through, one per direction, opened on first use.  Empty between
    splices; one a splice left bytes in (it failed half way) is closed with its connection."""

    __slots__ = ("capacity", "read", "write")

    def __init__(self) -> None:
        self.read, self.write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            # A larger pipe moves more per system call; past the user's pipe allowance (pipe-user-pages-soft)
            # the system refuses it and the default stays.
            self.capacity = fcntl.fcntl(self.write, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            self.capacity = fcntl.fcntl(self.write, fcntl.F_GETPIPE_SZ)

    @classmethod
    def open(cls) -> Pipe | None:
        """A new pipe, or None when the process has no file descriptors left (then frames are read whole)."""
        try:
            return cls()
        except OSError:
            return None

    def close(self) -> None:
        if self.read >= 0:
            os.close(self.read)
            os.close(self.write)
            self.read = self.write = -1


async def splice(source: trio.abc.Stream, destination: trio.abc.Stream, count: int, pipe: Pipe) -> None:
    """Move the next ``count`` bytes of ``source`` to ``destination`` through ``pipe`` (both streams
    :func:`can_splice`), waiting for either socket as it must.  Raises :class:`SourceEnded` if ``source``
    ends or breaks first, ``trio.BrokenResourceError`` if ``destination`` breaks.  Either way, or if it is
    cancelled, the destination has part of the bytes and ``pipe`` may hold some: the caller ends both."""
    src = source.socket  # type: ignore[attr-defined]
    dst = destination.socket  # type: ignore[attr-defined]
    src_fd, dst_fd, pipe_in, pipe_out, capacity = src.fileno(), dst.fileno(), pipe.write, pipe.read, pipe.capacity
    held = 0  # bytes in the pipe
    await trio.lowlevel.checkpoint_if_cancelled()
    while count or held:
        moved = False
        if count and held < capacity:
            try:
                n = os.splice(src_fd, pipe_in, min(count, capacity - held), flags=_SPLICE_FLAGS)
            except BlockingIOError:
                n = -1
            except OSError as exc:
                raise SourceEnded(f"socket connection broken: {exc}") from exc
            if n == 0:
                raise SourceEnded(f"the peer closed the connection with {count} bytes of a frame to come")
            if n > 0:
                count -= n
                held += n
                moved = True
        if held:
            try:
                n = os.splice(pipe_out, dst_fd, held, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                n = 0
            except OSError as exc:
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
            if n:
                held -= n
                moved = True
        if not moved:
            if held:
                await trio.lowlevel.wait_writable(dst)
            else:
                await trio.lowlevel.wait_readable(src)
    await _maybe_yield()


def unread_bytes(stream: trio.abc.Stream) -> bool:
    """Whether the client sent bytes ksi has not read yet (socket streams; other streams: no)."""
    raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    if isinstance(stream, trio.SSLStream):
        # Decrypted or undecrypted bytes trio holds for the next receive (private, so looked up carefully).
        ssl_object, incoming = getattr(stream, "_ssl_object", None), getattr(stream, "_incoming", None)
        if (ssl_object is not None and ssl_object.pending()) or (incoming is not None and incoming.pending):
            return True
    sock = getattr(raw, "socket", None)
    if sock is None:
        return False
    count = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, count, True)
    except OSError:
        return True  # cannot tell: keep the connection
    return count[0] > 0
