"""The cold path as real consumers use it: every client in the matrix, consumer groups resuming from a
committed cold offset, a Fetch mixing cold and hot partitions, timestamp seeks on both sides of the
seam, retention advancing while a consumer reads, and lake-only topics."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from clients import CLIENT_NAMES, Record, make_client
from ksi.brokers import BrokerProcess
from test_history import BASE_TS, PARTITIONS, PER_PARTITION, archive, consumer_config, read_all, strip


def produce_text(bootstrap: str, topic: str) -> dict[tuple[int, int], Record]:
    """Printable keys, values and headers (kcat reads them as text), in small batches (see test_history)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 10})
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            producer.produce(topic, key=f"k{p}-{i}".encode(), value=f"value {p}/{i} {'x' * (i % 7)}".encode(),
                             headers=[("h", b"1"), ("src", b"test")], partition=p, timestamp=BASE_TS + i * 1000)
            if i % 10 == 9:
                producer.flush(10)
    assert producer.flush(30) == 0
    return {k: Record(v["key"], v["value"], tuple(v["headers"] or ()))
            for k, v in strip(read_all(bootstrap, topic, PARTITIONS * PER_PARTITION)).items()}


def as_archived(records: dict[tuple[int, int], Record]) -> dict[tuple[int, int], dict[str, Any]]:
    return {k: {"key": r.key, "value": r.value, "headers": list(r.headers), "timestamp": (1, BASE_TS + k[1] * 1000)}
            for k, r in records.items()}


def history_topic(noida: BrokerProcess, lake: Any, prefix: str, archived_below: int, log_start: int
                  ) -> tuple[str, dict[tuple[int, int], Record]]:
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, PARTITIONS)
    originals = produce_text(noida.bootstrap, topic)
    archive(lake, table_of(topic), as_archived(originals), below=archived_below)
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, log_start)
    return topic, originals


def table_of(topic: str) -> str:
    return f"history.{topic.replace('-', '_')}"


def proxy_for(ksi_proxy: Any, noida: BrokerProcess, props: dict[str, str], *topics: str) -> Any:
    return ksi_proxy(noida, catalog={"name": "lake", **props},
                     topics=[{"name": t, "table": table_of(t), "layout": "ksi"} for t in topics])


