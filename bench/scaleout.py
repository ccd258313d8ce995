"""Scale-out benchmark (issue 15): one ksi instance against three behind a load balancer, replaying history
from the lake to many consumers, with the same records read straight from the broker alongside.

    .venv/bin/python bench/scaleout.py                         # 500,000 records, 6 consumers, 2 rounds
    .venv/bin/python bench/scaleout.py --records 200000 --consumers 4 --rounds 1
    make bench-scaleout                                        # the same (SCALEOUT_ARGS for the options)

What it does, all on loopback, in a temporary directory:

1. Starts noida-db and produces --records records (10-byte keys, 90-110-byte raw values, explicit
   timestamps) round-robin over --partitions partitions into two topics: ``direct`` stays in the broker,
   ``history`` is written to a ksi-layout Iceberg table (PyIceberg, SQLite catalog, committed as ``ksi
   archive`` commits: the next offsets in the snapshot summary) and then deleted from the broker
   (DeleteRecords to the end), so every ksi read of it is a cold read from the lake.  The same rows are
   also written to one table per consumer, served as lake-only topics ``lake-<i>``.
2. Per round, in alternating order, each path read by --consumers consumer processes at once, each reading
   every partition of its topic from offset 0 to the end:
     direct               the consumers against the broker (topic ``direct``): the ceiling on this machine;
     shared, ksi x1 / xN  every consumer replays ``history`` through one ksi instance, or --instances
                          instances, behind HAProxy (TCP, round robin); concurrent reads of a chunk share
                          one lake read and its cache, as when many consumers replay one topic;
     distinct, ksi x1 / xN  consumer i replays its own ``lake-<i>``: every byte is read from the lake and
                          encoded for one consumer only, the full cost of the cold path per byte.
   Instances run on this host, each on ports of its own advertising the balancer's ports
   (proxy.advertised_port_base), and are started fresh for each path and round with cold caches: before
   the clock starts, each reads a small topic of its own (``warm``) once, so the lazy imports and first-use
   set-up of a new process are not measured, and one unmeasured read of every table before the first
   round warms the page cache.  A path is measured from the moment its consumers start to the last one's
   last record.
3. Reports per path: aggregate records/s and MB/s (MB = 10^6 bytes of key + value), the ratio to direct,
   ksi's CPU seconds per GB (all instances together), the cores ksi used, records per ksi CPU second, peak
   RSS per instance (VmHWM, reset before each phase), how many broker-port connections each instance
   accepted, the lake reads (windows of row groups read and encoded) and cache evictions of all instances
   together, and HAProxy's and the broker's CPU.  From those: the per-core efficiency and what N machines
   would serve (written out after the table).

Every consumer checks what it read: per partition, the count and the sum of offsets must be those produced
(a lost or duplicated record changes one of them).

The machine this runs on matters more than usual: the instances, HAProxy, the broker and the consumers
share its cores.  On a 2-core machine three instances cannot run in parallel, so the xN rows show the cost
of scaling out (balancer hops, a cache per instance) more than its gain; the CPU per GB is what carries
over to more machines.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import pyarrow as pa
import pyarrow.compute  # pa.compute
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

# bench/ is on sys.path when this runs as a script; the repository root for tests/haproxy.py
from harness import MAX_FRAME_BYTES, KsiProcess, machine, rounds
from passthrough import CONSUMER_CONFIG, PRODUCER_CONFIG

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ksi.brokers import BrokerProcess, free_port, start_noida
from tests.haproxy import HAProxy, Route

STALL_SECONDS = 60.0
BASE_TS = (int(time.time()) - 3600) * 1000  # noida-db's time retention is 7 days


def key_of(i: int) -> bytes:
    return b"k%09d" % i


def value_of(i: int) -> bytes:
    return (b"v%09d:" % i).ljust(90 + i % 21, b"x")  # 90..110 bytes


def payload_bytes(records: int) -> int:
    return sum(len(key_of(i)) + len(value_of(i)) for i in range(records))


# -- data ----------------------------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value_of(i), key_of(i), partition=i % partitions, timestamp=BASE_TS + i)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300) != 0:
        raise SystemExit(f"could not produce every record to {topic}")


def write_tables(workdir: Path, topics: list[str], records: int, partitions: int, warm: int = 2000) -> dict[str, str]:
    """The records in ksi's layout, one table per topic (``bench.<topic>``), one append each, with the
    archive's commit state, and a small one-partition ``bench.warm`` for warming instances up; the
    catalog's properties."""
    import json

    from pyiceberg.catalog.sql import SqlCatalog

    from ksi.history.ksi_table import arrow_schema, partition_spec, raw_value_schema, sort_order
    from ksi.lake.commits import ARCHIVED_OFFSETS

    (workdir / "warehouse").mkdir()
    props = {"uri": f"sqlite:///{workdir / 'catalog.db'}", "warehouse": f"file://{workdir / 'warehouse'}"}
    catalog = SqlCatalog("lake", **props)
    catalog.create_namespace("bench")
    order = sorted(range(records), key=lambda i: (i % partitions, i))
    n = len(order)
    data = pa.table({
        "kafka_partition": pa.array([i % partitions for i in order], pa.int32()),
        "kafka_offset": pa.array([i // partitions for i in order], pa.int64()),
        "kafka_timestamp": pa.array([(BASE_TS + i) * 1000 for i in order], pa.timestamp("us", tz="UTC")),
        "kafka_timestamp_type": pa.array([0] * n, pa.int32()),
        "kafka_key": pa.array([key_of(i) for i in order], pa.binary()),
        "kafka_headers": pa.nulls(n, arrow_schema().field("kafka_headers").type),
        "kafka_value": pa.array([value_of(i) for i in order], pa.binary()),
        "kafka_value_schema_id": pa.nulls(n, pa.int32()),
    }, schema=arrow_schema())
    table = catalog.create_table("bench.warm", schema=raw_value_schema(), partition_spec=partition_spec(),
                                 sort_order=sort_order())
    table.append(data.filter(pa.compute.equal(data["kafka_partition"], 0)).slice(0, warm))
    ends = {p: len(range(p, records, partitions)) for p in range(partitions)}
    for topic in topics:
        table = catalog.create_table(f"bench.{topic.replace('-', '_')}", schema=raw_value_schema(),
                                     partition_spec=partition_spec(), sort_order=sort_order())
        table.append(data, snapshot_properties={ARCHIVED_OFFSETS: json.dumps({str(p): o for p, o in ends.items()}),
                                                "ksi.topic": topic})
    return props


def expected_sums(records: int, partitions: int) -> dict[int, tuple[int, int]]:
    """Per partition: (count, sum of offsets)."""
    out = {}
    for p in range(partitions):
        count = len(range(p, records, partitions))
        out[p] = (count, count * (count - 1) // 2)
    return out


# -- consumers -----------------------------------------------------------------------------------------


def _consumer(bootstrap: str, topic: str, partitions: int, records: int, barrier: Any, results: Any) -> None:
    try:
        gc.disable()  # nothing is kept: Python's collector would only cost CPU (bench/reads.py, stop 31)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"so-{os.getpid()}", **CONSUMER_CONFIG})
        consumer.list_topics(topic, timeout=30)  # connected and the topic known before the clock starts
        barrier.wait()
        # assigned only now: librdkafka starts fetching in the background as soon as partitions are assigned
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        counts = [0] * partitions
        sums = [0] * partitions
        seen, last = 0, time.perf_counter()
        while seen < records:
            batch = consumer.consume(10_000, timeout=0.5)
            for message in batch:
                if message.error() is not None:
                    raise KafkaException(message.error())
                p, offset = message.partition(), message.offset()
                assert p is not None and offset is not None
                counts[p] += 1
                sums[p] += offset
            if batch:
                seen += len(batch)
                last = time.perf_counter()
            elif time.perf_counter() - last > STALL_SECONDS:
                raise RuntimeError(f"stalled at {seen} of {records} records")
        consumer.close()
        results.put(("done", last, {p: (counts[p], sums[p]) for p in range(partitions)}))
    except BaseException as exc:  # noqa: BLE001 - reported by the coordinator
        results.put(("error", repr(exc), None))


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Phase:
    path: str
    instances: int
    records: int
    payload: int
    seconds: float
    ksi_cpu: float = 0.0
    haproxy_cpu: float = 0.0
    broker_cpu: float = 0.0
    rss_mib: list[float] = field(default_factory=list)
    connections: list[int] = field(default_factory=list)
    lake_reads: int = 0         # windows of row groups read from the lake and encoded, all instances
    evictions: int = 0          # encoded reads dropped from the instances' caches

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_second(self) -> float:
        return self.payload / self.seconds / 1e6

    @property
    def cpu_seconds_per_gb(self) -> float:
        return self.ksi_cpu / (self.payload / 1e9)

    @property
    def ksi_cores(self) -> float:
        return self.ksi_cpu / self.seconds

    @property
    def records_per_ksi_cpu_second(self) -> float:
        return self.records / self.ksi_cpu if self.ksi_cpu else 0.0


def read_phase(path: str, bootstrap: str, topics: list[str], args: argparse.Namespace,
               expected: dict[int, tuple[int, int]], payload: int, broker: BrokerProcess, instances: list[KsiProcess],
               balancer: HAProxy | None) -> Phase:
    """``len(topics)`` consumer processes, consumer i reading every record of ``topics[i]``."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(topics) + 1)
    results = context.Queue()
    processes = [context.Process(target=_consumer, args=(bootstrap, topic, args.partitions, args.records, barrier,
                                                         results)) for topic in topics]
    for process in processes:
        process.start()
    barrier.wait(timeout=180)
    for instance in instances:
        Path(f"/proc/{instance.process.pid}/clear_refs").write_text("5")  # VmHWM from here
    start = time.perf_counter()
    ksi_before = sum(i.cpu_seconds() for i in instances)
    reads_before = sum(metric_sum(i, "ksi_lake_reads_total") for i in instances)
    evictions_before = sum(metric_sum(i, "ksi_lake_cache_evictions_total") for i in instances)
    lb_before = cpu_seconds(balancer.process.pid) if balancer is not None and balancer.process else 0.0
    broker_before = cpu_seconds(broker.process.pid) if broker.process else 0.0
    ends = []
    for _ in processes:
        kind, when, sums = results.get(timeout=1800)
        if kind == "error":
            raise SystemExit(f"{path}: a consumer failed: {when}")
        if sums != expected:
            raise SystemExit(f"{path}: a consumer read {sums}, expected {expected} (count, sum of offsets)")
        ends.append(when)
    seconds = max(ends) - start
    phase = Phase(path, len(instances), args.records * len(topics), payload * len(topics), seconds,
                  ksi_cpu=sum(i.cpu_seconds() for i in instances) - ksi_before,
                  haproxy_cpu=(cpu_seconds(balancer.process.pid) - lb_before
                               if balancer is not None and balancer.process else 0.0),
                  broker_cpu=cpu_seconds(broker.process.pid) - broker_before if broker.process else 0.0,
                  rss_mib=[i.memory_kib("VmHWM") / 1024 for i in instances],
                  connections=[int(connections(i)) for i in instances],
                  lake_reads=int(sum(metric_sum(i, "ksi_lake_reads_total") for i in instances) - reads_before),
                  evictions=int(sum(metric_sum(i, "ksi_lake_cache_evictions_total") for i in instances)
                                - evictions_before))
    for process in processes:
        process.join(30)
    return phase


def metric_sum(instance: KsiProcess, prefix: str) -> float:
    """The sum of every sample of ksi's /metrics whose line starts with ``prefix`` (a name, maybe with labels)."""
    assert instance.metrics_url is not None
    with urllib.request.urlopen(instance.metrics_url, timeout=5) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def connections(instance: KsiProcess) -> float:
    """Client connections the instance accepted on its broker listeners."""
    return metric_sum(instance, 'ksi_client_connections_total{listener="broker-')


def warm_up(bootstrap: str, timeout: float = 60.0) -> None:
    """A first cold read through a fresh instance, of the small ``warm`` topic (its own table): the lazy
    imports and first-use set-up of the lake reader happen here, not in the measured phase, while the
    measured topics stay out of the instance's cache.  A raw Fetch on the bootstrap connection (before the
    balancer that the instance advertises runs), answered by ksi from the lake."""
    import socket
    import struct

    from kafka.protocol.consumer import FetchRequest, FetchResponse

    version = 11
    T = FetchRequest.FetchTopic
    request = FetchRequest(version=version, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                               version=version, topic="warm", partitions=[T.FetchPartition(
                                   version=version, partition=0, current_leader_epoch=-1, fetch_offset=0,
                                   log_start_offset=-1, partition_max_bytes=1 << 20)])],
                           forgotten_topics_data=[], rack_id="")
    request.with_header(correlation_id=1, client_id="warm-up")
    payload = bytes(request.encode(version=version, header=True))
    host, port = bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(payload)) + payload)
            data = b""
            while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise SystemExit(f"warm-up through {bootstrap}: the connection closed")
                data += chunk
        response = FetchResponse.decode(data[8:], version=version)  # size, correlation id
        part = response.responses[0].partitions[0]
        if part.error_code == 0 and part.records:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"warm-up through {bootstrap}: error {part.error_code}, no records in {timeout:g} s")
        time.sleep(0.2)


