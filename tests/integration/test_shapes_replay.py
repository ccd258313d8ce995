"""Byte-exact replay through ksi on every table shape a writer leaves (issue 11), by a real client.

The same records are produced to a real broker (noida-db) and written into a table the way each writer
writes it (tests.shapes), then the broker's log start is moved past them, so every offset below it is served
from the lake and the rest by the broker.  The shapes:

* ``redpanda one-file`` and ``automq one-file``: one data file, one row group, the Kafka partitions mixed
  (Redpanda's single translation, unpartitioned spec; AutoMQ's);
* ``redpanda streaming``: small files (a sink committing every few seconds), partitions interleaved;
* ``redpanda hourly`` and ``redpanda daily``: spec ``hour(timestamp)`` / ``day(timestamp)``, every file mixing
  partitions, each partition's offsets spread over many time partitions;
* ``ksi archive``: ksi's own layout (identity partition spec, runs of offsets per file).

confluent-kafka reads every partition from offset 0 to the high watermark: every offset once, in order, and
its key, value, timestamp and headers exactly as produced.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, TopicPartition

from ksi.brokers import BrokerProcess
from tests.integration.test_foreign_tables import PARTITIONS, Record, produce
from tests.shapes import KafkaRecords, synthetic, write_table

LAKE, HOT = 1_200, 100   # records in the lake (below the log start), then only in Kafka
DAYS = 3                 # the lake's records span this many days: dozens of hours, a few days
SMALL_CACHE = 24 << 10   # bytes: about one read of a partition, so the others are evicted to the spill file

SHAPES: dict[str, tuple[str, str, dict[str, Any]]] = {  # case -> layout, shape, writer options
    "redpanda-one-file": ("redpanda", "one-file", {}),
    "automq-one-file": ("automq", "one-file", {"key_type": "raw"}),
    "redpanda-streaming": ("redpanda", "streaming", {"rows_per_file": 100}),
    "redpanda-hourly": ("redpanda", "hourly", {}),
    "redpanda-daily": ("redpanda", "daily", {}),
    "ksi-archive": ("ksi", "archive", {"rows_per_file": 100}),
}


def make_records(topic: str) -> tuple[KafkaRecords, KafkaRecords]:
    now_ms = int(time.time()) * 1000
    lake = synthetic(LAKE, PARTITIONS, seed=31, start_ms=now_ms - DAYS * 86_400_000,
                     ms_per_record=(DAYS * 86_400_000 - 3_600_000) / LAKE, topic=topic)
    ends = [lake.partition.to_pylist().count(p) for p in range(PARTITIONS)]
    hot = synthetic(HOT, PARTITIONS, seed=32, first_offsets=ends, first_row=LAKE, start_ms=now_ms - 60_000,
                    topic=topic)
    return lake, hot


def read_all(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[tuple[int, int], Record]:
    """Every partition from offset 0 by assignment, until the high watermark; fails on an offset twice or out
    of order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"shapes-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "fetch.error.backoff.ms": 100})
    got: dict[tuple[int, int], Record] = {}
    last = dict.fromkeys(range(PARTITIONS), -1)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(got) < sum(ends.values()):
            for m in consumer.consume(500, 0.3):
                assert m.error() is None, m.error()
                p, o = m.partition(), m.offset()
                assert o > last[p], f"{topic}: offset {p}/{o} after {last[p]}"
                last[p] = o
                got[(p, o)] = (m.key(), m.value(), m.timestamp()[1], list(m.headers() or []))
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("case", list(SHAPES))
def test_every_shape_replays_byte_exact_through_ksi(noida: BrokerProcess, ksi_proxy: Any, catalog: Any,
                                                   case: str) -> None:
    lake, props = catalog
    layout, shape, options = SHAPES[case]
    topic = f"shape-{case}-{uuid.uuid4().hex[:6]}"
    lake_records, hot = make_records(topic)
    produced = produce(noida, topic, [lake_records, hot])
    table = f"history.{topic.replace('-', '_')}"
    report = write_table(lake, table, lake_records, layout=layout, shape=shape, **options)
    files = [task.file.file_path for task in report.table.scan().plan_files()]
    assert len(files) == report.files
    if shape == "one-file":  # one data file holding every partition, in one row group
        assert len(files) == 1 and pq.ParquetFile(files[0].removeprefix("file://")).num_row_groups == 1
    else:  # hours: dozens of files; days: a few per cut
        assert len(files) >= {"streaming": 12, "hourly": 24, "daily": DAYS, "archive": 12}[shape], len(files)
    log_start = {p: lake_records.partition.to_pylist().count(p) for p in range(PARTITIONS)}
    for p, offset in log_start.items():
        noida.delete_records(topic, p, offset)
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props},
                      topics=[{"name": topic, "table": table, "layout": layout}])
    ends = {p: sum(1 for q, _ in produced if q == p) for p in range(PARTITIONS)}
    got = read_all(proxy.bootstrap, topic, ends)
    assert got.keys() == produced.keys(), (case, sorted(got.keys() ^ produced.keys())[:10], proxy.log_tail())
    for key, record in produced.items():
        assert got[key] == record, (case, key)
    assert proxy.metric("ksi_cold_fetches_total", topic=topic) > 0  # the lake answered below the log start


def test_a_replay_answered_from_the_spill_file_is_byte_exact(noida: BrokerProcess, ksi_proxy: Any, catalog: Any,
                                                             tmp_path: Any) -> None:
    """With a memory cache that holds about one read, what it evicts goes to the spill file
    (``history.spill_bytes``), and a second consumer replaying the same history is answered from there: every
    record as produced, as from memory or the lake."""
    lake, props = catalog
    topic = f"spill-{uuid.uuid4().hex[:6]}"
    lake_records, hot = make_records(topic)
    produced = produce(noida, topic, [lake_records, hot])
    table = f"history.{topic.replace('-', '_')}"
    write_table(lake, table, lake_records, layout="redpanda", shape="hourly")
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, lake_records.partition.to_pylist().count(p))
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props},
                      topics=[{"name": topic, "table": table, "layout": "redpanda"}],
                      history={"cache_bytes": SMALL_CACHE, "spill_bytes": 64 << 20, "spill_dir": str(spill_dir),
                               "prefetch": False})
    ends = {p: sum(1 for q, _ in produced if q == p) for p in range(PARTITIONS)}
    for reader in ("first", "second"):
        got = read_all(proxy.bootstrap, topic, ends)
        assert got.keys() == produced.keys(), (reader, sorted(got.keys() ^ produced.keys())[:10], proxy.log_tail())
        for key, record in produced.items():
            assert got[key] == record, (reader, key)
    assert proxy.metric("ksi_lake_spill_writes_total") > 0, proxy.log_tail()
    assert proxy.metric("ksi_lake_spill_hits_total") > 0, proxy.log_tail()
    assert not list(spill_dir.iterdir())  # unlinked when made
