"""``ksi archive --follow`` as a user runs it (a child process; on the Spark engine, the default, and on the local
engine), and the no-op fast path: commits every interval while a producer writes, kill -9 of the whole process
group (driver, JVM, Python workers) mid-stream, a restart that continues from the last commit, the lag metrics,
SIGTERM ending it cleanly; every offset once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from ksi.brokers import free_port
from ksi.pipeline.offsets import read_archived_offsets

from ..processes import process_group
from .conftest import REPO_ROOT
from .kafka_helpers import produce, table_offsets

PARTITIONS = 2


def _wait_for(predicate: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _commits(log: Path) -> int:
    return log.read_text(errors="replace").count(" records in ") if log.exists() else 0


@pytest.mark.parametrize(("engine", "inline_max_records"), [
    ("spark", 0),        # every round as Spark tasks on the running application
    ("spark", 500_000),  # the default: rounds this small run in the driver, the application idles
    ("local", 500_000),
])
def test_follow_commits_every_interval_survives_kill_9_and_archives_every_offset_once(
        noida: Any, lake: Any, make_config: Any, tmp_path: Path, engine: str, inline_max_records: int) -> None:
    topic = f"follow-{engine}-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    _, path = make_config(topic, table, archive={"interval_seconds": 1, "engine": engine,
                                                 "inline_max_records": inline_max_records})
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    port = free_port()
    command = [sys.executable, "-m", "ksi", "archive", "--config", str(path), "--follow",
               "--metrics-port", f"127.0.0.1:{port}"]

    produced = [0]
    stop = threading.Event()

    def producer() -> None:  # a steady trickle in small steps, as a live topic gets
        while not stop.is_set():
            produce(noida.bootstrap, topic, PARTITIONS, 200, first=produced[0] // PARTITIONS)
            produced[0] += 200 * PARTITIONS
            time.sleep(0.2)

    writer = threading.Thread(target=producer, daemon=True)
    writer.start()
    try:
        first_log = tmp_path / "follow-1.log"
        with open(first_log, "wb") as log:
            first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                     start_new_session=True)
        _wait_for(lambda: _commits(first_log) >= 3 or first.poll() is not None, "three commits")
        assert first.poll() is None, first_log.read_text()
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert f'ksi_archive_lag_records{{partition="0",topic="{topic}"}}' in metrics
        assert f'ksi_archive_lag_seconds{{partition="1",topic="{topic}"}}' in metrics
        assert f'ksi_archive_commits_total{{topic="{topic}"}}' in metrics
        # kill -9 the driver and its worker processes in the middle of the stream
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        assert first.returncode == -signal.SIGKILL
        killed_at = read_archived_offsets(lake.table(table)).next_offsets
        assert sum(killed_at.values()) > 0

        second_log = tmp_path / "follow-2.log"
        with open(second_log, "wb") as log:
            second = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                      start_new_session=True)
        _wait_for(lambda: _commits(second_log) >= 2 or second.poll() is not None, "commits after the restart")
        stop.set()
        writer.join(60)
        total = produced[0]
        _wait_for(lambda: sum(read_archived_offsets(lake.table(table)).next_offsets.values()) >= total,
                  "the lake to catch up")
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0, second_log.read_text()
        # nothing it started outlives it: the JVM, Spark's Python daemon and workers, or the local workers
        _wait_for(lambda: not process_group(second.pid), "the process group to be empty")
    finally:
        stop.set()
        for process in (locals().get("first"), locals().get("second")):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    text = second_log.read_text()
    assert f"on the {engine} engine" in text
    assert "follow: SIGTERM: stopping after this round" in text and "stopped after" in text
    assert "lag " in text and " records, " in text
    counts = table_offsets(lake.table(table))
    assert set(counts.values()) == {1}, "an offset was archived twice"
    assert set(counts) == {(p, o) for p in range(PARTITIONS) for o in range(total // PARTITIONS)}


def test_a_run_with_nothing_new_starts_no_engine(noida: Any, lake: Any, make_config: Any, monkeypatch: Any,
                                                 capsys: Any) -> None:
    from ksi.pipeline import cli, tasks
    from ksi.pipeline.archive import archive_topic

    topic = f"noop-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 30)
    config, path = make_config(topic, table)
    assert archive_topic(None, config, config.config.topics[0]).rows == PARTITIONS * 30

    def no_engine(pipeline: Any, records: int | None = None) -> Any:
        raise AssertionError("an engine was started for a run with nothing to do")

    monkeypatch.setattr(tasks, "open_engine", no_engine)
    assert cli.archive_main(["--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{topic}: up to date, nothing to archive" in out and "done: 1/1 topics, 0 rows" in out


def test_the_archive_command_imports_no_pandas_trio_or_registry_server(noida: Any, lake: Any, make_config: Any
                                                                       ) -> None:
    """What a small ``ksi archive`` run pays before it reads (docs/pipeline.md, *Incremental runs*): pandas is
    left out of its driver, and trio, the registry's HTTP server and kafka-python's codec are not imported
    (``python -X importtime`` names every module a process imports); a run with nothing new imports neither
    PyIceberg nor pyarrow."""
    topic = f"imports-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 20)
    _, path = make_config(topic, table, archive={"engine": "spark"})
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))

    def run() -> tuple[str, set[str]]:
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "ksi", "archive", "--config", str(path)],
                              capture_output=True, text=True, env=env, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout, {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
                             if line.startswith("import time:")}

    out, imported = run()
    assert f"{PARTITIONS * 20} rows" in out                  # a run that read and committed, inline
    assert {"pyiceberg", "pyarrow", "confluent_kafka", "protocol.batch_columns"} <= imported
    # pyarrow tries ``import pandas`` (importtime lists the attempt, refused by ksi.allocator); none of it loads
    assert not {m for m in imported if m.startswith(("pandas.", "trio")) or m in ("ksi.registry.http", "kafka")}
    out, imported = run()
    assert f"{topic}: up to date, nothing to archive" in out
    assert not {m for m in imported if m.startswith(("pyiceberg", "pyarrow", "sqlalchemy"))}


def test_the_quick_estimate_of_a_run_agrees_with_its_plan(noida: Any, lake: Any, make_config: Any) -> None:
    """What decides whether Spark starts before planning: the records a run will read, from ListOffsets and the
    SQLite catalog's metadata file alone, equal to what the real plan (PyIceberg) finds."""
    from ksi.pipeline.archive import archive_topic, plan_topic
    from ksi.pipeline.quickplan import records_to_read

    topic = f"quick-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 40)
    config, _ = make_config(topic, table)
    topics = config.config.topics
    assert records_to_read(config, topics) == PARTITIONS * 40      # no table yet: the whole log
    archive_topic(None, config, topics[0])
    assert records_to_read(config, topics) == 0 == plan_topic(config, topics[0]).records
    produce(noida.bootstrap, topic, PARTITIONS, 25, first=40)
    assert records_to_read(config, topics) == PARTITIONS * 25 == plan_topic(config, topics[0]).records


