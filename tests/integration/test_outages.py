"""Outages of what the cold path depends on, with real parts: a PostgreSQL catalog stopped (connections
refused) or hung (SIGSTOP: connections accepted, nothing answered) and brought back, the warehouse's data
files gone for a while, and the embedded Schema Registry stopped and restarted on its port and data.

What ksi needs at fetch time, and so what an outage takes away:

* the **catalog**: a table is loaded once, then refreshed (at most every 2 s, when a request names the
  topic) to learn new snapshots, i.e. which offsets the lake holds.  With the catalog down ksi keeps the
  snapshot it has (snapshots are immutable), so offsets in it are still served, while offsets only a newer
  snapshot holds get KAFKA_STORAGE_ERROR until the catalog answers again.  If the catalog is down when ksi
  starts, ksi knows nothing about the lake: cold offsets get KAFKA_STORAGE_ERROR, never the broker's
  OFFSET_OUT_OF_RANGE (which would make a consumer reset past history it never read).
* the **warehouse's files** (manifests, data files): read for every chunk not in the cache.
* the **Schema Registry**: a typed Avro column is encoded with its writer's schema, fetched by id once.

In every case the consumer sees a retriable error (it stalls, it does not skip), hot partitions are
served throughout, and once the dependency is back the consumer reads every offset exactly once, byte for
byte.  The chunk cache is off (``history.cache_bytes = 0``) so every cold fetch really reads the lake.
"""

from __future__ import annotations

import re
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.record import MemoryRecords

from ksi.brokers import BrokerProcess, free_port
from ksi.registry import RegistryServer, start_registry
from protocol import api, response_body_offset
from test_history import BASE_TS, PARTITIONS, PER_PARTITION, archive, consumer_config, produce, strip
from test_history_avro import PER_PARTITION as AVRO_PER_PARTITION
from test_history_avro import archive_typed, produce_orders
from tests.postgres_server import PostgresServer, running_postgres

KAFKA_STORAGE_ERROR = 56
COLD_PATH = {"cache_bytes": 0, "prefetch": False}  # every cold fetch reads the lake: no cached chunk hides an outage


# -- a PostgreSQL catalog that can be stopped and started ---------------------------------------------


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


@pytest.fixture
def pg_catalog(postgres: PostgresServer, tmp_path: Path) -> Iterator[tuple[Any, dict[str, str]]]:
    """A PyIceberg SqlCatalog on the PostgreSQL server, its own namespace per test; the server is running
    again when the test ends, whatever the test did to it."""
    from pyiceberg.catalog.sql import SqlCatalog

    if not postgres.running:
        postgres.start()
    (tmp_path / "warehouse").mkdir()
    props = {"uri": postgres.uri, "warehouse": f"file://{tmp_path / 'warehouse'}"}
    catalog = SqlCatalog("pg", **props)
    namespace = f"h_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    try:
        yield catalog, {"namespace": namespace, **props}
    finally:
        if postgres.paused:
            postgres.resume()
        if not postgres.running:
            postgres.start()
        catalog.engine.dispose()


# -- a client reduced to the wire: the error code a partition really gets ------------------------------


def _call(bootstrap: str, request: Any, response_cls: Any, version: int) -> Any:
    host, port = bootstrap.rsplit(":", 1)
    request.with_header(correlation_id=7, client_id="outage-test")
    payload = bytes(request.encode(version=version, header=True))
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", _read_exactly(sock, 4))[0]
        raw = _read_exactly(sock, size)
    entry = api(response_cls.API_KEY)
    assert entry is not None
    assert struct.unpack_from(">i", raw)[0] == 7
    return response_cls.decode(raw[response_body_offset(raw, entry.response_header_version(version)):],
                               version=version)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        assert more, "ksi closed the connection"
        data += more
    return data


