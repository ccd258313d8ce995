"""Event-loop and relay benchmark (issue 18): what a round trip costs in ksi and in minimal relays (trio,
asyncio, asyncio + uvloop, native C with read/write, native C with splice), against the same broker.

    .venv/bin/python bench/relay_loop.py                        # timing: 3 rounds of 5 s per path and request
    .venv/bin/python bench/relay_loop.py --seconds 3 --rounds 2
    .venv/bin/python bench/relay_loop.py --count 500 --top 25   # counts: instructions, system calls, calls
    .venv/bin/python bench/relay_loop.py --count 300 --paths ksi,trio

Starts noida-db (which answers an empty Fetch at once, so a client at the tail of a topic makes round trips
as fast as the path allows) and, as separate processes: ``python -m ksi serve`` with the topics configured
for history (the whole request path: history filter, metrics, response scans), and the minimal relays
(``bench/relays.py``): per
client connection one broker connection, each frame read (4-byte size prefix) and written on as it is, no
parsing, no metrics; on trio with ksi's own socket layer (``ksi.rawio``, ``protocol.FrameReader``), on
asyncio with a ``Protocol`` (the fast asyncio interface), on asyncio with uvloop if it is installed, and
``bench/relay_native.c`` (built with gcc into .cache/bench): an epoll loop that relays bytes as they come,
with read(2)/write(2) or with splice(2) through a pipe (the bytes never reach user space): the floor of any
relay.

Three requests, each from one blocking client socket, encoded once: a Fetch v12 at the tail of an empty
topic, an acks=all Produce v9 of one 100-byte record, and a Fetch v12 of one batch of 1024 records of
1000 bytes (about 1 MB: the per-byte cost).

Timing (the default): ``--seconds`` of round trips per path and request, paths alternating in each round;
round trips per second and the path's CPU (utime + stime, all threads) per round trip.  On a shared machine
these move with the load.

``--count N``: what does not move with the load.  Per path and request, N round trips after a warm-up:
instructions per round trip (valgrind's callgrind on the path's process, counted per thread, switched on
once it is warm; what the process executes idle for as long is measured before and after and subtracted),
system calls per round trip (``strace -c -f``), and Python function calls per round trip (cProfile in the
event loop's thread, switched on and off by signals: ``--top K`` lists the K most called).  ksi's timers
that run by wall time (the lake's range refresh every 2 s, the cluster discovery every 30 s) are set to an
hour for the counts: under valgrind a run lasts 20-50 times as long, and they would be counted as if each
round trip paid for them.  Instructions are user space only: the kernel's side of the system calls is not
in them (the timing's CPU has it).

``--profile`` (timing): then one more run of ksi and of the trio relay under py-spy (``--format raw``),
each sample put in a group by its innermost frame.
"""

from __future__ import annotations

import argparse
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
from passthrough import history_catalog, settle

TOPIC = "loop"
PRODUCE_TOPIC = "loop-produce"  # Fetch reads TOPIC at its tail: it stays empty
BULK_TOPIC = "loop-bulk"        # one batch of BULK_RECORDS records of 1000 bytes, fetched whole again and again
BULK_RECORDS = 1024
TOPICS = (TOPIC, PRODUCE_TOPIC, BULK_TOPIC)
RELAYS = Path(__file__).with_name("relays.py")  # the relays measured, each run as a process of its own


# -- the client and the measurement ------------------------------------------------------------------------


class Target:
    def __init__(self, name: str, port: int, process: subprocess.Popen[bytes] | KsiProcess | None) -> None:
        self.name, self.port, self.process = name, port, process
        self.round_trips: dict[str, list[float]] = {}
        self.us_per_round_trip: dict[str, list[float]] = {}

    def pid(self) -> int:
        assert self.process is not None
        return self.process.process.pid if isinstance(self.process, KsiProcess) else self.process.pid

    def cpu_seconds(self) -> float:
        if self.process is None:
            return 0.0
        stat = Path(f"/proc/{self.pid()}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fetch_frame(topic: str = TOPIC) -> bytes:
    """A Fetch v12 of partition 0 of ``topic`` from offset 0, up to 2 MiB, as librdkafka sends it to noida
    (which offers v13, but names no topic ids, so librdkafka stays at v12): at the tail of an empty topic,
    or the whole of BULK_TOPIC's batch."""
    from kafka.protocol.consumer import FetchRequest

    version = 12
    T = FetchRequest.FetchTopic
    request = FetchRequest(version=version, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=2 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                               version=version, topic=topic, partitions=[T.FetchPartition(
                                   version=version, partition=0, current_leader_epoch=-1, fetch_offset=0,
                                   last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=2 << 20)])],
                           forgotten_topics_data=[], rack_id="")
    request.with_header(correlation_id=1, client_id="relay-loop")
    body = bytes(request.encode(version=version, header=True))
    return len(body).to_bytes(4, "big") + body


