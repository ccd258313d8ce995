"""Reading Kafka offset ranges in archive tasks: one consumer per task.

Each task (:mod:`ksi.pipeline.tasks`) reads one range ``(partition, start, stop)``: it assigns a confluent-kafka
consumer to ``partition`` at ``start`` and consumes until it reaches ``stop`` (exclusive), emitting Arrow
record batches in the table's layout.  Offsets may have gaps (transaction markers, aborted records that a
``read_committed`` consumer never sees, compacted keys); a range ends when a record at or past ``stop``
arrives, when the consumer's position passes ``stop``, or at end-of-partition at or past ``stop``.
A task that receives nothing for ``poll_timeout_seconds`` fails (and is retried): it never ends early.

Aborted transactions: the range is read ``read_committed``.  Where a batch of what it delivered has offset
gaps (the sign of transactions or compaction), the span from the first gap to the last is read again
``read_uncommitted``: a record that the second read delivers at an offset the first left out belongs to an
aborted transaction (control markers are delivered by neither, compacted offsets by neither).  It is kept,
in offset order, with ``kafka_aborted`` true, so the proxy can serve read_uncommitted consumers what the
broker would give them and leave it out for read_committed ones.  A range without gaps is read once.

Records become Arrow columns in batches of ``batch_rows``: one list comprehension per field over the
consumer's messages, then Arrow and numpy (timestamps, header offsets); no per-record code of ksi's.

A run small enough for the driver opens its consumers before it plans (:func:`prefetch`), so their first
fetches overlap the driver's imports; :func:`read_range` takes the one opened at its start.

Values are decoded into typed columns by :class:`ksi.pipeline.values.ValueDecoder` when the topic has
Avro schemas, else kept as raw bytes.  This module runs on executors: it imports only pyarrow, numpy,
confluent-kafka and the pipeline's value decoding.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from confluent_kafka import Message

__all__ = ["ERROR_COLUMN", "HEADER_TYPE", "RangeReadError", "ReadSpec", "close_prefetched", "consumer_config",
           "metadata_arrow_fields", "prefetch", "read_range"]

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
BATCH_ROWS = 10_000
CONSUME_TIMEOUT = 0.1  # seconds one consume() may wait for a batch to fill
TIMESTAMP_NOT_AVAILABLE = 0
ERROR_COLUMN = "_ksi_error"  # a value decoder's error text per row (ksi.pipeline.values), for dead letters


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
        pa.field("kafka_aborted", pa.bool_()),
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
    batch_rows: int = BATCH_ROWS


def _consumer_config(spec: ReadSpec, isolation_level: str = "read_committed") -> dict[str, Any]:
    return consumer_config(spec.bootstrap, spec.consumer, isolation_level)


def consumer_config(bootstrap: str, overrides: dict[str, str], isolation_level: str = "read_committed"
                    ) -> dict[str, Any]:
    """A task's consumer settings: ksi's, then ``archive.consumer`` (``overrides``), then the isolation level."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": "ksi-archive",        # required by the client; nothing is committed to the group
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": isolation_level,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",     # a range start that is gone is an error, never a silent skip
        "fetch.queue.backoff.ms": 10,
        # some brokers (noida-db) ignore fetch size limits and answer with very large responses
        "receive.message.max.bytes": 1_000_000_000,
        "check.crcs": False,
        # librdkafka prefetches up to this much per consumer (default 64 MiB): part of a task's memory bound
        "queued.max.messages.kbytes": 32768,
        # ... and until it holds this many messages (default 100,000, each with a few hundred bytes of
        # librdkafka's own beside its payload): two of the task's batches.  2M records on local[*], the process
        # tree's peak: on tansu, which honours fetch limits as Kafka does, 1,020 -> 895 MiB (each Python worker
        # 275-302 -> 223-228 MiB); on noida-db, which answers a fetch with the partition's whole tail, 1,312 ->
        # 1,389 MiB (a second such answer arrives while the first is still held)
        "queued.min.messages": 2 * BATCH_ROWS,
        "log_level": 3,
    }
    config.update(overrides)
    config["isolation.level"] = isolation_level  # whatever archive.consumer says: the two reads need their own
    return config


# Consumers opened before a run is planned, keyed by what they read: (config, topic, partition, start).
_PREFETCHED: dict[tuple[Any, ...], Any] = {}


def _prefetch_key(config: dict[str, Any], topic: str, partition: int, start: int) -> tuple[Any, ...]:
    return (tuple(sorted((k, str(v)) for k, v in config.items())), topic, partition, start)


