"""Hypothesis strategies for table contents, per layout: hostile rows for fuzzing a reader.

``layout_tables(layout)`` draws a :class:`FuzzTable`: records (some hostile: partitions beyond the
topic's, negative, duplicate or far-future offsets, offsets at or past a log start, huge values, null
keys/values/header keys and values), converted to the layout's rows, then nulls put into random rows of
every nullable column of the table (Redpanda v25.3 declares even partition and offset optional), and
sometimes a wrong-but-castable column type (partition as long, offset as int, timestamptz as timestamp).
:func:`tests.shapes.build.write_rows` writes one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st
from pyiceberg.types import IntegerType, LongType, TimestampType

from .layouts import Layout, make_layout
from .records import HEADERS_TYPE, KafkaRecords, typed_values

__all__ = ["LAYOUT_VARIANTS", "FuzzTable", "kafka_records", "layout_tables"]

# (layout, options) pairs worth fuzzing: every layout and its modes
LAYOUT_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("ksi", {}), ("ksi", {"typed": True}),
    ("redpanda", {}), ("redpanda", {"version": "v24.3"}), ("redpanda", {"mode": "schema"}),
    ("automq", {}), ("automq", {"value": "typed", "key_type": "raw"}),
    ("kafka-connect", {}), ("kafka-connect", {"metadata": "nested"}), ("kafka-connect", {"schemaless": True}),
    ("streambased", {}),
]

HUGE = 1 << 20


@dataclass(frozen=True)
class FuzzTable:
    layout: Layout
    records: KafkaRecords     # what the rows were made from (before nulls were put in)
    rows: pa.Table            # the table's rows, in the layout's Arrow schema
    nulled: dict[str, int]    # column path -> rows made null


@st.composite
def kafka_records(draw: st.DrawFn, *, max_rows: int = 30, partitions: int = 4, log_start: int | None = None,
                  hostile: bool = True, typed: bool = False) -> KafkaRecords:
    """Records of a ``partitions``-partition topic; with ``hostile`` some rows break the rules a reader
    might assume (see the module docstring)."""
    n = draw(st.integers(min_value=1, max_value=max_rows))
    bad_partition = st.sampled_from([partitions, partitions + 7, -1, 2**31 - 1]) if hostile else st.nothing()
    part_strategy = st.integers(0, partitions - 1) | bad_partition if hostile else st.integers(0, partitions - 1)
    parts = draw(st.lists(part_strategy, min_size=n, max_size=n))
    base = draw(st.integers(0, 1000))
    offsets = []
    counters: dict[int, int] = {}
    for p in parts:
        counters[p] = counters.get(p, base) + draw(st.sampled_from([1, 1, 1, 2, 5]))  # gaps sometimes
        offsets.append(counters[p])
    if hostile:
        for i in range(n):
            kind = draw(st.sampled_from(["ok"] * 8 + ["negative", "duplicate", "far", "past_log_start"]))
            if kind == "negative":
                offsets[i] = -draw(st.integers(1, 10))
            elif kind == "duplicate" and i:
                j = draw(st.integers(0, i - 1))
                parts[i], offsets[i] = parts[j], offsets[j]
            elif kind == "far":
                offsets[i] = draw(st.sampled_from([2**40, 2**62, 2**63 - 1]))
            elif kind == "past_log_start" and log_start is not None:
                offsets[i] = log_start + draw(st.integers(0, 5))
    ts_strategy = st.integers(1_600_000_000_000, 1_900_000_000_000)
    if hostile:
        ts_strategy = ts_strategy | st.sampled_from([-1, 0, 253_402_300_799_999])
    timestamps = draw(st.lists(ts_strategy, min_size=n, max_size=n))
    ts_types = draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n))
    size = st.integers(0, 64) | (st.sampled_from([HUGE]) if hostile else st.nothing())
    blob = size.map(lambda k: bytes(np.random.default_rng(k).integers(0, 256, k, dtype=np.uint8)))
    keys = draw(st.lists(st.none() | blob, min_size=n, max_size=n))
    values = draw(st.lists(st.none() | blob if hostile else blob, min_size=n, max_size=n))
    header_key = st.text(max_size=8) | (st.none() if hostile else st.nothing())
    header_value = st.binary(max_size=16) | st.none()
    header = st.fixed_dictionaries({"key": header_key, "value": header_value})
    headers = draw(st.lists(st.lists(header, max_size=3), min_size=n, max_size=n))
    record_typed = None
    if typed:
        ts = np.asarray(timestamps, dtype=np.int64)
        record_typed = typed_values(n, np.random.default_rng(0), ts)
        null_value = pa.array([v is None for v in values])
        record_typed = pa.StructArray.from_arrays(record_typed.flatten(), fields=list(record_typed.type),
                                                  mask=null_value)
    return KafkaRecords(partition=pa.array(parts, pa.int32()), offset=pa.array(offsets, pa.int64()),
                        timestamp_ms=pa.array(timestamps, pa.int64()), key=pa.array(keys, pa.binary()),
                        value=pa.array(values, pa.binary()), headers=pa.array(headers, HEADERS_TYPE),
                        timestamp_type=pa.array(ts_types, pa.int8()), typed=record_typed)


def _paths(arrow: pa.Schema) -> list[tuple[str, pa.Field]]:
    """(dotted path, field) of every top-level column and struct member (not list elements)."""
    out: list[tuple[str, pa.Field]] = []

    def visit(f: pa.Field, prefix: str) -> None:
        path = prefix + f.name
        out.append((path, f))
        if pa.types.is_struct(f.type):
            for i in range(f.type.num_fields):
                visit(f.type.field(i), path + ".")

    for f in arrow:
        visit(f, "")
    return out


def _null_rows(array: pa.Array, path: list[str], target: str, mask: np.ndarray) -> pa.Array:
    """``array`` with the member ``path`` (relative) nulled where ``mask``."""
    if not path:
        if pa.types.is_struct(array.type):  # keep the children's values: required members stay non-null
            null = pa.array(mask) if not array.null_count else pc.or_(pa.array(mask), pc.is_null(array))
            return pa.StructArray.from_arrays([array.field(i) for i in range(array.type.num_fields)],
                                              fields=list(array.type), mask=null)
        return pc.if_else(pa.array(mask), pa.nulls(len(array), array.type), array)
    assert pa.types.is_struct(array.type)
    children = []
    for i in range(array.type.num_fields):
        child = array.field(i)
        if array.type.field(i).name == path[0]:
            child = _null_rows(child, path[1:], target, mask)
        children.append(child)
    validity = pc.is_valid(array) if array.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(array.type),
                                      mask=pc.invert(validity) if validity is not None else None)


def _overrides(draw: st.DrawFn, layout_name: str, options: dict[str, Any], records: KafkaRecords) -> dict[str, Any]:
    """Maybe one wrong-but-castable type: partition as long, offset as int (if all fit), a timestamptz
    as a timestamp without zone."""
    paths = {"ksi": ("kafka_partition", "kafka_offset", "kafka_timestamp"),
             "redpanda": ("redpanda.partition", "redpanda.offset", "redpanda.timestamp"),
             "automq": ("_kafka_metadata.partition", "_kafka_metadata.offset", None),
             "kafka-connect": ("_kafka_metadata_partition", "_kafka_metadata_offset", None),
             "streambased": ("kafka_partition", "kafka_offset", "kafka_timestamp")}[layout_name]
    if layout_name == "kafka-connect" and options.get("metadata") == "nested":
        paths = ("_kafka_metadata.partition", "_kafka_metadata.offset", None)
    choice = draw(st.sampled_from(["none", "none", "partition_long", "offset_int", "timestamp_naive"]))
    fits = len(records) == 0 or (pc.max(records.offset).as_py() < 2**31 and pc.min(records.offset).as_py() >= -2**31)
    if choice == "partition_long" and not options.get("schemaless"):
        return {paths[0]: LongType()}
    if choice == "offset_int" and fits:
        return {paths[1]: IntegerType()}
    if choice == "timestamp_naive" and paths[2] is not None and options.get("version") != "v24.3":
        return {paths[2]: TimestampType()}
    return {}


@st.composite
def layout_tables(draw: st.DrawFn, layout_name: str, options: dict[str, Any] | None = None, *,
                  max_rows: int = 30, partitions: int = 4, log_start: int | None = None,
                  hostile: bool = True) -> FuzzTable:
    """A table's contents in ``layout_name`` (with ``options``; ``typed=True`` for ksi's typed mode)."""
    options = dict(options or {})
    typed = options.pop("typed", False) or layout_name in ("kafka-connect", "streambased") \
        or options.get("mode") == "schema" or options.get("value") == "typed"
    records = draw(kafka_records(max_rows=max_rows, partitions=partitions, log_start=log_start, hostile=hostile,
                                 typed=typed))
    if layout_name == "automq":  # a map value cannot be null, nor a key: AutoMQ cannot write such headers
        headers = [[h for h in hs if h["key"] is not None and h["value"] is not None] for hs in
                   records.headers.to_pylist()]
        records = KafkaRecords(records.partition, records.offset, records.timestamp_ms, records.key, records.value,
                               pa.array(headers, HEADERS_TYPE), records.timestamp_type, records.typed)
    if hostile:
        options["type_overrides"] = _overrides(draw, layout_name, options, records)
    layout = make_layout(layout_name, records, **options)
    rows = layout.to_rows(records)
    nulled: dict[str, int] = {}
    if hostile and rows.num_rows:
        columns = {name: rows[name].combine_chunks() for name in rows.column_names}
        for path, f in _paths(layout.arrow_schema):
            if not f.nullable or not draw(st.booleans()):
                continue
            mask = np.asarray(draw(st.lists(st.booleans(), min_size=rows.num_rows, max_size=rows.num_rows)))
            if not mask.any():
                continue
            top, *rest = path.split(".")
            columns[top] = _null_rows(columns[top], rest, path, mask)
            nulled[path] = int(mask.sum())
        rows = pa.Table.from_arrays([columns[n] for n in rows.column_names], schema=layout.arrow_schema)
    return FuzzTable(layout, records, rows, nulled)