def raw_fetch(bootstrap: str, topic: str, offsets: dict[int, int], cold: tuple[int, ...] = (0,),
              timeout: float = 15) -> dict[int, tuple[int, dict[int, Any]]]:
    """A Fetch v12 for ``{partition: offset}``: per partition, its error code and the records (offset ->
    value) at or after the offset asked for.

    ksi answers the partitions that are ready and starts reading the others for the next fetch, as a broker
    answers with the partitions that have data: a cold partition (``cold``) answered empty and without error
    is asked again, as a consumer would, until it is answered with records or an error."""
    deadline = time.monotonic() + timeout
    while True:
        found = _fetch_once(bootstrap, topic, offsets)
        if not any(found.get(p) == (0, {}) for p in cold) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _fetch_once(bootstrap: str, topic: str, offsets: dict[int, int]) -> dict[int, tuple[int, dict[int, Any]]]:
    T = FetchRequest.FetchTopic
    request = FetchRequest(version=12, replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                               version=12, topic=topic, partitions=[T.FetchPartition(
                                   version=12, partition=p, current_leader_epoch=-1, fetch_offset=o,
                                   last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
                                   for p, o in offsets.items()])],
                           forgotten_topics_data=[], rack_id="")
    response = _call(bootstrap, request, FetchResponse, 12)
    found: dict[int, tuple[int, dict[int, Any]]] = {}
    for t in response.responses:
        for p in t.partitions:
            records: dict[int, Any] = {}
            batches = MemoryRecords(bytes(p.records or b""))
            while (batch := batches.next_batch()) is not None:
                for record in batch:
                    if record.offset >= offsets[p.partition_index]:
                        records[record.offset] = record.value
            found[p.partition_index] = (p.error_code, records)
    assert set(found) == set(offsets), found
    return found


def raw_earliest(bootstrap: str, topic: str, partition: int, timestamp: int = -2) -> tuple[int, int]:
    """ListOffsets for one partition, EARLIEST or a timestamp: (error code, offset)."""
    T = ListOffsetsRequest.ListOffsetsTopic
    request = ListOffsetsRequest(version=2, replica_id=-1, isolation_level=0, topics=[T(
        version=2, name=topic, partitions=[T.ListOffsetsPartition(version=2, partition_index=partition,
                                                                  timestamp=timestamp)])])
    response = _call(bootstrap, request, ListOffsetsResponse, 2)
    [answer] = response.topics[0].partitions
    return answer.error_code, answer.offset


# -- consumers -------------------------------------------------------------------------------------


