#!/usr/bin/env python3
"""Soak ksi: mixed producers, cold and hot consumers, a moving log start and a broker fault, then an exact
count of produced versus consumed records per partition.

What it starts (all on loopback, under --data-dir):

* a broker: noida-db (persistent; DeleteRecords really moves the log start) or tansu (memory only; see
  "tansu" below);
* an Iceberg catalog: PyIceberg's SqlCatalog on SQLite, with the topic's ksi-layout table;
* ksi: ``python -m ksi serve`` with the topic configured for history.

What runs for --seconds:

* producers through ksi: confluent-kafka and kafka-python, acks=all, keys (some null), headers, explicit
  timestamps, some null values; every acknowledged record is kept in a ledger (partition, offset) -> a
  digest of key, value, headers and timestamp;
* cold consumers through ksi, each reading from the beginning (through the lake) and then following the
  tail: a confluent-kafka consumer group that commits after every batch, a kafka-python consumer by
  assignment, and a confluent-kafka consumer by assignment started just before the fault (so the fault
  lands in its cold read).  Cold consumers are throttled (--cold-rate) so they spend time in the lake;
* hot consumers through ksi, by assignment from the end of the log when they start: confluent-kafka and
  aiokafka;
* the archiver, every --archive-every seconds: what ``ksi archive`` and retention do.  Per partition it
  reads the next offsets straight from the broker, appends them to the Iceberg table (ksi layout), then
  moves the broker's log start below the lake's end with DeleteRecords.  Consumers that lag fall from the
  broker into the lake, transparently (tansu cannot delete records: there the topic is configured with
  prefer_lake, so archived offsets are still served from the lake);
* one fault at --fault-at of the run: ``broker`` = kill -9 the broker and start it again after --outage
  seconds on the same port (noida keeps its data), ``proxy`` = kill -9 ksi and start it again on the same
  ports, ``none``.  Producers keep producing through the outage (into their clients' queues).

noida writes its state to disk once a second (its whole Kafka state as one file), so a kill -9 loses the
last second of acknowledged writes: a property of that broker, not of ksi.  The soak therefore quiesces
the producers and waits until the broker's state file holds every acknowledged record before it kills;
consumers, the archiver and ksi are never paused.

tansu: memory only and no DeleteRecords, so the fault is ``proxy`` (a broker restart would lose the topic)
and archived offsets are served from the lake through prefer_lake.  Two faults of tansu itself, measured
without ksi, show up in a tansu soak: with two producers writing one partition at once a consumer can skip a
record (so there each partition gets one producer), and a fetch with max_wait_ms=0, which ksi sends for the
hot half of a fetch it splits, is answered with no partitions at all, which kafka-python rejects as an
invalid full fetch response and then stalls (the cold-kp consumer may not reach the end).

At the end the producers stop, the consumers read up to the final end of every partition, and a table
per partition and consumer shows: consumed, lost (offsets never consumed), skipped (jumps forward),
dup (records delivered twice that Kafka semantics do not allow), replayed (a consumer group re-reading
from its own last commit after a rebalance: allowed), bad (a record whose key, value, headers or
timestamp differ from what was produced).  The exit status is 1 when any of lost, skipped, dup or bad is
not zero, when a consumer did not reach the end, or when ksi logged a Python traceback; 0 otherwise.

    .venv/bin/python scripts/soak.py --seconds 120
    make soak SOAK_SECONDS=600
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from ksi.brokers import BrokerProcess, free_port, start_noida, start_tansu  # noqa: E402

log = logging.getLogger("soak")

RECEIVE_MESSAGE_MAX_BYTES = 1_000_000_000  # noida ignores fetch size limits: librdkafka must take whole partitions
SESSION_TIMEOUT_MS = 6000                  # tansu holds a JoinGroup for session.timeout/2


# -- records ----------------------------------------------------------------------------------------


def digest(key: bytes | None, value: bytes | None, headers: Any, timestamp_ms: int) -> int:
    """One 64-bit number for what a consumer must get back: key, value, headers and timestamp.

    Python's hash of a tuple of bytes is stable within a process (producers and consumers share one)."""
    normalized = tuple((k, bytes(v) if v is not None else None) for k, v in (headers or ()))
    return hash((key, value, normalized, timestamp_ms))


Headers = list[tuple[str, str | bytes | None]]


def make_record(producer: str, seq: int, partition: int, value_bytes: int) -> tuple[bytes | None, bytes | None,
                                                                                    Headers, int]:
    """Key (null every 13th), value (null about every 97th, else ``value_bytes`` long), headers, timestamp."""
    key = None if seq % 13 == 0 else f"{producer}-{partition}-{seq}".encode()
    if seq % 97 == 5 and key is not None:  # a null value (kafka-python refuses a record with neither)
        value = None
    else:
        head = f"{producer}|{partition}|{seq}|".encode()
        value = head + b"x" * max(0, value_bytes - len(head))
    headers: Headers = [("producer", producer.encode()), ("seq", str(seq).encode())]
    if seq % 3 == 0:
        headers.append(("empty", b""))
    return key, value, headers, int(time.time() * 1000)


