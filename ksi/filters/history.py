"""History: Fetch and ListOffsets (v1+) are answered by the history router (ksi/history/routing.py) when their
turn comes, one at a time per connection: the lake below the hot watermark, the broker above it. A hot Fetch
is decided here, in the task that read it, without the router: the request is scanned, not decoded
(:func:`protocol.fetch_request_scan.scan_fetch_request`), and when no partition of a configured topic is
below the highest log start a connection has learnt for it, nor at an offset the lake holds (by the lake's
offset ranges as last read, the router's own first test) unless that log start is known to be at or below it
and the topic does not prefer the lake (the broker holds it too: a replay of a range both hold, or a consumer
at the tail of a topic archived continuously), it goes on as its bytes. A Fetch that names a configured
topic is made sessionless in place (KIP-227 session id 0, epoch -1: fixed-width fields), as the router makes
the Fetches it forwards; one that names none keeps its fetch session, and its response is not looked at. The
response to one that names a configured topic is scanned for OFFSET_OUT_OF_RANGE (retention moved the log
start while the consumer read): a configured topic's partition answered so hands the request to the router
(:class:`Defer`), which routes it again with fresh watermarks; any other response goes back as its bytes.

Fetch v0-v3 (and a Fetch that names a configured topic by an id not learnt yet, a lake-only topic, or
forgotten topics of an incremental session) goes to the router as before: before v4 the frame is searched
for each configured topic's name.  ListOffsets is always the router's: it is rare.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kafka.protocol.api_key import ApiKey

from protocol.errors import KAFKA_STORAGE_ERROR, OFFSET_OUT_OF_RANGE, MalformedFrame
from protocol.fetch_request_scan import patch_sessionless, scan_fetch_request
from protocol.fetch_scan import scan_fetch_response
from protocol.fetch_walk import Walk, first_records_size, walk_fetch_response

from .api import Action, Defer, Filter, Forward, Request, Response, Session, Spliced

if TYPE_CHECKING:
    from protocol import RequestHeader

    from ..history.routing import HistoryRouter
    from ..history.watermarks import Upstream

__all__ = ["HistoryFilter"]

FETCH_TOPIC_IDS = 13  # Fetch v13+ names topics by id
FETCH_SCANNED = 4     # Fetch v4+ is scanned for the fast path
FETCH_NODE_ENDPOINTS = 16  # Fetch v16+ responses may name brokers: read whole, the address filter rewrites them
WALK_FROM_BYTES = 64 * 1024  # a response is walked when its first partition's records are at least this large


class HistoryFilter(Filter):
    name = "history"
    defers_responses = True

    def __init__(self, router: HistoryRouter) -> None:
        self.router = router
        self._fetch = Defer(self._route_fetch)
        self._fetch_again = Defer(router.fetch)
        self._list_offsets = Defer(router.list_offsets)
        self._names = tuple(t.name for t in router.history.config.topics)
        self._name_bytes = tuple(name.encode() for name in self._names)

    def wants_request(self, api_key: int, api_version: int) -> bool:
        return api_key == ApiKey.Fetch or (api_key == ApiKey.ListOffsets and api_version >= 1)

    def wants_response(self, api_key: int, api_version: int) -> bool:
        return api_key == ApiKey.Fetch and api_version >= FETCH_SCANNED

    def on_request(self, request: Request, session: Session) -> Action | None:
        if request.header.api_key != ApiKey.Fetch:
            return self._list_offsets
        if request.header.api_version < FETCH_SCANNED:
            return self._fetch if self._names_history(request) else None
        return self._fetch if self._needs_router(request) else None

    async def on_response(self, response: Response, session: Session) -> Defer | None:
        """A forwarded Fetch's response: the router's when the broker answered a configured topic's partition
        OFFSET_OUT_OF_RANGE, else its bytes as they are.  Only a Fetch that named a configured topic is
        scanned (the others' requests were not noted)."""
        request = response.request
        if not response.from_broker or request is None or not request.notes or self.name not in request.notes:
            return None
        version = response.header.api_version
        layout = scan_fetch_response(response.body, version, OFFSET_OUT_OF_RANGE)
        for partition in layout.partitions:
            name = self._topic_name(partition.topic, version)
            if name is not None and self.router.history.config_for(name) is not None:
                return self._fetch_again  # answered by the router, which recovers it (never handed back)
        return None

    async def _route_fetch(self, header: RequestHeader, frame: bytes | memoryview, upstream: Upstream,
                           client: str) -> bytes | memoryview | Spliced | Forward:
        """A Fetch for the router: answered by it, or handed back (the broker answers all of it, as it turned
        out once the router had learnt the log starts) and forwarded, its response scanned by :meth:`on_response`
        and relayed unread when :meth:`relays_unread` lets it."""
        answer = await self.router.fetch(header, frame, upstream, client,
                                         hand_back=header.api_version >= FETCH_SCANNED)
        if isinstance(answer, Forward):
            return Forward(answer.frame, {self.name: True})
        return answer

    def relays_unread(self, response: Response, rest: int) -> bool:
        """A large Fetch response read only up to its last partition's records: the same test as
        :meth:`on_response`, on the partitions before them and the last one's fields (every error code is
        there), so that the records may be spliced on unread."""
        request = response.request
        if not response.from_broker or request is None or not request.notes or self.name not in request.notes:
            return True
        version = response.header.api_version
        body = response.body
        try:
            layout = scan_fetch_response(body, version, OFFSET_OUT_OF_RANGE, whole_size=len(body) + rest)
        except MalformedFrame:
            return False  # not that shape: read whole (and checked whole)
        for partition in layout.partitions:
            name = self._topic_name(partition.topic, version)
            if name is not None and self.router.history.config_for(name) is not None:
                return False
        return True

    def walks_unread(self, response: Response, rest: int) -> Walk | None:
        """A large Fetch response (v4-v15) whose head does not reach its last partition's fields: relayed in
        segments as it arrives (ksi.relay), each partition's fields looked at before they go on.  A
        configured topic's partition answered OFFSET_OUT_OF_RANGE cannot be handed to the router any more (the
        partitions before it are on their way): it goes on as KAFKA_STORAGE_ERROR, retriable, and the partition's
        next Fetch is the router's (History.out_of_range_relayed)."""
        version = response.header.api_version
        if not FETCH_SCANNED <= version < FETCH_NODE_ENDPOINTS:
            return None
        out_of_range: list[int] = []

        def seen(topic: str | uuid.UUID, partition: int, error_code: int) -> None:
            if self._out_of_range(topic, error_code) is not None:
                out_of_range.append(partition)

        first = first_records_size(response.frame, version, response.offset, seen)
        if out_of_range:
            return None  # in the head, while the router can still have the whole response: read whole
        if first is None or first < WALK_FROM_BYTES:
            return None  # many small partitions, most likely: read whole, one scan (cheaper than a walk)
        return walk_fetch_response(version, response.offset, self._relayed_error)

    def _out_of_range(self, topic: str | uuid.UUID, error_code: int) -> str | None:
        """The configured topic's name when a partition of ``topic`` (a name, or an id: Fetch v13+) is answered
        OFFSET_OUT_OF_RANGE; else None."""
        if error_code != OFFSET_OUT_OF_RANGE:
            return None
        name = self._topic_name(topic, FETCH_TOPIC_IDS if isinstance(topic, uuid.UUID) else FETCH_SCANNED)
        return name if name is not None and self.router.history.config_for(name) is not None else None

    def _relayed_error(self, topic: str | uuid.UUID, partition: int, error_code: int) -> int | None:
        name = self._out_of_range(topic, error_code)
        if name is None:
            return None
        self.router.history.out_of_range_relayed(name, partition)
        return KAFKA_STORAGE_ERROR

    def _topic_name(self, key: Any, version: int) -> str | None:
        return key if version < FETCH_TOPIC_IDS else self.router.topic_ids.name(key)

    def _needs_router(self, request: Request) -> bool:
        """Whether the router must see this Fetch (v4+); if not, it is forwarded, made sessionless in place
        when it names a configured topic."""
        header = request.header
        version = header.api_version
        assert header.body_offset is not None
        body = memoryview(request.frame)[header.body_offset:]
        scan = scan_fetch_request(body, version)
        history = self.router.history
        named = False
        for key, partitions in scan.topics:
            name = self._topic_name(key, version)
            if name is None:
                if self._unknown_ids():
                    return True  # it may be a configured topic's: the router looks
                continue
            config = history.config_for(name)
            if config is None:
                continue
            named = True
            if name in history.lake_only:
                return True
            ranges = history.fresh_ranges(name)
            if ranges is None or (not ranges and history.unavailable(name) is not None):
                return True  # the router refreshes the ranges, or answers that the lake cannot say
            for partition, offset in partitions:
                if history.partition_unavailable(name, partition) is not None or history.routes_next(name, partition):
                    return True
                lake = ranges.get(partition)
                if lake is None:
                    continue
                log_start = history.log_start(name, partition)
                # Below the log start a connection learnt: a hole or a gap at the seam, which the router steps
                # over or reports, as the broker's OFFSET_OUT_OF_RANGE would make it.  In the lake: the
                # router's, unless the broker holds it too (at or above that log start; the topic not
                # preferring the lake), which seam.decide answers HOT: a log start that moved past it
                # meanwhile comes back OFFSET_OUT_OF_RANGE, handed to the router (on_response).
                if offset < log_start or (lake.first <= offset <= lake.last and (config.prefer_lake or log_start < 0)):
                    return True
        if not named:
            return False
        request.notes = {self.name: True}  # on_response scans its response for OFFSET_OUT_OF_RANGE
        if scan.sessionless:
            return False
        if scan.forgotten:
            return True  # an incremental session's request: the router forwards it sessionless, decoded
        if body.readonly:
            frame = bytearray(request.frame)
            patch_sessionless(memoryview(frame)[header.body_offset:], scan)
            request.replace(bytes(frame))
        else:
            patch_sessionless(body, scan)
        return False

    def _unknown_ids(self) -> bool:
        ids = self.router.topic_ids
        return any(ids.id_of(name) is None for name in self._names)

    def _names_history(self, request: Request) -> bool:
        """Fetch v0-v3: whether a configured topic's name is in the frame (a false match costs the router's
        look)."""
        frame = bytes(request.frame)
        return any(name in frame for name in self._name_bytes)
