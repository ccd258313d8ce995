"""The splice data path end to end (issue 18, docs/passthrough.md): a topic configured with history, its large
record batches produced through ksi and read back through ksi, from the broker and across the seam.

ksi moves the records of a frame with 64 KiB or more still unread from one socket to the other with splice(2)
(``ksi_spliced_bytes_total``): a Produce request's records to the broker, and a forwarded Fetch response's
records to the client once the history filter has scanned the partitions' fields in its first bytes (none of
a configured topic OFFSET_OUT_OF_RANGE).  The unit tests (tests/ksi/test_splice.py) check that decision and
the byte path on sockets; this test checks what a user sees, with a real broker (noida-db, which really moves
its log start), a real ksi process, a real table and two clients of different Fetch versions: every record
once and byte-exact, spliced at the hot offsets, then replayed from the lake across the seam after the
broker's log start moved under the running ksi (the router answers those Fetches, lake and broker stitched);
and a Fetch forwarded to the broker on a log start ksi learnt before it moved, answered OFFSET_OUT_OF_RANGE
for one partition beside another's records, is handed to the router and read from the lake.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition

from ksi.brokers import BrokerProcess
from tests.shapes import HEADERS_TYPE, KafkaRecords, write_table

PARTITIONS = 2
PER_PARTITION = 2_500
LOG_START = 600            # offsets below it are deleted from the broker and kept in the lake
VALUE_BYTES = 1_000
BASE_MS = (int(time.time()) - 3_600) * 1000

Record = tuple[bytes | None, bytes | None, int, list[tuple[str, Any]]]  # key, value, timestamp ms, headers


def record(partition: int, offset: int) -> Record:
    """The record at ``partition``/``offset``: distinct bytes in every position, so a shifted or repeated
    splice shows."""
    stamp = b"%d:%06d:" % (partition, offset)
    value = (stamp * (VALUE_BYTES // len(stamp) + 1))[:VALUE_BYTES]
    return b"k%d-%d" % (partition, offset), value, BASE_MS + offset, [("h", stamp), ("n", b"%d" % offset)]


def lake_records(below: int) -> KafkaRecords:
    rows = [(p, o, *record(p, o)) for p in range(PARTITIONS) for o in range(below)]
    return KafkaRecords(
        partition=pa.array([r[0] for r in rows], pa.int32()), offset=pa.array([r[1] for r in rows], pa.int64()),
        timestamp_ms=pa.array([r[4] for r in rows], pa.int64()), key=pa.array([r[2] for r in rows], pa.binary()),
        value=pa.array([r[3] for r in rows], pa.binary()),
        headers=pa.array([[{"key": k, "value": v} for k, v in r[5]] for r in rows], HEADERS_TYPE))


def produce(bootstrap: str, topic: str) -> None:
    """Every record, in batches of up to 1 MB (one Produce request each: large enough to be spliced)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 200, "batch.size": 1_000_000,
                         "batch.num.messages": 100_000, "compression.type": "none", "acks": "all",
                         "enable.idempotence": True})
    failed: list[str] = []
    for offset in range(PER_PARTITION):
        for p in range(PARTITIONS):
            key, value, ts, headers = record(p, offset)
            producer.produce(topic, value, key, partition=p, timestamp=ts, headers=headers,
                             on_delivery=lambda err, _m: failed.append(str(err)) if err else None)
        if offset % 500 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0, "records left unsent"
    assert not failed, failed[:3]


def read_confluent(bootstrap: str, topic: str, starts: dict[int, int]) -> dict[tuple[int, int], Record]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"splice-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "fetch.error.backoff.ms": 50,
                         "receive.message.max.bytes": 1 << 30})
    got: dict[tuple[int, int], Record] = {}
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        deadline = time.monotonic() + 60
        while len(got) < PARTITIONS * PER_PARTITION - sum(starts.values()) and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.3):
                assert m.error() is None, m.error()
                where = (m.partition(), m.offset())
                assert where not in got, f"{where} delivered twice"
                got[where] = (m.key(), m.value(), m.timestamp()[1], list(m.headers() or []))
    finally:
        consumer.close()
    return got


def read_kafka_python(bootstrap: str, topic: str, starts: dict[int, int]) -> dict[tuple[int, int], Record]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=1000,
                             fetch_max_bytes=1 << 30, max_partition_fetch_bytes=1 << 24)
    got: dict[tuple[int, int], Record] = {}
    try:
        consumer.assign([KTP(topic, p) for p in starts])
        for p, offset in starts.items():
            consumer.seek(KTP(topic, p), offset)
        deadline = time.monotonic() + 60
        while len(got) < PARTITIONS * PER_PARTITION - sum(starts.values()) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=300).values():
                for m in batch:
                    where = (m.partition, m.offset)
                    assert where not in got, f"{where} delivered twice"
                    got[where] = (m.key, m.value, m.timestamp, [(k, bytes(v)) for k, v in m.headers])
    finally:
        consumer.close()
    return got


