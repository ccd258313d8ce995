"""The producer threads (confluent-kafka and kafka-python, acks=all), with the quiesce switch the faults
use, and a synchronous seed producer."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .records import Ledger, digest, make_record

__all__ = ["ProducerThread", "Producers", "produce_sync"]

log = logging.getLogger("soak")


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
