"""Pass-through benchmark: a real broker, straight and through ksi, side by side in one run.

    .venv/bin/python bench/passthrough.py                 # tansu, 1,000,000 records
    .venv/bin/python bench/passthrough.py --broker noida --records 200000
    make bench N=200000

Starts a Kafka-compatible broker (ksi.brokers) and ``python -m ksi serve`` in front of it, then with
the same confluent-kafka settings for both paths measures

  (a) produce throughput: --records values of --value-bytes over --partitions partitions;
  (b) consume throughput: every record of one of those topics, from offset 0;
  (c) produce latency: single acks=all records with linger.ms=0, each produced and flushed before the
      next one (a full client -> broker -> client round trip);
  (d) the proxy's CPU seconds (utime + stime from /proc/PID/stat, all threads) and peak RSS (VmHWM).

Throughput runs alternate between direct and ksi (direct first in odd rounds, ksi first in even ones)
and the table reports the best of --repeats rounds; latency samples alternate in blocks and are pooled.
MB means 10^6 bytes of record values; keys are empty. Runs in well under 3 minutes at the default size
on 2 cores. Use --direct-only to measure the broker and client alone.

Reading the numbers: one Python producer tops out near 700k records/s on its own produce() loop, so
produce throughput is usually client-bound on both paths; the proxy's cost shows in its CPU line and in
the latency lines. Consume throughput is librdkafka's and tells the proxy apart more clearly.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from ksi.brokers import BrokerProcess, free_port, start_noida, start_tansu

# librdkafka's receive buffer: noida ignores fetch size limits, so a fetch answer can be far larger than
# fetch.max.bytes. The proxy gets the same limit as its max_frame_bytes.
MAX_FRAME_BYTES = 512 * 1024 * 1024

PRODUCER_CONFIG: dict[str, object] = {
    "acks": "all",
    "enable.idempotence": False,  # tansu and noida; and it would add a round trip per connection
    "compression.type": "none",
    "linger.ms": 10,
    "batch.size": 1_000_000,
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "delivery.report.only.error": True,  # failures still reach on_delivery; successes cost no Python call
}
LATENCY_PRODUCER_CONFIG: dict[str, object] = {
    "acks": "all",
    "enable.idempotence": False,
    "linger.ms": 0,
}
CONSUMER_CONFIG: dict[str, object] = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "fetch.queue.backoff.ms": 10,  # librdkafka's default (1000) makes a replay ~6x slower
    "receive.message.max.bytes": MAX_FRAME_BYTES,
    "fetch.max.bytes": 52_428_800,
    "max.partition.fetch.bytes": 1_048_576,
}
STALL_SECONDS = 30.0  # give up on a consume that makes no progress for this long
LATENCY_BLOCK = 250  # latency round trips per path before switching to the other
WARMUP_ROUND_TRIPS = 20  # per block, not measured


@dataclass(frozen=True, slots=True)
class Run:
    path: str  # "direct" | "ksi"
    records: int
    seconds: float
    cpu_seconds: float | None  # the proxy's CPU over the run (ksi path only)

    def rate(self) -> float:
        return self.records / self.seconds

    def mb_per_second(self, value_bytes: int) -> float:
        return self.records * value_bytes / self.seconds / 1e6


# -- the proxy ---------------------------------------------------------------------------------------


class ProxyProcess:
    """``python -m ksi serve`` as a child process, with its log in ``workdir``."""

    def __init__(self, workdir: Path, upstream: str) -> None:
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.metrics_port = free_port()
        self.config_path = workdir / "ksi.toml"
        self.config_path.write_text(
            "[proxy]\n"
            f'listen = "127.0.0.1:{self.port}"\n'
            f"broker_port_base = {free_port()}\n"
            f"max_frame_bytes = {MAX_FRAME_BYTES}\n"
            'log_level = "warning"\n'
            "\n[upstream]\n"
            f'bootstrap_servers = ["{upstream}"]\n'
            "\n[metrics]\n"
            f'listen = "127.0.0.1:{self.metrics_port}"\n'
        )
        self.log_path = workdir / "ksi.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ksi", "serve", "--config", str(self.config_path)],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        )
        self._wait_listening(30.0)

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"ksi exited with code {self.process.returncode} while starting\n{self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"ksi did not listen on {self.bootstrap} within {timeout:.0f} s\n{self.log_tail()}")
                time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """utime + stime of the proxy process, all threads (fields 14 and 15 of /proc/PID/stat)."""
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_kib(self, key: str) -> int:
        """A line of /proc/PID/status in KiB: VmRSS (now) or VmHWM (peak resident set)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last lines of {self.log_path} ---\n" + "\n".join(text)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


