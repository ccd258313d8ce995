"""Fetch and ListOffsets for history topics: split at the hot watermark, serve cold offsets from the lake,
merge one response.

For a Fetch naming a configured topic's partition at offset ``o``:

* ``lake.first <= o <= lake.last`` and ``o < log_start_offset`` (or ``prefer_lake``): cold, read from the
  lake and encoded as record batches with their original offsets;
* otherwise the partition goes to the broker as usual.  If the broker answers OFFSET_OUT_OF_RANGE
  (retention moved the log start while the consumer read), the watermarks are refreshed and the partition
  is served from the lake when it holds ``o``: no gap, no duplicate;
* ``lake.last < o < log_start_offset`` is lost data: the partition gets KAFKA_STORAGE_ERROR (retriable, so
  the consumer stalls visibly instead of skipping), a log line names topic, partition and range, and
  ``ksi_lake_gaps_total`` counts it.

Upstream fetches are sessionless (KIP-227 session id 0, epoch -1), so the broker never holds partition
state that a split request would leave stale, and clients always see session id 0.  The log start
offset (ListOffsets EARLIEST) is asked on the client's own upstream connection, cached for a second.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse

from protocol import RequestHeader, api, decode_body, encode_body, encode_response_header
from protocol.errors import (
    KAFKA_STORAGE_ERROR,
    NONE,
    OFFSET_OUT_OF_RANGE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from protocol.legacy_records import for_fetch_version

from ..metrics import COLD_FETCHES
from ..upstream import decode_response
from ..lake.table import LakeError, OffsetRange
from .lake_only import LakeOnlyTopics
from .service import History, Watermarks
from .topic_ids import TopicIds

__all__ = ["HistoryRouter", "Upstream"]

log = logging.getLogger("ksi.history")

EARLIEST = -2
LATEST = -1
UNKNOWN_RANGE = OffsetRange(-1, -2)  # a partition whose lake offsets cannot be learnt now
LIST_OFFSETS_VERSION = 2  # isolation level (read_committed -> last stable offset) needs v2
PROBE_FETCH_VERSION = 4   # the READ probe: isolation level, topic names, no sessions
WATERMARK_TTL_SECONDS = 1.0
FETCH = api(1)
LIST_OFFSETS = api(2)
assert FETCH is not None and LIST_OFFSETS is not None


class Upstream(Protocol):
    """The client's own upstream connection, and what ksi learnt on it."""

    marks: dict[tuple[str, int], "Watermarks | Refused"]
    principal: str     # who the broker accepted the client as (lake-only topics' allow-list)
    denied: set[str]   # lake-only topics already refused to it (logged once)

    async def call(self, payload: bytes, api: str) -> bytes | memoryview:
        """Send a request on the client's upstream connection; the raw response frame."""


@dataclass(frozen=True, slots=True)
class Refused:
    """The broker answered this connection's ListOffsets for a partition with an error (for example
    TOPIC_AUTHORIZATION_FAILED): the cold path answers with the same error, never with data."""

    error_code: int
    at: float


@dataclass
class _Cold:
    topic: Any          # the request's topic entry (name or id as the client sent it)
    name: str
    partition: Any      # the request's partition entry
    lake: OffsetRange
    error: int = NONE
    readable: bool = True   # False: nothing to read (a lake-only partition read up to its end)
    cap: int | None = None  # the first offset the lake must not answer for (the log start); None: the lake's end
    records: bytes = b""
    high_watermark: int = -1
    last_stable_offset: int = -1


@dataclass
class _Plan:
    cold: list[_Cold] = field(default_factory=list)
    history: dict[tuple[str, int], OffsetRange] = field(default_factory=dict)
    requested: dict[tuple[str, int], int] = field(default_factory=dict)  # fetch offset per history partition


