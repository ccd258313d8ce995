"""One topic across all time, on a real broker whose log start really moves (noida-db DeleteRecords)
and a real Iceberg catalog (SqlCatalog on SQLite): offsets below the log start come from the lake."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError

from ksi.brokers import BrokerProcess
from ksi.history.ksi_table import arrow_schema, partition_spec, raw_value_schema, sort_order

PARTITIONS = 2
PER_PARTITION = 200
# Recent timestamps: noida-db applies time retention (7 days), which would delete older records.
BASE_TS = (int(time.time()) - 3600) * 1000


def consumer_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "fetch.queue.backoff.ms": 10, "receive.message.max.bytes": 200_000_000,
            "session.timeout.ms": 6000, **extra}


def produce(bootstrap: str, topic: str) -> dict[tuple[int, int], dict[str, Any]]:
    # Small batches: noida-db's DeleteRecords drops whole batches, so a log start inside one big batch
    # would move past the offset asked for.
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 10})
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            key = None if i % 17 == 0 else f"key-{p}-{i}".encode()
            value = None if i % 29 == 5 else f"value {p}/{i} ".encode() * (1 + i % 5)
            headers = [("h", f"{i}".encode()), ("src", b"test")] if i % 3 else None
            producer.produce(topic, key=key, value=value, headers=headers, partition=p, timestamp=BASE_TS + i * 1000)
            if i % 10 == 9:
                producer.flush(10)
    assert producer.flush(30) == 0
    return read_all(bootstrap, topic, PARTITIONS * PER_PARTITION)


def read_all(bootstrap: str, topic: str, expected: int, timeout: float = 60, **extra: Any
             ) -> dict[tuple[int, int], dict[str, Any]]:
    consumer = Consumer(consumer_config(bootstrap, **extra))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    records: dict[tuple[int, int], dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    errors = []
    try:
        while len(records) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                errors.append(message.error())
                if len(errors) > 20:
                    break
                continue
            key = (message.partition(), message.offset())
            assert key not in records, f"duplicate record at {key}"
            records[key] = {"key": message.key(), "value": message.value(), "headers": message.headers(),
                            "timestamp": message.timestamp()}
    finally:
        consumer.close()
    records["errors"] = errors  # type: ignore[index]
    return records


def archive(catalog: SqlCatalog, table_name: str, records: dict[tuple[int, int], dict[str, Any]],
            below: int) -> None:
    """What `ksi archive` will do: write the records with offset < below in the ksi layout."""
    rows = sorted((k, v) for k, v in records.items() if isinstance(k, tuple) and k[1] < below)
    data = pa.table({
        "kafka_partition": pa.array([k[0] for k, _ in rows], pa.int32()),
        "kafka_offset": pa.array([k[1] for k, _ in rows], pa.int64()),
        "kafka_timestamp": pa.array([v["timestamp"][1] * 1000 for _, v in rows], pa.timestamp("us", tz="UTC")),
        "kafka_timestamp_type": pa.array([v["timestamp"][0] - 1 for _, v in rows], pa.int32()),
        "kafka_key": pa.array([v["key"] for _, v in rows], pa.binary()),
        "kafka_headers": pa.array([[{"key": hk, "value": hv} for hk, hv in (v["headers"] or [])] for _, v in rows],
                                  arrow_schema().field("kafka_headers").type),
        "kafka_value": pa.array([v["value"] for _, v in rows], pa.binary()),
        "kafka_value_schema_id": pa.nulls(len(rows), pa.int32()),
    }, schema=arrow_schema())
    try:
        table = catalog.load_table(table_name)
    except NoSuchTableError:
        table = catalog.create_table(table_name, schema=raw_value_schema(), partition_spec=partition_spec(),
                                     sort_order=sort_order())
    table.append(data)


def strip(records: dict[Any, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    return {k: v for k, v in records.items() if isinstance(k, tuple)}


def test_consumer_replays_lake_then_log_byte_for_byte(noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    lake, props = catalog
    topic = f"history-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, PARTITIONS)
    originals = strip(produce(noida.bootstrap, topic))
    assert len(originals) == PARTITIONS * PER_PARTITION
    archive(lake, f"history.{topic.replace('-', '_')}", originals, below=120)
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, 100)  # the log now starts at 100; the lake holds 0..119

    proxy = ksi_proxy(noida, catalog={"name": "lake", **props},
                      topics=[{"name": topic, "table": f"history.{topic.replace('-', '_')}", "layout": "ksi"}])
    direct = strip(read_all(noida.bootstrap, topic, PARTITIONS * 100, timeout=10))
    assert min(o for _, o in direct) == 100  # Kafka alone has lost offsets 0..99

    replayed = read_all(proxy.bootstrap, topic, PARTITIONS * PER_PARTITION)
    assert replayed.pop("errors") == []
    assert replayed == originals  # every offset once, keys, values, headers and timestamps as produced

    consumer = Consumer(consumer_config(proxy.bootstrap))
    try:
        for p in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            assert (low, high) == (0, PER_PARTITION)
        wanted = [TopicPartition(topic, p, BASE_TS + 42 * 1000 - 1) for p in range(PARTITIONS)]
        found = consumer.offsets_for_times(wanted, timeout=10)
        assert [tp.offset for tp in found] == [42] * PARTITIONS  # answered from the lake, below the log start
    finally:
        consumer.close()
    metrics = __import__("urllib.request").request.urlopen(proxy.metrics_url).read().decode()
    assert f'ksi_cold_fetches_total{{topic="{topic}"}}' in metrics


def test_gap_between_lake_and_log_is_reported_not_skipped(noida: BrokerProcess, ksi_proxy: Any,
                                                          catalog: Any) -> None:
    lake, props = catalog
    topic = f"gap-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, PARTITIONS)
    originals = strip(produce(noida.bootstrap, topic))
    archive(lake, f"history.{topic.replace('-', '_')}", originals, below=50)
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, 100)  # offsets 50..99 are nowhere
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props},
                      topics=[{"name": topic, "table": f"history.{topic.replace('-', '_')}", "layout": "ksi"}])
    replayed = read_all(proxy.bootstrap, topic, PARTITIONS * PER_PARTITION, timeout=8)
    replayed.pop("errors")  # librdkafka retries KAFKA_STORAGE_ERROR quietly; the consumer simply stalls
    offsets = sorted(replayed)
    assert all(o < 50 for _, o in offsets), "no record past the gap may be delivered as if nothing was lost"
    assert len(offsets) == PARTITIONS * 50
    assert "are in neither the lake nor Kafka" in proxy.log_text()
    metrics = __import__("urllib.request").request.urlopen(proxy.metrics_url).read().decode()
    assert f'ksi_lake_gaps_total{{topic="{topic}"}}' in metrics


def test_status_shows_lake_log_and_gap(noida: BrokerProcess, catalog: Any, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    lake, props = catalog
    topic = f"status-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, PARTITIONS)
    originals = strip(produce(noida.bootstrap, topic))
    archive(lake, f"history.{topic.replace('-', '_')}", originals, below=50)
    noida.delete_records(topic, 0, 100)  # partition 0: 50..99 lost; partition 1: lake and log overlap
    config = tmp_path / "status.toml"
    config.write_text(f"""