# -- the three measurements ----------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, records: int, partitions: int, values: list[bytes]) -> float:
    """Produce ``records`` values round-robin over ``partitions``; seconds from first produce to flushed."""
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
    producer.list_topics(topic, timeout=10)  # connect and learn the leaders before the clock starts
    send = producer.produce
    n_values = len(values)
    start = time.perf_counter()
    for i in range(records):
        try:
            send(topic, values[i % n_values], partition=i % partitions, on_delivery=on_delivery)
        except BufferError:
            producer.poll(0.05)
            send(topic, values[i % n_values], partition=i % partitions, on_delivery=on_delivery)
    left = producer.flush(120)
    elapsed = time.perf_counter() - start
    if failures or left:
        raise SystemExit(f"produce to {bootstrap}: {len(failures)} failed ({failures[:1]}), {left} undelivered")
    return elapsed


def consume(bootstrap: str, topic: str, records: int, partitions: int) -> float:
    """Read ``records`` records of ``topic`` from offset 0; seconds from assign to the last record."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.monotonic_ns()}",
                         **CONSUMER_CONFIG})
    try:
        consumer.list_topics(topic, timeout=10)
        start = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        seen = 0
        last_progress = start
        while seen < records:
            batch = consumer.consume(10_000, timeout=0.5)
            for msg in batch:
                if msg.error() is not None:
                    raise KafkaException(msg.error())
            now = time.perf_counter()
            if batch:
                seen += len(batch)
                last_progress = now
            elif now - last_progress > STALL_SECONDS:
                raise SystemExit(f"consume from {bootstrap}: stalled at {seen} of {records} records")
        elapsed = time.perf_counter() - start
        if seen != records:
            raise SystemExit(f"consume from {bootstrap}: got {seen} records, expected {records}")
        return elapsed
    finally:
        consumer.close()


def produce_latencies(bootstrap: str, topic: str, samples: int, partitions: int, value: bytes) -> list[float]:
    """``samples`` produce+flush round trips of one record each, in seconds."""
    producer = Producer({"bootstrap.servers": bootstrap, **LATENCY_PRODUCER_CONFIG})
    producer.list_topics(topic, timeout=10)
    for _ in range(WARMUP_ROUND_TRIPS):  # connections, metadata, the broker's first append
        producer.produce(topic, value, partition=0)
        producer.flush(10)
    out = []
    for i in range(samples):
        start = time.perf_counter()
        producer.produce(topic, value, partition=i % partitions)
        if producer.flush(10):
            raise SystemExit(f"latency produce to {bootstrap}: not delivered within 10 s")
        out.append(time.perf_counter() - start)
    return out


# -- orchestration and report --------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def timed(path: str, proxy: ProxyProcess | None, records: int, action: Callable[[], float]) -> Run:
    cpu_before = proxy.cpu_seconds() if proxy and path == "ksi" else None
    seconds = action()
    cpu = proxy.cpu_seconds() - cpu_before if proxy and cpu_before is not None else None
    return Run(path, records, seconds, cpu)


def rounds(paths: list[str], repeats: int) -> list[str]:
    """direct, ksi, ksi, direct, direct, ksi, ...: each path goes first equally often."""
    order: list[str] = []
    for r in range(repeats):
        order += paths if r % 2 == 0 else paths[::-1]
    return order


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=("tansu", "noida"), default="tansu")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="throughput rounds per path (best is reported)")
    parser.add_argument("--latency-samples", type=int, default=2000, help="round trips per path")
    parser.add_argument("--direct-only", action="store_true", help="no proxy: measure the broker alone")
    args = parser.parse_args()

    values = [os.urandom(args.value_bytes) for _ in range(64)]
    paths = ["direct"] if args.direct_only else ["direct", "ksi"]
    bench_start = time.perf_counter()

    print(f"# ksi pass-through benchmark: {args.broker}, {args.records:,} records x {args.value_bytes} B, "
          f"{args.partitions} partitions")
    print(f"python {platform.python_version()}, confluent-kafka {confluent_kafka.__version__}, "
          f"librdkafka {confluent_kafka.libversion()[0]}, {os.cpu_count()} CPUs")
    print(f"producer:         {PRODUCER_CONFIG}")
    print(f"latency producer: {LATENCY_PRODUCER_CONFIG}")
    print(f"consumer:         {CONSUMER_CONFIG}")
    print()

    with tempfile.TemporaryDirectory(prefix="ksi-bench-") as tmp:
        workdir = Path(tmp)
        broker: BrokerProcess | None = None
        proxy: ProxyProcess | None = None
        try:
            if args.broker == "tansu":
                broker = start_tansu(free_port(), log_path=workdir / "tansu.log")
            else:
                broker = start_noida(workdir / "noida", free_port())
            if not args.direct_only:
                proxy = ProxyProcess(workdir, broker.bootstrap)
                cpu_at_start = proxy.cpu_seconds()
                rss_at_start = proxy.memory_kib("VmRSS")
            bootstrap = {"direct": broker.bootstrap, "ksi": proxy.bootstrap if proxy else ""}

            # (a) produce: a fresh topic per run, so each run appends to an empty log
            produce_runs: list[Run] = []
            for i, path in enumerate(rounds(paths, args.repeats)):
                topic = f"bench-produce-{i}-{path}"
                broker.create_topic(topic, args.partitions)
                run = timed(path, proxy, args.records, lambda: produce(
                    bootstrap[path], topic, args.records, args.partitions, values))
                produce_runs.append(run)
                print(f"produce {path:6} {run.rate():>12,.0f} rec/s  {run.seconds:6.2f} s", flush=True)

            # (b) consume: every path reads the same topic, written directly in the first round
            source = "bench-produce-0-direct"
            consume_runs: list[Run] = []
            for path in rounds(paths, args.repeats):
                run = timed(path, proxy, args.records, lambda: consume(
                    bootstrap[path], source, args.records, args.partitions))
                consume_runs.append(run)
                print(f"consume {path:6} {run.rate():>12,.0f} rec/s  {run.seconds:6.2f} s", flush=True)

            # (c) latency: blocks of 250 round trips, alternating paths, pooled per path
            broker.create_topic("bench-latency", args.partitions)
            latencies: dict[str, list[float]] = {p: [] for p in paths}
            cpu_before = proxy.cpu_seconds() if proxy else 0.0
            ksi_round_trips = 0
            while any(len(v) < args.latency_samples for v in latencies.values()):
                for path in paths:
                    n = min(LATENCY_BLOCK, args.latency_samples - len(latencies[path]))
                    if n:
                        latencies[path] += produce_latencies(
                            bootstrap[path], "bench-latency", n, args.partitions, values[0])
                        ksi_round_trips += n + WARMUP_ROUND_TRIPS if path == "ksi" else 0
            latency_cpu = proxy.cpu_seconds() - cpu_before if proxy else 0.0

            if proxy:
                cpu_total = proxy.cpu_seconds() - cpu_at_start
                rss_peak = proxy.memory_kib("VmHWM")
        finally:
            if proxy:
                proxy.stop()
            if broker:
                broker.stop()

    report(args, paths, produce_runs, consume_runs, latencies)
    if proxy:
        print()
        for name, runs in (("produce", produce_runs), ("consume", consume_runs)):
            ksi_runs = [r for r in runs if r.path == "ksi"]
            cpu = sum(r.cpu_seconds or 0.0 for r in ksi_runs)
            wall = sum(r.seconds for r in ksi_runs)
            mb = sum(r.records for r in ksi_runs) * args.value_bytes / 1e6
            # millicores per MB/s = (cpu / wall * 1000) / (mb / wall) = CPU milliseconds per MB
            print(f"ksi CPU, {name}: {cpu:.2f} s over {wall:.2f} s of ksi runs = {cpu / wall:.2f} cores, "
                  f"{cpu * 1000 / mb:.1f} millicores per MB/s")
        print(f"ksi CPU, latency phase: {latency_cpu:.2f} s for {ksi_round_trips} single-record produces "
              f"= {latency_cpu / ksi_round_trips * 1e6:.0f} us each")
        print(f"ksi CPU, whole run: {cpu_total:.2f} s (utime + stime, all threads, after start-up)")
        print(f"ksi memory: RSS {rss_at_start / 1024:.0f} MiB after start-up, peak (VmHWM) {rss_peak / 1024:.0f} MiB")
    print(f"\nbenchmark took {time.perf_counter() - bench_start:.0f} s")
    return 0


def report(args: argparse.Namespace, paths: list[str], produce_runs: list[Run], consume_runs: list[Run],
           latencies: dict[str, list[float]]) -> None:
    print(f"\n## Throughput (best of {args.repeats} alternating rounds; MB = 10^6 B of values)\n")
    print("| path | records/s | MB/s | ratio to direct |")
    print("|---|---:|---:|---:|")
    for name, runs in (("produce", produce_runs), ("consume", consume_runs)):
        best = {p: max((r for r in runs if r.path == p), key=Run.rate) for p in paths}
        for path in paths:
            run = best[path]
            ratio = run.rate() / best["direct"].rate()
            print(f"| {name} {'direct' if path == 'direct' else 'via ksi'} | {run.rate():,.0f} | "
                  f"{run.mb_per_second(args.value_bytes):.1f} | {ratio:.2f} |")
    print(f"\n## Produce latency (acks=all, linger.ms=0, one record produced and flushed, "
          f"{args.latency_samples} round trips per path)\n")
    medians = {}
    for path in paths:
        ordered = sorted(latencies[path])
        medians[path] = statistics.median(ordered)
        extra = ""
        if path != "direct":
            extra = f"  (+{(medians[path] - medians['direct']) * 1e3:.3f} ms median)"
        print(f"- {'direct' if path == 'direct' else 'via ksi'}: median {medians[path] * 1e3:.3f} ms, "
              f"p99 {percentile(ordered, 0.99) * 1e3:.3f} ms{extra}")


if __name__ == "__main__":
    sys.exit(main())