class Reader:
    """A confluent-kafka consumer on assigned partitions that records every record it is given and fails on
    a duplicate."""

    def __init__(self, bootstrap: str, topic: str, start: dict[int, int]) -> None:
        self.consumer = Consumer(consumer_config(bootstrap, **{"fetch.error.backoff.ms": 100}))
        self.consumer.assign([TopicPartition(topic, p, o) for p, o in start.items()])
        self.topic = topic
        self.records: dict[tuple[int, int], Any] = {}
        self.errors: list[Any] = []

    def poll_until(self, done: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            self.poll_once()

    def poll_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.poll_once()

    def poll_once(self, timeout: float = 0.2) -> None:
        for message in self.consumer.consume(1000, timeout):
            if message.error():
                self.errors.append(message.error())
                continue
            key = (message.partition(), message.offset())
            assert key not in self.records, f"duplicate record at {key}"
            self.records[key] = {"key": message.key(), "value": message.value(), "headers": message.headers(),
                                 "timestamp": message.timestamp()}

    def offsets(self, partition: int) -> list[int]:
        return sorted(o for p, o in self.records if p == partition)

    def position(self, partition: int) -> int:
        [tp] = self.consumer.position([TopicPartition(self.topic, partition)])
        return int(tp.offset)

    def close(self) -> None:
        self.consumer.close()


def history_topic(broker: BrokerProcess, catalog: Any, table: str, archived_below: int, log_start: int
                  ) -> tuple[str, dict[tuple[int, int], dict[str, Any]]]:
    topic = f"outage-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, PARTITIONS)
    originals = strip(produce(broker.bootstrap, topic))
    archive(catalog, table, originals, below=archived_below)
    for p in range(PARTITIONS):
        broker.delete_records(topic, p, log_start)
    return topic, originals


def hot_topic(broker: BrokerProcess, count: int = 20) -> tuple[str, dict[int, bytes]]:
    """A topic ksi has no history for: pure pass-through."""
    topic = f"hot-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, value=b"hot %d" % i, partition=0)
    assert producer.flush(30) == 0
    return topic, {i: b"hot %d" % i for i in range(count)}


def read_hot(bootstrap: str, topic: str, expected: dict[int, bytes]) -> dict[int, bytes]:
    reader = Reader(bootstrap, topic, {0: 0})
    try:
        reader.poll_until(lambda: len(reader.records) >= len(expected), 30)
    finally:
        reader.close()
    return {o: r["value"] for (_, o), r in reader.records.items()}


def served(answer: tuple[int, dict[int, Any]], originals: dict[tuple[int, int], Any], partition: int, start: int,
           end: int) -> bool:
    """A partition's Fetch answer is data, without error: the records from ``start`` on, as produced, ending
    at or before ``end`` (a fetch may stop anywhere after its first batch, but never reads past ``end``)."""
    error, records = answer
    offsets = sorted(records)
    value = (lambda v: v["value"]) if isinstance(next(iter(originals.values())), dict) else (lambda v: v)
    return (error == 0 and bool(offsets) and offsets == list(range(start, offsets[-1] + 1)) and offsets[-1] < end
            and all(records[o] == value(originals[(partition, o)]) for o in offsets))


# -- the catalog -----------------------------------------------------------------------------------


def test_catalog_outage_while_serving(noida: BrokerProcess, ksi_proxy: Any, postgres: PostgresServer,
                                      pg_catalog: Any) -> None:
    """PostgreSQL stops after ksi loaded the table.  What ksi's snapshot holds is still served; offsets only
    a newer snapshot holds get KAFKA_STORAGE_ERROR and the consumer stalls there (no skip) until the
    catalog is back; hot partitions and topics are served throughout."""
    catalog, props = pg_catalog
    namespace = props.pop("namespace")
    table = f"{namespace}.events"
    topic, originals = history_topic(noida, catalog, table, archived_below=120, log_start=100)
    hot, hot_values = hot_topic(noida)
    proxy = ksi_proxy(noida, catalog={"name": "pg", **props}, history=COLD_PATH,
                      topics=[{"name": topic, "table": table}])

    # ksi loads the table (snapshot 1: offsets 0..119) and serves from it.
    assert served(raw_fetch(proxy.bootstrap, topic, {0: 0})[0], originals, 0, 0, 120)

    # The archive commits offsets 120..179 (snapshot 2) while nobody reads the topic, then the catalog
    # goes down and retention moves the log start to 180: 120..179 are now only in snapshot 2, which ksi
    # cannot learn about until the catalog is back.
    archive(catalog, table, {k: v for k, v in originals.items() if k[1] >= 120}, below=180)
    catalog.engine.dispose()
    postgres.stop()
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, 180)

    during = raw_fetch(proxy.bootstrap, topic, {0: 50, 1: 190})
    assert served(during[0], originals, 0, 50, 120)  # from the snapshot ksi has: its files, no catalog
    assert served(during[1], originals, 1, 190, 200)  # hot
    assert raw_fetch(proxy.bootstrap, topic, {0: 150}) == {0: (KAFKA_STORAGE_ERROR, {})}  # retriable, no data
    assert raw_earliest(proxy.bootstrap, topic, 0) == (0, 0)
    # Timestamp lookups: offset 50 is in the snapshot ksi has, so it is the answer; the first offset at
    # offset 150's time is in snapshot 2 only, and the broker would answer 180: a retriable error instead.
    assert raw_earliest(proxy.bootstrap, topic, 0, BASE_TS + 50 * 1000) == (0, 50)
    assert raw_earliest(proxy.bootstrap, topic, 0, BASE_TS + 150 * 1000) == (KAFKA_STORAGE_ERROR, -1)
    assert read_hot(proxy.bootstrap, hot, hot_values) == hot_values

    reader = Reader(proxy.bootstrap, topic, {0: 0, 1: 0})
    stale = f"topic {topic} partition 0: offsets 120..179 are no longer in Kafka"
    try:
        reader.poll_until(lambda: len(reader.records) >= 2 * 120, 30)
        # ksi asks the catalog again within 2 s of the last time and says why it cannot serve 120..179;
        # meanwhile the consumer keeps asking for 120, and nothing past 119 may reach it.
        reader.poll_until(lambda: stale in proxy.log_text(), 30)
        reader.poll_for(1)
        for p in range(PARTITIONS):
            assert reader.offsets(p) == list(range(120)), p
            assert reader.position(p) == 120
        postgres.start()  # the catalog is back: ksi picks up snapshot 2 by itself
        reader.poll_until(lambda: len(reader.records) >= len(originals), 30)
    finally:
        reader.close()
    assert reader.records == originals  # every offset exactly once, as produced
    assert raw_earliest(proxy.bootstrap, topic, 0, BASE_TS + 150 * 1000) == (0, 150)
    log_text = proxy.log_text()
    assert f"topic {topic}: cannot refresh table {table} from the catalog" in log_text
    assert "and the lake cannot be asked for a newer one" in log_text.split(stale, 1)[1].splitlines()[0]
    assert f"topic {topic}: the lake answers again" in log_text


