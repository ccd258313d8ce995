"""Reads the benchmark times: one consumer reading a topic whole, several at once, and a seek.

Every consumer uses the same confluent-kafka settings (CONSUMER_CONFIG).  A read that makes no progress for
STALL_SECONDS gives up and says so.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition

from harness import MAX_FRAME_BYTES

__all__ = [
    "CONSUMER_CONFIG", "SAMPLE_EVERY", "Concurrent", "Read", "lake_ready", "read_all", "read_concurrently",
    "seek_seconds",
]

CONSUMER_CONFIG: dict[str, Any] = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "fetch.queue.backoff.ms": 10,  # librdkafka's default (1000) makes a replay ~6x slower
    "receive.message.max.bytes": MAX_FRAME_BYTES,
    "fetch.max.bytes": 52_428_800,
    "max.partition.fetch.bytes": 1_048_576,
}
# The same fetch sizes for the Java consumer (bench/java/JavaReadAll.java; its other settings are its defaults)
JAVA_CONFIG: dict[str, Any] = {k: CONSUMER_CONFIG[k] for k in ("fetch.max.bytes", "max.partition.fetch.bytes")}
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
    client_cores: float = 0.0  # CPU this process (the consumer and librdkafka's threads) used over the read
    thread_cores: float = 0.0  # ... of which the consumer's own thread (the one calling consume())
    idle_cores: float | None = None  # the machine's idle CPU over the read (/proc/stat), in cores


def read_all(bootstrap: str, topic: str, partitions: int, records: int, keep: bool = True) -> Read:
    """Every record of ``topic`` from offset 0 (kept for checking when ``keep``); timed from assign to the last."""
    c = consumer(bootstrap)
    messages: list[Message] = []
    errors: list[str] = []
    got = 0
    try:
        c.list_topics(topic, timeout=30)  # bootstrap connection and metadata before the clock starts
        # The messages kept for checking would make Python's cyclic collector walk a list of up to millions of
        # objects again and again: the collector waits until the read is over (what a consumer that keeps
        # nothing would cost; measured on one ksi, warm: 1.26M records/s with it off, 0.56M with it on).
        collecting = gc.isenabled()
        gc.disable()
        jiffies = _cpu_jiffies()
        start, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
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
        span = max(time.perf_counter() - start, 1e-9)
        cores, thread = (time.process_time() - cpu) / span, (time.thread_time() - own) / span
        idle = _idle_between(jiffies, _cpu_jiffies())
    finally:
        if collecting:
            gc.enable()
        c.close()
    return Read(got, elapsed, first or float("nan"), messages, errors, stalled, cores, thread, idle)


@dataclass
class Concurrent:
    consumers: int
    records: int              # all consumers together
    seconds: float
    problems: list[str] = field(default_factory=list)
    client_cores: float = 0.0  # CPU the consumers used over the counted window, in cores
    idle_cores: float | None = None  # the machine's idle CPU over the counted window, in cores (/proc/stat)

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


def _concurrent_consumer(n: int, bootstrap: str, topic: str, partitions: int, start: float, end: float,
                         records: int | None, values: dict[int, dict[int, bytes]] | None,
                         out: Any) -> None:
    """One consumer of :func:`read_concurrently`, in a process of its own; puts (n, counted, finished,
    cpu seconds in the counted window, problems) on ``out``.  ``start`` and ``end`` are ``time.time()``
    values."""
    problems: list[str] = []
    total, base, counting, finished = 0, 0, False, 0.0
    counted_cpu = 0.0
    # Nothing is kept, so Python's cyclic collector has nothing to find; left on, it ran at every few hundred
    # Message objects a consume() made and took 39% of a consumer's CPU (py-spy --native, 8 consumers of
    # ksi): the figures were the collector's.  read_all turns it off for the same reason.
    gc.disable()
    cpu = 0.0
    c = consumer(bootstrap)
    try:
        c.list_topics(topic, timeout=30)
        time.sleep(max(0.0, start - 2.0 - time.time()))  # every consumer assigns at once, 2 s of warm-up
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        expect = [0] * partitions
        while (now := time.time()) < end:
            if not counting and now >= start:
                base, counting, cpu = total, True, time.process_time()
            if records is not None and total >= records:
                finished = now
                break
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
    except Exception as exc:  # noqa: BLE001 - reported with the figures
        problems.append(f"consumer {n}: {type(exc).__name__}: {exc}")
    finally:
        if counting:
            counted_cpu = time.process_time() - cpu
        c.close()
    out.put((n, total - base if counting else 0, finished, counted_cpu, problems[:10]))


def read_concurrently(bootstrap: str, topic: str, partitions: int, consumers: int, seconds: float,
                      values: dict[int, dict[int, bytes]] | None = None, warmup: float = 2.0,
                      records: int | None = None, mark: Callable[[], None] | None = None) -> Concurrent:
    """``consumers`` consumers, each a process of its own (as separate applications are: one Python process
    cannot consume for eight), each read ``topic`` from offset 0 at once; the records all of them read in a
    window of ``seconds`` after a ``warmup``, over the window's length (or, when every consumer has read all
    ``records`` before it ends, up to when the last one did).  Each checks its own records: offsets contiguous
    from 0 per partition (no gap, no duplicate) and, for a sample, the value (``values``: per partition, the
    value of every SAMPLE_EVERY-th offset).  Also measured: the CPU the consumers used, in cores.  ``mark`` is
    called when the counted window starts and when it ends, so the server's CPU can be taken over the same
    records as the rate (not over the consumers' start-up, about 5 s in which the server idles, nor the
    warm-up, whose records are not counted); consumers that read everything before the end leave the server
    idle after, so its CPU over the window, divided by the rate's seconds, is still its cores while reading.
    The consumers' CPU and the machine's idle CPU (so a read that leaves CPU unused says so) are taken over
    the same seconds as the rate."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start = time.time() + 5.0 + warmup  # time for every process to start and connect
    end = start + seconds
    procs = [context.Process(target=_concurrent_consumer, daemon=True,
                             args=(n, bootstrap, topic, partitions, start, end, records, values, out))
             for n in range(consumers)]
    # Started before the consumers are: starting them takes seconds (each reads its arguments).
    marks = [threading.Timer(max(0.0, t - time.time()), mark) for t in (start, end)] if mark is not None else []
    for timer in marks:
        timer.start()
    cpu_samples: list[tuple[float, int, int]] = []  # (time, idle jiffies, all jiffies), every 0.25 s
    sampling = threading.Event()

    def sample_cpu() -> None:
        while not sampling.wait(0.25):
            cpu_samples.append((time.time(), *_cpu_jiffies()))

    sampler = threading.Thread(target=sample_cpu, daemon=True)
    sampler.start()
    for proc in procs:
        proc.start()
    results = []
    problems: list[str] = []
    for _ in procs:
        try:
            results.append(out.get(timeout=end - time.time() + 90))
        except queue.Empty:
            problems.append("a consumer process did not report")
            break
    for timer in marks:
        timer.join()
    sampling.set()
    sampler.join()
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    counted = sum(r[1] for r in results)
    finished = [r[2] for r in results]
    for r in results:
        problems += r[4]
    span = seconds
    if len(results) == consumers and all(finished):
        span = max(max(finished) - start, 1e-3)
        if min(finished) < start:
            problems.append("a consumer read everything during the warm-up: use more records or fewer seconds")
    return Concurrent(consumers, counted, span, problems[:10], sum(r[3] for r in results) / span,
                      _idle_cores(cpu_samples, start, start + span))


