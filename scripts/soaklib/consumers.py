"""The consumer threads through ksi, each recording every record it gets, and the throttle that keeps
cold consumers in the lake for a while."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .records import digest, signed64

__all__ = ["RECEIVE_MESSAGE_MAX_BYTES", "SESSION_TIMEOUT_MS", "ConsumerThread", "Throttle", "Trace"]

log = logging.getLogger("soak")

RECEIVE_MESSAGE_MAX_BYTES = 1_000_000_000  # noida ignores fetch size limits: librdkafka must take whole partitions
SESSION_TIMEOUT_MS = 6000                  # tansu holds a JoinGroup for session.timeout/2


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
        self.traces[partition].add(offset, signed64(digest(key, value, headers, ts)))

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