def assert_exact(got: dict[tuple[int, int], Record], starts: dict[int, int], client: str) -> None:
    want = {(p, o) for p, start in starts.items() for o in range(start, PER_PARTITION)}
    assert set(got) == want, (client, sorted(set(got) ^ want)[:10])
    wrong = [where for where, rec in got.items() if rec != record(*where)]
    assert not wrong, (client, wrong[:5], got[wrong[0]][:3] if wrong else None)


def history_topic(noida: BrokerProcess, ksi_proxy: Any, catalog: Any, prefix: str) -> tuple[str, Any]:
    """A new topic on the broker, its table holding offsets [0, LOG_START) of both partitions as ksi's archive
    leaves it (its offsets committed), and a ksi process with the topic configured for history."""
    lake, props = catalog
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    write_table(lake, table, lake_records(LOG_START), layout="ksi", shape="archive", commit_state=False,
                snapshot_properties={"ksi.archived-offsets": json.dumps(dict.fromkeys(("0", "1"), LOG_START))})
    return topic, ksi_proxy(noida, catalog={"name": "lake", **props}, topics=[{"name": topic, "table": table}])


def test_large_batches_of_a_history_topic_are_spliced_both_ways_and_replayed_exactly_across_the_seam(
        noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    topic, proxy = history_topic(noida, ksi_proxy, catalog, "splice")

    produce(proxy.bootstrap, topic)
    produced = proxy.metric("ksi_spliced_bytes_total", direction="proxy_to_server")
    assert produced > PARTITIONS * PER_PARTITION * VALUE_BYTES // 2, (
        f"Produce requests spliced: {produced:,.0f} bytes\n{proxy.log_tail()}")

    # Above the lake: Fetches forwarded to the broker, their records (noida-db answers with each partition's
    # whole tail, ~1.9 MB, both partitions in one response) spliced to the client, the second partition's
    # fields read between the two partitions' records (ksi.relay).
    hot = dict.fromkeys(range(PARTITIONS), LOG_START)
    spliced = 0.0
    for client, read in (("confluent-kafka", read_confluent), ("kafka-python", read_kafka_python)):
        assert_exact(read(proxy.bootstrap, topic, hot), hot, f"{client}, above the lake")
        now = proxy.metric("ksi_spliced_bytes_total", direction="proxy_to_client")
        assert now - spliced > PARTITIONS * (PER_PARTITION - LOG_START) * VALUE_BYTES * 0.9, (
            f"{client}: Fetch responses spliced: {now - spliced:,.0f} bytes")
        spliced = now

    # The broker's log start moves under the running ksi: a replay from the beginning reads the lake, then the
    # broker, every record once.
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, LOG_START)
    start = dict.fromkeys(range(PARTITIONS), 0)
    for client, read in (("confluent-kafka", read_confluent), ("kafka-python", read_kafka_python)):
        assert_exact(read(proxy.bootstrap, topic, start), start, f"{client}, from the beginning")
    assert proxy.metric("ksi_cold_fetches_total", topic=topic) > 0, "nothing was read from the lake"
    assert proxy.metric("ksi_upstream_errors_total") == 0, proxy.log_tail()
    assert proxy.metric("ksi_client_errors_total") == 0, proxy.log_tail()


def test_a_forwarded_fetch_answered_out_of_range_after_the_log_start_moved_is_read_from_the_lake(
        noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    """A Fetch forwarded on what ksi knew of the log starts, answered OFFSET_OUT_OF_RANGE for one partition
    because the broker's log start moved since (the response holds the other partition's records too): the
    history filter hands it to the router, and the consumer reads every record once, the moved range from the
    lake."""
    topic, proxy = history_topic(noida, ksi_proxy, catalog, "splice-oor")
    produce(noida.bootstrap, topic)
    # Partition 1 from an offset both hold: ksi learns log start 0 and forwards its Fetches to the broker.  The
    # first Fetch, which no connection had learnt that log start for, is the router's; finding it all the
    # broker's, the router hands it back, and noida-db's answer (both partitions' whole tails) is spliced on.
    starts = {0: LOG_START, 1: 100}
    assert_exact(read_confluent(proxy.bootstrap, topic, starts), starts, "confluent-kafka, both held")
    spliced = proxy.metric("ksi_spliced_bytes_total", direction="proxy_to_client")
    assert spliced > (2 * PER_PARTITION - LOG_START - 100) * VALUE_BYTES * 0.9, (
        f"Fetch responses spliced: {spliced:,.0f} bytes\n{proxy.log_tail()}")
    assert proxy.metric("ksi_cold_fetches_total", topic=topic) == 0
    noida.delete_records(topic, 1, LOG_START)  # ksi still knows log start 0: the next Fetch goes to the broker
    for client, read in (("confluent-kafka", read_confluent), ("kafka-python", read_kafka_python)):
        assert_exact(read(proxy.bootstrap, topic, starts), starts, f"{client}, after the log start moved")
    assert proxy.metric("ksi_cold_fetches_total", topic=topic) > 0, "nothing was read from the lake"
    assert proxy.metric("ksi_upstream_errors_total") == 0, proxy.log_tail()
    assert proxy.metric("ksi_client_errors_total") == 0, proxy.log_tail()
