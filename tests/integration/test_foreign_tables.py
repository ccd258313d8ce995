"""Foreign tables as their writers leave them, replayed through ksi by real clients (issue 12).

The records are produced to a real broker (noida-db), the same records are written into a table the way the
writer writes it (tests.shapes), then the broker's log start is moved past them, so every offset below it is
served from the lake.  Each table holds what real tables hold besides the records:

* ``redpanda-migrated``: Redpanda's v24.3 -> v25.3 migration as its guide describes it (the old rows have
  nulls in the new timestamp and header-key columns, their values in ``timestamp_v1`` and ``key_v1``), and
  an at-least-once retry: 5% of the newer rows written twice, identical;
* ``automq-differing``: AutoMQ's raw layout with 5% of the rows written twice and the copies' values
  changed (a re-read after the data changed): served once, the first data file's row, and reported.

Two client libraries (confluent-kafka in a committing group at both isolation levels, kafka-python by
assignment) read from the beginning across the seam: every offset once, the bytes as produced (where the
copy differs: the original), the group's commits at the high watermark (lag 0).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ksi.brokers import BrokerProcess
from tests.shapes import KafkaRecords, synthetic, write_redpanda_migrated, write_table
from tests.shapes.anomalies import duplicate

PARTITIONS = 2
BEFORE, AFTER, HOT = 300, 300, 100  # rows before the migration, after it (both in the lake), only in Kafka

Record = tuple[bytes | None, bytes | None, int, list[tuple[str, bytes]]]  # key, value, timestamp, headers


def make_records() -> tuple[KafkaRecords, KafkaRecords, KafkaRecords]:
    def counts(records: KafkaRecords) -> np.ndarray:
        return np.bincount(records.partition.to_numpy(), minlength=PARTITIONS)

    # Timestamps of the last hour: the broker's retention would delete records as old as synthetic's default.
    start_ms = (int(time.time()) - 3600) * 1000
    before = synthetic(BEFORE, PARTITIONS, seed=21, start_ms=start_ms, ms_per_record=1000.0)
    after = synthetic(AFTER, PARTITIONS, seed=22, first_offsets=list(map(int, counts(before))), first_row=BEFORE,
                      start_ms=start_ms, ms_per_record=1000.0)
    hot = synthetic(HOT, PARTITIONS, seed=23, first_offsets=list(map(int, counts(before) + counts(after))),
                    first_row=BEFORE + AFTER, start_ms=start_ms, ms_per_record=1000.0)
    return before, after, hot


def produce(broker: BrokerProcess, topic: str, parts: list[KafkaRecords]) -> dict[tuple[int, int], Record]:
    """Every record at its own offset (one idempotent producer, partitions in arrival order)."""
    broker.create_topic(topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    produced: dict[tuple[int, int], Record] = {}
    for records in parts:
        for p, o, ts, _, key, value, headers in records.rows():
            producer.produce(topic, value, key, partition=p, timestamp=ts, headers=headers)
            produced[(p, o)] = (key, value, ts, headers)
    assert producer.flush(30) == 0
    check = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check"})
    try:  # the broker numbered them as the writer's table does
        for p in range(PARTITIONS):
            assert check.get_watermark_offsets(TopicPartition(topic, p), 10)[1] == sum(1 for q, _ in produced if q == p)
    finally:
        check.close()
    return produced


def lake_end(records: list[KafkaRecords]) -> dict[int, int]:
    ends = dict.fromkeys(range(PARTITIONS), 0)
    for part in records:
        for p, o in zip(part.partition.to_pylist(), part.offset.to_pylist(), strict=True):
            ends[p] = max(ends[p], o + 1)
    return ends


def read_group(bootstrap: str, topic: str, isolation: str,
               ends: dict[int, int]) -> tuple[dict[tuple[int, int], Record], dict[int, int]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "isolation.level": isolation, "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "fetch.error.backoff.ms": 100, "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000})
    got: dict[tuple[int, int], Record] = {}
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(got) < sum(ends.values()):
            for m in consumer.consume(500, 0.3):
                assert m.error() is None, m.error()
                key = (m.partition(), m.offset())
                assert key not in got, f"{isolation}: {key} delivered twice"
                got[key] = (m.key(), m.value(), m.timestamp()[1], list(m.headers() or []))
        positions = consumer.position([TopicPartition(topic, p) for p in range(PARTITIONS)])
        consumer.commit(offsets=positions, asynchronous=False)
        committed = {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)}
    finally:
        consumer.close()
    return got, committed


def read_kafka_python(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[tuple[int, int], Record]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    got: dict[tuple[int, int], Record] = {}
    try:
        consumer.assign([KTP(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(got) < sum(ends.values()):
            for batch in consumer.poll(timeout_ms=300).values():
                for m in batch:
                    key = (m.partition, m.offset)
                    assert key not in got, f"kafka-python: {key} delivered twice"
                    got[key] = (m.key, m.value, m.timestamp, list(m.headers or []))
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("case", ["redpanda-migrated", "automq-differing"])
def test_foreign_table_replays_exactly_through_ksi(noida: BrokerProcess, ksi_proxy: Any, catalog: Any,
                                                 case: str) -> None:
    lake, props = catalog
    before, after, hot = make_records()
    topic = f"foreign-{case}-{uuid.uuid4().hex[:6]}"
    produced = produce(noida, topic, [before, after, hot])
    table = f"history.{topic.replace('-', '_')}"
    if case == "redpanda-migrated":
        layout = "redpanda"
        write_redpanda_migrated(lake, table, before, duplicate(after, 0.05, seed=5))
    else:
        layout = "automq"
        write_table(lake, table, duplicate(KafkaRecords.concat([before, after]), 0.05, differing=True, seed=5),
                    layout="automq", shape="streaming", key_type="raw")
    log_start = lake_end([before, after])
    for p, offset in log_start.items():
        noida.delete_records(topic, p, offset)
    # Redpanda holds retention back until it has translated (explained holes); AutoMQ keeps no such record,
    # but the lake ends exactly at the log start here, so there is no hole to step over.
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props},
                      topics=[{"name": topic, "table": table, "layout": layout}])
    ends = {p: sum(1 for q, _ in produced if q == p) for p in range(PARTITIONS)}
    for isolation in ("read_committed", "read_uncommitted"):
        got, committed = read_group(proxy.bootstrap, topic, isolation, ends)
        assert got.keys() == produced.keys(), (isolation, sorted(got.keys() ^ produced.keys())[:10], proxy.log_tail())
        assert got == produced, isolation
        assert committed == ends  # lag 0
    got = read_kafka_python(proxy.bootstrap, topic, ends)
    assert got == produced
    duplicates = proxy.metric("ksi_lake_rows_total", topic=topic, reason="duplicate")
    assert duplicates >= int(0.05 * AFTER)
    if case == "automq-differing":
        assert proxy.metric("ksi_lake_rows_total", topic=topic, reason="differing_duplicate") > 0
        assert f"topic {topic}: the table holds differing rows for the same offset" in proxy.log_text()
    else:
        assert proxy.metric("ksi_lake_rows_total", topic=topic, reason="differing_duplicate") == 0
