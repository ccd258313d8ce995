"""The check: one consumer's deliveries of one partition against the ledger, offset by offset."""

from __future__ import annotations

from dataclasses import dataclass, field

from .consumers import Trace
from .records import signed64

__all__ = ["Verdict", "verify"]


@dataclass
class Verdict:
    consumed: int = 0
    lost: int = 0       # offsets in the expected range never delivered
    skipped: int = 0    # offsets jumped over (delivered later or not at all): never allowed
    dup: int = 0        # extra deliveries Kafka semantics do not allow
    replayed: int = 0   # a group re-reading from its own last commit after a rebalance: allowed
    bad: int = 0        # delivered with other key, value, headers or timestamp than produced
    outside: int = 0    # offsets outside [start, end)
    rewinds: list[tuple[int, int, int]] = field(default_factory=list)  # (delivery index, from, to)
    first_problem: str = ""

    @property
    def ok(self) -> bool:
        return not (self.lost or self.skipped or self.dup or self.bad or self.outside)

    def note(self, text: str) -> None:
        if not self.first_problem:
            self.first_problem = text


def verify(trace: Trace, start: int, end: int, expected: dict[int, int], group: bool) -> Verdict:
    """Check one consumer's deliveries of one partition against the ledger, offset by offset.

    Every offset in ``[start, end)`` must be delivered with the digest produced there.  A consumer by
    assignment must deliver each exactly once, in order.  A consumer group may rewind after a
    rebalance, but only to an offset it committed itself (or to ``start`` before its first commit), and
    the records it then reads again are counted as *replayed*, not as duplicates."""
    v = Verdict()
    counts = bytearray(max(0, end - start))
    position = start
    legal_until = start  # re-deliveries below this follow a legal rewind
    allowed = trace.commits | {start}
    for index, (offset, value) in enumerate(zip(trace.offsets, trace.digests, strict=True)):
        v.consumed += 1
        if not start <= offset < end:
            v.outside += 1
            v.note(f"offset {offset} outside [{start}, {end})")
            continue
        if offset < position:  # a rewind
            v.rewinds.append((index, position, offset))
            if group and offset in allowed:
                legal_until = max(legal_until, position)
            else:
                legal_until = min(legal_until, offset)
                v.note(f"rewound from {position} to {offset}" + (" (not a committed offset)" if group else ""))
        elif offset > position:
            v.skipped += offset - position
            v.note(f"skipped {position}..{offset - 1}")
        position = offset + 1
        slot = offset - start
        if counts[slot]:
            if group and offset < legal_until:
                v.replayed += 1
            else:
                v.dup += 1
                v.note(f"offset {offset} delivered again")
        counts[slot] = min(255, counts[slot] + 1)
        want = expected.get(offset)
        if want is None or signed64(want) != value:
            v.bad += 1
            v.note(f"offset {offset}: " + ("no acknowledged record there" if want is None else "content differs"))
    v.lost = counts.count(0)
    if v.lost:
        missing = next(i for i, c in enumerate(counts) if c == 0) + start
        v.note(f"{v.lost} offsets never delivered, the first {missing}")
    return v
