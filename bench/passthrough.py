"""Pass-through benchmark (issue 18): what ksi adds to every request, measured against the same clients
straight to the broker, interleaved in one run.

    .venv/bin/python bench/passthrough.py                       # noida-db, defaults below
    .venv/bin/python bench/passthrough.py --quick               # a smaller run (about a minute)
    .venv/bin/python bench/passthrough.py --profile             # and py-spy profiles of ksi per phase
    .venv/bin/python bench/passthrough.py --placement ksi-own-cpu   # ksi on a CPU of its own (--help: others)
    make bench-passthrough PASSTHROUGH_ARGS='--broker tansu'

Starts a Kafka-compatible broker (ksi.brokers; noida-db by default, which answers an empty Fetch at once, so
a consumer at the tail polls in a loop and every round trip shows) and ``python -m ksi serve`` in front of
it.  By default the benchmarked topics are configured with history (``--history same``: a ``[[topics]]``
entry per topic, each with an empty ksi-layout Iceberg table in a SQLite catalog), so the whole request
path is active as it is for a topic with history; ``--history other`` configures an unrelated topic only,
``--history none`` none.  With the same confluent-kafka settings for both paths it measures:

  (1) produce latency: one record produced with acks=all, linger.ms=0, and flushed before the next;
  (2) produce-to-consume latency: one record produced (acks=all) and the time until a consumer at the
      tail of the partition receives it, one at a time;
  (3) pass-through throughput and ksi's CPU: N producer processes and N consumer processes on N
      partitions at once (each producer writes its partition, each consumer reads one), for each N of
      --workers (default 1 and 8), at 100-byte and 1 KiB values; wall time from the start until the last
      record is consumed;
  (4) a consumer idling at the tail of a topic for --idle-seconds: ksi's CPU and its Fetch round trips.

Latency samples alternate between direct and ksi in blocks of 250 and are pooled; throughput runs
alternate (direct, ksi, ksi, direct, ...), and the ratio is the median of each pair's (a pair of runs made
one after the other shares the machine's load of the moment).  The report ends with the issue's targets as
this run measured them.  ksi's CPU is utime + stime of its process, all threads.  MB = 10^6 bytes of
record values produced; each record crosses ksi twice (produced and consumed), and "millicores per MB/s" =
ksi CPU milliseconds per MB produced and consumed once.  ksi's start-up (it listens before it has imported
the lake's libraries) is waited out before the first phase.  Figures on a shared machine are indicative:
the report prints the load average at the start and the end of each phase.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import statistics
import struct
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, Producer, TopicPartition

# bench/ is on sys.path when this runs as a script (and in the worker processes it spawns).
from harness import (
    MAX_FRAME_BYTES,
    KsiProcess,
    add_placement_option,
    find_py_spy,
    machine,
    percentile,
    pin,
    placement_of,
    rounds,
    summarise_profile,
)
from ksi.brokers import BrokerProcess, free_port, start_noida, start_tansu
from reads import CONSUMER_CONFIG  # the cold benchmark's consumer settings: one set for every benchmark

__all__ = ["CONSUMER_CONFIG", "MAX_FRAME_BYTES", "PRODUCER_CONFIG"]

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
LATENCY_PRODUCER_CONFIG: dict[str, object] = {"acks": "all", "enable.idempotence": False, "linger.ms": 0}
TAIL_CONSUMER_CONFIG: dict[str, object] = {**CONSUMER_CONFIG, "fetch.wait.max.ms": 100}
LATENCY_BLOCK = 250
WARMUP = 20
STALL_SECONDS = 60.0
WORKERS = 8


# -- (1) and (2): latency, one record at a time ------------------------------------------------------------


def produce_latencies(bootstrap: str, topic: str, samples: int, value: bytes) -> list[float]:
    producer = Producer({"bootstrap.servers": bootstrap, **LATENCY_PRODUCER_CONFIG})
    producer.list_topics(topic, timeout=10)
    for _ in range(WARMUP):
        producer.produce(topic, value, partition=0)
        producer.flush(10)
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        producer.produce(topic, value, partition=0)
        if producer.flush(10):
            raise SystemExit(f"latency produce to {bootstrap}: not delivered within 10 s")
        out.append(time.perf_counter() - start)
    return out


def end_to_end_latencies(bootstrap: str, topic: str, samples: int, value_bytes: int) -> list[float]:
    """Produce one record, wait until the tail consumer has it; the time between, per record."""
    producer = Producer({"bootstrap.servers": bootstrap, **LATENCY_PRODUCER_CONFIG})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"e2e-{time.monotonic_ns()}",
                         **TAIL_CONSUMER_CONFIG})
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, end)])
        pad = b"\x00" * max(0, value_bytes - 12)
        out: list[float] = []
        for i in range(-WARMUP, samples):
            start = time.perf_counter()
            producer.produce(topic, struct.pack(">iq", i, time.perf_counter_ns()) + pad, partition=0)
            producer.poll(0)
            deadline = start + 10
            while True:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None and struct.unpack_from(">i", msg.value())[0] == i:
                    break
                if msg is not None and msg.error() is not None and not msg.error().code() == -191:  # partition EOF
                    raise KafkaException(msg.error())
                if time.perf_counter() > deadline:
                    raise SystemExit(f"end-to-end via {bootstrap}: record {i} not consumed within 10 s")
            if i >= 0:
                out.append(time.perf_counter() - start)
            producer.flush(10)
        return out
    finally:
        consumer.close()


# -- (3): 8 producers and 8 consumers, each in its own process -----------------------------------------


def _producer_worker(bootstrap: str, topic: str, partition: int, records: int, value_bytes: int,
                     barrier: Any, results: Any) -> None:
    try:
        values = [os.urandom(value_bytes) for _ in range(16)]
        producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
        producer.list_topics(topic, timeout=10)
        barrier.wait()
        cpu = time.process_time()
        for i in range(records):
            while True:
                try:
                    producer.produce(topic, values[i & 15], partition=partition)
                    break
                except BufferError:
                    producer.poll(0.01)
        if producer.flush(120):
            raise RuntimeError("records left undelivered after 120 s")
        results.put(("produced", partition, time.perf_counter(), time.process_time() - cpu))
    except BaseException as exc:  # noqa: BLE001 - reported by the coordinator
        results.put(("error", partition, repr(exc), 0))


def _consumer_worker(bootstrap: str, topic: str, partition: int, records: int, barrier: Any, results: Any) -> None:
    try:
        gc.disable()  # nothing is kept: Python's collector would only cost CPU (bench/reads.py, stop 31)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"tp-{topic}-{partition}",
                             **CONSUMER_CONFIG})
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        consumer.list_topics(topic, timeout=10)
        barrier.wait()
        cpu = time.process_time()
        seen, last = 0, time.perf_counter()
        while seen < records:
            batch = consumer.consume(10_000, timeout=0.5)
            for msg in batch:
                if msg.error() is not None:
                    raise KafkaException(msg.error())
            if batch:
                seen += len(batch)
                last = time.perf_counter()
            elif time.perf_counter() - last > STALL_SECONDS:
                raise RuntimeError(f"stalled at {seen} of {records} records")
        cpu = time.process_time() - cpu
        consumer.close()
        results.put(("consumed", partition, last, cpu))
    except BaseException as exc:  # noqa: BLE001 - reported by the coordinator
        results.put(("error", partition, repr(exc), 0))


@dataclass(frozen=True, slots=True)
class Run:
    path: str
    value_bytes: int
    records: int
    seconds: float
    cpu_seconds: float | None
    workers: int = WORKERS
    others_cpu_seconds: float = 0.0  # the clients' (from the start on) and the broker's CPU during the run
    round_trips: dict[str, float] | None = None  # through ksi during the run, by API (ksi's runs)

    @property
    def cpu_per_mb(self) -> float:
        """Every process's CPU seconds (clients, broker, and ksi on its path) per MB produced and consumed."""
        return (self.others_cpu_seconds + (self.cpu_seconds or 0)) / (self.records * self.value_bytes / 1e6)

    @property
    def mb_per_second(self) -> float:
        return self.records * self.value_bytes / self.seconds / 1e6

    @property
    def millicores_per_mbs(self) -> float | None:
        if self.cpu_seconds is None:
            return None
        return self.cpu_seconds * 1000 / (self.records * self.value_bytes / 1e6)