def test_catalog_down_when_ksi_starts(noida: BrokerProcess, ksi_proxy: Any, postgres: PostgresServer,
                                      pg_catalog: Any) -> None:
    """ksi starts while PostgreSQL is down: it cannot know what the lake holds, so offsets below the log
    start get KAFKA_STORAGE_ERROR (not the broker's OFFSET_OUT_OF_RANGE, which makes a consumer reset to
    the log start and skip the history), EARLIEST is not answered with the log start, and once the
    catalog is up ksi opens it by itself and the consumer reads every offset from 0 exactly once."""
    catalog, props = pg_catalog
    namespace = props.pop("namespace")
    table = f"{namespace}.events"
    topic, originals = history_topic(noida, catalog, table, archived_below=120, log_start=100)
    hot, hot_values = hot_topic(noida)
    catalog.engine.dispose()
    postgres.stop()
    proxy = ksi_proxy(noida, catalog={"name": "pg", **props}, history={**COLD_PATH, "catalog_retry_seconds": 1},
                      topics=[{"name": topic, "table": table}])

    during = raw_fetch(proxy.bootstrap, topic, {0: 0, 1: 150})
    assert during[0] == (KAFKA_STORAGE_ERROR, {})  # not OFFSET_OUT_OF_RANGE
    assert served(during[1], originals, 1, 150, 200)  # hot
    error, offset = raw_earliest(proxy.bootstrap, topic, 0)
    assert error == KAFKA_STORAGE_ERROR, (error, offset)  # the lake's first offset is unknown: not 100
    assert raw_earliest(proxy.bootstrap, topic, 0, BASE_TS + 50 * 1000) == (KAFKA_STORAGE_ERROR, -1)  # not 100
    assert read_hot(proxy.bootstrap, hot, hot_values) == hot_values

    # A group member with no committed offset starts from EARLIEST; one assigned offset 0 fetches it.
    reader = Reader(proxy.bootstrap, topic, {0: 0})
    group = Consumer(consumer_config(proxy.bootstrap))
    group.subscribe([topic])
    grouped: dict[tuple[int, int], Any] = {}

    def poll_group() -> None:
        for message in group.consume(1000, 0.1):
            if not message.error():
                key = (message.partition(), message.offset())
                assert key not in grouped, f"duplicate {key}"
                grouped[key] = message.value()

    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:  # both consumers at work while the catalog is down
            reader.poll_once(0.1)
            poll_group()
        assert reader.records == {} and grouped == {}, "nothing may be delivered before the lake is known"
        postgres.start()
        deadline = time.monotonic() + 30
        while (len(reader.records) < PER_PARTITION or len(grouped) < len(originals)) and time.monotonic() < deadline:
            reader.poll_once(0.1)
            poll_group()
    finally:
        reader.close()
        group.close()
    assert reader.records == {k: v for k, v in originals.items() if k[0] == 0}
    assert grouped == {k: v["value"] for k, v in originals.items()}
    log_text = proxy.log_text()
    assert "cannot open the Iceberg catalog 'pg'" in log_text
    assert f"topic {topic} partition 0: offset 0 is below the log start (100), and the lake cannot be asked" in log_text
    assert "the Iceberg catalog 'pg' is reachable again" in log_text
    assert log_text.count(f"topic {topic}: history from {table}") == 1


