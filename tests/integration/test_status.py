"""`ksi status` as an operator runs it, against noida-db (whose log start really moves) and a SQLite catalog:
the picture per partition (lake, overlap, Kafka, lost offsets), the JSON, the lag of the lake behind the log
in records and seconds, the config found without --config, and an unreachable broker told in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from conftest import REPO_ROOT
from ksi.brokers import BrokerProcess, free_port
from test_history import BASE_TS, PARTITIONS, PER_PARTITION, archive, produce, strip


def status(*args: str, cwd: Path = REPO_ROOT, encoding: str = "utf-8") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ksi", "status", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, encoding=encoding,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONIOENCODING": encoding,
                               "KSI_CONFIG": ""}, check=False)


def write_config(path: Path, bootstrap: str, props: dict[str, str], topic: str) -> Path:
    path.write_text(f"""
[upstream]
bootstrap_servers = "{bootstrap}"
[catalog]
name = "lake"
uri = "{props['uri']}"
warehouse = "{props['warehouse']}"
[[topics]]
name = "{topic}"
table = "history.{topic.replace('-', '_')}"
""")
    return path


def test_status_draws_the_seam_and_the_lag(noida: BrokerProcess, catalog: Any, tmp_path: Path) -> None:
    lake, props = catalog
    topic = f"seam-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, PARTITIONS)
    originals = strip(produce(noida.bootstrap, topic))
    archive(lake, f"history.{topic.replace('-', '_')}", originals, below=50)
    noida.delete_records(topic, 0, 100)  # partition 0: 50..99 lost
    noida.delete_records(topic, 1, 20)   # partition 1: 20..49 in both
    config = write_config(tmp_path / "ksi.toml", noida.bootstrap, props, topic)

    picture = status(cwd=tmp_path)  # no --config: ./ksi.toml is found
    assert picture.returncode == 1, picture.stderr  # a gap fails the check
    assert picture.stderr == ""
    lines = picture.stdout.splitlines()
    assert lines[0].startswith(f"{topic} <- history.{topic.replace('-', '_')} (snapshot ")
    part0 = next(line for line in lines if line.startswith("   0 |"))
    part1 = next(line for line in lines if line.startswith("   1 |"))
    bar0, bar1 = part0.split("|")[1], part1.split("|")[1]
    assert set(bar0) == {"█", "╳", "░"} and bar0.index("█") < bar0.index("╳") < bar0.index("░")
    assert set(bar1) == {"█", "▓", "░"} and bar1.index("█") < bar1.index("▓") < bar1.index("░")
    assert "lake 0..49  log 100..199  hot wm 100  lag 150 rec / " in part0 and "LOST 50..99" in part0
    assert "lake 0..49  log 20..199  hot wm 20  lag 150 rec / " in part1 and "LOST" not in part1
    assert lines[-1].split() == ["█", "lake", "only", "▓", "lake", "and", "Kafka", "░", "Kafka", "only", "╳", "in",
                                 "neither", "(lost)"]

    plain = status("--config", str(config), encoding="ascii")
    assert plain.returncode == 1 and "#" in plain.stdout and "X" in plain.stdout and "█" not in plain.stdout

    result = status("--config", str(config), "--json")
    rows = {r["partition"]: r for r in json.loads(result.stdout)}
    now = time.time()
    assert (rows[0]["lake_first"], rows[0]["lake_last"], rows[0]["lake_next"]) == (0, 49, 50)
    assert (rows[0]["log_start_offset"], rows[0]["high_watermark"], rows[0]["hot_watermark"]) == (100, PER_PARTITION,
                                                                                                   100)
    assert rows[0]["gap"] == [50, 99] and rows[1]["gap"] is None
    assert rows[0]["lag_records"] == rows[1]["lag_records"] == PER_PARTITION - 50
    # seconds: the age of the first record the lake lacks (partition 0: 50..99 are gone, so offset 100)
    assert rows[0]["next_timestamp_ms"] == BASE_TS + 100 * 1000
    assert rows[1]["next_timestamp_ms"] == BASE_TS + 50 * 1000
    assert abs(rows[1]["lag_seconds"] - (now - (BASE_TS + 50_000) / 1000)) < 120
    assert rows[0]["snapshot_id"] is not None and rows[0]["problem"] is None


def test_status_of_an_archived_topic_is_zero_lag(noida: BrokerProcess, catalog: Any, tmp_path: Path) -> None:
    lake, props = catalog
    topic = f"done-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, PARTITIONS)
    archive(lake, f"history.{topic.replace('-', '_')}", strip(produce(noida.bootstrap, topic)), below=PER_PARTITION)
    result = status("--config", str(write_config(tmp_path / "k.toml", noida.bootstrap, props, topic)), "--json")
    assert result.returncode == 0, result.stdout
    assert [(r["lag_records"], r["lag_seconds"]) for r in json.loads(result.stdout)] == [(0, 0.0)] * PARTITIONS


def test_status_with_the_broker_unreachable_says_so_in_one_line(catalog: Any, tmp_path: Path) -> None:
    _, props = catalog
    port = free_port()
    result = status("--config", str(write_config(tmp_path / "k.toml", f"127.0.0.1:{port}", props, "gone")))
    assert result.returncode == 1
    assert result.stderr == ""  # librdkafka's own retry lines are not printed
    row = next(line for line in result.stdout.splitlines() if line.startswith("   - |"))
    assert f"Kafka unreachable at 127.0.0.1:{port} (upstream.bootstrap_servers)" in row
