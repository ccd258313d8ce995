"""The driver's commit: the tasks' data files and the new archived offsets in one Iceberg snapshot.

The commit is a PyIceberg fast append on a freshly loaded table, with ``ksi.archived-offsets`` (and the
topic and run id) in the snapshot summary.  Exactly once rests on two checks:

1. Before committing, the table's archived offsets are read again; if they differ from the ones the run
   planned from, another job archived in between: the commit is abandoned (:class:`OffsetsMoved`) and
   the run re-plans from the new offsets (its files stay unreferenced; ``ksi compact`` removes orphans).
2. The commit itself (with PyIceberg's automatic retries off) carries Iceberg's requirement that the
   table's ``main`` branch still points at the snapshot just loaded (``AssertRefSnapshotId``), checked
   by the catalog atomically with the swap of the metadata pointer (a compare-and-swap on the JDBC/SQL
   catalog's row).  If anything committed in
   between (a compaction, another archive), the catalog refuses (``CommitFailedException``), and the
   commit goes back to step 1 on the reloaded table: a compaction in between leaves the offsets as
   they were and the same files are committed on top of it; another archive moves them and (1) stops.

So two racing runs can never both commit the same range, whichever engine wrote their files.

Dead letters go to ``<table>_dead_letters`` first, in one transaction that deletes that table's rows of
the run's ranges and appends the new ones, so a rerun after a crash between the two commits replaces
them instead of duplicating them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..lake.commits import LOST_OFFSETS, encode_lost, lost_offsets
from .files import WrittenFile, data_files
from .offsets import OFFSETS_PROPERTY, TOPIC_PROPERTY, encode_offsets, read_archived_offsets

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

__all__ = ["RUN_PROPERTY", "OffsetsMoved", "commit_archive", "commit_dead_letters"]

RUN_PROPERTY = "ksi.archive-run"


class OffsetsMoved(RuntimeError):
    """Another job committed offsets since this run planned: re-plan."""


def _no_retries(table: Table) -> Table:
    """``table`` with PyIceberg's own commit retries off (for this object only; nothing is written).

    PyIceberg retries a refused commit by re-applying the append on the refreshed table, which would
    commit the same offsets on top of another job's commit: the offsets check in :func:`commit_archive`
    must run before every attempt instead."""
    properties = {**table.metadata.properties, "commit.retry.num-retries": "0"}
    table.metadata = table.metadata.model_copy(update={"properties": properties})
    return table


def commit_archive(catalog: Catalog, table_name: str, planned: dict[int, int], next_offsets: dict[int, int],
                   files: list[WrittenFile], topic: str, run_id: str, attempts: int = 20,
                   say: Callable[[str], None] | None = None,
                   lost: dict[int, list[tuple[int, int]]] | None = None) -> Snapshot | None:
    """Commit ``files`` and ``next_offsets`` if the table still holds ``planned``; returns the new snapshot.
    ``lost``: offsets retention deleted before this run could read them, recorded with the ones recorded
    before (``ksi.lost-offsets``, see :mod:`ksi.lake.commits`)."""
    from pyiceberg.exceptions import CommitFailedException

    properties = {OFFSETS_PROPERTY: encode_offsets(next_offsets), TOPIC_PROPERTY: topic, RUN_PROPERTY: run_id}
    for attempt in range(1, attempts + 1):
        table = _no_retries(catalog.load_table(table_name))
        current = read_archived_offsets(table).next_offsets
        if current != planned:
            raise OffsetsMoved(f"{table_name}: archived offsets moved from {encode_offsets(planned)} to "
                               f"{encode_offsets(current)} while this run read")
        if lost:
            snapshot = table.current_snapshot()
            known = lost_offsets(table, snapshot.snapshot_id if snapshot is not None else None)
            properties[LOST_OFFSETS] = encode_lost({p: known.get(p, []) + lost.get(p, [])
                                                    for p in set(known) | set(lost)})
        try:
            with (table.transaction() as transaction,
                  transaction.update_snapshot(snapshot_properties=properties).fast_append() as append):
                for data_file in data_files(files, table.metadata.format_version):
                    append.append_data_file(data_file)
        except CommitFailedException as exc:
            if say is not None:
                say(f"{topic}: the table changed during the commit ({str(exc).splitlines()[0][:120]}); "
                    f"checking the offsets again (attempt {attempt})")
            continue
        return catalog.load_table(table_name).current_snapshot()
    raise OffsetsMoved(f"{table_name}: {attempts} commits in a row lost a race; re-planning")


def commit_dead_letters(catalog: Catalog, table_name: str, ranges: list[tuple[int, int, int]],
                        files: list[WrittenFile], attempts: int = 20) -> None:
    """Replace the dead-letter rows of ``ranges`` ((partition, start, stop)) by ``files``."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan, Or

    # PyIceberg's annotations want bound terms and Literal objects; a column name and an int are what its
    # docs use and what it binds at run time.
    terms = [And(EqualTo("kafka_partition", p), GreaterThanOrEqual("kafka_offset", start),  # type: ignore[call-arg, arg-type]
                 LessThan("kafka_offset", stop)) for p, start, stop in ranges if stop > start]  # type: ignore[call-arg, arg-type]
    if not terms:
        return
    condition = terms[0] if len(terms) == 1 else Or(*terms)
    for _ in range(attempts):
        table = catalog.load_table(table_name)
        try:
            with table.transaction() as transaction, warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Delete operation did not match any records")
                transaction.delete(condition)
                with transaction.update_snapshot().fast_append() as append:
                    for data_file in data_files(files, table.metadata.format_version):
                        append.append_data_file(data_file)
        except CommitFailedException:
            continue
        return
    raise OffsetsMoved(f"{table_name}: {attempts} dead-letter commits in a row lost a race")
