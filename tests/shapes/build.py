"""Build an Iceberg table from Kafka records in a writer's layout and a shape, fast.

Parquet files are written with pyarrow (Iceberg field ids in the Arrow schema), their manifest entries
are computed from the footers as Iceberg's writers do, and many files are committed per snapshot with
PyIceberg's fast (or merge) append.  Tables are created from metadata written here and registered, so the
field ids are exactly the writer's (PyIceberg's ``create_table`` would renumber them).  Records are taken
slice by slice: memory is bounded by one slice plus the rows of the files being cut from it.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.exceptions import NamespaceAlreadyExistsError
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadataV2
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortField, SortOrder
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform
from pyiceberg.typedef import Record

from .layouts import CommitState, Layout, make_layout
from .records import KafkaRecords, as_slices
from .snapshots import StagedSnapshots

__all__ = [
    "SHAPES",
    "BuildReport",
    "ShapePlan",
    "append_records",
    "create_table",
    "partition_spec",
    "plan_shape",
    "split_invalid",
    "write_rows",
    "write_table",
]

SHAPES = ("one-file", "streaming", "hourly", "daily", "archive", "large")
MS_PER_HOUR = 3_600_000
MS_PER_DAY = 86_400_000


@dataclass(frozen=True)
class ShapePlan:
    """How a stream of records becomes files and snapshots."""

    spec: str                      # "none", "identity" (Kafka partition), "hour", "day"; "null": the table's
                                   # one-field spec, every new file's value null (a migrated Redpanda table)
    cut_rows: int | None           # rows (arrival order) per cut; a cut's rows make one file per group.
                                   # None: one file per group over the whole input
    files_per_commit: int | None   # None: one commit at the end
    row_group_rows: int | None     # None: from the writer's row group bytes (or one per file)
    per_kafka_partition: bool      # a file holds one Kafka partition
    sort_in_file: bool             # rows sorted by (partition, offset) inside a file


@dataclass
class BuildReport:
    table: Table
    rows: int = 0
    files: int = 0
    row_groups: int = 0
    snapshots: int = 0
    bytes: int = 0
    seconds: float = 0.0
    dlq: Table | None = None
    data_files: list[DataFile] = field(default_factory=list, repr=False)


def plan_shape(shape: str, layout: Layout, options: dict[str, Any], partitions: int = 1) -> ShapePlan:
    """The shape's plan for this layout; ``options`` may override ``rows_per_file``, ``files_per_commit``,
    ``row_group_rows``, ``mix_partitions`` (consumed from the dict).  A writer whose files hold one Kafka
    partition cuts ``partitions`` times the rows, so its files too hold about ``rows_per_file`` rows."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")
    native = "identity" if layout.identity_partition else ("hour" if layout.name == "redpanda" else "none")
    mix = options.pop("mix_partitions", None)  # override: e.g. a compacted Redpanda table mixes them
    per_partition = layout.files_per_kafka_partition if mix is None else not mix
    rows = options.pop("rows_per_file", None)
    scale = partitions if per_partition else 1
    per_commit = options.pop("files_per_commit", None)
    rg_rows = options.pop("row_group_rows", None)
    if shape == "one-file":
        # a bulk load, a compaction, one translation: one file (one per Kafka partition where the spec says
        # so); a Redpanda table with redpanda.iceberg.partition.spec=() so the one file can span hours
        spec = "identity" if layout.identity_partition else "none"
        return ShapePlan(spec, None, per_commit, rg_rows, layout.identity_partition, layout.sort_by_offset)
    if shape == "archive":
        if layout.name != "ksi":
            raise ValueError(f"shape 'archive' is ksi archive's own; layout {layout.name!r} has no archive runs")
        return ShapePlan("identity", (rows or 62_500) * scale, per_commit or scale, rg_rows, True, True)
    if shape in ("hourly", "daily"):
        if layout.identity_partition:
            raise ValueError(f"layout {layout.name!r} is partitioned by Kafka partition; it has no "
                             f"{shape} shape")
        if layout.time_path is None:
            raise ValueError(f"layout {layout.name!r} with these options has no timestamp column to partition "
                             f"by (AutoMQ and Kafka Connect keep ms as a long: use typed values with a 'ts' field)")
        return ShapePlan("hour" if shape == "hourly" else "day", (rows or 20_000) * scale, per_commit or 4, rg_rows,
                         per_partition, False)
    if shape == "streaming":
        return ShapePlan(native, (rows or 2_000) * scale, per_commit or 4, rg_rows, per_partition,
                         layout.sort_by_offset)
    # large: many files and many manifests (a snapshot, so a manifest, per files_per_commit files)
    return ShapePlan(native, (rows or 10_000) * scale, per_commit or 10, rg_rows, per_partition, layout.sort_by_offset)