class Ledger:
    """Every record a producer had acknowledged: partition -> offset -> digest."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._lock = threading.Lock()
        self.acked: list[dict[int, int]] = [{} for _ in range(partitions)]
        self.failed: list[str] = []
        self.twice: list[tuple[int, int]] = []  # an offset acknowledged for two different records

    def ack(self, partition: int, offset: int, value: int) -> None:
        with self._lock:
            if offset in self.acked[partition] and self.acked[partition][offset] != value:
                self.twice.append((partition, offset))
            self.acked[partition][offset] = value

    def fail(self, error: str) -> None:
        with self._lock:
            self.failed.append(error)

    def end(self, partition: int) -> int:
        """One past the highest acknowledged offset."""
        with self._lock:
            acked = self.acked[partition]
            return max(acked) + 1 if acked else 0

    def count(self) -> int:
        with self._lock:
            return sum(len(a) for a in self.acked)


# -- producers --------------------------------------------------------------------------------------


class ProducerThread(threading.Thread):
    """Produces round-robin over the partitions at about ``rate`` records/s until stopped.

    ``allowed`` cleared = quiesce: the thread stops producing, waits until everything it sent is
    acknowledged, and sets ``idle``."""

    def __init__(self, name: str, kind: str, bootstrap: str, topic: str, ledger: Ledger, rate: float,
                 value_bytes: int, allowed: threading.Event, stop: threading.Event,
                 partitions: list[int] | None = None) -> None:
        super().__init__(name=f"producer-{name}", daemon=True)
        self.label, self.kind, self.bootstrap, self.topic = name, kind, bootstrap, topic
        self.targets = partitions if partitions is not None else list(range(ledger.partitions))
        self.ledger, self.rate, self.value_bytes = ledger, rate, value_bytes
        self.allowed, self.stop_event = allowed, stop
        self.idle = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.kind == "confluent":
                self._run_confluent()
            elif self.kind == "kafka-python":
                self._run_kafka_python()
            else:
                raise ValueError(self.kind)
        except BaseException as exc:  # reported by the orchestrator
            self.error = exc
            log.exception("%s failed", self.name)

    def _pace(self, started: float) -> None:
        ahead = self.sent / self.rate - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(min(ahead, 0.2))

    def _loop(self, send: Callable[[int, int], None], flush: Callable[[], None]) -> None:
        started = time.monotonic()
        while not self.stop_event.is_set():
            if not self.allowed.is_set():
                flush()
                self.idle.set()
                while not self.allowed.is_set() and not self.stop_event.is_set():
                    time.sleep(0.02)
                self.idle.clear()
                started = time.monotonic() - self.sent / self.rate
                continue
            send(self.targets[self.sent % len(self.targets)], self.sent)
            self.sent += 1
            self._pace(started)
        flush()
        self.idle.set()

    def _run_confluent(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({
            "bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": False,
            "linger.ms": 5, "batch.num.messages": 20, "message.timeout.ms": 300_000,
            "reconnect.backoff.ms": 100, "reconnect.backoff.max.ms": 1000, "socket.timeout.ms": 10_000,
            "logger": logging.getLogger("soak.librdkafka"),
        })

        def send(partition: int, seq: int) -> None:
            key, value, headers, ts = make_record(self.label, seq, partition, self.value_bytes)
            expected = digest(key, value, headers, ts)

            def delivered(err: Any, msg: Any) -> None:
                if err is not None:
                    self.ledger.fail(f"{self.label} seq {seq}: {err}")
                else:
                    self.ledger.ack(msg.partition(), msg.offset(), expected)

            while True:
                try:
                    producer.produce(self.topic, key=key, value=value, headers=headers, partition=partition,
                                     timestamp=ts, on_delivery=delivered)
                    break
                except BufferError:  # local queue full (a long outage): wait for room
                    producer.poll(0.1)
            producer.poll(0)

        def flush() -> None:
            while producer.flush(1.0) > 0 and not self.stop_event.is_set():
                pass
            producer.flush(30)

        self._loop(send, flush)

    def _run_kafka_python(self) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5, batch_size=4096,
                                 retries=1_000_000, delivery_timeout_ms=300_000, request_timeout_ms=10_000,
                                 reconnect_backoff_max_ms=1000, max_block_ms=300_000, enable_idempotence=False)

        def send(partition: int, seq: int) -> None:
            key, value, headers, ts = make_record(self.label, seq, partition, self.value_bytes)
            expected = digest(key, value, headers, ts)
            future = producer.send(self.topic, key=key, value=value, headers=headers, partition=partition,
                                   timestamp_ms=ts)
            future.add_callback(lambda md: self.ledger.ack(md.partition, md.offset, expected))
            future.add_errback(lambda exc: self.ledger.fail(f"{self.label} seq {seq}: {exc!r}"))

        try:
            self._loop(send, lambda: producer.flush(timeout=300))
        finally:
            producer.close(timeout=10)


def produce_sync(bootstrap: str, topic: str, ledger: Ledger, per_partition: int, value_bytes: int,
                 label: str = "seed") -> None:
    """Produce ``per_partition`` records to every partition and wait for every acknowledgement, flushing
    every 20 records so batches stay small (noida's DeleteRecords drops whole batches)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                         "linger.ms": 0, "batch.num.messages": 20})
    errors: list[str] = []
    seq = 0
    for i in range(per_partition):
        for p in range(ledger.partitions):
            key, value, headers, ts = make_record(label, seq, p, value_bytes)
            expected = digest(key, value, headers, ts)

            def delivered(err: Any, msg: Any, expected: int = expected) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    ledger.ack(msg.partition(), msg.offset(), expected)

            producer.produce(topic, key=key, value=value, headers=headers, partition=p, timestamp=ts,
                             on_delivery=delivered)
            seq += 1
        if i % 20 == 19:
            producer.flush(30)
    assert producer.flush(30) == 0 and not errors, f"seed producer: {errors[:3]}"


# -- consumers --------------------------------------------------------------------------------------


@dataclass
class Trace:
    """What one consumer got from one partition, in delivery order."""

    offsets: array[int] = field(default_factory=lambda: array("q"))
    digests: array[int] = field(default_factory=lambda: array("q"))
    commits: set[int] = field(default_factory=set)  # offsets this consumer sent as its group commit
    commit_log: list[tuple[int, int]] = field(default_factory=list)  # (records delivered by then, offset)
    position: int = -1                              # one past the last offset delivered

    def add(self, offset: int, value: int) -> None:
        self.offsets.append(offset)
        self.digests.append(value)
        self.position = offset + 1


def _signed64(value: int) -> int:
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


class ConsumerThread(threading.Thread):
    """One consumer through ksi, recording every record it gets.

    kinds: ``confluent`` (by assignment), ``confluent-group`` (subscribe, commit after every batch),
    ``kafka-python`` and ``aiokafka`` (by assignment).  ``start`` = offset per partition for the
    assigned ones (None = the earliest offset ksi reports, i.e. the lake's first).  ``hook(partition,
    offset)`` runs before each record is taken (throttling, fault gates) and may block."""

    def __init__(self, name: str, kind: str, bootstrap: str, topic: str, partitions: int,
                 start: dict[int, int] | None = None, hook: Callable[[int, int], None] | None = None,
                 small_fetches: bool = False) -> None:
        super().__init__(name=f"consumer-{name}", daemon=True)
        self.label, self.kind, self.bootstrap, self.topic = name, kind, bootstrap, topic
        self.partitions = partitions
        self.start_offsets = start
        self.hook = hook
        self.small_fetches = small_fetches
        self.traces = [Trace() for _ in range(partitions)]
        self.assignments = 0          # (re)assignments seen by a group consumer
        self.commit_failures = 0
        self.errors: list[str] = []   # client-reported errors (retriable ones included)
        self.error: BaseException | None = None
        self._end: list[int] | None = None
        self._abort = threading.Event()
        self.group_id = f"soak-{name}-{uuid.uuid4().hex[:6]}"
        self.finished = threading.Event()

    # -- control

    def finish(self, end: list[int]) -> None:
        """Read up to ``end`` (per partition) and stop."""
        self._end = list(end)

    def abort(self) -> None:
        self._abort.set()

    def expected_start(self, partition: int) -> int | None:
        return None if self.start_offsets is None else self.start_offsets.get(partition, 0)

    def consumed(self) -> int:
        return sum(len(t.offsets) for t in self.traces)

    def _done(self) -> bool:
        if self._abort.is_set():
            return True
        end = self._end
        return end is not None and all(self.traces[p].position >= end[p] or end[p] == self._floor(p)
                                       for p in range(self.partitions))

    def _floor(self, partition: int) -> int:
        start = self.expected_start(partition)
        return start if start is not None else 0

    def _take(self, partition: int, offset: int, key: Any, value: Any, headers: Any, ts: int) -> None:
        if self.hook is not None:
            self.hook(partition, offset)
        self.traces[partition].add(offset, _signed64(digest(key, value, headers, ts)))

    def run(self) -> None:
        try:
            {"confluent": self._run_confluent, "confluent-group": self._run_confluent,
             "kafka-python": self._run_kafka_python, "aiokafka": self._run_aiokafka}[self.kind]()
        except BaseException as exc:
            self.error = exc
            log.exception("%s failed", self.name)
        finally:
            self.finished.set()

    # -- confluent-kafka

    def _confluent_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap, "group.id": self.group_id,
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES, "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": 1000, "fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 10,
            "reconnect.backoff.ms": 100, "reconnect.backoff.max.ms": 1000, "socket.timeout.ms": 10_000,
            "logger": logging.getLogger("soak.librdkafka"),
        }
        if self.small_fetches:
            # Little read-ahead, so the consumer's fetches (not only its polls) are where the fault hits.
            config.update({"queued.max.messages.kbytes": 128, "fetch.max.bytes": 65536, "message.max.bytes": 65536,
                           "max.partition.fetch.bytes": 32768, "queued.min.messages": 10})
        return config

    def _run_confluent(self) -> None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        consumer = Consumer(self._confluent_config())
        group = self.kind == "confluent-group"

        def on_assign(c: Any, partitions: list[Any]) -> None:
            self.assignments += 1

        try:
            if group:
                consumer.subscribe([self.topic], on_assign=on_assign)
            else:
                consumer.assign([TopicPartition(self.topic, p, self._start_or_beginning(p))
                                 for p in range(self.partitions)])
            while not self._done():
                messages = consumer.consume(num_messages=500, timeout=0.2)
                taken: dict[int, int] = {}
                for m in messages:
                    if m.error():
                        self.errors.append(str(m.error()))
                        continue
                    partition, offset = m.partition(), m.offset()
                    assert partition is not None and offset is not None
                    _, ts = m.timestamp()
                    self._take(partition, offset, m.key(), m.value(), m.headers(), ts)
                    taken[partition] = offset + 1
                if group and taken:
                    offsets = [TopicPartition(self.topic, p, o) for p, o in taken.items()]
                    for p, o in taken.items():
                        self.traces[p].commits.add(o)
                        self.traces[p].commit_log.append((len(self.traces[p].offsets), o))
                    try:
                        consumer.commit(offsets=offsets, asynchronous=False)
                    except KafkaException as exc:  # the broker is away, or a rebalance is under way
                        self.commit_failures += 1
                        self.errors.append(f"commit: {exc}")
        finally:
            consumer.close()

    def _start_or_beginning(self, partition: int) -> int:
        start = self.expected_start(partition)
        return start if start is not None else -2  # OFFSET_BEGINNING: ksi answers the lake's first offset

    # -- kafka-python

    def _run_kafka_python(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        extra: dict[str, Any] = {}
        if self.small_fetches:
            extra = {"max_partition_fetch_bytes": 32768, "fetch_max_bytes": 65536}
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                                 auto_offset_reset="earliest", fetch_max_wait_ms=100, request_timeout_ms=10_000,
                                 reconnect_backoff_max_ms=1000, **extra)
        try:
            tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
            consumer.assign(tps)
            for tp in tps:
                start = self.expected_start(tp.partition)
                if start is None:
                    consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, start)
            while not self._done():
                for batch in consumer.poll(timeout_ms=200, max_records=500).values():
                    for m in batch:
                        self._take(m.partition, m.offset, m.key, m.value, list(m.headers or ()), m.timestamp)
        finally:
            consumer.close(autocommit=False)

    # -- aiokafka

    def _run_aiokafka(self) -> None:
        asyncio.run(self._aiokafka())

    async def _aiokafka(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="earliest", fetch_max_wait_ms=100, request_timeout_ms=10_000,
                                    retry_backoff_ms=100)
        await consumer.start()
        try:
            tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
            consumer.assign(tps)
            for tp in tps:
                start = self.expected_start(tp.partition)
                if start is None:
                    await consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, start)
            while not self._done():
                batches = await consumer.getmany(timeout_ms=200, max_records=500)
                for batch in batches.values():
                    for m in batch:
                        self._take(m.partition, m.offset, m.key, m.value, list(m.headers or ()), m.timestamp)
        finally:
            await consumer.stop()