def ksi_path(n: int, workdir: Path, label: str, broker: BrokerProcess, node_id: int, props: dict[str, str],
             topics: list[dict[str, Any]]) -> tuple[list[KsiProcess], HAProxy]:
    """``n`` ksi instances behind a fresh HAProxy (a frontend for the bootstrap and one for the broker)."""
    front_bootstrap, front_broker = free_port(), free_port()
    instances, broker_ports = [], []
    for i in range(n):
        broker_ports.append(free_port())
        instances.append(KsiProcess(workdir, f"{label}-{i}", broker.bootstrap, catalog=props, topics=topics,
                                    proxy={"broker_port_base": broker_ports[-1], "advertised_port_base": front_broker,
                                           "max_frame_bytes": MAX_FRAME_BYTES}))
    for instance in instances:
        warm_up(instance.bootstrap)
    routes = [Route("bootstrap", front_bootstrap, tuple(("127.0.0.1", i.port) for i in instances)),
              Route(f"broker-{node_id}", front_broker, tuple(("127.0.0.1", port) for port in broker_ports))]
    balancer = HAProxy(routes, workdir / f"haproxy-{label}", check_ms=1000)
    balancer.start()
    return instances, balancer


# -- report ----------------------------------------------------------------------------------------------


def best(phases: list[Phase], path: str) -> Phase:
    return max((p for p in phases if p.path == path), key=lambda p: p.records_per_second)