# ------------------------------------------------------------------------------------- table metadata

def _source_id(schema: Schema, path: str) -> int:
    return schema.find_field(path).field_id


def partition_spec(plan: ShapePlan, layout: Layout) -> PartitionSpec:
    schema = layout.schema
    if plan.spec == "none":
        return UNPARTITIONED_PARTITION_SPEC
    if plan.spec == "identity":
        name = layout.partition_path.replace(".", "_")
        return PartitionSpec(PartitionField(_source_id(schema, layout.partition_path), 1000, IdentityTransform(), name))
    assert layout.time_path is not None
    transform = HourTransform() if plan.spec == "hour" else DayTransform()
    name = f"{layout.time_path.replace('.', '_')}_{plan.spec}"
    return PartitionSpec(PartitionField(_source_id(schema, layout.time_path), 1000, transform, name))


def _sort_order(layout: Layout) -> SortOrder:
    if not layout.sort_by_offset:
        return UNSORTED_SORT_ORDER
    identity = IdentityTransform()
    return SortOrder(SortField(source_id=_source_id(layout.schema, layout.partition_path), transform=identity),
                     SortField(source_id=_source_id(layout.schema, layout.offset_path), transform=identity),
                     order_id=1)


def create_table(catalog: Any, identifier: str, schema: Schema, spec: PartitionSpec, sort_order: SortOrder,
                 properties: dict[str, str]) -> Table:
    """Create ``identifier`` with exactly these ids (metadata written here, then registered)."""
    namespace, name = identifier.rsplit(".", 1)
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(namespace)
    location = catalog._resolve_table_location(None, namespace, name).rstrip("/")
    last_partition_id = max([f.field_id for f in spec.fields], default=999)
    metadata = TableMetadataV2(
        location=location, table_uuid=uuid.uuid4(), last_updated_ms=int(time.time() * 1000),
        last_column_id=schema.highest_field_id, schemas=[schema], current_schema_id=schema.schema_id,
        partition_specs=[spec], default_spec_id=spec.spec_id, last_partition_id=last_partition_id,
        sort_orders=[sort_order], default_sort_order_id=sort_order.order_id, properties=properties,
    )
    path = f"{location}/metadata/00000-{uuid.uuid4()}.metadata.json"
    io = catalog._load_file_io(location=path)
    ToOutputFile.table_metadata(metadata, io.new_output(path))
    return catalog.register_table(identifier, path)


# ------------------------------------------------------------------------------------------ the writer

def _group_keys(records: KafkaRecords, plan: ShapePlan) -> pa.Table:
    """Per row: the partition value of the spec (or 0) and the Kafka partition (or 0) of its file."""
    if plan.spec == "hour":
        time_key = pc.floor(pc.divide(records.timestamp_ms.cast(pa.float64()), MS_PER_HOUR)).cast(pa.int64())
    elif plan.spec == "day":
        time_key = pc.floor(pc.divide(records.timestamp_ms.cast(pa.float64()), MS_PER_DAY)).cast(pa.int64())
    else:
        time_key = pa.array(np.zeros(len(records), dtype=np.int64))
    part_key = records.partition if (plan.per_kafka_partition or plan.spec == "identity") \
        else pa.array(np.zeros(len(records), dtype=np.int32))
    return pa.table({"t": time_key, "p": part_key})


def _groups(records: KafkaRecords, plan: ShapePlan) -> Iterator[tuple[tuple[int, int], KafkaRecords]]:
    keys = _group_keys(records, plan)
    if len(records) == 0:
        return
    t = keys["t"].to_numpy()
    p = keys["p"].to_numpy()
    combined = t.astype(np.int64) * (1 << 20) + p.astype(np.int64)
    order = np.argsort(combined, kind="stable")
    sorted_keys = combined[order]
    bounds = np.flatnonzero(np.diff(sorted_keys)) + 1
    for chunk in np.split(order, bounds):
        first = chunk[0]
        yield (int(t[first]), int(p[first])), records.take(pa.array(chunk))


