"""Where one partition's fetch offset is served from: the seam between the lake and the log, as a pure function.

For a topic that exists in Kafka, with the lake holding offsets ``lake.first..lake.last`` of a partition
and the broker's log starting at ``log_start`` (the hot watermark):

=================================================  ===========================================================
fetch offset ``o``                                 answer
=================================================  ===========================================================
``o >= log_start`` (or the lake holds nothing)     HOT: the broker's (if retention moves past ``o`` meanwhile,
                                                   its OFFSET_OUT_OF_RANGE is caught and this is asked again)
``lake.first <= o <= lake.last``, ``o < log_start``  COLD: the lake's records from ``o`` (a hole inside the
                                                   lake is stepped over, as a broker steps over compacted
                                                   offsets), below ``log_start``; STEP to ``log_start``
                                                   when the lake holds nothing from ``o`` below it
                                                   (``held_from >= log_start``: a hole where the lake runs
                                                   past the log start, explained by the later offsets the
                                                   lake holds)
``o < lake.first``                                 HOT: the broker's OFFSET_OUT_OF_RANGE (the client resets
                                                   to EARLIEST, which ksi answers with ``lake.first``)
``lake.last < o < log_start``: a hole at the seam  STEP to ``min(writer_next, log_start)`` when the writer's
                                                   commit state says it read ``o`` (its next offset
                                                   ``writer_next > o``): the offsets it skipped (commit
                                                   markers, aborted records, tombstones it drops, compacted
                                                   keys) are stepped over and the consumer's lag reaches 0;
                                                   GAP when ``writer_next <= o``: records never reached the
                                                   lake before retention deleted them (lost data: error,
                                                   log line, metric); when the writer left no commit state,
                                                   the topic's ``seam_holes`` setting decides (``error``, the
                                                   default, or ``skip``)
=================================================  ===========================================================

Offsets ``ksi archive`` recorded as lost (``lost``: retention deleted them before it read them; see
:mod:`ksi.lake.commits`) are a GAP wherever they fall, also inside the lake: a read below them is capped at
their first offset, a step stops there.

``prefer_lake`` serves every offset the lake holds from the lake.  The lake unreadable (catalog down, nothing
known) and ``o < log_start``: UNAVAILABLE (a retriable error: the broker's answer would skip history).  The
broker refusing the client the partition: REFUSED with its error, never data.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ..lake.table import OffsetRange
from .watermarks import Refused, Watermarks

__all__ = ["Decision", "Route", "decide"]


class Route(enum.Enum):
    HOT = "hot"                  # forward to the broker
    COLD = "cold"                # read the lake from the offset, below ``cap`` (None: the lake's end)
    STEP = "step"                # answer nothing but a step to ``to``: the offsets between are explained holes
    GAP = "gap"                  # lost data between the lake's end and the log start: a retriable error
    UNAVAILABLE = "unavailable"  # the lake cannot be asked now: a retriable error
    REFUSED = "refused"          # the broker refused this client the partition: its error


@dataclass(frozen=True, slots=True)
class Decision:
    route: Route
    cap: int | None = None     # COLD: the first offset not to serve from the lake
    to: int | None = None      # STEP: where the consumer goes
    error: int = 0             # REFUSED: the broker's error code
    certain: bool = True       # GAP: False when the writer keeps no commit state (not known to be lost)
    lost_from: int | None = None  # GAP: the first offset missing (where the writer stopped reading, if known)
    reason: str = ""           # STEP: what explains the hole (ksi_lake_steps_total's reason label)
    lost_to: int | None = None  # GAP: the first offset after a range the archive recorded as lost


HOT = Decision(Route.HOT)
UNAVAILABLE = Decision(Route.UNAVAILABLE)


def decide(offset: int, lake: OffsetRange | None, marks: Watermarks | Refused | None, *, prefer_lake: bool = False,
           lake_unknown: bool = False, writer_next: int | None = None, seam_holes: str = "error",
           held_from: int | None = None, lost: Sequence[tuple[int, int]] = ()) -> Decision:
    """The route of a fetch at ``offset`` (see the module docstring).  ``marks``: the broker's answer on the
    client's connection (None: not asked, the partition is not cold-side); ``lake_unknown``: the lake's
    offsets cannot be learnt now; ``writer_next``: the writer's next offset for the partition from its
    commit state (None: it keeps none); ``held_from``: the first offset at or after ``offset`` the lake holds
    (None: not known, read to find out); ``lost``: the ranges (first, last) the archive recorded as lost."""
    if isinstance(marks, Refused):
        return Decision(Route.REFUSED, error=marks.error_code)
    if marks is None:
        return HOT
    log_start = marks.log_start_offset
    if lake is None:
        return UNAVAILABLE if lake_unknown and offset < log_start else HOT
    for first, last in lost:
        if first <= offset <= last and lake.first <= offset < max(log_start, lake.next):
            return Decision(Route.GAP, lost_from=first, lost_to=last + 1)
    lost_next = min((first for first, _ in lost if first > offset), default=None)
    if lake.first <= offset <= lake.last and (prefer_lake or offset < log_start):
        cap = None if prefer_lake else log_start
        if lost_next is not None:
            cap = lost_next if cap is None else min(cap, lost_next)
        if cap is not None and held_from is not None and held_from >= cap:
            return Decision(Route.STEP, to=cap, reason="lake")  # the lake holds later offsets
        return Decision(Route.COLD, cap=cap)
    if offset >= log_start or offset < lake.first:
        return HOT
    # lake.last < offset < log_start: a hole at the seam
    stop = log_start if lost_next is None else min(log_start, lost_next)
    if writer_next is None:
        if seam_holes == "skip":
            return Decision(Route.STEP, to=stop, reason="seam_holes_skip")
        return Decision(Route.GAP, certain=False, lost_from=lake.next)
    if offset < writer_next:
        return Decision(Route.STEP, to=min(writer_next, stop), reason="writer")
    return Decision(Route.GAP, lost_from=max(writer_next, lake.next))
