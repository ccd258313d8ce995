"""The archive benchmark (``make bench-archive``): ``ksi archive`` against the read limit and a plain writer.

Everything side by side in one run, on one broker (noida-db, or tansu with ``--broker tansu``) and one
SQLite catalog:

* per size (``--sizes``, default 500k and 2M records; 4 partitions, ~100-byte values, 2 headers, keys):
  - **direct**: one confluent-kafka consumer reading the topic from the beginning (the read limit);
  - **plain writer**: confluent-kafka -> pyarrow -> PyIceberg ``append`` every 100k rows;
  - **ksi archive** per engine (``--engines``, default spark and local; the progress lines say whether a run's
    tasks ran on Spark or, being small, in the driver): the real CLI as a child process, wall-clock time from
    start to exit, and the peak RSS (and PSS) of its whole process tree;
* at the largest size, per engine: a **no-op run** (nothing new) and a **10% incremental run**;
* **--follow** (Spark engine unless ``--follow-engine local``): ``ksi archive --follow --interval I`` while a
  producer writes ``--follow-rate`` records/s for ``--follow-seconds``; every 0.5 s the benchmark itself
  measures how far the lake is behind the log (now - timestamp of the first unarchived record, the lake's
  offsets read from the catalog), and reports p50/p99; afterwards every produced offset must be in the table
  exactly once;
* **ksi compact** of the largest table after the 10% run, again with nothing due, and of the follow table.

Every archive's table is checked: each offset exactly once.  The figures are indicative when other work
runs on the machine: the report prints the load average and the busiest other processes.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

# bench/ is on sys.path when this runs as a script.
from harness import memory, percentile, tree  # noqa: E402
from ksi.brokers import BrokerProcess, start_noida, start_tansu, stop_process  # noqa: E402
from reads import CONSUMER_CONFIG  # noqa: E402  (one set of consumer settings for every benchmark)

PARTITIONS = 4
VALUE_BYTES = 100
# --engines: each is `ksi archive --engine E` with extra [archive] settings; spark-noinline never runs in the driver;
# the -librdkafka ones read with confluent-kafka consumers instead of ksi's own reader (archive.reader)
ENGINES = {"spark": ("spark", ""), "local": ("local", ""), "spark-noinline": ("spark", "inline_max_records = 0\n"),
           "spark-librdkafka": ("spark", 'reader = "librdkafka"\n'),
           "local-librdkafka": ("local", 'reader = "librdkafka"\n')}
TARGETS = {"read": 0.5, "plain": 1.5, "incremental": 0.20, "follow_p99_intervals": 2.0, "rss_bytes": 1 << 30}


def say(line: str) -> None:
    print(line, flush=True)


# ---------------------------------------------------------------------------------------------- data


def produce(bootstrap: str, topic: str, count: int, first: int = 0, rate: float | None = None,
            stop: threading.Event | None = None) -> int:
    """``count`` records (keys, ~100-byte values, 2 headers) round-robin over the partitions; at ``rate``
    records/s when given (in 1000-record steps).  Returns how many were produced."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 1_000_000, "compression.type": "none"})
    payload = bytes(range(256)) * 2
    started = time.monotonic()
    n = 0
    for i in range(first, first + count):
        if stop is not None and stop.is_set():
            break
        headers: list[tuple[str, str | bytes | None]] = [("source", b"bench"), ("seq", b"%d" % i)]
        while True:
            try:
                producer.produce(topic, key=b"key-%08d" % i, value=payload[i % 199:i % 199 + VALUE_BYTES],
                                 headers=headers, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        if rate is not None and n % 1000 == 0:
            producer.poll(0)
            ahead = n / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    if producer.flush(120):
        raise SystemExit(f"{topic}: records not delivered")
    return n


def consumer_config(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "group.id": "bench", **CONSUMER_CONFIG}


def direct(bootstrap: str, topic: str, records: int) -> float:
    """Seconds one consumer takes to receive every record of ``topic``: batches of 10,000 counted, nothing
    else done with them (the read limit)."""
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    started = time.monotonic()
    seen = 0
    while seen < records:
        seen += len(consumer.consume(10000, 1.0))
    seconds = time.monotonic() - started
    consumer.close()
    return seconds


def plain_writer(bootstrap: str, topic: str, records: int, catalog: Any, table_name: str) -> float:
    """Seconds a plain writer takes: consume, 100k rows at a time into pyarrow, PyIceberg ``append``."""
    from ksi.history.ksi_table import partition_spec, raw_value_schema

    table = catalog.create_table(table_name, schema=raw_value_schema(), partition_spec=partition_spec())
    schema = table.schema().as_arrow()
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    started = time.monotonic()
    seen = 0
    rows: list[Any] = []
    while seen < records:
        for m in consumer.consume(10000, 1.0):
            if m.error() is not None:
                continue
            kind, ts = m.timestamp()
            rows.append((m.partition(), m.offset(), ts * 1000, kind - 1, m.key(), m.headers() or [], m.value()))
            seen += 1
        if len(rows) >= 100_000 or (seen >= records and rows):
            columns = list(zip(*rows, strict=True))
            headers = [[{"key": k, "value": v} for k, v in h] for h in columns[5]]
            batch = pa.table([pa.array(columns[0], pa.int32()), pa.array(columns[1], pa.int64()),
                              pa.array(columns[2], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                              pa.array(columns[3], pa.int32()), pa.array(columns[4], pa.large_binary()),
                              pa.array(headers, schema.field("kafka_headers").type),
                              pa.array(columns[6], pa.large_binary()), pa.nulls(len(rows), pa.int32())],
                             schema=schema)
            table.append(batch)
            rows = []
    seconds = time.monotonic() - started
    consumer.close()
    return seconds


def offsets_once(catalog: Any, table_name: str, expected: int, lso_of: tuple[str, str] | None = None) -> str:
    """"ok" when the table holds each of the ``expected`` offsets (0.. per partition) exactly once.

    ``lso_of`` (bootstrap, topic), for tansu, whose last stable offset stays a few hundred records below
    what was produced (so an archive, which reads up to it, stops there): short of ``expected`` is also
    right when the table holds exactly the offsets below each partition's last stable offset, once."""
    rows = catalog.load_table(table_name).scan(selected_fields=("kafka_partition", "kafka_offset")).to_arrow()
    counts = Counter(zip(rows["kafka_partition"].to_pylist(), rows["kafka_offset"].to_pylist(), strict=True))
    twice = sum(1 for c in counts.values() if c > 1)
    if not twice and len(counts) < expected and lso_of is not None:
        from ksi.pipeline.quickplan import watermarks

        marks = watermarks(*lso_of, 30)
        if set(counts) == {(p, o) for p, (_, lso) in marks.items() for o in range(lso)}:
            return f"ok below the last stable offset, {expected - len(counts)} produced records above it"
    if twice or len(counts) != expected:
        return f"WRONG: {len(counts)} distinct offsets of {expected}, {twice} archived more than once"
    return "ok"


# ---------------------------------------------------------------------------------------------- processes


@dataclass
class Run:
    seconds: float
    returncode: int
    peak_rss: int
    peak_pss: int
    output: str
    check: str = ""
    engine: str = ""   # what ran the tasks: spark, inline (in the driver) or local


def run_measured(command: list[str], env: dict[str, str], log_path: Path) -> Run:
    """Run ``command`` to completion (wall time from start to exit), sampling its process tree's memory every
    0.5 s in a thread."""
    peak = [0, 0]
    done = threading.Event()
    with open(log_path, "wb") as log:
        started = time.monotonic()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                   start_new_session=True)

        def sample() -> None:
            while not done.wait(0.5):  # peaks last seconds; sampling is not free (smaps of every process)
                rss, pss = memory(tree(process.pid))
                peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        process.wait()
        seconds = time.monotonic() - started
        done.set()
        sampler.join()
    output = log_path.read_text(errors="replace")
    return Run(seconds, process.returncode, peak[0], peak[1], output, engine=ran_on(output))


ENGINE_RUN = re.compile(r"reading \d+ offsets in \d+ tasks \((\w+) engine")


def ran_on(output: str) -> str:
    """The engine a ``ksi archive`` run's tasks ran on, from its progress lines ("" when it read nothing)."""
    found = ENGINE_RUN.findall(output)
    return ",".join(sorted(set(found)))


# ---------------------------------------------------------------------------------------------- follow


@dataclass
class FollowResult:
    produced: int = 0
    seconds: list[float] = field(default_factory=list)
    records: list[int] = field(default_factory=list)
    unknown: int = 0  # lag samples whose age could not be read (records behind, none read within 2 s)
    peak_rss: int = 0
    peak_pss: int = 0
    check: str = ""
    rounds: str = ""


def follow_bench(args: argparse.Namespace, broker: BrokerProcess, catalog: Any, config: Path, env: dict[str, str],
                 work: Path) -> FollowResult:
    from ksi.pipeline.follow import LagProbe
    from ksi.pipeline.offsets import read_archived_offsets

    topic, table_name = "follow", "history.follow"
    broker.create_topic(topic, PARTITIONS)
    result = FollowResult()
    log_path = work / "follow.log"
    command = [sys.executable, "-m", "ksi", "archive", "--config", str(config), "--topic", topic, "--follow",
               "--interval", str(args.interval), "--engine", args.follow_engine]
    stop = threading.Event()
    count = int(args.follow_rate * args.follow_seconds)
    producer = threading.Thread(target=lambda: setattr(result, "produced", produce(
        broker.bootstrap, topic, count, rate=args.follow_rate, stop=stop)), daemon=True)
    probe = LagProbe(broker.bootstrap)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                   start_new_session=True)
        try:
            # wait for the follower's first round (the table exists then), then start producing
            deadline = time.monotonic() + 120
            while "follow: follow:" not in log_path.read_text(errors="replace") and process.poll() is None:
                if time.monotonic() > deadline:
                    raise SystemExit(f"--follow did not start:\n{log_path.read_text()[-2000:]}")
                time.sleep(0.2)
            producer.start()
            time.sleep(2 * args.interval)  # measure the steady state, not the first rounds
            while producer.is_alive():
                rss, pss = memory(tree(process.pid))
                result.peak_rss, result.peak_pss = max(result.peak_rss, rss), max(result.peak_pss, pss)
                table = catalog.load_table(table_name)
                lake = read_archived_offsets(table).next_offsets
                worst, behind, unknown = 0.0, 0, False
                for p in range(PARTITIONS):
                    records, seconds = probe.lag(topic, p, lake.get(p, 0))
                    unknown = unknown or math.isnan(seconds)
                    worst, behind = max(worst, 0.0 if math.isnan(seconds) else seconds), behind + records
                if unknown:  # records behind whose first could not be read in time: no figure, counted
                    result.unknown += 1
                else:
                    result.seconds.append(worst)
                result.records.append(behind)
                time.sleep(0.5)
            deadline = time.monotonic() + 10 * args.interval + 60
            while time.monotonic() < deadline:
                lake = read_archived_offsets(catalog.load_table(table_name)).next_offsets
                if sum(lake.values()) >= result.produced:
                    break
                time.sleep(0.5)
        finally:
            stop.set()
            probe.close()
            stop_process(process, 60, group=True)
    text = log_path.read_text(errors="replace")
    result.rounds = next((line for line in reversed(text.splitlines()) if "stopped after" in line), "")
    result.check = offsets_once(catalog, table_name, result.produced)
    return result


