"""Reading Kafka offset ranges inside Spark tasks (``mapInArrow``): one consumer per task.

The driver hands each task one row ``(partition, start, stop)``; the task assigns a confluent-kafka
consumer to ``partition`` at ``start`` and consumes until it reaches ``stop`` (exclusive), emitting Arrow
record batches in the table's layout.  Offsets may have gaps (transaction markers, aborted records that a
``read_committed`` consumer never sees, compacted keys); a range ends when a record at or past ``stop``
arrives, when the consumer's position passes ``stop``, or at end-of-partition at or past ``stop``.
A task that receives nothing for ``poll_timeout_seconds`` fails (Spark retries it): it never ends early.

Values are decoded into typed columns by :class:`ksi.pipeline.values.ValueDecoder` when the topic has
Avro schemas, else kept as raw bytes.  This module runs on executors: it imports only pyarrow,
confluent-kafka and the pipeline's value decoding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

__all__ = ["ReadSpec", "RangeReadError", "read_ranges", "HEADER_TYPE", "metadata_arrow_fields"]

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
BATCH_ROWS = 10_000
TIMESTAMP_NOT_AVAILABLE = 0


class RangeReadError(RuntimeError):
    """A task could not read its whole offset range."""


def metadata_arrow_fields() -> list[pa.Field]:
    """The ksi layout's Kafka columns, in table order."""
    return [
        pa.field("kafka_partition", pa.int32(), nullable=False),
        pa.field("kafka_offset", pa.int64(), nullable=False),
        pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("kafka_timestamp_type", pa.int32()),
        pa.field("kafka_key", pa.binary()),
        pa.field("kafka_headers", HEADER_TYPE),
        pa.field("kafka_value", pa.binary()),
        pa.field("kafka_value_schema_id", pa.int32()),
    ]


@dataclass(frozen=True)
class ReadSpec:
    """Everything a task needs; pickled to the executors."""

    bootstrap: str
    topic: str
    output_schema: pa.Schema
    consumer: dict[str, str] = field(default_factory=dict)
    poll_timeout_seconds: float = 60.0
    decoder: Any = None  # ksi.pipeline.values.ValueDecoder, or None for raw bytes


def _consumer_config(spec: ReadSpec) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": spec.bootstrap,
        "group.id": "ksi-archive",        # required by the client; nothing is committed to the group
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "auto.offset.reset": "error",     # a range start that is gone is an error, never a silent skip
        "fetch.queue.backoff.ms": 10,
        # some brokers (noida-db) ignore fetch size limits and answer with very large responses
        "receive.message.max.bytes": 1_000_000_000,
        "check.crcs": False,
        "log_level": 3,
    }
    config.update(spec.consumer)
    return config


class _Columns:
    """Column builders for one output batch."""

    def __init__(self) -> None:
        self.partition: list[int] = []
        self.offset: list[int] = []
        self.timestamp: list[int | None] = []
        self.timestamp_type: list[int | None] = []
        self.key: list[bytes | None] = []
        self.header_offsets: list[int] = [0]
        self.header_keys: list[str] = []
        self.header_values: list[bytes | None] = []
        self.value: list[bytes | None] = []
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.offset)

    def add(self, message: Any) -> None:
        self.partition.append(message.partition())
        self.offset.append(message.offset())
        ts_type, ts = message.timestamp()
        if ts_type == TIMESTAMP_NOT_AVAILABLE:
            self.timestamp.append(None)
            self.timestamp_type.append(None)
        else:
            self.timestamp.append(ts * 1000)
            self.timestamp_type.append(ts_type - 1)  # librdkafka: 1 CreateTime, 2 LogAppendTime
        key, value = message.key(), message.value()
        self.key.append(key)
        self.value.append(value)
        self.bytes += (len(key) if key else 0) + (len(value) if value else 0)
        headers = message.headers()
        if headers:
            for hk, hv in headers:
                self.header_keys.append(hk)
                self.header_values.append(hv)
                self.bytes += len(hk) + (len(hv) if hv else 0)
        self.header_offsets.append(len(self.header_keys))

    def metadata_arrays(self) -> dict[str, pa.Array]:
        headers = pa.ListArray.from_arrays(
            pa.array(self.header_offsets, pa.int32()),
            pa.StructArray.from_arrays([pa.array(self.header_keys, pa.string()),
                                        pa.array(self.header_values, pa.binary())], names=["key", "value"]))
        return {
            "kafka_partition": pa.array(self.partition, pa.int32()),
            "kafka_offset": pa.array(self.offset, pa.int64()),
            "kafka_timestamp": pa.array(self.timestamp, pa.timestamp("us", tz="UTC")),
            "kafka_timestamp_type": pa.array(self.timestamp_type, pa.int32()),
            "kafka_key": pa.array(self.key, pa.binary()),
            "kafka_headers": headers.cast(HEADER_TYPE),
            "kafka_value": pa.array(self.value, pa.binary()),
        }