def produce_frame(version: int = 9, value_bytes: int = 100, records: int = 1, topic: str = PRODUCE_TOPIC) -> bytes:
    """A Produce (acks=all) of ``records`` records to partition 0 of ``topic``, as librdkafka sends it to
    noida (v9: flexible)."""
    from kafka.protocol.producer import ProduceRequest
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=64 << 20)
    for offset in range(records):
        builder.append(offset, timestamp=None, key=None, value=b"v" * value_bytes, headers=[])
    T = ProduceRequest.TopicProduceData
    request = ProduceRequest(version=version, transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[T(
        version=version, name=topic, partition_data=[T.PartitionProduceData(
            version=version, index=0, records=bytes(builder.build()))])])
    request.with_header(correlation_id=1, client_id="relay-loop")
    body = bytes(request.encode(version=version, header=True))
    return len(body).to_bytes(4, "big") + body


def fill_bulk_topic(port: int) -> None:
    """BULK_TOPIC's one batch, produced straight to the broker."""
    with connected(port) as sock:
        exchange(sock, produce_frame(value_bytes=1000, records=BULK_RECORDS, topic=BULK_TOPIC), port)


FETCH = "Fetch v12 at the tail"
PRODUCE = "Produce v9 acks=all, one 100 B record"
BULK = f"Fetch v12 of {BULK_RECORDS} records of 1000 B"


def requests() -> dict[str, bytes]:
    """The requests measured, as frames."""
    return {FETCH: fetch_frame(), PRODUCE: produce_frame(), BULK: fetch_frame(BULK_TOPIC)}


def exchange(sock: socket.socket, frame: bytes, port: int) -> None:
    """One round trip on a connected blocking socket."""
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


def connected(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def round_trips(port: int, frame: bytes, seconds: float) -> int:
    with connected(port) as sock:
        n = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            exchange(sock, frame, port)
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


# -- deterministic counts: instructions (callgrind), system calls (strace), Python calls (cProfile) ---------

WARMUP_ROUND_TRIPS = 300
# ksi's timers that run by wall time, not per request (the lake's range refresh, every 2 s; the cluster
# discovery, every 30 s), are set this long in the counting run: under valgrind a run takes 20-50 times as
# long, and they would be counted as if each round trip paid for them.
STEADY_SECONDS = 3600
IDLE_SECONDS = 10.0


NATIVE = "native (C)"
NATIVE_SPLICE = "native splice (C)"


def native_relay() -> str | None:
    """bench/relay_native.c built with gcc into .cache/bench (again when the source is newer); None without gcc."""
    source = Path(__file__).with_name("relay_native.c")
    binary = Path(__file__).resolve().parent.parent / ".cache" / "bench" / "relay_native"
    if binary.exists() and binary.stat().st_mtime >= source.stat().st_mtime:
        return str(binary)
    binary.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["gcc", "-O2", "-Wall", "-o", str(binary), str(source)], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"(the native relay is left out: gcc failed: {exc})")
        return None
    return str(binary)


def relay_command(loop: str, port: int, upstream: str, cprofile: Path | None = None) -> list[str]:
    """The command line of the relay on ``loop`` listening on ``port``."""
    if loop in (NATIVE, NATIVE_SPLICE):
        binary = native_relay()
        assert binary is not None
        host, upstream_port = upstream.rsplit(":", 1)
        return [binary, str(port), host, upstream_port, *(["splice"] if loop == NATIVE_SPLICE else [])]
    return [sys.executable, str(RELAYS), loop, "--listen", str(port), "--upstream", upstream,
            *(["--cprofile", str(cprofile)] if cprofile is not None else [])]


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _wait_port(port: int, process: subprocess.Popen[bytes], timeout: float, name: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"{name} did not listen on {port}") from None
            time.sleep(0.5)


