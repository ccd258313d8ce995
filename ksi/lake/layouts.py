"""Table layouts ksi replays: where partition, offset, timestamp, key, headers and value live.

A topic's history may have been written by ksi's own archive job or by another system; each layout
names the columns (dotted paths into structs) that hold the Kafka record's parts.  Columns that are
not Kafka metadata are the value's fields (typed value columns); a layout may instead keep the value as
raw bytes.  :func:`resolve` checks a layout against a table's schema and says precisely what is missing.

The ksi layout (written by ``ksi archive``) keeps everything needed for byte-exact replay:

    kafka_partition        int        required, identity partition field
    kafka_offset           long       required, sort key
    kafka_timestamp        timestamptz  (ms precision; Kafka timestamps are ms)
    kafka_timestamp_type   int        0 CreateTime, 1 LogAppendTime
    kafka_key              binary     null for a null key
    kafka_headers          list<struct<key: string, value: binary>>
    kafka_value            binary     the value's raw bytes when it was not decoded (else null)
    kafka_value_schema_id  int        the writer's Schema Registry id when the value was decoded into
                                      the typed columns that follow; null otherwise
    kafka_aborted          boolean    true for a record of an aborted transaction (kept for read_uncommitted
                                      consumers, skipped for read_committed ones); null or false, or no
                                      such column (tables archived before it existed): not aborted
    <value fields...>      typed columns of the decoded Avro value
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyiceberg.schema import Schema
from pyiceberg.types import ListType, MapType, StructType

__all__ = ["KSI", "LAYOUTS", "Layout", "LayoutError", "ResolvedLayout", "resolve"]


class LayoutError(Exception):
    """A table does not match the layout configured for its topic."""


@dataclass(frozen=True, slots=True)
class Layout:
    name: str
    partition: str
    offset: str
    timestamp: str | None
    timestamp_type: str | None = None
    key: str | None = None
    headers: str | None = None
    headers_as_map: bool = False        # automq keeps headers as map<string, binary>
    raw_value: str | None = None        # a binary column holding the whole value
    schema_id: str | None = None        # the writer's schema id per row
    aborted: str | None = None          # a boolean column: true for a record of an aborted transaction
    metadata_roots: tuple[str, ...] = ()  # top-level columns that are not value fields


KSI = Layout(
    name="ksi",
    partition="kafka_partition",
    offset="kafka_offset",
    timestamp="kafka_timestamp",
    timestamp_type="kafka_timestamp_type",
    key="kafka_key",
    headers="kafka_headers",
    raw_value="kafka_value",
    schema_id="kafka_value_schema_id",
    aborted="kafka_aborted",
    metadata_roots=("kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_timestamp_type", "kafka_key",
                    "kafka_headers", "kafka_value", "kafka_value_schema_id", "kafka_aborted"),
)

REDPANDA = Layout(
    name="redpanda",
    partition="redpanda.partition",
    offset="redpanda.offset",
    timestamp="redpanda.timestamp",
    timestamp_type="redpanda.timestamp_type",
    key="redpanda.key",
    headers="redpanda.headers",
    raw_value="value",  # key_value mode; schema modes put the value's fields at the top level
    metadata_roots=("redpanda", "value"),
)

AUTOMQ = Layout(
    name="automq",
    partition="_kafka_metadata.partition",
    offset="_kafka_metadata.offset",
    timestamp="_kafka_metadata.timestamp",
    key="_kafka_key",
    headers="_kafka_header",
    headers_as_map=True,
    raw_value="_kafka_value",
    metadata_roots=("_kafka_metadata", "_kafka_key", "_kafka_header", "_kafka_value"),
)

KAFKA_CONNECT_FLAT = Layout(
    name="kafka-connect",
    partition="_kafka_metadata_partition",
    offset="_kafka_metadata_offset",
    timestamp="_kafka_metadata_timestamp",
    metadata_roots=("_kafka_metadata_partition", "_kafka_metadata_offset", "_kafka_metadata_timestamp",
                    "_kafka_metadata_topic"),
)

KAFKA_CONNECT_NESTED = Layout(
    name="kafka-connect",
    partition="_kafka_metadata.partition",
    offset="_kafka_metadata.offset",
    timestamp="_kafka_metadata.timestamp",
    metadata_roots=("_kafka_metadata",),
)

STREAMBASED = Layout(
    name="streambased",
    partition="kafka_partition",
    offset="kafka_offset",
    timestamp="kafka_timestamp",
    metadata_roots=("kafka_partition", "kafka_offset", "kafka_timestamp"),
)

# Candidates per configured layout name, tried in order.
LAYOUTS: dict[str, tuple[Layout, ...]] = {
    "ksi": (KSI,),
    "redpanda": (REDPANDA,),
    "automq": (AUTOMQ,),
    "kafka-connect": (KAFKA_CONNECT_FLAT, KAFKA_CONNECT_NESTED),
    "streambased": (STREAMBASED,),
}


@dataclass(frozen=True, slots=True)
class ResolvedLayout:
    """A layout checked against one table: which optional columns exist, and the value columns."""

    layout: Layout
    key: str | None
    headers: str | None
    timestamp_type: str | None
    raw_value: str | None
    schema_id: str | None
    value_columns: tuple[str, ...]  # top-level typed value columns (empty for raw-value tables)
    timestamp: str | None = None    # the timestamp column (the layout's, or its newest rename)
    timestamp_fallbacks: tuple[str, ...] = ()  # older renames of it (``timestamp_v1``): read where it is null
    aborted: str | None = None      # the aborted-transaction marker column, when the table has one

    @property
    def name(self) -> str:
        return self.layout.name

    @property
    def partition(self) -> str:
        return self.layout.partition

    @property
    def offset(self) -> str:
        return self.layout.offset

    @property
    def timestamps(self) -> tuple[str, ...]:
        """The timestamp column and its renames, newest first (coalesced in that order)."""
        return ((self.timestamp,) if self.timestamp else ()) + self.timestamp_fallbacks

    def selected_fields(self) -> tuple[str, ...]:
        paths = [self.partition, self.offset, *self.timestamps]
        for optional in (self.timestamp_type, self.key, self.headers, self.raw_value, self.schema_id, self.aborted):
            if optional is not None:
                paths.append(optional)
        return tuple(dict.fromkeys([p.split(".")[0] for p in paths] + list(self.value_columns)))


def _has(schema: Schema, path: str) -> bool:
    try:
        schema.find_field(path)
    except ValueError:
        return False
    return True


_INTEGERS = ("int", "long")
_TIMES = ("timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns", "long", "int")
_BYTES = ("binary", "string", "fixed", "uuid")
KINDS = {  # what each part of a record may be stored as (Iceberg type names)
    "partition": _INTEGERS, "offset": _INTEGERS, "timestamp": _TIMES, "timestamp_type": _INTEGERS,
    "key": _BYTES, "raw_value": _BYTES, "schema_id": _INTEGERS, "aborted": ("boolean",),
}


def _kind(field_type: object) -> str:
    text = str(field_type)
    return text.split("(", maxsplit=1)[0].split("[", maxsplit=1)[0].split("<", maxsplit=1)[0].strip()


def type_problems(schema: Schema, parts: dict[str, str | None]) -> list[str]:
    """What is wrong with the types of a layout's columns (``parts``: part name -> column path)."""
    problems = []
    for part, path in parts.items():
        if path is None:
            continue
        field_type = schema.find_field(path).field_type
        if part == "headers":
            element = field_type.element_type if isinstance(field_type, ListType) else None
            ok = isinstance(field_type, MapType) or (isinstance(element, StructType)
                                                     and {"key", "value"} <= {f.name for f in element.fields})
            if not ok:
                problems.append(f"column {path} ({part}) is {field_type}, expected a list of (key, value) structs"
                                " or a map")
        elif part in KINDS and _kind(field_type) not in KINDS[part]:
            problems.append(f"column {path} ({part}) is {field_type}, expected one of {', '.join(KINDS[part])}")
    return problems


