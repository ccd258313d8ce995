"""The minimal relays :mod:`relay_loop` measures beside ksi, each run as a process of its own (and ksi itself,
run so that the counts can profile it and lengthen its timers): per client connection one broker connection,
each frame read (4-byte size prefix) and written on as it is, no parsing, no metrics; on trio with ksi's own
socket layer (``ksi.rawio``, ``protocol.FrameReader``), on asyncio with a ``Protocol`` (the fast asyncio
interface), and on asyncio with uvloop.

    .venv/bin/python bench/relays.py trio --listen 9100 --upstream 127.0.0.1:9092
    .venv/bin/python bench/relays.py ksi --config ksi.toml --ranges-ttl 3600 --cprofile out.prof

``--cprofile PATH``: cProfile in the event loop's thread, switched on by SIGUSR1 and off (and dumped to PATH)
by SIGUSR2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Any

from protocol import FrameReader

MAX_FRAME = 64 << 20


def serve_trio(listen: int, upstream: tuple[str, int]) -> None:
    import trio

    from ksi import rawio

    async def pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
        reader = FrameReader(MAX_FRAME)
        drained = False
        while data := await rawio.receive_some(source, 256 * 1024, wait_first=drained):
            drained = len(data) < 256 * 1024
            reader.receive_data(data)
            while (frame := reader.next_sized()) is not None:
                await rawio.send_all(sink, frame)

    async def handle(client: trio.SocketStream) -> None:
        broker = await trio.open_tcp_stream(*upstream)
        async with client, broker, trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, broker)
            await pump(broker, client)
            nursery.cancel_scope.cancel()

    trio.run(trio.serve_tcp, handle, listen)


class _Relay(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = FrameReader(MAX_FRAME)
        self.peer: _Relay | None = None
        self.transport: Any = None  # asyncio's or uvloop's transport (uvloop's are not asyncio.Transport)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reader.receive_data(data)
        self.flush()

    def flush(self) -> None:
        """Write the whole frames read so far to the peer (they wait until its connection is up)."""
        if self.peer is None or self.peer.transport is None:
            return
        while (frame := self.reader.next_sized()) is not None:
            self.peer.transport.write(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


def serve_asyncio(listen: int, upstream: tuple[str, int], use_uvloop: bool) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()

        def client_side() -> _Relay:
            relay = _Relay()
            broker = _Relay()
            relay.peer, broker.peer = broker, relay

            async def connect() -> None:
                await loop.create_connection(lambda: broker, *upstream)
                relay.flush()

            task = loop.create_task(connect())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            return relay

        server = await loop.create_server(client_side, "127.0.0.1", listen)
        await server.serve_forever()

    if use_uvloop:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def serve_profiled(path: Path, serve: Any) -> None:
    """Run ``serve()`` with cProfile switched on by SIGUSR1 and off (and dumped to ``path``) by SIGUSR2, in the
    main thread (where the event loop runs)."""
    import cProfile

    profiler = cProfile.Profile()

    def on(signum: int, frame: Any) -> None:
        profiler.enable()

    def off(signum: int, frame: Any) -> None:
        profiler.disable()
        profiler.dump_stats(str(path))
        profiler.clear()

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    serve()


def serve_ksi(config: str, ranges_ttl: float | None) -> None:
    """``ksi serve``; ``ranges_ttl``: how long the lake's offset ranges are used before a Fetch refreshes them
    (``ksi.lake.catalog.RANGES_TTL_SECONDS``, 2 s): the counting run makes it long, so that a refresh, which
    comes every 2 s of wall time and not per request, does not fall into a run slowed down by valgrind."""
    import runpy

    if ranges_ttl is not None:
        import ksi.lake.catalog

        ksi.lake.catalog.RANGES_TTL_SECONDS = ranges_ttl
    sys.argv = ["ksi", "serve", "--config", config]
    with contextlib.suppress(SystemExit):
        runpy.run_module("ksi", run_name="__main__", alter_sys=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("relay", choices=("ksi", "trio", "asyncio", "uvloop"))
    parser.add_argument("--listen", type=int, help="the port to listen on (not ksi: its config says)")
    parser.add_argument("--upstream", help="the broker, host:port (not ksi: its config says)")
    parser.add_argument("--config", help="ksi's config file")
    parser.add_argument("--cprofile", type=Path, help="cProfile, on with SIGUSR1, off and dumped here with SIGUSR2")
    parser.add_argument("--ranges-ttl", type=float, help="ksi: seconds the lake's offset ranges are used")
    args = parser.parse_args()

    def serve() -> None:
        if args.relay == "ksi":
            serve_ksi(args.config, args.ranges_ttl)
            return
        host, port = args.upstream.rsplit(":", 1)
        if args.relay == "trio":
            serve_trio(args.listen, (host, int(port)))
        else:
            serve_asyncio(args.listen, (host, int(port)), args.relay == "uvloop")

    if args.cprofile is not None:
        serve_profiled(args.cprofile, serve)
    else:
        serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
