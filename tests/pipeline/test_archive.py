"""``ksi archive`` on real Spark (local[2]) against a real broker and a shared SQLite catalog: byte-for-byte
replay through the proxy after the broker deleted the archived offsets, exactly once across kills and races,
and compaction while a consumer reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from ksi.pipeline.archive import archive_topic
from ksi.pipeline.compact import compact_table, data_file_count
from ksi.pipeline.offsets import read_archived_offsets

from .conftest import REPO_ROOT
from .kafka_helpers import consumer_config, produce, read_all, table_offsets

PARTITIONS = 2


def unique(prefix: str) -> tuple[str, str]:
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    return topic, f"history.{topic.replace('-', '_')}"


def test_archive_then_replay_through_the_proxy_byte_for_byte(noida: Any, spark: Any, lake: Any, make_config: Any,
                                                             start_proxy: Any) -> None:
    topic, table = unique("replay")
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 150)
    config, path = make_config(topic, table, archive={"max_records_per_task": 40})
    lines: list[str] = []
    first = archive_topic(spark, config, config.config.topics[0], progress=lines.append)
    assert first.rows == PARTITIONS * 150 and first.attempts == 1 and first.engine == "spark"
    assert [(r.partition, r.start, r.stop) for r in first.ranges] == [(0, 0, 150), (1, 0, 150)]
    assert any("partition 0: offsets 0..149" in line for line in lines)
    assert "150 rows" not in first.summary_line() and f"{PARTITIONS * 150} rows" in first.summary_line()

    produce(noida.bootstrap, topic, PARTITIONS, 50, first=150)  # more arrives; a second run takes only that
    second = archive_topic(None, config, config.config.topics[0])  # a small run: in this process this time
    assert second.rows == PARTITIONS * 50 and second.engine == "inline"
    assert [(r.start, r.stop) for r in second.ranges] == [(150, 200)] * PARTITIONS
    assert archive_topic(spark, config, config.config.topics[0]).up_to_date

    counts = table_offsets(lake.table(table))
    assert set(counts) == {(p, o) for p in range(PARTITIONS) for o in range(200)} and set(counts.values()) == {1}
    assert read_archived_offsets(lake.table(table)).next_offsets == {0: 200, 1: 200}

    originals = read_all(noida.bootstrap, topic, PARTITIONS, PARTITIONS * 200)
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, 180)  # Kafka now starts at 180: 0..179 only in the lake
    assert len(read_all(noida.bootstrap, topic, PARTITIONS, PARTITIONS * 20, timeout=5)) == PARTITIONS * 20
    proxy = start_proxy(path)
    replayed = read_all(proxy.bootstrap, topic, PARTITIONS, PARTITIONS * 200)
    assert replayed == originals  # every offset once: keys, values, headers, timestamps as produced


def test_killed_runs_then_a_full_run_archive_every_record_exactly_once(noida: Any, lake: Any, make_config: Any,
                                                                       tmp_path: Path) -> None:
    topic, table = unique("kill")
    noida.create_topic(topic, PARTITIONS)
    per_partition = 100_000
    produce(noida.bootstrap, topic, PARTITIONS, per_partition, small_batches=False)
    # inline_max_records 0: a run this small would otherwise run in the driver, and this kills Spark's tasks
    _, path = make_config(topic, table, archive={"max_records_per_task": 20_000, "inline_max_records": 0})
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "ksi", "archive", "--config", str(path)]

    # kill -9 the whole process group (driver, JVM and Python workers, or the local engine's worker processes)
    # as the run's tasks start reading
    for engine, kill_on in (("spark", "reading"), ("local", "reading")):
        log_path = tmp_path / f"killed-{engine}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen([*command, "--engine", engine], stdout=log, stderr=subprocess.STDOUT, env=env,
                                       cwd=REPO_ROOT, start_new_session=True)
        deadline = time.monotonic() + 120
        while kill_on not in log_path.read_text(errors="replace") and process.poll() is None:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        assert process.returncode == -signal.SIGKILL, log_path.read_text()

    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout
    assert "ksi archive: done: 1/1 topics" in result.stdout
    counts = table_offsets(lake.table(table))
    assert len(counts) == PARTITIONS * per_partition
    assert set(counts.values()) == {1}, "an offset was archived twice"
    assert set(counts) == {(p, o) for p in range(PARTITIONS) for o in range(per_partition)}


def test_racing_archive_jobs_never_commit_the_same_offsets_twice(noida: Any, spark: Any, lake: Any,
                                                                 make_config: Any) -> None:
    topic, table = unique("race")
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 300)
    config, _ = make_config(topic, table)
    # both jobs (each with its own local engine) plan from the same snapshot, then both try to commit:
    # exactly one may win each round
    barrier = threading.Barrier(2, timeout=120)

    def hold(attempt: int) -> None:
        if attempt == 1:
            barrier.wait()

    results: list[Any] = []
    errors: list[BaseException] = []

    def job() -> None:
        try:
            results.append(archive_topic(None, config, config.config.topics[0], before_commit=hold))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=job) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors
    assert sorted(r.attempts for r in results) == [1, 2]  # the loser saw the conflict and re-planned
    loser = max(results, key=lambda r: r.attempts)
    assert loser.up_to_date and loser.rows == 0
    counts = table_offsets(lake.table(table))
    assert set(counts.values()) == {1} and len(counts) == PARTITIONS * 300


def test_many_small_runs_compacted_while_a_consumer_reads(noida: Any, spark: Any, lake: Any, make_config: Any,
                                                          start_proxy: Any) -> None:
    topic, table = unique("compact")
    noida.create_topic(topic, PARTITIONS)
    config, path = make_config(topic, table, compact={"retain_last": 1, "expire_older_than_hours": 0,
                                                      "orphan_older_than_hours": 0, "orphan_every_hours": 0})
    runs = 6
    for run in range(runs):
        produce(noida.bootstrap, topic, PARTITIONS, 100, first=run * 100)
        archive_topic(None, config, config.config.topics[0])
    files_before = data_file_count(spark, "lake", table)
    assert files_before == runs * PARTITIONS
    originals = read_all(noida.bootstrap, topic, PARTITIONS, PARTITIONS * runs * 100)
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, runs * 100)  # everything is served from the lake
    proxy = start_proxy(path)

    # a consumer replays the topic through the proxy while the table is rewritten underneath it
    replayed: dict[Any, Any] = {}
    reader = threading.Thread(target=lambda: replayed.update(
        read_all(proxy.bootstrap, topic, PARTITIONS, PARTITIONS * runs * 100, timeout=120)))
    reader.start()
    # keep the older snapshots (and their files) while the consumer may still read them
    from dataclasses import replace
    lines: list[str] = []
    result = compact_table(spark, config, config.config.topics[0], progress=lines.append,
                           settings=replace(config.compact, retain_last=100, expire_older_than_hours=1))
    reader.join(180)
    assert replayed == originals
    # the archive's files do not overlap: read in offset order by one task per partition (in this process: a
    # rewrite this small), one replace snapshot
    assert any(f"rewriting {runs * PARTITIONS} files" in line and f"in {PARTITIONS} tasks (inline engine)" in line
               for line in lines), lines
    assert f"  rewrote {runs * PARTITIONS} files into {PARTITIONS} (one replace snapshot)" in lines, lines
    assert (result.files_before, result.files_after) == (runs * PARTITIONS, PARTITIONS)
    assert data_file_count(spark, "lake", table) == PARTITIONS
    assert [s.summary.operation.value for s in lake.table(table).snapshots()][-1] == "replace"

    # now expire everything but the newest snapshot, remove orphans, and archive on: no loss, no duplicate
    warehouse = Path(lake.properties["warehouse"].removeprefix("file://"))
    orphan = warehouse / table.replace(".", "/") / "data" / "orphan.parquet"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"left behind by a killed job")
    os.utime(orphan, (time.time() - 60, time.time() - 60))
    cleanup = compact_table(spark, config, config.config.topics[0])
    assert cleanup.expired_data_files >= runs * PARTITIONS and cleanup.orphans_removed >= 1
    assert not orphan.exists()

    # nothing due (one file per partition, one snapshot, the orphan sweep just done): Spark is not asked
    def no_spark() -> Any:
        raise AssertionError("Spark was started for a compaction with nothing to do")

    idle = compact_table(no_spark, config, config.config.topics[0],
                         settings=replace(config.compact, orphan_every_hours=24))
    assert (idle.files_before, idle.files_after, idle.rewritten_files) == (PARTITIONS, PARTITIONS, 0)
    produce(noida.bootstrap, topic, PARTITIONS, 100, first=runs * 100)
    more = archive_topic(None, config, config.config.topics[0])
    assert [(r.start, r.stop) for r in more.ranges] == [(runs * 100, (runs + 1) * 100)] * PARTITIONS
    counts = table_offsets(lake.table(table))
    assert set(counts.values()) == {1} and len(counts) == PARTITIONS * (runs + 1) * 100


def test_errors_name_the_problem_and_the_fix(noida: Any, spark: Any, make_config: Any, tmp_path: Path) -> None:
    from ksi.brokers import free_port
    from ksi.pipeline.archive import ArchiveError

    topic, table = unique("errors")
    config, path = make_config(topic, table, upstream={"bootstrap_servers": f"127.0.0.1:{free_port()}"})
    with pytest.raises(ArchiveError,
                       match=r"cannot reach the Kafka cluster at 127\.0\.0\.1:.*upstream\.bootstrap_servers"):
        archive_topic(spark, config, config.config.topics[0])
    config, path = make_config(topic, table)

    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run([sys.executable, "-m", "ksi", "archive", "--config", str(path), "--topic", "nope"],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 2
    assert "topic 'nope' has no table configured" in result.stderr and "[[topics]] entry" in result.stderr


def test_offsets_deleted_before_they_were_archived_stay_a_gap(noida: Any, lake: Any, make_config: Any,
                                                              start_proxy: Any) -> None:
    """Retention passed the archive (50..79 deleted before a run read them): the run goes on from the log start
    and records the lost range in its snapshot (ksi.lost-offsets, kept by later runs); the proxy then answers
    it as a gap although the lake holds offsets on both sides, instead of stepping over it as a hole the writer
    read, and ksi status lists it."""
    from ksi.lake.commits import lost_offsets
    from ksi.status import collect_status
    from ksi.verify import verify_topic

    topic, table = unique("lost")
    noida.create_topic(topic, 1)
    produce(noida.bootstrap, topic, 1, 50)
    config, path = make_config(topic, table)
    archive_topic(None, config, config.config.topics[0])  # 0..49
    produce(noida.bootstrap, topic, 1, 50, first=50)
    noida.delete_records(topic, 0, 80)
    lines: list[str] = []
    second = archive_topic(None, config, config.config.topics[0], progress=lines.append, verbose=True)
    assert [(r.start, r.stop, r.lost) for r in second.ranges] == [(80, 100, (50, 79))]
    assert any("offsets 50..79 were deleted from Kafka before they were archived" in line for line in lines)
    assert lake.table(table).current_snapshot().summary["ksi.lost-offsets"] == '{"0":[[50,79]]}'
    produce(noida.bootstrap, topic, 1, 20, first=100)
    third = archive_topic(None, config, config.config.topics[0])  # a later run: the record stays
    assert [(r.start, r.stop, r.lost) for r in third.ranges] == [(100, 120, None)]
    current = lake.table(table)
    assert lost_offsets(current, current.current_snapshot().snapshot_id) == {0: [(50, 79)]}
    noida.delete_records(topic, 0, 110)  # 80..109 only in the lake now

    [row] = collect_status(config.config)
    assert row.lost == [(50, 79)] and row.gap is None and row.failed()
    [report] = verify_topic(config.config, topic)
    assert report.archive_lost == [(50, 79)] and not report.ok and not report.mismatch_count

    proxy = start_proxy(path)
    consumer = Consumer(consumer_config(proxy.bootstrap, **{"fetch.error.backoff.ms": 100}))
    got: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got += [m.offset() for m in consumer.consume(500, 0.3) if m.error() is None]
        [position] = consumer.position([TopicPartition(topic, 0)])
        assert got == list(range(50)) and position.offset == 50  # stalled at the gap, nothing skipped
        consumer.assign([TopicPartition(topic, 0, 80)])  # past it: the lake, then the log
        later: list[int] = []
        deadline = time.monotonic() + 20
        while len(later) < 40 and time.monotonic() < deadline:
            later += [m.offset() for m in consumer.consume(500, 0.3) if m.error() is None]
        assert later == list(range(80, 120))
    finally:
        consumer.close()
    assert f"topic {topic} partition 0: offsets 50..79 were deleted from Kafka before ksi archive read them" \
        in proxy.log_text()
