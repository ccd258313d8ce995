"""``ksi archive`` and ``ksi compact``: the pipeline's command lines (``archive_main``, ``compact_main``).

Both read the same TOML file as ``ksi serve`` (its ``[catalog]``, ``[upstream]``, ``[schema_registry]``
and ``[[topics]]``, plus ``[spark]``, ``[archive]`` and ``[compact]``), start one SparkSession, work topic
by topic, print progress to stderr and a summary to stdout, and exit 0 on success, 1 when a topic
failed, 2 on a configuration error.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..config import ConfigError
from .settings import ENGINES, PipelineConfig, load_pipeline_config, select_topics, with_overrides

if TYPE_CHECKING:
    from .quickplan import QuickPlan

__all__ = ["archive_demo", "archive_main", "build_archive_parser", "build_compact_parser", "compact_main", "exit_now"]

ARCHIVE_DESCRIPTION = """\
Copy each configured topic's not-yet-archived offsets, up to the current last stable offset, into the
topic's Iceberg table (ksi layout), exactly once. Offset ranges are read by parallel tasks that write
Parquet data files; the driver commits them all in one snapshot. Each task reads its range with ksi's own
Fetch client, record batches decoded straight into columns ([archive] reader = "auto"); with SASL, an
[archive] consumer property that client does not speak, or old (v0/v1) message sets, it reads with
librdkafka instead (reader = "librdkafka" always does), and the progress line says which. Avro values
(Schema Registry framing) are decoded into typed columns, keeping each row's writer schema id; other
values are kept as raw bytes. Values that cannot be decoded go to
<table>_dead_letters as well. The archived offsets are committed in the same Iceberg snapshot as the data,
so a killed run can simply be run again, and two runs never commit the same offsets twice.

A run first asks the catalog and the broker what is new; with nothing new it ends there, without starting
Spark (with a SQLite catalog in a fraction of a second, before PyIceberg is even loaded). The work runs
on an engine ([archive] engine): "spark" tasks (the default, on local[*] and on a cluster) or "local"
worker processes (no JVM). On a local[...] master a run of at most [archive] inline_max_records records
(500,000) runs in the driver instead, without Spark (its consumers start fetching while the run is
planned); the progress line says which. Spark settings come from the config's [spark] section (master,
driver_memory, executor_memory, jars, iceberg_runtime_jar, conf); the options below override them.