def _cpu_jiffies() -> tuple[int, int]:
    """The machine's idle (idle + iowait) and total CPU time so far, in jiffies (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields[:8])  # user nice system idle iowait irq softirq steal


def _idle_cores(samples: list[tuple[float, int, int]], start: float, end: float) -> float | None:
    """Idle cores between the samples nearest ``start`` and ``end``."""
    inside = [s for s in samples if start - 0.25 <= s[0] <= end + 0.25]
    return _idle_between(inside[0][1:], inside[-1][1:]) if len(inside) >= 2 else None


def _idle_between(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """Idle cores between two :func:`_cpu_jiffies` readings (None when no jiffy passed)."""
    if after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1)  # /proc/stat sums every CPU


def lake_ready(bootstrap: str, topic: str, partitions: int, first: int = 0, timeout: float = 120.0) -> float:
    """Wait until ksi answers each partition's low watermark from the lake (``first``: the table planned and
    the catalog loaded; nothing is read, so the cache stays cold); the seconds it took."""
    started = time.perf_counter()
    c = consumer(bootstrap)
    try:
        for p in range(partitions):
            while c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[0] != first:
                if time.perf_counter() - started > timeout:
                    raise SystemExit(f"{topic}/{p}: ksi did not answer from the lake within {timeout:.0f} s")
                time.sleep(0.05)
    finally:
        c.close()
    return time.perf_counter() - started


def seek_seconds(bootstrap: str, topic: str, targets: list[tuple[int, int]], settle: float = 0.0) -> list[float]:
    """Time from assigning (partition, offset) to the first record, for each target, on one consumer that
    already knows the cluster (so a seek, not a connection, is timed).  ``settle``: seconds to wait before
    each seek, so that the fetch the consumer had in flight for the seek before has come back (librdkafka
    sends a broker one Fetch at a time: a seek waits for the one in flight)."""
    c = consumer(bootstrap)
    out = []
    try:
        c.list_topics(topic, timeout=30)
        for partition, offset in targets:
            time.sleep(settle)
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
