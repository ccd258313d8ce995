"""Transactions end to end (issue 12): a topic written by a transactional producer, commits and aborts
interleaved, archived by ``ksi archive`` (the inline engine, and the Spark engine), then the broker's log start
moved into the middle of it (DeleteRecords on noida-db) and the whole topic read through ksi under both
isolation levels with two client libraries.

Each read through ksi is compared offset-exact with what the same client read from the broker before the log
start moved: read_committed consumers get exactly the committed records, read_uncommitted ones the committed
and the aborted records; a consumer group's committed offsets end at the high watermark (lag 0); ListOffsets
EARLIEST answers the lake's first offset, LATEST and the last stable offset are the broker's.
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from ksi.pipeline.archive import archive_topic
from ksi.verify import print_verify

from .kafka_helpers import BASE_TS, consumer_config

PARTITIONS = 2
TRANSACTIONS = 12
PER_TRANSACTION = 4                  # records per partition per transaction; the marker takes one more offset
END = TRANSACTIONS * (PER_TRANSACTION + 1)
# Just after aborted transaction 7 (offsets 35..38, its abort marker 39): the lake's last records are aborted, so
# a read_committed consumer steps from 34 over them and the marker to the log start.  (Not inside a transaction:
# noida-db then gives read_committed consumers the aborted records at and above the log start.)
LOG_START = 40

Read = dict[tuple[int, int], tuple[bytes | None, bytes | None, int, list[tuple[str, bytes]]]]


def aborted(transaction: int) -> bool:
    return transaction % 3 == 1


def produce_transactions(bootstrap: str, topic: str) -> None:
    """Transactions over both partitions, every third aborted (1, 4, 7, 10): in each partition transaction t
    holds offsets 5t..5t+3, its commit or abort marker 5t+4."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"txn-{uuid.uuid4().hex[:6]}",
                         "linger.ms": 0})
    producer.init_transactions(30)
    for t in range(TRANSACTIONS):
        producer.begin_transaction()
        for p in range(PARTITIONS):
            for i in range(PER_TRANSACTION):
                n = t * PER_TRANSACTION + i
                producer.produce(topic, key=None if i == 3 else b"k%d" % n,
                                 value=b"%s p%d t%d r%d" % (b"aborted" if aborted(t) else b"committed", p, t, i),
                                 headers=[("t", b"%d" % t)] if i % 2 else None, partition=p,
                                 timestamp=BASE_TS + n)
        if aborted(t):
            assert producer.flush(30) == 0  # in the log before the abort (else librdkafka purges them unsent)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)