def _statistics_plan(schema: Schema, properties: dict[str, str]) -> dict[int, Any]:
    """PyIceberg's metrics plan, with bounds also for primitives nested in structs (PyIceberg collects
    only counts for every nested column; Java's writers and Redpanda after PR 30704 write min/max for
    struct members, not for list elements or map entries)."""
    import dataclasses

    from pyiceberg.io.pyarrow import MetricModeTypes, MetricsMode, match_metrics_mode
    from pyiceberg.types import BinaryType, StringType, StructType

    plan = compute_statistics_plan(schema, properties)
    default = match_metrics_mode(properties.get("write.metadata.metrics.default", "truncate(16)"))
    in_structs: set[int] = set()

    def visit(kind: Any, nested_in_struct: bool) -> None:
        if isinstance(kind, StructType):
            for f in kind.fields:
                if f.field_type.is_primitive and nested_in_struct:
                    in_structs.add(f.field_id)
                visit(f.field_type, True)
        # list elements and map entries: counts only, as Java

    for top in schema.fields:
        visit(top.field_type, True)
    for field_id in in_structs:
        collector = plan.get(field_id)
        if collector is None or default.type == MetricModeTypes.NONE:
            continue
        mode = default
        textual = isinstance(collector.iceberg_type, (StringType, BinaryType))
        if default.type == MetricModeTypes.TRUNCATE and not textual:
            mode = MetricsMode(MetricModeTypes.FULL)
        plan[field_id] = dataclasses.replace(collector, mode=mode)
    return plan


def _offsets_summary(records: KafkaRecords) -> pa.Table:
    """Per Kafka partition: highest offset, highest and last timestamp (for the writers' commit state)."""
    t = pa.table({"p": records.partition, "o": records.offset, "ts": records.timestamp_ms})
    return t.group_by("p", use_threads=False).aggregate([("o", "max"), ("ts", "max"), ("ts", "last")])


class _OpenFile:
    """A data file written row group by row group (the one-file shape over a stream of slices)."""

    def __init__(self, writer: _Writer, key: tuple[int, int]) -> None:
        self.writer, self.key = writer, key
        self.buffer: list[pa.Table] = []
        self.buffered = 0
        self.parts: list[pa.Table] = []
        self.path = writer.new_path(key)
        self.stream: Any = None
        self.pq_writer: pq.ParquetWriter | None = None
        self.collector: list[pq.FileMetaData] = []
        self.rows = 0

    def add(self, records: KafkaRecords) -> None:
        rows = self.writer.to_rows(records)
        if rows.num_rows == 0:
            return
        self.parts.append(_offsets_summary(records))
        self.buffer.append(rows)
        self.buffered += rows.num_rows
        target = self.writer.row_group_rows(rows, whole_file=None)
        while target is not None and self.buffered >= target:
            merged = pa.concat_tables(self.buffer)
            self._write(merged.slice(0, target))
            rest = merged.slice(target)
            self.buffer, self.buffered = ([rest], rest.num_rows) if rest.num_rows else ([], 0)

    def _write(self, rows: pa.Table) -> None:
        if self.pq_writer is None:
            settings = self.writer.layout.parquet
            self.stream = self.writer.table.io.new_output(self.path).create(overwrite=True)
            self.pq_writer = pq.ParquetWriter(self.stream, self.writer.arrow_schema, **settings.writer_options(),
                                              metadata_collector=self.collector)
        if self.writer.plan.sort_in_file:
            rows = rows.take(pc.sort_indices(rows, sort_keys=self.writer.sort_keys(rows)))
        self.pq_writer.write_table(rows, row_group_size=max(1, rows.num_rows))
        self.rows += rows.num_rows

    def close(self) -> None:
        if self.buffered:
            self._write(pa.concat_tables(self.buffer))
            self.buffer, self.buffered = [], 0
        if self.pq_writer is None:
            return
        self.pq_writer.close()
        size = self.stream.tell()
        self.stream.close()
        self.writer.add_data_file(self.key, self.path, size, self.collector[0], self.parts)


