"""Fetch for history topics: each partition routed at the seam (:mod:`ksi.history.seam`), the hot part
forwarded, the rest answered by ksi, one response.

* Partitions the lake answers (cold reads, steps over explained holes, per-partition errors) are *local*;
  the others are forwarded in one sessionless Fetch (KIP-227 session id 0: the broker never holds
  partition state a split request would leave stale, and clients always see session id 0).
* The broker's response is scanned, not decoded (:func:`protocol.fetch_scan.scan_fetch_response`): with
  nothing to add and nothing out of range it is returned as its bytes.  A partition the broker answers
  OFFSET_OUT_OF_RANGE (retention moved the log start while the consumer read, or the consumer is at a hole
  at the seam) is routed again with fresh watermarks and lake offsets.
* The response is built with the codec and the records spliced in (:class:`protocol.splice.Splice`): the
  lake's batches are sent as they are cached, never copied into the response.
* A step over an explained hole is a control batch spanning it (:func:`protocol.records.encode_control_batch`):
  consumers move past control batches, as past a transactional producer's markers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import trio
from kafka.protocol.consumer import FetchRequest, FetchResponse

from protocol import RequestHeader, decode_body, encode_response_header, known_api
from protocol.errors import (
    KAFKA_STORAGE_ERROR,
    NONE,
    OFFSET_OUT_OF_RANGE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from protocol.fetch_scan import scan_fetch_response
from protocol.legacy_records import LegacyConversionError, for_fetch_version
from protocol.records import CONTROL_BATCH_SPAN, encode_control_batch
from protocol.splice import Splice

from ..filters.api import Forward, Spliced
from ..lake.table import LakeError, OffsetRange
from ..metrics import COLD_FETCHES
from ..upstream import decode_response
from . import watermarks
from .lake_only import LakeOnlyTopics, lake_only_partitions
from .seam import Decision, Route, decide
from .service import History
from .topic_ids import TopicIds
from .watermarks import Refused, Upstream, Watermarks

__all__ = ["FetchHandler"]

log = logging.getLogger("ksi.history")

FETCH = known_api(1)
TOPIC_IDS_FROM = 13
LEGACY_BELOW = 4           # Fetch v0-v3 carry message formats 0 and 1 only
RECOVERY_READ_BYTES = 1 << 20
STEP_BATCHES = 8            # control batches in one step's answer
OLD_STEP_FETCH_VERSION = 4  # the broker's records after a step, for Fetch v0-v3 (see _forward_old_steps)


@dataclass
class _Local:
    """A partition ksi answers itself."""

    topic: Any                  # the request's topic entry (name or id as the client sent it)
    name: str
    partition: Any              # the request's partition entry
    error: int = NONE
    records: list[bytes] = field(default_factory=list)
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    read_cap: int | None = None  # to read from the lake below this (None: to the lake's end)
    read: bool = False          # records still to read from the lake
    step_to: int | None = None  # answer with a step to this offset
    hot_from: int = -1          # the broker's log start, as this connection learnt it
    lake_next: int | None = None  # the lake's end (a cold read under read_committed may find only aborted records)


@dataclass
class _Plan:
    local: list[_Local] = field(default_factory=list)
    requested: dict[tuple[str, int], int] = field(default_factory=dict)  # fetch offset per history partition
    isolation_level: int = 0  # the Fetch's: read_committed (1) is not served the lake's aborted records


class FetchHandler:
    def __init__(self, history: History, topic_ids: TopicIds, lake_only: LakeOnlyTopics) -> None:
        self.history = history
        self.topic_ids = topic_ids
        self.lake_only = lake_only

    def _name(self, entry: Any, version: int) -> str | None:
        return entry.topic if version < TOPIC_IDS_FROM else self.topic_ids.name(entry.topic_id)

    async def __call__(self, header: RequestHeader, request: bytes | memoryview, upstream: Upstream,
                       client: str, hand_back: bool = False) -> bytes | memoryview | Spliced | Forward:
        """The response to a Fetch; or, ``hand_back`` (Fetch v4+: the history filter scans the broker's answer for
        OFFSET_OUT_OF_RANGE), :class:`Forward` when the broker answers every partition of it: its records are
        then relayed to the client unread, as a Fetch the filter forwards is, instead of read whole here."""
        version = header.api_version
        assert header.body_offset is not None
        message = decode_body(FetchRequest, version, request[header.body_offset:])
        isolation = message.isolation_level if version >= 4 else 0
        plan = await self._plan(message, version, upstream, client, isolation)
        plan.isolation_level = isolation
        local_keys = {(id(x.topic), x.partition.partition) for x in plan.local}
        hot_topics = []
        for topic in message.topics:
            partitions = [p for p in topic.partitions if (id(topic), p.partition) not in local_keys]
            if partitions:
                topic.partitions = partitions
                hot_topics.append(topic)
        budget = message.max_bytes if version >= 3 else 1 << 31
        hot = None
        hot_ready = False  # the broker's part has records
        if hot_topics:
            message.topics = hot_topics
            # KIP-227 sessionless (session id 0, epoch -1, nothing forgotten) as sent, or made so below
            sessionless = version < 7 or ((message.session_id, message.session_epoch) == (0, -1)
                                          and not message.forgotten_topics_data)
            if version >= 7:
                message.session_id, message.session_epoch, message.forgotten_topics_data = 0, -1, []
            if plan.local:
                message.max_wait_ms = 0  # ksi's part is ready: do not hold the response for min_bytes
            forward: bytes | memoryview
            if plan.local or not sessionless:
                message.with_header(correlation_id=0, client_id=header.client_id)
                forward = bytes(message.encode(version=version, header=True))
            else:
                forward = request  # sessionless already, nothing taken out: the client's own bytes
            if hand_back and not plan.local and version >= LEGACY_BELOW:
                return Forward(forward, {})
            raw = await upstream.call(bytes(forward), "Fetch")
            offset = 4 + (1 if FETCH.response_header_version(version) >= 1 else 0)
            layout = scan_fetch_response(memoryview(raw)[offset:], version)
            recover = [p for p in layout.partitions if p.error_code == OFFSET_OUT_OF_RANGE
                       and self._history_partition(p.topic, p.partition_index, version, plan)]
            if not plan.local and not recover:
                # The broker's bytes, undecoded: nothing to add or to recover.  Relayed without a copy unless
                # they name brokers (Fetch v16+ node endpoints), which the address filter must rewrite.
                return raw if layout.node_endpoints else Spliced((raw[:4], memoryview(raw)[4:]))
            hot = decode_response(FetchResponse, version, raw, FETCH.response_header_version(version))
            await self._recover(hot, version, plan, upstream, client, isolation)
            budget -= sum(p.records_size for p in layout.partitions if p.records_size > 0)
            hot_ready = any(p.records_size > 0 for p in layout.partitions)
        await self._fill(plan, version, budget, upstream, client, ready=hot_ready)
        if version < LEGACY_BELOW:
            await self._forward_old_steps(plan, version, upstream, header.client_id)
        if hot is None and not any(x.records or x.error != NONE for x in plan.local):
            # Only lake-only partitions read to their end: hold the answer for max_wait as a broker does, so a
            # caught-up consumer does not spin.
            await trio.sleep(max(message.max_wait_ms, 0) / 1000)
        return self._response(header, version, hot, hot_topics, plan)

    def _history_partition(self, topic: Any, partition: int, version: int, plan: _Plan) -> bool:
        name = topic if version < TOPIC_IDS_FROM else self.topic_ids.name(topic)
        return name is not None and (name, partition) in plan.requested

    # -- routing -------------------------------------------------------------------------------

    async def _plan(self, message: Any, version: int, upstream: Upstream, client: str, isolation: int) -> _Plan:
        plan = _Plan()
        candidates: list[tuple[Any, str, Any, OffsetRange | None, bool]] = []
        for topic in message.topics:
            name = self._name(topic, version)
            config = self.history.config_for(name) if name else None
            if config is None or name is None:
                continue
            ranges = await self.history.ranges(name)
            unknown = not ranges and self.history.unavailable(name) is not None
            if name in self.history.lake_only:
                allowed = self.lake_only.may_read(name, upstream, client)
                plan.local += [self._lake_only(topic, name, p, ranges, allowed) for p in topic.partitions]
                continue
            for p in topic.partitions:
                lake = ranges.get(p.partition)
                plan.requested[(name, p.partition)] = p.fetch_offset
                self.history.routing(name, p.partition)
                if self.history.partition_unavailable(name, p.partition) is not None:
                    candidates.append((topic, name, p, None, True))  # a data file of it cannot be read
                elif (lake is None and unknown) or (lake is not None and lake.first <= p.fetch_offset and (
                        p.fetch_offset <= lake.last or p.fetch_offset < self.history.log_start(name, p.partition)
                        or version < LEGACY_BELOW)):
                    # In the lake, or in a hole at the seam below the log start: routed here rather than after
                    # the broker's OFFSET_OUT_OF_RANGE (which brokers refusing Fetch v0-v3 never send: old
                    # clients' fetches above the lake's first offset are all routed here).
                    candidates.append((topic, name, p, lake, unknown))
        if not candidates:
            return plan
        await watermarks.learn(upstream, [(name, p.partition) for _, name, p, _, _ in candidates], isolation,
                               self.history.note_log_start)
        for topic, name, p, lake, unknown in candidates:
            local = await self._route(topic, name, p, p.fetch_offset, lake, unknown, upstream, client)
            if local is not None:
                plan.local.append(local)
        return plan

    async def _route(self, topic: Any, name: str, p: Any, offset: int, lake: OffsetRange | None, unknown: bool,
                     upstream: Upstream, client: str) -> _Local | None:
        """The local answer for a partition at ``offset``, or None when the broker answers it."""
        config = self.history.config_for(name)
        assert config is not None
        marks = watermarks.marks_of(upstream, name, p.partition)
        writer_next = self.history.writer_next(name, p.partition)
        if (writer_next is None and config.writer_group is not None and isinstance(marks, Watermarks)
                and lake is not None and lake.last < offset < marks.log_start_offset):
            committed = await watermarks.group_offset(upstream, config.writer_group, name, p.partition)
            if isinstance(committed, Refused):
                # Which of the offsets at the seam the sink read cannot be asked now: retriable, never a gap.
                local = _Local(topic, name, p, error=KAFKA_STORAGE_ERROR, high_watermark=marks.high_watermark,
                               last_stable_offset=marks.last_stable_offset, log_start_offset=lake.first)
                self.history.report_writer_unknown(name, p.partition, offset, config.writer_group,
                                                   committed.error_code, client)
                return local
            writer_next = committed
        held_from = None
        if (lake is not None and isinstance(marks, Watermarks) and lake.first <= offset <= lake.last
                and offset < marks.log_start_offset):
            held_from = self.history.held_from(name, p.partition, offset)
        d: Decision = decide(offset, lake, marks, prefer_lake=config.prefer_lake, lake_unknown=unknown,
                             writer_next=writer_next, seam_holes=config.seam_holes, held_from=held_from,
                             lost=self.history.lost(name, p.partition))
        if d.route is Route.HOT:
            return None
        local = _Local(topic, name, p)
        if isinstance(marks, Watermarks):
            local.high_watermark, local.last_stable_offset = marks.high_watermark, marks.last_stable_offset
            local.hot_from = marks.log_start_offset
        local.log_start_offset = lake.first if lake is not None else -1
        if d.route is Route.REFUSED:
            local.error = d.error  # the broker refused this client the partition: the cold path refuses it too
        elif d.route is Route.COLD:
            local.read, local.read_cap = True, d.cap
            local.lake_next = lake.next if lake is not None else None
        elif d.route is Route.STEP:
            assert d.to is not None
            local.step_to = d.to
            self.history.report_step(name, p.partition, offset, d.to, d.reason, client)
        elif d.route is Route.GAP and d.lost_to is not None:
            assert d.lost_from is not None
            self.history.report_lost(name, p.partition, d.lost_from, d.lost_to - 1, client)
            local.error = KAFKA_STORAGE_ERROR
        elif d.route is Route.GAP:
            assert lake is not None and isinstance(marks, Watermarks)
            self.history.report_gap(name, p.partition, d.lost_from if d.lost_from is not None else lake.next,
                                    marks.log_start_offset, client, d.certain, lake_last=lake.last)
            local.error = KAFKA_STORAGE_ERROR  # retriable: the consumer stalls visibly instead of skipping
        else:  # UNAVAILABLE
            assert isinstance(marks, Watermarks)
            self.history.report_unavailable(name, p.partition, f"offset {offset} is below the log start"
                                            f" ({marks.log_start_offset})", client)
            local.error = KAFKA_STORAGE_ERROR
        return local

    @staticmethod
    def _lake_only(topic: Any, name: str, p: Any, ranges: dict[int, OffsetRange], allowed: bool) -> _Local:
        """A lake-only partition: the lake's range is the whole log."""
        lake = ranges.get(p.partition)
        end = lake.next if lake is not None else 0
        local = _Local(topic, name, p, high_watermark=end, last_stable_offset=end,
                       log_start_offset=lake.first if lake is not None else 0)
        partitions = lake_only_partitions(ranges)
        if not allowed:
            local.error = TOPIC_AUTHORIZATION_FAILED
        elif p.partition >= partitions:
            local.error = UNKNOWN_TOPIC_OR_PARTITION
        elif p.fetch_offset == end:
            pass  # at the end of the log (an empty partition's is 0): nothing to read yet
        elif lake is None or not lake.first <= p.fetch_offset < end:
            local.error = OFFSET_OUT_OF_RANGE
        else:
            local.read, local.lake_next = True, end
        return local

    async def _recover(self, response: Any, version: int, plan: _Plan, upstream: Upstream, client: str,
                       isolation: int) -> None:
        """Partitions the broker answered OFFSET_OUT_OF_RANGE: routed again with fresh watermarks and lake
        offsets (an archive run may have just added the offsets, retention may have just moved)."""
        for topic in response.responses:
            name = self._name(topic, version)
            if name is None:
                continue
            kept = []
            for p in topic.partitions:
                offset = plan.requested.get((name, p.partition_index))
                if p.error_code != OFFSET_OUT_OF_RANGE or offset is None:
                    kept.append(p)
                    continue
                ranges = await self.history.ranges(name, max_age=0.0)
                unknown = not ranges and self.history.unavailable(name) is not None
                lake = ranges.get(p.partition_index)
                if self.history.partition_unavailable(name, p.partition_index) is not None:
                    lake, unknown = None, True
                if lake is None and not unknown:
                    kept.append(p)  # the lake holds nothing of this partition: the broker's answer stands
                    continue
                watermarks.forget(upstream, name, p.partition_index)
                await watermarks.learn(upstream, [(name, p.partition_index)], isolation, self.history.note_log_start)
                local = await self._route(_TopicOf(topic, version), name, _PartitionOf(p.partition_index, offset),
                                          offset,
                                    lake, unknown, upstream, client)
                if local is None:
                    kept.append(p)  # below the lake's first offset: the broker's OFFSET_OUT_OF_RANGE stands
                else:
                    plan.local.append(local)
            topic.partitions = kept
        response.responses = [t for t in response.responses if t.partitions]

    # -- answering -----------------------------------------------------------------------------

    async def _fill(self, plan: _Plan, version: int, budget: int, upstream: Upstream, client: str,
                    ready: bool = False) -> None:
        """Read the local partitions' records (within the response's byte budget), or their steps.

        As a broker answers a fetch with the partitions that have data without waiting for the others, the
        partitions whose records are read already are answered at once, and reads of the others are started
        (in parallel) for the next fetch; only a fetch for which nothing is ready (``ready``: the broker's part
        has records) waits for its reads."""
        waiting: list[_Local] = []
        budget = await self._fill_pass(plan.local, plan, version, budget, upstream, client, waiting, wait=False)
        if waiting and not ready and not any(x.records or x.error != NONE for x in plan.local):
            await self._fill_pass(waiting, plan, version, budget, upstream, client, [], wait=True)

    async def _fill_pass(self, locals_: list[_Local], plan: _Plan, version: int, budget: int, upstream: Upstream,
                         client: str, waiting: list[_Local], wait: bool) -> int:
        """One pass of :meth:`_fill` over ``locals_``; those with nothing read yet (``wait`` False) are added to
        ``waiting``.  Returns the budget left."""
        first = True
        for local in locals_:
            if local.step_to is not None:
                local.records = _step(local.partition.fetch_offset, local.step_to, version)
                continue
            if local.error != NONE or not local.read:
                continue
            limit = min(local.partition.partition_max_bytes, max(budget, 0))
            if limit <= 0 and not first:
                continue
            first = False
            offset = local.partition.fetch_offset
            try:
                records = await self.history.read(local.name, local.partition.partition, offset, max(limit, 1),
                                                  local.read_cap, reader=id(upstream),
                                                  isolation_level=plan.isolation_level, wait=wait)
            except LakeError as exc:
                self.history.report_read_error(local.name, local.partition.partition, offset, exc, client)
                local.error = KAFKA_STORAGE_ERROR  # retriable: the client backs off and asks again
                continue
            if records is None:  # being read: answered by a later fetch (or the waiting pass)
                waiting.append(local)
                continue
            local.records = records
            if (not local.records and local.read_cap is not None
                    and self.history.nothing_below(local.name, local.partition.partition, offset, local.read_cap,
                                                   id(upstream))):
                # The lake holds nothing from here below the log start, but later offsets (a read found them
                # past a hole): step to the log start, or the consumer asks for this offset forever.
                local.step_to, local.read = local.read_cap, False
                self.history.report_step(local.name, local.partition.partition, offset, local.read_cap, "lake",
                                         client)
                local.records = _step(offset, local.step_to, version)
                continue
            COLD_FETCHES.labels(local.name).inc()
            if not local.records and local.lake_next is not None:
                # No record to serve from here to the lake's end or the log start: only holes inside the lake
                # (a commit marker just below the log start of a lake that reaches past it) or, under
                # read_committed, records of aborted transactions.  Stepped over as a broker steps a consumer
                # over them; from the lake's end the seam decides as for any hole there.
                to = local.lake_next if local.read_cap is None else min(local.lake_next, local.read_cap)
                if to > offset:
                    local.step_to, local.read = to, False
                    self.history.report_step(local.name, local.partition.partition, offset, to, "lake", client)
                    local.records = _step(offset, to, version)
                continue
            if version < LEGACY_BELOW:
                joined = b"".join(local.records)
                local.records = [await trio.to_thread.run_sync(for_fetch_version, joined, version, max(limit, 1),
                                                               offset)]
            budget -= sum(len(b) for b in local.records)
        return budget

    async def _forward_old_steps(self, plan: _Plan, version: int, upstream: Upstream, client_id: str | None) -> None:
        """Fetch v0-v3 cannot carry a step: the old message formats have no control batches (Kafka drops
        transaction markers when it converts down), and an empty answer makes the client fetch the same offset
        forever.  A partition stepped to the log start gets the broker's records from there instead, converted
        to the version's message format: what a broker answers a fetch at a marker (old clients take messages
        above their fetch offset).  The broker is asked with Fetch v4, which every broker serves (Kafka 4 and
        noida-db refuse v0-v3), read_uncommitted as Kafka serves old clients.  A step that stops below the log
        start (to where a writer stopped reading: a gap follows) cannot be forwarded and stays empty."""
        moved = [x for x in plan.local if x.step_to is not None and 0 <= x.hot_from <= x.step_to]
        if not moved:
            return
        F = FetchRequest
        topics: dict[str, list[Any]] = {}
        for x in moved:
            topics.setdefault(x.name, []).append(F.FetchTopic.FetchPartition(
                version=OLD_STEP_FETCH_VERSION, partition=x.partition.partition, fetch_offset=x.step_to,
                partition_max_bytes=x.partition.partition_max_bytes))
        request = F(version=OLD_STEP_FETCH_VERSION, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=(1 << 31) - 1,
                    isolation_level=0, topics=[F.FetchTopic(version=OLD_STEP_FETCH_VERSION, topic=name, partitions=ps)
                                               for name, ps in topics.items()])
        request.with_header(correlation_id=0, client_id=client_id)
        raw = await upstream.call(bytes(request.encode(version=OLD_STEP_FETCH_VERSION, header=True)), "Fetch")
        response = decode_response(FetchResponse, OLD_STEP_FETCH_VERSION, raw,
                                   FETCH.response_header_version(OLD_STEP_FETCH_VERSION))
        answers = {(t.topic, p.partition_index): p for t in response.responses for p in t.partitions}
        for x in moved:
            answer = answers.get((x.name, x.partition.partition))
            if answer is None or answer.error_code != NONE:
                continue  # (retention moved again, say): the client asks again and is routed afresh
            x.high_watermark, x.last_stable_offset = answer.high_watermark, answer.last_stable_offset
            assert x.step_to is not None
            try:
                x.records = [await trio.to_thread.run_sync(for_fetch_version, bytes(answer.records or b""), version,
                                                           x.partition.partition_max_bytes, x.step_to)]
            except LegacyConversionError as exc:
                log.warning("topic %s partition %d: the broker's records at %d cannot be converted for Fetch v%d:"
                            " %s", x.name, x.partition.partition, x.step_to, version, exc)

    def _response(self, header: RequestHeader, version: int, hot: Any, hot_topics: list[Any],
                  plan: _Plan) -> Spliced:
        P = FetchResponse.FetchableTopicResponse.PartitionData
        splice = Splice()
        response = hot if hot is not None else FetchResponse(version=version, throttle_time_ms=0, error_code=NONE,
                                                            session_id=0, responses=[])
        by_key = {_key(t): t for t in response.responses}
        for topic in response.responses:  # the broker's records, spliced too (never copied twice)
            for p in topic.partitions:
                if p.records:
                    p.records = splice.placeholder([p.records])
        for local in plan.local:
            key = _key(local.topic)
            entry = by_key.get(key)
            if entry is None:
                entry = FetchResponse.FetchableTopicResponse(version=version, partitions=[])
                if version >= TOPIC_IDS_FROM:
                    entry.topic_id = local.topic.topic_id
                else:
                    entry.topic = local.topic.topic
                response.responses.append(entry)
                by_key[key] = entry
            entry.partitions.append(P(
                version=version, partition_index=local.partition.partition, error_code=local.error,
                high_watermark=local.high_watermark, last_stable_offset=local.last_stable_offset,
                log_start_offset=local.log_start_offset, aborted_transactions=[] if version >= 4 else None,
                preferred_read_replica=-1, records=splice.placeholder(local.records) if local.records else b""))
        if hot is not None:
            _fill_omitted(response, version, hot_topics, by_key)
        response.session_id = 0
        if version >= 16:
            response.node_endpoints = []  # a spliced response names no broker (clients look leaders up again)
        head = encode_response_header(header.correlation_id, FETCH.response_header_version(version))
        return Spliced(splice.encode(response, version, FETCH.is_flexible(version), head))


