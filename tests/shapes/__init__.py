"""Iceberg tables as real writers leave them, for ksi's tests and benchmarks.

    from tests.shapes import KafkaRecords, synthetic, write_table
    report = write_table(catalog, "ns.topic", synthetic(100_000, 4, typed=True), layout="redpanda",
                         shape="hourly", mode="schema")

Layouts (``docs/writers.md`` has the facts and their sources): ``ksi``, ``redpanda``, ``automq``,
``kafka-connect``, ``streambased``.  Shapes: ``one-file``, ``streaming``, ``hourly``, ``daily``,
``archive``, ``large``.  :mod:`tests.shapes.anomalies` turns a topic's records into what a writer keeps
(holes, duplicates, aborted transactions, compaction); :mod:`tests.shapes.evolution` builds Redpanda's
v25.3 migration; :mod:`tests.shapes.strategies` has hypothesis strategies for fuzzing a reader.
"""

from __future__ import annotations

from .build import SHAPES, BuildReport, ShapePlan, append_records, create_table, plan_shape, write_table
from .layouts import LAYOUT_NAMES, Layout, make_layout
from .records import HEADERS_TYPE, KafkaRecords, synthetic, synthetic_slices, typed_values

__all__ = ["KafkaRecords", "synthetic", "synthetic_slices", "typed_values", "HEADERS_TYPE", "write_table",
           "append_records", "create_table", "plan_shape", "BuildReport", "ShapePlan", "SHAPES", "LAYOUT_NAMES",
           "Layout", "make_layout"]