def renamed(schema: Schema, path: str) -> list[str]:
    """The columns beside ``path`` named ``<name>_v<N>``, newest (highest N) first: a writer's migration that
    renamed a column and added a new one under the old name (Redpanda v25.3's guide renames
    ``redpanda.timestamp`` to ``timestamp_v1``); rows written before it hold their value only there."""
    parent, _, leaf = path.rpartition(".")
    try:
        parent_type = schema.find_field(parent).field_type if parent else schema.as_struct()
    except ValueError:
        return []
    if not isinstance(parent_type, StructType):
        return []
    fields = parent_type.fields
    pattern = re.compile(re.escape(leaf) + r"_v(\d+)$")
    found = [(int(m.group(1)), f.name) for f in fields if (m := pattern.match(f.name))]
    return [f"{parent}.{name}" if parent else name for _, name in sorted(found, reverse=True)]


def resolve(layout_name: str, schema: Schema, table: str) -> ResolvedLayout:
    """Match ``schema`` against the named layout; raise :class:`LayoutError` naming what is missing."""
    candidates = LAYOUTS.get(layout_name)
    if candidates is None:
        raise LayoutError(f"unknown layout {layout_name!r}")
    problems = []
    for layout in candidates:
        required = [layout.partition, layout.offset]
        missing = [p for p in required if not _has(schema, p)]
        if missing:
            problems.append(f"no column {', '.join(missing)}")
            continue
        optional = {name: (path if path is not None and _has(schema, path) else None)
                    for name, path in (("key", layout.key), ("headers", layout.headers),
                                       ("timestamp_type", layout.timestamp_type), ("raw_value", layout.raw_value),
                                       ("schema_id", layout.schema_id), ("aborted", layout.aborted))}
        roots = set(layout.metadata_roots)
        value_columns = tuple(f.name for f in schema.fields if f.name not in roots)
        if optional["raw_value"] is None and not value_columns:
            problems.append("no value column (neither a raw value column nor typed value fields)")
            continue
        timestamps: list[str] = []
        if layout.timestamp is not None:
            timestamps = ([layout.timestamp] if _has(schema, layout.timestamp) else []) + renamed(schema,
                                                                                                  layout.timestamp)
            if not timestamps:
                problems.append(f"no column {layout.timestamp}")
                continue
        wrong = type_problems(schema, {"partition": layout.partition, "offset": layout.offset, **optional})
        for path in timestamps:
            wrong += type_problems(schema, {"timestamp": path})
        if wrong:
            problems.append("; ".join(wrong))
            continue
        return ResolvedLayout(layout=layout, value_columns=value_columns,
                              timestamp=timestamps[0] if timestamps else None,
                              timestamp_fallbacks=tuple(timestamps[1:]), **optional)
    columns = ", ".join(f.name for f in schema.fields)
    raise LayoutError(f"table {table} does not match layout {layout_name!r}: {'; '.join(problems)}"
                      f" (its top-level columns: {columns})")
