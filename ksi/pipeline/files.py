"""Arrow batches into Iceberg data files: Parquet written by Arrow in the tasks, described by PyIceberg on the driver.

An archive task (on an executor or in a local worker process) streams one Kafka partition's offset range
into :class:`DataFileWriter`, which buffers about ``row_group_bytes`` of Arrow data, writes it as one
Parquet row group, and rolls to a new file past ``target_file_bytes``.  Memory is bounded by the row
group size, not by the range.  Each closed file becomes a :class:`NewFile`: its path, size, partition value
and Parquet footer.  The driver describes them for a commit (:func:`describe_files`): Iceberg's per-file
statistics (record count, column sizes, value, null and NaN counts, lower and upper bounds by field id,
split offsets), computed by PyIceberg from the footer exactly as PyIceberg's own writer does.  The Parquet
schema carries the table's field ids.

A task imports pyarrow, not PyIceberg: the :class:`TableTarget` it is given holds plain values (the Arrow
schema with field ids, the Parquet writer's options, each partition's data directory), and files on a local
warehouse are written with pyarrow's own files.  PyIceberg's FileIO and location provider are imported in a
task only when the warehouse is not a local path (object stores and their credentials) or the table has a
location provider other than PyIceberg's default.  (Measured: a Spark worker's imports went from 0.55 s to
about 0.1 s, and each Python process holds about 80 MiB less: docs/pipeline.md.)

Nothing is committed here: files become part of the table only when the driver commits them
(:mod:`ksi.pipeline.commit`), so a killed or retried task leaves at most unreferenced files behind.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile as IcebergDataFile
    from pyiceberg.table import Table
    from pyiceberg.typedef import TableVersion

__all__ = ["DataFileWriter", "NewFile", "TableTarget", "WrittenFile", "conform", "data_files", "describe_files",
           "leaf_paths", "new_prefix"]

# PyIceberg's writer warns about table properties it does not implement; these two this writer implements
# itself (row group size in bytes) or that do not apply.
_OWN_PROPERTIES = ("write.parquet.row-group-size-bytes", "write.parquet.bloom-filter-max-bytes")
# Parquet columns whose values are (nearly) all distinct in Kafka data: a dictionary is built for them only
# to be thrown away when it outgrows its page limit (measured: 0.23 s -> 0.16 s to write 500k records, and
# smaller files).  Every other column (partition, timestamp type, schema id, header keys, typed values) keeps
# Parquet's dictionary encoding.
_PLAIN_COLUMNS = frozenset({"kafka_offset", "kafka_timestamp", "kafka_key", "kafka_value",
                            "kafka_headers.list.element.value"})


@dataclass(frozen=True)
class TableTarget:
    """Everything a task needs to write data files for one table; pickled to the executors/workers.

    Plain values only (see the module docstring), and only the parts of the table's metadata a writer uses
    (not its snapshot history, which grows with every commit of a long-running ``--follow``)."""

    name: str
    arrow_schema: pa.Schema             # the table's current schema, with its field ids
    parquet_options: dict[str, Any]     # pyarrow.parquet.ParquetWriter's keyword arguments
    location: str
    properties: dict[str, str]
    io_properties: dict[str, str]       # the catalog's FileIO properties (S3 credentials, ...)
    row_group_bytes: int
    target_file_bytes: int
    data_dirs: dict[Any, str] = field(default_factory=dict)  # partition value -> directory (default locations)
    partition_keys: dict[Any, Any] = field(default_factory=dict)  # partition value -> PartitionKey (other ones)

    @classmethod
    def of(cls, table: Table, partitions: Iterable[Any], row_group_bytes: int | None = None,
           target_file_bytes: int | None = None) -> TableTarget:
        """The target for writing ``partitions`` (values of the ksi layout's ``kafka_partition``, the table's
        identity partition) of a PyIceberg ``table``."""
        from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs, schema_to_pyarrow
        from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
        from pyiceberg.table.locations import SimpleLocationProvider, load_location_provider

        metadata = table.metadata
        props = dict(metadata.properties)
        name = table.name()
        schema, spec = metadata.schema(), metadata.spec()
        arrow_schema = schema_to_pyarrow(schema, include_field_ids=True)
        options = _get_parquet_writer_kwargs({k: v for k, v in props.items() if k not in _OWN_PROPERTIES})
        options["use_dictionary"] = [c for c in leaf_paths(arrow_schema) if c not in _PLAIN_COLUMNS]
        provider = load_location_provider(metadata.location, props)
        keys = {p: PartitionKey([PartitionFieldValue(f, p) for f in spec.fields], spec, schema) if spec.fields
                else None for p in set(partitions)}
        simple = type(provider) is SimpleLocationProvider
        return cls(name=".".join(name) if isinstance(name, tuple) else str(name), arrow_schema=arrow_schema,
                   parquet_options=options, location=metadata.location, properties=props,
                   io_properties=dict(table.io.properties),
                   row_group_bytes=row_group_bytes or int(props.get("write.parquet.row-group-size-bytes", 8 << 20)),
                   target_file_bytes=target_file_bytes or int(props.get("write.target-file-size-bytes", 128 << 20)),
                   data_dirs={p: provider.new_data_location("x", key).rsplit("/", 1)[0] for p, key in keys.items()}
                   if simple else {},
                   partition_keys={} if simple else keys)

    def data_location(self, name: str, partition: Any) -> str:
        """Where a new data file named ``name`` of ``partition`` goes (as PyIceberg's location provider says)."""
        directory = self.data_dirs.get(partition)
        if directory is not None:
            return f"{directory}/{name}"
        from pyiceberg.table.locations import load_location_provider

        provider = load_location_provider(self.location, self.properties)
        return provider.new_data_location(name, self.partition_keys.get(partition))


@dataclass
class NewFile:
    """A data file a task wrote: what the driver needs to describe it for a commit (:func:`describe_files`)."""

    file_path: str
    file_size_in_bytes: int
    partition: Any                   # the rows' kafka_partition
    footer: pq.FileMetaData          # the Parquet footer (pickled as its Thrift bytes)


@dataclass
class WrittenFile:
    """A data file written but not yet committed, described: what the driver needs to add it to the table."""

    file_path: str
    file_size_in_bytes: int
    partition: tuple[Any, ...]
    spec_id: int
    stats: dict[str, Any]            # DataFileStatistics.to_serialized_dict()
    sort_order_id: int | None = None

    @property
    def record_count(self) -> int:
        return int(self.stats["record_count"])


def describe_files(table: Table, files: list[NewFile]) -> list[WrittenFile]:
    """Iceberg's description of ``files`` written for the PyIceberg ``table`` (as loaded when their target was
    made: the schema they were written with), on the driver."""
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )

    if not files:
        return []
    metadata = table.metadata
    schema, spec = metadata.schema(), metadata.spec()
    plan = compute_statistics_plan(schema, metadata.properties)
    mapping = parquet_path_to_id_mapping(schema)
    described = []
    for f in files:
        stats = data_file_statistics_from_parquet_metadata(f.footer, plan, mapping)
        partition = stats.partition(spec, schema)
        described.append(WrittenFile(file_path=f.file_path, file_size_in_bytes=f.file_size_in_bytes,
                                     partition=tuple(partition[i] for i in range(len(partition))),
                                     spec_id=spec.spec_id, stats=stats.to_serialized_dict(),
                                     sort_order_id=metadata.default_sort_order_id or None))
    return described


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
    files: list[NewFile] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.arrow_schema = self.target.arrow_schema
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._writer: pq.ParquetWriter | None = None
        self._stream: Any = None
        self._path = ""

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
            self._path = self.target.data_location(name, self.partition_value)
            self._stream = _create(self._path, self.target.io_properties)
            self._writer = pq.ParquetWriter(self._stream, schema=self.arrow_schema, store_decimal_as_integer=True,
                                            **self.target.parquet_options)
        table = pa.Table.from_batches(self._buffer, schema=self.arrow_schema)
        self._writer.write_table(table, row_group_size=table.num_rows)  # one row group per flush
        self._buffer, self._buffered = [], 0
        if self._stream.tell() >= self.target.target_file_bytes:
            self._close_file()

    def _close_file(self) -> None:
        assert self._writer is not None
        self._writer.close()
        size = self._stream.tell()
        self._stream.close()
        self.files.append(NewFile(file_path=self._path, file_size_in_bytes=size, partition=self.partition_value,
                                  footer=self._writer.writer.metadata))
        self._writer = self._stream = None

    def close(self) -> list[NewFile]:
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


