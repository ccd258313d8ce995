"""``ksi compact``: keep a topic's table fast to read.

Its cost follows the work: first a plan from the table's metadata alone (PyIceberg: manifests and the
snapshot list, no data read, no Spark) says which partitions have at least ``min_input_files`` small
files (under 75% of ``target_file_size_bytes``, Iceberg's own threshold), whether any snapshot is due to
expire, and whether the orphan sweep is due (at most every ``orphan_every_hours`` per table, recorded in
the table property ``ksi.orphans-removed-at``).  Nothing due: done, without starting Spark.  Otherwise
only what is due runs:

1. The rewrite of the small files.  Files as ``ksi archive`` writes them (sorted by offset, not
   overlapping) are read in offset order by one task per partition on the archive's engine and written
   into files of ``compact.target_file_size_bytes``, committed as one ``replace`` snapshot
   (:mod:`ksi.pipeline.rewrite`): no sort, no shuffle, no Spark SQL, so the fixed cost is the bare
   SparkContext's start (or none: a rewrite as small as an archive run that would run in the driver runs
   there).  Files that need a sort (overlapping offsets, delete files, an older partition spec) go to
   Iceberg's ``rewrite_data_files`` with the ``sort`` strategy and sort order ``kafka_partition,
   kafka_offset``, one call over every partition that needs it (its ``where``).  Either way each output
   file holds one partition's contiguous offset range, so a Fetch prunes to it by its min/max statistics.
2. ``expire_snapshots`` (Iceberg's procedure): snapshots older than ``compact.expire_older_than_hours`` are
   removed, except the newest ``compact.retain_last``, and so are the files only they referenced.
3. ``remove_orphan_files`` (Iceberg's procedure): files no snapshot references (left by killed jobs) that
   are older than ``compact.orphan_older_than_hours`` are deleted.

Safe alongside the proxy and ``ksi archive``: a rewrite replaces files without changing rows, and is
committed on top of any archive commit that came in between (as long as its input files are all still
there; an archive deletes nothing); the archive's commit validation ignores commits without offsets (see
:mod:`ksi.pipeline.offsets`); Iceberg's procedures retry their commits and a lost race is retried here as a
whole.  Readers keep working because files are only deleted once no retained snapshot needs them; keep
``expire_older_than_hours`` above the longest read, and ``orphan_older_than_hours`` above the longest
archive run (files an archive has written but not yet committed look like orphans).  Expiring the snapshot
that carries ``ksi.archived-offsets`` is harmless: the offsets are then derived from the data files'
statistics.
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

__all__ = ["CompactPlan", "CompactResult", "SparkProvider", "compact_table", "data_file_count", "plan_compaction"]

SORT_ORDER = "kafka_partition ASC NULLS LAST, kafka_offset ASC NULLS LAST"
ORPHANS_PROPERTY = "ksi.orphans-removed-at"
SMALL_FILE_FRACTION = 0.75  # Iceberg's default min-file-size-bytes: 75% of the target size


@dataclass
class CompactPlan:
    """What ``ksi compact`` would do to a table, from its metadata alone."""

    files: int = 0
    partitions: dict[Any, int] = field(default_factory=dict)  # partition value -> small files to rewrite
    rewrite_bytes: int = 0      # the bytes of those files
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
    sizes: dict[Any, int] = {}
    threshold = settings.target_file_size_bytes * SMALL_FILE_FRACTION
    for task in table.scan().plan_files():
        plan.files += 1
        if task.file.file_size_in_bytes < threshold:
            key = task.file.partition[0] if len(task.file.partition) else None
            small[key] = small.get(key, 0) + 1
            sizes[key] = sizes.get(key, 0) + task.file.file_size_in_bytes
    plan.partitions = {k: n for k, n in small.items() if n >= settings.min_input_files}
    plan.rewrite_bytes = sum(sizes[k] for k in plan.partitions)
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


class SparkProvider:
    """Spark for ``ksi compact``, started when first needed: :meth:`context` for the rewrite's tasks (the
    session's, when there is one; else the archive's bare, fast-starting SparkContext), :meth:`session` for
    Iceberg's procedures (a SparkSession with Iceberg's runtime; a bare context started before is stopped
    first: one Spark application per process).  :meth:`stop` ends what it started."""

    def __init__(self, pipeline: PipelineConfig, session: Any = None) -> None:
        self.pipeline = pipeline
        self._session = session
        self._owned_session = False
        self._start: Any = None

    def session(self, work_bytes: int | None = None) -> Any:
        if self._session is None:
            from .spark import get_spark

            if self._start is not None:
                self._start.stop()
                self._start = None
            self._session = get_spark(self.pipeline.spark, self.pipeline.config.catalog, work_bytes, dump=True)
            self._owned_session = True
        return self._session

    def context(self) -> Any:
        if self._session is not None:
            return self._session.sparkContext
        if self._start is None:
            from .spark import SparkStart, active_context

            active = active_context()
            if active is not None:
                return active
            self._start = SparkStart(self.pipeline.spark, warm=self.pipeline.spark.master.startswith("local"))
        return self._start.context()

    def stop(self) -> None:
        if self._start is not None:
            self._start.stop()
            self._start = None
        if self._session is not None and self._owned_session:
            from .spark import stop_spark

            stop_spark(self._session)
        self._session = None


def _rewrite_with_tasks(provider: SparkProvider, pipeline: PipelineConfig, catalog: Any, table: Table,
                        rewrite: tuple[list[Any], list[Any]], settings: CompactSettings, result: CompactResult,
                        say: Callable[[str], None]) -> None:
    """The rewrite as tasks (:mod:`ksi.pipeline.rewrite`): on Spark, or in this process when it is as small as
    an archive run that would run here (``archive.inline_max_records`` on a ``local[...]`` master)."""
    import uuid

    from .files import TableTarget, describe_files
    from .rewrite import RewriteJob, commit_replace, rewrite_group
    from .settings import runs_inline
    from .tasks import InlineEngine, SparkEngine

    groups, replaced = rewrite
    records = sum(g.records for g in groups)
    files = len(replaced)
    engine: Any = InlineEngine() if runs_inline(pipeline, records) else SparkEngine(provider.context())
    say(f"  rewriting {files} files ({sum(g.bytes for g in groups) / 1e6:.1f} MB, {records:,} records) of "
        f"{len(groups)} partitions in {len(groups)} tasks ({engine.name} engine): in offset order, no sort needed")
    target = TableTarget.of(table, [g.partition for g in groups], target_file_bytes=settings.target_file_size_bytes)
    job = RewriteJob(run_id=uuid.uuid4().hex, target=target)
    said = [time.monotonic()]

    def on_progress(done: int, total: int, _: int) -> None:
        if time.monotonic() - said[0] >= pipeline.archive.progress_seconds:
            say(f"  rewriting: {done}/{total} tasks done")
            said[0] = time.monotonic()

    written = engine.map(functools.partial(rewrite_group, job), groups, on_progress)
    added = describe_files(table, [f for files_of_group in written for f in files_of_group])
    commit_replace(catalog, ".".join(table.name()) if isinstance(table.name(), tuple) else str(table.name()),
                   replaced, added, attempts=20, say=say)
    result.rewritten_files = files
    result.added_files = len(added)
    result.rewritten_bytes = sum(g.bytes for g in groups)
    say(f"  rewrote {files} files into {len(added)} (one replace snapshot)")


def _rewrite(spark: Any, catalog: str, ident: str, plan: CompactPlan, settings: CompactSettings,
             result: CompactResult, say: Callable[[str], None]) -> None:
    """One ``rewrite_data_files`` over every partition that needs it (its ``where``): Iceberg plans those files
    only, rewrites the partitions' file groups concurrently and commits as groups finish (partial progress),
    so the call's fixed cost (planning, Spark's jobs, the commit) is paid once, not per partition (measured:
    1.2 s per partition per call); Spark's task progress is reported while it runs."""
    from .tasks import SparkProgress

    options = (f"map('target-file-size-bytes', '{settings.target_file_size_bytes}', "
               f"'min-input-files', '{settings.min_input_files}', 'partial-progress.enabled', 'true')")
    where = _where(plan.partitions)
    call = (f"CALL {catalog}.system.rewrite_data_files(table => {ident}, strategy => 'sort', sort_order => "
            f"{_quote(SORT_ORDER)}, options => {options}, where => {_quote(where)})")
    say(f"  rewriting {plan.rewrite_files} files ({plan.rewrite_bytes / 1e6:.1f} MB) of {len(plan.partitions)} "
        f"partitions in one rewrite_data_files ({where})")
    context = spark.sparkContext
    group = f"ksi-compact-{time.monotonic_ns()}"
    said = [time.monotonic()]

    def on_progress(done: int, total: int, _: int) -> None:
        if time.monotonic() - said[0] >= 5.0:
            say(f"  rewriting: {done}/{total} Spark tasks done")
            said[0] = time.monotonic()

    context.setJobGroup(group, "ksi compact: rewrite_data_files")
    try:
        with SparkProgress(context, group, on_progress):
            row = _retry(functools.partial(_first_row, spark, call), "rewrite_data_files", settings.commit_retries,
                         say)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    result.rewritten_files = int(row["rewritten_data_files_count"])
    result.added_files = int(row["added_data_files_count"])
    result.rewritten_bytes = int(row["rewritten_bytes_count"])
    failed = int(row["failed_data_files_count"]) if "failed_data_files_count" in row else 0
    say(f"  rewrote {result.rewritten_files} files into {result.added_files}"
        + (f" ({failed} files in file groups that failed: they stay as they are, for the next run)" if failed else ""))


