"""Avro values through the lake: produced with confluent-kafka's Avro serializer against the embedded
Schema Registry, kept in the table as typed columns, and replayed by ksi with Schema Registry framing,
byte for byte (ksi layout, schema evolving mid-topic) or with a registered schema that fits the table
(foreign layouts, which keep no schema id)."""

from __future__ import annotations

import json
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StructType, TimestamptzType

from ksi.avro import arrow_type, decode_values, encode_values, iceberg_struct, parse_schema
from ksi.brokers import BrokerProcess
from ksi.history.ksi_table import arrow_schema, partition_spec, raw_value_schema, sort_order, value_columns
from ksi.registry import RegistryServer, start_registry
from test_history import BASE_TS, consumer_config

ORDER_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "int"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": "float"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "note", "type": ["null", "string"], "default": None},
]}
# v2: id widened to long, amount to double, a field added with a default (BACKWARD compatible).
ORDER_V2 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "priority", "type": "int", "default": 0},
]}
PER_PARTITION = 120


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryServer]:
    server = start_registry("127.0.0.1", 0, tmp_path / "registry")
    try:
        yield server
    finally:
        server.stop()


def order(i: int, v2: bool) -> dict[str, Any]:
    value: dict[str, Any] = {"id": i, "customer": f"c{i % 7}", "amount": i * 1.25, "tags": ["a"] * (i % 3),
                             "note": None if i % 4 else f"note {i}"}
    if v2:
        value["priority"] = i % 5
    return value


def produce_orders(bootstrap: str, registry: RegistryServer, topic: str, partitions: int, v2_from: int,
                   raw_every: int = 0) -> dict[tuple[int, int], bytes | None]:
    """Avro values (v1 then v2), and, every ``raw_every``-th record, a plain-text value or a tombstone."""
    client = SchemaRegistryClient({"url": registry.url})
    serialize = {v: AvroSerializer(client, json.dumps(s)) for v, s in ((1, ORDER_V1), (2, ORDER_V2))}
    ctx = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 10})
    sent: dict[tuple[int, int], bytes | None] = {}
    for p in range(partitions):
        for i in range(PER_PARTITION):
            value: bytes | None
            if raw_every and i % raw_every == raw_every - 1:
                value = None if i % 2 else f"plain text {i}".encode()
            else:
                value = serialize[2 if i >= v2_from else 1](order(i, i >= v2_from), ctx)
            producer.produce(topic, key=f"k{i}".encode(), value=value, partition=p, timestamp=BASE_TS + i * 1000)
            if i % 10 == 9:
                producer.flush(10)
    assert producer.flush(30) == 0
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    deadline = time.monotonic() + 30
    while len(sent) < partitions * PER_PARTITION and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            sent[(message.partition(), message.offset())] = message.value()
    consumer.close()
    assert len(sent) == partitions * PER_PARTITION
    return sent


def archive_typed(catalog: Any, name: str, registry: RegistryServer, records: dict[tuple[int, int], bytes | None],
                  below: int) -> None:
    """What `ksi archive` does with Avro values: typed columns + the writer's schema id, raw bytes otherwise."""
    client = SchemaRegistryClient({"url": registry.url})
    rows = sorted((k, v) for k, v in records.items() if k[1] < below)
    ids = sorted({struct.unpack(">I", v[1:5])[0] for _, v in rows if v and v[0] == 0})
    schemas = {i: parse_schema(client.get_schema(i).schema_str) for i in ids}
    table = catalog.create_table(name, schema=raw_value_schema(), partition_spec=partition_spec(),
                                 sort_order=sort_order())
    for i in ids:  # one schema change per version: union_by_name compares against the committed schema
        with table.update_schema() as update:
            update.union_by_name(value_columns(iceberg_struct(schemas[i])))
    table = catalog.load_table(name)
    target = table.schema().as_arrow()
    value_fields = [f for f in target if f.name not in arrow_schema().names]
    base = {
        "kafka_partition": pa.array([k[0] for k, _ in rows], pa.int32()),
        "kafka_offset": pa.array([k[1] for k, _ in rows], pa.int64()),
        "kafka_timestamp": pa.array([(BASE_TS + k[1] * 1000) * 1000 for k, _ in rows], pa.timestamp("us", tz="UTC")),
        "kafka_timestamp_type": pa.array([0] * len(rows), pa.int32()),
        "kafka_key": pa.array([f"k{k[1]}".encode() for k, _ in rows], pa.binary()),
        "kafka_headers": pa.nulls(len(rows), arrow_schema().field("kafka_headers").type),
    }
    typed: dict[str, list[Any]] = {f.name: [None] * len(rows) for f in value_fields}
    raw: list[bytes | None] = [v for _, v in rows]
    schema_ids: list[int | None] = [None] * len(rows)
    for schema_id, schema in schemas.items():
        at = [n for n, (_, v) in enumerate(rows) if v and v[0] == 0 and struct.unpack(">I", v[1:5])[0] == schema_id]
        decoded = decode_values([rows[n][1][5:] for n in at], schema)  # type: ignore[index]
        assert encode_values(decoded, schema).to_pylist() == [rows[n][1][5:] for n in at]  # type: ignore[index]
        assert decoded.type == arrow_type(schema)
        for column in decoded.type:
            values = decoded.field(column.name).to_pylist()
            for n, value in zip(at, values, strict=True):
                typed[column.name][n] = value
        for n in at:
            raw[n], schema_ids[n] = None, schema_id
    columns = dict(base, kafka_value=pa.array(raw, pa.binary()), kafka_value_schema_id=pa.array(schema_ids, pa.int32()))
    for f in value_fields:
        columns[f.name] = pa.array(typed[f.name], f.type)
    table.append(pa.table(columns, schema=target))