def report(phases: list[Phase], paths: list[str], args: argparse.Namespace, load: tuple[float, float, float]) -> None:
    direct = best(phases, "direct")
    directs = [p for p in phases if p.path == "direct"]
    print(f"\n## Replay from the lake: {args.consumers} consumers each read {args.records:,} records"
          f" ({args.partitions} partitions); best of {args.rounds} round(s), median ratio to direct in brackets\n")
    print("| path | records/s | MB/s | ratio to direct | ksi CPU s per GB | ksi cores used | records per ksi CPU s"
          " | peak RSS per instance | broker-port connections per instance | lake reads | cache evictions"
          " | HAProxy CPU s | broker CPU s |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|")
    for path in paths:
        row = best(phases, path)
        if path == "direct":
            print(f"| direct | {row.records_per_second:,.0f} | {row.mb_per_second:.1f} | 1.00 | — | — | — | — |"
                  f" — | — | — | — | {row.broker_cpu:.1f} |")
            continue
        ratios = [p.records_per_second / d.records_per_second
                  for p, d in zip([p for p in phases if p.path == path], directs, strict=False)]
        ratio = f"{row.records_per_second / direct.records_per_second:.2f} ({statistics.median(ratios):.2f})"
        rss = " / ".join(f"{r:.0f}" for r in row.rss_mib) + " MiB"
        conns = " / ".join(str(c) for c in row.connections)
        print(f"| {path} | {row.records_per_second:,.0f} | {row.mb_per_second:.1f} | {ratio} |"
              f" {row.cpu_seconds_per_gb:.1f} | {row.ksi_cores:.2f} | {row.records_per_ksi_cpu_second:,.0f} | {rss} |"
              f" {conns} | {row.lake_reads} | {row.evictions} | {row.haproxy_cpu:.1f} | {row.broker_cpu:.1f} |")
    print("\nEvery round:\n")
    for p in phases:
        print(f"- {p.path}: {p.records_per_second:,.0f} records/s in {p.seconds:.2f} s, ksi {p.ksi_cpu:.2f} CPU s"
              f" ({p.ksi_cores:.2f} cores), {p.lake_reads} lake reads, {p.evictions} cache evictions, HAProxy"
              f" {p.haproxy_cpu:.2f} s, broker {p.broker_cpu:.2f} s")
    n = args.instances
    cores = os.cpu_count() or 1
    lines = ["", "## Per-core efficiency and what N machines would serve", ""]
    for workload in ("shared", "distinct"):
        one, many = best(phases, f"{workload}, ksi x1"), best(phases, f"{workload}, ksi x{n}")
        lines.append(f"- {workload}: 1 instance {one.records_per_second:,.0f} records/s using {one.ksi_cores:.2f}"
                     f" ksi cores ({one.cpu_seconds_per_gb:.1f} CPU s per GB); {n} instances"
                     f" {many.records_per_second:,.0f} records/s"
                     f" ({many.records_per_second / one.records_per_second:.2f}x) using {many.ksi_cores:.2f} ksi cores"
                     f" ({many.cpu_seconds_per_gb:.1f} CPU s per GB,"
                     f" {many.cpu_seconds_per_gb / one.cpu_seconds_per_gb:.2f}x the CPU per byte).")
    # capacity per core from the distinct workload, in the configuration whose caches held the working set
    # (fewest evictions): evicted chunks are read again, which is a cache-size effect, not the cold path's cost
    basis = min((best(phases, f"distinct, ksi x{k}") for k in (1, n)),
                key=lambda p: (p.evictions, p.cpu_seconds_per_gb))
    worst = basis.cpu_seconds_per_gb
    gb_per_core = 1 / worst if worst else 0.0
    record = best(phases, "direct").payload / best(phases, "direct").records
    lines += [
        (f"- On this {cores}-core machine the instances, HAProxy, the broker and {args.consumers} consumer processes"
         " share the cores, so aggregate throughput here is bounded by the machine, not by ksi: the figure"
         " that carries over is ksi's CPU per GB."),
        (f"- Per ksi core, from the distinct workload (every byte read from the lake and encoded for one consumer),"
         f" {basis.path} ({basis.evictions} cache evictions): {worst:.1f} CPU s per GB, so one core serves about"
         f" {gb_per_core:.2f} GB/s ({gb_per_core * 1e9 / record:,.0f} records/s of {record:.0f} B). Consumers that"
         " replay the same history at once share reads and cost less (the shared rows). When the chunks being"
         " read do not fit in an instance's history.cache_bytes, prefetched chunks are evicted before they are"
         f" used and read again (lake reads above the x{n} row's, cache evictions): size the cache for the"
         " partitions replayed at once x 2 chunks (history.chunk_bytes, encoded), or spread them over more"
         " instances."),
        ("- A ksi instance is one event loop plus lake-read threads: run one instance per core, k per machine"
         f" of k cores. N such machines would serve about N x k x {gb_per_core:.2f} GB/s of cold replay, until the"
         " network (a 10 Gb/s NIC carries about 1.2 GB/s), the lake's storage or the broker (metadata,"
         " watermarks, the hot tail) is the limit; e.g. 3 machines x 8 cores:"
         f" {3 * 8 * gb_per_core:.1f} GB/s by CPU, {min(3 * 8 * gb_per_core, 3 * 1.2):.1f} GB/s with 10 Gb/s NICs."
         " Memory: each instance keeps its own cache (history.cache_bytes) and its peak RSS is in the table."),
        "- An estimate from this one run on a shared machine, not a measurement on N machines.",
        "",
        f"load average {load[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end (other work on this machine counts).",
    ]
    print("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000, help="records per topic (default 500,000)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--consumers", type=int, default=6, help="consumer processes (default 6)")
    parser.add_argument("--instances", type=int, default=3, help="ksi instances in the scaled-out paths (default 3)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.instances < 2:
        parser.error("--instances: at least 2 (the comparison is 1 against that many)")
    load = os.getloadavg()
    print(f"# ksi scale-out benchmark: 1 vs {args.instances} instances behind HAProxy")
    print(f"{machine()}; python {sys.version.split()[0]}, confluent-kafka {confluent_kafka.__version__},"
          f" librdkafka {confluent_kafka.libversion()[0]}; load average at start {load[0]:.2f}")
    print(f"consumer {CONSUMER_CONFIG}\n", flush=True)
    n = args.instances
    paths = ["direct", "shared, ksi x1", f"shared, ksi x{n}", "distinct, ksi x1", f"distinct, ksi x{n}"]
    lake_only = [f"lake-{i}" for i in range(args.consumers)]
    topics = [{"name": "history", "table": "bench.history"}] + [
        {"name": t, "table": f"bench.{t.replace('-', '_')}", "lake_only_readers": ["*"]} for t in ["warm", *lake_only]]
    phases: list[Phase] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ksi-scaleout-") as tmp:
        workdir = Path(tmp)
        broker = start_noida(workdir / "noida", free_port(), log_path=workdir / "noida.log")
        try:
            for topic in ("direct", "history"):
                broker.create_topic(topic, args.partitions)
                produce(broker.bootstrap, topic, args.records, args.partitions)
            props = write_tables(workdir, ["history", *lake_only], args.records, args.partitions)
            for p in range(args.partitions):
                broker.delete_records("history", p, len(range(p, args.records, args.partitions)))
            node_id = next(iter(Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x"}).list_topics(
                timeout=10).brokers))
            expected = expected_sums(args.records, args.partitions)
            payload = payload_bytes(args.records)
            print(f"data ready in {time.perf_counter() - started:.0f} s: {args.records:,} records,"
                  f" {payload / 1e6:.1f} MB of keys and values per read", flush=True)

            def through_ksi(label: str, instances_wanted: int, read: list[str]) -> Phase:
                name = f"{len(phases)}-" + "".join(c if c.isalnum() else "-" for c in label)  # file names
                instances, balancer = ksi_path(instances_wanted, workdir, name, broker, node_id, props, topics)
                try:
                    return read_phase(label, f"127.0.0.1:{balancer.routes[0].port}", read, args, expected, payload,
                                      broker, instances, balancer)
                finally:
                    balancer.stop()
                    for instance in instances:
                        if instance.tracebacks():
                            print(instance.log_tail(40))
                        instance.stop()

            # one unmeasured read of every table first: no path pays for a cold page cache
            through_ksi("warm-up", 1, ["history", *lake_only])
            for path in rounds(paths, args.rounds):
                if path == "direct":
                    phase = read_phase(path, broker.bootstrap, ["direct"] * args.consumers, args, expected, payload,
                                       broker, [], None)
                else:
                    workload, _, count = path.partition(", ksi x")
                    read = ["history"] * args.consumers if workload == "shared" else lake_only
                    phase = through_ksi(path, int(count), read)
                phases.append(phase)
                print(f"{path:20} {phase.records_per_second:12,.0f} records/s {phase.seconds:7.2f} s"
                      f"  ksi {phase.ksi_cpu:6.2f} CPU s", flush=True)
        finally:
            broker.stop()
    report(phases, paths, args, load)
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
