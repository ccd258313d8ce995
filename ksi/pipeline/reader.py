"""Reading Kafka offset ranges in archive tasks.

Each task (:mod:`ksi.pipeline.tasks`) reads one range ``(partition, start, stop)`` of one partition and emits
Arrow record batches in the table's layout holding every record of it, records of aborted transactions
included and marked.  Two readers, chosen by ``archive.reader``:

* ``ksi`` (the default where it applies): ksi's own Fetch client (:mod:`ksi.pipeline.fetcher`), whose
  responses are decoded into columns with numpy and Arrow, one Python step per record
  (:mod:`protocol.batch_columns`), in chunks of a few MiB whatever the broker sends.  Reads are
  ``read_committed``; the response's aborted transactions mark the records they cover (``kafka_aborted``).
* ``librdkafka``: a confluent-kafka consumer per task, for what ksi's client does not speak (SASL, any
  ``archive.consumer`` property outside :data:`ksi.pipeline.fetcher.SPOKEN`; ``auto`` falls back to it
  then, saying why), and for old-format message sets (magic 0/1), from the first such offset on.  Records
  become columns one list comprehension per field.  Aborted transactions: the range is read
  ``read_committed``; where a batch of what it delivered has offset gaps (the sign of transactions or
  compaction), the span from the first gap to the last is read again ``read_uncommitted``: a record that the
  second read delivers at an offset the first left out belongs to an aborted transaction.

Offsets may have gaps (transaction markers, aborted records, compacted keys); a range ends when a record at or
past ``stop`` arrives (or, librdkafka, the consumer's position passes ``stop``).  A task that receives
nothing for ``poll_timeout_seconds`` fails (and is retried): it never ends early.

A run small enough for the driver starts its reads before it plans (:func:`prefetch`), so their first
fetches overlap the driver's imports; :func:`read_range` takes the one opened at its start.

Values are decoded into typed columns by :class:`ksi.pipeline.values.ValueDecoder` when the topic has
Avro schemas, else kept as raw bytes.  This module runs on executors: it imports only pyarrow, numpy,
ksi's protocol package, confluent-kafka and the pipeline's value decoding.
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

from protocol.batch_columns import HEADERS_TYPE as HEADER_TYPE
from protocol.batch_columns import DecodedRecords, UnsupportedMagic, decode_batches
from protocol.errors import MalformedFrame

from . import fetcher

if TYPE_CHECKING:
    from confluent_kafka import Message

__all__ = ["ERROR_COLUMN", "HEADER_TYPE", "RangeReadError", "ReadSpec", "close_prefetched", "consumer_config",
           "metadata_arrow_fields", "prefetch", "read_range"]

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
    reader: str = "auto"  # archive.reader: auto, ksi or librdkafka


def reader_for(choice: str, overrides: dict[str, str]) -> tuple[str, str | None]:
    """The reader a run uses (``ksi`` or ``librdkafka``) for ``archive.reader = choice``, and why librdkafka
    when ``auto`` falls back to it (the ``archive.consumer`` property ksi's client does not speak)."""
    if choice == "librdkafka":
        return "librdkafka", None
    missing = fetcher.unsupported(overrides)
    if missing is None:
        return "ksi", None
    if choice == "ksi":
        raise RangeReadError(f"archive.reader = \"ksi\" does not speak archive.consumer property {missing}; "
                             "remove it, or set archive.reader = \"librdkafka\"")
    return "librdkafka", f"archive.consumer property {missing} is not one ksi's reader speaks"


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


# Reads started before a run is planned (RangeFetch, or librdkafka consumers), keyed by what they read:
# (reader, config, topic, partition, start).
_PREFETCHED: dict[tuple[Any, ...], Any] = {}


def _prefetch_key(reader: str, config: dict[str, Any], topic: str, partition: int, start: int) -> tuple[Any, ...]:
    return (reader, tuple(sorted((k, str(v)) for k, v in config.items())), topic, partition, start)


def prefetch(bootstrap: str, overrides: dict[str, str], topic: str, ranges: dict[int, tuple[int, int]],
             reader: str = "auto") -> int:
    """Start now the reads a run's tasks in this process will make of ``ranges`` (partition ->
    ``(start, stop)``), so that their first records are fetched while the driver is still importing and
    planning (a new ``ksi archive`` process spends about half a second there).  :func:`read_range` takes the
    read whose config, topic, partition and start are its own; those the plan does not use are closed by
    :func:`close_prefetched`.  Returns how many were started."""
    chosen, _why = reader_for(reader, overrides)
    config = consumer_config(bootstrap, overrides)
    opened = 0
    for partition, (start, stop) in sorted(ranges.items()):
        key = _prefetch_key(chosen, config, topic, partition, start)
        if start >= stop or key in _PREFETCHED:
            continue
        if chosen == "ksi":
            _PREFETCHED[key] = fetcher.RangeFetch(bootstrap, overrides, topic, partition, start, stop)
        else:
            from confluent_kafka import Consumer, TopicPartition

            consumer = Consumer(config)
            consumer.assign([TopicPartition(topic, partition, start)])
            _PREFETCHED[key] = consumer
        opened += 1
    return opened


def close_prefetched() -> int:
    """Close the prefetched reads no task took (the plan read other ranges); returns how many."""
    reads = list(_PREFETCHED.values())
    _PREFETCHED.clear()
    for read in reads:
        read.close()
    return len(reads)


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
    return _finish(arrays, len(messages), spec, aborted), size


def _finish(arrays: dict[str, pa.Array], n: int, spec: ReadSpec, aborted: npt.NDArray[np.bool_] | None
            ) -> pa.RecordBatch:
    """The record batch of the output schema from the Kafka columns: aborted marks, decoded values, nulls."""
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
    return pa.RecordBatch.from_arrays(out, schema=spec.output_schema)


def _offset(message: Message) -> int:
    offset = message.offset()
    assert offset is not None  # a consumed record, or the end of the partition, always has one
    return offset


def read_range(spec: ReadSpec, partition: int, start: int, stop: int,
               counter: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    """Batches holding every record of ``topic``/``partition`` in ``[start, stop)``, records of aborted
    transactions included and marked (see the module docstring).

    ``counter[0]`` is increased by the bytes of the keys, values and headers read."""
    if start >= stop:
        return
    chosen, _why = reader_for(spec.reader, spec.consumer)
    if chosen == "ksi":
        try:
            yield from _read_with_ksi(spec, partition, start, stop, counter)
            return
        except _OldFormat as exc:  # magic 0/1 message sets from here on: librdkafka reads those
            start = exc.offset
    yield from _read_with_librdkafka(spec, partition, start, stop, counter)


class _OldFormat(Exception):
    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


def _read_with_ksi(spec: ReadSpec, partition: int, start: int, stop: int,
                   counter: list[int] | None) -> Iterator[pa.RecordBatch]:
    """:func:`read_range` with ksi's Fetch client; raises :class:`_OldFormat` at an old message set, with the
    offset below which every record was yielded."""
    key = _prefetch_key("ksi", consumer_config(spec.bootstrap, spec.consumer), spec.topic, partition, start)
    read: fetcher.RangeFetch | None = _PREFETCHED.pop(key, None)
    expected = start  # every offset below it is in a batch yielded
    try:
        while expected < stop:
            try:
                if read is None:
                    read = fetcher.RangeFetch(spec.bootstrap, spec.consumer, spec.topic, partition, expected, stop,
                                              spec.poll_timeout_seconds)
                verify = read.settings.verify_crc
                for chunk in read:
                    records = decode_batches(chunk.data, chunk.starts, chunk.aborted, verify_crc=verify)
                    lo = int(np.searchsorted(records.offsets, expected))
                    hi = int(np.searchsorted(records.offsets, stop))
                    extra = None
                    if chunk.aborted:
                        extra = _left_out(spec, partition, records, lo, hi, expected, min(records.next_offset, stop))
                    if extra is not None:
                        batch, size = _merged_batch(records, lo, hi, extra, partition, spec)
                        if counter is not None:
                            counter[0] += size
                        yield batch
                    elif hi > lo:
                        batch, size = _decoded_batch(records, lo, hi, partition, spec)
                        if counter is not None:
                            counter[0] += size
                        yield batch
                    expected = max(expected, min(records.next_offset, stop))
                    if expected >= stop:
                        break
            except UnsupportedMagic:
                raise _OldFormat(expected) from None  # librdkafka reads both formats: on from what is not yielded
            except fetcher.FetchError as exc:
                raise RangeReadError(str(exc)) from None
            except MalformedFrame as exc:
                raise RangeReadError(f"{spec.topic}/{partition}: the broker's record batches do not decode: "
                                     f"{exc}") from None
            read.close()
            read = None  # a prefetched read that ended below this task's stop: read on from where it ended
    finally:
        if read is not None:
            read.close()


def _left_out(spec: ReadSpec, partition: int, records: DecodedRecords, lo: int, hi: int, first: int, end: int
              ) -> tuple[DecodedRecords, npt.NDArray[np.int64]] | None:
    """The records of aborted transactions a read_committed answer left out, read again read_uncommitted.

    Kafka's brokers answer read_committed with every batch and the aborted transactions, and the decoder marks
    them; some brokers (noida-db) list the aborted transactions but leave their batches out.  Offsets in
    ``[first, end)`` that are neither a record nor a control batch, in an answer that listed aborted
    transactions, are read again read_uncommitted: what that gives there is aborted.  Returns the second
    read's records and the indexes of those to add, or None when nothing is missing."""
    gaps = _gaps(records.offsets[lo:hi], records.controls, first, end)
    if not len(gaps):
        return None
    again = fetcher.RangeFetch(spec.bootstrap, spec.consumer, spec.topic, partition, int(gaps[0, 0]),
                               int(gaps[-1, 1]), spec.poll_timeout_seconds, fetcher.READ_UNCOMMITTED)
    parts = []
    try:
        for chunk in again:
            read = decode_batches(chunk.data, chunk.starts, verify_crc=again.settings.verify_crc)
            at = np.searchsorted(gaps[:, 0], read.offsets, side="right") - 1  # the gap starting at or below
            inside = (at >= 0) & (read.offsets < gaps[np.maximum(at, 0), 1])
            parts.append((read, np.flatnonzero(inside)))
    except fetcher.FetchError as exc:
        raise RangeReadError(str(exc)) from None
    finally:
        again.close()
    parts = [(read, keep) for read, keep in parts if len(keep)]
    if not parts:
        return None
    if len(parts) > 1:  # more than one chunk's worth of aborted records: rare enough to join them
        return _joined(parts)
    return parts[0]


def _gaps(offsets: npt.NDArray[np.int64], controls: npt.NDArray[np.int64], first: int, end: int
          ) -> npt.NDArray[np.int64]:
    """The spans ``[lo, hi)`` of ``[first, end)`` that neither a record (``offsets``, ascending) nor a control
    batch (``controls``: (first, last) rows) takes, as rows."""
    lows = np.concatenate([offsets, controls[:, 0], [first - 1, end]])
    highs = np.concatenate([offsets, controls[:, 1], [first - 1, end]])
    order = np.argsort(lows, kind="stable")
    lows, highs = lows[order], np.maximum.accumulate(highs[order])
    after = highs[:-1] + 1            # the first offset after everything up to here
    before = lows[1:]                 # the next taken offset
    spans = np.stack([np.maximum(after, first), np.minimum(before, end)], axis=1)
    return spans[spans[:, 0] < spans[:, 1]]


def _joined(parts: list[tuple[DecodedRecords, npt.NDArray[np.int64]]]) -> tuple[DecodedRecords, npt.NDArray[np.int64]]:
    taken = [_taken(read, keep) for read, keep in parts]
    joined = DecodedRecords(
        offsets=np.concatenate([t.offsets for t in taken]),
        timestamps=np.concatenate([t.timestamps for t in taken]),
        timestamp_types=np.concatenate([t.timestamp_types for t in taken]),
        keys=pa.concat_arrays([t.keys for t in taken]),
        values=pa.concat_arrays([t.values for t in taken]),
        headers=pa.concat_arrays([t.headers for t in taken]),
        aborted=np.ones(sum(len(t) for t in taken), bool),
        next_offset=taken[-1].next_offset,
        data_bytes=sum(t.data_bytes for t in taken),
        controls=np.zeros((0, 2), np.int64),
    )
    return joined, np.arange(len(joined))


def _taken(records: DecodedRecords, rows: npt.NDArray[np.int64]) -> DecodedRecords:
    """Rows ``rows`` of ``records``, all marked aborted."""
    index = pa.array(rows)
    return DecodedRecords(records.offsets[rows], records.timestamps[rows], records.timestamp_types[rows],
                          records.keys.take(index), records.values.take(index), records.headers.take(index),
                          np.ones(len(rows), bool), records.next_offset, records.data_bytes, records.controls)


def _merged_batch(records: DecodedRecords, lo: int, hi: int,
                  extra: tuple[DecodedRecords, npt.NDArray[np.int64]], partition: int, spec: ReadSpec
                  ) -> tuple[pa.RecordBatch, int]:
    """Rows ``lo:hi`` of ``records`` and the aborted records ``extra`` adds, in offset order."""
    added = _taken(*extra)
    offsets = np.concatenate([records.offsets[lo:hi], added.offsets])
    order = np.argsort(offsets, kind="stable")
    index = pa.array(order)
    n = hi - lo
    merged = DecodedRecords(
        offsets=offsets[order],
        timestamps=np.concatenate([records.timestamps[lo:hi], added.timestamps])[order],
        timestamp_types=np.concatenate([records.timestamp_types[lo:hi], added.timestamp_types])[order],
        keys=pa.concat_arrays([records.keys.slice(lo, n), added.keys]).take(index),
        values=pa.concat_arrays([records.values.slice(lo, n), added.values]).take(index),
        headers=pa.concat_arrays([records.headers.slice(lo, n), added.headers]).take(index),
        aborted=np.concatenate([records.aborted[lo:hi], added.aborted])[order],
        next_offset=records.next_offset, data_bytes=0, controls=records.controls,
    )
    return _decoded_batch(merged, 0, len(merged), partition, spec)


def _decoded_batch(records: DecodedRecords, lo: int, hi: int, partition: int, spec: ReadSpec
                   ) -> tuple[pa.RecordBatch, int]:
    """Rows ``lo:hi`` of decoded records as a batch of the output schema, and their key, value and header bytes."""
    n = hi - lo
    keys, values = records.keys.slice(lo, n), records.values.slice(lo, n)
    headers = records.headers.slice(lo, n)
    entries = headers.flatten()
    arrays: dict[str, pa.Array] = {
        "kafka_partition": pa.array(np.full(n, partition, np.int32)),
        "kafka_offset": pa.array(records.offsets[lo:hi]),
        "kafka_timestamp": pa.array(records.timestamps[lo:hi] * 1000).cast(pa.timestamp("us", tz="UTC")),
        "kafka_timestamp_type": pa.array(records.timestamp_types[lo:hi]),
        "kafka_key": keys,
        "kafka_headers": headers,
        "kafka_value": values,
    }
    aborted = records.aborted[lo:hi]
    size = (_data_bytes(keys) + _data_bytes(values) + _data_bytes(entries.field("key"))
            + _data_bytes(entries.field("value")))
    return _finish(arrays, n, spec, aborted if aborted.any() else None), size


def _read_with_librdkafka(spec: ReadSpec, partition: int, start: int, stop: int,
                          counter: list[int] | None) -> Iterator[pa.RecordBatch]:
    """:func:`read_range` with a confluent-kafka consumer."""
    from confluent_kafka import Consumer

    config = _consumer_config(spec)
    consumer = _PREFETCHED.pop(_prefetch_key("librdkafka", config, spec.topic, partition, start), None) \
        or Consumer(config)
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