def test_every_client_reads_cold_history_in_groups_and_resumes_from_a_cold_commit(
        noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    lake, props = catalog
    topic, originals = history_topic(noida, lake, "clients", archived_below=120, log_start=100)
    proxy = proxy_for(ksi_proxy, noida, props, topic)
    total = PARTITIONS * PER_PARTITION
    for name in CLIENT_NAMES:
        client = make_client(name, "noida")
        group = f"{name}-{uuid.uuid4().hex[:6]}"
        # 30 records, all below the log start, are read and committed; the group then resumes from
        # those cold offsets and reads the rest, across the seam into the broker's log.
        first = client.consume(proxy.bootstrap, topic, group, 30)
        assert all(c.offset < 100 for c in first), name
        rest = client.consume(proxy.bootstrap, topic, group, total - len(first))
        got: dict[tuple[int, int], Record] = {}
        for c in first + rest:
            assert (c.partition, c.offset) not in got, f"{name}: duplicate at {(c.partition, c.offset)}"
            got[(c.partition, c.offset)] = c.record
        assert got == originals, f"{name}: records differ from what was produced"


def test_mixed_fetch_timestamp_seeks_and_retention_moving_during_a_read(
        noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    lake, props = catalog
    topic, originals = history_topic(noida, lake, "seam", archived_below=PER_PARTITION, log_start=100)
    proxy = proxy_for(ksi_proxy, noida, props, topic)

    # One consumer, partition 0 at a cold offset and partition 1 at a hot one: librdkafka puts both in
    # one Fetch to the partitions' leader, which ksi splits and merges.
    consumer = Consumer(consumer_config(proxy.bootstrap))
    got: dict[tuple[int, int], bytes] = {}
    try:
        consumer.assign([TopicPartition(topic, 0, 10), TopicPartition(topic, 1, 150)])
        deadline = time.monotonic() + 30
        while len(got) < (PER_PARTITION - 10) + (PER_PARTITION - 150) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                got[(message.partition(), message.offset())] = message.value()
        assert got == {k: r.value for k, r in originals.items() if k[1] >= (10 if k[0] == 0 else 150)}

        # Timestamp lookups: offset 42 is only in the lake, offset 150 is in both, asked across the seam.
        for offset in (42, 99, 100, 150):
            found = consumer.offsets_for_times([TopicPartition(topic, p, BASE_TS + offset * 1000) for p in (0, 1)],
                                               timeout=10)
            assert [tp.offset for tp in found] == [offset, offset], offset
    finally:
        consumer.close()

    # Retention moves the log start past a consumer's position while it reads: ksi serves the
    # now-deleted offsets from the lake, with no gap and no duplicate.
    consumer = Consumer(consumer_config(proxy.bootstrap))
    seen: dict[tuple[int, int], bytes] = {}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        moved = False
        deadline = time.monotonic() + 60
        while len(seen) < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            key = (message.partition(), message.offset())
            assert key not in seen, f"duplicate {key}"
            seen[key] = message.value()
            if not moved and len(seen) >= 60:
                for p in range(PARTITIONS):
                    noida.delete_records(topic, p, 180)
                    # Seek each partition to where it is, dropping what librdkafka prefetched, so the next
                    # fetches ask for offsets the broker just deleted.
                    position = max((o for (q, o) in seen if q == p), default=-1) + 1
                    consumer.seek(TopicPartition(topic, p, position))
                moved = True
        assert seen == {k: r.value for k, r in originals.items()}
    finally:
        consumer.close()


def test_lake_only_topic_is_listed_readable_and_read_only(
        noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    lake, props = catalog
    # History for a topic that does not exist in Kafka (deleted long ago, or loaded from elsewhere).
    source, originals = history_topic(noida, lake, "source", archived_below=PER_PARTITION, log_start=0)
    topic = f"lakeonly-{uuid.uuid4().hex[:8]}"
    lake.rename_table(table_of(source), table_of(topic))
    # Unauthenticated clients (noida has no SASL) are User:ANONYMOUS; without this nobody may read it.
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props}, topics=[
        {"name": topic, "table": table_of(topic), "lake_only_readers": ["User:ANONYMOUS"]}])
    deadline = time.monotonic() + 20
    while "does not exist in Kafka" not in proxy.log_text() and time.monotonic() < deadline:
        time.sleep(0.1)

    for name in ("kafka-python", "kafkajs", "kcat"):
        assert make_client(name, "noida").topics(proxy.bootstrap).get(topic) == PARTITIONS, name
    # Read by assignment: the broker's group coordinator refuses offset commits for a topic it does not
    # have, so consumer groups cannot commit on lake-only topics (README, Limits).
    replayed = read_all(proxy.bootstrap, topic, PARTITIONS * PER_PARTITION)
    assert replayed.pop("errors") == []
    assert {k: Record(v["key"], v["value"], tuple(v["headers"] or ())) for k, v in replayed.items()} == originals

    consumer = Consumer(consumer_config(proxy.bootstrap))
    try:
        for p in range(PARTITIONS):
            assert consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) == (0, PER_PARTITION)
        found = consumer.offsets_for_times([TopicPartition(topic, 0, BASE_TS + 77 * 1000)], timeout=10)
        assert found[0].offset == 77
    finally:
        consumer.close()

    failures: list[Any] = []
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "message.timeout.ms": 10000})
    producer.produce(topic, value=b"nope", partition=0, on_delivery=lambda err, msg: failures.append(err))
    producer.flush(15)
    assert failures and failures[0] is not None and failures[0].code() != 0
    assert "is read-only" in proxy.log_text()
    # ksi took the topic out of the Metadata requests the broker saw, so it was never auto-created there.
    admin = Consumer(consumer_config(noida.bootstrap))
    try:
        assert topic not in admin.list_topics(timeout=5).topics
    finally:
        admin.close()
