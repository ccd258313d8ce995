"""The ksi table layout as Iceberg objects: schema, partition spec and sort order.

Shared by the archive pipeline (which writes such tables) and the tests; the proxy reads any layout
through :mod:`ksi.lake.layouts`.

Partitioned by ``kafka_partition`` (identity), sorted by ``kafka_offset``: a Fetch for one partition
at one offset prunes to that partition's files by partition value, then to the file and row group
whose ``kafka_offset`` min/max statistics contain the offset.
"""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.transforms import IdentityTransform
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

__all__ = ["ABORTED_COLUMN", "TABLE_PROPERTIES", "arrow_schema", "partition_spec", "raw_value_schema", "sort_order",
           "value_columns"]

# Small row groups: a cold Fetch at any offset decodes one row group (~8 MiB, ~80k records of ~100 B),
# not Parquet's default 128 MiB; files stay large (one file per partition per archive run, compacted).
TABLE_PROPERTIES = {
    "write.parquet.row-group-size-bytes": str(8 << 20),   # Spark's Iceberg writer
    "write.parquet.row-group-limit": "65536",             # PyIceberg's writer (rows)
    "write.target-file-size-bytes": str(256 << 20),
}

PARTITION_ID, OFFSET_ID = 1, 2
# Optional boolean, true for a record of an aborted transaction: added by the archive to every table it writes
# (:func:`ksi.pipeline.archive.ensure_aborted_column`), so tables made before it existed get it too.
ABORTED_COLUMN = "kafka_aborted"


def raw_value_schema() -> Schema:
    """The ksi layout for values kept as raw bytes (no typed value columns)."""
    return Schema(
        NestedField(PARTITION_ID, "kafka_partition", IntegerType(), required=True),
        NestedField(OFFSET_ID, "kafka_offset", LongType(), required=True),
        NestedField(3, "kafka_timestamp", TimestamptzType(), required=False),
        NestedField(4, "kafka_timestamp_type", IntegerType(), required=False),
        NestedField(5, "kafka_key", BinaryType(), required=False),
        NestedField(6, "kafka_headers", ListType(
            element_id=10,
            element_type=StructType(
                NestedField(11, "key", StringType(), required=False),
                NestedField(12, "value", BinaryType(), required=False),
            ),
            element_required=False,
        ), required=False),
        NestedField(7, "kafka_value", BinaryType(), required=False),
        NestedField(8, "kafka_value_schema_id", IntegerType(), required=False),
    )


def value_columns(value: StructType) -> Schema:
    """Typed value columns as a ksi table holds them, for ``UpdateSchema.union_by_name``: every top-level
    column optional (rows whose value stayed raw bytes, or was null, leave them empty); nested fields
    keep their nullability.  Field ids are placeholders; the update assigns the table's own."""
    metadata = {f.name for f in raw_value_schema().fields} | {ABORTED_COLUMN}
    clashes = [f.name for f in value.fields if f.name in metadata]
    if clashes:
        raise ValueError(f"value field(s) {', '.join(clashes)} clash with the ksi layout's metadata columns")
    return Schema(*(NestedField(f.field_id, f.name, f.field_type, required=False, doc=f.doc) for f in value.fields))


def partition_spec() -> PartitionSpec:
    return PartitionSpec(PartitionField(source_id=PARTITION_ID, field_id=1000, transform=IdentityTransform(),
                                        name="kafka_partition"))


def sort_order() -> SortOrder:
    return SortOrder(SortField(source_id=PARTITION_ID, transform=IdentityTransform()),
                     SortField(source_id=OFFSET_ID, transform=IdentityTransform()))


def arrow_schema() -> pa.Schema:
    """The Arrow schema matching :func:`raw_value_schema`, for writers."""
    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    return pa.schema([
        pa.field("kafka_partition", pa.int32(), nullable=False),
        pa.field("kafka_offset", pa.int64(), nullable=False),
        pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("kafka_timestamp_type", pa.int32()),
        pa.field("kafka_key", pa.binary()),
        pa.field("kafka_headers", pa.list_(header)),
        pa.field("kafka_value", pa.binary()),
        pa.field("kafka_value_schema_id", pa.int32()),
    ])
