"""Cold-path benchmark (issue 11): the same records read straight from the broker and through ksi once they
exist only in Iceberg, for every table shape real writers leave, side by side in one run.

    make bench                              # 1M records per shape, 10M for concurrency and seeks
    make bench N=200000 BENCH_ARGS='--large 2000000 --rounds 1'
    .venv/bin/python bench/cold.py --help

What it does, all on loopback, in a temporary directory, with noida-db (its DeleteRecords really moves the
log start) and a SQLite Iceberg catalog:

1. Records made column-wise (tests.shapes.synthetic: 4 partitions, ~130-byte records: 8-byte key, one
   header, 100-byte value), produced to two topics: ``direct`` (kept) and ``cold`` (then deleted from the
   broker up to its high watermark: every offset is below the log start, so ksi serves it from the lake).
2. The same records written as the writers write them (tests.shapes): one-file (AutoMQ's layout, one data
   file mixing every partition in 128 MiB row groups: a bulk load or compaction), streaming (AutoMQ, files
   of ~2,000 rows committed four at a time, partitions interleaved in every file), hourly (Redpanda:
   ``hour(redpanda.timestamp)``, a file per partition and hour, one row group each) and archive (ksi's own:
   partitioned by Kafka partition, sorted by offset).
3. Per shape and round: direct (a consumer on ``direct``), cold first read (a fresh ksi serving ``cold`` from
   the shape's table) and cold warm (a second consumer on the same ksi); records/s, ratio to the direct read
   made just before the shape's, ksi's CPU seconds per GB of record payload, ksi's peak RSS.  The first read
   is timed from when ksi answers from the lake (the table loaded and planned; that time, from ksi listening, is in the
   note), and once more including it ("incl. planning": a consumer that comes before the lake is ready).
   Then pass-through: ``direct``
   through ksi with the topic configured for history (the table holds every offset and so does the broker,
   whose records a consumer then reads; timed, as the first reads are, once ksi has planned the table) and
   with no ``[[topics]]``.  Each of these reads' notes has the consumer's cores, its ``consume()`` thread's
   (Python's side of the client: at most one core) and the machine's idle cores.  At --large (tansu runs) the
   same records are also read from tansu once a round, not a ratio's base: what this client reads from a
   broker that serves it faster than noida-db, which tells a warm read at the client's ceiling.
4. At --large records (10M): 8 consumers reading at once, through ksi (a lake-only topic per shape, fresh
   ksi each) and direct; aggregate records/s over a window, and ksi's peak RSS over all its processes;
   ksi's one-consumer figure over the same window.  The large topic read directly is on tansu (memory
   storage): noida answers a Fetch with a partition's whole tail, which at 10M records no client accepts.
5. Seeks: time to the first record after assigning a random partition at an offset in its middle, through
   ksi and direct, at N and --large records, in 1 file and in 1,000 files (``--seeks-only``: this section
   alone).  The ratio's direct seek is on tansu at both sizes when --large runs (noida-db's is shown beside).
   Each seek is cold (offsets going down, a window apart) on a consumer with no Fetch in flight; the same
   seeks back to back, on a fresh ksi, are in the note (``Bench.seeks`` says why they differ).

6. The Java client (``--java``, on by default when the JVM test clients are installed): the Apache Kafka Java
   consumer (``bench/java/JavaReadAll.java``, full JIT) reading ``direct`` and, per shape, a fresh ksi's
   ``cold`` (first read, then warm): a second client, with a ceiling of its own (warm through ksi it read
   2.2-2.3M records/s at stop 39, the JVM taking what ksi and the idle left; the Python client tops out at
   ~1.9M).  Each read's record count and key + value bytes must equal direct's.

Every full read is checked (per partition: count and BLAKE2 digest of offset, timestamp, key, value,
headers); concurrent reads check offsets are contiguous and sample values.  --profile samples ksi with
py-spy during the cold first read of one shape.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from data import (
    KafkaRecords,
    compare,
    consumed_digests,
    expected_digests,
    partition_ranges,
    produce,
    record_slices,
    records,
)
from harness import (
    KsiProcess,
    add_placement_option,
    find_py_spy,
    machine,
    pin,
    placement,
    placement_of,
    summarise_profile,
)
from ksi.brokers import start_noida, start_tansu
from reads import (
    CONSUMER_CONFIG,
    JAVA_CONFIG,
    SAMPLE_EVERY,
    Concurrent,
    Read,
    lake_ready,
    read_all,
    read_concurrently,
    seek_seconds,
)
from tests.shapes import write_table

SHAPES = {  # name -> (layout, tests.shapes shape, options)
    "one-file": ("automq", "one-file", {"key_type": "raw"}),
    "streaming": ("automq", "streaming", {"key_type": "raw"}),
    "hourly": ("redpanda", "hourly", {"mode": "key_value"}),
    "archive": ("ksi", "archive", {}),
}
MIB = 1 << 20
GB = 1e9
SEEK_SETTLE = 0.5  # seconds a consumer waits before a seek, so that its Fetch in flight is back (Row "seek")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Row:
    section: str
    path: str
    shape: str
    rate: float = 0.0           # records/s
    ratio: float | None = None  # to the round's direct read
    cpu_per_gb: float | None = None
    rss_mib: float | None = None
    note: str = ""
    rounds: list[float] = field(default_factory=list)


def _ms(seconds: list[float]) -> str:
    return f"median {statistics.median(seconds) * 1000:.0f} ms, max {max(seconds) * 1000:.0f}"


def _idle(read: Concurrent) -> str:
    return "" if read.idle_cores is None else f", machine idle {read.idle_cores:.2f} cores"


def _client_cores(reads: list[Read]) -> str:
    """The single consumer's CPU over its reads (medians): the process, the thread calling consume() (Python's
    side of the client, one core at most), and what the machine left idle meanwhile."""
    idle = [r.idle_cores for r in reads if r.idle_cores is not None]
    return (f"client {statistics.median(r.client_cores for r in reads):.2f} cores (its consume() thread"
            f" {statistics.median(r.thread_cores for r in reads):.2f})"
            + (f", machine idle {statistics.median(idle):.2f} cores" if idle else ""))


def payload_bytes(data: KafkaRecords) -> int:
    """Record payload: key + value + header keys and values (the same for every path)."""
    headers = data.headers.flatten()
    return int(data.key.nbytes + data.value.nbytes + headers.field(0).nbytes + headers.field(1).nbytes)


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.history: dict[str, Any] = {}
        for item in getattr(args, "history", []):
            key, _, value = item.partition("=")
            self.history[key] = int(value) if value.lstrip("-").isdigit() else value
        self.workdir = workdir
        # --placement: the brokers inherit the CPUs they are started on, the client processes this one's
        clients_cpus, server_cpus, self.ksi_cpus = placement(getattr(args, "placement", "shared"))
        pin(server_cpus)
        self.broker = start_noida(workdir / "broker", log_path=workdir / "noida.log")
        # The large topic read directly lives on tansu: noida answers a Fetch with the partition's whole tail
        # whatever fetch.max.bytes says, so at 10M records (~330 MB a partition) its answers pass any client's
        # receive limit and direct consumers read nothing.  tansu honours the limits.
        self.large_broker = start_tansu(log_path=workdir / "tansu.log") if args.large else None
        pin(clients_cpus)
        from pyiceberg.catalog.sql import SqlCatalog

        (workdir / "warehouse").mkdir()
        self.catalog_props = {"uri": f"sqlite:///{workdir / 'catalog.db'}",
                              "warehouse": f"file://{workdir / 'warehouse'}"}
        self.catalog = SqlCatalog("lake", **self.catalog_props)
        self.catalog.create_namespace("bench")
        self.rows: list[Row] = []
        self.py_spy = find_py_spy("auto") if args.profile else None
        self.profile: list[str] = []
        self.profile_8: list[str] = []

    def ksi(self, name: str, topics: list[dict[str, Any]]) -> KsiProcess:
        return KsiProcess(self.workdir, name, self.broker.bootstrap, topics=topics,
                          catalog=self.catalog_props if topics else None, cpus=self.ksi_cpus,
                          history=self.history or None)

    def table(self, name: str, shape: str, data: Any, **extra: Any) -> str:
        layout, kind, options = SHAPES[shape]
        identifier = f"bench.{name}"
        report = write_table(self.catalog, identifier, data, layout=layout, shape=kind, **options, **extra)
        log(f"  table {identifier}: {shape} ({layout}), {report.rows:,} rows, {report.files} files,"
            f" {report.row_groups} row groups, {report.snapshots} snapshots, {report.seconds:.1f} s")
        return identifier

    # -- phases ----------------------------------------------------------------------------------

    def shapes(self, data: KafkaRecords) -> None:
        args, n, partitions = self.args, len(data), self.args.partitions
        log(f"producing {n:,} records to 'direct' and 'cold'")
        self.broker.create_topic("direct", partitions)
        self.broker.create_topic("cold", partitions)
        produce(self.broker.bootstrap, "direct", data, log)
        produce(self.broker.bootstrap, "cold", data, log)
        for p, (_, last) in partition_ranges(data).items():
            self.broker.delete_records("cold", p, last + 1)
        if self.large_broker is not None:  # the same records on the other broker: how fast the client reads there
            self.large_broker.create_topic("direct", partitions)
            produce(self.large_broker.bootstrap, "direct", data, log)
        expected = expected_digests(data)
        gb = payload_bytes(data) / GB
        tables = {shape: self.table(f"cold_{shape.replace('-', '_')}", shape, data) for shape in args.shapes}
        results: dict[tuple[str, str], list[tuple[float, float | None, float | None, float]]] = {}
        client: dict[tuple[str, str], list[Read]] = {}  # the reads, for the consumer's cores (it is one process)
        ready: dict[str, list[tuple[float, float]]] = {}  # per shape (or path): seconds from ksi's start and its
        # listening until the lake answered (the table loaded and planned)
        for r in range(args.rounds):
            log(f"round {r + 1}/{args.rounds}")
            if self.large_broker is not None:
                # Not a ratio's base (ksi's upstream, noida, is): what the same client reads from a broker that
                # serves it faster, so the warm reads' figures can be told from the client's own limit.
                other = read_all(self.large_broker.bootstrap, "direct", partitions, n)
                self.check("direct (tansu)", expected, other)
                results.setdefault(("direct (tansu, not the ratios' base)", "-"), []).append(
                    (n / other.seconds, None, None, 0.0))
                client.setdefault(("direct (tansu, not the ratios' base)", "-"), []).append(other)
            for shape, table in tables.items():
                # Direct again before each shape: a shape's ratios are to the direct read just before them (on
                # this shared 2-core machine one direct read per round left later shapes' ratios to chance).
                direct = read_all(self.broker.bootstrap, "direct", partitions, n)
                self.check("direct", expected, direct)
                results.setdefault(("direct", "-"), []).append((n / direct.seconds, None, None, 0.0))
                client.setdefault(("direct", "-"), []).append(direct)
                ksi = self.ksi(f"{shape}-{r}", [{"name": "cold", "table": table, "layout": SHAPES[shape][0]}])
                try:
                    # The first read is of a cold cache, not of a cold process: the table is planned first
                    # (ksi does that in the background once it listens; the time is in the report).
                    planning = lake_ready(ksi.bootstrap, "cold", partitions)
                    ready.setdefault(shape, []).append((time.perf_counter() - ksi.started, planning))
                    profiling = self.py_spy is not None and shape == args.profile and r == 0
                    if profiling:
                        ksi.start_profile(self.py_spy, self.workdir / f"profile-{shape}.txt",  # type: ignore[arg-type]
                                          gil=args.gil)
                    for path in ("cold, first read", "cold, warm"):
                        cpu = ksi.cpu_seconds()
                        read = read_all(ksi.bootstrap, "cold", partitions, n)
                        used = ksi.cpu_seconds() - cpu
                        self.check(f"{path} ({shape})", expected, read)
                        results.setdefault((path, shape), []).append(
                            (n / read.seconds, n / read.seconds / (n / direct.seconds), used / gb, ksi.peak_mib()))
                        client.setdefault((path, shape), []).append(read)
                        if path == "cold, first read":  # as a consumer that comes before the lake is ready sees it
                            seconds = read.seconds + planning
                            results.setdefault(("cold, first read incl. planning", shape), []).append(
                                (n / seconds, n / seconds / (n / direct.seconds), None, ksi.peak_mib()))
                        if profiling and path == "cold, first read":
                            ksi.stop_profile()
                            self.profile = summarise_profile(self.workdir / f"profile-{shape}.txt")
                            self.profile.insert(0, f"read {read.seconds:.1f} s, ksi used"
                                                f" {used / read.seconds:.2f} cores"
                                                + (" (samples: the thread holding the GIL only)" if args.gil else ""))
                finally:
                    ksi.stop()
            with_table = [{"name": "direct", "table": tables[args.shapes[-1]], "layout": SHAPES[args.shapes[-1]][0]}]
            for path, topics in (("pass-through (topic with a table)", with_table),
                                 ("pass-through, no [[topics]]", [])):
                ksi = self.ksi(f"pass-{len(topics)}-{r}", topics)
                try:
                    if topics:  # timed once ksi has started up (imports, catalog, the plan), as the cold reads are
                        ready.setdefault(path, []).append((time.perf_counter() - ksi.started,
                                                           ksi.lake_planned("direct", partitions)))
                    cpu = ksi.cpu_seconds()
                    read = read_all(ksi.bootstrap, "direct", partitions, n)
                    used = ksi.cpu_seconds() - cpu
                    self.check(path, expected, read)
                    results.setdefault((path, "-"), []).append(
                        (n / read.seconds, n / read.seconds / (n / direct.seconds), used / gb, ksi.peak_mib()))
                    client.setdefault((path, "-"), []).append(read)
                finally:
                    ksi.stop()
        for (path, shape), values in results.items():
            best = max(values, key=lambda v: v[0])
            ratios = [v[1] for v in values if v[1] is not None]
            note = ""
            if path.startswith("cold, first read") and shape in ready:
                note = (f"lake ready {statistics.median(r[1] for r in ready[shape]):.2f} s after ksi listened"
                        f" ({statistics.median(r[0] for r in ready[shape]):.1f} s after it started)")
            elif path in ready:
                note = (f"timed once the table was planned, {statistics.median(r[1] for r in ready[path]):.2f} s"
                        " after ksi listened")
            cpu = [v[2] for v in values if v[2] is not None]
            if (path, shape) in client:
                note = "; ".join(x for x in (note, _client_cores(client[(path, shape)])) if x)
            self.rows.append(Row("shapes", path, shape, best[0], statistics.median(ratios) if ratios else None,
                                 statistics.median(cpu) if cpu else None,
                                 max(v[3] for v in values) or None, note=note, rounds=[round(v[0]) for v in values]))

    def java(self, n: int) -> None:
        """Section 6: the Java client, direct and through a fresh ksi per shape (first read, warm)."""
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
        from jvm_programs import JvmMissing, java_command

        def read(bootstrap: str, topic: str) -> tuple[int, int, float]:
            command = java_command("JavaReadAll", bootstrap, topic, *(f"{k}={v}" for k, v in JAVA_CONFIG.items()),
                                   heap="1g", quick_start=False)
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
            if done.returncode != 0:
                raise SystemExit(f"JavaReadAll {topic} via {bootstrap} failed: {done.stderr[-2000:]}")
            got = json.loads(done.stdout.strip().splitlines()[-1])
            return int(got["records"]), int(got["bytes"]), float(got["seconds"])

        try:
            read(self.broker.bootstrap, "direct")  # compiles the program if need be, warms the page cache
        except JvmMissing as exc:
            log(f"java: skipped ({exc})")
            self.rows.append(Row("java", "skipped", "-", note=str(exc)))
            return
        results: dict[tuple[str, str], list[tuple[float, float | None, float | None, float]]] = {}
        rounds = min(self.args.rounds, 2)
        expected_bytes = 0
        for r in range(rounds):
            log(f"java round {r + 1}/{rounds}")
            records, expected_bytes, seconds = read(self.broker.bootstrap, "direct")
            if records != n:
                raise SystemExit(f"java direct: {records:,} records of {n:,}")
            direct_rate = n / seconds
            results.setdefault(("direct", "-"), []).append((direct_rate, None, None, 0.0))
            for shape in self.args.shapes:
                table = f"bench.cold_{shape.replace('-', '_')}"
                ksi = self.ksi(f"java-{shape}-{r}", [{"name": "cold", "table": table, "layout": SHAPES[shape][0]}])
                try:
                    lake_ready(ksi.bootstrap, "cold", self.args.partitions)
                    for path in ("cold, first read", "cold, warm"):
                        cpu = ksi.cpu_seconds()
                        records, nbytes, seconds = read(ksi.bootstrap, "cold")
                        used = ksi.cpu_seconds() - cpu  # includes the JVM's start: an upper bound
                        if (records, nbytes) != (n, expected_bytes):
                            raise SystemExit(f"java {path} ({shape}): {records:,} records, {nbytes:,} bytes; direct"
                                             f" read {n:,} and {expected_bytes:,}")
                        results.setdefault((path, shape), []).append(
                            (n / seconds, n / seconds / direct_rate, used / (nbytes / GB), ksi.peak_mib()))
                finally:
                    ksi.stop()
        for (path, shape), values in results.items():
            best = max(values, key=lambda v: v[0])
            ratios = [v[1] for v in values if v[1] is not None]
            self.rows.append(Row("java", path, shape, best[0], statistics.median(ratios) if ratios else None,
                                 statistics.median(v[2] for v in values) if values[0][2] is not None else None,
                                 max(v[3] for v in values) or None, rounds=[round(v[0]) for v in values]))

    def large(self) -> None:
        args, n, partitions = self.args, self.args.large, self.args.partitions
        log(f"large: {n:,} records")
        assert self.large_broker is not None
        direct10 = self.large_broker.bootstrap
        self.large_broker.create_topic("direct10", partitions)
        produce(direct10, "direct10", record_slices(n, partitions), log)
        values: dict[int, dict[int, bytes]] = {p: {} for p in range(partitions)}  # a sample: every 97th offset
        for part in record_slices(n, partitions):
            sample = np.flatnonzero(np.asarray(part.offset) % SAMPLE_EVERY == 0)
            for p, o, v in zip(part.partition.take(sample).to_pylist(), part.offset.take(sample).to_pylist(),
                               part.value.take(sample).to_pylist(), strict=True):
                values[p][o] = v
        direct8 = read_concurrently(direct10, "direct10", partitions, 8, args.window, values,
                                    records=n)
        self.rows.append(Row("8 consumers", "direct", "-", direct8.rate, 1.0,
                             note="; ".join([f"clients {direct8.client_cores:.2f} cores{_idle(direct8)}",
                                                   *direct8.problems])))
        direct1 = read_concurrently(direct10, "direct10", partitions, 1, args.window, values,
                                    records=n)
        self.rows.append(Row("1 consumer", "direct", "-", direct1.rate, 1.0,
                             note="; ".join([f"clients {direct1.client_cores:.2f} cores{_idle(direct1)}",
                                                   *direct1.problems])))
        for shape in args.shapes:
            table = self.table(f"large_{shape.replace('-', '_')}", shape, record_slices(n, partitions))
            name = f"lake-{shape}"
            topic = {"name": name, "table": table, "layout": SHAPES[shape][0], "lake_only_readers": ["*"]}
            for consumers, base in ((1, direct1), (8, direct8)):
                ksi = self.ksi(f"large-{shape}-{consumers}", [topic])
                try:
                    lake_ready(ksi.bootstrap, name, partitions)  # discovery ran, the table is planned
                    profiling = self.py_spy is not None and shape == args.profile and consumers == 8
                    if profiling:
                        ksi.start_profile(self.py_spy, self.workdir / f"profile-8-{shape}.txt",  # type: ignore[arg-type]
                                          gil=args.gil)
                    peaks = ksi.watch_metrics(("ksi_lake_cache_bytes", "ksi_lake_arrow_bytes"))
                    counted = ("ksi_lake_reads_total", "ksi_lake_cache_misses_total", "ksi_lake_cache_evictions_total")
                    before = ksi.totals(counted)
                    wall = time.perf_counter()
                    cpu: list[float] = []  # ksi's CPU seconds when the counted window starts and ends
                    got = read_concurrently(ksi.bootstrap, name, partitions, consumers, args.window, values,
                                            records=n, mark=lambda cpu=cpu, ksi=ksi: cpu.append(ksi.cpu_seconds()))
                    used, wall = cpu[1] - cpu[0], time.perf_counter() - wall
                    after = ksi.totals(counted)
                    reads, misses, evictions = (int(after[k] - before[k]) for k in counted)
                    if profiling:
                        ksi.stop_profile()
                        self.profile_8 = [f"read {wall:.1f} s, ksi used {used / got.seconds:.2f} cores in the counted"
                                          f" {got.seconds:.1f} s"
                                          + (" (samples: the thread holding the GIL only)" if args.gil else ""),
                                          *summarise_profile(self.workdir / f"profile-8-{shape}.txt")]
                    section = "8 consumers" if consumers == 8 else "1 consumer"
                    per_gb = used / (got.records * 130 / GB) if got.records else None
                    note = (f"clients {got.client_cores:.2f} cores, ksi {used / got.seconds:.2f} cores{_idle(got)};"
                            f" peak cache"
                            f" {peaks.get('ksi_lake_cache_bytes', 0) / MIB:.0f} MiB, Arrow"
                            f" {peaks.get('ksi_lake_arrow_bytes', 0) / MIB:.0f} MiB; {reads:,} lake reads,"
                            f" {misses:,} cache misses, {evictions:,} evictions")
                    self.rows.append(Row(section, "cold", shape, got.rate, got.rate / base.rate if base.rate else None,
                                         per_gb, ksi.peak_mib(), note="; ".join([note, *got.problems])))
                finally:
                    ksi.stop()

    def seek_topics(self, small: KafkaRecords) -> None:
        """The topics the seek section reads directly, for a run of that section alone (--seeks-only)."""
        log(f"producing {len(small):,} records to 'direct'")
        self.broker.create_topic("direct", self.args.partitions)
        produce(self.broker.bootstrap, "direct", small, log)
        if self.args.large and self.large_broker is not None:
            log(f"producing {self.args.large:,} records to 'direct10'")
            self.large_broker.create_topic("direct10", self.args.partitions)
            produce(self.large_broker.bootstrap, "direct10", record_slices(self.args.large, self.args.partitions), log)

    def seeks(self, small: KafkaRecords) -> None:
        """Seeks at N and --large rows.  The ratio's direct seek is on the same broker at both sizes, tansu when
        --large runs (it must: noida-db cannot serve a 10M-record topic), so that the ratios compare: noida-db
        answers a seek's Fetch with the partition's whole tail, which the client parses before it hands over
        the first record, so its seek time grows with the tail (62-77 ms at 1M rows, none at 10M); it is shown
        beside, at N, as a row of its own.

        Each seek is cold: the targets go down the partitions' offsets over 30% of a partition (reads ahead go
        up), so that with 9 seeks of 4 partitions they are 9,375 offsets apart at 1M rows, more than a window
        of 32,768 rows holds of any partition, and each waits SEEK_SETTLE seconds on the consumer first, so that the
        Fetch it had in flight for the seek before has come back: librdkafka sends a broker one Fetch at a
        time, and a seek's Fetch waits behind it.  A broker answers that one at once; ksi holds it while it
        reads the lake, as Kafka holds a Fetch for tiered data (its remote fetch), so back to back a seek
        into the lake also waits for a lake read of the partition left.  That figure, on a fresh ksi, is shown
        in the note."""
        args, partitions = self.args, self.args.partitions
        rng = np.random.default_rng(11)
        sizes = [(len(small), self.broker, "direct", small)]
        if args.large and self.large_broker is not None:
            sizes = [(len(small), self.large_broker, "direct_seek", small),
                     (args.large, self.large_broker, "direct10", None)]
            self.large_broker.create_topic("direct_seek", partitions)
            produce(self.large_broker.bootstrap, "direct_seek", small, log)
        for rows, broker, direct_topic, data in sizes:
            per_partition = rows // partitions
            steps = max(args.seeks - 1, 1)
            targets = [(int(rng.integers(partitions)), int(per_partition * (0.6 - 0.3 * i / steps)))
                       for i in range(args.seeks)]
            if broker is not self.broker and rows == len(small):
                other = seek_seconds(self.broker.bootstrap, "direct", targets, SEEK_SETTLE)
                self.rows.append(Row("seek", f"direct ({self.broker.kind}, not the ratio's)", f"{rows:,} rows",
                                     statistics.median(other), note=f"max {max(other) * 1000:.0f} ms",
                                     rounds=[round(s * 1000) for s in other]))
            direct = seek_seconds(broker.bootstrap, direct_topic, targets, SEEK_SETTLE)
            in_a_row = seek_seconds(broker.bootstrap, direct_topic, targets)
            self.rows.append(Row("seek", f"direct ({broker.kind})", f"{rows:,} rows", statistics.median(direct),
                                 note=f"max {max(direct) * 1000:.0f} ms; back to back {_ms(in_a_row)}",
                                 rounds=[round(s * 1000) for s in direct]))
            for files, shape, extra in ((1, "one-file", {}),
                                        (1000, "streaming", {"rows_per_file": max(rows // 1000, 1)})):
                source = data if data is not None else record_slices(rows, partitions)
                table = self.table(f"seek_{rows}_{files}", shape, source, **extra)
                name = f"seek-{rows}-{files}"
                got: dict[float, list[float]] = {}
                for settle in (SEEK_SETTLE, 0.0):  # each on a fresh ksi: nothing read yet
                    ksi = self.ksi(name, [{"name": name, "table": table, "layout": SHAPES[shape][0],
                                           "lake_only_readers": ["*"]}])
                    try:
                        lake_ready(ksi.bootstrap, name, partitions)
                        got[settle] = seek_seconds(ksi.bootstrap, name, targets, settle)
                    finally:
                        ksi.stop()
                cold = got[SEEK_SETTLE]
                self.rows.append(Row("seek", "cold", f"{rows:,} rows, {files:,} file(s)", statistics.median(cold),
                                     statistics.median(cold) / statistics.median(direct),
                                     note=f"max {max(cold) * 1000:.0f} ms; back to back {_ms(got[0.0])}"
                                          f" ({statistics.median(got[0.0]) / statistics.median(in_a_row):.2f}x)",
                                     rounds=[round(s * 1000) for s in cold]))

    def check(self, what: str, expected: dict[int, Any], read: Any) -> None:
        if read.stalled or read.errors:
            raise SystemExit(f"{what}: stalled={read.stalled} errors={read.errors[:3]}")
        problem = compare(expected, consumed_digests(read.messages))
        if problem:
            raise SystemExit(f"{what}: WRONG RECORDS: {problem}")
        read.messages.clear()


def report(bench: Bench, started: float) -> str:
    args = bench.args
    out = [f"ksi cold-path benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {machine()}",
           f"{args.records:,} records x {args.partitions} partitions per shape ({args.rounds} rounds, best rate, median"
           f" ratio); --large {args.large:,}; placement {getattr(args, 'placement', 'shared')}; consumer settings"
           f" {json.dumps(CONSUMER_CONFIG)}", ""]
    cpu_rss = "ksi CPU s/GB | ksi peak RSS MiB"
    for section, headers in (("shapes", f"| path | shape | records/s | ratio to direct | {cpu_rss} | |"),
                             ("1 consumer", f"| path | shape | records/s | ratio | {cpu_rss} | note |"),
                             ("8 consumers", f"| path | shape | records/s (aggregate) | ratio | {cpu_rss} | note |"),
                             ("java", f"| path | shape | records/s | ratio to direct | {cpu_rss} | |"),
                             ("seek", "| path | table | median seconds | ratio | | | |")):
        rows = [r for r in bench.rows if r.section == section]
        if not rows:
            continue
        out += [f"### {section}", "", headers, "|" + "---|" * (headers.count("|") - 1)]
        for r in rows:
            rate = f"{r.rate:.3f}" if section == "seek" else f"{r.rate:,.0f}"
            out.append(f"| {r.path} | {r.shape} | {rate} | {'' if r.ratio is None else f'{r.ratio:.2f}'} |"
                       f" {'' if r.cpu_per_gb is None else f'{r.cpu_per_gb:.1f}'} |"
                       f" {'' if r.rss_mib is None else f'{r.rss_mib:.0f}'} | {r.note} |")
        out.append("")
    if bench.profile:
        out += [f"### py-spy: cold first read, {args.profile}", "", "```", *bench.profile, "```", ""]
    if bench.profile_8:
        out += [f"### py-spy: 8 consumers, {args.profile}", "", "```", *bench.profile_8, "```", ""]
    out.append(f"({time.time() - started:.0f} s; rounds per row: "
               + "; ".join(f"{r.path}/{r.shape}: {r.rounds}" for r in bench.rows if r.rounds) + ")")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="records per shape (default 1,000,000)")
    parser.add_argument("--large", type=int, default=10_000_000, help="records for the concurrency and large"
                        " seek tables (default 10,000,000; 0 skips them)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--window", type=float, default=20.0, help="seconds the concurrent reads are measured")
    parser.add_argument("--seeks", type=int, default=9, help="seeks per table")
    parser.add_argument("--seeks-only", action="store_true",
                        help="run only section 5, the seeks (at --records and, unless --large 0, at --large)")
    parser.add_argument("--profile", choices=list(SHAPES), help="py-spy ksi during this shape's first cold read")
    parser.add_argument("--gil", action="store_true",
                        help="with --profile: sample only the thread holding the GIL (its busy seconds over the"
                             " read's are the share of the read the GIL was held)")
    parser.add_argument("--java", action=argparse.BooleanOptionalAction, default=True,
                        help="also read with the Apache Kafka Java consumer (section 6; skipped when the JVM test "
                             "clients are not installed: scripts/install-jvm-deps.sh)")
    parser.add_argument("--history", action="append", default=[], metavar="KEY=VALUE",
                        help="a [history] setting for every ksi the benchmark starts (repeatable), e.g. "
                             "cache_bytes=268435456")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    add_placement_option(parser)
    args = parser.parse_args()
    placement_of(parser, args)  # checked before anything starts
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="ksi-bench-") as tmp:
        bench = Bench(args, Path(tmp))
        try:
            data = records(args.records, args.partitions)
            if args.seeks_only:
                bench.seek_topics(data)
                bench.seeks(data)
            else:
                bench.shapes(data)
                if args.java:
                    bench.java(len(data))
                if args.large:
                    bench.large()
                if args.seeks:
                    bench.seeks(data)
        finally:
            bench.broker.stop()
            if bench.large_broker is not None:
                bench.large_broker.stop()
        text = report(bench, started)
    print(text)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in bench.rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