@dataclass
class WarmRun:
    records: int = 0
    seconds: float = 0.0     # the rounds that archived the new records, summed (each pays its own fixed part)
    rounds: int = 0
    check: str = ""


ROUND = re.compile(r"follow: \S+: \+([\d,]+) records in .*\(([\d.]+) s\)")
WARM_INTERVAL = 10


def warm_incremental(broker: BrokerProcess, catalog: Any, config: Path, topic: str, table_name: str, engine: str,
                     count: int, env: dict[str, str], work: Path, tansu: bool = False) -> WarmRun:
    """10% more records archived by a running ``ksi archive --follow`` (its engine started, its workers warm, its
    imports done): what an incremental run costs without a process's start.  The follower's first round catches
    the table up; then ``count`` records are produced at once, well before the next round (the interval is
    ``WARM_INTERVAL``, so the producer does not share the machine with the timed round), and the round that
    archives them is timed (its own figure).  ``tansu``: the records are archived up to the broker's last stable
    offset, which stays a few hundred records below what was produced (see :func:`offsets_once`)."""
    from ksi.pipeline.archive import watermarks
    from ksi.pipeline.offsets import read_archived_offsets

    log_path = work / f"warm-{table_name}.log"
    command = [sys.executable, "-m", "ksi", "archive", "--config", str(config), "--topic", topic, "--follow",
               "--interval", str(WARM_INTERVAL), "--engine", engine]
    result = WarmRun()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                   start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while f"follow: {topic}: " not in log_path.read_text(errors="replace"):  # the first round is done
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"--follow did not start:\n{log_path.read_text()[-2000:]}")
                time.sleep(0.2)
            had = sum(high for _, high in watermarks(broker.bootstrap, topic, 30).values())
            before = len(log_path.read_text(errors="replace"))
            produce(broker.bootstrap, topic, count, first=had)
            total = had + count
            deadline = time.monotonic() + 300

            def target() -> int:
                return min(total, sum(lso for _, lso in watermarks(broker.bootstrap, topic, 30).values())) \
                    if tansu else total

            while not had < target() <= sum(
                    read_archived_offsets(catalog.load_table(table_name)).next_offsets.values()):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"--follow did not archive {count:,} records:\n{log_path.read_text()[-2000:]}")
                time.sleep(0.2)
            time.sleep(0.5)  # the round's own line follows its commit
        finally:
            stop_process(process, 60, group=True)
    for match in ROUND.finditer(log_path.read_text(errors="replace")[before:]):
        result.records += int(match.group(1).replace(",", ""))
        result.seconds += float(match.group(2))
        result.rounds += 1
    result.check = offsets_once(catalog, table_name, total, (broker.bootstrap, topic) if tansu else None)
    if result.records != count:
        result.check += f"; the timed rounds archived {result.records:,} of {count:,}"
    return result


