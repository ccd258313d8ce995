"""``ksi archive``: copy each partition's not-yet-archived offsets into the topic's Iceberg table.

One run per topic:

1. Open (or create, in the ksi layout) the table through PyIceberg, read the archived offsets and the
   snapshot they came from (:mod:`ksi.pipeline.offsets`), and ask the broker for each partition's
   log-start offset and last stable offset (= the high watermark for non-transactional topics).  Plan
   ``[next, end)`` per partition.  Nothing new: the run ends here, before any engine or registry is
   asked anything (:func:`plan_topic`, also used by the CLI to skip starting Spark at all).
2. When the Schema Registry has Avro schemas under ``<topic>-value``, evolve the table to the union of
   all of them (Iceberg field ids, no rewrite) so every task's output schema is known up front.
3. Cut the ranges into tasks sized to the work (:func:`plan_chunks`) and run them on an engine
   (:mod:`ksi.pipeline.tasks`: local worker processes, or Spark): each reads its range with a Kafka
   consumer and writes Parquet data files, uncommitted.
4. Commit dead letters (idempotently), then every task's files and the new offsets in one snapshot,
   validated against concurrent archives (:mod:`ksi.pipeline.commit`).  A lost race re-plans.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import Config, TopicConfig
from ..history.ksi_table import ABORTED_COLUMN, partition_spec, raw_value_schema, sort_order
from .commit import OffsetsMoved, commit_archive, commit_dead_letters
from .offsets import TOPIC_PROPERTY, ArchivedOffsets, read_archived_offsets
from .quickplan import ArchiveError, watermarks
from .settings import ArchiveSettings, PipelineConfig, dead_letter_table

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

__all__ = [
    "ArchiveError",
    "ArchiveResult",
    "PartitionRange",
    "TopicPlan",
    "archive_topic",
    "is_commit_conflict",
    "open_catalog",
    "plan_chunks",
    "plan_topic",
    "watermarks",
]

log = logging.getLogger("ksi.pipeline.archive")

Progress = Callable[[str], None]
MIN_RECORDS_PER_TASK = 50_000  # below this a task's fixed cost (a consumer, a file) outweighs parallelism


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
    tasks: int = 0
    engine: str = ""

    @property
    def up_to_date(self) -> bool:
        return self.snapshot_id is None

    def summary_line(self) -> str:
        if self.up_to_date:
            return f"{self.topic}: up to date, nothing to archive ({self.seconds:.1f} s)"
        rate = self.rows / self.seconds if self.seconds else 0.0
        mbps = self.kafka_bytes / self.seconds / 1e6 if self.seconds else 0.0
        dead = f", {self.dead_letters} dead letters" if self.dead_letters else ""
        return (f"{self.topic}: committed snapshot {self.snapshot_id} to {self.table}: {self.rows} rows in "
                f"{self.files} files ({_size(self.file_bytes)}){dead}; {rate:,.0f} rows/s, {mbps:.1f} MB/s of Kafka"
                f" records, {self.seconds:.1f} s")


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def open_catalog(config: Config) -> Catalog:
    """PyIceberg's catalog for ``config``; an unreachable catalog is an :class:`ArchiveError` naming the fix.

    (The same catalog the proxy opens; not through ``ksi.history``, whose imports a run does not need.)"""
    from pyiceberg.catalog import load_catalog

    if config.catalog is None:
        raise ArchiveError(f"{config.source}: no [catalog] section: add one with name, uri and warehouse")
    properties = dict(config.catalog.properties)
    if "type" not in properties and properties.get("uri", "").startswith(("sqlite", "postgresql", "mysql")):
        properties["type"] = "sql"
    try:
        catalog = load_catalog(config.catalog.name, **properties)
        catalog.list_namespaces()
    except Exception as exc:  # noqa: BLE001 - whatever the catalog raises: said with the key to check
        raise ArchiveError(f"cannot open the Iceberg catalog at {config.catalog.properties.get('uri')}: "
                           f"{type(exc).__name__}: {exc}; check catalog.uri in {config.source} (is the database "
                           "running and the path writable?)") from None
    return catalog


def is_commit_conflict(exc: BaseException) -> bool:
    """Whether a Spark/Iceberg error means another writer committed first (the operation may be retried)."""
    text = str(exc)
    return any(marker in text for marker in ("ValidationException", "CommitFailedException",
                                             "Found conflicting files", "CommitStateUnknownException"))


def plan_chunks(ranges: list[PartitionRange], max_records: int, parallelism: int = 1,
                min_records: int = MIN_RECORDS_PER_TASK) -> list[tuple[int, int, int]]:
    """``(partition, start, stop)`` per task, sized to the work: enough tasks to keep ``parallelism``
    workers busy, none under ``min_records`` offsets (unless its range is smaller) nor over
    ``max_records``; a range is cut into equal pieces."""
    total = sum(r.count for r in ranges)
    size = min(max_records, max(min_records, math.ceil(total / max(1, parallelism))))
    chunks = []
    for r in ranges:
        if r.count <= 0:
            continue
        pieces = math.ceil(r.count / size)
        step = math.ceil(r.count / pieces)
        start = r.start
        while start < r.stop:
            stop = min(r.stop, start + step)
            chunks.append((r.partition, start, stop))
            start = stop
    return chunks


def _table_properties(settings: ArchiveSettings, topic: str) -> dict[str, str]:
    return {
        "write.target-file-size-bytes": str(settings.target_file_size_bytes),
        "write.parquet.row-group-size-bytes": str(settings.row_group_size_bytes),
        "write.distribution-mode": "hash",
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "100",
        TOPIC_PROPERTY: topic,
    }


def ensure_table(catalog: Catalog, name: str, settings: ArchiveSettings, topic: str,
                 schema: Schema | None = None) -> Table:
    """Load ``name``, creating it (and its namespace) in the ksi layout when it does not exist."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError

    try:
        return catalog.load_table(name)
    except NoSuchTableError:
        pass
    namespace = name.rsplit(".", 1)[0]
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(namespace)
    try:
        return catalog.create_table(name, schema=schema or raw_value_schema(), partition_spec=partition_spec(),
                                    sort_order=sort_order(), properties=_table_properties(settings, topic))
    except TableAlreadyExistsError:  # a concurrent job created it first
        return catalog.load_table(name)


