"""Property: for random record schemas and data, fastavro's bodies -> decode_values -> encode_values gives
the same bytes, and decode_values reads what fastavro reads."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from ksi.avro import (
    arrow_type,
    decode_values,
    encode_values,
    iceberg_struct,
    parse_schema,
    unsupported_reason,
)

from . import avro_bytes, avro_read, data, normalize, record_schemas

# KSI_AVRO_EXAMPLES=5000 for a longer hunt
SETTINGS = settings(
    max_examples=int(os.environ.get("KSI_AVRO_EXAMPLES", "120")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def schema_and_rows(draw: st.DrawFn) -> tuple[Any, list[Any]]:
    schema = draw(record_schemas)
    rows = draw(st.lists(data(schema), min_size=0, max_size=6))
    return schema, rows


@SETTINGS
@given(schema_and_rows(), st.integers(0, 2))
def test_decode_then_encode_is_byte_identical(case: tuple[Any, list[Any]], lead: int) -> None:
    schema_json, rows = case
    schema = parse_schema(schema_json)
    bodies = [avro_bytes(schema_json, row) for row in rows]

    # decode reads what fastavro reads
    columns = decode_values(bodies, schema)
    assert columns.type == arrow_type(schema)
    assert len(columns) == len(bodies)
    assert normalize(columns.to_pylist()) == normalize([avro_read(schema_json, b) for b in bodies])

    # encode gives the bodies back, from the StructArray, a sliced one, and a RecordBatch
    assert unsupported_reason(schema, columns.type) is None
    assert encode_values(columns, schema).to_pylist() == bodies
    padded = decode_values(bodies[:1] * lead + bodies, schema).slice(lead if bodies else 0)
    assert encode_values(padded, schema).to_pylist() == bodies
    batch = pa.RecordBatch.from_struct_array(columns)
    assert encode_values(batch, schema).to_pylist() == bodies


@SETTINGS
@given(schema_and_rows())
def test_encode_from_pyiceberg_arrow_types(case: tuple[Any, list[Any]]) -> None:
    """The table's Arrow types as pyiceberg reads them (large strings and lists, its field names)."""
    schema_json, rows = case
    schema = parse_schema(schema_json)
    bodies = [avro_bytes(schema_json, row) for row in rows]
    table_type = schema_to_pyarrow(Schema(*iceberg_struct(schema).fields), include_field_ids=False)
    columns = decode_values(bodies, schema)
    table = pa.Table.from_batches([pa.RecordBatch.from_struct_array(columns)]).cast(table_type)
    assert unsupported_reason(schema, table.schema) is None
    # as two chunks
    chunked = pa.concat_tables([table.slice(0, len(table) // 2), table.slice(len(table) // 2)])
    assert encode_values(chunked, schema).to_pylist() == bodies
