"""The pipeline with PostgreSQL as the shared catalog: Spark (Iceberg's JDBC catalog, Debian's PostgreSQL JDBC
driver) and PyIceberg (SqlCatalog over psycopg2) on one database, served by a real PostgreSQL server that
this test starts from Debian's packages (scripts/install-spark-deps.sh installs them)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ksi.config import CatalogConfig
from ksi.pipeline.archive import archive_topic
from ksi.pipeline.spark import ensure_catalog

from ..postgres_server import running_postgres
from .kafka_helpers import produce, read_all, table_offsets


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    with running_postgres() as server:
        yield server.uri


def test_archive_with_a_postgresql_catalog(noida: Any, spark: Any, postgres: str, make_config: Any,
                                           lake: Any, start_proxy: Any) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse = Path(lake.properties["warehouse"].removeprefix("file://")).parent / "pg-warehouse"
    warehouse.mkdir(exist_ok=True)
    props = {"uri": postgres, "warehouse": f"file://{warehouse}"}
    catalog = SqlCatalog("pg", **props)
    catalog.create_namespace("history")
    ensure_catalog(spark, CatalogConfig("pg", props))  # a second catalog on the running session

    topic = f"pg-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, 2)
    produce(noida.bootstrap, topic, 2, 120)
    config, path = make_config(topic, table, catalog={"name": "pg", **props})
    result = archive_topic(spark, config, config.config.topics[0])
    assert result.rows == 240
    produce(noida.bootstrap, topic, 2, 30, first=120)
    assert archive_topic(spark, config, config.config.topics[0]).rows == 60

    counts = table_offsets(catalog.load_table(table))  # PyIceberg sees Spark's commits through PostgreSQL
    assert len(counts) == 300 and set(counts.values()) == {1}
    assert spark.sql(f"SELECT count(*) FROM pg.{table}").collect()[0][0] == 300

    originals = read_all(noida.bootstrap, topic, 2, 300)
    for p in range(2):
        noida.delete_records(topic, p, 150)
    proxy = start_proxy(path)
    assert read_all(proxy.bootstrap, topic, 2, 300) == originals