def _cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _quiet(pid: int, timeout: float = 120.0) -> None:
    """Wait until the process's start-up is over (ksi opens the lake after it listens): CPU below 3% for a
    second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = _cpu_seconds(pid)
        time.sleep(1.0)
        if _cpu_seconds(pid) - before < 0.03:
            return


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _warm(port: int, frames: dict[str, bytes]) -> None:
    for frame in frames.values():
        with connected(port) as sock:
            for _ in range(WARMUP_ROUND_TRIPS):
                exchange(sock, frame, port)


def _dumps(prefix: Path) -> set[Path]:
    return set(prefix.parent.glob(prefix.name + "*"))


def _callgrind_total(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)


def _collected(pid: int, prefix: Path, action: Any) -> tuple[int, int]:
    """Instructions the process executed while ``action()`` ran: (the event loop's thread, all threads).
    Counters zeroed before, dumped after (one dump file per thread; thread 1 runs the event loop)."""
    _control(pid, "--zero")
    before = _dumps(prefix)
    action()
    _control(pid, "--dump")
    deadline = time.monotonic() + 60
    while not _dumps(prefix) - before:
        if time.monotonic() > deadline:
            raise SystemExit(f"callgrind wrote no dump for {prefix}")
        time.sleep(0.2)
    time.sleep(1.0)  # every thread's file written completely
    new = _dumps(prefix) - before
    main = min(new, key=lambda path: path.name.rsplit("-", 1)[-1])
    return _callgrind_total(main), sum(_callgrind_total(path) for path in new)


def count_instructions(name: str, argv: list[str], port: int, frames: dict[str, bytes], n: int,
                       workdir: Path) -> dict[str, Any]:
    """Under callgrind (instrumented once warm, one count per thread): per kind of request, ``n`` round
    trips on one connection; the instructions per round trip of the event loop's thread and of all threads,
    less what the process executes idle for as long (its timers), measured before and after."""
    prefix = workdir / f"callgrind-{name.replace(' ', '-')}"
    process = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                                f"--callgrind-out-file={prefix}.%p", *argv],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result: dict[str, Any] = {}
    try:
        _wait_port(port, process, 900, f"{name} under valgrind")
        _warm(port, frames)
        time.sleep(IDLE_SECONDS)
        _control(process.pid, "--instr=on")
        idle = [_collected(process.pid, prefix, lambda: time.sleep(IDLE_SECONDS))]
        walls = {}
        raw = {}
        for kind, frame in frames.items():
            with connected(port) as sock:
                for _ in range(20):
                    exchange(sock, frame, port)
                started = time.monotonic()

                def run(sock: socket.socket = sock, frame: bytes = frame) -> None:
                    for _ in range(n):
                        exchange(sock, frame, port)

                raw[kind] = _collected(process.pid, prefix, run)
                walls[kind] = time.monotonic() - started
        idle.append(_collected(process.pid, prefix, lambda: time.sleep(IDLE_SECONDS)))
        loop_idle = max(i[0] for i in idle) / IDLE_SECONDS  # the larger: subtract no more than could be idle
        all_idle = max(i[1] for i in idle) / IDLE_SECONDS
        result["idle"] = (loop_idle, all_idle, [i[0] / IDLE_SECONDS for i in idle])
        for kind in frames:
            loop, every = raw[kind]
            result[kind] = ((loop - loop_idle * walls[kind]) / n, (every - all_idle * walls[kind]) / n, loop / n)
    finally:
        _stop(process)
    return result


def count_syscalls(pid: int, port: int, frame: bytes, n: int, output: Path) -> dict[str, float]:
    """System calls of the process (all threads) per round trip, by name: ``strace -c`` over ``n`` round trips."""
    with connected(port) as sock:
        for _ in range(20):
            exchange(sock, frame, port)
        strace = subprocess.Popen(["strace", "-f", "-c", "-o", str(output), "-p", str(pid)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached
        for _ in range(n):
            exchange(sock, frame, port)
        strace.send_signal(signal.SIGINT)
        strace.wait(60)
    calls: dict[str, float] = {}
    for line in output.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            calls[parts[-1]] = int(parts[3]) / n
    return calls


def count_calls(pid: int, port: int, frame: bytes, n: int, output: Path, top: int) -> tuple[float, list[str]]:
    """Python function calls per round trip in the process's event loop thread (cProfile, switched on and off
    by SIGUSR1/SIGUSR2: see ``--cprofile``), and the top functions by calls and by own time."""
    import pstats

    with connected(port) as sock:
        for _ in range(20):
            exchange(sock, frame, port)
        os.kill(pid, signal.SIGUSR1)
        time.sleep(0.5)
        for _ in range(n):
            exchange(sock, frame, port)
        os.kill(pid, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not output.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
    stats = pstats.Stats(str(output))
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(calls for (_, calls, _, _, _) in entries.values())
    lines = []
    for (path, line, function), (_, calls, own, _, _) in sorted(entries.items(), key=lambda i: -i[1][1])[:top]:
        where = "/".join(Path(path).parts[-2:]) if path != "~" else ""
        lines.append(f"    {calls / n:7.2f} calls {own / n * 1e6:7.1f} us own  {function} ({where}:{line})")
    output.unlink()
    return total / n, lines


def counts_main(args: argparse.Namespace, loops: list[str]) -> int:
    n = args.count
    print(f"# instructions, system calls and Python calls per round trip: {n} round trips per kind, noida")
    print(machine())
    print(f"load average at start {_loadavg()} (the counts do not depend"
          " on it)")
    with tempfile.TemporaryDirectory(prefix="ksi-relay-count-") as tmp:
        workdir = Path(tmp)
        broker = start_noida(workdir / "noida", log_path=workdir / "noida.log")
        try:
            for topic in TOPICS:
                broker.create_topic(topic, 1)
            fill_bulk_topic(broker.port)
            frames = requests()
            catalog = history_catalog(workdir, list(TOPICS))
            ksi = KsiProcess(workdir, "loop", broker.bootstrap, catalog=catalog, topics=[
                {"name": t, "table": f"bench.{t.replace('-', '_')}"} for t in TOPICS])
            ksi.stop()  # its config is used below, with no discovery round during the counts
            config = ksi.config_path.read_text()
            ksi.config_path.write_text(config.replace(
                "[upstream]\n", f"[upstream]\nmetadata_refresh_seconds = {STEADY_SECONDS}\n"))
            targets: list[tuple[str, str, int]] = [("ksi", "ksi", ksi.port)]
            targets += [(f"relay on {loop}", loop, free_port()) for loop in loops]
            if args.paths:
                targets = [t for t in targets if t[1] in args.paths.split(",")]
            syscalls: dict[str, dict[str, dict[str, float]]] = {}
            calls: dict[str, dict[str, tuple[float, list[str]]]] = {}
            instructions: dict[str, dict[str, Any]] = {}
            for name, loop, port in targets:
                slug = name.replace(" ", "-").replace("(", "").replace(")", "")
                profile_path = None if loop in (NATIVE, NATIVE_SPLICE) else workdir / f"cprofile-{slug}.prof"

                def command(profile_path: Path | None, loop: str = loop, port: int = port) -> list[str]:
                    if loop == "ksi":
                        return [sys.executable, str(RELAYS), "ksi", "--config", str(ksi.config_path),
                                "--ranges-ttl", str(STEADY_SECONDS),
                                *(["--cprofile", str(profile_path)] if profile_path is not None else [])]
                    return relay_command(loop, port, broker.bootstrap, profile_path)

                process = subprocess.Popen(command(profile_path), stdin=subprocess.DEVNULL)
                try:
                    _wait_port(port, process, 120, name)
                    _warm(port, frames)
                    _quiet(process.pid)
                    syscalls[name] = {kind: count_syscalls(process.pid, port, frame, n, workdir / f"strace-{slug}.txt")
                                      for kind, frame in frames.items()}
                    if profile_path is not None:
                        calls[name] = {kind: count_calls(process.pid, port, frame, n, profile_path, args.top)
                                       for kind, frame in frames.items()}
                finally:
                    _stop(process)
                instructions[name] = count_instructions(name, command(None), port, frames, n, workdir)
        finally:
            broker.stop()
    print()
    print("| path | request | instructions per round trip: event loop thread (all threads) | Python calls |"
          " system calls (all threads) |")
    print("|---|---|---:|---:|---|")
    for name, found in instructions.items():
        for kind in frames:
            loop, every, _ = found[kind]
            counted = syscalls[name][kind]
            listed = ", ".join(f"{call} {count:.2f}" for call, count in sorted(counted.items(), key=lambda i: -i[1])
                               if count >= 0.05)
            python_calls = f"{calls[name][kind][0]:.1f}" if name in calls else "-"
            print(f"| {name} | {kind} | {loop:,.0f} ({every:,.0f}) | {python_calls} |"
                  f" {sum(counted.values()):.2f}: {listed} |")
    print()
    for name, found in instructions.items():
        loop_idle, all_idle, measured = found["idle"]
        print(f"{name}: idle, {loop_idle:,.0f} instructions per second in the event loop's thread (before and after:"
              f" {', '.join(f'{v:,.0f}' for v in measured)}), {all_idle:,.0f} in all threads; subtracted above")
    if args.top:
        for name in calls:
            for kind in frames:
                print(f"\n## {name}, {kind}: top Python functions by calls per round trip (cProfile; its own time"
                      " is inflated by the profiler)\n")
                print("\n".join(calls[name][kind][1]))
    print(f"\nload average at end {_loadavg()}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="one more run of ksi and the trio relay under py-spy")
    parser.add_argument("--count", type=int, metavar="N", help="instead of timing: instructions (callgrind) and"
                        " system calls (strace) per round trip over N round trips of each kind")
    parser.add_argument("--paths", help="with --count: only these paths, comma-separated (ksi, trio, asyncio, uvloop,"
                        f" {NATIVE!r}, {NATIVE_SPLICE!r})")
    parser.add_argument("--top", type=int, default=0, help="with --count: the top Python functions of each path")
    args = parser.parse_args()
    loops = ["trio", "asyncio"]
    try:
        import uvloop  # noqa: F401

        loops.append("uvloop")
    except ImportError:
        print("(uvloop is not installed: its relay is left out)")
    if native_relay() is not None:
        loops += [NATIVE, NATIVE_SPLICE]
    if args.count:
        return counts_main(args, loops)
    print("# event-loop benchmark: one client's round trips (a Fetch at the tail, an acks=all Produce), noida")
    print(machine())
    with tempfile.TemporaryDirectory(prefix="ksi-relay-loop-") as tmp:
        workdir = Path(tmp)
        broker = start_noida(workdir / "noida", log_path=workdir / "noida.log")
        started: list[subprocess.Popen[bytes]] = []
        ksi: KsiProcess | None = None
        try:
            for topic in TOPICS:
                broker.create_topic(topic, 1)
            fill_bulk_topic(broker.port)
            catalog = history_catalog(workdir, list(TOPICS))
            ksi = KsiProcess(workdir, "loop", broker.bootstrap, catalog=catalog, topics=[
                {"name": t, "table": f"bench.{t.replace('-', '_')}"} for t in TOPICS])
            settle(ksi, TOPIC)
            paths = [Target("direct", broker.port, None), Target("ksi", ksi.port, ksi)]
            for loop in loops:
                port = free_port()
                process = subprocess.Popen(relay_command(loop, port, broker.bootstrap), stdin=subprocess.DEVNULL)
                started.append(process)
                paths.append(Target(f"relay on {loop}", port, process))
            frames = requests()
            frame = frames[FETCH]
            for path in paths:  # warm up and wait for each listener
                deadline = time.monotonic() + 30
                while True:
                    try:
                        for warm in frames.values():
                            round_trips(path.port, warm, 0.5)
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)
            print(f"load average at start {_loadavg()}")
            for r in range(args.rounds):
                for kind, sent in frames.items():
                    for path in paths if r % 2 == 0 else reversed(paths):
                        before = path.cpu_seconds()
                        n = round_trips(path.port, sent, args.seconds)
                        cpu = path.cpu_seconds() - before
                        path.round_trips.setdefault(kind, []).append(n / args.seconds)
                        path.us_per_round_trip.setdefault(kind, []).append(cpu / n * 1e6)
            print(f"\n{args.rounds} runs of {args.seconds:g} s per path and request, alternating; load average at end"
                  f" {_loadavg()}\n")
            print("| path | request | round trips/s (median) | CPU of the path per round trip (us, median; runs) |")
            print("|---|---|---:|---:|")
            for kind in frames:
                for path in paths:
                    cpu = "-" if path.process is None else (
                        f"{statistics.median(path.us_per_round_trip[kind]):.0f} ("
                        + ", ".join(f"{v:.0f}" for v in path.us_per_round_trip[kind]) + ")")
                    print(f"| {path.name} | {kind} | {statistics.median(path.round_trips[kind]):,.0f} | {cpu} |")
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