def prefetch(bootstrap: str, overrides: dict[str, str], topic: str, ranges: dict[int, tuple[int, int]]) -> int:
    """Open and assign now the consumers a run's tasks in this process will read ``ranges`` (partition ->
    ``(start, stop)``) with, so that librdkafka's threads fetch their first records while the driver is still
    importing and planning (a new ``ksi archive`` process spends about half a second there, and a task
    otherwise waits 60-80 ms for its first fetch, one task after another).  :func:`read_range` takes the
    consumer whose config, topic, partition and start are its own; those the plan does not use are closed by
    :func:`close_prefetched`.  Returns how many were opened."""
    from confluent_kafka import Consumer, TopicPartition

    config = consumer_config(bootstrap, overrides)
    opened = 0
    for partition, (start, stop) in sorted(ranges.items()):
        key = _prefetch_key(config, topic, partition, start)
        if start >= stop or key in _PREFETCHED:
            continue
        consumer = Consumer(config)
        consumer.assign([TopicPartition(topic, partition, start)])
        _PREFETCHED[key] = consumer
        opened += 1
    return opened


def close_prefetched() -> int:
    """Close the prefetched consumers no task took (the plan read other ranges); returns how many."""
    consumers = list(_PREFETCHED.values())
    _PREFETCHED.clear()
    for consumer in consumers:
        consumer.close()
    return len(consumers)


def _columns(messages: list[Any], first: int | None = None) -> tuple[dict[str, pa.Array], int]:
    """The ksi layout's Kafka columns of ``messages`` (records only, no error events), and their key, value
    and header bytes.  One list comprehension per column: no per-record Python function of our own.
    ``first``: the messages' offsets are ``first, first + 1, ...`` (no gap): a range, not read per record."""
    n = len(messages)
    kinds, times = zip(*[m.timestamp() for m in messages], strict=True) if n else ((), ())
    ts_types = pa.array(kinds, pa.int32())
    available = pc.not_equal(ts_types, TIMESTAMP_NOT_AVAILABLE)
    keys = pa.array([m.key() for m in messages], pa.binary())
    values = pa.array([m.value() for m in messages], pa.binary())
    headers = [m.headers() for m in messages]
    counts = [len(h) if h else 0 for h in headers]
    flat = [kv for h in headers if h for kv in h]
    names, contents = zip(*flat, strict=True) if flat else ((), ())
    header_keys = pa.array(names, pa.string())
    header_values = pa.array(contents, pa.binary())
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    entries = pa.StructArray.from_arrays([header_keys, header_values], names=["key", "value"])
    arrays = {
        # one partition per read: the column is a constant, not a call per record
        "kafka_partition": pa.array(np.full(n, messages[0].partition() if n else 0, np.int32)),
        "kafka_offset": pa.array(np.arange(first, first + n, dtype=np.int64)) if first is not None
        else pa.array([m.offset() for m in messages], pa.int64()),
        # librdkafka: 0 not available, 1 CreateTime, 2 LogAppendTime; Kafka's attribute bit is type - 1
        "kafka_timestamp": pc.if_else(available, pc.multiply(pa.array(times, pa.int64()), 1000),
                                      pa.scalar(None, pa.int64())).cast(pa.timestamp("us", tz="UTC")),
        "kafka_timestamp_type": pc.if_else(available, pc.subtract(ts_types, 1), pa.scalar(None, pa.int32())),
        "kafka_key": keys,
        "kafka_headers": pa.ListArray.from_arrays(pa.array(offsets), entries).cast(HEADER_TYPE),
        "kafka_value": values,
    }
    size = (_data_bytes(keys) + _data_bytes(values) + _data_bytes(header_keys) + _data_bytes(header_values))
    return arrays, size


def _data_bytes(array: pa.Array) -> int:
    """Bytes of a binary/string array's values (its data buffer's used length)."""
    if len(array) == 0:
        return 0
    offsets = array.buffers()[1]
    ends = np.frombuffer(offsets, np.int32, count=len(array) + 1, offset=array.offset * 4)
    return int(ends[-1] - ends[0])


def _to_batch(messages: list[Any], spec: ReadSpec, aborted: npt.NDArray[np.bool_] | None = None,
              first: int | None = None) -> tuple[pa.RecordBatch, int]:
    arrays, size = _columns(messages, first)
    n = len(messages)
    if aborted is not None:  # true for a record of an aborted transaction, null for the others
        arrays["kafka_aborted"] = pc.if_else(pa.array(aborted), pa.scalar(True), pa.scalar(None, pa.bool_()))
    if spec.decoder is not None:
        arrays.update(spec.decoder.decode(arrays["kafka_value"], arrays["kafka_partition"], arrays["kafka_offset"]))
    else:
        arrays["kafka_value_schema_id"] = pa.nulls(n, pa.int32())
    out = []
    for f in spec.output_schema:
        array = arrays.get(f.name)
        out.append(pa.nulls(n, f.type) if array is None else array)
    return pa.RecordBatch.from_arrays(out, schema=spec.output_schema), size


def _offset(message: Message) -> int:
    offset = message.offset()
    assert offset is not None  # a consumed record, or the end of the partition, always has one
    return offset