def compact_table(spark: Any, pipeline: PipelineConfig, topic: TopicConfig, *,
                  progress: Callable[[str], None] | None = None, settings: CompactSettings | None = None,
                  now: datetime | None = None) -> CompactResult:
    """Rewrite small files, expire old snapshots and remove orphan files of ``topic``'s table, as due.

    ``spark``: a SparkSession, or a :class:`SparkProvider` that starts Spark only when there is work for it
    (and the lighter SparkContext when Iceberg's procedures are not needed)."""
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
    from .rewrite import plan_rewrite

    rewrite = plan_rewrite(table, settings.target_file_size_bytes * SMALL_FILE_FRACTION, set(plan.partitions)) \
        if plan.partitions else None
    provider = spark if isinstance(spark, SparkProvider) else SparkProvider(pipeline, spark)
    if plan.expiring or plan.orphans_due or (plan.partitions and rewrite is None):
        # Iceberg's procedures are due: one session for all of it (the rewrite's tasks run on its context)
        provider.session(plan.rewrite_bytes)
    if plan.partitions and rewrite is not None:
        _rewrite_with_tasks(provider, pipeline, catalog, table, rewrite, settings, result, say)
    if plan.partitions and rewrite is None:
        say("  these files need a sort (overlapping offsets, delete files or another partition spec): Iceberg's "
            "rewrite_data_files does it")
        _rewrite(provider.session(plan.rewrite_bytes), name, ident, plan, settings, result, say)
    if plan.expiring or plan.orphans_due:
        spark = provider.session(0)

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
