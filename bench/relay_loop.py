"""Event-loop benchmark (issue 18): what a Fetch round trip costs in a minimal frame relay on trio, asyncio
and asyncio + uvloop, beside ksi itself, against the same broker.

    .venv/bin/python bench/relay_loop.py                 # 3 rounds of 5 s per path
    .venv/bin/python bench/relay_loop.py --seconds 3 --rounds 2

Starts noida-db (which answers an empty Fetch at once, so a client at the tail of a topic makes round trips
as fast as the path allows) and, as separate processes: ``python -m ksi serve`` with the topic configured
for history (the whole request path: history filter, metrics, response scans), and this file's minimal
relay (``--serve LOOP``): per client connection one broker connection, each frame read (4-byte size
prefix) and written on as it is, no parsing, no metrics; on trio with ksi's own socket layer
(``ksi.rawio``: non-blocking system calls first), on asyncio with a ``Protocol`` (the fast asyncio
interface), and on asyncio with uvloop (libuv) if it is installed.

The client is this process: one blocking socket sending a Fetch v12 for the topic's tail (encoded once)
and reading the answer, in a loop, ``--seconds`` per run; runs alternate between paths in each round.
For each path: round trips per second and the path's CPU (utime + stime, all threads) per round trip.  The
gap between ksi and the trio relay is ksi's own code; the gap between the relays is the event loop's.

``--profile``: then one more run of ksi and of the trio relay under py-spy (``--format raw``), each sample
put in a group by its innermost frame: socket system calls (``os.read``/``os.write``/``os.writev`` in
ksi.rawio), trio (its run loop, epoll I/O manager, outcome), ksi and protocol code, other.  py-spy counts a
thread that is runnable but not running as busy, so on a loaded machine the system calls' share (which wake
the peer) is overstated; the CPU per round trip above is not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from harness import IDLE_LEAVES, KsiProcess, find_py_spy, machine
from ksi.brokers import free_port, start_noida
from passthrough import history_catalog
from protocol import FrameReader

TOPIC = "loop"
MAX_FRAME = 64 << 20


# -- the relays (run with --serve) -----------------------------------------------------------------------


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


# -- the client and the measurement ------------------------------------------------------------------------


class Target:
    def __init__(self, name: str, port: int, process: subprocess.Popen[bytes] | KsiProcess | None) -> None:
        self.name, self.port, self.process = name, port, process
        self.round_trips: list[float] = []
        self.us_per_round_trip: list[float] = []

    def pid(self) -> int:
        assert self.process is not None
        return self.process.process.pid if isinstance(self.process, KsiProcess) else self.process.pid

    def cpu_seconds(self) -> float:
        if self.process is None:
            return 0.0
        stat = Path(f"/proc/{self.pid()}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fetch_frame() -> bytes:
    from kafka.protocol.consumer import FetchRequest

    T = FetchRequest.FetchTopic
    request = FetchRequest(version=12, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                               version=12, topic=TOPIC, partitions=[T.FetchPartition(
                                   version=12, partition=0, current_leader_epoch=-1, fetch_offset=0,
                                   last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])],
                           forgotten_topics_data=[], rack_id="")
    request.with_header(correlation_id=1, client_id="relay-loop")
    body = bytes(request.encode(version=12, header=True))
    return len(body).to_bytes(4, "big") + body


def round_trips(port: int, frame: bytes, seconds: float) -> int:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        n = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            sock.sendall(frame)
            head = sock.recv(4, socket.MSG_WAITALL)
            if len(head) < 4:
                raise SystemExit(f"connection to port {port} closed")
            size = int.from_bytes(head, "big")
            got = 0
            while got < size:
                chunk = sock.recv(size - got)
                if not chunk:
                    raise SystemExit(f"connection to port {port} closed mid-frame")
                got += len(chunk)
            n += 1
        return n


def group(leaf: str) -> str:
    """The group of a py-spy frame "function (file:line)" (see --profile)."""
    if "ksi/rawio.py" in leaf and leaf.startswith(("send_all", "send_parts", "receive_some")):
        return "socket system calls (ksi.rawio)"
    if "trio/" in leaf or "outcome/" in leaf or "sniffio" in leaf:
        return "trio (run loop, I/O manager)"
    if "ksi/" in leaf or "protocol/" in leaf or "kafka/" in leaf or "prometheus_client" in leaf:
        return "ksi and protocol code"
    return "other"


def profile(py_spy: str, target: Target, frame: bytes, seconds: float, output: Path) -> list[str]:
    pid = target.pid()
    spy = subprocess.Popen([py_spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "200", "--output",
                            str(output)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)
    round_trips(target.port, frame, seconds)
    spy.send_signal(signal.SIGINT)
    spy.wait(60)
    groups: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for line in output.read_text(errors="replace").splitlines() if output.exists() else []:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.split(";")[-1]
        if leaf.startswith(IDLE_LEAVES):
            continue  # waiting (epoll, the metrics server, idle worker threads)
        threaded = "_thread_cache.py" in stack or "concurrent/futures" in stack
        kind = "worker threads (lake ranges refresh)" if threaded else group(leaf)
        groups[kind] += int(count)
        leaves[leaf] += int(count)
    total = sum(groups.values()) or 1
    lines = [f"{target.name}: {total} busy samples; by innermost frame: "
             + ", ".join(f"{name} {n / total:.0%}" for name, n in groups.most_common())]
    lines += [f"    {n / total:6.1%}  {leaf}" for leaf, n in leaves.most_common(12)]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="one more run of ksi and the trio relay under py-spy")
    parser.add_argument("--serve", choices=("trio", "asyncio", "uvloop"), help=argparse.SUPPRESS)
    parser.add_argument("--listen", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        host, port = args.upstream.rsplit(":", 1)
        if args.serve == "trio":
            serve_trio(args.listen, (host, int(port)))
        else:
            serve_asyncio(args.listen, (host, int(port)), args.serve == "uvloop")
        return 0

    print("# event-loop benchmark: one client's Fetch round trips at the tail, noida")
    print(machine())
    loops = ["trio", "asyncio"]
    try:
        import uvloop  # noqa: F401

        loops.append("uvloop")
    except ImportError:
        print("(uvloop is not installed: its relay is left out)")
    with tempfile.TemporaryDirectory(prefix="ksi-relay-loop-") as tmp:
        workdir = Path(tmp)
        broker = start_noida(workdir / "noida", log_path=workdir / "noida.log")
        started: list[subprocess.Popen[bytes]] = []
        ksi: KsiProcess | None = None
        try:
            broker.create_topic(TOPIC, 1)
            catalog = history_catalog(workdir, [TOPIC])
            ksi = KsiProcess(workdir, "loop", broker.bootstrap, catalog=catalog,
                             topics=[{"name": TOPIC, "table": f"bench.{TOPIC}"}])
            paths = [Target("direct", broker.port, None), Target("ksi", ksi.port, ksi)]
            for loop in loops:
                port = free_port()
                process = subprocess.Popen([sys.executable, __file__, "--serve", loop, "--listen", str(port),
                                            "--upstream", broker.bootstrap], stdin=subprocess.DEVNULL)
                started.append(process)
                paths.append(Target(f"relay on {loop}", port, process))
            frame = fetch_frame()
            for path in paths:  # warm up and wait for each listener
                deadline = time.monotonic() + 30
                while True:
                    try:
                        round_trips(path.port, frame, 0.5)
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)
            for r in range(args.rounds):
                for path in paths if r % 2 == 0 else reversed(paths):
                    before = path.cpu_seconds()
                    n = round_trips(path.port, frame, args.seconds)
                    cpu = path.cpu_seconds() - before
                    path.round_trips.append(n / args.seconds)
                    path.us_per_round_trip.append(cpu / n * 1e6)
            print(f"\n{args.rounds} runs of {args.seconds:g} s per path, alternating; load average at end"
                  f" {os.getloadavg()[0]:.2f}\n")
            print("| path | round trips/s (median) | CPU of the path per round trip (us, median; runs) |")
            print("|---|---:|---:|")
            for path in paths:
                cpu = "-" if path.process is None else (
                    f"{statistics.median(path.us_per_round_trip):.0f} ("
                    + ", ".join(f"{v:.0f}" for v in path.us_per_round_trip) + ")")
                print(f"| {path.name} | {statistics.median(path.round_trips):,.0f} | {cpu} |")
            if args.profile:
                py_spy = find_py_spy("auto")
                assert py_spy is not None
                print()
                for path in paths[1:3]:
                    for line in profile(py_spy, path, frame, args.seconds, workdir / f"{path.name}.txt"):
                        print(line)
        finally:
            for process in started:
                process.terminate()
                process.wait(10)
            if ksi is not None:
                ksi.stop()
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
