"""``ksi archive``: copy each partition's not-yet-archived offsets into the topic's Iceberg table.

One run per topic:

1. Open (or create, in the ksi layout) the table through PyIceberg and read the archived offsets and the
   snapshot they came from (:mod:`ksi.pipeline.offsets`).
2. Ask the broker for each partition's log-start offset and last stable offset (= the high watermark
   for non-transactional topics), and plan ``[next, end)`` per partition, cut into chunks of at most
   ``archive.max_records_per_task`` offsets.
3. When the Schema Registry has Avro schemas under ``<topic>-value``, evolve the table to the union of
   all of them (Iceberg field ids, no rewrite) so every task's output schema is known up front.
4. One Spark task per chunk reads its range with a Kafka consumer (``mapInArrow``,
   :mod:`ksi.pipeline.reader`); Spark's Iceberg writer writes the rows sorted by partition and offset.
5. Poison values go to ``<table>_dead_letters`` first (idempotently: that table's rows for the planned
   ranges are replaced), then the data and the new offsets are committed to the topic's table in one
   snapshot, validated against concurrent archives.  A lost race is retried from fresh offsets.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..config import Config, TopicConfig
from ..history.ksi_table import partition_spec, raw_value_schema, sort_order
from .offsets import OFFSETS_PROPERTY, TOPIC_PROPERTY, ArchivedOffsets, encode_offsets, overwrite_filter, \
    read_archived_offsets
from .reader import ReadSpec, read_ranges
from .settings import ArchiveSettings, PipelineConfig, dead_letter_table

__all__ = ["ArchiveError", "ArchiveResult", "PartitionRange", "archive_topic", "plan_chunks", "open_catalog",
           "is_commit_conflict"]

log = logging.getLogger("ksi.pipeline.archive")

RUN_PROPERTY = "ksi.archive-run"
Progress = Callable[[str], None]


class ArchiveError(RuntimeError):
    """The archive of a topic cannot proceed; the message names the topic and the fix."""


@dataclass(frozen=True, slots=True)
class PartitionRange:
    partition: int
    start: int        # first offset to archive
    stop: int         # exclusive: the last stable offset when planned
    log_start: int
    lost: tuple[int, int] | None = None  # offsets deleted from Kafka before they were archived

    @property
    def count(self) -> int:
        return max(0, self.stop - self.start)


@dataclass
class ArchiveResult:
    topic: str
    table: str
    ranges: list[PartitionRange] = field(default_factory=list)
    snapshot_id: int | None = None
    rows: int = 0
    files: int = 0
    file_bytes: int = 0
    kafka_bytes: int = 0
    dead_letters: int = 0
    seconds: float = 0.0
    attempts: int = 0

    @property
    def up_to_date(self) -> bool:
        return self.snapshot_id is None

    def summary_line(self) -> str:
        if self.up_to_date:
            return f"{self.topic}: up to date, nothing to archive ({self.seconds:.1f} s)"
        rate = self.rows / self.seconds if self.seconds else 0.0
        mbps = self.kafka_bytes / self.seconds / 1e6 if self.seconds else 0.0
        dead = f", {self.dead_letters} dead letters" if self.dead_letters else ""
        return (f"{self.topic}: committed snapshot {self.snapshot_id} to {self.table}: {self.rows} rows in {self.files} "
                f"files ({_size(self.file_bytes)}){dead}; {rate:,.0f} rows/s, {mbps:.1f} MB/s of Kafka records, "
                f"{self.seconds:.1f} s")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def open_catalog(config: Config) -> Any:
    """PyIceberg's catalog for ``config``; an unreachable catalog is an :class:`ArchiveError` naming the fix."""
    from ..lake.catalog import load_catalog

    if config.catalog is None:
        raise ArchiveError(f"{config.source}: no [catalog] section: add one with name, uri and warehouse")
    try:
        catalog = load_catalog(config)
        catalog.list_namespaces()
    except Exception as exc:
        raise ArchiveError(f"cannot open the Iceberg catalog at {config.catalog.properties.get('uri')}: "
                           f"{type(exc).__name__}: {exc}; check catalog.uri in {config.source} (is the database "
                           "running and the path writable?)") from None
    return catalog


