"""Holes at the seam (issue 12): offsets just below the broker's log start that no writer stores.

A transactional producer's commit markers take offsets of their own (here every tenth: offsets 9, 19, ..., 99
just below the log start 100), and Iceberg's Kafka Connect sink drops tombstones (here offsets 96..98).  A
table written as each writer writes it (tests.shapes) ends below the log start; the broker (noida-db, its
DeleteRecords really moves the log start) starts at 100.  Consumers must step over the hole as a broker steps
over compacted offsets and markers, read every record exactly once, and their group's committed offsets and lag
must end right, when the writer's commit state says it read those offsets (ksi's archived offsets; Redpanda,
which holds retention back until it has translated; the Kafka Connect sink's consumer group).  A writer that
keeps no such state (AutoMQ) stalls the consumer with a retriable error unless the topic's ``seam_holes`` is
``skip``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ksi.brokers import BrokerProcess
from ksi.registry import RegistryServer, start_registry
from tests.shapes import KafkaRecords, write_table

PARTITIONS = 2
PER_PARTITION = 130          # offsets 0..129 per partition
LOG_START = 100
TOMBSTONES = range(96, 99)   # null values the Kafka Connect sink drops
BASE_MS = (int(time.time()) - 600) * 1000


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryServer]:
    server = start_registry("127.0.0.1", 0, tmp_path / "registry")
    try:
        yield server
    finally:
        server.stop()


def produce_transactions(broker: BrokerProcess, topic: str) -> dict[tuple[int, int], tuple[bytes | None, int]]:
    """Transactions of nine records per partition, committed: the tenth offset of every ten is a commit
    marker.  Returns (partition, offset) -> (value, timestamp) of every data record."""
    broker.create_topic(topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"seam-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(30)
    produced: dict[tuple[int, int], tuple[bytes | None, int]] = {}
    for p in range(PARTITIONS):
        for block in range(PER_PARTITION // 10):
            producer.begin_transaction()
            for i in range(9):
                offset = block * 10 + i
                value = None if offset in TOMBSTONES else b"p%d-%d" % (p, offset)
                producer.produce(topic, value, b"k%d" % offset, partition=p, timestamp=BASE_MS + offset)
                produced[(p, offset)] = (value, BASE_MS + offset)
            producer.commit_transaction(30)
    return produced


def lake_records(produced: dict[tuple[int, int], tuple[bytes | None, int]], *, drop_tombstones: bool,
                 typed: bool = False, below: int = LOG_START) -> KafkaRecords:
    """The data records below ``below`` (the log start), as a writer that read them keeps them."""
    rows = sorted((p, o, v, ts) for (p, o), (v, ts) in produced.items()
                  if o < below and not (drop_tombstones and v is None))
    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    return KafkaRecords(
        partition=pa.array([r[0] for r in rows], pa.int32()), offset=pa.array([r[1] for r in rows], pa.int64()),
        timestamp_ms=pa.array([r[3] for r in rows], pa.int64()), key=pa.array([b"k%d" % r[1] for r in rows]),
        value=pa.array([r[2] for r in rows], pa.binary()), headers=pa.nulls(len(rows), pa.list_(header)),
        typed=pa.StructArray.from_arrays([pa.array([r[1] for r in rows], pa.int64())], names=["n"],
                                         mask=pa.array([r[2] is None for r in rows])) if typed else None)


def read_all(bootstrap: str, topic: str, isolation: str,
             group: str) -> tuple[dict[tuple[int, int], Any], dict[int, int]]:
    """Every record from the beginning to the end with confluent-kafka in a group that commits; the records and
    the group's committed offsets."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": isolation,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.error.backoff.ms": 100,
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
                         "receive.message.max.bytes": 1 << 30})
    got: dict[tuple[int, int], Any] = {}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            for m in consumer.consume(500, 0.3):
                if m.error() is None:
                    key = (m.partition(), m.offset())
                    assert key not in got, f"{key} delivered twice"
                    got[key] = (m.value(), m.timestamp()[1])
            positions = consumer.position([TopicPartition(topic, p) for p in range(PARTITIONS)])
            if all(tp.offset >= PER_PARTITION for tp in positions):
                break
        positions = consumer.position([TopicPartition(topic, p) for p in range(PARTITIONS)])
        assert all(tp.offset >= PER_PARTITION for tp in positions), (
            f"{isolation}: stalled at {[(tp.partition, tp.offset) for tp in positions]}; read up to"
            f" {[max((o for (q, o) in got if q == p), default=None) for p in range(PARTITIONS)]}")
        consumer.commit(offsets=positions, asynchronous=False)
        committed = {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)}
    finally:
        consumer.close()
    return got, committed