def _to_batch(columns: _Columns, spec: ReadSpec) -> pa.RecordBatch:
    arrays = columns.metadata_arrays()
    if spec.decoder is not None:
        arrays.update(spec.decoder.decode(arrays["kafka_value"], arrays["kafka_partition"], arrays["kafka_offset"]))
    else:
        arrays["kafka_value_schema_id"] = pa.nulls(len(columns), pa.int32())
    n = len(columns)
    out = []
    for f in spec.output_schema:
        array = arrays.get(f.name)
        out.append(pa.nulls(n, f.type) if array is None else array)
    return pa.RecordBatch.from_arrays(out, schema=spec.output_schema)


def read_range(spec: ReadSpec, partition: int, start: int, stop: int,
               counter: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    """Batches holding every record of ``topic``/``partition`` in ``[start, stop)``.

    ``counter[0]`` is increased by the bytes of the keys, values and headers read."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    if start >= stop:
        return
    consumer = Consumer(_consumer_config(spec))
    try:
        consumer.assign([TopicPartition(spec.topic, partition, start)])
        columns = _Columns()
        last_progress = time.monotonic()
        done = False
        while not done:
            messages = consumer.consume(num_messages=BATCH_ROWS, timeout=1.0)
            if messages:
                last_progress = time.monotonic()
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if message.offset() >= stop:
                            done = True
                        continue
                    raise RangeReadError(f"{spec.topic}/{partition} [{start}, {stop}): {error}")
                if message.offset() >= stop:
                    done = True
                    continue
                if done:
                    continue
                columns.add(message)
                if len(columns) >= BATCH_ROWS:
                    if counter is not None:
                        counter[0] += columns.bytes
                    yield _to_batch(columns, spec)
                    columns = _Columns()
            if not done:
                position = consumer.position([TopicPartition(spec.topic, partition)])[0].offset
                if position >= stop:
                    done = True
                elif time.monotonic() - last_progress > spec.poll_timeout_seconds:
                    raise RangeReadError(f"{spec.topic}/{partition}: no record for {spec.poll_timeout_seconds:.0f} s "
                                         f"at offset {max(position, start)} while reading [{start}, {stop}); "
                                         "is the broker reachable from the executors?")
        if len(columns):
            if counter is not None:
                counter[0] += columns.bytes
            yield _to_batch(columns, spec)
    finally:
        consumer.close()


def read_ranges(spec: ReadSpec, bytes_read: Any = None) -> Callable[[Iterator[pa.RecordBatch]],
                                                                   Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: each input row ``(partition, start, stop)`` becomes that range's records.

    ``bytes_read`` (a Spark accumulator) sums the bytes of the Kafka records read, for the job's summary."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counter = [0]
        for batch in batches:
            rows = batch.to_pydict()
            for partition, start, stop in zip(rows["partition"], rows["start"], rows["stop"], strict=True):
                yield from read_range(spec, int(partition), int(start), int(stop), counter)
        if bytes_read is not None:
            bytes_read.add(counter[0])

    return run