def is_commit_conflict(exc: BaseException) -> bool:
    """Whether a Spark/Iceberg error means another writer committed first (the operation may be retried)."""
    text = str(exc)
    return any(marker in text for marker in ("ValidationException", "CommitFailedException",
                                             "Found conflicting files", "CommitStateUnknownException"))


def plan_chunks(ranges: list[PartitionRange], max_records: int) -> list[tuple[int, int, int]]:
    """``(partition, start, stop)`` per task: each range cut into pieces of at most ``max_records`` offsets."""
    chunks = []
    for r in ranges:
        start = r.start
        while start < r.stop:
            stop = min(r.stop, start + max_records)
            chunks.append((r.partition, start, stop))
            start = stop
    return chunks


def _watermarks(bootstrap: str, topic: str, timeout: float) -> dict[int, tuple[int, int]]:
    """partition -> (log-start offset, last stable offset), asked of the broker."""
    from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout * 1000), "log_level": 0})
    try:
        metadata = admin.list_topics(topic=topic, timeout=timeout)
    except KafkaException as exc:
        raise ArchiveError(f"cannot reach the Kafka cluster at {bootstrap}: {exc.args[0]}; check "
                           "upstream.bootstrap_servers and that the brokers are running") from None
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise ArchiveError(f"topic {topic!r} does not exist in the Kafka cluster at {bootstrap} "
                           f"({info.error if info is not None else 'unknown topic'}); check the topic name")
    partitions = sorted(info.partitions)
    result: dict[int, list[int]] = {p: [0, 0] for p in partitions}
    for index, spec in enumerate((OffsetSpec.earliest(), OffsetSpec.latest())):
        futures = admin.list_offsets({TopicPartition(topic, p): spec for p in partitions},
                                     isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout)
        for tp, future in futures.items():
            try:
                result[tp.partition][index] = future.result().offset
            except KafkaException as exc:
                raise ArchiveError(f"{topic}/{tp.partition}: ListOffsets failed: {exc.args[0]}") from None
    return {p: (low, high) for p, (low, high) in result.items()}


def _table_properties(settings: ArchiveSettings, topic: str) -> dict[str, str]:
    return {
        "write.target-file-size-bytes": str(settings.target_file_size_bytes),
        "write.parquet.row-group-size-bytes": str(settings.row_group_size_bytes),
        "write.distribution-mode": "hash",
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "100",
        TOPIC_PROPERTY: topic,
    }


def ensure_table(catalog: Any, name: str, settings: ArchiveSettings, topic: str, schema: Any = None) -> Any:
    """Load ``name``, creating it (and its namespace) in the ksi layout when it does not exist."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError

    try:
        return catalog.load_table(name)
    except NoSuchTableError:
        pass
    namespace = name.rsplit(".", 1)[0]
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    try:
        return catalog.create_table(name, schema=schema or raw_value_schema(), partition_spec=partition_spec(),
                                    sort_order=sort_order(), properties=_table_properties(settings, topic))
    except TableAlreadyExistsError:  # a concurrent job created it first
        return catalog.load_table(name)


def plan_ranges(topic: str, archived: ArchivedOffsets, marks: dict[int, tuple[int, int]],
                until: int | None = None) -> list[PartitionRange]:
    ranges = []
    for partition, (log_start, end) in sorted(marks.items()):
        if until is not None:
            end = min(end, max(until, archived.next_offset(partition, log_start)))
        start = archived.next_offset(partition, log_start)
        lost = None
        if start < log_start:
            lost = (start, log_start - 1)
            start = log_start
        if start > end:
            raise ArchiveError(f"{topic}/{partition}: the table holds offsets up to {start - 1} but Kafka's partition "
                               f"ends at {end}: was the topic deleted and recreated? Archive it into a new table")
        ranges.append(PartitionRange(partition, start, end, log_start, lost))
    return ranges


class _ProgressReporter:
    """Prints the running job's task progress every few seconds from a daemon thread."""

    def __init__(self, spark: Any, group: str, label: str, every: float, progress: Progress) -> None:
        self.spark, self.group, self.label, self.every, self.progress = spark, group, label, every, progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"progress-{group}", daemon=True)

    def __enter__(self) -> _ProgressReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        last = ""
        while not self._stop.wait(self.every):
            try:
                done = total = 0
                for job_id in tracker.getJobIdsForGroup(self.group):
                    job = tracker.getJobInfo(job_id)
                    for stage_id in job.stageIds if job else ():
                        stage = tracker.getStageInfo(stage_id)
                        if stage is not None:
                            done += stage.numCompletedTasks
                            total += stage.numTasks
            except Exception:  # the session is shutting down
                return
            line = f"{self.label}: {done}/{total} tasks done"
            if total and line != last:
                self.progress(line)
                last = line


