"""The seam as a pure function: every route a fetch offset can take (ksi/history/seam.py's table)."""

from __future__ import annotations

import sys

import pytest

from ksi.history.seam import Route, decide
from ksi.history.watermarks import Refused, Watermarks
from ksi.lake.table import OffsetRange

LAKE = OffsetRange(0, 88)       # the lake holds 0..88
MARKS = Watermarks(100, 150, 150, 0.0)  # the log holds 100..149


@pytest.mark.parametrize(("offset", "route", "cap"), [
    (0, Route.COLD, 100), (50, Route.COLD, 100), (88, Route.COLD, 100),   # in the lake, below the log start
    (100, Route.HOT, None), (149, Route.HOT, None), (150, Route.HOT, None),  # the log's
])
def test_lake_and_log(offset: int, route: Route, cap: int | None) -> None:
    d = decide(offset, LAKE, MARKS)
    assert d.route is route and d.cap == cap


def test_prefer_lake_serves_what_the_lake_holds_uncapped() -> None:
    lake = OffsetRange(0, 120)
    assert decide(110, lake, MARKS, prefer_lake=True).route is Route.COLD
    assert decide(110, lake, MARKS, prefer_lake=True).cap is None
    assert decide(110, lake, MARKS).route is Route.HOT  # the broker holds it: by default, the broker's


def test_below_the_lake_is_the_brokers_out_of_range() -> None:
    assert decide(-5, OffsetRange(10, 88), MARKS).route is Route.HOT  # the client resets to EARLIEST


@pytest.mark.parametrize(("writer_next", "offset", "route", "to", "lost_from"), [
    (100, 89, Route.STEP, 100, None),      # the writer read to the log start: 89..99 are explained holes
    (sys.maxsize, 95, Route.STEP, 100, None),  # a writer that reads before retention may delete (Redpanda)
    (92, 89, Route.STEP, 92, None),        # explained up to 92 ...
    (92, 92, Route.GAP, None, 92),         # ... then never read: lost
    (89, 89, Route.GAP, None, 89),         # the writer stopped where the lake ends: 89..99 lost
])
def test_holes_at_the_seam_follow_the_writers_commit_state(writer_next: int, offset: int, route: Route,
                                                           to: int | None, lost_from: int | None) -> None:
    d = decide(offset, LAKE, MARKS, writer_next=writer_next)
    assert (d.route, d.to, d.lost_from) == (route, to, lost_from)
    assert d.certain


def test_a_writer_without_commit_state_follows_seam_holes() -> None:
    d = decide(95, LAKE, MARKS)
    assert d.route is Route.GAP and not d.certain and d.lost_from == 89
    assert decide(95, LAKE, MARKS, seam_holes="skip").route is Route.STEP
    assert decide(95, LAKE, MARKS, seam_holes="skip").to == 100


def test_refusals_and_an_unreadable_lake() -> None:
    assert decide(10, LAKE, Refused(29, 0.0)).route is Route.REFUSED
    assert decide(10, LAKE, Refused(29, 0.0)).error == 29
    assert decide(10, None, MARKS, lake_unknown=True).route is Route.UNAVAILABLE
    assert decide(120, None, MARKS, lake_unknown=True).route is Route.HOT
    assert decide(10, None, MARKS).route is Route.HOT  # the lake holds nothing of the partition
    assert decide(10, LAKE, None).route is Route.HOT   # not asked: the broker answers


def test_a_hole_where_the_lake_runs_past_the_log_start_steps_to_it() -> None:
    """The lake holds ..98 and 100..120, the log starts at 100, 99 is a commit marker: the lake's next offset
    (100) explains the hole, so the consumer steps to the log start (it stalled, fetching 99 forever)."""
    lake = OffsetRange(0, 120)
    d = decide(99, lake, MARKS, held_from=100)
    assert (d.route, d.to, d.reason) == (Route.STEP, 100, "lake")
    assert decide(99, lake, MARKS, held_from=115).to == 100            # the next record lies further on
    assert decide(98, lake, MARKS, held_from=98).route is Route.COLD   # a record below the log start: read it
    assert decide(95, lake, MARKS, held_from=98).cap == 100           # a hole below it is the read's to step over
    assert decide(99, lake, MARKS).route is Route.COLD                 # not known: the read finds out
    assert decide(99, lake, MARKS, prefer_lake=True, held_from=100).route is Route.COLD  # served whole


def test_steps_name_their_reason() -> None:
    assert decide(95, LAKE, MARKS, writer_next=100).reason == "writer"
    assert decide(95, LAKE, MARKS, seam_holes="skip").reason == "seam_holes_skip"


def test_offsets_the_archive_recorded_lost_are_a_gap_wherever_they_fall() -> None:
    """ksi's archive lost 40..49 (retention passed it) and went on from 50: inside the lake, the range is not a
    hole its writer read."""
    lake, lost = OffsetRange(0, 88), [(40, 49)]
    d = decide(45, lake, MARKS, writer_next=100, lost=lost)
    assert (d.route, d.lost_from, d.lost_to) == (Route.GAP, 40, 50)
    assert decide(40, lake, MARKS, lost=lost).route is Route.GAP
    assert decide(10, lake, MARKS, lost=lost).cap == 40           # read up to the lost range, no further
    d = decide(38, lake, MARKS, held_from=50, lost=lost)          # 38, 39 markers: step to 40, then the gap
    assert (d.route, d.to) == (Route.STEP, 40)
    assert decide(50, lake, MARKS, lost=lost).cap == 100          # past it: as before
    assert decide(10, lake, MARKS, prefer_lake=True, lost=lost).cap == 40
    d = decide(92, lake, MARKS, writer_next=100, lost=[(95, 97)])  # at the seam: a step stops at the range
    assert (d.route, d.to) == (Route.STEP, 95)


def test_a_step_wider_than_a_control_batch_is_split() -> None:
    from kafka.record.default_records import DefaultRecordBatch

    from ksi.history.fetch import STEP_BATCHES, _step
    from protocol.records import CONTROL_BATCH_SPAN

    def spans(batches: list[bytes]) -> list[tuple[int, int]]:
        out = []
        for data in batches:
            batch = DefaultRecordBatch(data)
            assert batch.is_control_batch
            out.append((batch.base_offset, batch.base_offset + batch.last_offset_delta))
        return out

    assert spans(_step(10, 20, 4)) == [(10, 19)]
    span = CONTROL_BATCH_SPAN
    assert spans(_step(5, 5 + 2 * span + 3, 4)) == [(5, 4 + span), (5 + span, 4 + 2 * span),
                                                   (5 + 2 * span, 7 + 2 * span)]
    wide = spans(_step(0, 1 << 62, 12))
    assert len(wide) == STEP_BATCHES and wide[-1][1] == STEP_BATCHES * span - 1  # the rest at the next fetch
    assert _step(10, 20, 3) == []  # Fetch v0-v3: no control batches (the broker's records are forwarded)