class Throttle:
    """A hook that lets a consumer take at most ``rate`` records per second (the rate can change)."""

    def __init__(self, rate: float) -> None:
        self.set_rate(rate)

    def set_rate(self, rate: float) -> None:
        self.rate, self.taken, self.since = rate, 0, time.monotonic()

    def __call__(self, partition: int, offset: int) -> None:
        self.taken += 1
        ahead = self.taken / self.rate - (time.monotonic() - self.since)
        if ahead > 0.05:
            time.sleep(ahead)


# -- verification -----------------------------------------------------------------------------------


@dataclass
class Verdict:
    consumed: int = 0
    lost: int = 0       # offsets in the expected range never delivered
    skipped: int = 0    # offsets jumped over (delivered later or not at all): never allowed
    dup: int = 0        # extra deliveries Kafka semantics do not allow
    replayed: int = 0   # a group re-reading from its own last commit after a rebalance: allowed
    bad: int = 0        # delivered with other key, value, headers or timestamp than produced
    outside: int = 0    # offsets outside [start, end)
    rewinds: list[tuple[int, int, int]] = field(default_factory=list)  # (delivery index, from, to)
    first_problem: str = ""

    @property
    def ok(self) -> bool:
        return not (self.lost or self.skipped or self.dup or self.bad or self.outside)

    def note(self, text: str) -> None:
        if not self.first_problem:
            self.first_problem = text


