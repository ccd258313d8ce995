"""The PySpark pipeline that puts Kafka history into Iceberg and keeps the tables fast to read.

    settings.py  the [spark], [archive] and [compact] sections of ksi's config
    jars.py      the Iceberg runtime jar, its relocated Jackson, the JDBC drivers
    spark.py     one SparkSession per process, sharing PyIceberg's catalog through Iceberg's JDBC catalog
    offsets.py   exactly-once bookkeeping: archived offsets in the snapshot summary of the data's commit
    reader.py    Kafka offset ranges read in Spark tasks (mapInArrow, one consumer per task)
    values.py    raw bytes or Avro decoded into typed columns; poison records
    typed.py     the table schema evolved to every value schema of the topic
    archive.py   ``ksi archive``
    compact.py   ``ksi compact``
    cli.py       the command lines, and ``archive_demo`` for ``ksi dev``

This package imports from ksi (config, table layout); nothing in ksi imports it except the CLI.
"""

from __future__ import annotations

from .cli import archive_demo, archive_main, compact_main

__all__ = ["archive_demo", "archive_main", "compact_main"]