def replay(bootstrap: str, topic: str, partitions: int, count: int) -> dict[tuple[int, int], bytes | None]:
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[tuple[int, int], bytes | None] = {}
    errors = []
    deadline = time.monotonic() + 40
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                errors.append(message.error())
                continue
            got[(message.partition(), message.offset())] = message.value()
    finally:
        consumer.close()
    assert not errors, errors
    return got


def test_avro_values_replay_byte_for_byte_across_schema_versions(
        noida: BrokerProcess, ksi_proxy: Any, catalog: Any, registry: RegistryServer) -> None:
    lake, props = catalog
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, 2)
    sent = produce_orders(noida.bootstrap, registry, topic, 2, v2_from=50, raw_every=13)
    archive_typed(lake, f"history.{topic.replace('-', '_')}", registry, sent, below=90)
    for p in range(2):
        noida.delete_records(topic, p, 80)
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props}, schema_registry={"url": registry.url},
                      topics=[{"name": topic, "table": f"history.{topic.replace('-', '_')}"}])
    got = replay(proxy.bootstrap, topic, 2, len(sent))
    assert got == sent  # v1 and v2 Avro bodies, plain values and tombstones, all as produced

    # And a consumer with the Avro deserializer reads the records as the producer wrote them.
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry.url}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    assert deserialize(got[(0, 3)], ctx) == order(3, False)
    assert deserialize(got[(1, 60)], ctx) == order(60, True)


def test_foreign_layout_typed_values_use_a_registered_schema_that_fits(
        noida: BrokerProcess, ksi_proxy: Any, catalog: Any, registry: RegistryServer) -> None:
    """A redpanda-layout table (typed top-level columns, no schema id) written from v1 values: ksi finds
    the registered v1 fits the columns and replays byte for byte.  A streambased table for a topic with no
    subject gets a schema derived from its columns, registered, and values a deserializer can read."""
    lake, props = catalog
    topic = f"rp-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, 1)
    sent = produce_orders(noida.bootstrap, registry, topic, 1, v2_from=PER_PARTITION)
    v1 = parse_schema(ORDER_V1)
    rows = sorted(sent.items())[:60]
    decoded = decode_values([v[5:] for _, v in rows], v1)  # type: ignore[index]
    redpanda = pa.StructArray.from_arrays([
        pa.array([p for (p, _), _ in rows], pa.int32()),
        pa.array([o for (_, o), _ in rows], pa.int64()),
        pa.array([(BASE_TS + o * 1000) * 1000 for (_, o), _ in rows], pa.timestamp("us", tz="UTC")),
        pa.array([f"k{o}".encode() for (_, o), _ in rows], pa.binary()),
    ], names=["partition", "offset", "timestamp", "key"])
    data = pa.Table.from_arrays([redpanda] + [decoded.field(i) for i in range(decoded.type.num_fields)],
                                names=["redpanda"] + [f.name for f in decoded.type])
    rp_table = lake.create_table(f"history.{topic.replace('-', '_')}", schema=data.schema)
    rp_table.append(data)
    noida.delete_records(topic, 0, 50)

    sb_topic = f"sb-{uuid.uuid4().hex[:8]}"
    sb_schema = Schema(NestedField(1, "kafka_partition", IntegerType(), required=False),
                       NestedField(2, "kafka_offset", LongType(), required=False),
                       NestedField(3, "kafka_timestamp", TimestamptzType(), required=False),
                       NestedField(4, "reading", StructType(NestedField(5, "sensor", IntegerType(), required=False),
                                                            NestedField(6, "value", LongType(), required=False)),
                                   required=False))
    sb_table = lake.create_table(f"history.{sb_topic.replace('-', '_')}", schema=sb_schema)
    sb_table.append(pa.table({
        "kafka_partition": pa.array([0] * 10, pa.int32()), "kafka_offset": pa.array(range(10), pa.int64()),
        "kafka_timestamp": pa.array([BASE_TS * 1000] * 10, pa.timestamp("us", tz="UTC")),
        "reading": pa.array([{"sensor": i, "value": i * i} for i in range(10)],
                            pa.struct([("sensor", pa.int32()), ("value", pa.int64())])),
    }, schema=sb_table.schema().as_arrow()))

    proxy = ksi_proxy(noida, catalog={"name": "lake", **props}, schema_registry={"url": registry.url}, topics=[
        {"name": topic, "table": f"history.{topic.replace('-', '_')}", "layout": "redpanda"},
        {"name": sb_topic, "table": f"history.{sb_topic.replace('-', '_')}", "layout": "streambased",
         "lake_only_readers": ["*"]},
    ])
    assert replay(proxy.bootstrap, topic, 1, len(sent)) == sent

    got = replay(proxy.bootstrap, sb_topic, 1, 10)  # lake-only: the topic does not exist in Kafka
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry.url}))
    ctx = SerializationContext(sb_topic, MessageField.VALUE)
    assert [deserialize(got[(0, i)], ctx) for i in range(10)] == [
        {"reading": {"sensor": i, "value": i * i}} for i in range(10)]
    assert "registered a schema derived from the table's columns" in proxy.log_text()