def verify(trace: Trace, start: int, end: int, expected: dict[int, int], group: bool) -> Verdict:
    """Check one consumer's deliveries of one partition against the ledger, offset by offset.

    Every offset in ``[start, end)`` must be delivered with the digest produced there.  A consumer by
    assignment must deliver each exactly once, in order.  A consumer group may rewind after a
    rebalance, but only to an offset it committed itself (or to ``start`` before its first commit), and
    the records it then reads again are counted as *replayed*, not as duplicates."""
    v = Verdict()
    counts = bytearray(max(0, end - start))
    position = start
    legal_until = start  # re-deliveries below this follow a legal rewind
    allowed = trace.commits | {start}
    for index, (offset, value) in enumerate(zip(trace.offsets, trace.digests, strict=True)):
        v.consumed += 1
        if not start <= offset < end:
            v.outside += 1
            v.note(f"offset {offset} outside [{start}, {end})")
            continue
        if offset < position:  # a rewind
            v.rewinds.append((index, position, offset))
            if group and offset in allowed:
                legal_until = max(legal_until, position)
            else:
                legal_until = min(legal_until, offset)
                v.note(f"rewound from {position} to {offset}" + (" (not a committed offset)" if group else ""))
        elif offset > position:
            v.skipped += offset - position
            v.note(f"skipped {position}..{offset - 1}")
        position = offset + 1
        slot = offset - start
        if counts[slot]:
            if group and offset < legal_until:
                v.replayed += 1
            else:
                v.dup += 1
                v.note(f"offset {offset} delivered again")
        counts[slot] = min(255, counts[slot] + 1)
        want = expected.get(offset)
        if want is None or _signed64(want) != value:
            v.bad += 1
            v.note(f"offset {offset}: " + ("no acknowledged record there" if want is None else "content differs"))
    v.lost = counts.count(0)
    if v.lost:
        missing = next(i for i, c in enumerate(counts) if c == 0) + start
        v.note(f"{v.lost} offsets never delivered, the first {missing}")
    return v