@dataclass
class _Writer:
    catalog: Any
    table: Table
    layout: Layout
    plan: ShapePlan
    report: BuildReport
    snapshot_properties: dict[str, str]
    write_summary: bool
    topic: str
    pending: list[DataFile] = field(default_factory=list)
    committed: dict[int, int] = field(default_factory=dict)
    max_ts: dict[int, int] = field(default_factory=dict)
    last_ts: dict[int, int] = field(default_factory=dict)
    pending_offsets: list[pa.Table] = field(default_factory=list)
    commits: int = 0
    staged: StagedSnapshots | None = None

    def __post_init__(self) -> None:
        self.arrow_schema = self.layout.arrow_schema
        self.stats_plan = _statistics_plan(self.layout.schema, self.table.metadata.properties)
        self.column_mapping = parquet_path_to_id_mapping(self.layout.schema)
        self.spec = self.table.spec()

    def to_rows(self, records: KafkaRecords) -> pa.Table:
        rows = self.layout.to_rows(records)
        return pa.Table.from_arrays(rows.columns, schema=self.arrow_schema)

    def sort_keys(self, rows: pa.Table) -> list[tuple[str, str]]:
        return [(self.layout.partition_path, "ascending"), (self.layout.offset_path, "ascending")]

    def row_group_rows(self, rows: pa.Table, whole_file: int | None) -> int | None:
        """Rows per row group: the shape's override, else the writer's bytes over this data's row size;
        None (one row group per file) for writers that flush only at the end."""
        if self.plan.row_group_rows is not None:
            return self.plan.row_group_rows
        target = self.layout.parquet.row_group_bytes
        if target is None:
            return whole_file
        per_row = max(1, rows.nbytes // max(1, rows.num_rows))
        return max(1, target // per_row)

    def new_path(self, key: tuple[int, int]) -> str:
        sub = ""
        if self.spec.fields:
            value = key[0] if self.plan.spec in ("hour", "day") else "null" if self.plan.spec == "null" else key[1]
            sub = f"{self.spec.fields[0].name}={value}/"
        return f"{self.table.location()}/data/{sub}{uuid.uuid4()}.parquet"

    def write_file(self, key: tuple[int, int], records: KafkaRecords) -> None:
        """One complete data file from ``records`` (the cut shapes)."""
        if self.plan.sort_in_file:
            records = records.sorted()
        rows = self.to_rows(records)
        if rows.num_rows == 0:
            return
        settings = self.layout.parquet
        path = self.new_path(key)
        collector: list[pq.FileMetaData] = []
        with self.table.io.new_output(path).create(overwrite=True) as stream:
            pq.write_table(rows, stream, row_group_size=self.row_group_rows(rows, rows.num_rows),
                           **settings.writer_options(), metadata_collector=collector)
            size = stream.tell()
        self.add_data_file(key, path, size, collector[0], [_offsets_summary(records)])

    def add_data_file(self, key: tuple[int, int], path: str, size: int, metadata: pq.FileMetaData,
                      parts: list[pa.Table]) -> None:
        settings = self.layout.parquet
        partition = Record(*([key[0]] if self.plan.spec in ("hour", "day") else
                             [key[1]] if self.plan.spec == "identity" else
                             [None] if self.plan.spec == "null" else []))
        stats = data_file_statistics_from_parquet_metadata(metadata, self.stats_plan, self.column_mapping)
        serialized = stats.to_serialized_dict()
        if not settings.column_bounds:  # Redpanda before PR 30704: partition, count and size only
            serialized = {"record_count": serialized["record_count"]}
        data_file = DataFile.from_args(content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
                                       partition=partition, file_size_in_bytes=size, sort_order_id=None,
                                       spec_id=self.spec.spec_id, equality_ids=None, key_metadata=None,
                                       **serialized)
        self.pending.append(data_file)
        self.pending_offsets.extend(parts)
        self.report.files += 1
        self.report.rows += metadata.num_rows
        self.report.row_groups += metadata.num_row_groups
        self.report.bytes += size
        self.report.data_files.append(data_file)
        if self.plan.files_per_commit is not None and len(self.pending) >= self.plan.files_per_commit:
            self.commit()

    def _advance(self) -> None:
        for agg in self.pending_offsets:
            for p, o, ts, last in zip(agg["p"].to_pylist(), agg["o_max"].to_pylist(), agg["ts_max"].to_pylist(),
                                      agg["ts_last"].to_pylist(), strict=True):
                self.committed[p] = max(self.committed.get(p, o + 1), o + 1)
                self.max_ts[p] = max(self.max_ts.get(p, ts), ts)
                self.last_ts[p] = last
        self.pending_offsets.clear()

    def flush(self) -> None:
        """Add the snapshots made so far to the table (one catalog commit)."""
        if self.staged is not None:
            self.staged.commit()

    def commit(self, files: list[DataFile] | None = None) -> None:
        """One snapshot adding the pending files (or ``files``), with the writer's summary (fast append;
        Redpanda: merge append); staged until :meth:`flush`."""
        files = self.pending if files is None else files
        if not files:
            return
        self._advance()
        properties = dict(self.snapshot_properties)
        if self.write_summary:
            state = CommitState(topic=self.topic, commit_index=self.commits, next_offsets=dict(self.committed),
                                max_timestamp_ms=dict(self.max_ts), last_timestamp_ms=dict(self.last_ts),
                                files_so_far=self.report.files)
            properties.update(self.layout.summary(state))
        if self.staged is None:
            self.staged = StagedSnapshots(self.table, merge=self.layout.name == "redpanda")
        self.staged.add(list(files), properties)
        if files is self.pending:
            self.pending = []
        self.commits += 1
        self.report.snapshots += 1


def split_invalid(records: KafkaRecords) -> tuple[KafkaRecords, KafkaRecords]:
    """(translatable, invalid) for Redpanda's schema modes: a tombstone or a value whose typed form is
    null (it did not decode) is invalid."""
    assert records.typed is not None
    invalid = pc.or_(pc.is_null(records.value), pc.is_null(records.typed))
    return records.filter(pc.invert(invalid)), records.filter(invalid)


def write_table(catalog: Any, identifier: str, records: KafkaRecords | Iterable[KafkaRecords], *, layout: str,
                shape: str, snapshot_properties: dict[str, str] | None = None, commit_state: bool = True,
                reregister_files: int = 0, invalid_record_action: str = "dlq_table",
                properties: dict[str, str] | None = None, **options: Any) -> BuildReport:
    """Write ``records`` (one :class:`KafkaRecords` or an iterable of slices, in arrival order) into a new
    table ``identifier`` as the writer ``layout`` leaves it, in ``shape``.

    Shape options: ``rows_per_file``, ``files_per_commit``, ``row_group_rows``, ``mix_partitions`` (True:
    files mix Kafka partitions even for a per-partition writer, as after a compaction).  Layout
    options: see :func:`tests.shapes.layouts.make_layout` (``mode``, ``version``, ``catalog_type``,
    ``column_bounds``, ``value``, ``key_type``, ``metadata``, ``schemaless``, ``type_overrides`` ...).
    ``commit_state`` writes the writer's own snapshot summary properties; ``reregister_files`` appends
    the first N data files again in a last snapshot (duplicates as apache/iceberg issue 16282 leaves
    them).  For Redpanda's schema mode, invalid records (tombstones, undecodable values) go to
    ``<identifier>~dlq`` in the key_value layout (``invalid_record_action="dlq_table"``, Redpanda's
    default) or are dropped (``"drop"``)."""
    started = time.perf_counter()
    slices = as_slices(records)
    first = next(slices, None)
    if first is None:
        raise ValueError(f"{identifier}: no records")
    topic = first.topic
    layout_options = dict(options)
    shape_options = {k: layout_options.pop(k) for k in ("rows_per_file", "files_per_commit", "row_group_rows",
                                                        "mix_partitions") if k in layout_options}
    spec_layout = make_layout(layout, first, **layout_options)
    plan = plan_shape(shape, spec_layout, shape_options, partitions=max(1, len(pc.unique(first.partition))))
    table_properties = dict(spec_layout.properties)
    table_properties.update({"write.parquet.compression-codec": spec_layout.parquet.compression})
    if spec_layout.parquet.row_group_bytes is not None:
        table_properties.setdefault("write.parquet.row-group-size-bytes", str(spec_layout.parquet.row_group_bytes))
    table_properties.update(properties or {})
    table = create_table(catalog, identifier, spec_layout.schema, partition_spec(plan, spec_layout),
                         _sort_order(spec_layout), table_properties)
    report = BuildReport(table=table)
    dlq_slices = append_records(table, spec_layout, plan, _chain(first, slices), report,
                                snapshot_properties=snapshot_properties, commit_state=commit_state,
                                reregister_files=reregister_files, topic=topic,
                                split_dlq=layout == "redpanda" and spec_layout.options.get("mode") == "schema")
    if dlq_slices and invalid_record_action == "dlq_table":
        dlq = write_table(catalog, f"{identifier}~dlq", dlq_slices, layout="redpanda", shape="streaming",
                          mode="key_value", version=spec_layout.options["version"],
                          catalog_type=spec_layout.options["catalog_type"],
                          column_bounds=spec_layout.options["column_bounds"],
                          rows_per_file=plan.cut_rows or 2_000)
        report.dlq = dlq.table
    report.seconds = time.perf_counter() - started
    return report


def _chain(first: KafkaRecords, rest: Iterator[KafkaRecords]) -> Iterator[KafkaRecords]:
    yield first
    yield from rest


def append_records(table: Table, layout: Layout, plan: ShapePlan, slices: Iterable[KafkaRecords],
                   report: BuildReport, *, snapshot_properties: dict[str, str] | None = None,
                   commit_state: bool = True, reregister_files: int = 0, topic: str = "topic",
                   split_dlq: bool = False) -> list[KafkaRecords]:
    """Write ``slices`` into ``table`` (which has ``layout``'s schema) as ``plan`` says, committing as it
    goes; returns the records split off as invalid (``split_dlq``, Redpanda's schema modes)."""
    writer = _Writer(None, table, layout, plan, report, dict(snapshot_properties or {}), commit_state, topic)
    dlq_slices: list[KafkaRecords] = []
    open_files: dict[tuple[int, int], _OpenFile] = {}
    leftover: KafkaRecords | None = None
    for part in slices:
        if split_dlq:
            part, invalid = split_invalid(part)
            if len(invalid):
                dlq_slices.append(invalid)
        if plan.cut_rows is None:  # one file per group over the whole input, row group by row group
            for key, group in _groups(part, plan):
                if key not in open_files:
                    open_files[key] = _OpenFile(writer, key)
                open_files[key].add(group)
            continue
        merged = part if leftover is None else KafkaRecords.concat([leftover, part])
        start_row = 0
        while len(merged) - start_row >= plan.cut_rows:
            for key, group in _groups(merged.slice(start_row, plan.cut_rows), plan):
                writer.write_file(key, group)
            start_row += plan.cut_rows
        leftover = merged.slice(start_row) if start_row < len(merged) else None
    if leftover is not None and len(leftover):
        for key, group in _groups(leftover, plan):
            writer.write_file(key, group)
    for key in sorted(open_files):
        open_files.pop(key).close()
    writer.commit()
    if reregister_files:
        # the same data files registered again in a later snapshot (apache/iceberg issue 16282)
        writer.commit(list(report.data_files[:reregister_files]))
    writer.flush()
    report.table = table
    return dlq_slices


def write_rows(catalog: Any, identifier: str, layout: Layout, rows: pa.Table, *, files: int = 1,
               commits: int = 1) -> BuildReport:
    """Write rows already in ``layout``'s Arrow schema (e.g. hostile rows from
    :mod:`tests.shapes.strategies`) into a new unpartitioned table: ``files`` files over ``commits``
    snapshots, rows in the given order."""
    table = create_table(catalog, identifier, layout.schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER,
                         {"write.parquet.compression-codec": layout.parquet.compression})
    report = BuildReport(table=table)
    plan = ShapePlan("none", None, None, None, False, False)
    writer = _Writer(None, table, layout, plan, report, {}, False, "topic")
    arrow = layout.arrow_schema
    rows = pa.Table.from_arrays([c.combine_chunks() for c in rows.columns], schema=arrow)
    bounds = np.linspace(0, rows.num_rows, max(1, files) + 1).astype(int)
    per_commit = max(1, -(-max(1, files) // max(1, commits)))
    for start, stop in itertools.pairwise(bounds):
        part = rows.slice(int(start), int(stop - start))
        path = writer.new_path((0, 0))
        collector: list[pq.FileMetaData] = []
        with table.io.new_output(path).create(overwrite=True) as stream:
            pq.write_table(part, stream, **layout.parquet.writer_options(), metadata_collector=collector)
            size = stream.tell()
        writer.add_data_file((0, 0), path, size, collector[0], [])
        if len(writer.pending) >= per_commit:
            writer.commit()
    writer.commit()
    writer.flush()
    report.table = table
    return report
