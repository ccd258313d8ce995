"""The lake side of the soak: a ksi-layout table, and the archiver that copies the broker's offsets into it
and moves the broker's log start (what ``ksi archive`` and retention do)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ksi.brokers import BrokerProcess

from .consumers import RECEIVE_MESSAGE_MAX_BYTES

__all__ = ["Archiver", "append_to_lake", "archive_range", "create_table", "read_direct", "watermarks"]

log = logging.getLogger("soak")


def create_table(catalog: Any, name: str) -> Any:
    from ksi.history.ksi_table import TABLE_PROPERTIES, partition_spec, raw_value_schema, sort_order

    # the soak appends with PyIceberg's own writer, which implements the row-group limit in rows, not the
    # byte size Spark's writer takes (it would warn on every append that it is not implemented)
    properties = {k: v for k, v in TABLE_PROPERTIES.items() if k != "write.parquet.row-group-size-bytes"}
    return catalog.create_table(name, schema=raw_value_schema(), partition_spec=partition_spec(),
                                sort_order=sort_order(), properties=properties)


def read_direct(bootstrap: str, topic: str, partition: int, start: int, stop: int,
                timeout: float = 60) -> list[Any]:
    """Records ``[start, stop)`` of one partition, straight from the broker (what ``ksi archive`` reads)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"archiver-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES,
                         "fetch.queue.backoff.ms": 10, "logger": logging.getLogger("soak.librdkafka")})
    out: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + timeout
        expected = start
        while expected < stop:
            if time.monotonic() > deadline:
                raise TimeoutError(f"archiver: read {topic}/{partition} up to {expected} of [{start}, {stop})")
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    continue
                offset = m.offset()
                if offset != expected:
                    raise AssertionError(f"archiver: {topic}/{partition} gave offset {offset}, expected {expected}")
                out.append(m)
                expected = offset + 1
                if expected >= stop:
                    break
    finally:
        consumer.close()
    return out


def append_to_lake(table: Any, messages: list[Any]) -> None:
    """Append confluent-kafka messages to a ksi-layout table."""
    import pyarrow as pa

    from ksi.history.ksi_table import arrow_schema

    schema = arrow_schema()
    data = pa.table({
        "kafka_partition": pa.array([m.partition() for m in messages], pa.int32()),
        "kafka_offset": pa.array([m.offset() for m in messages], pa.int64()),
        "kafka_timestamp": pa.array([m.timestamp()[1] * 1000 for m in messages], pa.timestamp("us", tz="UTC")),
        "kafka_timestamp_type": pa.array([m.timestamp()[0] - 1 for m in messages], pa.int32()),
        "kafka_key": pa.array([m.key() for m in messages], pa.binary()),
        "kafka_headers": pa.array([[{"key": k, "value": v} for k, v in (m.headers() or [])] for m in messages],
                                  schema.field("kafka_headers").type),
        "kafka_value": pa.array([m.value() for m in messages], pa.binary()),
        "kafka_value_schema_id": pa.nulls(len(messages), pa.int32()),
    }, schema=schema)
    table.append(data)


def archive_range(table: Any, bootstrap: str, topic: str, partition: int, start: int, stop: int) -> int:
    """Copy ``[start, stop)`` of a partition from the broker into the table; the number of rows."""
    if stop <= start:
        return 0
    messages = read_direct(bootstrap, topic, partition, start, stop)
    append_to_lake(table, messages)
    return len(messages)


def watermarks(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int]]:
    """(log start, high watermark) per partition, straight from the broker."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-watermarks",
                         "logger": logging.getLogger("soak.librdkafka")})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(partitions)]
    finally:
        consumer.close()


@dataclass
class Archiver:
    table: Any
    broker: BrokerProcess
    topic: str
    partitions: int
    hot_keep: int
    can_delete: bool
    lake_next: list[int] = field(default_factory=list)
    log_start: list[int] = field(default_factory=list)
    rounds: int = 0
    rows: int = 0
    failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.lake_next = [0] * self.partitions
        self.log_start = [0] * self.partitions

    def round(self) -> None:
        """Archive each partition up to ``hot_keep`` below its end, then delete what the lake holds from
        the broker, keeping 100 offsets of overlap (DeleteRecords drops whole batches, so the log start
        may land a little past the offset asked for, but never past the lake's end)."""
        with self.lock:
            try:
                marks = watermarks(self.broker.bootstrap, self.topic, self.partitions)
                for p, (low, high) in enumerate(marks):
                    stop = high - self.hot_keep
                    if stop <= self.lake_next[p]:
                        continue
                    self.rows += archive_range(self.table, self.broker.bootstrap, self.topic, p, self.lake_next[p],
                                               stop)
                    self.lake_next[p] = stop
                    delete_below = stop - 100
                    if self.can_delete and delete_below > low:
                        self.broker.delete_records(self.topic, p, delete_below)
                        self.log_start[p] = delete_below
                self.rounds += 1
            except Exception as exc:  # noqa: BLE001 - the broker may be down (a fault): try again next round
                self.failures += 1
                log.warning("archiver round failed: %s", exc)
