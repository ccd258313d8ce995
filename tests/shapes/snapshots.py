"""Many snapshots, one catalog commit.

A writer that commits every few files leaves hundreds of snapshots.  PyIceberg's transaction path
deep-copies the whole table metadata about fifteen times per commit, so 250 commits cost a minute;
here each snapshot's manifest and manifest list are written as the writer goes (exactly what a fast
append, or Redpanda's merge append, writes) and the snapshots are added to the table in one metadata
commit at the end (``AddSnapshot`` updates, then the ``main`` ref), the way a catalog would have seen
them one by one.  Readers see the same table: same snapshots, parents, sequence numbers, manifests
and summaries.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.manifest import (
    DataFile,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.table import Table
from pyiceberg.table.metadata import _generate_snapshot_id
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate

__all__ = ["StagedSnapshots"]

MIN_COUNT_TO_MERGE = 100  # Iceberg's and Redpanda's merge_append_action default


@dataclass
class StagedSnapshots:
    table: Table
    merge: bool = False                      # merge manifests as a merge append does
    snapshots: list[Snapshot] = field(default_factory=list)
    manifests: list[ManifestFile] = field(default_factory=list)

    def __post_init__(self) -> None:
        metadata = self.table.metadata
        current = self.table.current_snapshot()
        self.parent_id: int | None = current.snapshot_id if current else None
        self.base_id = self.parent_id
        self.previous_summary: Any = current.summary if current else None
        self.sequence = metadata.last_sequence_number
        self.manifests = list(current.manifests(self.table.io)) if current else []
        self.compression = metadata.properties.get("write.avro.compression-codec", "gzip")
        self.clock = max(int(time.time() * 1000), metadata.last_updated_ms + 1)

    def _path(self, name: str) -> str:
        return f"{self.table.location()}/metadata/{name}"

    def add(self, files: list[DataFile], properties: dict[str, str]) -> Snapshot:
        """One append snapshot of ``files`` with ``properties`` in its summary (manifests written now)."""
        metadata = self.table.metadata
        schema, spec = metadata.schema(), metadata.spec()
        snapshot_id = _generate_snapshot_id()
        self.sequence += 1
        commit = uuid.uuid4()
        new: list[ManifestEntry] = [ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id,
                                                            data_file=f) for f in files]
        previous = self.manifests
        if self.merge and len(previous) + 1 >= MIN_COUNT_TO_MERGE:
            # the merge append folds every manifest into one (they are small: far below 8 MiB)
            for manifest in previous:
                for entry in manifest.fetch_manifest_entry(self.table.io, discard_deleted=True):
                    new.append(ManifestEntry.from_args(
                        status=ManifestEntryStatus.EXISTING, snapshot_id=entry.snapshot_id,
                        sequence_number=entry.sequence_number, file_sequence_number=entry.file_sequence_number,
                        data_file=entry.data_file))
            previous = []
        with write_manifest(format_version=2, spec=spec, schema=schema,
                            output_file=self.table.io.new_output(self._path(f"{commit}-m0.avro")),
                            snapshot_id=snapshot_id, avro_compression=self.compression) as writer:
            for entry in new:
                writer.add_entry(entry)
        manifest = writer.to_manifest_file()
        # what the manifest list writer assigns to a manifest of this commit, kept for later lists
        manifest.sequence_number = self.sequence
        existing = [e.sequence_number for e in new if e.sequence_number is not None]
        manifest.min_sequence_number = min(existing + [self.sequence])
        self.manifests = [manifest] + previous
        list_path = self._path(f"snap-{snapshot_id}-0-{commit}.avro")
        with write_manifest_list(format_version=2, output_file=self.table.io.new_output(list_path),
                                 snapshot_id=snapshot_id, parent_snapshot_id=self.parent_id,
                                 sequence_number=self.sequence, avro_compression=self.compression) as lw:
            lw.add_manifests(self.manifests)
        collector = SnapshotSummaryCollector()
        for f in files:
            collector.add_file(f, partition_spec=spec, schema=schema)
        summary = update_snapshot_summaries(Summary(operation=Operation.APPEND, **collector.build(), **properties),
                                            previous_summary=self.previous_summary)
        self.clock += 1
        snapshot = Snapshot(snapshot_id=snapshot_id, parent_snapshot_id=self.parent_id, sequence_number=self.sequence,
                            timestamp_ms=self.clock, manifest_list=list_path, summary=summary,
                            schema_id=metadata.current_schema_id)
        self.snapshots.append(snapshot)
        self.parent_id, self.previous_summary = snapshot_id, summary
        return snapshot

    def commit(self) -> None:
        """Add the staged snapshots to the table in one catalog commit."""
        if not self.snapshots:
            return
        updates: list[Any] = [AddSnapshotUpdate(snapshot=s) for s in self.snapshots]
        updates.append(SetSnapshotRefUpdate(snapshot_id=self.snapshots[-1].snapshot_id,
                                            parent_snapshot_id=self.snapshots[-1].parent_snapshot_id,
                                            ref_name="main", type=SnapshotRefType.BRANCH))
        self.table._do_commit(updates=tuple(updates),
                              requirements=(AssertRefSnapshotId(snapshot_id=self.base_id, ref="main"),))
        self.base_id = self.snapshots[-1].snapshot_id
        self.snapshots = []