# -- the lake ---------------------------------------------------------------------------------------


def create_table(catalog: Any, name: str) -> Any:
    from ksi.history.ksi_table import TABLE_PROPERTIES, partition_spec, raw_value_schema, sort_order

    return catalog.create_table(name, schema=raw_value_schema(), partition_spec=partition_spec(),
                                sort_order=sort_order(), properties=TABLE_PROPERTIES)


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


# -- faults -----------------------------------------------------------------------------------------


def noida_persisted(data_dir: Path, topic: str) -> dict[int, int] | None:
    """High watermark per partition of ``topic`` in noida's state file (None while it is unreadable)."""
    try:
        state = json.loads((data_dir / "kafka.json").read_bytes())
        for name, body in state["topics"]:
            if name == topic:
                return {int(pid): int(p["high_watermark"]) for pid, p in body["partitions"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {}


def noida_committed(data_dir: Path, group: str, topic: str) -> dict[int, int]:
    """The offsets ``group`` has committed for ``topic`` in noida's state file: after a kill -9, exactly
    what the restarted broker answers OffsetFetch with."""
    state = json.loads((data_dir / "kafka.json").read_bytes())
    return {int(p): int(offset) for (g, t, p), offset in state.get("committed_offsets", [])
            if g == group and t == topic}


def wait_persisted(broker: BrokerProcess, topic: str, ends: list[int], timeout: float = 20) -> None:
    """Wait until the broker's on-disk state holds every acknowledged record (noida writes it once a
    second); only then does a kill -9 lose nothing that was acknowledged."""
    if broker.kind != "noida" or broker.data_dir is None:
        return
    deadline = time.monotonic() + timeout
    while True:
        persisted = noida_persisted(broker.data_dir, topic)
        if persisted is not None and all(persisted.get(p, 0) >= end for p, end in enumerate(ends)):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"noida did not persist {topic} up to {ends} within {timeout} s (state: {persisted})")
        time.sleep(0.05)


class Producers:
    """The producer threads, with the quiesce switch the fault injection uses."""

    def __init__(self) -> None:
        self.allowed = threading.Event()
        self.allowed.set()
        self.stop = threading.Event()
        self.threads: list[ProducerThread] = []

    def add(self, name: str, kind: str, bootstrap: str, topic: str, ledger: Ledger, rate: float, value_bytes: int,
            partitions: list[int] | None = None) -> ProducerThread:
        thread = ProducerThread(name, kind, bootstrap, topic, ledger, rate, value_bytes, allowed=self.allowed,
                                stop=self.stop, partitions=partitions)
        self.threads.append(thread)
        thread.start()
        return thread

    def quiesce(self, timeout: float = 120) -> None:
        """Stop producing and wait until every record sent so far is acknowledged."""
        self.allowed.clear()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            while not thread.idle.wait(0.1):
                if thread.error is not None or not thread.is_alive():
                    raise RuntimeError(f"{thread.name} died: {thread.error!r}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{thread.name} did not drain within {timeout} s")

    def resume(self) -> None:
        self.allowed.set()

    def finish(self, timeout: float = 300) -> None:
        self.stop.set()
        self.allowed.set()
        for thread in self.threads:
            thread.join(timeout)
            if thread.is_alive():
                raise TimeoutError(f"{thread.name} did not finish within {timeout} s")


def kill_broker(broker: BrokerProcess, producers: Producers, ledger: Ledger, topic: str) -> None:
    """Quiesce the producers, wait until the broker's state is on disk, then kill -9 it."""
    producers.quiesce()
    wait_persisted(broker, topic, [ledger.end(p) for p in range(ledger.partitions)])
    broker.kill()


# -- ksi --------------------------------------------------------------------------------------------


class KsiProcess:
    """``python -m ksi serve`` on fixed ports (so a restart keeps every client's addresses)."""

    def __init__(self, config_path: Path, log_path: Path, bootstrap_port: int) -> None:
        self.config_path, self.log_path, self.port = config_path, log_path, bootstrap_port
        self.process: subprocess.Popen[bytes] | None = None
        self.bootstrap = f"127.0.0.1:{bootstrap_port}"

    def start(self, timeout: float = 30) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "ksi", "serve", "--config", str(self.config_path)],
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            cwd=REPO_ROOT, env=env)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"ksi exited with {self.process.returncode}; see {self.log_path}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"ksi did not listen on {self.port} within {timeout} s; see {self.log_path}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout: float = 20) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                return -9
        return self.process.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""


