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
