"""``ksi compact``'s rewrite of small files: Python tasks on the archive's engine, one REPLACE commit.

A partition's small files, as ``ksi archive`` writes them, are sorted by offset inside and do not overlap
each other (each task writes one partition's range in offset order).  Read one after another in the order
of their ``kafka_offset`` lower bounds, their rows come out sorted: a rewrite is a concatenation, no sort and
no shuffle.  One task per partition streams its small files' row groups into new files of
``compact.target_file_size_bytes`` with the archive's writer (:class:`ksi.pipeline.files.DataFileWriter`);
the driver describes them and commits one ``replace`` snapshot that deletes the inputs and adds the outputs
(:func:`commit_replace`), checked against concurrent commits like the archive's own.

Why not Iceberg's ``rewrite_data_files`` for this: its fixed cost.  On this project's 2-core VM, rewriting 40
small files (1 MB) took 21-24 s with it, nearly all of it Spark SQL's and Iceberg's start and the first
procedure call (JIT, class loading, a sort's sampling and shuffle stages), about 11 CPU-seconds even with a
fast-starting JVM; on the archive's engine the same rewrite costs the bare SparkContext's start and a
task per partition (docs/pipeline.md has the figures).

:func:`plan_rewrite` says from metadata alone whether a table's small files qualify: the table's default
spec is the ksi layout's identity partition on ``kafka_partition``; each file is a Parquet data file of that
spec with ``kafka_offset`` bounds and no delete file applies to it; a partition's files do not overlap.
Otherwise ``ksi compact`` uses Iceberg's procedure (:mod:`ksi.pipeline.compact`), which sorts.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from .files import DataFileWriter, NewFile, TableTarget, WrittenFile, data_files

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

__all__ = ["CompactionConflict", "RewriteGroup", "RewriteJob", "commit_replace", "plan_rewrite", "rewrite_group"]

FIELD_ID = b"PARQUET:field_id"


@dataclass(frozen=True)
class RewriteGroup:
    """One partition's small files, in offset order."""

    partition: int
    paths: tuple[str, ...]
    bytes: int
    records: int


@dataclass(frozen=True)
class RewriteJob:
    """What every rewrite task of one ``ksi compact`` shares; pickled to the workers."""

    run_id: str
    target: TableTarget


def plan_rewrite(table: Table, small_below: float, partitions: set[Any]
                 ) -> tuple[list[RewriteGroup], list[DataFile]] | None:
    """The rewrite of ``partitions``' files under ``small_below`` bytes in ``table``'s current snapshot, and the
    data files it replaces; None when they do not qualify (see the module docstring)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.manifest import FileFormat
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import LongType

    schema, spec = table.schema(), table.spec()
    try:
        part_field = schema.find_field("kafka_partition")
        offset_field = schema.find_field("kafka_offset")
    except ValueError:
        return None
    if len(spec.fields) != 1 or spec.fields[0].source_id != part_field.field_id \
            or not isinstance(spec.fields[0].transform, IdentityTransform):
        return None
    chosen: dict[int, list[tuple[int, int, DataFile]]] = {}
    for task in table.scan().plan_files():
        f = task.file
        if f.file_size_in_bytes >= small_below or f.partition[0] not in partitions:
            continue
        lower = (f.lower_bounds or {}).get(offset_field.field_id)
        upper = (f.upper_bounds or {}).get(offset_field.field_id)
        if task.delete_files or f.spec_id != spec.spec_id or f.file_format != FileFormat.PARQUET \
                or lower is None or upper is None:
            return None
        chosen.setdefault(int(f.partition[0]), []).append(
            (int(from_bytes(LongType(), lower)), int(from_bytes(LongType(), upper)), f))
    groups, replaced = [], []
    for partition, files in sorted(chosen.items()):
        files.sort(key=lambda item: item[0])
        if any(files[i][0] <= files[i - 1][1] for i in range(1, len(files))):
            return None  # offset ranges overlap: only a sort gives sorted files
        groups.append(RewriteGroup(partition, tuple(f.file_path for _, _, f in files),
                                   sum(f.file_size_in_bytes for _, _, f in files),
                                   sum(f.record_count for _, _, f in files)))
        replaced += [f for _, _, f in files]
    return groups, replaced


def rewrite_group(job: RewriteJob, group: RewriteGroup) -> list[NewFile]:
    """The task: ``group``'s files, row group by row group, into files of the target size (uncommitted)."""
    writer = DataFileWriter(job.target, f"{job.run_id[:12]}-c-p{group.partition}-{uuid.uuid4().hex[:8]}",
                            group.partition)
    try:
        for path in group.paths:
            for batch in _row_groups(path, job.target):
                writer.write(batch)
        return writer.close()
    except BaseException:
        writer.abort()
        raise


