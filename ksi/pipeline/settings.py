"""The pipeline's settings: the ``[spark]``, ``[archive]`` and ``[compact]`` sections of ksi's TOML config.

The rest of the file (catalog, upstream, schema registry, topics) is parsed by :mod:`ksi.config`, so the
proxy and the pipeline read one file.  Errors use :class:`ksi.config.ConfigError`: ``FILE: KEY: message``.
Command-line overrides (``--master``, ``--conf``, ...) are applied with :func:`with_overrides`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config, ConfigError, Section, TopicConfig, parse_config, read_toml

__all__ = [
    "ArchiveSettings",
    "CompactSettings",
    "PipelineConfig",
    "SparkSettings",
    "dead_letter_table",
    "load_pipeline_config",
    "parse_pipeline_sections",
    "runs_inline",
    "select_topics",
]

_LISTED_IN = "docs/pipeline.md"  # where an unknown key's error points

MIB = 1024 * 1024
ENGINES = ("spark", "local")
READERS = ("auto", "ksi", "librdkafka")  # ksi.pipeline.reader.READERS


@dataclass(frozen=True, slots=True)
class SparkSettings:
    master: str = "local[*]"
    app_name: str = "ksi"
    driver_memory: str | None = None
    executor_memory: str | None = None
    iceberg_runtime_jar: str | None = None  # the official runtime jar; replaces the bundled one
    jars: tuple[str, ...] = ()              # more jars for the driver and executors
    python: str | None = None               # the executors' Python (PYSPARK_PYTHON); default: this one
    log_level: str = "WARN"
    conf: dict[str, str] = field(default_factory=dict)  # any other spark.* property
    catalog: dict[str, str] = field(default_factory=dict)  # extra spark.sql.catalog.<name>.* properties


@dataclass(frozen=True, slots=True)
class ArchiveSettings:
    max_records_per_task: int = 1_000_000     # larger offset ranges are split over several tasks
    poll_timeout_seconds: float = 60.0        # a task that receives nothing for this long fails
    commit_retries: int = 5                   # attempts when another writer commits the same range first
    target_file_size_bytes: int = 128 * MIB   # table property write.target-file-size-bytes (new tables)
    row_group_size_bytes: int = 16 * MIB      # write.parquet.row-group-size-bytes (new tables)
    progress_seconds: float = 5.0             # how often a running job prints progress
    consumer: dict[str, str] = field(default_factory=dict)  # extra librdkafka properties for the readers
    reader: str = "auto"                      # auto, ksi (its own Fetch client) or librdkafka
    engine: str = "spark"                     # spark, or local (worker processes, no JVM)
    inline_max_records: int = 500_000         # on local[...]: a run this small runs in the driver (0: never)
    interval_seconds: float = 5.0             # --follow: how often to commit
    metrics_listen: str | None = None         # --follow: HOST:PORT for Prometheus /metrics


@dataclass(frozen=True, slots=True)
class CompactSettings:
    target_file_size_bytes: int = 128 * MIB
    min_input_files: int = 2                  # a partition with fewer small files is left alone
    expire_older_than_hours: float = 120.0    # snapshots older than this are expired ...
    retain_last: int = 20                     # ... except the newest ones
    orphan_older_than_hours: float = 72.0     # unreferenced files older than this are deleted ...
    orphan_every_hours: float = 24.0          # ... by a sweep at most this often per table (0: every run)
    commit_retries: int = 5


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    config: Config
    spark: SparkSettings = SparkSettings()
    archive: ArchiveSettings = ArchiveSettings()
    compact: CompactSettings = CompactSettings()

    @property
    def source(self) -> str:
        return self.config.source


def runs_inline(pipeline: PipelineConfig, records: int | None) -> bool:
    """Whether a run (or a compaction's rewrite) of ``records`` runs in the driver rather than on Spark: on a
    ``local[...]`` master, at most ``archive.inline_max_records`` of them (None: not known)."""
    return (records is not None and pipeline.spark.master.startswith("local")
            and records <= pipeline.archive.inline_max_records)


def load_pipeline_config(path: str | Path) -> PipelineConfig:
    """Read ``path``: ksi's config plus the pipeline's sections.  Raises :class:`ConfigError`."""
    raw = read_toml(path)
    return parse_pipeline_sections(raw, parse_config(raw, str(path)))


def parse_pipeline_sections(raw: dict[str, Any], config: Config) -> PipelineConfig:
    source = config.source
    spark = Section(source, "spark", raw.get("spark", {}), _LISTED_IN)
    jars = spark.get("jars", list, [])
    if not all(isinstance(j, str) for j in jars):
        raise spark.fail("jars", "must be a list of paths")
    spark_settings = SparkSettings(
        master=spark.get("master", str, "local[*]"),
        app_name=spark.get("app_name", str, "ksi"),
        driver_memory=spark.get("driver_memory", str, None),
        executor_memory=spark.get("executor_memory", str, None),
        iceberg_runtime_jar=spark.get("iceberg_runtime_jar", str, None),
        jars=tuple(jars),
        python=spark.get("python", str, None),
        log_level=spark.get("log_level", str, "WARN").upper(),
        conf=spark.table("conf"),
        catalog=spark.table("catalog"),
    )
    if spark_settings.log_level not in ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF", "TRACE"):
        raise spark.fail("log_level", f"must be a log4j level such as WARN or INFO, got {spark_settings.log_level!r}")
    for key in spark_settings.conf:
        if not key.startswith("spark."):
            raise spark.fail(f"conf.{key}", "Spark properties start with 'spark.'")
    spark.reject_unknown()

    a = Section(source, "archive", raw.get("archive", {}), _LISTED_IN)
    archive = ArchiveSettings(
        max_records_per_task=a.positive("max_records_per_task", int, 1_000_000),
        poll_timeout_seconds=float(a.positive("poll_timeout_seconds", (int, float), 60.0)),
        commit_retries=a.positive("commit_retries", int, 5),
        target_file_size_bytes=a.positive("target_file_size_bytes", int, 128 * MIB),
        row_group_size_bytes=a.positive("row_group_size_bytes", int, 16 * MIB),
        progress_seconds=float(a.positive("progress_seconds", (int, float), 5.0)),
        consumer=a.table("consumer"),
        reader=a.get("reader", str, "auto"),
        engine=a.get("engine", str, "spark"),
        inline_max_records=a.non_negative("inline_max_records", int, 500_000),
        interval_seconds=float(a.positive("interval_seconds", (int, float), 5.0)),
        metrics_listen=a.get("metrics_listen", str, None),
    )
    if archive.engine not in ENGINES:
        raise a.fail("engine", f"must be one of {', '.join(ENGINES)}, got {archive.engine!r}")
    if archive.reader not in READERS:
        raise a.fail("reader", f"must be one of {', '.join(READERS)}, got {archive.reader!r}")
    if archive.reader == "ksi":
        from .fetcher import unsupported

        missing = unsupported(archive.consumer)
        if missing is not None:
            raise a.fail("reader", f"ksi's reader does not speak archive.consumer property {missing}: remove it, "
                                   "or set reader = \"librdkafka\" (or \"auto\")")
    a.reject_unknown()

    c = Section(source, "compact", raw.get("compact", {}), _LISTED_IN)
    compact = CompactSettings(
        target_file_size_bytes=c.positive("target_file_size_bytes", int, 128 * MIB),
        min_input_files=c.positive("min_input_files", int, 2),
        expire_older_than_hours=float(c.non_negative("expire_older_than_hours", (int, float), 120.0)),
        retain_last=c.positive("retain_last", int, 20),
        orphan_older_than_hours=float(c.non_negative("orphan_older_than_hours", (int, float), 72.0)),
        orphan_every_hours=float(c.non_negative("orphan_every_hours", (int, float), 24.0)),
        commit_retries=c.positive("commit_retries", int, 5),
    )
    c.reject_unknown()
    return PipelineConfig(config=config, spark=spark_settings, archive=archive, compact=compact)


def with_overrides(settings: SparkSettings, *, master: str | None = None, executor_memory: str | None = None,
                   driver_memory: str | None = None, iceberg_jar: str | None = None,
                   jars: list[str] | None = None, conf: list[str] | None = None) -> SparkSettings:
    """``settings`` with command-line values put over the config file's."""
    changes: dict[str, Any] = {}
    if master:
        changes["master"] = master
    if executor_memory:
        changes["executor_memory"] = executor_memory
    if driver_memory:
        changes["driver_memory"] = driver_memory
    if iceberg_jar:
        changes["iceberg_runtime_jar"] = iceberg_jar
    if jars:
        changes["jars"] = settings.jars + tuple(j for item in jars for j in item.split(",") if j)
    if conf:
        merged = dict(settings.conf)
        for item in conf:
            key, sep, value = item.partition("=")
            if not sep or not key.startswith("spark."):
                raise ConfigError("--conf", item, "must be spark.KEY=VALUE")
            merged[key] = value
        changes["conf"] = merged
    return dataclasses.replace(settings, **changes)


def dead_letter_table(topic: TopicConfig) -> str:
    """The dead-letter table next to a topic's table: ``<table>_dead_letters``."""
    return f"{topic.table}_dead_letters"


def select_topics(config: Config, names: list[str] | None) -> list[TopicConfig]:
    """The configured topics named (all when ``names`` is empty); an unknown name is a ConfigError."""
    if not names:
        if not config.topics:
            raise ConfigError(config.source, "topics", "no [[topics]] entry: add one with name and table for each "
                                                       "topic to archive")
        return list(config.topics)
    known = {t.name: t for t in config.topics}
    chosen = []
    for name in names:
        if name not in known:
            listed = ", ".join(sorted(known)) or "none"
            raise ConfigError(config.source, "topics", f"topic {name!r} has no table configured"
                                                       f" (configured: {listed}); add a [[topics]] entry with"
                                                       f" name = \"{name}\" and table = \"NAMESPACE.TABLE\"")
        chosen.append(known[name])
    return chosen
