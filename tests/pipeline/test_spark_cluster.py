"""The pipeline on a real Spark cluster, through the public command line only: a standalone master and two
workers (separate JVMs started with pyspark's own ``spark-class``), a PostgreSQL catalog (Debian's server,
shared by the driver, the executors and PyIceberg) and a warehouse every worker reaches.  ``ksi archive
--master spark://...`` runs twice and ``ksi compact --master spark://...`` once; every offset is in the
table exactly once, the committed offsets say where the next run starts, the work ran in executors on both
workers, and the proxy replays the topic from the compacted table byte for byte.  And ``ksi archive --follow``
on the same cluster: every round on one application.

One cluster for the module (about 15 s to start on a loaded 2-core machine)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ksi.brokers import free_port, stop_process
from ksi.pipeline.offsets import read_archived_offsets

from ..postgres_server import running_postgres
from .conftest import REPO_ROOT
from .kafka_helpers import produce, read_all, table_offsets

PARTITIONS = 2
WORKERS = 2


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class SparkCluster:
    master_url: str
    work_dirs: list[Path]

    def executor_dirs(self) -> list[list[Path]]:
        """Per worker: the executor directories it created (``app-*/<executor id>``)."""
        return [sorted(d.glob("app-*/*")) for d in self.work_dirs]

    def applications(self) -> set[str]:
        """The applications whose executors ran on any worker so far."""
        return {d.parent.name for dirs in self.executor_dirs() for d in dirs}

    def workers_of(self, application: str) -> list[int]:
        """The workers (by index) that launched an executor of ``application`` (``app-*/<executor id>``)."""
        return [i for i, dirs in enumerate(self.executor_dirs()) if any(d.parent.name == application for d in dirs)]


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A standalone master and two workers (1 core, 1 GiB each) on loopback."""
    from ksi.pipeline.spark import find_java_home

    root = tmp_path_factory.mktemp("spark-cluster")
    env = dict(os.environ, JAVA_HOME=find_java_home(), PYTHONPATH=str(REPO_ROOT), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(root))
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []
    work_dirs = [root / f"work-{i}" for i in range(WORKERS)]

    def launch(name: str, args: list[str], extra_env: dict[str, str] | None = None) -> None:
        with open(root / f"{name}.log", "wb") as log:
            processes.append(subprocess.Popen([_spark_class(), *args], stdout=log, stderr=subprocess.STDOUT,
                                              env={**env, **(extra_env or {})}, start_new_session=True))

    def wait(what: str, condition: Any, log: Path) -> None:
        deadline = time.monotonic() + 90
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} within 90 s:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)

    try:
        launch("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                          "--webui-port", str(free_port())])
        wait("the master did not listen", lambda: _listening(port), root / "master.log")
        for i, work in enumerate(work_dirs):
            launch(f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                                   "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                                   "--work-dir", str(work)])
        for i in range(WORKERS):
            log = root / f"worker-{i}.log"
            wait(f"worker {i} did not register", lambda log=log: "Successfully registered with master" in
                 log.read_text(errors="replace"), log)
        yield SparkCluster(master_url, work_dirs)
    finally:
        for process in reversed(processes):
            stop_process(process, 30, group=True)


@pytest.fixture(scope="module")
def postgres_catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A PostgreSQL Iceberg catalog (its ``history`` namespace created) and a warehouse on local disk, which
    every worker of this one-host cluster reaches; the catalog properties."""
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse = tmp_path_factory.mktemp("cluster-warehouse")
    with running_postgres() as server:
        props = {"uri": server.uri, "warehouse": f"file://{warehouse}"}
        SqlCatalog("pg", **props).create_namespace("history")
        yield props


def run_cli(command: str, config: Path, master: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1", SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.run([sys.executable, "-m", "ksi", command, "--config", str(config), "--master", master,
                           "--executor-memory", "512m", *args], check=False, capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT, timeout=600)


def test_archive_twice_and_compact_on_a_standalone_cluster(noida: Any, make_config: Any, spark_cluster: SparkCluster,
                                                           postgres_catalog: dict[str, str], start_proxy: Any) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("pg", **postgres_catalog)
    applications_before = spark_cluster.applications()
    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 3000, small_batches=False)
    _, path = make_config(topic, table, catalog={"name": "pg", **postgres_catalog},
                          archive={"max_records_per_task": 1000})  # several tasks, spread over both executors

    first = run_cli("archive", path, spark_cluster.master_url)
    assert first.returncode == 0, first.stderr[-5000:] + first.stdout
    assert "ksi archive: done: 1/1 topics" in first.stdout
    assert read_archived_offsets(catalog.load_table(table)).next_offsets == {0: 3000, 1: 3000}

    produce(noida.bootstrap, topic, PARTITIONS, 1000, first=3000, small_batches=False)
    second = run_cli("archive", path, spark_cluster.master_url)
    assert second.returncode == 0, second.stderr[-5000:] + second.stdout
    assert read_archived_offsets(catalog.load_table(table)).next_offsets == {0: 4000, 1: 4000}
    counts = table_offsets(catalog.load_table(table))
    assert set(counts.values()) == {1}, "an offset was archived twice"
    assert set(counts) == {(p, o) for p in range(PARTITIONS) for o in range(4000)}
    files_before = len(list(catalog.load_table(table).scan().plan_files()))
    assert files_before >= 2 * PARTITIONS  # two archive runs: at least a file per partition each

    compacted = run_cli("compact", path, spark_cluster.master_url, "--retain-last", "1",
                        "--expire-older-than-hours", "0", "--orphan-older-than-hours", "0")
    assert compacted.returncode == 0, compacted.stderr[-5000:] + compacted.stdout
    assert "ksi compact: done: 1/1 tables" in compacted.stdout
    after = catalog.load_table(table)
    assert len(list(after.scan().plan_files())) == PARTITIONS  # one sorted file per partition
    counts = table_offsets(after)
    assert set(counts.values()) == {1} and len(counts) == PARTITIONS * 4000
    assert read_archived_offsets(after).next_offsets == {0: 4000, 1: 4000}  # the next run starts there still

    # the work ran in executors that both workers launched, for each of the three applications
    applications = sorted(spark_cluster.applications() - applications_before)
    assert len(applications) == 3, applications  # archive, archive, compact
    assert {app: spark_cluster.workers_of(app) for app in applications} == \
        {app: list(range(WORKERS)) for app in applications}, spark_cluster.executor_dirs()

    # and the proxy serves the compacted table from the lake, byte for byte, once the broker dropped it
    originals = read_all(noida.bootstrap, topic, PARTITIONS, PARTITIONS * 4000)
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, 3500)
    proxy = start_proxy(path)
    assert read_all(proxy.bootstrap, topic, PARTITIONS, PARTITIONS * 4000) == originals


def test_follow_keeps_one_application_on_a_standalone_cluster(noida: Any, lake: Any, make_config: Any,
                                                              spark_cluster: SparkCluster, tmp_path: Path) -> None:
    """``ksi archive --follow --master spark://...``: every round on one Spark application (its executors
    launched once), then SIGTERM, and every offset once."""
    applications_before = spark_cluster.applications()
    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 500)
    _, path = make_config(topic, table, archive={"interval_seconds": 1})
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1", SPARK_LOCAL_IP="127.0.0.1")
    log_path = tmp_path / "follow.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "ksi", "archive", "--config", str(path), "--follow",
                                    "--master", spark_cluster.master_url, "--executor-memory", "512m"],
                                   stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                   start_new_session=True)
    try:
        def archived() -> int:
            return sum(read_archived_offsets(lake.table(table)).next_offsets.values()) if lake.catalog.table_exists(
                table) else 0

        deadline = time.monotonic() + 240
        while archived() < PARTITIONS * 500:
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-5000:]
            time.sleep(0.5)
        produce(noida.bootstrap, topic, PARTITIONS, 300, first=500)  # a second round on the same application
        while archived() < PARTITIONS * 800:
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-5000:]
            time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 0, log_path.read_text()[-5000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = log_path.read_text()
    assert "on the spark engine" in text and "stopped after" in text
    assert len(spark_cluster.applications() - applications_before) == 1  # one application for every round
    counts = table_offsets(lake.table(table))
    assert set(counts.values()) == {1}
    assert set(counts) == {(p, o) for p in range(PARTITIONS) for o in range(800)}
