"""Arrow batches into Iceberg data files: Parquet written by Arrow, described for a commit by PyIceberg.

An archive task (on an executor or in a local worker process) streams one Kafka partition's offset range
into :class:`DataFileWriter`, which buffers about ``row_group_bytes`` of Arrow data, writes it as one
Parquet row group, and rolls to a new file past ``target_file_bytes``.  Memory is bounded by the row
group size, not by the range.  Each closed file becomes a :class:`WrittenFile`: the path and the
statistics Iceberg keeps per data file (record count, column sizes, value, null and NaN counts, lower and
upper bounds by field id, split offsets), computed by PyIceberg from the Parquet footer exactly as
PyIceberg's own writer does.  The Parquet schema carries the table's field ids.

Nothing is committed here: files become part of the table only when the driver commits them
(:mod:`ksi.pipeline.commit`), so a killed or retried task leaves at most unreferenced files behind.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile as IcebergDataFile
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.typedef import TableVersion

__all__ = ["DataFileWriter", "TableTarget", "WrittenFile", "conform", "data_files", "new_prefix"]

# PyIceberg's writer warns about table properties it does not implement; these two this writer implements
# itself (row group size in bytes) or that do not apply.
_OWN_PROPERTIES = ("write.parquet.row-group-size-bytes", "write.parquet.bloom-filter-max-bytes")


@dataclass(frozen=True)
class TableTarget:
    """Everything a task needs to write data files for one table; pickled to the executors/workers.

    Only the parts of the table's metadata a writer uses (not its snapshot history, which grows with
    every commit of a long-running ``--follow``)."""

    name: str
    schema: Schema                   # the table's current schema
    spec: PartitionSpec              # the default spec
    location: str
    properties: dict[str, str]
    format_version: int
    io_properties: dict[str, str]    # the catalog's FileIO properties (S3 credentials, ...)
    row_group_bytes: int
    target_file_bytes: int
    sort_order_id: int | None = None  # the table's sort order, which every file a task writes follows

    @classmethod
    def of(cls, table: Table, row_group_bytes: int | None = None, target_file_bytes: int | None = None) -> TableTarget:
        metadata = table.metadata
        props = dict(metadata.properties)
        name = table.name()
        return cls(name=".".join(name) if isinstance(name, tuple) else str(name), schema=metadata.schema(),
                   spec=metadata.spec(), location=metadata.location, properties=props,
                   format_version=int(metadata.format_version), io_properties=dict(table.io.properties),
                   row_group_bytes=row_group_bytes or int(props.get("write.parquet.row-group-size-bytes", 8 << 20)),
                   target_file_bytes=target_file_bytes or int(props.get("write.target-file-size-bytes", 128 << 20)),
                   sort_order_id=metadata.default_sort_order_id or None)

    def arrow_schema(self) -> pa.Schema:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        return schema_to_pyarrow(self.schema, include_field_ids=True)


@dataclass
class WrittenFile:
    """A data file written but not yet committed: what the driver needs to add it to the table."""

    file_path: str
    file_size_in_bytes: int
    partition: tuple[Any, ...]
    spec_id: int
    stats: dict[str, Any]            # DataFileStatistics.to_serialized_dict()
    sort_order_id: int | None = None

    @property
    def record_count(self) -> int:
        return int(self.stats["record_count"])


def data_files(files: list[WrittenFile], format_version: TableVersion) -> list[IcebergDataFile]:
    """PyIceberg ``DataFile`` objects for ``files`` (on the driver, for the commit)."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    return [DataFile.from_args(_table_format_version=format_version, content=DataFileContent.DATA,
                               file_path=f.file_path, file_format=FileFormat.PARQUET, partition=Record(*f.partition),
                               file_size_in_bytes=f.file_size_in_bytes, sort_order_id=f.sort_order_id,
                               spec_id=f.spec_id,
                               equality_ids=None, key_metadata=None, **f.stats)
            for f in files]


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` in ``schema`` (the file schema, with field ids): columns cast by name, missing ones null."""
    n = batch.num_rows
    names = batch.schema.names
    columns = []
    for f in schema:
        if f.name in names:
            column = batch.column(names.index(f.name))
            columns.append(column if column.type == f.type else column.cast(f.type))
        else:
            columns.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


@dataclass
class DataFileWriter:
    """Rolling Parquet writer for one partition value of one table (see the module docstring)."""

    target: TableTarget
    prefix: str                      # unique per task attempt: file names are ``{prefix}-{n:05d}.parquet``
    partition_value: Any             # the rows' kafka_partition (identity partition)
    files: list[WrittenFile] = field(default_factory=list)

    def __post_init__(self) -> None:
        from pyiceberg.io import load_file_io
        from pyiceberg.io.pyarrow import (
            _get_parquet_writer_kwargs,
            compute_statistics_plan,
            parquet_path_to_id_mapping,
        )
        from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
        from pyiceberg.table.locations import load_location_provider

        target = self.target
        self.schema = target.schema
        self.spec = target.spec
        self.arrow_schema = target.arrow_schema()
        self.io = load_file_io(target.io_properties, target.location)
        self.locations = load_location_provider(target.location, target.properties)
        properties = {k: v for k, v in target.properties.items() if k not in _OWN_PROPERTIES}
        self.parquet_kwargs = _get_parquet_writer_kwargs(properties)
        self.stats_plan = compute_statistics_plan(self.schema, target.properties)
        self.id_mapping = parquet_path_to_id_mapping(self.schema)
        values = [PartitionFieldValue(f, self.partition_value) for f in self.spec.fields]
        self.partition_key = PartitionKey(values, self.spec, self.schema) if values else None
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._writer: pq.ParquetWriter | None = None
        self._stream: Any = None
        self._path = ""
        self._output: Any = None

    def write(self, batch: pa.RecordBatch) -> None:
        """Add rows (already in :attr:`arrow_schema`, e.g. through :func:`conform`)."""
        if batch.num_rows == 0:
            return
        self._buffer.append(batch)
        self._buffered += batch.nbytes
        if self._buffered >= self.target.row_group_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        if self._writer is None:
            name = f"{self.prefix}-{len(self.files):05d}.parquet"
            self._path = self.locations.new_data_location(name, partition_key=self.partition_key)
            self._output = self.io.new_output(self._path)
            self._stream = self._output.create(overwrite=True)
            self._writer = pq.ParquetWriter(self._stream, schema=self.arrow_schema, store_decimal_as_integer=True,
                                            **self.parquet_kwargs)
        table = pa.Table.from_batches(self._buffer, schema=self.arrow_schema)
        self._writer.write_table(table, row_group_size=table.num_rows)  # one row group per flush
        self._buffer, self._buffered = [], 0
        if self._stream.tell() >= self.target.target_file_bytes:
            self._close_file()

    def _close_file(self) -> None:
        from pyiceberg.io.pyarrow import data_file_statistics_from_parquet_metadata

        assert self._writer is not None
        self._writer.close()
        self._stream.close()
        stats = data_file_statistics_from_parquet_metadata(self._writer.writer.metadata, self.stats_plan,
                                                           self.id_mapping)
        partition = stats.partition(self.spec, self.schema)
        self.files.append(WrittenFile(file_path=self._path, file_size_in_bytes=len(self._output),
                                      partition=tuple(partition[i] for i in range(len(partition))),
                                      spec_id=self.spec.spec_id, stats=stats.to_serialized_dict(),
                                      sort_order_id=self.target.sort_order_id))
        self._writer = self._stream = self._output = None

    def close(self) -> list[WrittenFile]:
        """Write what is buffered and close the current file; returns every file written."""
        self._flush()
        if self._writer is not None:
            self._close_file()
        return self.files

    def abort(self) -> None:
        """Close without describing the open file (it stays an orphan for ``ksi compact``)."""
        if self._writer is not None:
            try:
                self._writer.close()
                self._stream.close()
            except Exception:  # noqa: BLE001 - best effort on an already failing task
                pass
        self._writer = None


def new_prefix(run_id: str, partition: int, start: int) -> str:
    """File name prefix of one task attempt: the run, the range, and a random part for Spark's retries."""
    return f"{run_id[:12]}-p{partition}-o{start}-{uuid.uuid4().hex[:8]}"