def ensure_aborted_column(table: Table, say: Progress | None = None) -> bool:
    """Add ``kafka_aborted`` (optional boolean: the records of aborted transactions) to a ksi table made before
    it existed; its older rows read as null, not aborted, which is what their archive's read_committed read
    kept.  No data file is rewritten.  Whether the schema changed."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.types import BooleanType

    if ABORTED_COLUMN in {f.name for f in table.schema().fields}:
        return False
    try:
        with table.update_schema() as update:
            update.add_column(ABORTED_COLUMN, BooleanType(), doc="true: a record of an aborted transaction")
    except CommitFailedException:  # a concurrent run changed the schema first: fine if it added the column
        if ABORTED_COLUMN in {f.name for f in table.refresh().schema().fields}:
            return True
        raise
    if say is not None:
        say(f"  table schema evolved: added {ABORTED_COLUMN} (records of aborted transactions)")
    return True


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


@dataclass
class TopicPlan:
    """What a run of one topic would archive, decided from the catalog and the broker alone."""

    topic: TopicConfig
    catalog: Catalog
    table: Table                      # as loaded
    archived: ArchivedOffsets
    ranges: list[PartitionRange]

    @property
    def records(self) -> int:
        return sum(r.count for r in self.ranges)

    @property
    def next_offsets(self) -> dict[int, int]:
        return {r.partition: r.stop for r in self.ranges}

    @property
    def up_to_date(self) -> bool:
        """Nothing to read and no offset to move (lost offsets and new partitions move offsets)."""
        return self.records == 0 and all(self.archived.next_offsets.get(p) == o for p, o in self.next_offsets.items())


def plan_topic(pipeline: PipelineConfig, topic: TopicConfig, catalog: Catalog | None = None, until: int | None = None
               ) -> TopicPlan:
    """Plan ``topic``'s next run (step 1 of the module docstring); no engine, no registry."""
    config, settings = pipeline.config, pipeline.archive
    if topic.layout != "ksi":
        raise ArchiveError(f"topic {topic.name}: ksi archive writes the 'ksi' layout, but the topic is configured "
                           f"with layout {topic.layout!r}; archive it into a table with layout = \"ksi\"")
    catalog = catalog or open_catalog(config)
    table = ensure_table(catalog, topic.table, settings, topic.name)
    archived = read_archived_offsets(table)
    bootstrap = ",".join(map(str, config.upstream.bootstrap_servers))
    marks = watermarks(bootstrap, topic.name, config.upstream.connect_timeout_seconds * 2)
    return TopicPlan(topic, catalog, table, archived, plan_ranges(topic.name, archived, marks, until))


