from __future__ import annotations

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from ksi.history.ksi_table import raw_value_schema
from ksi.lake.layouts import LayoutError, resolve


def test_ksi_layout_resolves_every_part() -> None:
    layout = resolve("ksi", raw_value_schema(), "history.t")
    assert (layout.key, layout.headers, layout.raw_value, layout.schema_id) == (
        "kafka_key", "kafka_headers", "kafka_value", "kafka_value_schema_id")
    assert layout.value_columns == ()
    assert layout.aborted is None  # a table archived before kafka_aborted existed: no record is aborted


def test_ksi_layout_reads_the_aborted_marker_and_never_as_a_value_column() -> None:
    from pyiceberg.types import BooleanType

    schema = Schema(*raw_value_schema().fields, NestedField(20, "n", LongType()),
                    NestedField(21, "kafka_aborted", BooleanType()))
    layout = resolve("ksi", schema, "history.t")
    assert layout.aborted == "kafka_aborted" and layout.value_columns == ("n",)
    assert "kafka_aborted" in layout.selected_fields()
    wrong = Schema(*raw_value_schema().fields, NestedField(21, "kafka_aborted", StringType()))
    with pytest.raises(LayoutError, match="kafka_aborted"):
        resolve("ksi", wrong, "history.t")


def test_redpanda_key_value_mode() -> None:
    schema = Schema(
        NestedField(1, "redpanda", StructType(
            NestedField(2, "partition", IntegerType(), required=True),
            NestedField(3, "offset", LongType(), required=True),
            NestedField(4, "timestamp", TimestamptzType(), required=True),
            NestedField(5, "headers", ListType(10, StructType(NestedField(11, "key", StringType()),
                                                                NestedField(12, "value", BinaryType())))),
            NestedField(6, "key", BinaryType()),
            NestedField(7, "timestamp_type", IntegerType()),
        ), required=True),
        NestedField(8, "value", BinaryType()),
    )
    layout = resolve("redpanda", schema, "t")
    assert (layout.partition, layout.key, layout.raw_value, layout.value_columns) == (
        "redpanda.partition", "redpanda.key", "value", ())


def test_automq_map_headers_and_typed_values() -> None:
    schema = Schema(
        NestedField(1, "_kafka_metadata", StructType(NestedField(2, "partition", IntegerType()),
                                                     NestedField(3, "offset", LongType()),
                                                     NestedField(4, "timestamp", LongType()))),
        NestedField(5, "_kafka_key", BinaryType()),
        NestedField(6, "_kafka_header", MapType(10, StringType(), 11, BinaryType())),
        NestedField(7, "amount", LongType()),
    )
    layout = resolve("automq", schema, "t")
    assert layout.layout.headers_as_map and layout.value_columns == ("amount",) and layout.raw_value is None


@pytest.mark.parametrize("nested", [False, True])
def test_kafka_connect_flat_and_nested(nested: bool) -> None:
    if nested:
        meta = [NestedField(1, "_kafka_metadata", StructType(NestedField(2, "partition", IntegerType()),
                                                             NestedField(3, "offset", LongType()),
                                                             NestedField(4, "timestamp", LongType())))]
    else:
        meta = [NestedField(1, "_kafka_metadata_partition", IntegerType()),
                NestedField(2, "_kafka_metadata_offset", LongType()),
                NestedField(3, "_kafka_metadata_timestamp", LongType())]
    schema = Schema(*meta, NestedField(9, "id", LongType()), NestedField(10, "name", StringType()))
    layout = resolve("kafka-connect", schema, "t")
    assert layout.value_columns == ("id", "name") and layout.key is None


def test_mismatch_names_what_is_missing_and_the_columns() -> None:
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "payload", StringType()))
    with pytest.raises(LayoutError) as info:
        resolve("streambased", schema, "history.orders")
    message = str(info.value)
    assert "history.orders" in message and "kafka_partition" in message and "id, payload" in message


def test_wrong_column_types_are_named() -> None:
    """A table whose offset column is a string, or whose headers are not (key, value) pairs, is refused at
    load time naming the column and its type (the topic is then served from Kafka alone)."""
    schema = Schema(NestedField(1, "kafka_partition", IntegerType()), NestedField(2, "kafka_offset", StringType()),
                    NestedField(3, "kafka_timestamp", LongType()), NestedField(4, "id", LongType()))
    with pytest.raises(LayoutError, match=r"column kafka_offset \(offset\) is string, expected one of int, long"):
        resolve("streambased", schema, "t")
    schema = Schema(NestedField(1, "kafka_partition", IntegerType()), NestedField(2, "kafka_offset", LongType()),
                    NestedField(3, "kafka_timestamp", StringType()), NestedField(4, "id", LongType()))
    with pytest.raises(LayoutError, match=r"column kafka_timestamp \(timestamp\) is string"):
        resolve("streambased", schema, "t")
