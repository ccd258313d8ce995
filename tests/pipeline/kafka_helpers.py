"""Producing to and reading back from a real broker (or the proxy), for the pipeline's tests."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

# Recent timestamps: noida-db applies time retention (7 days) and would delete older records.
BASE_TS = (int(time.time()) - 3600) * 1000

Records = dict[tuple[int, int], dict[str, Any]]


def consumer_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "fetch.queue.backoff.ms": 10, "receive.message.max.bytes": 200_000_000,
            "session.timeout.ms": 6000, **extra}


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int, first: int = 0,
            values: Any = None, small_batches: bool = True) -> None:
    """Records with keys (some null), values (some null, varied sizes), headers (some absent), timestamps."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 0 if small_batches else 20,
                              "queue.buffering.max.messages": 1_000_000}
    if small_batches:  # noida's DeleteRecords drops whole batches: keep them small
        config["batch.num.messages"] = 10
    producer = Producer(config)
    for p in range(partitions):
        for i in range(first, first + per_partition):
            key = None if i % 17 == 0 else f"key-{p}-{i}".encode()
            if values is not None:
                value = values(p, i)
            else:
                value = None if i % 29 == 5 else f"value {p}/{i} ".encode() * (1 + i % 5)
            headers = [("h", f"{i}".encode()), ("src", b"test")] if i % 3 else None
            while True:
                try:
                    producer.produce(topic, key=key, value=value, headers=headers, partition=p,
                                     timestamp=BASE_TS + i * 10)
                    break
                except BufferError:
                    producer.poll(0.1)
            if small_batches and i % 10 == 9:
                producer.poll(0)
    assert producer.flush(60) == 0


def read_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 60, **extra: Any) -> Records:
    """Every record from offset 0 of each partition; asserts no offset arrives twice."""
    consumer = Consumer(consumer_config(bootstrap, **extra))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: Records = {}
    deadline = time.monotonic() + timeout
    try:
        while len(records) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            key = (message.partition(), message.offset())
            assert key not in records, f"duplicate record at {key}"
            records[key] = {"key": message.key(), "value": message.value(), "headers": message.headers(),
                            "timestamp": message.timestamp()}
    finally:
        consumer.close()
    return records


def table_offsets(table: Any) -> Counter[tuple[int, int]]:
    """(partition, offset) -> how many rows of the table hold it."""
    rows = table.scan(selected_fields=("kafka_partition", "kafka_offset")).to_arrow()
    return Counter(zip(rows["kafka_partition"].to_pylist(), rows["kafka_offset"].to_pylist(), strict=True))