@dataclass
class _PartitionOf:
    """A partition the broker answered out of range, standing in for the request's partition entry."""

    partition: int
    fetch_offset: int
    partition_max_bytes: int = RECOVERY_READ_BYTES


class _TopicOf:
    """A response topic entry standing in for the request's (same name or id)."""

    def __init__(self, topic: Any, version: int) -> None:
        if version >= TOPIC_IDS_FROM:
            self.topic_id = topic.topic_id
        else:
            self.topic = topic.topic


def _step(offset: int, to: int, version: int) -> list[bytes]:
    """The records of a step from ``offset`` to ``to``: control batches spanning the offsets between, each at
    most CONTROL_BATCH_SPAN offsets, at most STEP_BATCHES of them (a wider step goes on at the next fetch).
    Fetch v0-v3 cannot carry them: see :meth:`FetchHandler._forward_old_steps`."""
    if version < LEGACY_BELOW:
        return []
    starts = range(offset, min(to, offset + STEP_BATCHES * CONTROL_BATCH_SPAN), CONTROL_BATCH_SPAN)
    return [encode_control_batch(start, min(start + CONTROL_BATCH_SPAN, to) - 1) for start in starts]


def _key(topic: Any) -> Any:
    return getattr(topic, "topic_id", None) or getattr(topic, "topic", None)