def _create(path: str, io_properties: dict[str, str]) -> Any:
    """A new file at ``path`` to stream into: pyarrow's own local file for a local path (``file://`` or none),
    else PyIceberg's FileIO with the catalog's properties."""
    parts = urlsplit(path)
    if parts.scheme in ("", "file"):
        local = parts.path if parts.scheme else path
        os.makedirs(os.path.dirname(local), exist_ok=True)
        return pa.OSFile(local, "wb")
    from pyiceberg.io import load_file_io

    return load_file_io(io_properties, path).new_output(path).create(overwrite=True)


def leaf_paths(schema: pa.Schema) -> list[str]:
    """The Parquet column paths of ``schema``'s leaves (``a.b``, ``list.element``, ``key_value.key``)."""
    def walk(prefix: str, kind: pa.DataType) -> list[str]:
        if pa.types.is_struct(kind):
            children = [kind.field(i) for i in range(kind.num_fields)]
            return [p for child in children for p in walk(f"{prefix}.{child.name}", child.type)]
        if pa.types.is_map(kind):
            return walk(f"{prefix}.key_value.key", kind.key_type) + walk(f"{prefix}.key_value.value", kind.item_type)
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return walk(f"{prefix}.list.element", kind.value_type)
        return [prefix]

    return [p for f in schema for p in walk(f.name, f.type)]


def new_prefix(run_id: str, partition: int, start: int) -> str:
    """File name prefix of one task attempt: the run, the range, and a random part for Spark's retries."""
    return f"{run_id[:12]}-p{partition}-o{start}-{uuid.uuid4().hex[:8]}"
