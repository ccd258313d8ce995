"""ListOffsets for history topics: the lake answers for the offsets below the hot watermark.

* EARLIEST answers the lake's first offset when the lake starts below the broker's log start.
* A timestamp lookup is answered from the lake when the lake's first offset with a timestamp at or after
  the time is below the broker's answer (Kafka timestamps are not monotonic: the smallest such offset,
  not a binary search).  LATEST passes through (the high watermark, or the last stable offset under
  read_committed: the broker's, on both sides of the seam).
* Lake-only topics: the lake's range is the whole log (LATEST = the lake's last offset + 1).
* The lake unreadable and nothing known of it: EARLIEST and timestamp lookups get KAFKA_STORAGE_ERROR
  (retriable), as the broker's answer would skip history.
"""

from __future__ import annotations

import logging

from kafka.protocol.api_message import ApiMessageData
from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

from protocol import RequestHeader, decode_body, encode_body, encode_response_header, known_api
from protocol.errors import KAFKA_STORAGE_ERROR, NONE, TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION

from ..lake.table import LakeError
from ..upstream import decode_response
from .lake_only import LakeOnlyTopics, lake_only_partitions
from .service import History
from .watermarks import EARLIEST, LATEST, Upstream

__all__ = ["ListOffsetsHandler"]

log = logging.getLogger("ksi.history")

LIST_OFFSETS = known_api(2)


class ListOffsetsHandler:
    def __init__(self, history: History, lake_only: LakeOnlyTopics) -> None:
        self.history = history
        self.lake_only = lake_only

    async def __call__(self, header: RequestHeader, request: bytes | memoryview, upstream: Upstream,
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
                broken = self.history.partition_unavailable(topic.name, p.partition_index) is not None
                if lake is None or broken:
                    if (unknown or broken) and p.error_code == NONE and (timestamp == EARLIEST or timestamp >= 0):
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

    async def _lake_only_offsets(self, topic: ApiMessageData, version: int, allowed: bool) -> ApiMessageData:
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
            elif index >= lake_only_partitions(ranges):
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