def ksi_config(bootstrap_port: int, base_port: int, metrics_port: int, broker: BrokerProcess,
               catalog_props: dict[str, str], topic: str, table: str, prefer_lake: bool) -> str:
    return f"""\
[proxy]
listen = "127.0.0.1:{bootstrap_port}"
advertised_host = "127.0.0.1"
broker_port_base = {base_port}

[upstream]
bootstrap_servers = "{broker.bootstrap}"
metadata_refresh_seconds = 2

[metrics]
listen = "127.0.0.1:{metrics_port}"

[catalog]
name = "lake"
uri = "{catalog_props['uri']}"
warehouse = "{catalog_props['warehouse']}"

[history]
window_rows = 8192

[[topics]]
name = "{topic}"
table = "{table}"
layout = "ksi"
prefer_lake = {"true" if prefer_lake else "false"}
"""


# -- the soak ---------------------------------------------------------------------------------------


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


def run_soak(args: argparse.Namespace) -> int:
    from pyiceberg.catalog.sql import SqlCatalog

    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="ksi-soak-")).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    logging.basicConfig(filename=str(data_dir / f"soak-{run_id}.log"), level=logging.INFO,
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    say = Printer()
    warnings.filterwarnings("ignore", message="Parquet writer option", category=UserWarning)  # PyIceberg's writer
    partitions = args.partitions
    fault = args.fault or ("broker" if args.broker == "noida" else "proxy")
    if fault == "broker" and args.broker == "tansu":
        say("tansu keeps its data in memory only: a broker restart would lose the topic; use --fault proxy")
        return 2

    say(f"soak {run_id}: {args.seconds:g} s, {partitions} partitions, broker {args.broker}, fault {fault}, "
        f"data in {data_dir}")
    if args.broker == "noida":
        broker = start_noida(data_dir / "noida", log_path=data_dir / "noida.log")
    else:
        broker = start_tansu(log_path=data_dir / "tansu.log")
    ksi: KsiProcess | None = None
    consumers: list[ConsumerThread] = []
    producers = Producers()
    try:
        topic = f"soak-{run_id}"
        table_name = f"history.soak_{run_id}"
        broker.create_topic(topic, partitions)
        (data_dir / "warehouse").mkdir(exist_ok=True)
        props = {"uri": f"sqlite:///{data_dir / 'catalog.db'}", "warehouse": f"file://{data_dir / 'warehouse'}"}
        catalog = SqlCatalog("lake", **props)
        if ("history",) not in catalog.list_namespaces():
            catalog.create_namespace("history")
        table = create_table(catalog, table_name)

        ledger = Ledger(partitions)
        # History to start with: seed records, archived and (noida) deleted from the broker.
        produce_sync(broker.bootstrap, topic, ledger, args.seed, args.value_bytes)
        archiver = Archiver(table, broker, topic, partitions, hot_keep=args.hot_keep, can_delete=broker.kind == "noida")
        archiver.round()

        ports = (free_port(), free_port(), free_port())
        config = data_dir / f"ksi-{run_id}.toml"
        config.write_text(ksi_config(*ports, broker, props, topic, table_name, prefer_lake=broker.kind == "tansu"))
        ksi = KsiProcess(config, data_dir / f"ksi-{run_id}.log", ports[0])
        ksi.start()
        say(f"ksi at {ksi.bootstrap} (log {ksi.log_path}); seed: {ledger.count()} records, lake up to "
            f"{archiver.lake_next}, log start {archiver.log_start}")

        everything = list(range(partitions))
        if broker.kind == "tansu" and partitions > 1:
            # tansu makes a record visible before an earlier one when two producers write one partition
            # at once, and consumers then skip the earlier one (measured without ksi): one producer per
            # partition there.
            shares = {"cf": (everything[0::2], args.rate * len(everything[0::2]) / partitions),
                      "kp": (everything[1::2], args.rate * len(everything[1::2]) / partitions)}
        else:
            shares = {"cf": (everything, args.rate / 2), "kp": (everything, args.rate / 2)}
        for label, kind in (("cf", "confluent"), ("kp", "kafka-python")):
            targets, rate = shares[label]
            producers.add(label, kind, ksi.bootstrap, topic, ledger, rate, args.value_bytes, partitions=targets)

        def consumer(name: str, kind: str, start: dict[int, int] | None, hook: Throttle | None = None
                     ) -> ConsumerThread:
            assert ksi is not None
            thread = ConsumerThread(name, kind, ksi.bootstrap, topic, partitions, start=start, hook=hook,
                                    small_fetches=hook is not None)
            consumers.append(thread)
            thread.start()
            return thread

        def tail() -> dict[int, int]:
            return {p: ledger.end(p) for p in range(partitions)}

        consumer("cold-group", "confluent-group", None, Throttle(args.cold_rate))
        consumer("cold-kp", "kafka-python", None, Throttle(args.cold_rate))
        consumer("hot-cf", "confluent", tail())
        consumer("hot-aio", "aiokafka", tail())

        started = time.monotonic()
        fault_at = started + args.seconds * args.fault_at
        late_at = fault_at - min(10.0, args.seconds * 0.1)  # a cold reader still in the lake when the fault lands
        next_archive = started + args.archive_every
        next_progress = started + args.progress_every
        faults: list[str] = []
        late_started = fault_done = False
        archiving: threading.Thread | None = None
        late_throttle = Throttle(args.cold_rate)
        while time.monotonic() - started < args.seconds:
            now = time.monotonic()
            workers: list[ProducerThread | ConsumerThread] = [*producers.threads, *consumers]
            for worker in workers:
                if worker.error is not None:
                    raise RuntimeError(f"{worker.name} failed: {worker.error!r}")
            if not late_started and now >= late_at:
                # Slow enough to be half way through the lake when the fault lands, full speed after it.
                late_throttle.set_rate(min(args.cold_rate, max(20.0, sum(archiver.lake_next) / 2 / (fault_at - now))))
                consumer("cold-late", "confluent", dict.fromkeys(range(partitions), 0), late_throttle)
                late_started = True
            if not fault_done and now >= fault_at and fault != "none":
                def positions() -> str:
                    return (f"lake < {archiver.lake_next}, consumer positions: "
                            + ", ".join(f"{c.label} {[t.position for t in c.traces]}" for c in consumers))

                faults.append(inject(fault, broker, ksi, producers, ledger, topic, archiver, args.outage, say,
                                     positions))
                late_throttle.set_rate(args.cold_rate)
                fault_done = True
            if now >= next_archive and (archiving is None or not archiving.is_alive()):
                archiving = threading.Thread(target=archiver.round, name="archiver", daemon=True)
                archiving.start()
                next_archive = now + args.archive_every
            if now >= next_progress:
                say(progress(now - started, ledger, archiver, consumers))
                next_progress = now + args.progress_every
            time.sleep(0.1)

        if archiving is not None:
            archiving.join()
        say("stopping the producers")
        producers.finish()
        end = [ledger.end(p) for p in range(partitions)]
        for thread in consumers:
            thread.finish(end)
        drain_deadline = time.monotonic() + args.drain_seconds
        while not all(t.finished.is_set() for t in consumers) and time.monotonic() < drain_deadline:
            time.sleep(0.5)
            if time.monotonic() >= next_progress:
                say(progress(time.monotonic() - started, ledger, archiver, consumers))
                next_progress = time.monotonic() + args.progress_every
        unfinished = [t.label for t in consumers if not t.finished.is_set()]
        for thread in consumers:
            thread.abort()
        for thread in consumers:
            thread.join(30)

        ok = report(say, ledger, consumers, end, unfinished, faults, archiver, ksi, producers)
        return 0 if ok else 1
    finally:
        producers.stop.set()
        producers.allowed.set()
        for thread in consumers:
            thread.abort()
        if ksi is not None:
            code = ksi.stop()
            if code != 0:
                say(f"ksi exited with code {code}")
        broker.stop()


def inject(fault: str, broker: BrokerProcess, ksi: KsiProcess | None, producers: Producers, ledger: Ledger,
           topic: str, archiver: Archiver, outage: float, say: Callable[[str], None],
           positions: Callable[[], str]) -> str:
    with archiver.lock:  # no archive round while the broker is down
        if fault == "broker":
            kill_broker(broker, producers, ledger, topic)
            producers.resume()  # producing through the outage, into the clients' queues
            say(f"FAULT: broker killed (kill -9) at ends {[ledger.end(p) for p in range(ledger.partitions)]}, "
                f"{positions()}; restarting it in {outage:g} s")
            time.sleep(outage)
            broker.start()
            say(f"broker back on {broker.bootstrap}")
            return f"broker kill -9, {outage:g} s down"
        assert ksi is not None
        producers.quiesce()  # an unanswered Produce would be retried: a duplicate without idempotence
        ksi.kill()
        producers.resume()
        say(f"FAULT: ksi killed (kill -9), {positions()}; restarting it in {outage:g} s")
        time.sleep(outage)
        ksi.start()
        say("ksi back")
        return f"ksi kill -9, {outage:g} s down"


def progress(elapsed: float, ledger: Ledger, archiver: Archiver, consumers: list[ConsumerThread]) -> str:
    ends = [ledger.end(p) for p in range(ledger.partitions)]
    parts = [f"t={elapsed:5.0f}s produced {ledger.count()} ends {ends} lake<{archiver.lake_next} "
             f"log start {archiver.log_start}"]
    for c in consumers:
        behind = sum(max(0, e - max(t.position, 0)) for e, t in zip(ends, c.traces, strict=True))
        parts.append(f"{c.label} {c.consumed()} (behind {behind})")
    return " | ".join(parts)


class Printer:
    def __call__(self, text: str) -> None:
        print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)
        log.info("%s", text)


