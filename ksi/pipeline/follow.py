"""``ksi archive --follow``: archive continuously, committing every interval, exactly once.

A loop of micro-batches over one engine (one pool of local workers, or one Spark application): every
``archive.interval_seconds`` each topic is archived up to its current last stable offset with
:func:`ksi.pipeline.archive.archive_topic`, the very code of a one-off run.  So exactly-once is the same
argument: each commit carries its offsets in the snapshot that adds its data, a commit is refused when
anything else committed offsets first, and a process killed at any point (kill -9 included) leaves
either nothing or whole commits; the next start continues from the last one.

Why not Structured Streaming: Spark's Kafka source needs the ``spark-sql-kafka`` jar (not installable
here, and a second Kafka client beside the one the tasks already use), its offsets live in a checkpoint
directory beside the table (two sources of truth to keep in step with the snapshot summary), and it
adds nothing a micro-batch loop over the same commit protocol lacks.

While it waits for the next round, the loop measures how far the lake is behind the log, per partition,
the way ``ksi status`` does: records = high watermark - lake's next offset (the archived offsets, so a
transaction's trailing commit marker is no lag); seconds = now - timestamp of the first record not yet
archived (0 when there are no records behind; unknown, NaN, when records are behind but none could be read
in time).  Both are Prometheus gauges
(``ksi_archive_lag_records``, ``ksi_archive_lag_seconds``) on ``--metrics-port``, and each round prints
one progress line.  SIGINT/SIGTERM end the loop after the round in progress.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import TopicConfig
from .settings import PipelineConfig

__all__ = ["Follower", "LagProbe", "follow_main", "parse_listen"]

Say = Callable[[str], None]


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``PORT`` (then 127.0.0.1)."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host = "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--metrics-port: must be PORT or HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


class LagProbe:
    """The lake's lag behind the log per partition (see the module docstring), from one small consumer.

    The timestamp of the first unarchived record is fetched once per lake offset (records never change),
    so between commits a sample costs one ListOffsets per partition."""

    def __init__(self, bootstrap: str, timeout: float = 2.0, extra: dict[str, str] | None = None) -> None:
        from confluent_kafka import Consumer

        self.timeout = timeout
        # read_uncommitted: a record of a transaction still open is not archived yet either, and its age is
        # how far the lake is behind (a read_committed probe would wait for records it cannot see)
        self._consumer = Consumer({
            **(extra or {}),
            "bootstrap.servers": bootstrap, "group.id": "ksi-archive-lag", "enable.auto.commit": False,
            "isolation.level": "read_uncommitted", "enable.partition.eof": False, "queued.min.messages": 1,
            # below the log start (retention passed the archive) the first record there is is the oldest behind
            "auto.offset.reset": "earliest",
            "fetch.queue.backoff.ms": 10, "receive.message.max.bytes": 1_000_000_000, "log_level": 3})
        self._first: dict[tuple[str, int, int], float] = {}  # (topic, partition, offset) -> timestamp s
        self._missing: dict[tuple[str, int, int], float] = {}  # probes that found nothing -> when

    def high_watermark(self, topic: str, partition: int) -> int:
        from confluent_kafka import TopicPartition

        return int(self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self.timeout,
                                                        cached=False)[1])

    def first_timestamp(self, topic: str, partition: int, offset: int) -> float | None:
        """Timestamp (Unix seconds) of the first record at or after ``offset``; None if none arrives."""
        from confluent_kafka import TopicPartition

        key = (topic, partition, offset)
        if key in self._first:
            return self._first[key]
        if time.monotonic() - self._missing.get(key, -1e9) < 10.0:  # nothing there a moment ago: do not wait again
            return None
        self._consumer.assign([TopicPartition(topic, partition, offset)])
        found: float | None = None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            message = self._consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            kind, ts = message.timestamp()
            found = ts / 1000.0 if kind else time.time()
            break
        self._consumer.unassign()
        if found is None:
            self._missing[key] = time.monotonic()
        else:
            self._first = {k: v for k, v in self._first.items() if k[:2] != (topic, partition)}
            self._first[key] = found
        return found

    def lag(self, topic: str, partition: int, lake_next: int) -> tuple[int, float]:
        """(records, seconds) the lake is behind ``topic``/``partition``; seconds is NaN (unknown) when records
        are behind but the first of them could not be read in time, never 0 (that would say "caught up")."""
        high = self.high_watermark(topic, partition)
        records = max(0, high - lake_next)
        if records == 0:
            return 0, 0.0
        ts = self.first_timestamp(topic, partition, lake_next)
        return records, max(0.0, time.time() - ts) if ts is not None else math.nan

    def close(self) -> None:
        self._consumer.close()


@dataclass
class Follower:
    """The loop; ``stop`` ends it after the round in progress."""

    pipeline: PipelineConfig
    topics: list[TopicConfig]
    engine: Any
    say: Say
    stop: threading.Event = field(default_factory=threading.Event)
    lake_next: dict[str, dict[int, int]] = field(default_factory=dict)
    rounds: int = 0
    failures: int = 0

    def run(self, max_rounds: int | None = None) -> None:
        from .. import metrics

        bootstrap = ",".join(map(str, self.pipeline.config.upstream.bootstrap_servers))
        probe = LagProbe(bootstrap, extra=self.pipeline.archive.consumer)
        interval = self.pipeline.archive.interval_seconds
        try:
            while not self.stop.is_set():
                began = time.monotonic()
                for topic in self.topics:
                    if self.stop.is_set():
                        break
                    self._round(topic, probe, metrics)
                self.rounds += 1
                if max_rounds is not None and self.rounds >= max_rounds:
                    break
                # sample the lag while waiting for the next round
                while not self.stop.wait(max(0.0, min(1.0, began + interval - time.monotonic()))):
                    if time.monotonic() >= began + interval:
                        break
                    self._sample(probe, metrics)
        finally:
            probe.close()

    def _round(self, topic: TopicConfig, probe: LagProbe, metrics: Any) -> None:
        from .archive import archive_topic

        started = time.monotonic()
        try:
            result = archive_topic(self.engine, self.pipeline, topic, verbose=False)
        except Exception as exc:  # noqa: BLE001 - the broker, catalog or registry is away: log, count, try again next round
            self.failures += 1
            metrics.ARCHIVE_ERRORS.labels(topic.name).inc()
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            self.say(f"follow: {topic.name}: round failed ({type(exc).__name__}: {first}); retrying in "
                     f"{self.pipeline.archive.interval_seconds:g} s")
            return
        seconds = time.monotonic() - started
        metrics.ARCHIVE_COMMIT_SECONDS.labels(topic.name).observe(seconds)
        self.lake_next[topic.name] = {r.partition: r.stop for r in result.ranges}
        if not result.up_to_date:
            metrics.ARCHIVE_RECORDS.labels(topic.name).inc(result.rows)
            metrics.ARCHIVE_COMMITS.labels(topic.name).inc()
            metrics.ARCHIVE_LAST_COMMIT.labels(topic.name).set(time.time())
        records, behind = self._sample_topic(topic.name, probe, metrics)
        done = (f"+{result.rows:,} records in {result.files} files, snapshot {result.snapshot_id}"
                if not result.up_to_date else "nothing new")
        self.say(f"follow: {topic.name}: {done} ({seconds:.1f} s); lag {records:,} records, "
                 f"{'? s (the first record behind not read yet)' if math.isnan(behind) else f'{behind:.1f} s'}")

    def _sample(self, probe: LagProbe, metrics: Any) -> None:
        for name in list(self.lake_next):
            with contextlib.suppress(Exception):  # a sample is best effort; the next round reports real failures
                self._sample_topic(name, probe, metrics)

    def _sample_topic(self, name: str, probe: LagProbe, metrics: Any) -> tuple[int, float]:
        total, worst, unknown = 0, 0.0, False
        for partition, lake_next in sorted(self.lake_next.get(name, {}).items()):
            records, seconds = probe.lag(name, partition, lake_next)
            metrics.ARCHIVE_LAG_RECORDS.labels(name, str(partition)).set(records)
            metrics.ARCHIVE_LAG_SECONDS.labels(name, str(partition)).set(seconds)
            total = total + records
            worst = max(worst, seconds)  # max(nan, x) is nan and max(x, nan) is x: keep unknown sticky below
            unknown = unknown or math.isnan(seconds)
        return total, math.nan if unknown else worst


def follow_main(pipeline: PipelineConfig, topics: list[TopicConfig], say: Say) -> int:
    """``ksi archive --follow``: returns the exit code (0 after SIGINT/SIGTERM)."""
    from ..metrics import start_metrics_server
    from .spark import SparkSetupError
    from .tasks import open_engine, warm

    settings = pipeline.archive
    server = None
    if settings.metrics_listen:
        try:
            host, port = parse_listen(settings.metrics_listen)
            server, _ = start_metrics_server(host, port)
        except (ValueError, OSError) as exc:
            print(f"ksi archive: configuration error: metrics: {exc}", file=sys.stderr)
            return 2
        say(f"follow: metrics on http://{host}:{port}/metrics")
    try:
        engine = open_engine(pipeline)
    except SparkSetupError as exc:
        print(f"ksi archive: {exc}", file=sys.stderr)
        return 1
    try:
        # the workers started (Spark's Python daemon and its imports, or the local pool) before the first
        # round, so that no round pays for them
        engine.map(warm, range(engine.parallelism))
    except Exception as exc:  # noqa: BLE001 - the workers cannot start (executors' Python?): say so, stop
        engine.close()
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        print(f"ksi archive: the {engine.name} engine's workers did not start: {first}", file=sys.stderr)
        return 1
    follower = Follower(pipeline, topics, engine, say)

    def stop(signum: int, frame: Any) -> None:
        say(f"follow: {signal.Signals(signum).name}: stopping after this round")
        follower.stop.set()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    say(f"follow: {', '.join(t.name for t in topics)} every {settings.interval_seconds:g} s on the {engine.name} "
        "engine (SIGINT/SIGTERM to stop)")
    try:
        follower.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        engine.close()
        if server is not None:
            server.shutdown()
    print(f"ksi archive: follow: stopped after {follower.rounds} rounds ({follower.failures} failed)", flush=True)
    return 0
