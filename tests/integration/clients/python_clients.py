"""The in-process drivers: confluent-kafka (librdkafka), kafka-python 3 and aiokafka."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from clients import (
    CONSUME_TIMEOUT_S,
    FETCH_MAX_WAIT_MS,
    HEARTBEAT_INTERVAL_MS,
    INSTALL_HINT,
    RECEIVE_MESSAGE_MAX_BYTES,
    SESSION_TIMEOUT_MS,
    Client,
    ClientMissing,
    Consumed,
    Record,
)

__all__ = ["AiokafkaClient", "ConfluentClient", "KafkaPythonClient", "librdkafka_config", "make"]


def make(name: str, broker_kind: str) -> Client:
    module = {"confluent-kafka": "confluent_kafka", "kafka-python": "kafka", "aiokafka": "aiokafka"}[name]
    try:
        __import__(module)
    except ImportError as exc:
        raise ClientMissing(f"Python package for {name} is not importable ({exc}): {INSTALL_HINT}") from exc
    drivers: dict[str, type[Any]] = {
        "confluent-kafka": ConfluentClient,
        "kafka-python": KafkaPythonClient,
        "aiokafka": AiokafkaClient,
    }
    client: Client = drivers[name](broker_kind)
    return client


def _timed_out(name: str, got: int, count: int, topic: str) -> AssertionError:
    return AssertionError(f"{name}: consumed {got} of {count} records from {topic} in {CONSUME_TIMEOUT_S:.0f} s")


def librdkafka_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    """Base librdkafka settings for loopback tests (also used by the admin and idempotence tests)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES,
        "socket.timeout.ms": 10000,
        "reconnect.backoff.max.ms": 500,
    }
    config.update(extra)
    return config


class ConfluentClient:
    name = "confluent-kafka"
    text_only = False

    def __init__(self, broker_kind: str) -> None:
        self.broker_kind = broker_kind

    def produce(self, bootstrap: str, topic: str, records: Sequence[Record]) -> None:
        from confluent_kafka import Producer

        errors: list[str] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        producer = Producer(librdkafka_config(bootstrap, **{"linger.ms": 5, "message.timeout.ms": 20000}))
        for r in records:
            producer.produce(topic, value=r.value, key=r.key, headers=list(r.headers), on_delivery=on_delivery)
        remaining = producer.flush(30)
        assert remaining == 0 and not errors, f"confluent-kafka: {remaining} undelivered, errors {errors[:3]}"

    def consume(self, bootstrap: str, topic: str, group: str, count: int) -> list[Consumed]:
        from confluent_kafka import Consumer

        consumer = Consumer(librdkafka_config(
            bootstrap,
            **{
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                "fetch.wait.max.ms": FETCH_MAX_WAIT_MS,
                "fetch.queue.backoff.ms": 10,  # the default (1 s) makes librdkafka 6x slower here
            },
        ))
        out: list[Consumed] = []
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            while len(out) < count:
                if time.monotonic() > deadline:
                    raise _timed_out(self.name, len(out), count, topic)
                for msg in consumer.consume(num_messages=count - len(out), timeout=0.5):
                    if msg.error():
                        raise AssertionError(f"confluent-kafka consume error: {msg.error()}")
                    out.append(_from_confluent(msg))
            consumer.commit(asynchronous=False)
        finally:
            consumer.close()
        return out

    def topics(self, bootstrap: str) -> dict[str, int]:
        from confluent_kafka.admin import AdminClient

        metadata = AdminClient(librdkafka_config(bootstrap)).list_topics(timeout=10)
        return {name: len(t.partitions) for name, t in metadata.topics.items()}


def _from_confluent(msg: Any) -> Consumed:
    key, value, partition, offset = msg.key(), msg.value(), msg.partition(), msg.offset()
    assert isinstance(value, bytes) and partition is not None and offset is not None, msg
    headers = tuple((name, data or b"") for name, data in (msg.headers() or []))
    return Consumed(Record(key, value, headers), partition, offset)


class KafkaPythonClient:
    name = "kafka-python"
    text_only = False

    def __init__(self, broker_kind: str) -> None:
        self.broker_kind = broker_kind

    def produce(self, bootstrap: str, topic: str, records: Sequence[Record]) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, request_timeout_ms=15000)
        try:
            futures = [producer.send(topic, key=r.key, value=r.value, headers=list(r.headers)) for r in records]
            producer.flush(timeout=30)
            for future in futures:
                future.get(timeout=1)
        finally:
            producer.close(timeout=5)

    def consume(self, bootstrap: str, topic: str, group: str, count: int) -> list[Consumed]:
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            request_timeout_ms=15000,
        )
        out: list[Consumed] = []
        try:
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            while len(out) < count:
                if time.monotonic() > deadline:
                    raise _timed_out(self.name, len(out), count, topic)
                for batch in consumer.poll(timeout_ms=500, max_records=count - len(out)).values():
                    for msg in batch:
                        headers = tuple((k, v) for k, v in msg.headers)
                        out.append(Consumed(Record(msg.key, msg.value, headers), msg.partition, msg.offset))
            consumer.commit()
        finally:
            consumer.close(autocommit=False)
        return out

    def topics(self, bootstrap: str) -> dict[str, int]:
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=15000)
        try:
            names = consumer.topics()
            return {name: len(consumer.partitions_for_topic(name) or ()) for name in names}
        finally:
            consumer.close()


class AiokafkaClient:
    name = "aiokafka"
    text_only = False

    def __init__(self, broker_kind: str) -> None:
        self.broker_kind = broker_kind
        # tansu's idempotent-producer support trips aiokafka; the other brokers take it
        self.idempotent = broker_kind != "tansu"

    def produce(self, bootstrap: str, topic: str, records: Sequence[Record]) -> None:
        asyncio.run(self._produce(bootstrap, topic, records))

    async def _produce(self, bootstrap: str, topic: str, records: Sequence[Record]) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=self.idempotent,
            acks="all" if self.idempotent else 1,
            linger_ms=5,
            request_timeout_ms=15000,
        )
        await producer.start()
        try:
            futures = [
                await producer.send(topic, key=r.key, value=r.value, headers=list(r.headers)) for r in records
            ]
            await producer.flush()
            for future in futures:
                await asyncio.wait_for(future, 10)
        finally:
            await producer.stop()

    def consume(self, bootstrap: str, topic: str, group: str, count: int) -> list[Consumed]:
        return asyncio.run(self._consume(bootstrap, topic, group, count))

    async def _consume(self, bootstrap: str, topic: str, group: str, count: int) -> list[Consumed]:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            request_timeout_ms=15000,
        )
        await consumer.start()
        out: list[Consumed] = []
        try:
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            while len(out) < count:
                if time.monotonic() > deadline:
                    raise _timed_out(self.name, len(out), count, topic)
                batches = await consumer.getmany(timeout_ms=500, max_records=count - len(out))
                for batch in batches.values():
                    for msg in batch:
                        headers = tuple((k, v) for k, v in msg.headers)
                        out.append(Consumed(Record(msg.key, msg.value, headers), msg.partition, msg.offset))
            await consumer.commit()
        finally:
            await consumer.stop()
        return out

    def topics(self, bootstrap: str) -> dict[str, int]:
        return asyncio.run(self._topics(bootstrap))

    async def _topics(self, bootstrap: str) -> dict[str, int]:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=15000)
        await consumer.start()
        try:
            names = await consumer.topics()
            return {name: len(consumer.partitions_for_topic(name) or ()) for name in names}
        finally:
            await consumer.stop()