def test_catalog_that_does_not_answer(noida: BrokerProcess, ksi_proxy: Any, postgres: PostgresServer,
                                      pg_catalog: Any) -> None:
    """PostgreSQL hangs (stopped with SIGSTOP: connections are accepted, nothing is answered, and no
    connect_timeout in the URI bounds the wait).  ksi starts anyway and serves hot partitions of the
    history topic and other topics; cold offsets get KAFKA_STORAGE_ERROR; when PostgreSQL answers again
    everything is read.  A second hang while serving: hot partitions and the snapshot ksi holds are
    served without waiting on the catalog."""
    catalog, props = pg_catalog
    namespace = props.pop("namespace")
    table = f"{namespace}.events"
    topic, originals = history_topic(noida, catalog, table, archived_below=120, log_start=100)
    hot, hot_values = hot_topic(noida)
    catalog.engine.dispose()
    postgres.pause()
    proxy = ksi_proxy(noida, catalog={"name": "pg", **props}, history={**COLD_PATH, "catalog_retry_seconds": 1},
                      topics=[{"name": topic, "table": table}])  # listens although the catalog hangs

    during = raw_fetch(proxy.bootstrap, topic, {0: 0, 1: 150})
    assert during[0] == (KAFKA_STORAGE_ERROR, {})
    assert served(during[1], originals, 1, 150, 200)
    assert raw_earliest(proxy.bootstrap, topic, 0)[0] == KAFKA_STORAGE_ERROR
    assert read_hot(proxy.bootstrap, hot, hot_values) == hot_values
    reader = Reader(proxy.bootstrap, topic, {0: 0, 1: 0})
    try:
        reader.poll_for(2)
        assert reader.records == {}
        postgres.resume()
        reader.poll_until(lambda: len(reader.records) >= len(originals), 30)
        assert reader.records == originals

        # Hung again while serving: the ranges ksi knows and their files need no catalog.  Requests go on
        # being answered while ksi's refresh of the ranges waits on the catalog, until ksi says so.
        postgres.pause()
        hung = f"topic {topic}: the catalog 'pg' has not answered a refresh of table {table}"
        deadline = time.monotonic() + 30
        while hung not in proxy.log_text():
            assert time.monotonic() < deadline, proxy.log_tail()
            during = raw_fetch(proxy.bootstrap, topic, {0: 50, 1: 150})
            assert served(during[0], originals, 0, 50, 120) and served(during[1], originals, 1, 150, 200)
        during = raw_fetch(proxy.bootstrap, topic, {0: 50, 1: 150})
        assert served(during[0], originals, 0, 50, 120) and served(during[1], originals, 1, 150, 200)
        assert read_hot(proxy.bootstrap, hot, hot_values) == hot_values
        postgres.resume()
        deadline = time.monotonic() + 30
        while f"topic {topic}: the lake answers again" not in proxy.log_text():
            assert time.monotonic() < deadline, proxy.log_tail()
            raw_fetch(proxy.bootstrap, topic, {0: 50})
    finally:
        reader.close()
        if postgres.paused:
            postgres.resume()
    log_text = proxy.log_text()
    assert "the Iceberg catalog 'pg' has not answered for" in log_text


# -- the warehouse's files -------------------------------------------------------------------------


