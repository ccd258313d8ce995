#!/usr/bin/env python3
"""Soak ksi: mixed producers, cold and hot consumers, a moving log start and a broker fault, then an exact
count of produced versus consumed records per partition.

What it starts (all on loopback, under --data-dir):

* a broker: noida-db (persistent; DeleteRecords really moves the log start) or tansu (memory only; see
  "tansu" below);
* an Iceberg catalog: PyIceberg's SqlCatalog on SQLite, with the topic's ksi-layout table;
* ksi: ``python -m ksi serve`` with the topic configured for history.

What runs for --seconds:

* producers through ksi: confluent-kafka and kafka-python, acks=all, keys (some null), headers, explicit
  timestamps, some null values; every acknowledged record is kept in a ledger (partition, offset) -> a
  digest of key, value, headers and timestamp;
* cold consumers through ksi, each reading from the beginning (through the lake) and then following the
  tail: a confluent-kafka consumer group that commits after every batch, a kafka-python consumer by
  assignment, and a confluent-kafka consumer by assignment started just before the fault (so the fault
  lands in its cold read).  Cold consumers are throttled (--cold-rate) so they spend time in the lake;
* hot consumers through ksi, by assignment from the end of the log when they start: confluent-kafka and
  aiokafka;
* the archiver, every --archive-every seconds: what ``ksi archive`` and retention do.  Per partition it
  reads the next offsets straight from the broker, appends them to the Iceberg table (ksi layout), then
  moves the broker's log start below the lake's end with DeleteRecords.  Consumers that lag fall from the
  broker into the lake, transparently (tansu cannot delete records: there the topic is configured with
  prefer_lake, so archived offsets are still served from the lake);
* one fault at --fault-at of the run: ``broker`` = kill -9 the broker and start it again after --outage
  seconds on the same port (noida keeps its data), ``proxy`` = kill -9 ksi and start it again on the same
  ports, ``none``.  Producers keep producing through the outage (into their clients' queues).

noida writes its state to disk once a second (its whole Kafka state as one file), so a kill -9 loses the
last second of acknowledged writes: a property of that broker, not of ksi.  The soak therefore quiesces
the producers and waits until the broker's state file holds every acknowledged record before it kills;
consumers, the archiver and ksi are never paused.

tansu: memory only and no DeleteRecords, so the fault is ``proxy`` (a broker restart would lose the topic)
and archived offsets are served from the lake through prefer_lake.  Two faults of tansu itself, measured
without ksi, show up in a tansu soak: with two producers writing one partition at once a consumer can skip a
record (so there each partition gets one producer), and a fetch with max_wait_ms=0, which ksi sends for the
hot half of a fetch it splits, is answered with no partitions at all, which kafka-python rejects as an
invalid full fetch response and then stalls (the cold-kp consumer may not reach the end).

At the end the producers stop, the consumers read up to the final end of every partition, and a table
per partition and consumer shows: consumed, lost (offsets never consumed), skipped (jumps forward),
dup (records delivered twice that Kafka semantics do not allow), replayed (a consumer group re-reading
from its own last commit after a rebalance: allowed), bad (a record whose key, value, headers or
timestamp differ from what was produced).  The exit status is 1 when any of lost, skipped, dup or bad is
not zero, when a consumer did not reach the end, or when ksi logged a Python traceback; 0 otherwise.

    .venv/bin/python scripts/soak.py --seconds 120
    make soak SOAK_SECONDS=600
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
import time
import uuid
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ksi
sys.path.insert(1, str(Path(__file__).resolve().parent))  # the soak's parts, also when loaded by path

from ksi.brokers import free_port, start_noida, start_tansu
from soaklib.consumers import ConsumerThread, Throttle
from soaklib.faults import inject
from soaklib.lake import Archiver, create_table
from soaklib.producers import Producers, ProducerThread, produce_sync
from soaklib.proxy import KsiProcess, ksi_config
from soaklib.records import Ledger
from soaklib.report import Printer, progress, report


def run_soak(args: argparse.Namespace) -> int:
    from pyiceberg.catalog.sql import SqlCatalog

    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="ksi-soak-")).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    logging.basicConfig(filename=str(data_dir / f"soak-{run_id}.log"), level=logging.INFO,
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    say = Printer()
    warnings.filterwarnings("ignore", message="Parquet writer option", category=UserWarning)  # PyIceberg's writer
    partitions = args.partitions
    fault = args.fault or ("broker" if args.broker == "noida" else "proxy")
    if fault == "broker" and args.broker == "tansu":
        say("tansu keeps its data in memory only: a broker restart would lose the topic; use --fault proxy")
        return 2

    say(f"soak {run_id}: {args.seconds:g} s, {partitions} partitions, broker {args.broker}, fault {fault}, "
        f"data in {data_dir}")
    if args.broker == "noida":
        broker = start_noida(data_dir / "noida", log_path=data_dir / "noida.log")
    else:
        broker = start_tansu(log_path=data_dir / "tansu.log")
    ksi: KsiProcess | None = None
    consumers: list[ConsumerThread] = []
    producers = Producers()
    try:
        topic = f"soak-{run_id}"
        table_name = f"history.soak_{run_id}"
        broker.create_topic(topic, partitions)
        (data_dir / "warehouse").mkdir(exist_ok=True)
        props = {"uri": f"sqlite:///{data_dir / 'catalog.db'}", "warehouse": f"file://{data_dir / 'warehouse'}"}
        catalog = SqlCatalog("lake", **props)
        if ("history",) not in catalog.list_namespaces():
            catalog.create_namespace("history")
        table = create_table(catalog, table_name)

        ledger = Ledger(partitions)
        # History to start with: seed records, archived and (noida) deleted from the broker.
        produce_sync(broker.bootstrap, topic, ledger, args.seed, args.value_bytes)
        archiver = Archiver(table, broker, topic, partitions, hot_keep=args.hot_keep, can_delete=broker.kind == "noida")
        archiver.round()

        ports = (free_port(), free_port(), free_port())
        config = data_dir / f"ksi-{run_id}.toml"
        config.write_text(ksi_config(*ports, broker, props, topic, table_name, prefer_lake=broker.kind == "tansu"))
        ksi = KsiProcess(config, data_dir / f"ksi-{run_id}.log", ports[0])
        ksi.start()
        say(f"ksi at {ksi.bootstrap} (log {ksi.log_path}); seed: {ledger.count()} records, lake up to "
            f"{archiver.lake_next}, log start {archiver.log_start}")

        everything = list(range(partitions))
        if broker.kind == "tansu" and partitions > 1:
            # tansu makes a record visible before an earlier one when two producers write one partition
            # at once, and consumers then skip the earlier one (measured without ksi): one producer per
            # partition there.
            shares = {"cf": (everything[0::2], args.rate * len(everything[0::2]) / partitions),
                      "kp": (everything[1::2], args.rate * len(everything[1::2]) / partitions)}
        else:
            shares = {"cf": (everything, args.rate / 2), "kp": (everything, args.rate / 2)}
        for label, kind in (("cf", "confluent"), ("kp", "kafka-python")):
            targets, rate = shares[label]
            producers.add(label, kind, ksi.bootstrap, topic, ledger, rate, args.value_bytes, partitions=targets)

        def consumer(name: str, kind: str, start: dict[int, int] | None, hook: Throttle | None = None
                     ) -> ConsumerThread:
            assert ksi is not None
            thread = ConsumerThread(name, kind, ksi.bootstrap, topic, partitions, start=start, hook=hook,
                                    small_fetches=hook is not None)
            consumers.append(thread)
            thread.start()
            return thread

        def tail() -> dict[int, int]:
            return {p: ledger.end(p) for p in range(partitions)}

        consumer("cold-group", "confluent-group", None, Throttle(args.cold_rate))
        consumer("cold-kp", "kafka-python", None, Throttle(args.cold_rate))
        consumer("hot-cf", "confluent", tail())
        consumer("hot-aio", "aiokafka", tail())

        started = time.monotonic()
        fault_at = started + args.seconds * args.fault_at
        late_at = fault_at - min(10.0, args.seconds * 0.1)  # a cold reader still in the lake when the fault lands
        next_archive = started + args.archive_every
        next_progress = started + args.progress_every
        faults: list[str] = []
        late_started = fault_done = False
        archiving: threading.Thread | None = None
        late_throttle = Throttle(args.cold_rate)
        while time.monotonic() - started < args.seconds:
            now = time.monotonic()
            workers: list[ProducerThread | ConsumerThread] = [*producers.threads, *consumers]
            for worker in workers:
                if worker.error is not None:
                    raise RuntimeError(f"{worker.name} failed: {worker.error!r}")
            if not late_started and now >= late_at:
                # Slow enough to be half way through the lake when the fault lands, full speed after it.
                late_throttle.set_rate(min(args.cold_rate, max(20.0, sum(archiver.lake_next) / 2 / (fault_at - now))))
                consumer("cold-late", "confluent", dict.fromkeys(range(partitions), 0), late_throttle)
                late_started = True
            if not fault_done and now >= fault_at and fault != "none":
                def positions() -> str:
                    return (f"lake < {archiver.lake_next}, consumer positions: "
                            + ", ".join(f"{c.label} {[t.position for t in c.traces]}" for c in consumers))

                faults.append(inject(fault, broker, ksi, producers, ledger, topic, archiver, args.outage, say,
                                     positions))
                late_throttle.set_rate(args.cold_rate)
                fault_done = True
            if now >= next_archive and (archiving is None or not archiving.is_alive()):
                archiving = threading.Thread(target=archiver.round, name="archiver", daemon=True)
                archiving.start()
                next_archive = now + args.archive_every
            if now >= next_progress:
                say(progress(now - started, ledger, archiver, consumers))
                next_progress = now + args.progress_every
            time.sleep(0.1)

        if archiving is not None:
            archiving.join()
        say("stopping the producers")
        producers.finish()
        end = [ledger.end(p) for p in range(partitions)]
        for thread in consumers:
            thread.finish(end)
        drain_deadline = time.monotonic() + args.drain_seconds
        while not all(t.finished.is_set() for t in consumers) and time.monotonic() < drain_deadline:
            time.sleep(0.5)
            if time.monotonic() >= next_progress:
                say(progress(time.monotonic() - started, ledger, archiver, consumers))
                next_progress = time.monotonic() + args.progress_every
        unfinished = [t.label for t in consumers if not t.finished.is_set()]
        for thread in consumers:
            thread.abort()
        for thread in consumers:
            thread.join(30)

        ok = report(say, ledger, consumers, end, unfinished, faults, archiver, ksi, producers)
        return 0 if ok else 1
    finally:
        producers.stop.set()
        producers.allowed.set()
        for thread in consumers:
            thread.abort()
        if ksi is not None:
            code = ksi.stop()
            if code != 0:
                say(f"ksi exited with code {code}")
        broker.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="soak.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Progress goes to stdout; the soak's own log (clients included), the broker's and ksi's logs "
               "and config stay in --data-dir.")
    parser.add_argument("--seconds", type=float, default=300, help="how long the producers run (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the soak topic (default %(default)s)")
    parser.add_argument("--broker", choices=("noida", "tansu"), default="noida",
                        help="the broker to start (default %(default)s)")
    parser.add_argument("--data-dir", default=None,
                        help="where the broker, catalog, warehouse and logs live (default: a new temporary "
                             "directory, printed at the start)")
    parser.add_argument("--rate", type=float, default=400,
                        help="records per second, all producers together (default %(default)s)")
    parser.add_argument("--value-bytes", type=int, default=200, help="value size in bytes (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1000,
                        help="records per partition produced before ksi starts; the archiver's first round "
                             "puts all but --hot-keep of them in the lake (default %(default)s)")
    parser.add_argument("--cold-rate", type=float, default=800,
                        help="records per second a cold consumer takes, so it spends a while in the lake "
                             "(default %(default)s)")
    parser.add_argument("--archive-every", type=float, default=10,
                        help="seconds between archive rounds (default %(default)s)")
    parser.add_argument("--hot-keep", type=int, default=300,
                        help="offsets per partition an archive round leaves in the broker only (default %(default)s)")
    parser.add_argument("--fault", choices=("broker", "proxy", "none"), default=None,
                        help="broker: kill -9 the broker and start it again; proxy: kill -9 ksi and start it "
                             "again; none (default: broker on noida, proxy on tansu)")
    parser.add_argument("--fault-at", type=float, default=0.5,
                        help="when to inject the fault, as a fraction of --seconds (default %(default)s)")
    parser.add_argument("--outage", type=float, default=5,
                        help="seconds the killed process stays down (default %(default)s)")
    parser.add_argument("--progress-every", type=float, default=5,
                        help="seconds between progress lines (default %(default)s)")
    parser.add_argument("--drain-seconds", type=float, default=120,
                        help="how long the consumers get to reach the end once the producers stop "
                             "(default %(default)s)")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.partitions < 1 or args.rate <= 0 or not 0 < args.fault_at < 1:
        parser.error("--seconds, --partitions and --rate must be positive and --fault-at in (0, 1)")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_soak(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