def throughput(path: str, bootstrap: str, broker: BrokerProcess, ksi: KsiProcess | None, topic: str,
               per_worker: int, value_bytes: int, workers: int = WORKERS) -> Run:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2 * workers + 1)
    results = context.Queue()
    processes = [context.Process(target=_producer_worker, args=(bootstrap, topic, p, per_worker, value_bytes,
                                                                  barrier, results)) for p in range(workers)]
    processes += [context.Process(target=_consumer_worker, args=(bootstrap, topic, p, per_worker, barrier, results))
                  for p in range(workers)]
    for process in processes:
        process.start()
    barrier.wait(timeout=120)
    start = time.perf_counter()
    cpu_before = ksi.cpu_seconds() if ksi is not None and path == "ksi" else None
    trips_before = answered(ksi) if ksi is not None and path == "ksi" else None
    assert broker.process is not None
    broker_before = process_cpu_seconds(broker.process.pid)
    ends: list[float] = []
    clients_cpu = 0.0
    for _ in range(2 * workers):
        kind, partition, when, extra = results.get(timeout=600)
        if kind == "error":
            raise SystemExit(f"{path} throughput, partition {partition}: {when}")
        if kind == "consumed":
            ends.append(when)
        clients_cpu += extra
    cpu = ksi.cpu_seconds() - cpu_before if ksi is not None and cpu_before is not None else None
    broker_cpu = process_cpu_seconds(broker.process.pid) - broker_before
    trips = None
    if ksi is not None and trips_before is not None:
        trips = {api: n - trips_before.get(api, 0.0) for api, n in answered(ksi).items()}
    for process in processes:
        process.join(30)
    return Run(path, value_bytes, per_worker * workers, max(ends) - start, cpu, workers, clients_cpu + broker_cpu,
               trips)


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads (fields 14 and 15 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- (4): a consumer idling at the tail ----------------------------------------------------------------


def answered(ksi: KsiProcess) -> dict[str, float]:
    """ksi_frames_total{direction="proxy_to_client"} by API, from ksi's /metrics: the round trips so far."""
    assert ksi.metrics_url is not None
    text = urllib.request.urlopen(ksi.metrics_url, timeout=5).read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("ksi_frames_total{") and 'direction="proxy_to_client"' in line:
            api = line.split('api="', 1)[1].split('"', 1)[0]
            found[api] = float(line.rsplit(" ", 1)[1])
    return found


def fetches_answered(ksi: KsiProcess) -> float:
    return answered(ksi).get("Fetch", 0.0)


def idle_tail(bootstrap: str, topic: str, seconds: float, ksi: KsiProcess) -> tuple[float, float]:
    """(ksi CPU cores, Fetch round trips per second) while one consumer waits at the tail of ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"idle-{time.monotonic_ns()}",
                         **TAIL_CONSUMER_CONFIG})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(WORKERS)])
        until = time.perf_counter() + 2
        while time.perf_counter() < until:  # connected and polling
            consumer.poll(0.1)
        cpu, fetches, start = ksi.cpu_seconds(), fetches_answered(ksi), time.perf_counter()
        until = start + seconds
        while time.perf_counter() < until:
            consumer.poll(0.1)
        wall = time.perf_counter() - start
        return (ksi.cpu_seconds() - cpu) / wall, (fetches_answered(ksi) - fetches) / wall
    finally:
        consumer.close()


# -- orchestration -----------------------------------------------------------------------------------


def settle(ksi: KsiProcess, topic: str, quiet: float = 0.03, timeout: float = 120.0) -> float:
    """Wait until ksi serves (a Metadata round trip through it) and its start-up is over: its CPU below
    ``quiet`` cores over a second.  ksi binds its ports before it opens the lake (PyIceberg's and pandas'
    imports: seconds of CPU), so a benchmark that starts as soon as the port answers measures that too.
    Returns the seconds waited."""
    started = time.perf_counter()
    producer = Producer({"bootstrap.servers": ksi.bootstrap, **LATENCY_PRODUCER_CONFIG})
    producer.list_topics(topic, timeout=timeout)
    while time.perf_counter() - started < timeout:
        before = ksi.cpu_seconds()
        time.sleep(1.0)
        if ksi.cpu_seconds() - before < quiet:
            break
    return time.perf_counter() - started


def history_catalog(workdir: Path, topics: list[str]) -> dict[str, str]:
    """A SQLite catalog with an empty ksi-layout table per topic (what ``--history`` configures)."""
    from pyiceberg.catalog.sql import SqlCatalog

    from ksi.history.ksi_table import partition_spec, raw_value_schema, sort_order

    props = {"uri": f"sqlite:///{workdir / 'catalog.db'}", "warehouse": f"file://{workdir / 'warehouse'}"}
    catalog = SqlCatalog("lake", **props)
    catalog.create_namespace("bench")
    for topic in topics:
        catalog.create_table(f"bench.{topic.replace('-', '_')}", schema=raw_value_schema(),
                             partition_spec=partition_spec(), sort_order=sort_order())
    return props


def latency_line(name: str, samples: dict[str, list[float]]) -> str:
    direct, via = sorted(samples["direct"]), sorted(samples["ksi"])
    d50, d99, k50, k99 = (percentile(direct, 0.5), percentile(direct, 0.99), percentile(via, 0.5),
                          percentile(via, 0.99))
    return (f"| {name} | {d50 * 1e3:.3f} / {d99 * 1e3:.3f} | {k50 * 1e3:.3f} / {k99 * 1e3:.3f} | "
            f"{(k50 - d50) * 1e3:+.3f} | {(k99 - d99) * 1e3:+.3f} |")


def overheads(samples: dict[str, list[float]]) -> tuple[float, float]:
    """ksi's p50 and p99 minus direct's, in seconds."""
    return (percentile(samples["ksi"], 0.5) - percentile(samples["direct"], 0.5),
            percentile(samples["ksi"], 0.99) - percentile(samples["direct"], 0.99))


def pair_ratios(runs: list[Run]) -> list[float]:
    """ksi's MB/s over direct's for each pair of runs made one after the other (the runs alternate direct,
    ksi, ksi, direct, ...): a pair shares the machine's load of the moment, which a ratio of medians over
    the whole phase does not on a shared machine."""
    out = []
    for first, second in zip(runs[::2], runs[1::2], strict=False):
        direct, via = (first, second) if first.path == "direct" else (second, first)
        out.append(via.mb_per_second / direct.mb_per_second)
    return out


def interleaved(paths: dict[str, str], samples: int, measure: Any) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {p: [] for p in paths}
    while any(len(v) < samples for v in out.values()):
        for path, bootstrap in paths.items():
            n = min(LATENCY_BLOCK, samples - len(out[path]))
            if n:
                out[path] += measure(bootstrap, n)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=("noida", "tansu"), default="noida")
    parser.add_argument("--history", choices=("same", "other", "none"), default="same",
                        help="[[topics]] entries: for the benchmarked topics (default), for another topic, or none")
    parser.add_argument("--latency-samples", type=int, default=1000, help="round trips per path and kind")
    parser.add_argument("--records-100", type=int, default=100_000, help="records per producer at 100-byte values")
    parser.add_argument("--records-1k", type=int, default=30_000, help="records per producer at 1 KiB values")
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs per path, shape and size")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="300 latency samples, a quarter of the records")
    parser.add_argument("--profile", dest="py_spy", action="store_const", const="auto",
                        help="sample ksi with py-spy in each phase and print where its time goes")
    parser.add_argument("--py-spy", dest="py_spy", help="path of the py-spy binary (implies --profile)")
    parser.add_argument("--workers", default="1,8", help="producer+consumer pairs per throughput run, comma-separated "
                        f"(each 1-{WORKERS}; default 1,8: one pair, and as many as the issue's 8+8)")
    parser.add_argument("--skip", action="append", default=[], choices=("latency", "e2e", "throughput", "idle"))
    add_placement_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.latency_samples, args.records_100, args.records_1k = 300, args.records_100 // 4, args.records_1k // 4
    clients_cpus, server_cpus, ksi_cpus = placement_of(parser, args)
    py_spy = find_py_spy(args.py_spy)
    started, load_start = time.perf_counter(), os.getloadavg()
    print(f"# ksi pass-through benchmark: {args.broker}, history {args.history}, placement {args.placement}"
          + ("" if ksi_cpus is None else f" (clients on CPUs {sorted(clients_cpus or ())}, broker on "
                                         f"{sorted(server_cpus or ())}, ksi on {sorted(ksi_cpus)})"))
    print(f"{machine()}; python {sys.version.split()[0]}, confluent-kafka {confluent_kafka.__version__}, "
          f"librdkafka {confluent_kafka.libversion()[0]}; load average at start {load_start[0]:.2f}")
    print(f"producer {PRODUCER_CONFIG}\nlatency producer {LATENCY_PRODUCER_CONFIG}\nconsumer {CONSUMER_CONFIG}\n",
          flush=True)
    profiles: dict[str, list[str]] = {}
    loads: list[str] = []  # each phase's 1-minute load average at its start and its end
    tput: list[Run] = []
    idle: tuple[float, float] | None = None
    latency: dict[str, dict[str, list[float]]] = {}
    sizes = [(100, args.records_100), (1024, args.records_1k)]
    workers = [int(w) for w in args.workers.split(",") if w]
    if any(not 1 <= w <= WORKERS for w in workers):
        parser.error(f"--workers: each between 1 and {WORKERS}")
    topics = ["bench-latency", "bench-e2e", "bench-idle"] + [
        f"bench-tp-{w}-{size}-{i}-{path}" for w in workers for size, _ in sizes
        for i, path in enumerate(rounds(["direct", "ksi"], args.repeats))]
    with tempfile.TemporaryDirectory(prefix="ksi-passthrough-") as tmp:
        workdir = Path(tmp)
        broker: BrokerProcess | None = None
        ksi: KsiProcess | None = None
        try:
            pin(server_cpus)  # the broker inherits the CPUs it is started on
            broker = (start_noida(workdir / "noida", free_port(), log_path=workdir / "noida.log")
                      if args.broker == "noida" else start_tansu(free_port(), log_path=workdir / "tansu.log"))
            pin(clients_cpus)  # and the client processes these
            # Every topic exists before ksi starts: a configured topic its first discovery does not find in
            # Kafka is served as a lake-only topic.
            for name in topics:
                broker.create_topic(name, 1 if name in ("bench-latency", "bench-e2e") else WORKERS)
            configured = {"same": topics, "other": ["bench-history"], "none": []}[args.history]
            catalog = history_catalog(workdir, configured) if configured else None
            ksi = KsiProcess(workdir, "passthrough", broker.bootstrap, catalog=catalog,
                             topics=[{"name": t, "table": f"bench.{t.replace('-', '_')}"} for t in configured],
                             cpus=ksi_cpus)
            paths = {"direct": broker.bootstrap, "ksi": ksi.bootstrap}
            print(f"ksi settled after {settle(ksi, 'bench-latency'):.1f} s (its start-up is not measured)", flush=True)

            def phase(label: str, action: Any) -> Any:
                if py_spy:
                    ksi.start_profile(py_spy, workdir / f"profile-{label}.txt")  # type: ignore[union-attr]
                load = os.getloadavg()[0]
                try:
                    return action()
                finally:
                    loads.append(f"{label} {load:.2f}-{os.getloadavg()[0]:.2f}")
                    if py_spy:
                        ksi.stop_profile()  # type: ignore[union-attr]
                        profiles[label] = summarise_profile(workdir / f"profile-{label}.txt")

            value = os.urandom(100)
            if "latency" not in args.skip:
                latency["produce (acks=all, one record at a time)"] = phase("produce-latency", lambda: interleaved(
                    paths, args.latency_samples, lambda b, n: produce_latencies(b, "bench-latency", n, value)))
                print("produce latency done", flush=True)
            if "e2e" not in args.skip:
                latency["produce to consume"] = phase("end-to-end", lambda: interleaved(
                    paths, args.latency_samples, lambda b, n: end_to_end_latencies(b, "bench-e2e", n, 100)))
                print("produce-to-consume latency done", flush=True)
            if "idle" not in args.skip:
                idle = phase("idle-tail", lambda: idle_tail(ksi.bootstrap, "bench-idle",  # type: ignore[union-attr]
                                                            args.idle_seconds, ksi))
                print("idle consumer done", flush=True)
            if "throughput" not in args.skip:
                for w in workers:
                    for size, per_worker in sizes:
                        def runs(size: int = size, per_worker: int = per_worker, w: int = w) -> None:
                            for i, path in enumerate(rounds(["direct", "ksi"], args.repeats)):
                                run = throughput(path, paths[path], broker, ksi,  # type: ignore[arg-type]
                                                 f"bench-tp-{w}-{size}-{i}-{path}", per_worker, size, w)
                                tput.append(run)
                                print(f"throughput {w}+{w} {size:>5} B {path:6} {run.mb_per_second:8.1f} MB/s"
                                      f" {run.seconds:6.2f} s", flush=True)
                        phase(f"throughput-{w}-{size}", runs)
            rss_peak = ksi.memory_kib("VmHWM") / 1024
            if ksi.tracebacks():
                print(ksi.log_tail(40))
        finally:
            if ksi is not None:
                ksi.stop()
            if broker is not None:
                broker.stop()
    report(latency, tput, idle, args)
    print(f"\nksi peak RSS {rss_peak:.0f} MiB")
    for label, lines in profiles.items():
        print(f"\n## Profile: {label}\n")
        print("\n".join(lines))
    load_end = os.getloadavg()
    print(f"\nload average (1 min) per phase, at its start-end: {'; '.join(loads)}")
    print(f"load average at end {load_end[0]:.2f}; benchmark took {time.perf_counter() - started:.0f} s")
    return 0


def round_trips_per_mb(tput: list[Run], workers: int, size: int) -> str:
    via = [r for r in tput if (r.workers, r.value_bytes) == (workers, size) and r.round_trips is not None]
    per_mb = {api: statistics.median((r.round_trips or {}).get(api, 0.0) / (r.records * size / 1e6) for r in via)
              for api in ("Produce", "Fetch")}
    return f"{workers}+{workers} {size} B: " + ", ".join(f"{api} {n:.0f}" for api, n in per_mb.items())


PRODUCE_LATENCY = "produce (acks=all, one record at a time)"
TARGET_P50, TARGET_P99, TARGET_MILLICORES, TARGET_RATIO = 0.3e-3, 1e-3, 25.0, 0.95


def report(latency: dict[str, dict[str, list[float]]], tput: list[Run], idle: tuple[float, float] | None,
           args: argparse.Namespace) -> None:
    targets: list[tuple[str, str, bool]] = []
    if latency:
        print(f"\n## Latency (ms, p50 / p99, {args.latency_samples} samples per path, interleaved)\n")
        print("| what | direct | via ksi | p50 overhead | p99 overhead |")
        print("|---|---:|---:|---:|---:|")
        for name, samples in latency.items():
            print(latency_line(name, samples))
        if PRODUCE_LATENCY in latency:
            p50, p99 = overheads(latency[PRODUCE_LATENCY])
            targets.append(("produce p50 overhead <= 0.3 ms", f"{p50 * 1e3:+.3f} ms", p50 <= TARGET_P50))
            targets.append(("produce p99 overhead <= 1 ms", f"{p99 * 1e3:+.3f} ms", p99 <= TARGET_P99))
    if tput:
        print(f"\n## Throughput: N producers + N consumers, each a process ({args.repeats} runs per path, alternating)"
              "\n")
        print("ratio: ksi's MB/s over direct's in each pair of runs made one after the other, median (lowest-highest);"
              " MB/s and ksi's CPU: medians.  CPU per MB: every process's (clients, broker, ksi) CPU seconds per MB,"
              " median; their quotient, direct's over ksi's, is the throughput ratio to expect where the machine's"
              " CPU is the limit (as with 8+8 clients on 2 cores), and depends less on other load than wall time\n")
        print("| producers + consumers | values | direct MB/s | via ksi MB/s | ratio | CPU s per MB: direct, via ksi"
              " (ratio) | ksi cores | ksi millicores per MB/s |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for w, size in sorted({(r.workers, r.value_bytes) for r in tput}):
            runs = [r for r in tput if (r.workers, r.value_bytes) == (w, size)]
            direct = statistics.median(r.mb_per_second for r in runs if r.path == "direct")
            via = [r for r in runs if r.path == "ksi"]
            ratios = pair_ratios(runs)
            ratio = statistics.median(ratios)
            cores = statistics.median((r.cpu_seconds or 0) / r.seconds for r in via)
            mc = statistics.median(r.millicores_per_mbs or 0 for r in via)
            direct_cpu = statistics.median(r.cpu_per_mb for r in runs if r.path == "direct")
            via_cpu = statistics.median(r.cpu_per_mb for r in via)
            print(f"| {w} + {w} | {size} B | {direct:.1f} | {statistics.median(r.mb_per_second for r in via):.1f} | "
                  f"{ratio:.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | {direct_cpu * 1e3:.1f} ms, "
                  f"{via_cpu * 1e3:.1f} ms ({direct_cpu / via_cpu:.2f}) | {cores:.2f} | {mc:.1f} |")
            if w == WORKERS:
                targets.append((f"throughput {w}+{w} at {size} B >= 0.95x direct", f"{ratio:.2f}x",
                                ratio >= TARGET_RATIO))
                if size == 1024:
                    targets.append((f"ksi CPU at {w}+{w}, 1 KiB records <= 25 millicores per MB/s",
                                    f"{mc:.1f}", mc <= TARGET_MILLICORES))
    if tput:
        print("\nksi's round trips per MB in those runs (medians; the Fetches include consumers' polls at the tail): "
              + "; ".join(round_trips_per_mb(tput, w, size) for w, size in sorted({(r.workers, r.value_bytes)
                                                                                  for r in tput})))
    if idle is not None:
        cores, rate = idle
        per = cores / rate * 1e6 if rate else float("nan")
        print(f"\n## A consumer at the tail for {args.idle_seconds:g} s\n")
        print(f"ksi {cores * 1000:.0f} millicores, {rate:,.0f} Fetch round trips/s = {per:.0f} us of ksi CPU each")
    if targets:
        print("\n## The issue's targets, as measured in this run\n")
        print("| target | measured | met |")
        print("|---|---:|---|")
        for name, value, met in targets:
            print(f"| {name} | {value} | {'yes' if met else 'NO'} |")


if __name__ == "__main__":
    sys.exit(main())
