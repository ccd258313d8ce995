"""``ksi compact`` plans from metadata alone, and its cost follows the files it rewrites: only partitions with
at least ``min_input_files`` small files are rewritten (its ``where``), files at the target size and
partitions with a single small file are left alone, and nothing due starts nothing.  No Spark here: the
plan is PyIceberg's view of a ksi-layout table written as the archive writes it (one file per run per
partition)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

from ksi.history.ksi_table import arrow_schema, partition_spec, raw_value_schema, sort_order
from ksi.pipeline.compact import ORPHANS_PROPERTY, _where, plan_compaction
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
