"""Tables whose schema evolved under their writer: Redpanda's v25.3 migration with its ``_v1`` renames.

The migration guide (redpanda-data/docs ``modules/upgrade/pages/iceberg-schema-changes-and-migration-guide.adoc``)
has the user rename ``redpanda.timestamp`` to ``timestamp_v1`` and ``redpanda.headers.key`` to ``key_v1``;
Redpanda then adds ``redpanda.timestamp`` (timestamptz) and ``redpanda.headers.key`` (string) again (and
``timestamp_type``, which v24.3 did not write).  Rows written before have nulls in the new columns
(every header key null), rows written after have nulls in the ``_v1`` columns.

v24.3's required fields (``redpanda``, ``partition``, ``offset``, ``timestamp``, the header element)
become optional: v25.3 declares every field optional and leaves ``timestamp_v1`` null, which a required
column could not hold (an inference: the guide does not say).  The partition spec still points at the
old timestamp field (now ``timestamp_v1``, null in new rows), so
new files get a null hour partition value: nothing in the guide or the source updates the spec (an
inference, stated as such in docs/writers.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.types import IntegerType, StringType, TimestamptzType

from .build import BuildReport, append_records, plan_shape, write_table
from .layouts import make_layout
from .records import KafkaRecords, as_slices

__all__ = ["conform", "write_redpanda_migrated"]


def conform(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` reshaped to ``target`` by field name: fields the target lacks are dropped, fields the
    source lacks are null, primitives cast."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_struct(target):
        mask = pc.is_null(array) if array.null_count else None
        source = array.type if pa.types.is_struct(array.type) else pa.struct([])
        names = [source.field(i).name for i in range(source.num_fields)]
        children = []
        for i in range(target.num_fields):
            f = target.field(i)
            if f.name in names:
                children.append(conform(array.field(names.index(f.name)), f.type))
            else:
                children.append(pa.nulls(len(array), f.type))
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_list(target):
        values = conform(array.values, target.value_type)
        offsets = array.offsets
        if array.null_count:
            offsets = pc.if_else(pa.concat_arrays([pc.is_null(array), pa.array([False])]),
                                 pa.scalar(None, pa.int32()), offsets)
        return pa.ListArray.from_arrays(offsets, values, type=target)
    return array.cast(target)


def write_redpanda_migrated(catalog: Any, identifier: str, before: KafkaRecords | Iterable[KafkaRecords],
                            after: KafkaRecords | Iterable[KafkaRecords], *, shape: str = "streaming",
                            mode: str = "key_value", catalog_ids: str = "object_storage",
                            column_bounds: bool = True, **shape_options: Any) -> BuildReport:
    """``before`` written by Redpanda v24.3, the table migrated as the guide says, then ``after`` written
    by v25.3 into the same table.  Returns the report of both phases together."""
    options = {"mode": mode, "version": "v24.3", "catalog_type": catalog_ids, "column_bounds": column_bounds}
    report = write_table(catalog, identifier, before, layout="redpanda", shape=shape, **options, **shape_options)
    table = report.table
    with table.update_schema() as update:  # the user's two renames ...
        update.rename_column("redpanda.timestamp", "timestamp_v1")
        update.rename_column("redpanda.headers.element.key", "key_v1")
    with table.update_schema() as update:  # ... then Redpanda's schema merge makes the v25.3 schema fit:
        # every field optional (v25.3 declares them so and writes nulls into timestamp_v1; inferred) ...
        for path in ("redpanda", "redpanda.partition", "redpanda.offset", "redpanda.timestamp_v1",
                     "redpanda.headers.element"):
            update.make_column_optional(path)
        # ... and the new columns
        update.add_column(("redpanda", "timestamp"), TimestamptzType())
        update.add_column(("redpanda", "headers", "element", "key"), StringType())
        update.add_column(("redpanda", "timestamp_type"), IntegerType())
    table = catalog.load_table(identifier)
    slices = as_slices(after)
    first = next(slices, None)
    if first is None:
        return report
    new = make_layout("redpanda", first, mode=mode, version="v25.3", catalog_type=catalog_ids,
                      column_bounds=column_bounds)
    schema = table.schema()
    arrow = schema_to_pyarrow(schema, include_field_ids=False)

    def to_rows(records: KafkaRecords) -> pa.Table:
        rows = new.to_rows(records)
        columns = [conform(rows[f.name] if f.name in rows.column_names else pa.nulls(len(rows), f.type), f.type)
                   for f in arrow]
        return pa.Table.from_arrays(columns, schema=arrow)

    evolved = dataclasses.replace(new, schema=schema, to_rows=to_rows)
    plan = plan_shape(shape, evolved, dict(shape_options), partitions=max(1, len(pc.unique(first.partition))))
    if table.spec().fields:  # hour(timestamp_v1): null in every new row
        plan = dataclasses.replace(plan, spec="null")

    def chain() -> Iterable[KafkaRecords]:
        yield first
        yield from slices

    append_records(table, evolved, plan, chain(), report, topic=first.topic)
    return report
