"""Archive throughput and compaction figures: ``python tests/pipeline/bench_archive.py [--records N]``.

Starts a noida-db broker, produces N records of ~100 B over 4 partitions, archives them with
``local[2]`` Spark into a SQLite-catalog table and prints rows/s and MB/s (of Kafka record bytes: keys,
values, headers).  With ``--small-runs K`` it then produces and archives K more small batches and prints
how many data files the table has before and after ``compact``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka import Producer  # noqa: E402

from ksi.brokers import start_noida  # noqa: E402
from ksi.config import parse_config  # noqa: E402
from ksi.pipeline.archive import archive_topic  # noqa: E402
from ksi.pipeline.settings import parse_pipeline_sections  # noqa: E402
from ksi.pipeline.spark import get_spark  # noqa: E402


def produce(bootstrap: str, topic: str, count: int, partitions: int, size: int = 100) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 500000, "compression.type": "none"})
    payload = bytes(range(256)) * (size // 256 + 1)
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=payload[i % 97:i % 97 + size - 12], key=b"key-%07d" % i,
                                 partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(120):
        raise SystemExit("records not delivered")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--small-runs", type=int, default=0)
    parser.add_argument("--small-run-records", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2, help="archive this many topics of --records each: the first "
                                                               "run includes the JVM's warm-up")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ksi-bench-"))
    (work / "warehouse").mkdir()
    broker = start_noida(work / "broker")
    topic = "bench"
    broker.create_topic(topic, args.partitions)
    raw = {"upstream": {"bootstrap_servers": broker.bootstrap},
           "catalog": {"name": "lake", "uri": f"sqlite:///{work / 'catalog.db'}", "warehouse": f"file://{work / 'warehouse'}"},
           "topics": [{"name": topic, "table": "history.bench"}],
           "spark": {"master": args.master}, "archive": {"progress_seconds": 10}}
    config = parse_pipeline_sections(raw, parse_config({k: v for k, v in raw.items() if k not in ("spark", "archive")},
                                                       "bench"))
    spark = get_spark(config.spark, config.config.catalog)
    for run in range(args.repeat):
        name = f"{topic}{run}"
        broker.create_topic(name, args.partitions)
        t0 = time.monotonic()
        produce(broker.bootstrap, name, args.records, args.partitions)
        print(f"produced {args.records} records in {time.monotonic() - t0:.1f} s", flush=True)
        one = dataclasses.replace(config.config.topics[0], name=name, table=f"history.{name}")
        result = archive_topic(spark, config, one, progress=lambda line: print(line, flush=True))
        print(f"ARCHIVE run {run + 1}: rows/s={result.rows / result.seconds:,.0f} "
              f"MB/s={result.kafka_bytes / result.seconds / 1e6:.1f} records={result.rows} "
              f"kafka_bytes={result.kafka_bytes} parquet_bytes={result.file_bytes} files={result.files} "
              f"seconds={result.seconds:.1f}", flush=True)
    if args.small_runs:
        from ksi.pipeline.compact import compact_table, data_file_count

        broker.create_topic(topic, args.partitions)
        for _ in range(args.small_runs):
            produce(broker.bootstrap, topic, args.small_run_records, args.partitions)
            archive_topic(spark, config, config.config.topics[0])
        before = data_file_count(spark, config.config.catalog.name, "history.bench")
        report = compact_table(spark, config, config.config.topics[0], progress=print)
        after = data_file_count(spark, config.config.catalog.name, "history.bench")
        print(f"COMPACT files before={before} after={after} ({report.summary_line()})")
    broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
