"""``ksi verify TOPIC`` against noida-db and a table written as ksi's archive writes it: equal records pass,
a changed record and lost offsets fail naming the offset, holes (transaction markers) and the seam are listed."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from conftest import to_toml
from ksi.brokers import BrokerProcess
from ksi.registry import RegistryServer
from test_seam import LOG_START, PARTITIONS, lake_records, produce_transactions, registry  # noqa: F401 - a fixture
from tests.shapes import write_table


def run_verify(config: Path, topic: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ksi", "verify", topic, "--config", str(config), *extra],
                          capture_output=True, text=True, timeout=120, check=False)


def config_for(tmp_path: Path, broker: BrokerProcess, props: dict[str, str], topic: str, table: str) -> Path:
    path = tmp_path / "verify.toml"
    path.write_text(to_toml({"upstream": {"bootstrap_servers": broker.bootstrap}, "catalog": {"name": "lake", **props},
                             "topics": [{"name": topic, "table": table}]}))
    return path


def test_verify_compares_lists_holes_and_fails_on_a_difference(noida: BrokerProcess, catalog: Any,
                                                                tmp_path: Path) -> None:
    lake, props = catalog
    topic = f"verify-{uuid.uuid4().hex[:6]}"
    produced = produce_transactions(noida, topic)
    kept = {k: v for k, v in produced.items() if k[1] < 120}  # the archive went up to 119; the log starts at 100
    table = f"history.{topic.replace('-', '_')}"
    records = lake_records(kept | {}, drop_tombstones=False)
    # lake_records keeps offsets below LOG_START only: add the overlap 100..119 as the archive has it
    overlap = lake_records({(p, o - 20): v for (p, o), v in kept.items() if o >= LOG_START}, drop_tombstones=False)
    overlap = type(overlap)(overlap.partition, pa.array([o + 20 for o in overlap.offset.to_pylist()], pa.int64()),
                            overlap.timestamp_ms, pa.array([b"k%d" % (o + 20) for o in overlap.offset.to_pylist()]),
                            overlap.value, overlap.headers)
    both = type(records).concat([records, overlap])
    write_table(lake, table, both, layout="ksi", shape="archive", commit_state=False,
                snapshot_properties={"ksi.archived-offsets": json.dumps({str(p): 120 for p in range(PARTITIONS)})})
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, LOG_START)
    config = config_for(tmp_path, noida, props, topic, table)

    done = run_verify(config, topic)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{topic} partition 0: OK" in done.stdout and "compared 100..118: 18 equal" in done.stdout
    assert "holes in the lake: 11 offset(s) without a record (9..9, 19..19" in done.stdout  # commit markers
    report = json.loads(run_verify(config, topic, "--json").stdout)
    assert report["ok"] and report["partitions"][0]["equal"] == 18

    # A record changed in the lake (a new table holding one differing value at offset 105 of partition 1)
    changed_table = table + "_changed"
    values = both.value.to_pylist()
    rows = list(zip(both.partition.to_pylist(), both.offset.to_pylist(), strict=True))
    values[rows.index((1, 105))] = b"changed"
    changed = type(both)(both.partition, both.offset, both.timestamp_ms, both.key, pa.array(values, pa.binary()),
                         both.headers)
    write_table(lake, changed_table, changed, layout="ksi", shape="archive")
    config = config_for(tmp_path, noida, props, topic, changed_table)
    done = run_verify(config, topic)
    assert done.returncode == 1
    assert f"{topic} partition 1: FAILED" in done.stdout and "mismatch: offset 105: value differ" in done.stdout


def test_verify_names_lost_offsets(noida: BrokerProcess, catalog: Any, tmp_path: Path) -> None:
    lake, props = catalog
    topic = f"verify-lost-{uuid.uuid4().hex[:6]}"
    produced = produce_transactions(noida, topic)
    table = f"history.{topic.replace('-', '_')}"
    write_table(lake, table, lake_records({k: v for k, v in produced.items() if k[1] < 90}, drop_tombstones=False),
                layout="ksi", shape="archive", commit_state=False,
                snapshot_properties={"ksi.archived-offsets": json.dumps({str(p): 90 for p in range(PARTITIONS)})})
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, LOG_START)
    done = run_verify(config_for(tmp_path, noida, props, topic, table), topic, "--partition", "0")
    assert done.returncode == 1
    assert "seam: lost 90..99 (the writer read up to 89)" in done.stdout
    assert "partition 1" not in done.stdout


@pytest.mark.parametrize("layout", ["redpanda", "kafka-connect"])
def test_verify_compares_what_each_layout_carries(noida: BrokerProcess, catalog: Any, registry: RegistryServer,  # noqa: F811
                                                  tmp_path: Path, layout: str) -> None:
    """A Redpanda key_value table carries every field: all are compared.  A Kafka Connect table has no key and
    no headers, and its values are rebuilt as Avro from columns: only timestamps are compared, the rest is
    reported as not compared, and the tombstones the sink drops (96..98, held by the broker) are explained
    holes, not mismatches.  The progress line comes as often as ``--progress-seconds`` says."""
    lake, props = catalog
    topic = f"verify-{layout}-{uuid.uuid4().hex[:6]}"
    produced = produce_transactions(noida, topic)
    table = f"history.{topic.replace('-', '_')}"
    connect = layout == "kafka-connect"
    options = {"shape": "streaming"} if connect else {"shape": "hourly", "mode": "key_value"}
    write_table(lake, table, lake_records(produced, drop_tombstones=connect, typed=connect, below=120),
                layout=layout, **options)
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, 90)  # the broker and the lake both hold 90..118 (119 is a marker)
    config = tmp_path / "verify.toml"
    config.write_text(to_toml({"upstream": {"bootstrap_servers": noida.bootstrap},
                               "catalog": {"name": "lake", **props}, "schema_registry": {"url": registry.url},
                               "topics": [{"name": topic, "table": table, "layout": layout}]}))

    done = run_verify(config, topic, "--partition", "0", "--progress-seconds", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    equal = 27 - 3 if connect else 27  # 90..118 without the markers 99 and 109 (and the dropped tombstones)
    assert f"{topic} partition 0: OK" in done.stdout and f"compared 90..118: {equal} equal" in done.stdout
    assert f"ksi verify: {topic} partition 0: " in done.stderr  # a progress line: every record at interval 0
    report = json.loads(run_verify(config, topic, "--partition", "0", "--json").stdout)["partitions"][0]
    if connect:
        assert "not compared (rebuilt/lost in this layout): key: lost" in done.stdout
        assert set(report["not_compared"]) == {"key", "headers", "value"}
        # the markers 99, 109 and the tombstones 96..98 are checked against the broker: explained; the markers
        # 9..89 lie below the log start and the table keeps no commit state of the sink: not explained
        assert report["hole_offsets"] == 9 + 4 + 1  # 9, 19, ..., 89; 96..99; 109
        assert (report["holes_explained"], report["holes_unexplained"]) == (5, 9)
    else:
        assert "not compared" not in done.stdout and report["not_compared"] == {}
    assert report["ok"] and report["equal"] == equal and report["mismatch_count"] == 0

    quiet = run_verify(config, topic, "--partition", "0", "--progress-seconds", "3600")
    assert quiet.returncode == 0 and "ksi verify:" not in quiet.stderr
