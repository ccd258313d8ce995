"""``ksi status`` counts the lake's lag as ``ksi archive --follow`` does: from where the writer stopped reading
(its commit state), so holes it read past (a transaction's trailing commit marker) are no lag."""

from __future__ import annotations

from ksi.status import PartitionStatus


def _row(**fields: int | None) -> PartitionStatus:
    base: dict[str, int | None] = {"lake_first": 0, "lake_last": 98, "snapshot_id": 1, "log_start_offset": 100,
                                   "high_watermark": 100}
    base.update(fields)
    return PartitionStatus(topic="t", table="h.t", partition=0, **base)  # type: ignore[arg-type]


def test_a_hole_the_writer_read_past_is_no_lag() -> None:
    row = _row(writer_next=100)          # offset 99 is a commit marker: the archive read it, the table has no row
    assert row.lake_next == 100
    assert row.lag_records == 0
    assert row.lag_seconds(now=0.0) == 0.0
    assert row.gap is None


def test_without_commit_state_the_last_row_decides() -> None:
    row = _row(writer_next=None, high_watermark=110)
    assert row.lake_next == 99
    assert row.lag_records == 11
    assert row.lag_seconds(now=0.0) is None   # the first record behind was not read: unknown, not 0


def test_records_beyond_what_the_writer_read_are_lag() -> None:
    row = _row(writer_next=100, high_watermark=130, log_start_offset=90)
    assert row.lag_records == 30