class HistoryRouter:
    def __init__(self, history: History, topic_ids: TopicIds) -> None:
        self.history = history
        self.topic_ids = topic_ids
        self.lake_only = LakeOnlyTopics(history, topic_ids.learn)

    def _topic_name(self, entry: Any, version: int) -> str | None:
        return entry.topic if version < 13 else self.topic_ids.name(entry.topic_id)

    # -- watermarks ----------------------------------------------------------------------------

    @staticmethod
    def _marks(upstream: Upstream, name: str, partition: int) -> Watermarks | Refused | None:
        found = upstream.marks.get((name, partition))
        if found is None or time.monotonic() - found.at > WATERMARK_TTL_SECONDS:
            return None
        return found

    async def _watermarks(self, upstream: Upstream, wanted: list[tuple[str, int]], isolation_level: int) -> None:
        """Ask the broker, on the client's own connection, for log start (EARLIEST) and high watermark /
        LSO (LATEST) of ``wanted``.  Kept per connection, briefly: the broker's answer is also its
        verdict on whether this client may see the partition, so it is never shared between clients."""
        missing = [tp for tp in wanted if self._marks(upstream, *tp) is None]
        if not missing:
            return
        answers: dict[int, dict[tuple[str, int], int]] = {}
        errors: dict[tuple[str, int], int] = {}
        for timestamp in (EARLIEST, LATEST):
            topics: dict[str, list[Any]] = {}
            for name, partition in missing:
                topics.setdefault(name, []).append(ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                    version=LIST_OFFSETS_VERSION, partition_index=partition, timestamp=timestamp))
            request = ListOffsetsRequest(version=LIST_OFFSETS_VERSION, replica_id=-1,
                                         isolation_level=isolation_level, topics=[
                                             ListOffsetsRequest.ListOffsetsTopic(version=LIST_OFFSETS_VERSION,
                                                                                 name=n, partitions=ps)
                                             for n, ps in topics.items()])
            request.with_header(correlation_id=0, client_id="ksi")
            raw = await upstream.call(bytes(request.encode(version=LIST_OFFSETS_VERSION, header=True)),
                                      "ListOffsets")
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
            errors.update(await self._read_verdicts(upstream, readable, isolation_level))
        now = time.monotonic()
        for tp in missing:
            start, end = answers[EARLIEST].get(tp), answers[LATEST].get(tp)
            if tp in errors:
                upstream.marks[tp] = Refused(errors[tp], now)
            elif start is not None and end is not None:
                upstream.marks[tp] = Watermarks(start, end, end, now)
                self.history.note_log_start(tp[0], tp[1], start)

    @staticmethod
    async def _read_verdicts(upstream: Upstream, ends: dict[tuple[str, int], int],
                             isolation_level: int) -> dict[tuple[str, int], int]:
        """The broker's READ verdict for this client: ListOffsets is authorised as DESCRIBE, Fetch as READ,
        so a Fetch at the partition's end (nothing to return, no waiting) is sent on the client's own
        connection.  Returns the partitions it refused, with the broker's error."""
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

    # -- Fetch ---------------------------------------------------------------------------------

    async def fetch(self, header: RequestHeader, request: bytes | memoryview, upstream: Upstream,
                    client: str) -> bytes | memoryview:
        """The response frame (response header + body) for a Fetch; the caller sets the correlation id."""
        version = header.api_version
        assert header.body_offset is not None
        message = decode_body(FetchRequest, version, request[header.body_offset:])
        plan = await self._plan(message, version, upstream, client)
        hot_topics = []
        cold_keys = {(id(c.topic), c.partition.partition) for c in plan.cold}
        for topic in message.topics:
            partitions = [p for p in topic.partitions if (id(topic), p.partition) not in cold_keys]
            if partitions:
                topic.partitions = partitions
                hot_topics.append(topic)
        budget = message.max_bytes if version >= 3 else 1 << 31
        response = None
        if hot_topics:
            message.topics = hot_topics
            if version >= 7:
                message.session_id, message.session_epoch, message.forgotten_topics_data = 0, -1, []
            if plan.cold:
                message.max_wait_ms = 0  # cold data is ready: do not hold the response for min_bytes
            message.with_header(correlation_id=0, client_id=header.client_id)
            raw = await upstream.call(bytes(message.encode(version=version, header=True)), "Fetch")
            if not plan.requested:
                return raw  # no history partition in it: the broker's response as it is
            response = decode_response(FetchResponse, version, raw, FETCH.response_header_version(version))
            if not plan.cold and not any(p.error_code == OFFSET_OUT_OF_RANGE
                                         for t in response.responses for p in t.partitions):
                return raw  # nothing to add or recover: the broker's bytes, not a re-encoding of them
            await self._recover_out_of_range(response, version, plan, upstream, client, message.isolation_level)
            budget -= sum(len(p.records or b"") for t in response.responses for p in t.partitions)
        for cold in plan.cold:
            if cold.error != NONE or not cold.readable:
                continue
            limit = min(cold.partition.partition_max_bytes, max(budget, 0))
            if limit <= 0 and (response is not None or cold is not plan.cold[0]):
                continue
            try:
                cold.records = await self._read(cold, max(limit, 1), upstream, client)
            except LakeError:
                cold.error = KAFKA_STORAGE_ERROR  # retriable: the client backs off and asks again
            if version < 4:  # Fetch v0-v3 carry only message formats 0 and 1 (protocol/legacy_records.py)
                cold.records = await trio.to_thread.run_sync(for_fetch_version, cold.records, version, max(limit, 1),
                                                             cold.partition.fetch_offset)
            budget -= len(cold.records)
        if response is None:
            if not any(c.records or c.error != NONE for c in plan.cold):
                # Only lake-only partitions, all read to their end: hold the answer for max_wait like a
                # broker would, so a caught-up consumer does not spin.
                await trio.sleep(max(message.max_wait_ms, 0) / 1000)
            response = FetchResponse(version=version, throttle_time_ms=0, error_code=NONE, session_id=0,
                                     responses=[])
        self._merge(response, version, plan.cold)
        if hot_topics:
            self._fill_omitted(response, version, hot_topics)
        response.session_id = 0
        head = encode_response_header(header.correlation_id, FETCH.response_header_version(version))
        return head + encode_body(response, version)

    async def _plan(self, message: Any, version: int, upstream: Upstream, client: str) -> _Plan:
        plan = _Plan()
        candidates: list[tuple[Any, str, Any, OffsetRange | None]] = []
        for topic in message.topics:
            name = self._topic_name(topic, version)
            config = self.history.config_for(name) if name else None
            if config is None or name is None:
                continue
            ranges = await self.history.ranges(name)
            unknown = not ranges and self.history.unavailable(name) is not None
            if name in self.history.lake_only:
                allowed = self.lake_only.may_read(name, upstream, client)
                for p in topic.partitions:
                    cold = self._lake_only_cold(topic, name, p, ranges)
                    if not allowed:
                        cold.error, cold.readable = TOPIC_AUTHORIZATION_FAILED, False
                    plan.cold.append(cold)
                continue
            for p in topic.partitions:
                lake = ranges.get(p.partition)
                if lake is None:
                    plan.requested[(name, p.partition)] = p.fetch_offset  # the lake may have it by now: see recovery
                    if unknown:  # the lake cannot be asked: an offset below the log start gets a retriable error
                        candidates.append((topic, name, p, None))
                    continue
                plan.history[(name, p.partition)] = lake
                plan.requested[(name, p.partition)] = p.fetch_offset
                if lake.first <= p.fetch_offset <= lake.last:
                    candidates.append((topic, name, p, lake))
        if not candidates:
            return plan
        await self._watermarks(upstream, [(name, p.partition) for _, name, p, _ in candidates],
                               message.isolation_level if version >= 4 else 0)
        for topic, name, p, lake in candidates:
            marks = self._marks(upstream, name, p.partition)
            config = self.history.config_for(name)
            assert config is not None
            if isinstance(marks, Refused):
                # The broker refused this client the partition: the cold path refuses it the same way.
                plan.cold.append(_Cold(topic, name, p, lake or UNKNOWN_RANGE, error=marks.error_code))
            elif lake is None:
                if marks is not None and p.fetch_offset < marks.log_start_offset:
                    self.history.report_unavailable(name, p.partition, f"offset {p.fetch_offset} is below the log"
                                                    f" start ({marks.log_start_offset})", client)
                    plan.cold.append(_Cold(topic, name, p, UNKNOWN_RANGE, error=KAFKA_STORAGE_ERROR,
                                           high_watermark=marks.high_watermark,
                                           last_stable_offset=marks.last_stable_offset))
            elif marks is not None and (config.prefer_lake or p.fetch_offset < marks.log_start_offset):
                plan.cold.append(_Cold(topic, name, p, lake,
                                       high_watermark=marks.high_watermark if marks else lake.next,
                                       last_stable_offset=marks.last_stable_offset if marks else lake.next,
                                       cap=None if config.prefer_lake else marks.log_start_offset))
        return plan

    @staticmethod
    def _lake_only_cold(topic: Any, name: str, p: Any, ranges: dict[int, OffsetRange]) -> _Cold:
        """A lake-only partition: the lake's range is the whole log."""
        lake = ranges.get(p.partition)
        end = lake.next if lake is not None else 0
        cold = _Cold(topic, name, p, lake or OffsetRange(0, -1), high_watermark=end, last_stable_offset=end)
        if lake is None and (not ranges or p.partition > max(ranges)):
            cold.error = UNKNOWN_TOPIC_OR_PARTITION
        elif p.fetch_offset == end:
            cold.readable = False
        elif lake is None or not lake.first <= p.fetch_offset <= lake.last:
            cold.error = OFFSET_OUT_OF_RANGE
        return cold

    async def _recover_out_of_range(self, response: Any, version: int, plan: _Plan, upstream: Upstream,
                                    client: str, isolation_level: int) -> None:
        """Retention moved past a partition while the request was in flight: serve it from the lake."""
        for topic in response.responses:
            name = self._topic_name(topic, version)
            if name is None:
                continue
            for p in topic.partitions:
                lake = plan.history.get((name, p.partition_index))
                request_offset = plan.requested.get((name, p.partition_index))
                if p.error_code != OFFSET_OUT_OF_RANGE or request_offset is None:
                    continue
                if lake is None or not lake.first <= request_offset <= lake.last:
                    # ksi's view of the lake is up to RANGES_TTL_SECONDS old: an archive run may have added these
                    # offsets just before retention deleted them.  Look again before passing the broker's answer
                    # on (the client would reset past that history) or calling it a gap.
                    lake = (await self.history.ranges(name, max_age=0.0)).get(p.partition_index, lake)
                    if lake is None and self.history.unavailable(name) is None:
                        continue  # the lake holds nothing of this partition: the broker's answer stands
                upstream.marks.pop((name, p.partition_index), None)
                await self._watermarks(upstream, [(name, p.partition_index)], isolation_level)
                marks = self._marks(upstream, name, p.partition_index)
                if not isinstance(marks, Watermarks):
                    continue
                if lake is None:  # the lake cannot be asked (see _plan)
                    if request_offset < marks.log_start_offset:
                        self.history.report_unavailable(name, p.partition_index, f"offset {request_offset} is below"
                                                        f" the log start ({marks.log_start_offset})", client)
                        p.error_code = KAFKA_STORAGE_ERROR
                    continue
                p.log_start_offset = lake.first
                if lake.first <= request_offset <= lake.last:
                    try:
                        config = self.history.config_for(name)
                        data = await self._read_range(name, p.partition_index, request_offset,
                                                      None if config is None or config.prefer_lake
                                                      else marks.log_start_offset, 1 << 20, upstream, client)
                    except LakeError:
                        p.error_code = KAFKA_STORAGE_ERROR
                        continue
                    if version < 4:  # as in fetch()
                        data = await trio.to_thread.run_sync(for_fetch_version, data, version, 1 << 20, request_offset)
                    p.error_code, p.records = NONE, data
                    p.high_watermark, p.last_stable_offset = marks.high_watermark, marks.last_stable_offset
                elif lake.last < request_offset < marks.log_start_offset:
                    self.history.report_gap(name, p.partition_index, lake.next, marks.log_start_offset, client)
                    p.error_code = KAFKA_STORAGE_ERROR

    @staticmethod
    def _key(topic: Any) -> Any:
        return getattr(topic, "topic_id", None) or getattr(topic, "topic", None)

    async def _read(self, cold: _Cold, max_bytes: int, upstream: Upstream, client: str) -> bytes:
        return await self._read_range(cold.name, cold.partition.partition, cold.partition.fetch_offset, cold.cap,
                                      max_bytes, upstream, client)

    async def _read_range(self, name: str, partition: int, offset: int, cap: int | None, max_bytes: int,
                          upstream: Upstream, client: str) -> bytes:
        try:
            data = await self.history.read(name, partition, offset, max_bytes, cap, reader=id(upstream))
        except LakeError as exc:
            self.history.report_read_error(name, partition, offset, exc, client)
            raise
        COLD_FETCHES.labels(name).inc()
        records = b"".join(data)
        log.debug("%s: topic %s partition %d: %d bytes from the lake at offset %d", client, name, partition,
                  len(records), offset)
        return records

    def _merge(self, response: Any, version: int, cold: list[_Cold]) -> None:
        P = FetchResponse.FetchableTopicResponse.PartitionData
        by_key = {self._key(t): t for t in response.responses}
        for c in cold:
            key = self._key(c.topic)
            topic = by_key.get(key)
            if topic is None:
                topic = FetchResponse.FetchableTopicResponse(version=version, partitions=[])
                if version >= 13:
                    topic.topic_id = c.topic.topic_id
                else:
                    topic.topic = c.topic.topic
                response.responses.append(topic)
                by_key[key] = topic
            topic.partitions.append(P(
                version=version, partition_index=c.partition.partition, error_code=c.error,
                high_watermark=c.high_watermark, last_stable_offset=c.last_stable_offset,
                log_start_offset=c.lake.first, aborted_transactions=[] if version >= 4 else None,
                preferred_read_replica=-1, records=c.records))

    def _fill_omitted(self, response: Any, version: int, hot_topics: list[Any]) -> None:
        """Every partition of a sessionless fetch must be in its response.  A broker that leaves one out
        (tansu answers a max_wait_ms=0 fetch, which ksi sends for the hot half of a split fetch, with no
        partitions at all) would make ksi's merged response invalid: kafka-python rejects such a full
        fetch response whole and stalls.  An omitted partition gets an empty answer: fetched again next."""
        P = FetchResponse.FetchableTopicResponse.PartitionData
        by_key = {self._key(t): t for t in response.responses}
        for topic in hot_topics:
            key = self._key(topic)
            entry = by_key.get(key)
            present = {p.partition_index for p in entry.partitions} if entry is not None else set()
            for p in topic.partitions:
                if p.partition in present:
                    continue
                if entry is None:
                    entry = FetchResponse.FetchableTopicResponse(version=version, partitions=[])
                    if version >= 13:
                        entry.topic_id = topic.topic_id
                    else:
                        entry.topic = topic.topic
                    response.responses.append(entry)
                    by_key[key] = entry
                entry.partitions.append(P(
                    version=version, partition_index=p.partition, error_code=NONE, high_watermark=-1,
                    last_stable_offset=-1, log_start_offset=-1, aborted_transactions=[] if version >= 4 else None,
                    preferred_read_replica=-1, records=b""))

    # -- ListOffsets ---------------------------------------------------------------------------

    async def list_offsets(self, header: RequestHeader, request: bytes | memoryview, upstream: Upstream,
                           client: str) -> bytes | memoryview:
        """The response frame for a ListOffsets; the caller sets the correlation id."""
        version = header.api_version
        assert header.body_offset is not None
        message = decode_body(ListOffsetsRequest, version, request[header.body_offset:])
        asked = {(t.name, p.partition_index): p.timestamp for t in message.topics for p in t.partitions}
        header_version = LIST_OFFSETS.response_header_version(version)
        lake_only = [t for t in message.topics if t.name in self.history.lake_only]
        if lake_only:
            message.topics = [t for t in message.topics if t.name not in self.history.lake_only]
        if not lake_only:
            raw = await upstream.call(bytes(request), "ListOffsets")
        elif message.topics:
            message.with_header(correlation_id=0, client_id=header.client_id)
            raw = await upstream.call(bytes(message.encode(version=version, header=True)), "ListOffsets")
        else:
            raw = None
        if raw is not None:
            response = decode_response(ListOffsetsResponse, version, raw, header_version)
        else:
            response = ListOffsetsResponse(version=version, throttle_time_ms=0, topics=[])
        for topic in lake_only:
            response.topics.append(await self._lake_only_offsets(
                topic, version, self.lake_only.may_read(topic.name, upstream, client)))
        changed = bool(lake_only)
        for topic in response.topics:
            if self.history.config_for(topic.name) is None or topic.name in self.history.lake_only:
                continue
            ranges = await self.history.ranges(topic.name)
            if any(asked.get((topic.name, p.partition_index)) == EARLIEST and p.error_code == NONE and p.offset > 0
                   and (ranges.get(p.partition_index) is None or ranges[p.partition_index].next < p.offset)
                   for p in topic.partitions):
                # The lake seems to end below the log start: it may have grown since ksi last looked.
                ranges = await self.history.ranges(topic.name, max_age=0.0)
            unknown = not ranges and self.history.unavailable(topic.name) is not None
            for p in topic.partitions:
                lake = ranges.get(p.partition_index)
                timestamp = asked.get((topic.name, p.partition_index))
                if timestamp is None:
                    continue
                if lake is None:
                    if unknown and p.error_code == NONE and (timestamp == EARLIEST or timestamp >= 0):
                        # The broker's answer would skip whatever history the lake holds.
                        what = "EARLIEST" if timestamp == EARLIEST else f"the offset for timestamp {timestamp}"
                        self.history.report_unavailable(topic.name, p.partition_index, f"{what} is asked", client)
                        p.error_code, p.offset, p.timestamp = KAFKA_STORAGE_ERROR, -1, -1
                        changed = True
                    continue
                if timestamp == EARLIEST and (p.error_code != NONE or p.offset < 0 or lake.first < p.offset):
                    p.error_code, p.offset, p.timestamp = NONE, lake.first, -1
                    changed = True
                elif timestamp >= 0:
                    try:
                        found = await self.history.offset_for_timestamp(topic.name, p.partition_index, timestamp)
                    except LakeError:  # the lake cannot be asked: the broker's answer might skip history
                        if p.error_code == NONE:
                            p.error_code, p.offset, p.timestamp = KAFKA_STORAGE_ERROR, -1, -1
                            changed = True
                        continue
                    if found is not None and (p.error_code != NONE or p.offset < 0 or found[0] < p.offset):
                        p.error_code, p.offset, p.timestamp = NONE, found[0], found[1]
                        changed = True
        if not changed and raw is not None:
            return raw
        log.debug("%s: ListOffsets answered from the lake", client)
        return encode_response_header(header.correlation_id, header_version) + encode_body(response, version)

    async def _lake_only_offsets(self, topic: Any, version: int, allowed: bool) -> Any:
        """ListOffsets for a lake-only topic: its log is the lake's range."""
        T = ListOffsetsResponse.ListOffsetsTopicResponse
        P = T.ListOffsetsPartitionResponse
        ranges = await self.history.ranges(topic.name)
        answer = T(version=version, name=topic.name, partitions=[])
        for asked in topic.partitions:
            index = asked.partition_index
            lake = ranges.get(index)
            p = P(version=version, partition_index=index, error_code=NONE, timestamp=-1, offset=-1)
            if version >= 4:
                p.leader_epoch = -1
            if not allowed:
                p.error_code = TOPIC_AUTHORIZATION_FAILED
            elif lake is None and (not ranges or index > max(ranges)):
                p.error_code = UNKNOWN_TOPIC_OR_PARTITION
            elif asked.timestamp == EARLIEST:
                p.offset = lake.first if lake is not None else 0
            elif asked.timestamp == LATEST:
                p.offset = lake.next if lake is not None else 0
            elif asked.timestamp >= 0 and lake is not None:
                try:
                    found = await self.history.offset_for_timestamp(topic.name, index, asked.timestamp)
                except LakeError:
                    p.error_code = KAFKA_STORAGE_ERROR
                else:
                    if found is not None:
                        p.offset, p.timestamp = found
            answer.partitions.append(p)
        return answer