--follow keeps running: every --interval seconds it archives what is new (one engine, so one Spark
application for the whole run; rounds of at most inline_max_records on a local[...] master run in the
driver), prints one progress line per commit with the lake's lag behind the log,
and exports that lag (records and seconds, per partition) as Prometheus metrics on --metrics-port.
SIGINT/SIGTERM finish the current commit and exit; kill -9 loses nothing (the next run continues from the
last commit).
"""

COMPACT_DESCRIPTION = """\
Table maintenance, per configured topic: rewrite small files into target-size files (the archive's files
read in offset order by tasks on the archive's engine, no sort, committed as one replace snapshot; files
that need a sort by Iceberg's rewrite_data_files), expire old snapshots (expire_snapshots, keeping
[compact] retain_last and everything newer than expire_older_than_hours), and delete orphan files older
than orphan_older_than_hours (remove_orphan_files, at most every orphan_every_hours). The table's
metadata decides first what is due, and only the partitions with at least min_input_files small files
are rewritten; with nothing due, Spark is not started, and a small rewrite on a local[...] master runs
in this process. Safe to run while ksi serves the table and while `ksi archive` commits to it.
"""


def _common(parser: argparse.ArgumentParser) -> None:
    from ..serving import CONFIG_HELP  # the lookup of serve, status and verify (ksi.serving.find_config)

    parser.add_argument("--config", "-c", metavar="FILE", help=f"{CONFIG_HELP}; see docs/pipeline.md")
    parser.add_argument("--topic", "-t", action="append", metavar="T",
                        help="only this topic (repeatable; default: every [[topics]] entry)")
    parser.add_argument("--master", metavar="URL", help="Spark master, e.g. local[4] or spark://host:7077 "
                                                        "(overrides spark.master; default local[*])")
    parser.add_argument("--executor-memory", metavar="MEM", help="e.g. 4g (overrides spark.executor_memory)")
    parser.add_argument("--driver-memory", metavar="MEM", help="e.g. 2g (overrides spark.driver_memory)")
    parser.add_argument("--iceberg-jar", metavar="JAR", help="the official iceberg-spark-runtime-3.5_2.12 jar to use "
                                                             "instead of the bundled one (spark.iceberg_runtime_jar)")
    parser.add_argument("--jars", action="append", metavar="JARS", help="more jars, comma-separated (repeatable)")
    parser.add_argument("--conf", action="append", metavar="spark.KEY=VALUE", help="any Spark property (repeatable)")
    parser.add_argument("--quiet", "-q", action="store_true", help="print only the summary")


def build_archive_parser(prog: str = "ksi archive") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=ARCHIVE_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(parser)
    parser.add_argument("--engine", choices=ENGINES, help="where tasks run (overrides archive.engine; default spark; "
                                                          "local: worker processes, no JVM)")
    parser.add_argument("--follow", "-f", action="store_true", help="keep archiving every --interval seconds until "
                                                                    "SIGINT/SIGTERM")
    parser.add_argument("--interval", type=float, metavar="S", help="--follow: seconds between commits "
                                                                    "(overrides archive.interval_seconds; default 5)")
    parser.add_argument("--metrics-port", metavar="[HOST:]PORT", help="--follow: serve Prometheus /metrics here "
                                                                      "(overrides archive.metrics_listen)")
    return parser


def build_compact_parser(prog: str = "ksi compact") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=COMPACT_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(parser)
    parser.add_argument("--retain-last", type=int, metavar="N", help="overrides compact.retain_last")
    parser.add_argument("--expire-older-than-hours", type=float, metavar="H",
                        help="overrides compact.expire_older_than_hours")
    parser.add_argument("--orphan-older-than-hours", type=float, metavar="H",
                        help="overrides compact.orphan_older_than_hours")
    parser.add_argument("--orphan-every-hours", type=float, metavar="H",
                        help="overrides compact.orphan_every_hours (0: sweep orphans on every run)")
    return parser


def _say(quiet: bool) -> Any:
    def say(line: str) -> None:
        if not quiet:
            print(f"ksi: {line}", file=sys.stderr, flush=True)
    return say


def _prepare(args: argparse.Namespace, command: str) -> tuple[PipelineConfig, list[Any]] | int:
    from ..serving import ConfigNotFound, find_config

    try:
        path = find_config(args.config)
    except ConfigNotFound as exc:
        print(f"ksi {command}: {exc}", file=sys.stderr)
        return 2
    try:
        pipeline = load_pipeline_config(path)
        spark_settings = with_overrides(pipeline.spark, master=args.master, executor_memory=args.executor_memory,
                                        driver_memory=args.driver_memory, iceberg_jar=args.iceberg_jar,
                                        jars=args.jars, conf=args.conf)
        topics = select_topics(pipeline.config, args.topic)
        if pipeline.config.catalog is None:
            raise ConfigError(pipeline.source, "catalog", "is required: add [catalog] with name, uri and warehouse")
    except ConfigError as exc:
        print(f"ksi {command}: configuration error: {exc}", file=sys.stderr)
        return 2
    import dataclasses

    return dataclasses.replace(pipeline, spark=spark_settings), topics


def archive_main(argv: Sequence[str] | None = None) -> int:
    """``ksi archive``: returns the exit code."""
    import dataclasses

    args = build_archive_parser().parse_args(argv)
    prepared = _prepare(args, "archive")
    if isinstance(prepared, int):
        return prepared
    pipeline, topics = prepared
    changes = {k: v for k, v in (("engine", args.engine), ("interval_seconds", args.interval),
                                 ("metrics_listen", args.metrics_port)) if v is not None}
    if args.interval is not None and args.interval <= 0:
        print("ksi archive: configuration error: --interval: must be > 0", file=sys.stderr)
        return 2
    pipeline = dataclasses.replace(pipeline, archive=dataclasses.replace(pipeline.archive, **changes))
    say = _say(args.quiet)
    if args.follow:
        from .follow import follow_main

        return follow_main(pipeline, topics, say)
    started = time.monotonic()
    from .quickplan import quick_plan

    quick = quick_plan(pipeline, topics)
    if quick is not None and quick.up_to_date:  # nothing new anywhere: no PyIceberg, no Spark
        for topic in topics:
            print(f"ksi archive: {topic.name}: up to date, nothing to archive", flush=True)
        print(f"ksi archive: done: {len(topics)}/{len(topics)} topics, 0 rows, 0 files, 0 dead letters in "
              f"{time.monotonic() - started:.1f} s", flush=True)
        return 0
    start = _before_planning(pipeline, topics, say, quick)
    from .archive import ArchiveError, archive_topic, plan_topic
    from .spark import SparkSetupError

    pending = []
    failed = rows = files = dead = 0
    for topic in topics:
        try:
            plan = plan_topic(pipeline, topic)
        except ArchiveError as exc:
            print(f"ksi archive: {exc}", file=sys.stderr)
            failed += 1
            continue
        if plan.up_to_date:
            print(f"ksi archive: {topic.name}: up to date, nothing to archive", flush=True)
        else:
            pending.append(plan)
    engine = None
    try:
        if not pending and start is not None:
            start.cancel()
        if pending:
            try:
                engine = _open_engine(pipeline, sum(plan.records for plan in pending), start)
            except SparkSetupError as exc:
                print(f"ksi archive: {exc}", file=sys.stderr)
                return 1
        for plan in pending:
            topic = plan.topic
            try:
                result = archive_topic(engine, pipeline, topic, progress=say, plan=plan)
            except ArchiveError as exc:
                print(f"ksi archive: {exc}", file=sys.stderr)
                failed += 1
                continue
            except Exception as exc:  # noqa: BLE001 - a Spark or Iceberg failure: one line, the details went to the log above
                print(f"ksi archive: {topic.name}: failed: {type(exc).__name__}: {_first_line(exc)}", file=sys.stderr)
                failed += 1
                continue
            rows, files, dead = rows + result.rows, files + result.files, dead + result.dead_letters
            offsets = ", ".join(f"p{r.partition} {r.start}..{r.stop - 1}" if r.count else f"p{r.partition} -"
                                for r in result.ranges)
            print(f"ksi archive: {result.summary_line()}", flush=True)
            if not result.up_to_date:
                print(f"ksi archive: {topic.name}: offsets archived: {offsets}", flush=True)
    finally:
        if engine is not None:
            engine.close()
        elif start is not None:
            start.cancel()
        if "ksi.pipeline.reader" in sys.modules:
            from .reader import close_prefetched

            close_prefetched()
    print(f"ksi archive: done: {len(topics) - failed}/{len(topics)} topics, {rows} rows, {files} files, {dead} dead "
          f"letters in {time.monotonic() - started:.1f} s", flush=True)
    return 1 if failed else 0


def _before_planning(pipeline: PipelineConfig, topics: list[Any], say: Any, quick: QuickPlan | None) -> Any:
    """What starts before the planning's imports, catalog and ListOffsets, so that the two overlap, decided by
    the quick plan ``quick`` (:func:`ksi.pipeline.quickplan.quick_plan`: ListOffsets and a SQLite catalog's
    metadata file; None when not known):

    * a run small enough for this process (at most ``archive.inline_max_records`` on a ``local[...]``
      master): its consumers, opened and assigned now (:func:`ksi.pipeline.reader.prefetch`), so their
      first records are fetched while PyIceberg is imported; returns None;
    * else, with the Spark engine on a ``local[...]`` master: Spark's start (a
      :class:`ksi.pipeline.spark.SparkStart`, cancelled when the plan needs no Spark), returned.

    None too when the run's size is not known this way, and on other masters (a cluster's application is
    started once there is work for it)."""
    if not pipeline.spark.master.startswith("local"):
        return None
    from .settings import runs_inline

    records = None if quick is None else quick.records
    if quick is not None and runs_inline(pipeline, records):
        from .reader import close_prefetched, prefetch

        bootstrap = ",".join(map(str, pipeline.config.upstream.bootstrap_servers))
        try:
            opened = sum(prefetch(bootstrap, pipeline.archive.consumer, topic.name, partitions, pipeline.archive.reader)
                         for topic, partitions in zip(topics, quick.ranges, strict=True))
        except Exception:  # noqa: BLE001 - e.g. an unknown archive.consumer property: the tasks say which
            close_prefetched()
            opened = 0
        if opened:
            say(f"{records:,} records to read, in this process: fetching them while planning")
        return None
    if pipeline.archive.engine != "spark":
        return None
    from .spark import SparkSetupError, SparkStart, active_context

    if active_context() is not None:  # a caller's own session (tests, examples): the engine uses it
        return None
    if records is not None:
        say(f"{records:,} records to read: starting Spark while planning")
    try:
        return SparkStart(pipeline.spark)
    except SparkSetupError:  # no Java: a run that needs Spark says so when it opens the engine
        return None


def _open_engine(pipeline: PipelineConfig, records: int | None = None, start: Any = None) -> Any:
    from .tasks import open_engine

    return open_engine(pipeline, records, start)


def compact_main(argv: Sequence[str] | None = None) -> int:
    """``ksi compact``: returns the exit code."""
    import dataclasses

    args = build_compact_parser().parse_args(argv)
    prepared = _prepare(args, "compact")
    if isinstance(prepared, int):
        return prepared
    pipeline, topics = prepared
    changes = {k: v for k, v in (("retain_last", args.retain_last),
                                 ("expire_older_than_hours", args.expire_older_than_hours),
                                 ("orphan_older_than_hours", args.orphan_older_than_hours),
                                 ("orphan_every_hours", args.orphan_every_hours)) if v is not None}
    settings = dataclasses.replace(pipeline.compact, **changes)
    say = _say(args.quiet)
    started = time.monotonic()
    from .compact import SparkProvider

    spark = SparkProvider(pipeline)
    try:
        return _compact_topics(pipeline, topics, spark, say, settings, started)
    finally:
        spark.stop()


def _compact_topics(pipeline: PipelineConfig, topics: list[Any], spark: Any, say: Any, settings: Any,
                    started: float) -> int:
    from .archive import ArchiveError
    from .compact import compact_table
    from .spark import SparkSetupError

    failed = before = after = 0
    for topic in topics:
        try:
            result = compact_table(spark, pipeline, topic, progress=say, settings=settings)
        except (ArchiveError, SparkSetupError) as exc:
            print(f"ksi compact: {exc}", file=sys.stderr)
            failed += 1
            continue
        except Exception as exc:  # noqa: BLE001 - a Spark or Iceberg failure: one line, the details went to the log above
            print(f"ksi compact: {topic.name}: failed: {type(exc).__name__}: {_first_line(exc)}", file=sys.stderr)
            failed += 1
            continue
        before, after = before + result.files_before, after + result.files_after
        print(f"ksi compact: {result.summary_line()}", flush=True)
    print(f"ksi compact: done: {len(topics) - failed}/{len(topics)} tables, {before} -> {after} data files in "
          f"{time.monotonic() - started:.1f} s", flush=True)
    return 1 if failed else 0


def exit_now(code: int) -> None:
    """End the process with ``code`` once a command's work, output and Spark's stop are done, without the
    interpreter's teardown of pyarrow, PyIceberg, SQLAlchemy and pyspark (measured: 0.3 s of every run).
    For the process's own command line only (``ksi archive``, ``ksi compact``), never for a caller's."""
    import logging
    import os

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def archive_demo(config_path: str, topic: str = "demo", table: str = "history.demo", master: str = "local[2]",
                 until: int | None = None, quiet: bool = False) -> int:
    """Archive ``topic`` into ``table`` with the catalog and broker of ``config_path`` (``ksi dev`` calls this);
    returns how many rows were archived (0 when the table was up to date).  ``until``: only offsets below it
    in each partition (the demo's "first part"); default everything up to the last stable offset.

    The demo runs the pipeline's local engine, whatever the config says: ``make run`` needs no Java (issue
    13), and the demo's few hundred records run in this process anyway.  A [[topics]] entry for ``topic``
    in the config wins over ``table``.  Raises ArchiveError or ConfigError with a message that names the fix.
    """
    import dataclasses

    from ..config import TopicConfig
    from .archive import archive_topic

    pipeline = load_pipeline_config(config_path)
    pipeline = dataclasses.replace(pipeline, spark=with_overrides(pipeline.spark, master=master),
                                   archive=dataclasses.replace(pipeline.archive, engine="local"))
    configured = {t.name: t for t in pipeline.config.topics}
    chosen = configured.get(topic) or TopicConfig(name=topic, table=table)
    result = archive_topic(None, pipeline, chosen, progress=_say(quiet), until=until)
    if not quiet:
        print(f"ksi: {result.summary_line()}", file=sys.stderr, flush=True)
    return result.rows