def archive_topic(spark: Any, pipeline: PipelineConfig, topic: TopicConfig, *, progress: Progress | None = None,
                  until: int | None = None, before_commit: Callable[[int], None] | None = None) -> ArchiveResult:
    """Archive ``topic``'s new offsets into its table, exactly once.

    ``until`` archives only offsets below it in every partition (default: up to the last stable offset).
    ``before_commit(attempt)`` is called just before the data is written (a test hook for racing jobs)."""
    from .values import prepare_values

    say = progress or (lambda line: None)
    config, settings = pipeline.config, pipeline.archive
    if topic.layout != "ksi":
        raise ArchiveError(f"topic {topic.name}: ksi archive writes the 'ksi' layout, but the topic is configured "
                           f"with layout {topic.layout!r}; archive it into a table with layout = \"ksi\"")
    assert config.catalog is not None
    catalog_name = config.catalog.name
    bootstrap = ",".join(map(str, config.upstream.bootstrap_servers))
    started = time.monotonic()
    result = ArchiveResult(topic=topic.name, table=topic.table)
    catalog = open_catalog(config)
    table = ensure_table(catalog, topic.table, settings, topic.name)
    values = prepare_values(config, topic, catalog, table, say)
    spark_table = f"{catalog_name}.{topic.table}"

    for attempt in range(1, settings.commit_retries + 1):
        result.attempts = attempt
        table = catalog.load_table(topic.table)
        archived = read_archived_offsets(table)
        marks = _watermarks(bootstrap, topic.name, config.upstream.connect_timeout_seconds * 2)
        ranges = plan_ranges(topic.name, archived, marks, until)
        result.ranges = ranges
        if attempt == 1:
            say(f"{topic.name} -> {spark_table}: offsets from {archived.source}")
        for r in ranges:
            if r.lost:
                say(f"  WARNING partition {r.partition}: offsets {r.lost[0]}..{r.lost[1]} were deleted from Kafka "
                    "before they were archived (lost; the proxy reports this gap)")
            state = f"offsets {r.start}..{r.stop - 1} ({r.count} to read)" if r.count else f"up to date at {r.stop}"
            say(f"  partition {r.partition}: {state}")
        chunks = plan_chunks(ranges, settings.max_records_per_task)
        next_offsets = {r.partition: r.stop for r in ranges}
        if not chunks and all(archived.next_offsets.get(p) == o for p, o in next_offsets.items()):
            result.seconds = time.monotonic() - started
            return result

        run_id = uuid.uuid4().hex
        spec = ReadSpec(bootstrap=bootstrap, topic=topic.name, output_schema=values.output_schema,
                        consumer=settings.consumer, poll_timeout_seconds=settings.poll_timeout_seconds,
                        decoder=values.decoder)
        kafka_bytes = spark.sparkContext.accumulator(0)
        plan = spark.sparkContext.parallelize(chunks or [(0, 0, 0)], numSlices=max(1, len(chunks))) \
            .toDF("partition int, start long, stop long")
        rows = plan.mapInArrow(read_ranges(spec, kafka_bytes), values.spark_schema)
        group = f"ksi-archive-{run_id}"
        spark.sparkContext.setJobGroup(group, f"ksi archive {topic.name}")
        say(f"{topic.name}: reading {sum(r.count for r in ranges)} offsets in {len(chunks)} tasks"
            + (f" (attempt {attempt})" if attempt > 1 else ""))
        cached = None
        try:
            with _ProgressReporter(spark, group, topic.name, settings.progress_seconds, say):
                if values.dead_letters:
                    # read Kafka once for both writes (dead letters, then the table)
                    rows = cached = rows.persist()
                    result.dead_letters = _write_dead_letters(spark, catalog, rows, topic, ranges, settings,
                                                              catalog_name)
                    if result.dead_letters:
                        say(f"{topic.name}: {result.dead_letters} records could not be decoded: written to "
                            f"{dead_letter_table(topic)} (and kept as raw bytes in {topic.table})")
                    rows = rows.drop("_ksi_error")
                if before_commit is not None:
                    before_commit(attempt)
                writer = (rows.writeTo(spark_table)
                          .option(f"snapshot-property.{OFFSETS_PROPERTY}", encode_offsets(next_offsets))
                          .option(f"snapshot-property.{TOPIC_PROPERTY}", topic.name)
                          .option(f"snapshot-property.{RUN_PROPERTY}", run_id)
                          .option("isolation-level", "serializable")
                          # each task holds one partition's range: sort locally, no shuffle
                          .option("distribution-mode", "none"))
                if archived.snapshot_id is not None:
                    writer = writer.option("validate-from-snapshot-id", str(archived.snapshot_id))
                from pyspark.sql import functions as F

                writer.overwrite(F.expr(overwrite_filter({r.partition: r.start for r in ranges})))
        except Exception as exc:
            if is_commit_conflict(exc) and attempt < settings.commit_retries:
                say(f"{topic.name}: another writer committed first ({_first_line(exc)}); re-reading the offsets")
                continue
            raise
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            if cached is not None:
                cached.unpersist()
        result.kafka_bytes = int(kafka_bytes.value)
        _fill_commit_stats(catalog.load_table(topic.table), run_id, result)
        result.seconds = time.monotonic() - started
        return result
    raise ArchiveError(f"{topic.name}: gave up after {settings.commit_retries} commit conflicts")  # pragma: no cover


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _fill_commit_stats(table: Any, run_id: str, result: ArchiveResult) -> None:
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary
        if summary is not None and summary.get(RUN_PROPERTY) == run_id:
            result.snapshot_id = snapshot.snapshot_id
            result.rows = int(summary.get("added-records") or 0)
            result.files = int(summary.get("added-data-files") or 0)
            result.file_bytes = int(summary.get("added-files-size") or 0)
            return
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    raise ArchiveError(f"{result.topic}: the commit of run {run_id} is not in {result.table}'s history")