# ---------------------------------------------------------------------------------------------- report


def load_and_neighbours(own: set[int]) -> str:
    """The load average and the busiest processes that are not this benchmark's."""
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    out = subprocess.run(["ps", "-eo", "pid,pcpu,rss,args", "--sort=-pcpu"], capture_output=True, text=True,
                         check=False).stdout
    busy = []
    for line in out.splitlines()[1:]:
        parts = line.split(None, 3)
        if len(parts) == 4 and int(parts[0]) not in own and float(parts[1]) >= 5.0:
            busy.append(f"{parts[1]}% {parts[3][:90]}")
    return f"load average {load}; other busy processes: " + ("; ".join(busy[:6]) if busy else "none")


def mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def engine_command(config: Path, topic: str, spec: str) -> list[str]:
    return [sys.executable, "-m", "ksi", "archive", "--config", str(config), "--topic", topic, "--engine",
            ENGINES[spec][0]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="500000,2000000", help="records per topic, comma-separated")
    parser.add_argument("--engines", default="spark,local",
                        help=f"ksi archive engines to measure, of {', '.join(ENGINES)} (spark-noinline: Spark even "
                             "for runs small enough for the driver)")
    parser.add_argument("--follow-seconds", type=float, default=40.0, help="0 skips the --follow part")
    parser.add_argument("--follow-rate", type=float, default=50_000.0, help="records/s produced during --follow")
    parser.add_argument("--follow-engine", default="spark", choices=("spark", "local"))
    parser.add_argument("--interval", type=float, default=5.0, help="--follow's commit interval")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of direct, plain and archive per size, "
                                                                 "interleaved; the best of each is reported (median "
                                                                 "ratio to direct in brackets)")
    parser.add_argument("--no-compact", action="store_true", help="skip the ksi compact part")
    parser.add_argument("--workdir", help="default: a new temporary directory")
    parser.add_argument("--broker", choices=("noida", "tansu"), default="noida",
                        help="noida-db answers a fetch with everything up to the partition's end whatever its size "
                             "limits say, so consumers hold more than librdkafka's queue limits; tansu honours them")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    engines = [e for e in args.engines.split(",") if e]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        parser.error(f"--engines: unknown {', '.join(unknown)} (known: {', '.join(ENGINES)})")

    work = Path(args.workdir or tempfile.mkdtemp(prefix="ksi-bench-archive-"))
    (work / "warehouse").mkdir(parents=True, exist_ok=True)
    say(f"workdir {work}; {os.cpu_count()} cores; {load_and_neighbours({os.getpid()})}")
    broker = (start_noida(work / "broker", log_path=work / "broker.log") if args.broker == "noida"
              else start_tansu(log_path=work / "broker.log"))
    from pyiceberg.catalog.sql import SqlCatalog

    catalog_props = {"uri": f"sqlite:///{work / 'catalog.db'}", "warehouse": f"file://{work / 'warehouse'}"}
    catalog = SqlCatalog("lake", **catalog_props)
    catalog.create_namespace("history")
    catalog.create_namespace("plain")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    # as a user's shell: Python keeps the compiled modules (a sandbox that sets this made every run compile
    # ksi's own modules again, ~0.06 s of each run's start)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    own = {os.getpid()} | ({broker.process.pid} if broker.process is not None else set())
    topics = [f"t{n}" for n in sizes] + ["follow"]
    config = work / "ksi.toml"
    entries = "".join(f'[[topics]]\nname = "{t}"\ntable = "history.{t}_ENGINE"\n' for t in topics[:-1])
    entries += '[[topics]]\nname = "follow"\ntable = "history.follow"\n'
    base = (f'[upstream]\nbootstrap_servers = "{broker.bootstrap}"\n[catalog]\nname = "lake"\n'
            f'uri = "{catalog_props["uri"]}"\nwarehouse = "{catalog_props["warehouse"]}"\n'
            '[spark]\nmaster = "local[*]"\n[archive]\nprogress_seconds = 10\n')
    configs = {(e, r): work / f"ksi-{e}-r{r}.toml" for e in engines for r in range(args.rounds)}
    for (e, r), path in configs.items():
        path.write_text(base + ENGINES[e][1] + entries.replace("ENGINE", f"{e.replace('-', '_')}_r{r}"),
                        encoding="utf-8")
    config.write_text(base + entries.replace("ENGINE", "follow"), encoding="utf-8")

    def table_of(topic: str, engine: str, r: int) -> str:
        return f"history.{topic}_{engine.replace('-', '_')}_r{r}"

    lines: list[str] = []
    summary: dict[Any, Any] = {}
    try:
        for n in sizes:
            topic = f"t{n}"
            broker.create_topic(topic, PARTITIONS)
            t0 = time.monotonic()
            produce(broker.bootstrap, topic, n)
            say(f"{topic}: produced {n:,} records in {time.monotonic() - t0:.1f} s")
            lso_of = (broker.bootstrap, topic) if args.broker == "tansu" else None
            reads, plains, runs = [], [], {e: [] for e in engines}
            for r in range(args.rounds):  # interleaved, so a busy moment hits one round, not one path
                reads.append(direct(broker.bootstrap, topic, n))
                say(f"{topic} round {r + 1}: direct {n / reads[-1]:,.0f} records/s")
                plains.append(plain_writer(broker.bootstrap, topic, n, catalog, f"plain.{topic}_r{r}"))
                say(f"{topic} round {r + 1}: plain writer {n / plains[-1]:,.0f} records/s "
                    f"({offsets_once(catalog, f'plain.{topic}_r{r}', n)})")
                for engine in engines:
                    run = run_measured(engine_command(configs[(engine, r)], topic, engine), env,
                                       work / f"archive-{engine}-{topic}-r{r}.log")
                    run.check = offsets_once(catalog, table_of(topic, engine, r), n, lso_of) if run.returncode == 0 \
                        else f"exit {run.returncode}: {run.output[-1500:]}"
                    say(f"{topic} round {r + 1}: ksi archive ({engine}; tasks on {run.engine}) "
                        f"{n / run.seconds:,.0f} records/s, {run.seconds:.1f} s, peak RSS {mib(run.peak_rss)} "
                        f"(PSS {mib(run.peak_pss)}) [{run.check}]")
                    runs[engine].append(run)
            read_s, plain_s = min(reads), min(plains)
            lines.append(f"| {n:,} | direct (read limit) | {n / read_s:,.0f} | 1.00 | — | — | — |")
            lines.append(f"| {n:,} | plain writer | {n / plain_s:,.0f} | {read_s / plain_s:.2f} | 1.00 | — | — |")
            for engine in engines:
                best = min(runs[engine], key=lambda run: run.seconds)
                ratios = sorted(reads[i] / run.seconds for i, run in enumerate(runs[engine]))
                checks = {run.check for run in runs[engine]}
                ran = ",".join(sorted({run.engine for run in runs[engine]}))
                lines.append(f"| {n:,} | ksi archive, {engine} engine (tasks on {ran}) | {n / best.seconds:,.0f} | "
                             f"{read_s / best.seconds:.2f} ({ratios[len(ratios) // 2]:.2f}) | "
                             f"{plain_s / best.seconds:.2f} | "
                             f"{mib(max(run.peak_rss for run in runs[engine]))} "
                             f"({mib(max(run.peak_pss for run in runs[engine]))}) | {', '.join(sorted(checks))} |")
                summary[(n, engine)] = (best, read_s, plain_s)
        largest = max(sizes)
        topic = f"t{largest}"
        produce(broker.bootstrap, topic, largest // 10, first=largest)
        for engine in engines:  # new processes first: a running --follow below produces more records
            full = summary[(largest, engine)][0]
            command = engine_command(configs[(engine, 0)], topic, engine)
            inc = run_measured(command, env, work / f"incremental-{engine}.log")
            noop = run_measured(command, env, work / f"noop-{engine}.log")
            check = offsets_once(catalog, table_of(topic, engine, 0), largest + largest // 10, (broker.bootstrap, topic)
                                 if args.broker == "tansu" else None)
            say(f"{topic}: {engine}: 10% incremental {inc.seconds:.1f} s on {inc.engine} "
                f"({inc.seconds / full.seconds:.0%} of the full run), no-op {noop.seconds:.1f} s [{check}]")
            summary[("inc", engine)] = (inc, noop, full, check)
        for engine in engines:
            full = summary[(largest, engine)][0]
            warm = warm_incremental(broker, catalog, configs[(engine, 0)], topic, table_of(topic, engine, 0),
                                    ENGINES[engine][0], largest // 10, env, work, args.broker == "tansu")
            say(f"{topic}: {engine}: 10% more in a running --follow: {warm.seconds:.2f} s in {warm.rounds} round(s) "
                f"({warm.seconds / full.seconds:.0%} of the full run) [{warm.check}]")
            summary[("warm", engine)] = warm
        follow = None
        if args.follow_seconds > 0:
            follow = follow_bench(args, broker, catalog, config, env, work)
            say(f"follow: p50 {percentile(follow.seconds, 0.5):.2f} s, p99 {percentile(follow.seconds, 0.99):.2f} s "
                f"behind ({follow.unknown} samples of unknown age); {follow.produced:,} produced [{follow.check}]")
        compactions = [] if args.no_compact else compact_bench(config, env, work, sizes, engines, follow is not None)
        neighbours = load_and_neighbours(set(tree(os.getpid())) | own)
    finally:
        broker.stop()

    say("")
    say(f"## ksi archive benchmark ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, {args.broker}, SQLite "
        f"catalog, {PARTITIONS} partitions, {VALUE_BYTES}-byte values, 2 headers)")
    say("")
    say(f"Best of {args.rounds} rounds (median ratio to direct in brackets); peak memory: the largest of the rounds, "
        "summed over the process tree (PSS counts pages shared between processes once).")
    say("")
    say("| records | path | records/s | ratio to direct | ratio to plain | peak RSS (PSS) of the tree | check |")
    say("|---:|---|---:|---:|---:|---:|---|")
    for line in lines:
        say(line)
    say("")
    say("| engine | full run | 10% incremental (a new process) | / full | no-op run | 10% more in a running --follow "
        "| / full |")
    say("|---|---:|---:|---:|---:|---:|---:|")
    for engine in engines:
        inc, noop, full, check = summary[("inc", engine)]
        warm = summary[("warm", engine)]
        say(f"| {engine} | {full.seconds:.1f} s | {inc.seconds:.1f} s (tasks on {inc.engine}) | "
            f"{inc.seconds / full.seconds:.0%} | {noop.seconds:.1f} s | {warm.seconds:.2f} s ({warm.rounds} round(s); "
            f"{warm.check}) | {warm.seconds / full.seconds:.0%} |")
    if follow is not None:
        say("")
        say(f"--follow ({args.follow_engine} engine, interval {args.interval:g} s, {args.follow_rate:,.0f} records/s "
            f"for {args.follow_seconds:g} s, {len(follow.seconds)} samples): lag p50 "
            f"{percentile(follow.seconds, 0.5):.2f} s, p99 {percentile(follow.seconds, 0.99):.2f} s, max "
            f"{max(follow.seconds, default=float('nan')):.2f} s; records behind p50 "
            f"{percentile([float(r) for r in follow.records], 0.5):,.0f}, p99 "
            f"{percentile([float(r) for r in follow.records], 0.99):,.0f}; peak RSS {mib(follow.peak_rss)} "
            f"(PSS {mib(follow.peak_pss)}); {follow.produced:,} produced, exactly once: {follow.check}; "
            f"{follow.rounds.strip()}")
    if compactions:
        say("")
        say("| ksi compact | wall | peak RSS | result |")
        say("|---|---:|---:|---|")
        for line in compactions:
            say(line)
    say("")
    say("Targets at the largest size (met / NOT met as measured in this run):")

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    for engine in engines:
        run, read_s, plain_s = summary[(largest, engine)]
        inc, noop, full, _ = summary[("inc", engine)]
        warm = summary[("warm", engine)]
        verdicts = [
            f"{read_s / run.seconds:.2f}x the read limit (>= {TARGETS['read']}: "
            f"{verdict(read_s / run.seconds >= TARGETS['read'])})",
            f"{plain_s / run.seconds:.2f}x the plain writer (>= {TARGETS['plain']}: "
            f"{verdict(plain_s / run.seconds >= TARGETS['plain'])})",
            f"10% incremental {inc.seconds / full.seconds:.0%} of the full run as a new process, "
            f"{warm.seconds / full.seconds:.0%} in a running --follow (<= {TARGETS['incremental']:.0%}: "
            f"{verdict(inc.seconds / full.seconds <= TARGETS['incremental'])} as a new process, "
            f"{verdict(warm.seconds / full.seconds <= TARGETS['incremental'])} in --follow)",
            f"no-op {noop.seconds:.1f} s",
            f"peak RSS {mib(run.peak_rss)}, PSS {mib(run.peak_pss)} (<= 1 GiB: RSS "
            f"{verdict(run.peak_rss <= TARGETS['rss_bytes'])}, PSS {verdict(run.peak_pss <= TARGETS['rss_bytes'])})",
        ]
        say(f"  {engine}: " + "; ".join(verdicts))
    if follow is not None:
        p99 = percentile(follow.seconds, 0.99)
        say(f"  follow ({args.follow_engine}): p99 {p99:.2f} s = {p99 / args.interval:.2f} intervals (<= "
            f"{TARGETS['follow_p99_intervals']:g}: {verdict(p99 / args.interval <= TARGETS['follow_p99_intervals'])});"
            f" peak RSS {mib(follow.peak_rss)}, PSS {mib(follow.peak_pss)}")
    say(f"While measuring: {neighbours}")
    return 0


def compact_bench(config: Path, env: dict[str, str], work: Path, sizes: list[int], engines: list[str],
                  follow: bool) -> list[str]:
    """``ksi compact`` of the largest table (its full run's files plus the 10% run's small ones), again with
    nothing due, and of the follow table's small files (one per partition per round)."""
    largest = max(sizes)
    text = config.read_text(encoding="utf-8")
    compact_config = work / "ksi-compact.toml"  # the largest topic's table of the first engine's first round
    compact_config.write_text(text.replace(f'table = "history.t{largest}_follow"',
                                           f'table = "history.t{largest}_{engines[0].replace("-", "_")}_r0"'),
                              encoding="utf-8")
    rows = []
    if follow:  # the follow table's rewrite alone: its orphan sweep marked done (a table's first one is due)
        from pyiceberg.catalog.sql import SqlCatalog

        from ksi.pipeline.compact import ORPHANS_PROPERTY

        props = dict(line.split(" = ", 1) for line in text.splitlines() if line.startswith(("uri", "warehouse")))
        lake = SqlCatalog("lake", **{k: v.strip('"') for k, v in props.items()})
        with lake.load_table("history.follow").transaction() as transaction:
            transaction.set_properties({ORPHANS_PROPERTY: f"{time.time():.0f}"})
    for number, (what, name) in enumerate(((f"{engines[0]}'s table after the 10% runs (and its first orphan sweep)",
                                            f"t{largest}"), ("nothing due", f"t{largest}"),
                                           ("follow's small files (the rewrite alone)", "follow"))):
        if name == "follow" and not follow:
            continue
        run = run_measured([sys.executable, "-m", "ksi", "compact", "--config", str(compact_config), "--topic", name,
                            "--orphan-every-hours", "24"], env, work / f"compact-{number}-{name}.log")
        detail = next((line.split(": ", 2)[-1] for line in run.output.splitlines()
                       if line.startswith("ksi compact: ") and "data files" in line and "done" not in line), "")
        if run.returncode != 0:
            detail = f"exit {run.returncode}: {run.output[-800:]}"
        rows.append(f"| {what} | {run.seconds:.1f} s | {mib(run.peak_rss)} | {detail} |")
        say(f"compact ({what}): {run.seconds:.1f} s: {detail}")
    return rows


if __name__ == "__main__":
    sys.exit(main())
