"""The pipeline that puts Kafka history into Iceberg and keeps the tables fast to read: tasks on Spark
(PySpark; or local worker processes), commits through PyIceberg, maintenance on Spark (the rewrite as tasks,
expiry and orphans with Iceberg's procedures).

    settings.py  the [spark], [archive] and [compact] sections of ksi's config
    jars.py      the Iceberg runtime jar, its relocated Jackson, the JDBC drivers
    jvm.py       the driver JVM's start options and its class-data sharing archive
    spark.py     the archive's SparkContext (started while the driver plans); compact's SparkSession with
                 Iceberg, sharing PyIceberg's catalog through Iceberg's JDBC catalog
    daemon.py    Spark's Python daemon with the task code imported before it forks its workers
    offsets.py   exactly-once bookkeeping: archived offsets in the snapshot summary of the data's commit
    quickplan.py the broker's watermarks; a run's size known before the planning's imports (start Spark early?)
    launch.py    the driver JVM launched without spark-submit's scripts once its command line is known
    reader.py    one Kafka partition's offset range read into Arrow columns (ksi's reader, or librdkafka)
    fetcher.py   ksi's own Fetch client for a range: chunked reads of each response, bounded read-ahead
    values.py    raw bytes or Avro decoded into typed columns; poison records
    typed.py     the table schema evolved to every value schema of the topic
    files.py     a task's rows streamed into Parquet data files; Iceberg's statistics of them on the driver
    tasks.py     the tasks and the engines that run them: Spark, inline (small runs), or local worker processes
    commit.py    one snapshot per run: every task's files and the archived offsets, conflict-checked
    archive.py   ``ksi archive``: plan from metadata, tasks sized to the work, one commit
    follow.py    ``ksi archive --follow``: micro-batches on one engine, the lag as metrics
    compact.py   ``ksi compact``: plan from metadata, the rewrite, Iceberg's expiry and orphan sweep
    rewrite.py   compaction's rewrite of non-overlapping small files as tasks, one replace commit
    cli.py       the command lines, and ``archive_demo`` for ``ksi dev``

This package imports from ksi (config, table layout); nothing in ksi imports it except the CLI.
"""

from __future__ import annotations

from .cli import archive_demo, archive_main, compact_main

__all__ = ["archive_demo", "archive_main", "compact_main"]