def read_confluent(bootstrap: str, topic: str, isolation: str, group: str | None = None
                   ) -> tuple[Read, dict[int, int]]:
    """Every record from offset 0 to the end with confluent-kafka, by assignment; with ``group``, the positions
    reached are committed and the group's committed offsets returned."""
    config = consumer_config(bootstrap, **{"isolation.level": isolation, "fetch.error.backoff.ms": 100})
    if group is not None:
        config["group.id"] = group
    consumer = Consumer(config)
    got: Read = {}
    committed: dict[int, int] = {}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        positions = []
        while time.monotonic() < deadline:
            for m in consumer.consume(500, 0.3):
                if m.error() is None:
                    key = (m.partition(), m.offset())
                    assert key not in got, f"{isolation}: {key} delivered twice"
                    got[key] = (m.key(), m.value(), m.timestamp()[1], list(m.headers() or []))
            positions = consumer.position([TopicPartition(topic, p) for p in range(PARTITIONS)])
            if all(tp.offset >= END for tp in positions):
                break
        assert all(tp.offset >= END for tp in positions), (isolation, [(tp.partition, tp.offset) for tp in positions])
        if group is not None:
            consumer.commit(offsets=positions, asynchronous=False)
            committed = {tp.partition: tp.offset for tp in consumer.committed(
                [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)}
    finally:
        consumer.close()
    return got, committed


def read_kafka_python(bootstrap: str, topic: str, isolation: str) -> Read:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                             consumer_timeout_ms=1000)
    got: Read = {}
    try:
        consumer.assign([KTP(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=300).values():
                for m in batch:
                    key = (m.partition, m.offset)
                    assert key not in got, f"kafka-python {isolation}: {key} delivered twice"
                    got[key] = (m.key, m.value, m.timestamp, [(k, v) for k, v in m.headers or []])
            if all(consumer.position(KTP(topic, p)) >= END for p in range(PARTITIONS)):
                break
        assert all(consumer.position(KTP(topic, p)) >= END for p in range(PARTITIONS)), isolation
    finally:
        consumer.close()
    return got


READERS: dict[str, Callable[[str, str, str], Read]] = {
    "confluent-kafka": lambda bootstrap, topic, isolation: read_confluent(bootstrap, topic, isolation)[0],
    "kafka-python": read_kafka_python,
}
ISOLATIONS = ("read_committed", "read_uncommitted")


def list_offsets(bootstrap: str, topic: str) -> dict[tuple[str, str], dict[int, int]]:
    """(spec, isolation) -> partition -> offset, asked with ListOffsets."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    out = {}
    for spec_name, spec in (("earliest", OffsetSpec.earliest()), ("latest", OffsetSpec.latest())):
        for isolation in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
            futures = admin.list_offsets({TopicPartition(topic, p): spec for p in range(PARTITIONS)},
                                         isolation_level=isolation, request_timeout=20)
            out[(spec_name, str(isolation))] = {tp.partition: f.result().offset for tp, f in futures.items()}
    return out


@pytest.mark.parametrize("engine", ["inline", "spark"])
def test_transactions_archived_and_replayed_under_both_isolation_levels(
        noida: Any, lake: Any, make_config: Any, start_proxy: Any, request: pytest.FixtureRequest,
        engine: str) -> None:
    topic = f"txn-{engine}-{uuid.uuid4().hex[:6]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce_transactions(noida.bootstrap, topic)

    direct = {(client, isolation): READERS[client](noida.bootstrap, topic, isolation)
              for client in READERS for isolation in ISOLATIONS}
    committed = {(p, 5 * t + i) for p in range(PARTITIONS) for t in range(TRANSACTIONS) if not aborted(t)
                 for i in range(PER_TRANSACTION)}
    every = {(p, 5 * t + i) for p in range(PARTITIONS) for t in range(TRANSACTIONS) for i in range(PER_TRANSACTION)}
    for client in READERS:  # what the broker gives each client: the reference the replay must match
        assert set(direct[(client, "read_committed")]) == committed, client
        assert set(direct[(client, "read_uncommitted")]) == every, client

    config, path = make_config(topic, table)
    runner = request.getfixturevalue("spark") if engine == "spark" else None
    result = archive_topic(runner, config, config.config.topics[0])
    assert result.engine == engine and result.rows == len(every)
    rows = lake.table(table).scan(selected_fields=("kafka_partition", "kafka_offset", "kafka_aborted")).to_arrow()
    marked = {(p, o) for p, o, a in zip(rows["kafka_partition"].to_pylist(), rows["kafka_offset"].to_pylist(),
                                        rows["kafka_aborted"].to_pylist(), strict=True) if a}
    assert len(rows) == len(every) and marked == every - committed

    for p in range(PARTITIONS):
        noida.delete_records(topic, p, LOG_START)
    broker_offsets = list_offsets(noida.bootstrap, topic)
    proxy = start_proxy(path)
    for client, read in READERS.items():
        for isolation in ISOLATIONS:
            got = read(proxy.bootstrap, topic, isolation)
            want = direct[(client, isolation)]
            assert got == want, (client, isolation, sorted(set(got) ^ set(want))[:10],
                                 [k for k in want if k in got and got[k] != want[k]][:5])

    for isolation in ISOLATIONS:  # a consumer group through ksi: committed offsets at the end, lag 0
        _, offsets = read_confluent(proxy.bootstrap, topic, isolation, f"g-{isolation}-{uuid.uuid4().hex[:6]}")
        assert offsets == dict.fromkeys(range(PARTITIONS), END), isolation

    through = list_offsets(proxy.bootstrap, topic)
    for (spec, isolation), offsets in through.items():
        if spec == "earliest":
            assert broker_offsets[(spec, isolation)] == dict.fromkeys(range(PARTITIONS), LOG_START)
            assert offsets == dict.fromkeys(range(PARTITIONS), 0), (spec, isolation)  # the lake's first offset
        else:  # the high watermark, and the last stable offset under read_committed: the broker's
            assert offsets == broker_offsets[(spec, isolation)] == dict.fromkeys(range(PARTITIONS), END), (
                spec, isolation, offsets, broker_offsets[(spec, isolation)])
    assert "refusing to skip" not in proxy.log_text()

    # ksi verify: the lake (aborted records included) equals what a read_uncommitted consumer gets from the broker
    out = io.StringIO()
    assert print_verify(config.config, topic, out=out, progress_seconds=3600) == 0, out.getvalue()
    assert f"{topic} partition 0: OK" in out.getvalue() and "compared 40..58: 16 equal" in out.getvalue()