def _fill_omitted(response: Any, version: int, hot_topics: list[Any], by_key: dict[Any, Any]) -> None:
    """Every partition of a sessionless fetch must be in its response.  A broker that leaves one out (tansu
    answers a max_wait_ms=0 fetch, which ksi sends for the hot half of a split fetch, with no partitions at
    all) would make the merged response invalid: kafka-python rejects such a full fetch response whole and
    stalls.  An omitted partition gets an empty answer: fetched again next."""
    P = FetchResponse.FetchableTopicResponse.PartitionData
    for topic in hot_topics:
        key = _key(topic)
        entry = by_key.get(key)
        present = {p.partition_index for p in entry.partitions} if entry is not None else set()
        for p in topic.partitions:
            if p.partition in present:
                continue
            if entry is None:
                entry = FetchResponse.FetchableTopicResponse(version=version, partitions=[])
                if version >= TOPIC_IDS_FROM:
                    entry.topic_id = topic.topic_id
                else:
                    entry.topic = topic.topic
                response.responses.append(entry)
                by_key[key] = entry
            entry.partitions.append(P(
                version=version, partition_index=p.partition, error_code=NONE, high_watermark=-1,
                last_stable_offset=-1, log_start_offset=-1, aborted_transactions=[] if version >= 4 else None,
                preferred_read_replica=-1, records=b""))
