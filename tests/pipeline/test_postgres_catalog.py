"""The pipeline with PostgreSQL as the shared catalog: Spark (Iceberg's JDBC catalog, Debian's PostgreSQL JDBC
driver) and PyIceberg (SqlCatalog over psycopg2) on one database, served by a real PostgreSQL server that
this test starts from Debian's packages (scripts/install-spark-deps.sh installs them)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ksi.brokers import free_port
from ksi.config import CatalogConfig
from ksi.pipeline.archive import archive_topic
from ksi.pipeline.spark import ensure_catalog

from .kafka_helpers import produce, read_all, table_offsets


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.fail("PostgreSQL is not installed: run scripts/install-spark-deps.sh")
    # outside pytest's tmp dirs (mode 0700): the server may run as another user
    root = Path(tempfile.mkdtemp(prefix="ksi-pg-"))
    data = root / "data"
    port = free_port()
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root: run the server as Debian's postgres user
        as_user = ["runuser", "-u", "postgres", "--"]
        root.chmod(0o755)
        data.mkdir()
        shutil.chown(data, "postgres", "postgres")
    subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "ksi", "-A", "trust"],
                   check=True, capture_output=True)
    subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(data / "server.log"), "-w", "start",
                    "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1"], check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg2://ksi@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


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