def test_data_files_unreadable_for_a_while(noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    """The table's data files cannot be read (an object store or a mount gone away; here the directory is
    moved aside): cold fetches get KAFKA_STORAGE_ERROR, the connection stays up, hot data flows, and once
    the files are back the consumer reads every offset exactly once."""
    lake, props = catalog
    table = "history.files"
    topic, originals = history_topic(noida, lake, table, archived_below=120, log_start=100)
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props}, history=COLD_PATH,
                      topics=[{"name": topic, "table": table}])
    assert served(raw_fetch(proxy.bootstrap, topic, {0: 0})[0], originals, 0, 0, 120)

    data = Path(props["warehouse"].removeprefix("file://")) / "history" / "files" / "data"
    assert data.is_dir()
    aside = data.with_name("data-away")
    data.rename(aside)
    reader = Reader(proxy.bootstrap, topic, {0: 0, 1: 150})
    try:
        during = raw_fetch(proxy.bootstrap, topic, {0: 10, 1: 150})
        assert during[0] == (KAFKA_STORAGE_ERROR, {})
        assert served(during[1], originals, 1, 150, 200)
        reader.poll_until(lambda: len(reader.records) >= 50, 30)
        reader.poll_for(2)
        assert reader.offsets(0) == [] and reader.offsets(1) == list(range(150, 200))
        aside.rename(data)
        reader.poll_until(lambda: len(reader.records) >= 250, 30)
    finally:
        reader.close()
    assert reader.records == {k: v for k, v in originals.items() if k[0] == 0 or k[1] >= 150}
    log_text = proxy.log_text()
    told = f"topic {topic} partition 0 offset (0|10): topic {topic} \\(table {table}\\): cannot read data file"
    assert re.search(told, log_text), proxy.log_tail()  # the consumer's fetch or the raw one, whichever was told first
    assert f"topic {topic} partition 0: cold reads succeed again" in log_text


# -- the Schema Registry ---------------------------------------------------------------------------


def test_registry_outage(noida: BrokerProcess, ksi_proxy: Any, catalog: Any, tmp_path: Path) -> None:
    """Typed Avro rows need their writer's schema from the registry.  Registry stopped: cold fetches get
    KAFKA_STORAGE_ERROR (never raw, empty or wrong bytes) while hot offsets, even in the same Fetch, are
    served; registry restarted on the same port and data: every value replays byte-identical."""
    lake, props = catalog
    port = free_port()
    registry: RegistryServer | None = start_registry("127.0.0.1", port, tmp_path / "registry")
    url = registry.url
    topic = f"avro-outage-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    try:
        noida.create_topic(topic, 2)
        sent = produce_orders(noida.bootstrap, registry, topic, 2, v2_from=50, raw_every=13)
        archive_typed(lake, table, registry, sent, below=90)
        for p in range(2):
            noida.delete_records(topic, p, 80)
        proxy = ksi_proxy(noida, catalog={"name": "lake", **props}, schema_registry={"url": url}, history=COLD_PATH,
                          topics=[{"name": topic, "table": table}])
        registry.stop()  # before ksi has asked it for any schema
        registry = None

        during = raw_fetch(proxy.bootstrap, topic, {0: 0, 1: 85})
        assert during[0] == (KAFKA_STORAGE_ERROR, {})
        assert served(during[1], sent, 1, 85, AVRO_PER_PARTITION)

        reader = Reader(proxy.bootstrap, topic, {0: 0, 1: 85})  # one Fetch: cold partition 0, hot partition 1
        try:
            reader.poll_until(lambda: len(reader.offsets(1)) >= AVRO_PER_PARTITION - 85, 30)
            reader.poll_for(2)
            assert reader.offsets(0) == [] and reader.position(0) in (0, -1001)  # nothing consumed
            registry = start_registry("127.0.0.1", port, tmp_path / "registry")
            reader.poll_until(lambda: len(reader.records) >= AVRO_PER_PARTITION * 2 - 85, 30)
        finally:
            reader.close()
        assert {k: r["value"] for k, r in reader.records.items()} == {
            k: v for k, v in sent.items() if k[0] == 0 or k[1] >= 85}
    finally:
        if registry is not None:
            registry.stop()
    log_text = proxy.log_text()
    assert f"topic {topic} partition 0 offset 0" in log_text and f"schema registry {url} is unreachable" in log_text
    assert f"topic {topic} partition 0: cold reads succeed again" in log_text