def archive_topic(engine: Any, pipeline: PipelineConfig, topic: TopicConfig, *, progress: Progress | None = None,
                  until: int | None = None, before_commit: Callable[[int], None] | None = None,
                  verbose: bool = True, plan: TopicPlan | None = None) -> ArchiveResult:
    """Archive ``topic``'s new offsets into its table, exactly once.

    ``engine``: a :class:`ksi.pipeline.tasks.Engine`, a SparkSession (tasks run as Spark tasks on it), or
    None (the engine ``archive.engine`` chooses, started for this call only, and only if there is work).
    ``until`` archives only offsets below it in every partition (default: up to the last stable offset).
    ``before_commit(attempt)`` is called just before the commit (a test hook for racing jobs).
    ``verbose``: print the per-partition plan (``--follow`` prints one line per interval instead).
    ``plan``: a :func:`plan_topic` result just made, used for the first attempt instead of planning again."""
    from .tasks import open_engine

    say = progress or (lambda line: None)
    settings = pipeline.archive
    started = time.monotonic()
    result = ArchiveResult(topic=topic.name, table=topic.table)
    catalog = plan.catalog if plan is not None else open_catalog(pipeline.config)
    owned = None
    try:
        for attempt in range(1, settings.commit_retries + 1):
            result.attempts = attempt
            if plan is None or attempt > 1:
                plan = plan_topic(pipeline, topic, catalog, until)
            result.ranges = plan.ranges
            if verbose:
                _say_plan(plan, attempt, say)
            if plan.up_to_date:
                result.seconds = time.monotonic() - started
                return result
            if engine is None:
                engine = owned = open_engine(pipeline, plan.records)
            elif not hasattr(engine, "run"):  # a SparkSession
                from .tasks import SparkEngine

                engine = SparkEngine(engine)
            result.engine = engine.name
            try:
                if _archive_once(engine, catalog, pipeline, plan, result, attempt, say, before_commit):
                    result.seconds = time.monotonic() - started
                    return result
            except OffsetsMoved as exc:
                if attempt == settings.commit_retries:
                    raise ArchiveError(f"{topic.name}: gave up after {attempt} commit conflicts: {exc}") from None
                say(f"{topic.name}: another writer committed first ({exc}); re-reading the offsets")
    finally:
        if owned is not None:
            owned.close()
    raise ArchiveError(f"{topic.name}: gave up after {settings.commit_retries} commit conflicts")  # pragma: no cover


def _say_plan(plan: TopicPlan, attempt: int, say: Progress) -> None:
    name = plan.topic.name
    if attempt == 1:
        say(f"{name} -> {plan.topic.table}: offsets from {plan.archived.source}")
    for r in plan.ranges:
        if r.lost:
            say(f"  WARNING partition {r.partition}: offsets {r.lost[0]}..{r.lost[1]} were deleted from Kafka "
                "before they were archived (lost: recorded in the table as ksi.lost-offsets; the proxy answers them"
                " with a retriable error, KAFKA_STORAGE_ERROR, and ksi status lists them)")
        state = f"offsets {r.start}..{r.stop - 1} ({r.count} to read)" if r.count else f"up to date at {r.stop}"
        say(f"  partition {r.partition}: {state}")


def _engine_for(engine: Any, pipeline: PipelineConfig, records: int) -> Any:
    """The engine for a run of ``records``: on a ``local[...]`` master, a Spark engine's run of at most
    ``archive.inline_max_records`` runs in this process (a ``--follow`` round, or a run whose size was not
    known before Spark started): on one machine a Spark job's scheduling and its Python workers' round
    trips cost more than such a run saves by running in parallel (measured: 10% more of a 2M-record topic in a
    running ``--follow``, 1.70 s as a Spark job).  Other engines are kept."""
    from .settings import runs_inline
    from .tasks import InlineEngine

    if engine.name == "spark" and runs_inline(pipeline, records):
        return InlineEngine()
    return engine