def test_a_small_run_fetches_its_ranges_while_it_plans(noida: Any, lake: Any, make_config: Any, monkeypatch: Any,
                                                      capsys: Any) -> None:
    """A run small enough for the driver opens its consumers before PyIceberg is imported (the quick plan's
    ranges); each task takes the one at its own start, and the table gets every offset once."""
    from ksi.pipeline import cli, reader
    from ksi.pipeline.archive import archive_topic

    topic = f"prefetch-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 30)
    config, path = make_config(topic, table)
    archive_topic(None, config, config.config.topics[0], until=10)
    produce(noida.bootstrap, topic, PARTITIONS, 15, first=30)
    opened: list[int] = []
    left: list[int] = []
    real_prefetch, real_close = reader.prefetch, reader.close_prefetched
    monkeypatch.setattr(reader, "prefetch", lambda *a: opened.append(real_prefetch(*a)) or opened[-1])
    monkeypatch.setattr(reader, "close_prefetched", lambda: left.append(real_close()) or left[-1])
    assert cli.archive_main(["--config", str(path)]) == 0
    captured = capsys.readouterr()
    assert f"{PARTITIONS * 35} records to read, in this process: fetching them while planning" in captured.err
    assert f"{PARTITIONS * 35} rows" in captured.out
    assert opened == [PARTITIONS] and left == [0]  # every consumer opened early was the one a task read with
    counts = table_offsets(lake.table(table))
    assert set(counts.values()) == {1}
    assert set(counts) == {(p, o) for p in range(PARTITIONS) for o in range(45)}


def test_consumers_opened_for_other_ranges_are_left_and_closed(noida: Any, lake: Any, make_config: Any) -> None:
    """The quick plan can be overtaken (another writer commits before this run plans): a consumer opened at
    another start is never read from; the run reads its own ranges, and the unused ones are closed."""
    from ksi.pipeline import reader
    from ksi.pipeline.archive import archive_topic

    topic = f"prefetch-other-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 20)
    config, _ = make_config(topic, table)
    overrides = config.archive.consumer
    assert reader.prefetch(noida.bootstrap, overrides, topic, dict.fromkeys(range(PARTITIONS), (5, 20))) == PARTITIONS
    assert reader.prefetch(noida.bootstrap, overrides, topic, dict.fromkeys(range(PARTITIONS), (5, 20))) == 0
    assert archive_topic(None, config, config.config.topics[0]).rows == PARTITIONS * 20
    assert reader.close_prefetched() == PARTITIONS
    assert reader.close_prefetched() == 0
    counts = table_offsets(lake.table(table))
    assert set(counts.values()) == {1}
    assert set(counts) == {(p, o) for p in range(PARTITIONS) for o in range(20)}


def test_a_bad_consumer_setting_fails_the_run_with_its_name_not_a_traceback(noida: Any, lake: Any, make_config: Any,
                                                                           capsys: Any) -> None:
    """The consumers opened before planning use ``archive.consumer``; a property librdkafka does not know is
    reported by the run, naming it, as it was before they were opened early."""
    from ksi.pipeline import cli, reader

    topic = f"prefetch-bad-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 5)
    _, path = make_config(topic, f"history.{topic.replace('-', '_')}",
                          archive={"consumer": {"no.such.property": "1"}})
    assert cli.archive_main(["--config", str(path)]) == 1
    captured = capsys.readouterr()
    assert "no.such.property" in captured.err and "Traceback" not in captured.err
    assert reader.close_prefetched() == 0
