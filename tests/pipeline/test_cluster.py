"""``ksi archive --follow`` on a real Spark cluster: a standalone master and one worker (separate JVMs,
started with pyspark's own ``spark-class``), the Spark engine's tasks in an executor the worker launches,
one Spark application for every round; then SIGTERM, and every offset once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ksi.brokers import free_port
from ksi.pipeline.offsets import read_archived_offsets

from .conftest import REPO_ROOT
from .kafka_helpers import produce, table_offsets

PARTITIONS = 2


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[str]:
    """A standalone Spark master and one worker (1 core, 1 GiB) on loopback; yields the master URL."""
    from ksi.pipeline.spark import find_java_home

    env = dict(os.environ, JAVA_HOME=find_java_home(), PYTHONPATH=str(REPO_ROOT), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_WORKER_DIR=str(tmp_path / "work"), SPARK_LOG_DIR=str(tmp_path))
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    processes = []
    try:
        for name, args in (("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                                       str(port), "--webui-port", str(free_port())]),
                           ("worker", ["org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                                       "--cores", "1", "--memory", "1g", "--webui-port", str(free_port())])):
            with open(tmp_path / f"{name}.log", "wb") as log:  # the child keeps its own copy
                processes.append(subprocess.Popen([_spark_class(), *args], stdout=log, stderr=subprocess.STDOUT,
                                                  env=env, start_new_session=True))
            if name == "master":
                deadline = time.monotonic() + 60
                while not _listening(port):
                    assert time.monotonic() < deadline, (tmp_path / "master.log").read_text()
                    time.sleep(0.2)
        deadline = time.monotonic() + 60
        while "Successfully registered with master" not in (tmp_path / "worker.log").read_text(errors="replace"):
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.2)
        yield master_url
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def test_follow_on_a_standalone_spark_cluster(noida: Any, lake: Any, make_config: Any, spark_cluster: str,
                                              tmp_path: Path) -> None:
    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 500)
    _, path = make_config(topic, table, archive={"interval_seconds": 1})
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1", SPARK_LOCAL_IP="127.0.0.1")
    log_path = tmp_path / "follow.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "ksi", "archive", "--config", str(path), "--follow",
                                    "--master", spark_cluster, "--executor-memory", "512m"],
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
    assert len(list((tmp_path / "work").glob("app-*"))) == 1  # one application (one executor) for every round
    counts = table_offsets(lake.table(table))
    assert set(counts.values()) == {1}
    assert set(counts) == {(p, o) for p in range(PARTITIONS) for o in range(800)}
