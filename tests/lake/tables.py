"""Small Redpanda-layout tables for the lake side's unit tests, written through PyIceberg with chosen files
and row-group sizes (the shapes that matter: one file mixing partitions, many small files, duplicates)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from kafka.record.default_records import DefaultRecordBatch
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

BASE_MS = 1_700_000_000_000

REDPANDA = Schema(
    NestedField(1, "redpanda", StructType(
        NestedField(3, "partition", IntegerType(), required=True),
        NestedField(4, "offset", LongType(), required=True),
        NestedField(5, "timestamp", TimestamptzType(), required=True),
        NestedField(6, "headers", ListType(9, StructType(NestedField(10, "key", StringType(), required=False),
                                                         NestedField(11, "value", BinaryType(), required=False)),
                                           element_required=False), required=False),
        NestedField(7, "key", BinaryType(), required=False),
        NestedField(8, "timestamp_type", IntegerType(), required=False),
    ), required=True),
    NestedField(2, "value", BinaryType(), required=False),
)


@dataclass(frozen=True)
class Row:
    partition: int
    offset: int
    timestamp: int | None = None      # ms; default BASE_MS + offset
    key: bytes | None = None
    value: bytes | None = b""
    headers: list[tuple[str | None, bytes | None]] | None = None


def value_of(partition: int, offset: int) -> bytes:
    return b"p%d-o%d" % (partition, offset)


def interleaved(partitions: int, per_partition: int) -> list[Row]:
    """Every partition's offsets 0..per_partition-1, partitions interleaved (as one translation writes them)."""
    return [Row(p, o, value=value_of(p, o), key=b"k%d" % o, headers=[("h", b"%d" % o)])
            for o in range(per_partition) for p in range(partitions)]


def catalog(tmp: Path) -> SqlCatalog:
    (tmp / "warehouse").mkdir(exist_ok=True)
    lake = SqlCatalog("lake", uri=f"sqlite:///{tmp / 'catalog.db'}", warehouse=f"file://{tmp / 'warehouse'}")
    lake.create_namespace("t")
    return lake


def arrow_rows(table: Any, rows: list[Row]) -> pa.Table:
    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    redpanda = pa.StructArray.from_arrays([
        pa.array([r.partition for r in rows], pa.int32()),
        pa.array([r.offset for r in rows], pa.int64()),
        pa.array([(BASE_MS + r.offset if r.timestamp is None else r.timestamp) * 1000 for r in rows],
                 pa.timestamp("us", tz="UTC")),
        pa.array([[{"key": k, "value": v} for k, v in r.headers] if r.headers is not None else None for r in rows],
                 pa.list_(header)),
        pa.array([r.key for r in rows], pa.binary()),
        pa.array([0] * len(rows), pa.int32()),
    ], names=["partition", "offset", "timestamp", "headers", "key", "timestamp_type"])
    return pa.Table.from_arrays([redpanda, pa.array([r.value for r in rows], pa.binary())],
                                schema=table.schema().as_arrow())


def write(lake: SqlCatalog, name: str, files: Iterable[list[Row]], row_group_rows: int = 1_000_000) -> Any:
    """One data file per element of ``files`` (one append each), row groups of ``row_group_rows`` rows."""
    table = lake.create_table(f"t.{name}", schema=REDPANDA,
                              properties={"write.parquet.row-group-limit": str(row_group_rows)})
    for rows in files:
        table.append(arrow_rows(table, rows))
    return lake.load_table(f"t.{name}")


def decode(batches: list[bytes]) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record in some record batches."""
    out = []
    for data in batches:
        for record in DefaultRecordBatch(data):
            out.append((record.offset, record.value))
    return out


def offsets(batches: list[bytes]) -> list[int]:
    return [o for o, _ in decode(batches)]


def all_offsets(rows: list[Row], partition: int) -> list[int]:
    return sorted({r.offset for r in rows if r.partition == partition})
