"""Typed value columns: the table's schema evolved to every Avro schema registered for the topic's values.

:func:`prepare_values` decides, per run, between raw bytes and typed columns (``values.py`` holds the
per-row decoding; this module imports it, never the reverse).

The driver evolves the table once per run, before any task starts: each version under ``<topic>-value``,
in schema-id order, is merged with PyIceberg's ``update_schema().union_by_name(...)``.  New fields become
new optional columns with new Iceberg field ids, ints widen to longs and floats to doubles in place, and
dropped fields simply stay (older rows keep their values, newer rows hold nulls); no data file is
rewritten.  Every value field is optional in the table, whatever the Avro schema says, because rows
written with other versions (or kept as raw bytes) have no value for it; each row's writer schema id says
which fields were really there, and the proxy re-encodes with that writer schema.

Schemas whose types Spark cannot write (Avro ``time-*``) or that typed columns cannot hold keep their
values as raw bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..config import Config, TopicConfig
from .values import ERROR_COLUMN, ValueDecoder, ValuePlan, check_value_names, raw_plan, registry_versions

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

__all__ = ["optional_struct", "prepare_values", "spark_arrow_type", "typed_plan"]


def prepare_values(config: Config, topic: TopicConfig, catalog: Catalog, table: Table,
                   say: Callable[[str], None]) -> ValuePlan:
    """Decide raw or typed for ``topic``; for typed, evolve ``table``'s schema first."""
    if config.schema_registry.url is None:
        return raw_plan()
    versions = registry_versions(config.schema_registry.url, f"{topic.name}-value")
    if not versions:
        return raw_plan()
    return typed_plan(topic, catalog, table, versions, say)


def optional_struct(struct: Any) -> Any:
    """``struct`` (a PyIceberg StructType) with every struct field optional, recursively."""
    from pyiceberg.types import ListType, MapType, NestedField, StructType

    def visit(t: Any) -> Any:
        if isinstance(t, StructType):
            return StructType(*(NestedField(f.field_id, f.name, visit(f.field_type), required=False, doc=f.doc)
                                for f in t.fields))
        if isinstance(t, ListType):
            return ListType(t.element_id, visit(t.element_type), element_required=t.element_required)
        if isinstance(t, MapType):
            return MapType(t.key_id, t.key_type, t.value_id, visit(t.value_type), value_required=t.value_required)
        return t

    return visit(struct)


def _has_time(t: Any) -> bool:
    from pyiceberg.types import ListType, MapType, StructType, TimeType

    if isinstance(t, TimeType):
        return True
    if isinstance(t, StructType):
        return any(_has_time(f.field_type) for f in t.fields)
    if isinstance(t, ListType):
        return _has_time(t.element_type)
    if isinstance(t, MapType):
        return _has_time(t.value_type)
    return False


def spark_arrow_type(t: pa.DataType) -> pa.DataType:
    """``t`` with the Arrow types Spark 3.5's ``mapInArrow`` cannot take replaced: large and fixed-size
    binaries/strings/lists by their plain forms."""
    if pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        item = t.value_field
        return pa.list_(item.with_type(spark_arrow_type(item.type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(spark_arrow_type(t.key_type)),
                       t.item_field.with_type(spark_arrow_type(t.item_type)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(spark_arrow_type(f.type)) for f in t])
    return t


def typed_plan(topic: TopicConfig, catalog: Catalog, table: Table, versions: dict[int, str],
               say: Callable[[str], None]) -> ValuePlan:
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.schema import Schema

    from ..avro import UnsupportedSchema, iceberg_struct, parse_schema

    usable: dict[int, str] = {}
    for schema_id, text in sorted(versions.items()):
        try:
            struct = iceberg_struct(parse_schema(text))
        except (UnsupportedSchema, ValueError) as exc:
            say(f"  values with schema id {schema_id}: kept as raw bytes ({exc})")
            continue
        if _has_time(struct):
            say(f"  values with schema id {schema_id}: kept as raw bytes (Spark cannot write Avro time-* fields)")
            continue
        check_value_names([f.name for f in struct.fields], topic.name)
        evolved = Schema(*optional_struct(struct).fields)
        current = {f.name for f in table.schema().fields}
        with table.update_schema() as update:
            update.union_by_name(evolved)
        table = catalog.load_table(topic.table)
        added = [f.name for f in table.schema().fields if f.name not in current]
        if added:
            say(f"  table schema evolved for schema id {schema_id}: added {', '.join(added)}")
        usable[schema_id] = text
    if not usable:
        return raw_plan()
    arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)
    fields = [f.with_type(spark_arrow_type(f.type)) for f in arrow]
    output = pa.schema([*fields, pa.field(ERROR_COLUMN, pa.string())])
    from ..lake.layouts import KSI

    value_fields = [f for f in fields if f.name not in KSI.metadata_roots]
    say(f"  values: Avro schema ids {', '.join(map(str, sorted(usable)))} decoded into "
        f"{len(value_fields)} typed columns; other values kept as raw bytes")
    return ValuePlan(output_schema=output, decoder=ValueDecoder(usable, value_fields), dead_letters=True)
