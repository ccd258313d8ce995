"""What a table's writer says it has read: per Kafka partition, the next offset it would write.

Offsets a writer read and did not store (transaction markers, aborted records, tombstones it drops, keys
compaction removed) leave holes in its table.  At the seam, where the lake ends below the broker's log
start, only the writer's own bookkeeping can tell such holes from records retention deleted before they
were archived (lost data).  Each layout keeps it somewhere else, or nowhere:

* ``ksi``: every ``ksi archive`` commit records ``ksi.archived-offsets`` (``{"0": next_offset, ...}``) in
  the summary of the snapshot that adds the data; compactions carry none, so the newest ancestor that does
  is the answer.
* ``redpanda``: Redpanda holds a partition's retention back until its records are translated
  (docs/writers.md), so every offset below the broker's log start was read by the writer: a hole at the
  seam is always explained (unless Iceberg was turned off for the topic and on again, which Redpanda
  documents as losing the offsets in between).
* ``kafka-connect``: Iceberg's sink commits the offsets it read to its consumer group in Kafka, not to the
  table; the Kafka side asks the broker for them (the topic's ``writer_group``).
* ``automq``, ``streambased``: nothing ksi can read; the topic's ``seam_holes`` setting decides.

Records retention deleted before ``ksi archive`` read them are lost, and the archive goes on from the log
start: the commit that goes past them records them in the same snapshot's summary, every lost range so far
(``ksi.lost-offsets``: ``{"0": [[first, last], ...], ...}``, inclusive), so the proxy answers them as a gap
wherever they fall, also inside the lake, where they would look like a hole the writer read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.table import Table

__all__ = [
    "ARCHIVED_OFFSETS",
    "LOST_OFFSETS",
    "READS_TO_LOG_START",
    "decode_offsets",
    "encode_lost",
    "encode_offsets",
    "lost_offsets",
    "writer_next_offsets",
]

READS_TO_LOG_START = frozenset({"redpanda"})  # writers that hold retention back until they have read

ARCHIVED_OFFSETS = "ksi.archived-offsets"
LOST_OFFSETS = "ksi.lost-offsets"
MAX_ANCESTORS = 10_000  # a table's history is walked at most this far back


def decode_offsets(text: str) -> dict[int, int]:
    return {int(p): int(o) for p, o in json.loads(text).items()}


def encode_offsets(next_offsets: dict[int, int]) -> str:
    return json.dumps({str(p): o for p, o in sorted(next_offsets.items())}, separators=(",", ":"))


def encode_lost(lost: dict[int, list[tuple[int, int]]]) -> str:
    return json.dumps({str(p): [list(r) for r in sorted(set(ranges))] for p, ranges in sorted(lost.items()) if ranges},
                      separators=(",", ":"))


def lost_offsets(table: Table, snapshot_id: int | None) -> dict[int, list[tuple[int, int]]]:
    """Per partition, the ranges of offsets ``ksi archive`` recorded as lost (first, last inclusive), as of
    ``snapshot_id``: none when no commit recorded any (or the record is unreadable)."""
    text = _summary_property(table, snapshot_id, LOST_OFFSETS) if snapshot_id is not None else None
    if text is None:
        return {}
    try:
        return {int(p): sorted((int(a), int(b)) for a, b in ranges) for p, ranges in json.loads(text).items()}
    except (ValueError, AttributeError, TypeError):
        return {}


def _summary_property(table: Table, snapshot_id: int, name: str) -> str | None:
    """The property on the newest ancestor of ``snapshot_id`` (itself included) that carries it."""
    snapshot = table.snapshot_by_id(snapshot_id)
    for _ in range(MAX_ANCESTORS):
        if snapshot is None:
            return None
        summary = snapshot.summary
        value = summary.get(name) if summary is not None else None
        if value is not None:
            return str(value)
        if snapshot.parent_snapshot_id is None:
            return None
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)
    return None


def _ksi(table: Table, snapshot_id: int) -> dict[int, int] | None:
    text = _summary_property(table, snapshot_id, ARCHIVED_OFFSETS)
    if text is None:
        return None
    try:
        return decode_offsets(text)
    except (ValueError, AttributeError, TypeError):
        return None  # not ksi's: unreadable bookkeeping is no bookkeeping


WRITER_STATE: dict[str, Callable[[Table, int], dict[int, int] | None]] = {
    "ksi": _ksi,
}


def writer_next_offsets(layout: str, table: Table, snapshot_id: int | None) -> dict[int, int] | None:
    """Per partition, the next offset the table's writer would write, as of ``snapshot_id``; None when the
    layout's writer keeps no such record (or this table has none)."""
    reader = WRITER_STATE.get(layout)
    if reader is None or snapshot_id is None:
        return None
    return reader(table, snapshot_id)
