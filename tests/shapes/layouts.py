"""Each writer's table layout: Iceberg schema (field ids in the writer's order), how a Kafka record becomes
a row, the Parquet settings, the native file grouping and the commit state it leaves.

The facts and the files they come from are in ``docs/writers.md``; the comments here name them briefly.
A :class:`Layout` turns :class:`~tests.shapes.records.KafkaRecords` into an Arrow table whose columns are
exactly the table's (nested columns as Arrow structs, lists and maps) with vectorized Arrow kernels.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids, schema_to_pyarrow
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BinaryType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from .records import KafkaRecords

__all__ = [
    "LAYOUT_NAMES",
    "Layout",
    "ParquetSettings",
    "depth_first_ids",
    "java_hashmap_order",
    "java_ids",
    "make_layout",
]

LAYOUT_NAMES = ("ksi", "redpanda", "automq", "kafka-connect", "streambased")
MIB = 1 << 20


@dataclass(frozen=True)
class ParquetSettings:
    """How the writer's Parquet files look (pyarrow equivalents).  The defaults are Iceberg's Java writer's
    (parquet-java under Iceberg's table properties, docs/writers.md): 1 MiB data pages cut at 20,000 rows,
    a 2 MiB dictionary before falling back to plain, v1 data pages, and the page index (OffsetIndex and
    ColumnIndex per column chunk), which parquet-java always writes."""

    row_group_bytes: int | None      # None: one row group per file (Redpanda)
    compression: str = "zstd"
    use_dictionary: bool = True
    data_page_size: int = MIB
    column_bounds: bool = True       # lower/upper bounds in the manifest entries
    page_index: bool = True
    max_rows_per_page: int | None = 20_000
    dictionary_page_bytes: int = 2 * MIB
    data_page_version: str = "1.0"

    def writer_options(self) -> dict[str, Any]:
        """pyarrow's ``ParquetWriter`` options for these settings."""
        options: dict[str, Any] = {
            "compression": self.compression, "use_dictionary": self.use_dictionary,
            "data_page_size": self.data_page_size, "write_page_index": self.page_index,
            "dictionary_pagesize_limit": self.dictionary_page_bytes, "data_page_version": self.data_page_version,
            "write_statistics": True}
        if self.max_rows_per_page is not None:
            options["max_rows_per_page"] = self.max_rows_per_page
        return options


@dataclass
class Layout:
    """One writer's layout, resolved with its options."""

    name: str
    schema: Schema                               # with the writer's field ids
    to_rows: Callable[[KafkaRecords], pa.Table]  # records -> rows in the table's Arrow schema
    partition_path: str                          # dotted column paths, for checks and sorting
    offset_path: str
    time_path: str | None                        # the timestamp(tz) column hour()/day() partition on
    parquet: ParquetSettings
    files_per_kafka_partition: bool              # the writer never mixes Kafka partitions in a file
    reads_committed: bool                        # aborted records never reach the table
    drops_tombstones: bool
    properties: dict[str, str] = field(default_factory=dict)
    summary: Callable[[CommitState], dict[str, str]] = lambda state: {}
    identity_partition: bool = False             # spec identity(partition) (ksi, streambased)
    sort_by_offset: bool = False                 # sort order (partition, offset) (ksi)
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def arrow_schema(self) -> pa.Schema:
        return schema_to_pyarrow(self.schema, include_field_ids=True)


@dataclass
class CommitState:
    """What a writer knows at a commit, for its snapshot summary."""

    topic: str
    commit_index: int                       # 0 for the first commit
    next_offsets: dict[int, int]            # partition -> highest offset committed so far + 1
    max_timestamp_ms: dict[int, int]        # partition -> highest timestamp committed so far
    last_timestamp_ms: dict[int, int]       # partition -> timestamp of the last record committed
    files_so_far: int


# ------------------------------------------------------------------------------------------- field ids

def java_ids(schema: Schema) -> Schema:
    """Fresh ids as Java's ``TypeUtil.assignFreshIds`` (and PyIceberg's create_table) give them: a
    struct's fields first, then their children."""
    return assign_fresh_schema_ids(schema)


def depth_first_ids(schema: Schema) -> Schema:
    """Fresh ids depth first from 1, as Redpanda's ``iceberg::schema::assign_fresh_ids`` gives them."""
    counter = iter(range(1, 1 << 30))

    def visit_type(t: IcebergType) -> IcebergType:
        if isinstance(t, StructType):
            return StructType(*[visit_field(f) for f in t.fields])
        if isinstance(t, ListType):
            element_id = next(counter)
            return ListType(element_id, visit_type(t.element_type), element_required=t.element_required)
        if isinstance(t, MapType):
            key_id = next(counter)
            key = visit_type(t.key_type)
            value_id = next(counter)
            return MapType(key_id, key, value_id, visit_type(t.value_type), value_required=t.value_required)
        return t

    def visit_field(f: NestedField) -> NestedField:
        field_id = next(counter)
        return NestedField(field_id, f.name, visit_type(f.field_type), required=f.required, doc=f.doc)

    return Schema(*[visit_field(f) for f in schema.fields])


def _f(name: str, kind: IcebergType, required: bool = False) -> NestedField:
    return NestedField(0, name, kind, required=required)  # ids assigned later


def _header_list(key_type: IcebergType, element_required: bool = False) -> ListType:
    return ListType(0, StructType(_f("key", key_type), _f("value", BinaryType())), element_required=element_required)


def value_fields(records: KafkaRecords, optional: bool | None = None) -> list[NestedField]:
    """The typed value's fields as Iceberg fields (placeholder ids); ``optional`` True forces every
    field optional, None keeps the Arrow nullability."""
    if records.typed is None:
        raise ValueError("this layout keeps the value's fields as columns: KafkaRecords.typed is required "
                         "(synthetic(..., typed=True) makes one)")
    arrow = pa.schema(list(records.typed.type))
    converted = _pyarrow_to_schema_without_ids(arrow)
    fields = []
    for f in converted.fields:
        required = f.required if optional is None else not optional
        fields.append(NestedField(0, f.name, f.field_type, required=required, doc=f.doc))
    return fields


def _force_optional(t: IcebergType) -> IcebergType:
    """Every nested field optional, map keys required (Redpanda's structured translator)."""
    if isinstance(t, StructType):
        return StructType(*[NestedField(0, f.name, _force_optional(f.field_type), required=False)
                             for f in t.fields])
    if isinstance(t, ListType):
        return ListType(0, _force_optional(t.element_type), element_required=False)
    if isinstance(t, MapType):
        return MapType(0, t.key_type, 0, _force_optional(t.value_type), value_required=False)
    return t


def java_hashmap_order(names: list[str], copied: int | None = None) -> list[str]:
    """Iteration order of a ``java.util.HashMap`` of these String keys: the first ``copied`` (default all)
    copied in by ``Maps.newHashMap(map)``, the rest ``put`` after (KafkaMetadataTransform.applySchemaless);
    buckets ``(h ^ h >>> 16) & (capacity - 1)``, insertion order within a bucket, Java's resizing."""
    def java_hash(s: str) -> int:
        h = 0
        for unit in _utf16_units(s):
            h = (31 * h + unit) & 0xFFFFFFFF
        return h

    copied = len(names) if copied is None else copied
    if copied:  # HashMap(Map m): threshold = tableSizeFor((int) (s / 0.75f + 1))
        wanted = int(copied / 0.75 + 1.0)
        capacity = 1
        while capacity < wanted:
            capacity *= 2
    else:
        capacity = 16
    for size in range(copied + 1, len(names) + 1):  # put(): resize when ++size > threshold
        if size > capacity * 0.75:
            capacity *= 2
    buckets: dict[int, list[str]] = {}
    for name in names:
        h = java_hash(name)
        buckets.setdefault((h ^ (h >> 16)) & (capacity - 1), []).append(name)
    return [n for b in sorted(buckets) for n in buckets[b]]


def _utf16_units(s: str) -> list[int]:
    data = s.encode("utf-16-be")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


# ------------------------------------------------------------------------------------------ conversions

def _micros(ms: pa.Array, tz: bool = True) -> pa.Array:
    us = pc.multiply(ms, pa.scalar(1000, pa.int64()))
    return us.cast(pa.timestamp("us", tz="UTC") if tz else pa.timestamp("us"))


def _struct(arrays: list[pa.Array], names: list[str], mask: pa.Array | None = None) -> pa.StructArray:
    return pa.StructArray.from_arrays(arrays, names=names, mask=mask)


def _headers_null_when_empty(headers: pa.Array) -> pa.Array:
    lengths = pc.fill_null(pc.list_value_length(headers), 0)
    empty = pc.equal(lengths, 0)
    return pc.if_else(empty, pa.nulls(len(headers), headers.type), headers)


def _headers_key_as_binary(headers: pa.Array) -> pa.Array:
    """list<struct<key string, value binary>> -> list<struct<key binary, value binary>>."""
    target = pa.list_(pa.field("element", pa.struct([pa.field("key", pa.binary()), pa.field("value", pa.binary())])))
    return headers.cast(target)


def _typed_columns(records: KafkaRecords, tombstones_null: bool = True) -> list[pa.Array]:
    """The typed value's fields as columns (null where the whole value is null, and for tombstones)."""
    assert records.typed is not None
    children = records.typed.flatten()  # parent nulls applied to the children
    if tombstones_null and records.value.null_count:
        null_value = pc.is_null(records.value)
        children = [pc.if_else(null_value, pa.nulls(len(c), c.type), c) for c in children]
    return children


def _cast_to(table_columns: dict[str, pa.Array], arrow_schema: pa.Schema) -> pa.Table:
    arrays = []
    for f in arrow_schema:
        column = table_columns[f.name]
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        arrays.append(column.cast(f.type) if column.type != f.type else column)
    return pa.Table.from_arrays(arrays, schema=arrow_schema)


def _apply_type_overrides(schema: Schema, overrides: dict[str, IcebergType]) -> Schema:
    """Replace the types of top-level or struct-member columns (wrong-but-castable types for fuzzing)."""
    if not overrides:
        return schema

    def visit(f: NestedField, prefix: str) -> NestedField:
        path = f"{prefix}{f.name}"
        kind = overrides.get(path, f.field_type)
        if path not in overrides and isinstance(kind, StructType):
            kind = StructType(*[visit(c, path + ".") for c in kind.fields])
        return NestedField(f.field_id, f.name, kind, required=f.required, doc=f.doc)

    return Schema(*[visit(f, "") for f in schema.fields])


# ---------------------------------------------------------------------------------------------- layouts

def make_layout(name: str, sample: KafkaRecords, **options: Any) -> Layout:
    """The layout ``name`` with its writer's options (see each ``_layout_*`` function), for records like
    ``sample`` (its typed value decides the value columns)."""
    builders = {"ksi": _layout_ksi, "redpanda": _layout_redpanda, "automq": _layout_automq,
                "kafka-connect": _layout_kafka_connect, "streambased": _layout_streambased}
    if name not in builders:
        raise ValueError(f"unknown layout {name!r}; one of {', '.join(LAYOUT_NAMES)}")
    overrides = options.pop("type_overrides", {})
    layout = builders[name](sample, options, overrides)
    unknown = set(options) - set(layout.options)
    if unknown:
        raise ValueError(f"layout {name}: unknown option(s) {', '.join(sorted(unknown))}")
    return layout


def _opt(options: dict[str, Any], key: str, default: Any, allowed: tuple[Any, ...] | None = None) -> Any:
    value = options.get(key, default)
    if allowed is not None and value not in allowed:
        raise ValueError(f"option {key}={value!r}: one of {', '.join(map(repr, allowed))}")
    return value


def _finish(schema: Schema, ids: str, overrides: dict[str, IcebergType]) -> Schema:
    schema = _apply_type_overrides(schema, overrides)
    return depth_first_ids(schema) if ids == "depth" else java_ids(schema)


def _layout_ksi(sample: KafkaRecords, options: dict[str, Any], overrides: dict[str, IcebergType]) -> Layout:
    """``ksi archive``'s table (ksi/history/ksi_table.py): typed values when ``sample.typed`` is given
    (``schema_id``, default 1, is the writer's registry id); Spark's writer, 16 MiB row groups."""
    from ksi.history.ksi_table import raw_value_schema

    schema_id = _opt(options, "schema_id", 1)
    row_group = _opt(options, "row_group_bytes", 16 * MIB)
    fields = list(raw_value_schema().fields)
    typed = sample.typed is not None
    if typed:
        fields += [NestedField(0, f.name, f.field_type, required=False) for f in value_fields(sample)]
    schema = _finish(Schema(*fields), "java", overrides)
    arrow = schema_to_pyarrow(schema, include_field_ids=False)

    def to_rows(r: KafkaRecords) -> pa.Table:
        null_value = pc.is_null(r.value)
        columns: dict[str, pa.Array] = {
            "kafka_partition": r.partition, "kafka_offset": r.offset, "kafka_timestamp": _micros(r.timestamp_ms),
            "kafka_timestamp_type": r.timestamp_types().cast(pa.int32()), "kafka_key": r.key,
            "kafka_headers": pc.if_else(pc.is_null(r.headers), pa.array([[]] * len(r), r.headers.type), r.headers)
            if r.headers.null_count else r.headers,
        }
        if typed:
            columns["kafka_value"] = pa.nulls(len(r), pa.binary())
            columns["kafka_value_schema_id"] = pc.if_else(null_value, pa.scalar(None, pa.int32()),
                                                          pa.scalar(schema_id, pa.int32()))
            for f, column in zip(sample.typed.type, _typed_columns(r), strict=True):  # type: ignore[union-attr]
                columns[f.name] = column
        else:
            columns["kafka_value"] = r.value
            columns["kafka_value_schema_id"] = pa.nulls(len(r), pa.int32())
        return _cast_to(columns, arrow)

    def summary(state: CommitState) -> dict[str, str]:
        return {"ksi.archived-offsets": json.dumps({str(p): o for p, o in sorted(state.next_offsets.items())},
                                                   separators=(",", ":")),
                "ksi.topic": state.topic, "ksi.archive-run": uuid.uuid4().hex}

    return Layout("ksi", schema, to_rows, "kafka_partition", "kafka_offset", "kafka_timestamp",
                  ParquetSettings(row_group_bytes=row_group), files_per_kafka_partition=True,
                  reads_committed=True, drops_tombstones=False, summary=summary, identity_partition=True,
                  sort_by_offset=True,
                  properties={"write.parquet.row-group-size-bytes": str(row_group),
                              "write.target-file-size-bytes": str(128 * MIB), "write.distribution-mode": "hash",
                              "ksi.topic": sample.topic},
                  options={"schema_id": schema_id, "row_group_bytes": row_group})


def _layout_redpanda(sample: KafkaRecords, options: dict[str, Any],
                     overrides: dict[str, IcebergType]) -> Layout:
    """Redpanda Iceberg topics. Options: ``mode`` ``key_value`` (default) or ``schema`` (typed columns);
    ``version`` ``v25.3`` (the 2026 tree, default) or ``v24.3``; ``catalog_type`` ``object_storage`` (Redpanda
    assigns ids depth first, default) or ``rest`` (a Java REST catalog reassigns them);
    ``column_bounds`` (manifests with min/max: after PR 30704, default True)."""
    mode = _opt(options, "mode", "key_value", ("key_value", "schema"))
    version = _opt(options, "version", "v25.3", ("v25.3", "v24.3"))
    catalog = _opt(options, "catalog_type", "object_storage", ("object_storage", "rest"))
    bounds = _opt(options, "column_bounds", True, (True, False))
    old = version == "v24.3"
    system = [
        _f("partition", IntegerType(), required=old),
        _f("offset", LongType(), required=old),
        _f("timestamp", TimestampType() if old else TimestamptzType(), required=old),
        _f("headers", _header_list(BinaryType() if old else StringType(), element_required=old)),
        _f("key", BinaryType()),
    ]
    if not old:
        system.append(_f("timestamp_type", IntegerType()))
    values: list[NestedField] = []
    if mode == "key_value":
        values.append(_f("value", BinaryType()))
    else:
        for f in value_fields(sample, optional=True):
            if f.name == "redpanda":  # a value field named redpanda moves into the struct as redpanda.data
                system.append(NestedField(0, "data", _force_optional(f.field_type), required=False))
            else:
                values.append(NestedField(0, f.name, _force_optional(f.field_type), required=False))
    fields = [_f("redpanda", StructType(*system), required=old)] + values
    schema = _finish(Schema(*fields), "depth" if catalog == "object_storage" else "java", overrides)
    arrow = schema_to_pyarrow(schema, include_field_ids=False)
    rp_type = arrow.field("redpanda").type

    def to_rows(r: KafkaRecords) -> pa.Table:
        headers = _headers_null_when_empty(r.headers)
        if old:
            headers = _headers_key_as_binary(headers)
        parts = [r.partition, r.offset, _micros(r.timestamp_ms, tz=not old), headers, r.key]
        names = ["partition", "offset", "timestamp", "headers", "key"]
        if not old:
            parts.append(r.timestamp_types().cast(pa.int32()))
            names.append("timestamp_type")
        columns: dict[str, pa.Array] = {}
        if mode == "key_value":
            columns["value"] = r.value
        else:
            for f, column in zip(sample.typed.type, _typed_columns(r), strict=True):  # type: ignore[union-attr]
                if f.name == "redpanda":
                    parts.append(column)
                    names.append("data")
                else:
                    columns[f.name] = column
        columns["redpanda"] = _struct(parts, names).cast(rp_type)
        return _cast_to(columns, arrow)

    def summary(state: CommitState) -> dict[str, str]:
        # the coordinator's own log offset of the newest committed entry, not a Kafka offset
        return {"redpanda.commit-metadata": json.dumps({"offset": 3 * state.commit_index + 2},
                                                       separators=(",", ":"))}

    return Layout("redpanda", schema, to_rows, "redpanda.partition", "redpanda.offset", "redpanda.timestamp",
                  # Redpanda's own writer: one v2 data page per column chunk, plain, no page index
                  ParquetSettings(row_group_bytes=None, use_dictionary=False, data_page_size=1 << 30,
                                  column_bounds=bounds, page_index=False, max_rows_per_page=None,
                                  data_page_version="2.0"),
                  files_per_kafka_partition=True, reads_committed=True, drops_tombstones=mode == "schema",
                  summary=summary,
                  options={"mode": mode, "version": version, "catalog_type": catalog, "column_bounds": bounds})


def _map_headers(headers: pa.Array) -> pa.Array:
    """list<struct<key, value>> -> map<string, binary> as AutoMQ's HashMap leaves it: no headers -> an
    empty map, a repeated key keeps its last value."""
    headers = pc.if_else(pc.is_null(headers), pa.array([[]] * len(headers), headers.type), headers) \
        if headers.null_count else headers
    flat = pc.list_flatten(headers)
    keys, values = flat.field(0), flat.field(1)
    if keys.null_count or values.null_count:
        raise ValueError("automq: a header with a null key or a null value cannot be written (the table's "
                         "map<string, binary> has a required value, Iceberg's Avro map conversion)")
    offsets = headers.offsets
    if len(flat):
        parent = pc.list_parent_indices(headers)
        dup = pa.table({"p": parent, "k": keys}).group_by(["p", "k"]).aggregate([("k", "count")])
        if pc.max(dup["k_count"]).as_py() > 1:  # rare: rebuild the rows with repeated keys in Python
            rows = headers.to_pylist()
            fixed = [None if hs is None else list({h["key"]: h["value"] for h in hs}.items()) for hs in rows]
            return pa.array(fixed, pa.map_(pa.string(), pa.field("value", pa.binary(), nullable=False)))
    return pa.MapArray.from_arrays(offsets, keys, values,
                                   type=pa.map_(pa.string(), pa.field("value", pa.binary(), nullable=False)))


def _layout_automq(sample: KafkaRecords, options: dict[str, Any], overrides: dict[str, IcebergType]) -> Layout:
    """AutoMQ Table Topic. Options: ``value`` ``raw`` (default; ``_kafka_value`` binary, a tombstone is
    empty bytes) or ``typed`` (the value's fields first; a tombstone is skipped); ``key_type`` ``string``
    (AutoMQ's default: null -> "", bytes decoded as UTF-8) or ``raw`` (binary, null -> empty bytes)."""
    value_mode = _opt(options, "value", "raw", ("raw", "typed"))
    key_type = _opt(options, "key_type", "string", ("string", "raw"))
    fields: list[NestedField] = [_f("_kafka_value", BinaryType())] if value_mode == "raw" else value_fields(sample)
    fields += [
        _f("_kafka_header", MapType(0, StringType(), 0, BinaryType(), value_required=True)),
        _f("_kafka_key", StringType() if key_type == "string" else BinaryType()),
        _f("_kafka_metadata", StructType(_f("partition", IntegerType(), True), _f("offset", LongType(), True),
                                         _f("timestamp", LongType(), True))),
    ]
    schema = _finish(Schema(*fields), "java", overrides)
    arrow = schema_to_pyarrow(schema, include_field_ids=False)

    def to_rows(r: KafkaRecords) -> pa.Table:
        if value_mode == "typed" and r.value.null_count:
            # AvroRegistryConverter: "does not support null data" (InvalidDataException), skipped by the
            # default errors.tolerance=invalid_data: a hole
            r = r.filter(pc.is_valid(r.value))
        empty = pa.scalar(b"", pa.binary())
        key = pc.fill_null(r.key, empty)
        if key_type == "string":
            key = _utf8_replace(key)
        columns: dict[str, pa.Array] = {
            "_kafka_header": _map_headers(r.headers), "_kafka_key": key,
            "_kafka_metadata": _struct([r.partition, r.offset, r.timestamp_ms], ["partition", "offset", "timestamp"]),
        }
        if value_mode == "raw":
            columns["_kafka_value"] = pc.fill_null(r.value, empty)
        else:
            for f, column in zip(sample.typed.type, _typed_columns(r), strict=True):  # type: ignore[union-attr]
                columns[f.name] = column
        return _cast_to(columns, arrow)

    def summary(state: CommitState) -> dict[str, str]:
        watermark = min(state.max_timestamp_ms.values()) if state.max_timestamp_ms else -1
        return {"automq.commit.id": str(uuid.uuid4()), "automq.watermark": str(watermark)}

    return Layout("automq", schema, to_rows, "_kafka_metadata.partition", "_kafka_metadata.offset",
                  "ts" if value_mode == "typed" else None,
                  ParquetSettings(row_group_bytes=128 * MIB), files_per_kafka_partition=False,
                  reads_committed=True, drops_tombstones=value_mode == "typed", summary=summary,
                  options={"value": value_mode, "key_type": key_type})


def _utf8_replace(binary: pa.Array) -> pa.Array:
    """bytes -> string as Java's ``new String(bytes, UTF_8)``: invalid sequences become U+FFFD."""
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:  # some key is not UTF-8: decode those in Python
        return pa.array([None if b is None else b.decode("utf-8", "replace") for b in binary.to_pylist()],
                        pa.string())


def _layout_kafka_connect(sample: KafkaRecords, options: dict[str, Any],
                          overrides: dict[str, IcebergType]) -> Layout:
    """Apache Iceberg's Kafka Connect sink with KafkaMetadataTransform. Options: ``metadata`` ``flat``
    (default) or ``nested``; ``schemaless`` False (Avro/Struct values with a Connect schema) or True (JSON
    without schema: every column optional, partition a long, HashMap column order); ``force_optional``
    (``iceberg.tables.schema-force-optional``). No key, no headers; tombstones are dropped."""
    metadata = _opt(options, "metadata", "flat", ("flat", "nested"))
    schemaless = _opt(options, "schemaless", False, (False, True))
    force_optional = _opt(options, "force_optional", False, (False, True))
    optional = True if (schemaless or force_optional) else None
    values = value_fields(sample, optional=optional)
    part_type: IcebergType = LongType() if schemaless else IntegerType()
    req = not (schemaless or force_optional)
    meta = [_f("topic", StringType(), req), _f("partition", part_type, req), _f("offset", LongType(), req),
            _f("timestamp", LongType())]
    if metadata == "flat":
        meta_fields = [NestedField(0, f"_kafka_metadata_{m.name}", m.field_type, required=m.required) for m in meta]
        fields = values + meta_fields
        if schemaless:
            by_name = {f.name: f for f in fields}
            fields = [by_name[n] for n in java_hashmap_order(list(by_name), copied=len(values))]
        part_path, off_path = "_kafka_metadata_partition", "_kafka_metadata_offset"
    else:
        fields = values + [_f("_kafka_metadata", StructType(*meta), req)]
        if schemaless:
            by_name = {f.name: f for f in fields}
            fields = [by_name[n] for n in java_hashmap_order(list(by_name), copied=len(values))]
            # the nested struct is a HashMap too (Maps.newHashMap() then put topic, partition, ...)
            nested = fields[[f.name for f in fields].index("_kafka_metadata")]
            members = {m.name: m for m in nested.field_type.fields}
            ordered = [members[n] for n in java_hashmap_order(list(members), copied=0)]
            fields = [NestedField(0, f.name, StructType(*ordered), required=f.required)
                      if f.name == "_kafka_metadata" else f for f in fields]
        part_path, off_path = "_kafka_metadata.partition", "_kafka_metadata.offset"
    schema = _finish(Schema(*fields), "java", overrides)
    arrow = schema_to_pyarrow(schema, include_field_ids=False)

    def to_rows(r: KafkaRecords) -> pa.Table:
        if pc.any(pc.is_null(r.value)).as_py():
            r = r.filter(pc.is_valid(r.value))  # "ignore tombstones"
        topic = pa.array(np.full(len(r), r.topic, dtype=object), pa.string())
        meta_arrays = [topic, r.partition, r.offset, r.timestamp_ms]
        columns: dict[str, pa.Array] = {}
        for f, column in zip(sample.typed.type, _typed_columns(r, tombstones_null=False), strict=True):  # type: ignore[union-attr]
            columns[f.name] = column
        if metadata == "flat":
            for name, column in zip(("topic", "partition", "offset", "timestamp"), meta_arrays, strict=True):
                columns[f"_kafka_metadata_{name}"] = column
        else:
            columns["_kafka_metadata"] = _struct(meta_arrays, ["topic", "partition", "offset", "timestamp"])
        return _cast_to(columns, arrow)

    def summary(state: CommitState) -> dict[str, str]:
        group = f"connect-{state.topic}-sink"
        props = {f"kafka.connect.offsets.control-iceberg.{group}": json.dumps({"0": 2 * (state.commit_index + 1)}),
                 "kafka.connect.commit-id": str(uuid.uuid4()), "kafka.connect.task-id": f"{state.topic}-sink-0"}
        if state.last_timestamp_ms:
            vtts = min(state.last_timestamp_ms.values())
            props["kafka.connect.valid-through-ts"] = datetime.fromtimestamp(vtts / 1000, UTC) \
                .isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return props

    return Layout("kafka-connect", schema, to_rows, part_path, off_path, "ts",
                  ParquetSettings(row_group_bytes=128 * MIB), files_per_kafka_partition=False,
                  reads_committed=False, drops_tombstones=True, summary=summary,
                  options={"metadata": metadata, "schemaless": schemaless, "force_optional": force_optional})


def _layout_streambased(sample: KafkaRecords, options: dict[str, Any],
                        overrides: dict[str, IcebergType]) -> Layout:
    """Streambased (no public source: the README's columns, unverified; see docs/writers.md)."""
    fields = [_f("kafka_partition", IntegerType(), True), _f("kafka_offset", LongType(), True),
              _f("kafka_timestamp", TimestamptzType())] + value_fields(sample, optional=True)  # null: tombstones
    schema = _finish(Schema(*fields), "java", overrides)
    arrow = schema_to_pyarrow(schema, include_field_ids=False)

    def to_rows(r: KafkaRecords) -> pa.Table:
        columns: dict[str, pa.Array] = {"kafka_partition": r.partition, "kafka_offset": r.offset,
                                        "kafka_timestamp": _micros(r.timestamp_ms)}
        for f, column in zip(sample.typed.type, _typed_columns(r), strict=True):  # type: ignore[union-attr]
            columns[f.name] = column
        return _cast_to(columns, arrow)

    return Layout("streambased", schema, to_rows, "kafka_partition", "kafka_offset", "kafka_timestamp",
                  ParquetSettings(row_group_bytes=128 * MIB), files_per_kafka_partition=True,
                  reads_committed=True, drops_tombstones=False, identity_partition=True, options={})
