"""Tables exactly as the real writers leave them (tests.shapes, from their source: docs/writers.md), read
through ksi's lake side: every record each layout can carry comes back, in offset order, each offset once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ksi.config import TopicConfig
from ksi.lake.table import LakeTable
from tests.shapes import KafkaRecords, synthetic, write_redpanda_migrated, write_table

from .tables import catalog

PARTITIONS = 3


def read_everything(table: LakeTable) -> dict[tuple[int, int], tuple[int, bytes | None, bytes | None, list[Any]]]:
    """(partition, offset) -> (timestamp, key, value, headers) of every record the lake serves."""
    table.offset_ranges()
    plan = table.plan
    out: dict[tuple[int, int], tuple[int, bytes | None, bytes | None, list[Any]]] = {}
    for p, partition_plan in plan.partitions.items():
        c = 0
        while c < partition_plan.components:
            read_plan = table.read_plan(plan, p, c, None)
            result = table.read(plan, read_plan, None)
            assert not result.failed, result.failed
            served = read_plan.served[p]
            for span in result.spans:
                if span.records is None:
                    continue
                cols = span.records.columns
                headers = cols.headers.to_pylist() if cols.headers is not None else [None] * len(cols)
                for o, ts, k, v, h in zip(cols.offsets.tolist(), cols.timestamps.tolist(), cols.keys.to_pylist(),
                                          cols.values.to_pylist(), headers, strict=True):
                    key = (span.partition, o)
                    if key in out:
                        continue  # served again as another partition's read's side product: the same record
                    out[key] = (ts, k, v, [(x["key"], x["value"]) for x in h] if h else [])
            c = max(served) + 1
    return out


def expected(records: KafkaRecords, *, keys: bool = True, headers: bool = True,
             values: bool = True) -> dict[tuple[int, int], tuple[int, bytes | None, bytes | None, list[Any]]]:
    out = {}
    for p, o, ts, _tt, k, v, h in records.rows():
        out[(p, o)] = (ts, k if keys else None, v if values else None,
                       [(hk.encode() if isinstance(hk, str) else hk, hv) for hk, hv in h] if headers else [])
    return out


def normalised(served: dict[Any, Any], values: bool = True) -> dict[Any, Any]:
    return {k: (ts, key, v if values else None, [(hk.encode() if isinstance(hk, str) else hk, hv) for hk, hv in h])
            for k, (ts, key, v, h) in served.items()}


@pytest.mark.parametrize(("layout", "shape", "options"), [
    ("ksi", "archive", {}),
    ("ksi", "one-file", {}),
    ("redpanda", "hourly", {"mode": "key_value"}),
    ("redpanda", "streaming", {"mode": "key_value", "version": "v24.3"}),
    ("redpanda", "one-file", {"mode": "key_value", "mix_partitions": True}),
    ("redpanda", "hourly", {"mode": "key_value", "column_bounds": False}),
    ("automq", "streaming", {"key_type": "raw"}),
    ("automq", "one-file", {"key_type": "raw", "row_group_rows": 700}),
    ("automq", "large", {"key_type": "raw", "rows_per_file": 300}),
])
def test_every_record_a_layout_carries_comes_back(tmp_path: Path, layout: str, shape: str,
                                                  options: dict[str, Any]) -> None:
    records = synthetic(3_000, PARTITIONS, seed=3)
    lake = catalog(tmp_path)
    write_table(lake, "t.topic", records, layout=layout, shape=shape, **options)
    table = LakeTable(lake, TopicConfig(name="topic", table="t.topic", layout=layout), window_rows=500)
    assert normalised(read_everything(table)) == expected(records)


def test_automq_string_keys_are_what_automq_kept(tmp_path: Path) -> None:
    """AutoMQ's default keeps keys as strings (UTF-8, bytes that are not replaced): ksi serves the bytes of
    that string, the best the table holds."""
    records = synthetic(600, PARTITIONS, seed=4)
    lake = catalog(tmp_path)
    write_table(lake, "t.topic", records, layout="automq", shape="streaming")
    table = LakeTable(lake, TopicConfig(name="topic", table="t.topic", layout="automq"), window_rows=500)
    served = read_everything(table)
    want = expected(records)
    assert served.keys() == want.keys()
    for k, (ts, key, value, headers) in served.items():
        original = want[k]
        assert (ts, value, headers) == (original[0], original[2], original[3])
        assert key == original[1].decode("utf-8", errors="replace").encode()


def test_kafka_connect_offsets_and_timestamps(tmp_path: Path) -> None:
    """Iceberg's Kafka Connect sink keeps no key and no headers (docs/writers.md), its partition as a long and
    its timestamp as ms: the offsets per partition and timestamp lookups come back exact (values are typed
    columns, re-encoded through the registry: tests/integration)."""
    records = synthetic(900, PARTITIONS, seed=5, typed=True)
    lake = catalog(tmp_path)
    write_table(lake, "t.topic", records, layout="kafka-connect", shape="streaming")
    table = LakeTable(lake, TopicConfig(name="topic", table="t.topic", layout="kafka-connect"), window_rows=500)
    counts = {p: int((records.partition.to_numpy() == p).sum()) for p in range(PARTITIONS)}
    assert ({p: (r.first, r.last) for p, r in table.offset_ranges().items()}
            == {p: (0, n - 1) for p, n in counts.items()})
    rows = sorted(records.rows(), key=lambda r: (r[0], r[1]))
    p, o, ts = rows[len(rows) // 2][:3]
    assert table.offset_for_timestamp(p, ts) == (o, ts)


def test_redpanda_migration_old_rows_read_from_the_renamed_columns(tmp_path: Path) -> None:
    """Redpanda's v25.3 migration: old rows keep their timestamp and header keys only in timestamp_v1 and
    key_v1 (the new columns are null there), new rows only in the new columns: both come back whole."""
    before = synthetic(400, PARTITIONS, seed=6)
    after = synthetic(400, PARTITIONS, seed=7, first_offsets=[int((before.partition.to_numpy() == p).sum())
                                                              for p in range(PARTITIONS)], first_row=400)
    lake = catalog(tmp_path)
    write_redpanda_migrated(lake, "t.topic", before, after)
    table = LakeTable(lake, TopicConfig(name="topic", table="t.topic", layout="redpanda"), window_rows=500)
    want = expected(before) | expected(after)
    assert normalised(read_everything(table)) == want


def test_redpanda_dead_letters_are_merged_back_in_offset_order(tmp_path: Path) -> None:
    """Redpanda's schema mode sends records it cannot translate (here: values that do not decode) to
    ``<table>~dlq`` with their raw bytes; ksi reads both tables as one log: no hole where they were, their
    bytes as produced."""
    from ksi.registry import start_registry
    from ksi.registry.client import RegistryClient
    from tests.shapes.anomalies import invalid_values

    records = invalid_values(synthetic(1_200, PARTITIONS, seed=8, typed=True), every=7)
    lake = catalog(tmp_path)
    report = write_table(lake, "t.topic", records, layout="redpanda", shape="streaming", mode="schema")
    assert report.dlq is not None and len(report.dlq.scan().to_arrow()) > 50
    registry = start_registry("127.0.0.1", 0, tmp_path / "registry")
    try:
        table = LakeTable(lake, TopicConfig(name="topic", table="t.topic", layout="redpanda"),
                          registry=RegistryClient(registry.url), window_rows=500)
        served = read_everything(table)
    finally:
        registry.stop()
    want = expected(records)
    assert served.keys() == want.keys()  # every offset, the dead letters' included
    invalid = {(p, o) for p, o, *_ in (r for r, typed in zip(records.rows(), records.typed.to_pylist(), strict=True)
                                       if typed is None)}
    assert invalid and all(served[k][2] == want[k][2] for k in invalid)  # raw bytes as produced
    assert all(served[k][:2] == want[k][:2] for k in served)          # timestamps and keys everywhere
