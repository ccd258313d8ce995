"""The broker's watermarks and verdict for one client connection, asked on that connection.

Before a partition is served from the lake, ksi asks the broker, on the client's own upstream connection:
ListOffsets EARLIEST and LATEST (authorised as DESCRIBE; they give the log start, the hot watermark, and
the high watermark or, under read_committed, the last stable offset) and a Fetch at the partition's end
(authorised as READ; it returns nothing and does not wait).  The answers are the broker's verdict on
whether this client may see the partition, so they are kept per connection, never shared, for
WATERMARK_TTL_SECONDS (trio's clock: tests run it in virtual time).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import trio
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)

from protocol.errors import (
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    NONE,
    NOT_COORDINATOR,
    OFFSET_OUT_OF_RANGE,
)

from ..metrics import record_seam
from ..upstream import decode_response

__all__ = [
    "EARLIEST",
    "LATEST",
    "WATERMARK_TTL_SECONDS",
    "Committed",
    "Refused",
    "Upstream",
    "Watermarks",
    "forget",
    "group_offset",
    "learn",
    "marks_of",
]

EARLIEST = -2
LATEST = -1
LIST_OFFSETS_VERSION = 2  # isolation level (read_committed -> last stable offset) needs v2
PROBE_FETCH_VERSION = 4   # the READ probe: isolation level, topic names, no sessions
OFFSET_FETCH_VERSION = 1  # a writer group's committed offsets: every broker answers it
WATERMARK_TTL_SECONDS = 1.0
# OffsetFetch errors that say "not here, not now" (v0-v1 put the group's error in every partition)
COORDINATOR_ERRORS = frozenset({COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR})


@dataclass(frozen=True, slots=True)
class Watermarks:
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int    # = high watermark under read_uncommitted (what LATEST answered)
    at: float


@dataclass(frozen=True, slots=True)
class Refused:
    """The broker answered this connection's ListOffsets (or READ probe) for a partition with an error, for
    example TOPIC_AUTHORIZATION_FAILED: the cold path answers with the same error, never with data."""

    error_code: int
    at: float


@dataclass(frozen=True, slots=True)
class Committed:
    """What a writer's consumer group committed for a partition (None: nothing; Refused: the broker asked is not
    the group's coordinator, so it cannot say now), as the broker said at ``at``."""

    offset: int | Refused | None
    at: float


class Upstream(Protocol):
    """The client's own upstream connection, and what ksi learnt on it."""

    marks: dict[Hashable, object]  # (topic, partition) -> Watermarks | Refused; ("group", ...) -> Committed
    principal: str         # who the broker accepted the client as (lake-only topics' allow-list)
    denied: set[str]       # lake-only topics already refused to it (logged once)

    async def call(self, payload: bytes, api: str) -> bytes | memoryview:
        """Send a request on the client's upstream connection; the raw response frame."""


def marks_of(upstream: Upstream, name: str, partition: int) -> Watermarks | Refused | None:
    """What the broker said of the partition on this connection, if it is fresh."""
    found = upstream.marks.get((name, partition))
    if not isinstance(found, (Watermarks, Refused)) or trio.current_time() - found.at > WATERMARK_TTL_SECONDS:
        return None
    return found


def forget(upstream: Upstream, name: str, partition: int) -> None:
    upstream.marks.pop((name, partition), None)