def read_with_kafka_python(bootstrap: str, topic: str, isolation: str) -> dict[tuple[int, int], Any]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                             consumer_timeout_ms=1000)
    got: dict[tuple[int, int], Any] = {}
    try:
        consumer.assign([KTP(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=300).values():
                for m in batch:
                    key = (m.partition, m.offset)
                    assert key not in got, f"{key} delivered twice"
                    got[key] = (m.value, m.timestamp)
            if all(consumer.position(KTP(topic, p)) >= PER_PARTITION for p in range(PARTITIONS)):
                break
    finally:
        consumer.close()
    return got


def expected(produced: dict[tuple[int, int], Any], *, drop_tombstones: bool) -> set[tuple[int, int]]:
    return {k for k, (v, _) in produced.items() if k[1] >= LOG_START or not (drop_tombstones and v is None)}


WRITERS = {  # name -> (layout, write_table options, topic settings, whether the writer drops tombstones)
    "ksi": ("ksi", {"shape": "archive", "commit_state": False,
                    "snapshot_properties": {"ksi.archived-offsets": '{"0":100,"1":100}'}}, {}, False),
    "redpanda": ("redpanda", {"shape": "hourly", "mode": "key_value"}, {}, False),
    "kafka-connect": ("kafka-connect", {"shape": "streaming"}, {"writer_group": "connect-iceberg-sink"}, True),
    "automq-skip": ("automq", {"shape": "streaming", "key_type": "raw"}, {"seam_holes": "skip"}, False),
}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_holes_below_the_log_start_are_stepped_over(noida: BrokerProcess, ksi_proxy: Any, catalog: Any,
                                                    registry: RegistryServer, writer: str) -> None:
    lake, props = catalog
    layout, options, settings, drops = WRITERS[writer]
    topic = f"seam-{writer}-{uuid.uuid4().hex[:6]}"
    produced = produce_transactions(noida, topic)
    table = f"history.{topic.replace('-', '_')}"
    write_table(lake, table, lake_records(produced, drop_tombstones=drops, typed=layout == "kafka-connect"),
                layout=layout, **options)
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, LOG_START)
    if "writer_group" in settings:  # the sink's consumer group committed what it read, markers included
        sink = Consumer({"bootstrap.servers": noida.bootstrap, "group.id": settings["writer_group"]})
        sink.commit(offsets=[TopicPartition(topic, p, LOG_START) for p in range(PARTITIONS)], asynchronous=False)
        sink.close()
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props}, schema_registry={"url": registry.url},
                      topics=[{"name": topic, "table": table, "layout": layout, **settings}])
    want = expected(produced, drop_tombstones=drops)
    for isolation in ("read_committed", "read_uncommitted"):
        got, committed = read_all(proxy.bootstrap, topic, isolation, f"g-{isolation}-{uuid.uuid4().hex[:4]}")
        assert set(got) == want, (isolation, sorted(set(got) ^ want)[:10])
        assert committed == dict.fromkeys(range(PARTITIONS), PER_PARTITION)  # lag 0: the high watermark
        got = read_with_kafka_python(proxy.bootstrap, topic, isolation)
        assert set(got) == want, ("kafka-python", isolation, sorted(set(got) ^ want)[:10])
    for (p, o), (value, ts) in got.items():
        assert ts == produced[(p, o)][1]
        if layout != "kafka-connect" and not (layout == "automq" and produced[(p, o)][0] is None):
            assert value == produced[(p, o)][0]  # (Kafka Connect's values are re-encoded; AutoMQ keeps b"")
    assert "refusing to skip" not in proxy.log_text()


def test_offsets_never_archived_keep_their_error(noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    """ksi's archive recorded that it read up to 90: offsets 90..99 were never archived when retention deleted
    them (lost data): the consumer stalls at 90 with a retriable error, the log names the range."""
    lake, props = catalog
    topic = f"seam-lost-{uuid.uuid4().hex[:6]}"
    produced = produce_transactions(noida, topic)
    records = lake_records({k: v for k, v in produced.items() if k[1] < 90}, drop_tombstones=False)
    table = f"history.{topic.replace('-', '_')}"
    write_table(lake, table, records, layout="ksi", shape="archive", commit_state=False,
                snapshot_properties={"ksi.archived-offsets": '{"0":90,"1":90}'})
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, LOG_START)
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props}, topics=[{"name": topic, "table": table}])
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": "lost", "fetch.error.backoff.ms": 100})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            got += [m.offset() for m in consumer.consume(500, 0.3) if m.error() is None]
        [position] = consumer.position([TopicPartition(topic, 0)])
    finally:
        consumer.close()
    assert max(got) == 88 and position.offset == 90  # 89 (a marker the archive read) stepped over, then stalled
    assert f"topic {topic} partition 0: offsets 90..99 are in neither the lake nor Kafka" in proxy.log_text()


def test_a_writer_without_commit_state_stalls_unless_told_to_skip(noida: BrokerProcess, ksi_proxy: Any,
                                                                  catalog: Any) -> None:
    lake, props = catalog
    topic = f"seam-automq-{uuid.uuid4().hex[:6]}"
    produced = produce_transactions(noida, topic)
    table = f"history.{topic.replace('-', '_')}"
    write_table(lake, table, lake_records(produced, drop_tombstones=False), layout="automq", shape="streaming",
                key_type="raw")
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, LOG_START)
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props}, topics=[{"name": topic, "table": table,
                                                                          "layout": "automq"}])
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": "stall", "fetch.error.backoff.ms": 100})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            got += [m.offset() for m in consumer.consume(500, 0.3) if m.error() is None]
    finally:
        consumer.close()
    assert max(got) == 98  # the lake's last record: 99 is a marker, then the log starts at 100
    log = proxy.log_text()
    assert "keeps no record of which offsets its writer read" in log and 'seam_holes = "skip"' in log
