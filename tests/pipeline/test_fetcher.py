"""ksi's own archive reader (``archive.reader = "ksi"``: ksi.pipeline.fetcher and protocol.batch_columns) against
real brokers, noida-db and tansu, and against the librdkafka reader on the same ranges: the same rows, column
for column, for every compression codec a producer may choose; bounded memory whatever the broker sends; the
errors a task reports."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from ksi.brokers import BrokerProcess, start_tansu
from ksi.pipeline import fetcher
from ksi.pipeline.reader import RangeReadError, ReadSpec, metadata_arrow_fields, read_range, reader_for

SCHEMA = pa.schema(metadata_arrow_fields())


@pytest.fixture(scope="module")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = start_tansu(log_path=tmp_path_factory.mktemp("fetcher-tansu") / "tansu.log")
    yield broker
    broker.stop()


@pytest.fixture(params=["noida", "tansu"])
def broker(request: pytest.FixtureRequest) -> BrokerProcess:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


def produce(broker: BrokerProcess, count: int, compression: str = "none", partitions: int = 2,
            batch: int = 500) -> str:
    """``count`` records a partition: keys (some null), values of 0-3000 bytes (some null), 0-2 headers
    (some values null), CreateTime timestamps going back and forth (recent: noida-db's retention deletes old
    ones); at most ``batch`` records a batch."""
    now = int(time.time() * 1000)
    topic = f"fetch-{compression}-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "compression.type": compression,
                         "batch.num.messages": batch})
    for p in range(partitions):
        for i in range(count):
            headers = [("n", b"%d" % i), ("empty", None)][: i % 3]
            producer.produce(topic, partition=p, key=None if i % 7 == 0 else b"k%d" % i,
                             value=None if i % 11 == 5 else bytes([i % 251]) * (i * 37 % 3001),
                             headers=headers or None, timestamp=now - (i * 7919) % 100_000)
        producer.flush(30)
    return topic


def read(broker: BrokerProcess, topic: str, partition: int, start: int, stop: int, reader: str,
         **consumer: str) -> pa.Table:
    spec = ReadSpec(broker.bootstrap, topic, SCHEMA, consumer=consumer, reader=reader, poll_timeout_seconds=10)
    return pa.Table.from_batches(list(read_range(spec, partition, start, stop)), schema=SCHEMA)


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_the_same_rows_as_librdkafka_for_every_codec(broker: BrokerProcess, compression: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    topic = produce(broker, 1200, compression)
    monkeypatch.setattr(fetcher, "CHUNK_BYTES", 64 << 10)  # many chunks, batches cut across them
    for partition, (start, stop) in ((0, (0, 1200)), (1, (333, 1001))):
        ours = read(broker, topic, partition, start, stop, "ksi")
        theirs = read(broker, topic, partition, start, stop, "librdkafka")
        assert ours.column("kafka_offset").to_pylist() == list(range(start, stop))
        assert ours.equals(theirs), f"{compression} p{partition}"


def test_a_range_ends_with_its_last_batch_whatever_the_broker_sends(noida: BrokerProcess,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """noida-db answers a Fetch with the partition's whole tail: the reader reads it a chunk at a time, at
    most QUEUED_CHUNKS ahead of the task (a chunk holds one batch at least), and leaves the rest unread once
    the range is complete."""
    monkeypatch.setattr(fetcher, "CHUNK_BYTES", 32 << 10)
    topic = produce(noida, 3000, partitions=1, batch=10)  # batches of 10 records: at most ~30 KiB
    head = fetcher.RangeFetch(noida.bootstrap, {}, topic, 0, 0, 3000)
    try:
        time.sleep(1.0)  # nothing taken: the thread reads ahead only as far as the queue lets it
        assert head.received <= (fetcher.QUEUED_CHUNKS + 2) * fetcher.CHUNK_BYTES
    finally:
        head.close()
    short = fetcher.RangeFetch(noida.bootstrap, {}, topic, 0, 0, 10)
    chunks = list(short)
    short.close()
    assert short.received <= 2 * fetcher.CHUNK_BYTES and len(chunks) == 1
    assert read(noida, topic, 0, 0, 10, "ksi").column("kafka_offset").to_pylist() == list(range(10))


def test_a_start_below_the_log_start_is_an_error_naming_it(noida: BrokerProcess) -> None:
    topic = produce(noida, 200, partitions=1)
    noida.delete_records(topic, 0, 100)
    with pytest.raises(RangeReadError, match=rf"{topic}/0: offset 50 is out of range on the broker"):
        read(noida, topic, 0, 50, 150, "ksi")


def test_a_partition_that_never_answers_fails_after_the_poll_timeout(noida: BrokerProcess) -> None:
    spec = ReadSpec(noida.bootstrap, "no-such-topic-" + uuid.uuid4().hex[:6], SCHEMA, reader="ksi",
                    poll_timeout_seconds=1)
    started = time.monotonic()
    with pytest.raises(RangeReadError, match=r"no-such-topic-\w+/0: no progress for 1 s at offset 0"):
        list(read_range(spec, 0, 0, 10))
    assert time.monotonic() - started < 10


def test_properties_ksis_reader_does_not_speak_choose_librdkafka() -> None:
    assert reader_for("auto", {"fetch.wait.max.ms": "100", "group.id": "x"}) == ("ksi", None)
    assert reader_for("auto", {"security.protocol": "SASL_SSL"}) == (
        "librdkafka", "archive.consumer property security.protocol=SASL_SSL is not one ksi's reader speaks")
    assert reader_for("auto", {"sasl.mechanism": "PLAIN"})[0] == "librdkafka"
    assert reader_for("librdkafka", {}) == ("librdkafka", None)


def test_tls_to_the_broker_is_refused_clearly_when_it_does_not_speak_tls(noida: BrokerProcess) -> None:
    spec = ReadSpec(noida.bootstrap, "any", SCHEMA, consumer={"security.protocol": "ssl"}, reader="ksi",
                    poll_timeout_seconds=5)
    with pytest.raises(RangeReadError, match=r"TLS with 127\.0\.0\.1:\d+ failed"):
        list(read_range(spec, 0, 0, 10))




@pytest.mark.parametrize(("consumer", "message"), [
    ({"fetch.max.bytes": "lots"}, "archive.consumer: fetch.max.bytes must be a whole number, got 'lots'"),
    ({"security.protocol": "ssl", "ssl.ca.location": "/no/such/ca.pem"}, "the ssl.* files cannot be used"),
])
def test_settings_ksis_reader_cannot_use_are_named(noida: BrokerProcess, consumer: dict[str, str],
                                                    message: str) -> None:
    spec = ReadSpec(noida.bootstrap, "any", SCHEMA, consumer=consumer, reader="ksi", poll_timeout_seconds=5)
    with pytest.raises(RangeReadError, match=message.replace(".", r"\.").replace("*", r"\*")):
        list(read_range(spec, 0, 0, 10))