def read_range(spec: ReadSpec, partition: int, start: int, stop: int,
               counter: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    """Batches holding every record of ``topic``/``partition`` in ``[start, stop)``, records of aborted
    transactions included and marked (see the module docstring).

    ``counter[0]`` is increased by the bytes of the keys, values and headers read."""
    from confluent_kafka import Consumer

    if start >= stop:
        return
    config = _consumer_config(spec)
    consumer = _PREFETCHED.pop(_prefetch_key(config, spec.topic, partition, start), None) or Consumer(config)
    aborted = _AbortedReader(spec, partition)
    try:
        pending: list[Any] = []
        settled = start  # offsets below it are in a batch already yielded
        for records in _consume(consumer, spec, partition, start, stop):
            pending.extend(records)
            if len(pending) >= spec.batch_rows:
                end = _offset(pending[-1]) + 1
                batch, size = _settle(pending, settled, end, spec, aborted)
                pending, settled = [], end
                if counter is not None:
                    counter[0] += size
                yield batch
        batch, size = _settle(pending, settled, stop, spec, aborted)
        if counter is not None:
            counter[0] += size
        if batch.num_rows:
            yield batch
    finally:
        consumer.close()
        aborted.close()


def _settle(committed: list[Any], lo: int, hi: int, spec: ReadSpec,
            aborted: _AbortedReader) -> tuple[pa.RecordBatch, int]:
    """The records of ``[lo, hi)``: ``committed`` (what read_committed delivered there), and where it left
    gaps, the aborted records read_uncommitted delivers in them."""
    n = len(committed)
    if n == hi - lo and (not n or _offset(committed[0]) == lo):  # offsets rise: no gap (the common case)
        return _to_batch(committed, spec, first=lo)
    offsets = np.fromiter((_offset(m) for m in committed), np.int64, count=n)
    bounds = np.concatenate(([lo - 1], offsets, [hi]))
    gaps = np.flatnonzero(np.diff(bounds) > 1)
    if not len(gaps):
        return _to_batch(committed, spec)
    first, last = int(bounds[gaps[0]]) + 1, int(bounds[gaps[-1] + 1])  # the span [first, last) holding the gaps
    seen = set(offsets.tolist())
    extra = [m for m in aborted.read(first, last) if _offset(m) not in seen]
    if not extra:
        return _to_batch(committed, spec)
    records = sorted(committed + extra, key=_offset)
    marked = np.isin(np.fromiter((_offset(m) for m in records), np.int64, count=len(records)), offsets, invert=True)
    return _to_batch(records, spec, marked)


class _AbortedReader:
    """A read_uncommitted consumer of one partition, opened at its first use, for spans with gaps."""

    def __init__(self, spec: ReadSpec, partition: int) -> None:
        self.spec, self.partition = spec, partition
        self._consumer: Any = None

    def read(self, start: int, stop: int) -> list[Any]:
        """Every record read_uncommitted delivers in ``[start, stop)``."""
        from confluent_kafka import Consumer, TopicPartition

        if self._consumer is None:
            self._consumer = Consumer(_consumer_config(self.spec, "read_uncommitted"))
        self._consumer.assign([TopicPartition(self.spec.topic, self.partition, start)])
        return [m for records in _consume(self._consumer, self.spec, self.partition, start, stop) for m in records]

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()


def _consume(consumer: Any, spec: ReadSpec, partition: int, start: int, stop: int) -> Iterator[list[Any]]:
    """Lists of the records ``consumer`` (assigned here at ``start`` unless already) delivers in
    ``[start, stop)``, until the range is complete.  Each ``consume`` asks for no more messages than the range
    still needs (plus one: the record or end-of-partition event at ``stop``), so the last call returns as soon
    as the range is complete instead of waiting for a full batch; a short timeout bounds the wait where gaps
    (transaction markers) make fewer records come."""
    from confluent_kafka import KafkaError, TopicPartition

    if not consumer.assignment():
        consumer.assign([TopicPartition(spec.topic, partition, start)])
    last_progress = time.monotonic()
    next_offset = start
    done = False
    while not done:
        want = min(spec.batch_rows, stop - next_offset + 1)
        messages = consumer.consume(num_messages=want, timeout=CONSUME_TIMEOUT)
        if messages:
            last_progress = time.monotonic()
            errors = [m for m in messages if m.error() is not None]
            if not errors and _offset(messages[-1]) < stop:  # the common case: all records, all wanted
                records = messages
            else:
                records = []
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - confluent-kafka's name
                            done = done or _offset(message) >= stop
                            continue
                        raise RangeReadError(f"{spec.topic}/{partition} [{start}, {stop}): {error}")
                    if _offset(message) >= stop:
                        done = True
                        break
                    records.append(message)
            if records:
                next_offset = _offset(records[-1]) + 1
                yield records
            done = done or next_offset >= stop
        if not done:
            position = consumer.position([TopicPartition(spec.topic, partition)])[0].offset
            if position >= stop:
                done = True
            elif time.monotonic() - last_progress > spec.poll_timeout_seconds:
                raise RangeReadError(f"{spec.topic}/{partition}: no record for {spec.poll_timeout_seconds:.0f} s "
                                     f"at offset {max(position, next_offset)} while reading [{start}, {stop}); "
                                     "is the broker reachable from the executors?")
