"""Iceberg tables as real writers leave them, for ksi's tests and benchmarks.

    from tests.shapes import synthetic_slices, write_table
    report = write_table(catalog, "ns.topic", synthetic_slices(10_000_000, 4, typed=True),
                         layout="redpanda", shape="hourly", mode="schema")
    report.table      # the pyiceberg Table; report.files, .row_groups, .snapshots, .dlq, .seconds

Layouts (``docs/writers.md`` has the facts and their sources): ``ksi``, ``redpanda`` (``mode``,
``version``, ``catalog_type``, ``column_bounds``), ``automq`` (``value``, ``key_type``), ``kafka-connect``
(``metadata``, ``schemaless``, ``force_optional``), ``streambased``.  Shapes: ``one-file``, ``streaming``,
``hourly``, ``daily``, ``archive``, ``large`` (``rows_per_file``, ``files_per_commit``, ``row_group_rows``,
``mix_partitions``).  Records come as one :class:`KafkaRecords` or an iterable of slices (bounded memory).

* :mod:`tests.shapes.anomalies`: a topic's records -> what a writer keeps (tombstones dropped,
  transactions with markers and aborts, compaction, at-least-once duplicates, undecodable values).
* :mod:`tests.shapes.evolution`: Redpanda's v25.3 migration (``_v1`` renames, nulls in old rows).
* :mod:`tests.shapes.strategies`: hypothesis strategies of hostile table contents per layout, written
  with :func:`write_rows`.
* ``python -m tests.shapes.measure``: build times per shape.
"""

from __future__ import annotations

from .build import SHAPES, BuildReport, ShapePlan, append_records, create_table, plan_shape, write_rows, write_table
from .evolution import write_redpanda_migrated
from .layouts import LAYOUT_NAMES, Layout, make_layout
from .records import HEADERS_TYPE, KafkaRecords, synthetic, synthetic_slices, typed_values

__all__ = [
           "HEADERS_TYPE",
           "LAYOUT_NAMES",
           "SHAPES",
           "BuildReport",
           "KafkaRecords",
           "Layout",
           "ShapePlan",
           "append_records",
           "create_table",
           "make_layout",
           "plan_shape",
           "synthetic",
           "synthetic_slices",
           "typed_values",
           "write_redpanda_migrated",
           "write_rows",
           "write_table",
]
