"""Exactly-once bookkeeping: which offsets of each partition a ksi table already holds.

Every archive commit records, in the summary of the very snapshot that adds the data, the next offset
to archive for every partition of the topic::

    ksi.archived-offsets = {"0": 1200, "1": 1187, ...}

Data and offsets therefore become visible in one atomic catalog commit: a job killed before the commit
leaves nothing behind but unreferenced files (``ksi compact`` removes orphans), and a job killed after it
finds the offsets on the next run.

Racing jobs are stopped by the same commit (:mod:`ksi.pipeline.commit`): the offsets are read again
on the table the commit is made against, and the catalog swaps the table's metadata only if nothing
committed since that read; a job whose offsets moved under it re-plans instead of committing the same
range twice.  A compaction in between leaves the offsets as they were, so it never makes an archive
fail, nor the reverse.

Reading the offsets walks from the current snapshot through its ancestors to the newest one that carries
the property (compactions in between carry none).  If expiry removed it, the offsets are derived from
the data files' column statistics instead (``max(kafka_offset) + 1`` per partition, metadata only):
offsets between that and the lost bookkeeping value were gaps (aborted transactions, compacted keys), so
reading them again adds nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot
    from pyiceberg.types import PrimitiveType

__all__ = ["OFFSETS_PROPERTY", "TOPIC_PROPERTY", "ArchivedOffsets", "encode_offsets", "read_archived_offsets"]

OFFSETS_PROPERTY = "ksi.archived-offsets"
TOPIC_PROPERTY = "ksi.topic"


@dataclass(frozen=True, slots=True)
class ArchivedOffsets:
    """The table's state as a job plans from it."""

    snapshot_id: int | None          # the snapshot read; the commit validates from here
    next_offsets: dict[int, int]     # partition -> next offset to archive (absent: never archived)
    source: str                      # "summary" (snapshot S), "data" (column statistics) or "empty"

    def next_offset(self, partition: int, default: int) -> int:
        return self.next_offsets.get(partition, default)


def encode_offsets(next_offsets: dict[int, int]) -> str:
    return json.dumps({str(p): o for p, o in sorted(next_offsets.items())}, separators=(",", ":"))


def decode_offsets(text: str) -> dict[int, int]:
    raw = json.loads(text)
    return {int(p): int(o) for p, o in raw.items()}


def read_archived_offsets(table: Table) -> ArchivedOffsets:
    """The next offset per partition of a PyIceberg ``table`` (freshly loaded), and the snapshot it came from."""
    current = table.current_snapshot()
    if current is None:
        return ArchivedOffsets(snapshot_id=None, next_offsets={}, source="empty")
    snapshot: Snapshot | None = current
    while snapshot is not None:
        summary = snapshot.summary
        text = summary.get(OFFSETS_PROPERTY) if summary is not None else None
        if text is not None:
            return ArchivedOffsets(snapshot_id=current.snapshot_id, next_offsets=decode_offsets(text),
                                   source=f"summary of snapshot {snapshot.snapshot_id}")
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return ArchivedOffsets(snapshot_id=current.snapshot_id, next_offsets=_offsets_from_data(table),
                           source="data file statistics")


def _offsets_from_data(table: Table) -> dict[int, int]:
    """``max(kafka_offset) + 1`` per ``kafka_partition`` from the data files' metadata (no data read)."""
    from pyiceberg.conversions import from_bytes

    schema = table.schema()
    part_field = schema.find_field("kafka_partition")
    offset_field = schema.find_field("kafka_offset")
    # the ksi layout's int and long columns (anything else fails in from_bytes, as before)
    part_type = cast("PrimitiveType", part_field.field_type)
    offset_type = cast("PrimitiveType", offset_field.field_type)
    spec = table.spec()
    part_pos = next((i for i, f in enumerate(spec.fields) if f.source_id == part_field.field_id), None)
    result: dict[int, int] = {}
    for task in table.scan(selected_fields=("kafka_partition", "kafka_offset")).plan_files():
        data_file = task.file
        upper = data_file.upper_bounds.get(offset_field.field_id) if data_file.upper_bounds else None
        if upper is None:
            continue
        high = int(from_bytes(offset_type, upper))
        if part_pos is not None:
            partition = int(data_file.partition[part_pos])
        else:  # not partitioned by kafka_partition: only usable when the file holds a single partition
            low_p = data_file.lower_bounds.get(part_field.field_id)
            high_p = data_file.upper_bounds.get(part_field.field_id)
            if low_p is None or low_p != high_p:
                raise ValueError(f"table {table.name()}: cannot derive archived offsets from data files spanning "
                                 "several partitions")
            partition = int(from_bytes(part_type, low_p))
        result[partition] = max(result.get(partition, 0), high + 1)
    return result
