"""``ksi compact`` plans from metadata alone, and its cost follows the files it rewrites: only partitions with
at least ``min_input_files`` small files are rewritten, files at the target size and partitions with a single
small file are left alone, and nothing due starts nothing.  The rewrite of non-overlapping files (as the
archive writes them) reads them in offset order into one replace snapshot, committed on top of a concurrent
append and refused when its files are gone; overlapping files are left to Iceberg's sorting procedure.  No
Spark here (the rewrite's tasks run in this process): a real SQLite catalog and PyIceberg's view of a
ksi-layout table written as the archive writes it (one file per run per partition)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from ksi.history.ksi_table import arrow_schema, partition_spec, raw_value_schema, sort_order
from ksi.pipeline.compact import ORPHANS_PROPERTY, _where, plan_compaction
from ksi.pipeline.files import TableTarget, describe_files
from ksi.pipeline.rewrite import CompactionConflict, RewriteJob, commit_replace, plan_rewrite, rewrite_group
from ksi.pipeline.settings import CompactSettings

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def _rows(partition: int, first: int, count: int, value_bytes: int) -> pa.Table:
    schema = arrow_schema()
    columns = {
        "kafka_partition": pa.array([partition] * count, pa.int32()),
        "kafka_offset": pa.array(range(first, first + count), pa.int64()),
        "kafka_timestamp": pa.array([1_700_000_000_000_000 + o for o in range(first, first + count)],
                                    pa.timestamp("us", tz="UTC")),
        "kafka_timestamp_type": pa.array([0] * count, pa.int32()),
        "kafka_key": pa.array([None] * count, pa.binary()),
        "kafka_headers": pa.array([None] * count, schema.field("kafka_headers").type),
        # incompressible values, so file sizes follow the bytes written
        "kafka_value": pa.array([random.Random(o).randbytes(value_bytes) for o in range(first, first + count)],
                                pa.binary()),
        "kafka_value_schema_id": pa.array([None] * count, pa.int32()),
    }
    return pa.Table.from_pydict(columns, schema=schema)


def _table(tmp_path: Path) -> tuple[SqlCatalog, str]:
    (tmp_path / "warehouse").mkdir()
    lake = SqlCatalog("lake", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'warehouse'}")
    lake.create_namespace("history")
    lake.create_table("history.orders", schema=raw_value_schema(), partition_spec=partition_spec(),
                      sort_order=sort_order())
    return lake, "history.orders"


def test_only_partitions_with_enough_small_files_are_rewritten(tmp_path: Path) -> None:
    lake, name = _table(tmp_path)
    table = lake.load_table(name)
    # partition 0: three small archive runs; partition 1: one large file and one small one; partition 2: large
    for first in (0, 10, 20):
        table.append(_rows(0, first, 10, 100))
    table.append(_rows(1, 0, 400, 1_000))
    table.append(_rows(1, 400, 10, 100))
    table.append(_rows(2, 0, 400, 1_000))
    table = lake.load_table(name)
    settings = CompactSettings(target_file_size_bytes=200_000, min_input_files=2, orphan_every_hours=24)

    plan = plan_compaction(table, settings, NOW)

    assert plan.files == 6
    assert plan.partitions == {0: 3}          # partition 1 has one small file: below min_input_files
    assert plan.rewrite_files == 3
    assert _where(plan.partitions) == "kafka_partition IN (0)"
    assert plan.expiring == 0                 # every snapshot is newer than the expiry age and the last 20
    assert plan.orphans_due                   # never swept


def test_nothing_due_means_nothing_to_do(tmp_path: Path) -> None:
    lake, name = _table(tmp_path)
    table = lake.load_table(name)
    table.append(_rows(0, 0, 400, 1_000))
    table.append(_rows(1, 0, 10, 100))
    with table.transaction() as tx:
        tx.set_properties({ORPHANS_PROPERTY: str(NOW.timestamp() - 3600)})
    table = lake.load_table(name)

    plan = plan_compaction(table, CompactSettings(target_file_size_bytes=200_000, min_input_files=2,
                                                  orphan_every_hours=24), NOW)

    assert plan.nothing_to_do, plan
    # a day later the orphan sweep is due again, and only that
    later = plan_compaction(table, CompactSettings(target_file_size_bytes=200_000, min_input_files=2,
                                                   orphan_every_hours=24),
                            datetime.fromtimestamp(NOW.timestamp() + 86_400, UTC))
    assert later.orphans_due and not later.partitions and not later.expiring


def test_old_snapshots_beyond_the_retained_ones_are_due_to_expire(tmp_path: Path) -> None:
    lake, name = _table(tmp_path)
    table = lake.load_table(name)
    for first in range(0, 50, 10):
        table.append(_rows(0, first, 10, 100))
    table = lake.load_table(name)
    newest = max(s.timestamp_ms for s in table.metadata.snapshots)
    moment = datetime.fromtimestamp(newest / 1000 + 10 * 3600, UTC)

    plan = plan_compaction(table, CompactSettings(expire_older_than_hours=5, retain_last=2), moment)

    assert plan.expiring == 3                 # five snapshots, all older than 5 h; the newest two kept


def _rewrite_inline(lake: SqlCatalog, name: str) -> tuple[list[Any], list[Any], Any]:
    """plan_rewrite of every small file, the tasks run in this process, the files described."""
    table = lake.load_table(name)
    planned = plan_rewrite(table, 200_000 * 0.75, {0, 1})
    assert planned is not None
    groups, replaced = planned
    job = RewriteJob(run_id="r" * 32, target=TableTarget.of(table, [g.partition for g in groups],
                                                             target_file_bytes=200_000))
    added = describe_files(table, [f for g in groups for f in rewrite_group(job, g)])
    return replaced, added, groups


def test_small_files_are_rewritten_in_offset_order_into_one_replace_snapshot(tmp_path: Path) -> None:
    lake, name = _table(tmp_path)
    table = lake.load_table(name)
    # appended out of order: the rewrite orders a partition's files by their offsets, not by their age
    for first in (20, 0, 10):
        table.append(_rows(0, first, 10, 100))
    table.append(_rows(1, 0, 5, 100))
    table.append(_rows(1, 5, 5, 100))
    before = lake.load_table(name).scan().to_arrow().sort_by([("kafka_partition", "ascending"),
                                                              ("kafka_offset", "ascending")])

    replaced, added, groups = _rewrite_inline(lake, name)
    assert [(g.partition, len(g.paths), g.records) for g in groups] == [(0, 3, 30), (1, 2, 10)]
    snapshot = commit_replace(lake, name, replaced, added)

    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "replace"
    table = lake.load_table(name)
    files = [task.file for task in table.scan().plan_files()]
    assert len(files) == 2 and {f.record_count for f in files} == {30, 10}
    # the same rows, and each new file's rows in offset order (no sort was run: the inputs did not overlap)
    for f in files:
        offsets = pq.read_table(f.file_path.removeprefix("file://"), columns=["kafka_offset"])["kafka_offset"]
        assert offsets.to_pylist() == sorted(offsets.to_pylist())
    after = table.scan().to_arrow().sort_by([("kafka_partition", "ascending"), ("kafka_offset", "ascending")])
    assert after.cast(before.schema).equals(before)  # (binary or large_binary: as each file was read)


def test_overlapping_files_are_left_to_a_sort(tmp_path: Path) -> None:
    lake, name = _table(tmp_path)
    table = lake.load_table(name)
    table.append(_rows(0, 0, 10, 100))
    table.append(_rows(0, 5, 10, 100))          # offsets 5..9 twice: another writer's retry
    assert plan_rewrite(lake.load_table(name), 150_000, {0}) is None


def test_a_replace_commits_on_top_of_an_append_and_refuses_when_its_files_are_gone(tmp_path: Path) -> None:
    lake, name = _table(tmp_path)
    table = lake.load_table(name)
    for first in (0, 10):
        table.append(_rows(0, first, 10, 100))
    replaced, added, _ = _rewrite_inline(lake, name)
    lake.load_table(name).append(_rows(0, 20, 10, 100))  # an archive run commits while the rewrite runs
    commit_replace(lake, name, replaced, added)
    offsets = sorted(lake.load_table(name).scan().to_arrow()["kafka_offset"].to_pylist())
    assert offsets == list(range(30))                    # the append's rows stay, the rewrite's are in once

    again_replaced, _, _ = _rewrite_inline(lake, name)
    assert {f.file_path for f in again_replaced} & {f.file_path for f in replaced} == set()
    with pytest.raises(CompactionConflict):             # the same files again: another compaction won
        commit_replace(lake, name, replaced, added)