def _row_groups(path: str, target: TableTarget) -> Iterator[pa.RecordBatch]:
    """``path``'s rows, a row group at a time, in the target's schema: columns matched by Iceberg field id
    (a column renamed since the file was written keeps its values; one added since reads as nulls)."""
    with _open(path, target.io_properties) as stream:
        reader = pq.ParquetFile(stream)
        by_id = {f.metadata.get(FIELD_ID): i for i, f in enumerate(reader.schema_arrow)
                 if f.metadata and FIELD_ID in f.metadata}
        for index in range(reader.num_row_groups):
            table = reader.read_row_group(index)
            columns = []
            for f in target.arrow_schema:
                position = by_id.get((f.metadata or {}).get(FIELD_ID))
                if position is None and f.name in table.column_names:
                    position = table.column_names.index(f.name)
                column = table.column(position) if position is not None else pa.nulls(table.num_rows, f.type)
                columns.append(column if column.type == f.type else column.cast(f.type))
            yield from pa.Table.from_arrays(columns, schema=target.arrow_schema).to_batches()


def _open(path: str, io_properties: dict[str, str]) -> Any:
    parts = urlsplit(path)
    if parts.scheme in ("", "file"):
        return pa.OSFile(parts.path if parts.scheme else path, "rb")
    from pyiceberg.io import load_file_io

    return load_file_io(io_properties, path).new_input(path).open()


class CompactionConflict(RuntimeError):
    """Files this rewrite replaces are gone from the table (another compaction, an expiry): nothing committed."""


def commit_replace(catalog: Catalog, table_name: str, replaced: list[DataFile], added: list[WrittenFile],
                   attempts: int = 20, say: Callable[[str], None] | None = None) -> Snapshot | None:
    """Commit one ``replace`` snapshot: ``replaced`` out, ``added`` in.  A concurrent commit (an archive's
    append) makes the catalog refuse it; it is then made again on the new head as long as every replaced file
    is still in the table (appends never remove one), else :class:`CompactionConflict`."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.snapshots import Operation, Summary
    from pyiceberg.table.update.snapshot import _OverwriteFiles
    from pyiceberg.typedef import EMPTY_DICT

    class _ReplaceFiles(_OverwriteFiles):
        """PyIceberg's overwrite producer, labelled ``replace``: the rows are the same, only the files change
        (PyIceberg 0.12 computes no summary for a replace; an overwrite's totals are the same)."""

        def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
            summary = super()._summary(snapshot_properties)
            return Summary(operation=Operation.REPLACE, **summary.additional_properties)

    from .commit import _no_retries

    wanted = {f.file_path for f in replaced}
    for attempt in range(1, attempts + 1):
        table = _no_retries(catalog.load_table(table_name))
        live = {task.file.file_path: task.file for task in table.scan().plan_files() if task.file.file_path in wanted}
        if set(live) != wanted:
            raise CompactionConflict(f"{table_name}: {len(wanted - set(live))} of the files to rewrite left the "
                                     "table during the rewrite (another compaction or an expiry); nothing committed")
        snapshot = table.current_snapshot()
        try:
            with table.transaction() as transaction:
                producer = _ReplaceFiles(operation=Operation.OVERWRITE, transaction=transaction, io=table.io)
                for data_file in live.values():
                    producer.delete_data_file(data_file)
                for data_file in data_files(added, table.metadata.format_version):
                    producer.append_data_file(data_file)
                producer.commit()
        except CommitFailedException as exc:
            if say is not None:
                say(f"  the table changed during the commit ({str(exc).splitlines()[0][:120]}); committing again on "
                    f"top of snapshot {snapshot.snapshot_id if snapshot else None} (attempt {attempt})")
            time.sleep(min(1.0, 0.05 * attempt))
            continue
        with contextlib.suppress(Exception):
            return catalog.load_table(table_name).current_snapshot()
        return None
    raise CompactionConflict(f"{table_name}: {attempts} commits of the rewrite in a row lost a race")