DEAD_LETTER_FIELDS = [
    pa.field("kafka_partition", pa.int32(), nullable=False),
    pa.field("kafka_offset", pa.int64(), nullable=False),
    pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("kafka_key", pa.binary()),
    pa.field("kafka_value", pa.binary()),
    pa.field("error", pa.string()),
]


def _write_dead_letters(spark: Any, catalog: Any, rows: Any, topic: TopicConfig, ranges: list[PartitionRange],
                        settings: ArchiveSettings, catalog_name: str) -> int:
    """Write the rows that failed to decode to the dead-letter table; replaces that table's rows for the same
    ranges, so a rerun after a crash never duplicates them.  Returns how many were written."""
    from pyspark.sql import functions as F

    bad = rows.where(F.col("_ksi_error").isNotNull()).select(
        "kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_key", "kafka_value",
        F.col("_ksi_error").alias("error"))
    count = bad.count()
    if count == 0:
        return 0
    name = dead_letter_table(topic)
    _ensure_dead_letter_table(catalog, name, settings, topic.name)
    condition = " OR ".join(f"(kafka_partition = {r.partition} AND kafka_offset >= {r.start} AND "
                            f"kafka_offset < {r.stop})" for r in ranges if r.count)
    bad.writeTo(f"{catalog_name}.{name}").overwrite(F.expr(condition))
    return count


def _ensure_dead_letter_table(catalog: Any, name: str, settings: ArchiveSettings, topic: str) -> Any:
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import BinaryType, IntegerType, LongType, NestedField, StringType, TimestamptzType

    try:
        return catalog.load_table(name)
    except NoSuchTableError:
        pass
    schema = Schema(
        NestedField(1, "kafka_partition", IntegerType(), required=True),
        NestedField(2, "kafka_offset", LongType(), required=True),
        NestedField(3, "kafka_timestamp", TimestamptzType(), required=False),
        NestedField(4, "kafka_key", BinaryType(), required=False),
        NestedField(5, "kafka_value", BinaryType(), required=False),
        NestedField(6, "error", StringType(), required=False),
    )
    spec = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(),
                                        name="kafka_partition"))
    try:
        return catalog.create_table(name, schema=schema, partition_spec=spec,
                                    properties={TOPIC_PROPERTY: topic, "write.distribution-mode": "hash"})
    except TableAlreadyExistsError:
        return catalog.load_table(name)