def report(say: Callable[[str], None], ledger: Ledger, consumers: list[ConsumerThread], end: list[int],
           unfinished: list[str], faults: list[str], archiver: Archiver, ksi: KsiProcess | None,
           producers: Producers) -> bool:
    ok = True
    header = (f"{'partition':>9} {'consumer':<11} {'start':>6} {'end':>7} {'produced':>8} {'consumed':>8} "
              f"{'lost':>5} {'skipped':>7} {'dup':>4} {'replayed':>8} {'bad':>4}")
    lines = [header, "-" * len(header)]
    totals: dict[str, Verdict] = {}
    problems: list[str] = []
    for p in range(ledger.partitions):
        expected = ledger.acked[p]
        missing_acks = end[p] - len(expected)
        if missing_acks:
            ok = False
            problems.append(f"partition {p}: {missing_acks} offsets below {end[p]} were never acknowledged to a "
                            "producer (the broker lost or added records)")
        for c in consumers:
            start = c.expected_start(p)
            start = 0 if start is None else start
            v = verify(c.traces[p], start, end[p], expected, group=c.kind == "confluent-group")
            t = totals.setdefault(c.label, Verdict())
            for name in ("consumed", "lost", "skipped", "dup", "replayed", "bad", "outside"):
                setattr(t, name, getattr(t, name) + getattr(v, name))
            lines.append(f"{p:>9} {c.label:<11} {start:>6} {end[p]:>7} {end[p] - start:>8} {v.consumed:>8} "
                         f"{v.lost:>5} {v.skipped:>7} {v.dup:>4} {v.replayed:>8} {v.bad:>4}")
            if not v.ok:
                ok = False
                problems.append(f"partition {p} {c.label}: {v.first_problem}")
    lines.append("-" * len(header))
    for label, t in totals.items():
        lines.append(f"{'all':>9} {label:<11} {'':>6} {'':>7} {'':>8} {t.consumed:>8} {t.lost:>5} {t.skipped:>7} "
                     f"{t.dup:>4} {t.replayed:>8} {t.bad:>4}")
    say("final table:\n" + "\n".join(lines))
    log_text = ksi.log_text() if ksi is not None else ""
    tracebacks = log_text.count("Traceback")
    gaps = log_text.count("are in neither the lake nor Kafka")
    say(f"produced {ledger.count()} records ({sum(t.sent for t in producers.threads)} by the soak producers), "
        f"failed deliveries {len(ledger.failed)}; faults: {', '.join(faults) or 'none'}; archiver: "
        f"{archiver.rounds} rounds, {archiver.rows} rows to the lake, {archiver.failures} failed rounds; lake "
        f"< {archiver.lake_next}, log start {archiver.log_start}")
    say("consumers: " + "; ".join(f"{c.label}: {c.assignments} assignment(s), {c.commit_failures} failed commits, "
                                  f"{len(c.errors)} client errors" if c.kind == "confluent-group"
                                  else f"{c.label}: {len(c.errors)} client errors" for c in consumers))
    say(f"ksi log: {tracebacks} tracebacks, {gaps} gap reports (false alarms unless records were lost), "
        f"{log_text.count('closing the client connection so it reconnects')} client connections closed for an "
        f"upstream error, {log_text.count('cluster discovery failed')} discovery failures, "
        f"{log_text.count('cluster reachable again')} recoveries")
    if ledger.failed:
        ok = False
        problems.append(f"{len(ledger.failed)} deliveries failed, e.g. {ledger.failed[0]}")
    if ledger.twice:
        ok = False
        problems.append(f"offsets acknowledged twice: {ledger.twice[:5]}")
    if unfinished:
        ok = False
        problems.append(f"consumers that did not reach the end: {', '.join(unfinished)}")
    if tracebacks:
        ok = False
        problems.append(f"ksi logged {tracebacks} traceback(s): see {ksi.log_path if ksi else '?'}")
    for problem in problems:
        say(f"PROBLEM: {problem}")
    say("RESULT: " + ("OK: nothing lost, nothing duplicated" if ok else "FAILED"))
    return ok


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="soak.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Progress goes to stdout; the soak's own log (clients included), the broker's and ksi's logs "
               "and config stay in --data-dir.")
    parser.add_argument("--seconds", type=float, default=300, help="how long the producers run (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the soak topic (default %(default)s)")
    parser.add_argument("--broker", choices=("noida", "tansu"), default="noida",
                        help="the broker to start (default %(default)s)")
    parser.add_argument("--data-dir", default=None,
                        help="where the broker, catalog, warehouse and logs live (default: a new temporary "
                             "directory, printed at the start)")
    parser.add_argument("--rate", type=float, default=400,
                        help="records per second, all producers together (default %(default)s)")
    parser.add_argument("--value-bytes", type=int, default=200, help="value size in bytes (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1000,
                        help="records per partition produced before ksi starts; the archiver's first round "
                             "puts all but --hot-keep of them in the lake (default %(default)s)")
    parser.add_argument("--cold-rate", type=float, default=800,
                        help="records per second a cold consumer takes, so it spends a while in the lake "
                             "(default %(default)s)")
    parser.add_argument("--archive-every", type=float, default=10,
                        help="seconds between archive rounds (default %(default)s)")
    parser.add_argument("--hot-keep", type=int, default=300,
                        help="offsets per partition an archive round leaves in the broker only (default %(default)s)")
    parser.add_argument("--fault", choices=("broker", "proxy", "none"), default=None,
                        help="broker: kill -9 the broker and start it again; proxy: kill -9 ksi and start it "
                             "again; none (default: broker on noida, proxy on tansu)")
    parser.add_argument("--fault-at", type=float, default=0.5,
                        help="when to inject the fault, as a fraction of --seconds (default %(default)s)")
    parser.add_argument("--outage", type=float, default=5,
                        help="seconds the killed process stays down (default %(default)s)")
    parser.add_argument("--progress-every", type=float, default=5,
                        help="seconds between progress lines (default %(default)s)")
    parser.add_argument("--drain-seconds", type=float, default=120,
                        help="how long the consumers get to reach the end once the producers stop "
                             "(default %(default)s)")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.partitions < 1 or args.rate <= 0 or not 0 < args.fault_at < 1:
        parser.error("--seconds, --partitions and --rate must be positive and --fault-at in (0, 1)")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_soak(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
