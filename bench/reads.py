"""Reads the benchmark times: one consumer reading a topic whole, several at once, and a seek.

Every consumer uses the same confluent-kafka settings (CONSUMER_CONFIG).  A read that makes no progress for
STALL_SECONDS gives up and says so.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition

from harness import MAX_FRAME_BYTES

__all__ = ["CONSUMER_CONFIG", "SAMPLE_EVERY", "Read", "read_all", "Concurrent", "read_concurrently", "seek_seconds"]

CONSUMER_CONFIG: dict[str, Any] = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "fetch.queue.backoff.ms": 10,  # librdkafka's default (1000) makes a replay ~6x slower
    "receive.message.max.bytes": MAX_FRAME_BYTES,
    "fetch.max.bytes": 52_428_800,
    "max.partition.fetch.bytes": 1_048_576,
}
STALL_SECONDS = 60.0
SAMPLE_EVERY = 97  # concurrent reads check the value of every 97th offset


def consumer(bootstrap: str, **extra: Any) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.monotonic_ns()}-{threading.get_ident()}",
                     **CONSUMER_CONFIG, **extra})


@dataclass
class Read:
    records: int
    seconds: float
    first_record_seconds: float
    messages: list[Message] = field(default_factory=list, repr=False)
    errors: list[str] = field(default_factory=list)
    stalled: bool = False


def read_all(bootstrap: str, topic: str, partitions: int, records: int, keep: bool = True) -> Read:
    """Every record of ``topic`` from offset 0 (kept for checking when ``keep``); timed from assign to the last."""
    c = consumer(bootstrap)
    messages: list[Message] = []
    errors: list[str] = []
    got = 0
    try:
        c.list_topics(topic, timeout=30)  # bootstrap connection and metadata before the clock starts
        start = time.perf_counter()
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        first = None
        last_progress = start
        stalled = False
        while got < records:
            batch = c.consume(10_000, timeout=0.5)
            now = time.perf_counter()
            if batch:
                good = [m for m in batch if m.error() is None]
                if len(good) != len(batch):
                    errors += [str(m.error()) for m in batch if m.error() is not None][:5]
                if good:
                    got += len(good)
                    if keep:
                        messages += good
                    last_progress = now
                    if first is None:
                        first = now - start
            elif now - last_progress > STALL_SECONDS:
                stalled = True
                break
        elapsed = (last_progress if stalled else time.perf_counter()) - start
    finally:
        c.close()
    return Read(got, elapsed, first or float("nan"), messages, errors, stalled)


@dataclass
class Concurrent:
    consumers: int
    records: int              # all consumers together
    seconds: float
    problems: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


def read_concurrently(bootstrap: str, topic: str, partitions: int, consumers: int, seconds: float,
                      values: dict[int, dict[int, bytes]] | None = None, warmup: float = 2.0) -> Concurrent:
    """``consumers`` consumers each read ``topic`` from offset 0 at once; the records all of them read in a
    window of ``seconds`` after a warm-up, over its length.  Each checks its own records: offsets contiguous
    from 0 per partition (no gap, no duplicate) and, for a sample, the value (``values``: per partition, the
    value of every SAMPLE_EVERY-th offset)."""
    problems: list[str] = []
    ready = threading.Barrier(consumers + 1)
    clock: dict[str, float] = {}
    counted = [0] * consumers

    def run(n: int) -> None:
        c = consumer(bootstrap)
        try:
            c.list_topics(topic, timeout=30)
            ready.wait()
            c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
            expect = [0] * partitions
            total, base, counting = 0, 0, False
            while (now := time.perf_counter()) < clock["end"]:
                if not counting and now >= clock["start"]:
                    base, counting = total, True
                for m in c.consume(10_000, timeout=0.2):
                    if m.error() is not None:
                        problems.append(f"consumer {n}: {m.error()}")
                        continue
                    p, o = m.partition(), m.offset()
                    if o != expect[p]:
                        problems.append(f"consumer {n}: partition {p} offset {o}, expected {expect[p]}")
                    expect[p] = o + 1
                    if values is not None and o % SAMPLE_EVERY == 0 and m.value() != values[p].get(o):
                        problems.append(f"consumer {n}: partition {p} offset {o}: wrong value")
                    total += 1
            counted[n] = total - base
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(consumers)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # let every consumer connect and learn the cluster; the barrier starts them together
    begin = time.perf_counter() + 0.5
    clock["start"], clock["end"] = begin + warmup, begin + warmup + seconds
    ready.wait()
    for t in threads:
        t.join(seconds + warmup + 60)
    return Concurrent(consumers, sum(counted), seconds, problems[:10])


def seek_seconds(bootstrap: str, topic: str, targets: list[tuple[int, int]]) -> list[float]:
    """Time from assigning (partition, offset) to the first record, for each target, on one consumer that
    already knows the cluster (so a seek, not a connection, is timed)."""
    c = consumer(bootstrap)
    out = []
    try:
        c.list_topics(topic, timeout=30)
        for partition, offset in targets:
            start = time.perf_counter()
            c.assign([TopicPartition(topic, partition, offset)])
            while True:
                batch = c.consume(1, timeout=1.0)
                if batch and batch[0].error() is None:
                    if batch[0].offset() != offset:
                        raise SystemExit(f"seek to {topic}/{partition}@{offset} gave offset {batch[0].offset()}")
                    break
                if time.perf_counter() - start > STALL_SECONDS:
                    raise SystemExit(f"seek to {topic}/{partition}@{offset}: no record in {STALL_SECONDS:.0f} s")
            out.append(time.perf_counter() - start)
            c.unassign()
    finally:
        c.close()
    return out
