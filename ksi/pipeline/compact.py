"""``ksi compact``: keep a topic's table fast to read, with Iceberg's own Spark procedures.

Its cost follows the work: first a plan from the table's metadata alone (PyIceberg: manifests and the
snapshot list, no data read, no Spark) says which partitions have at least ``min_input_files`` small
files (under 75% of ``target_file_size_bytes``, Iceberg's own threshold), whether any snapshot is due to
expire, and whether the orphan sweep is due (at most every ``orphan_every_hours`` per table, recorded in
the table property ``ksi.orphans-removed-at``).  Nothing due: done, without starting Spark.  Otherwise
Spark runs only the procedures that are due, and ``rewrite_data_files`` only over the partitions that
need it (its ``where``), so it plans and rewrites those files and no others: one call (and commit) per
partition, each followed by a progress line, so a long rewrite says how far it is.

1. ``rewrite_data_files`` with the ``sort`` strategy: the small files archive runs leave behind are
   rewritten into files of ``compact.target_file_size_bytes``, sorted by ``kafka_partition, kafka_offset``
   (the table is partitioned by ``kafka_partition``, so each output file holds one partition's
   contiguous offset range and a Fetch prunes to it by its min/max statistics).
2. ``expire_snapshots``: snapshots older than ``compact.expire_older_than_hours`` are removed, except the
   newest ``compact.retain_last``, and so are the files only they referenced.
3. ``remove_orphan_files``: files no snapshot references (left by killed jobs) that are older than
   ``compact.orphan_older_than_hours`` are deleted.

Safe alongside the proxy and ``ksi archive``: a rewrite is a ``replace`` commit, which Iceberg validates
only against deletions of the files it rewrites (an archive deletes nothing), and an archive's commit
validation ignores replace commits (see :mod:`ksi.pipeline.offsets`); the procedures retry their commits
and a lost race is retried here as a whole.  Readers keep working because files are only deleted once
no retained snapshot needs them; keep ``expire_older_than_hours`` above the longest read, and
``orphan_older_than_hours`` above the longest archive run (files an archive has written but not yet
committed look like orphans).  Expiring the snapshot that carries ``ksi.archived-offsets`` is harmless:
the offsets are then derived from the data files' statistics.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..config import TopicConfig
from .archive import ArchiveError, is_commit_conflict, open_catalog
from .settings import CompactSettings, PipelineConfig

if TYPE_CHECKING:
    from pyiceberg.table import Table

__all__ = ["CompactPlan", "CompactResult", "compact_table", "data_file_count", "plan_compaction"]

SORT_ORDER = "kafka_partition ASC NULLS LAST, kafka_offset ASC NULLS LAST"
ORPHANS_PROPERTY = "ksi.orphans-removed-at"
SMALL_FILE_FRACTION = 0.75  # Iceberg's default min-file-size-bytes: 75% of the target size


@dataclass
class CompactPlan:
    """What ``ksi compact`` would do to a table, from its metadata alone."""

    files: int = 0
    partitions: dict[Any, int] = field(default_factory=dict)  # partition value -> small files to rewrite
    expiring: int = 0           # snapshots expire_snapshots would remove
    orphans_due: bool = False

    @property
    def rewrite_files(self) -> int:
        return sum(self.partitions.values())

    @property
    def nothing_to_do(self) -> bool:
        return not self.partitions and not self.expiring and not self.orphans_due


def plan_compaction(table: Table, settings: CompactSettings, moment: datetime) -> CompactPlan:
    """:class:`CompactPlan` for a PyIceberg ``table`` (see the module docstring)."""
    plan = CompactPlan()
    small: dict[Any, int] = {}
    threshold = settings.target_file_size_bytes * SMALL_FILE_FRACTION
    for task in table.scan().plan_files():
        plan.files += 1
        if task.file.file_size_in_bytes < threshold:
            key = task.file.partition[0] if len(task.file.partition) else None
            small[key] = small.get(key, 0) + 1
    plan.partitions = {k: n for k, n in small.items() if n >= settings.min_input_files}
    cutoff_ms = (moment - timedelta(hours=settings.expire_older_than_hours)).timestamp() * 1000
    newest_first = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms, reverse=True)
    plan.expiring = sum(1 for s in newest_first[settings.retain_last:] if s.timestamp_ms < cutoff_ms)
    last_sweep = table.metadata.properties.get(ORPHANS_PROPERTY)
    plan.orphans_due = (last_sweep is None or settings.orphan_every_hours == 0 or
                        moment.timestamp() - float(last_sweep) >= settings.orphan_every_hours * 3600)
    return plan


def _where(partitions: dict[Any, int]) -> str:
    values = sorted(partitions, key=lambda v: (v is None, v))
    terms = [str(int(v)) for v in values if v is not None]
    where = f"kafka_partition IN ({', '.join(terms)})" if terms else ""
    if None in partitions:
        where = f"({where} OR kafka_partition IS NULL)" if where else "kafka_partition IS NULL"
    return where


@dataclass
class CompactResult:
    topic: str
    table: str
    files_before: int = 0
    files_after: int = 0
    rewritten_files: int = 0
    added_files: int = 0
    rewritten_bytes: int = 0
    expired_data_files: int = 0
    expired_manifests: int = 0
    orphans_removed: int = 0
    seconds: float = 0.0

    def summary_line(self) -> str:
        return (f"{self.topic}: {self.table}: {self.files_before} -> {self.files_after} data files "
                f"({self.rewritten_files} rewritten into {self.added_files}, {self.rewritten_bytes / 1e6:.1f} MB); "
                f"expired snapshots freed {self.expired_data_files} data files and {self.expired_manifests} manifests; "
                f"{self.orphans_removed} orphan files removed; {self.seconds:.1f} s")


def data_file_count(spark: Any, catalog_name: str, table: str) -> int:
    """How many data files the table's current snapshot has (Iceberg's ``files`` metadata table)."""
    return int(spark.sql(f"SELECT count(*) FROM {catalog_name}.{table}.data_files").collect()[0][0])


def _file_count(table: Table) -> int:
    return sum(1 for _ in table.scan().plan_files())


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _retry(action: Callable[[], Any], what: str, attempts: int, say: Callable[[str], None]) -> Any:
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:
            if not is_commit_conflict(exc) or attempt == attempts:
                raise
            say(f"  {what}: a concurrent commit won (attempt {attempt}); retrying")
            time.sleep(min(5.0, 0.5 * attempt))
    return None  # pragma: no cover


def _first_row(spark: Any, sql: str) -> Any:
    return spark.sql(sql).collect()[0]


def _remove_orphans_action(spark: Any, table: str, moment: datetime, settings: CompactSettings) -> int:
    # Iceberg's Spark actions have no Python API: pyspark's gateway to the JVM is the way in.
    jvm = spark._jvm  # noqa: SLF001
    session = spark._jsparkSession  # noqa: SLF001
    java_table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(session, table)
    older_than_ms = int((moment - timedelta(hours=settings.orphan_older_than_hours)).timestamp() * 1000)
    result = (jvm.org.apache.iceberg.spark.actions.SparkActions.get(session)
              .deleteOrphanFiles(java_table).olderThan(older_than_ms).execute())
    return sum(1 for _ in result.orphanFileLocations())


def compact_table(spark: Any, pipeline: PipelineConfig, topic: TopicConfig, *,
                  progress: Callable[[str], None] | None = None, settings: CompactSettings | None = None,
                  now: datetime | None = None) -> CompactResult:
    """Rewrite small files, expire old snapshots and remove orphan files of ``topic``'s table, as due.

    ``spark``: a SparkSession, or a function returning one (called only when Spark has work to do)."""
    say = progress or (lambda line: None)
    settings = settings or pipeline.compact
    config = pipeline.config
    assert config.catalog is not None
    catalog = open_catalog(config)
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = catalog.load_table(topic.table)
    except NoSuchTableError:
        raise ArchiveError(f"topic {topic.name}: table {topic.table} does not exist yet: run `ksi archive` "
                           "first") from None
    name = config.catalog.name
    ident = _quote(topic.table)
    started = time.monotonic()
    moment = now or datetime.now(UTC)
    result = CompactResult(topic=topic.name, table=topic.table)
    plan = plan_compaction(table, settings, moment)
    result.files_before = result.files_after = plan.files
    say(f"{topic.name}: {topic.table} has {plan.files} data files; {plan.rewrite_files} small ones to rewrite in "
        f"{len(plan.partitions)} partitions (target {settings.target_file_size_bytes / 1e6:.0f} MB, at least "
        f"{settings.min_input_files} per partition), {plan.expiring} snapshots to expire, orphan sweep "
        f"{'due' if plan.orphans_due else 'not due'}")
    if plan.nothing_to_do:
        result.seconds = time.monotonic() - started
        return result
    if callable(spark) and not hasattr(spark, "sql"):
        spark = spark()

    if plan.partitions:
        options = (f"map('target-file-size-bytes', '{settings.target_file_size_bytes}', "
                   f"'min-input-files', '{settings.min_input_files}')")
        values = sorted(plan.partitions, key=lambda v: (v is None, v))
        for number, value in enumerate(values, 1):
            where = _where({value: plan.partitions[value]})
            call = (f"CALL {name}.system.rewrite_data_files(table => {ident}, strategy => 'sort', sort_order => "
                    f"{_quote(SORT_ORDER)}, options => {options}, where => {_quote(where)})")
            row = _retry(functools.partial(_first_row, spark, call), "rewrite_data_files", settings.commit_retries, say)
            rewritten, added = int(row["rewritten_data_files_count"]), int(row["added_data_files_count"])
            result.rewritten_files += rewritten
            result.added_files += added
            result.rewritten_bytes += int(row["rewritten_bytes_count"])
            say(f"  partition {number}/{len(values)} ({where}): rewrote {rewritten} files into {added}; "
                f"{result.rewritten_files} files into {result.added_files} so far")

    if plan.expiring:
        expire_before = (moment - timedelta(hours=settings.expire_older_than_hours)).strftime("%Y-%m-%d %H:%M:%S.%f")
        row = _retry(lambda: spark.sql(
            f"CALL {name}.system.expire_snapshots(table => {ident}, older_than => TIMESTAMP '{expire_before}', "
            f"retain_last => {settings.retain_last})").collect()[0], "expire_snapshots", settings.commit_retries, say)
        result.expired_data_files = int(row["deleted_data_files_count"])
        result.expired_manifests = int(row["deleted_manifest_files_count"])
        say(f"  expired snapshots older than {expire_before} UTC (keeping the newest {settings.retain_last}): "
            f"{result.expired_data_files} data files and {result.expired_manifests} manifests deleted")

    if plan.orphans_due:
        orphan_before = (moment - timedelta(hours=settings.orphan_older_than_hours)).strftime("%Y-%m-%d %H:%M:%S.%f")
        if settings.orphan_older_than_hours >= 24:
            rows = spark.sql(f"CALL {name}.system.remove_orphan_files(table => {ident}, "
                             f"older_than => TIMESTAMP '{orphan_before}')").collect()
            result.orphans_removed = len(rows)
        else:
            # the procedure refuses windows under 24 h (a running archive's uncommitted files would look
            # orphaned); a configured shorter window is the user's explicit choice, so use the action API
            result.orphans_removed = _remove_orphans_action(spark, f"{name}.{topic.table}", moment, settings)
        say(f"  removed {result.orphans_removed} orphan files older than {orphan_before} UTC")
        with catalog.load_table(topic.table).transaction() as transaction:
            transaction.set_properties({ORPHANS_PROPERTY: f"{moment.timestamp():.0f}"})
    result.files_after = _file_count(catalog.load_table(topic.table))
    result.seconds = time.monotonic() - started
    return result