[upstream]
bootstrap_servers = "{noida.bootstrap}"
[catalog]
name = "lake"
uri = "{props['uri']}"
warehouse = "{props['warehouse']}"
[[topics]]
name = "{topic}"
table = "history.{topic.replace('-', '_')}"
""")
    result = subprocess.run([sys.executable, "-m", "ksi", "status", "--config", str(config), "--json"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result.stderr  # a gap makes status fail
    rows = {r["partition"]: r for r in json.loads(result.stdout)}
    assert (rows[0]["lake_first"], rows[0]["lake_last"], rows[0]["log_start_offset"]) == (0, 49, 100)
    assert rows[0]["gap"] == [50, 99] and rows[1]["gap"] is None
    assert rows[1]["high_watermark"] == PER_PARTITION and rows[0]["snapshot_id"] is not None
    text = subprocess.run([sys.executable, "-m", "ksi", "status", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, check=False).stdout
    assert "LOST 50..99" in text


def test_missing_table_and_wrong_layout_are_named_and_the_topic_stays_readable(
        noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    lake, props = catalog
    topic = f"bad-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, PARTITIONS)
    originals = strip(produce(noida.bootstrap, topic))
    archive(lake, "history.wrong_layout", originals, below=10)  # a ksi table, configured as redpanda below
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props}, topics=[
        {"name": topic, "table": "history.does_not_exist", "layout": "ksi"},
        {"name": "other", "table": "history.wrong_layout", "layout": "redpanda"},
    ])
    replayed = strip(read_all(proxy.bootstrap, topic, PARTITIONS * PER_PARTITION))
    assert replayed == originals  # served from Kafka as if ksi had no lake for it
    log_text = proxy.log_text()
    assert f"topic {topic}: table history.does_not_exist does not exist in the catalog" in log_text
    assert "topic other: table history.wrong_layout does not match layout 'redpanda'" in log_text


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4", "snappy", "gzip"])
def test_prefer_lake_serves_what_the_lake_holds_on_a_broker_without_retention(
        tansu: BrokerProcess, ksi_proxy: Any, catalog: Any, compression: str) -> None:
    lake, props = catalog
    topic = f"prefer-{uuid.uuid4().hex[:8]}"
    tansu.create_topic(topic, PARTITIONS)
    originals = strip(produce(tansu.bootstrap, topic))
    archive(lake, f"history.{topic.replace('-', '_')}", originals, below=120)
    proxy = ksi_proxy(tansu, catalog={"name": "lake", **props},
                      topics=[{"name": topic, "table": f"history.{topic.replace('-', '_')}", "layout": "ksi",
                               "prefer_lake": True, "compression": compression}])
    replayed = read_all(proxy.bootstrap, topic, PARTITIONS * PER_PARTITION)
    assert replayed.pop("errors") == []
    assert replayed == originals
    metrics = __import__("urllib.request").request.urlopen(proxy.metrics_url).read().decode()
    served = [line for line in metrics.splitlines() if line.startswith(f'ksi_cold_fetches_total{{topic="{topic}"}}')]
    assert served and float(served[0].split()[-1]) >= 1