async def learn(upstream: Upstream, wanted: list[tuple[str, int]], isolation_level: int,
                note_log_start: Callable[[str, int, int], None]) -> None:
    """Ask the broker for the log start and the high watermark / LSO of ``wanted`` partitions (those not
    fresh), and for its READ verdict; ``note_log_start`` hears every log start learnt."""
    missing = [tp for tp in wanted if marks_of(upstream, *tp) is None]
    if not missing:
        return
    answers: dict[int, dict[tuple[str, int], int]] = {}
    errors: dict[tuple[str, int], int] = {}
    for timestamp in (EARLIEST, LATEST):
        topics: dict[str, list[Any]] = {}
        for name, partition in missing:
            topics.setdefault(name, []).append(ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                version=LIST_OFFSETS_VERSION, partition_index=partition, timestamp=timestamp))
        request = ListOffsetsRequest(version=LIST_OFFSETS_VERSION, replica_id=-1, isolation_level=isolation_level,
                                     topics=[ListOffsetsRequest.ListOffsetsTopic(version=LIST_OFFSETS_VERSION,
                                                                                 name=n, partitions=ps)
                                             for n, ps in topics.items()])
        request.with_header(correlation_id=0, client_id="ksi")
        raw = await upstream.call(bytes(request.encode(version=LIST_OFFSETS_VERSION, header=True)), "ListOffsets")
        response = decode_response(ListOffsetsResponse, LIST_OFFSETS_VERSION, raw, 0)
        found = answers.setdefault(timestamp, {})
        for topic in response.topics:
            for p in topic.partitions:
                if p.error_code == NONE:
                    found[(topic.name, p.partition_index)] = p.offset
                else:
                    errors[(topic.name, p.partition_index)] = p.error_code
    readable = {tp: end for tp, end in answers[LATEST].items() if tp not in errors and tp in answers[EARLIEST]}
    if readable:
        errors.update(await _read_verdicts(upstream, readable, isolation_level))
    now = trio.current_time()
    for tp in missing:
        start, end = answers[EARLIEST].get(tp), answers[LATEST].get(tp)
        if tp in errors:
            upstream.marks[tp] = Refused(errors[tp], now)
        elif start is not None and end is not None:
            upstream.marks[tp] = Watermarks(start, end, end, now)
            note_log_start(tp[0], tp[1], start)
            record_seam(tp[0], tp[1], log_start=start, high_watermark=end)


async def _read_verdicts(upstream: Upstream, ends: dict[tuple[str, int], int],
                         isolation_level: int) -> dict[tuple[str, int], int]:
    """The broker's READ verdict for this client: a Fetch at each partition's end (nothing to return, no
    waiting) on the client's own connection.  The partitions it refused, with the broker's error."""
    topics: dict[str, list[Any]] = {}
    for (name, partition), end in ends.items():
        topics.setdefault(name, []).append(FetchRequest.FetchTopic.FetchPartition(
            version=PROBE_FETCH_VERSION, partition=partition, fetch_offset=end, partition_max_bytes=1))
    request = FetchRequest(version=PROBE_FETCH_VERSION, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1,
                           isolation_level=isolation_level,
                           topics=[FetchRequest.FetchTopic(version=PROBE_FETCH_VERSION, topic=name, partitions=ps)
                                   for name, ps in topics.items()])
    request.with_header(correlation_id=0, client_id="ksi")
    raw = await upstream.call(bytes(request.encode(version=PROBE_FETCH_VERSION, header=True)), "Fetch")
    response = decode_response(FetchResponse, PROBE_FETCH_VERSION, raw, 0)
    return {(t.topic, p.partition_index): p.error_code for t in response.responses for p in t.partitions
            if p.error_code not in (NONE, OFFSET_OUT_OF_RANGE)}  # out of range: judged, and allowed


async def group_offset(upstream: Upstream, group: str, topic: str, partition: int) -> int | Refused | None:
    """The offset ``group`` (a sink's consumer group: a writer that commits what it read) committed for the
    partition, asked on the client's own connection and kept like the watermarks; None when it committed
    none or the broker refuses to say (the client may not DESCRIBE the group).  Refused with the error when
    the broker cannot tell now: it is not the group's coordinator (another broker of a cluster is: only
    the client's own connection, with its own credentials, may ask, so ksi does not ask that one), or the
    coordinator is loading or moving (COORDINATOR_* errors): never a reason to call the offsets lost."""
    key = ("group", group, topic, partition)
    found = upstream.marks.get(key)
    if isinstance(found, Committed) and trio.current_time() - found.at <= WATERMARK_TTL_SECONDS:
        return found.offset
    request = OffsetFetchRequest(version=OFFSET_FETCH_VERSION, group_id=group, topics=[
        OffsetFetchRequest.OffsetFetchRequestTopic(version=OFFSET_FETCH_VERSION, name=topic,
                                                   partition_indexes=[partition])])
    request.with_header(correlation_id=0, client_id="ksi")
    raw = await upstream.call(bytes(request.encode(version=OFFSET_FETCH_VERSION, header=True)), "OffsetFetch")
    response = decode_response(OffsetFetchResponse, OFFSET_FETCH_VERSION, raw, 0)
    committed: int | Refused | None = None
    for t in response.topics:
        for p in t.partitions:
            if t.name != topic or p.partition_index != partition:
                continue
            if p.error_code in COORDINATOR_ERRORS:
                committed = Refused(p.error_code, trio.current_time())
            elif p.error_code == NONE and p.committed_offset >= 0:
                committed = int(p.committed_offset)
    upstream.marks[key] = Committed(committed, trio.current_time())
    return committed