def _archive_once(engine: Any, catalog: Catalog, pipeline: PipelineConfig, plan: TopicPlan, result: ArchiveResult,
                  attempt: int, say: Progress, before_commit: Callable[[int], None] | None) -> bool:
    from .files import TableTarget, describe_files
    from .reader import ReadSpec
    from .tasks import ArchiveJob
    from .typed import prepare_values

    config, settings, topic = pipeline.config, pipeline.archive, plan.topic
    base = catalog.load_table(topic.table) if ensure_aborted_column(plan.table, say) else plan.table
    values = prepare_values(config, topic, catalog, base, say)
    table = catalog.load_table(topic.table)  # the schema may have evolved
    partitions = [r.partition for r in plan.ranges if r.count > 0]
    dead_table = dead_target = None
    if values.dead_letters:
        dead_table = _ensure_dead_letter_table(catalog, dead_letter_table(topic), settings, topic.name)
        dead_target = TableTarget.of(dead_table, partitions)
    run_id = uuid.uuid4().hex
    bootstrap = ",".join(map(str, config.upstream.bootstrap_servers))
    job = ArchiveJob(run_id=run_id,
                     read=ReadSpec(bootstrap=bootstrap, topic=topic.name, output_schema=values.output_schema,
                                   consumer=settings.consumer, poll_timeout_seconds=settings.poll_timeout_seconds,
                                   decoder=values.decoder, reader=settings.reader),
                     table=TableTarget.of(table, partitions, settings.row_group_size_bytes,
                                          settings.target_file_size_bytes),
                     dead_letters=dead_target)
    engine = _engine_for(engine, pipeline, plan.records)
    chunks = plan_chunks(plan.ranges, settings.max_records_per_task, engine.parallelism)
    result.tasks = len(chunks)
    if chunks:
        from .reader import reader_for

        why = (f": in this process, no Spark, for a run of at most archive.inline_max_records = "
               f"{settings.inline_max_records:,}" if engine.name == "inline" else "")
        reader, fallback = reader_for(settings.reader, settings.consumer)
        if fallback is not None:
            say(f"{topic.name}: reading with librdkafka: {fallback}")
        say(f"{topic.name}: reading {plan.records} offsets in {len(chunks)} tasks ({engine.name} engine{why}, "
            f"{reader} reader)"
            + (f" (attempt {attempt})" if attempt > 1 else ""))
    said_at, said = [time.monotonic()], [""]

    def on_progress(done: int, total: int, rows: int) -> None:
        line = f"{topic.name}: {done}/{total} tasks done" + (f", {rows:,} records written" if rows >= 0 else "")
        if line != said[0] and time.monotonic() - said_at[0] >= settings.progress_seconds:
            say(line)
            said_at[0], said[0] = time.monotonic(), line

    results = engine.run(job, chunks, on_progress) if chunks else []
    if chunks:
        say(f"{topic.name}: {len(results)}/{len(chunks)} tasks done, {sum(r.rows for r in results):,} records; "
            "committing")
    files = describe_files(table, [f for r in results for f in r.files])
    dead_files = describe_files(dead_table, [f for r in results for f in r.dead_letter_files]) \
        if dead_table is not None else []
    if before_commit is not None:
        before_commit(attempt)
    if dead_files:
        # recheck first, so a lost race does not replace the winner's dead letters with the same rows
        if read_archived_offsets(catalog.load_table(topic.table)).next_offsets != plan.archived.next_offsets:
            raise OffsetsMoved(f"{topic.table}: offsets moved before the dead letters were committed")
        commit_dead_letters(catalog, dead_letter_table(topic), chunks, dead_files)
        result.dead_letters = sum(r.dead_letters for r in results)
        say(f"{topic.name}: {result.dead_letters} records could not be decoded: written to "
            f"{dead_letter_table(topic)} (and kept as raw bytes in {topic.table})")
    snapshot = commit_archive(catalog, topic.table, plan.archived.next_offsets, plan.next_offsets, files,
                              topic.name, run_id, say=say,
                              lost={r.partition: [r.lost] for r in plan.ranges if r.lost is not None})
    result.snapshot_id = snapshot.snapshot_id if snapshot is not None else None
    result.rows = sum(r.rows for r in results)
    result.files = len(files)
    result.file_bytes = sum(f.file_size_in_bytes for f in files)
    result.kafka_bytes = sum(r.kafka_bytes for r in results)
    return True


def _ensure_dead_letter_table(catalog: Catalog, name: str, settings: ArchiveSettings, topic: str) -> Table:
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
