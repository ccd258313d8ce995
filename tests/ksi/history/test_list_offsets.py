"""ListOffsetsHandler (ksi/history/list_offsets.py), called directly: a real History (the lake holds offsets
0..9 of ``t``), the fake broker answering on the client's connection with its log from offset 6 to 20."""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

from ksi.history.lake_only import LakeOnlyTopics
from ksi.history.list_offsets import ListOffsetsHandler
from ksi.history.service import History
from ksi.history.watermarks import EARLIEST, LATEST
from protocol import parse_request_header

from ..test_connection import MemoryBroker, ProbeSession
from .conftest import LAKE_TIMESTAMP_MS

VERSION = 2


async def list_offsets(history: History, timestamp: int, log: tuple[int, int] = (6, 20)) -> tuple[int, int, int]:
    broker = MemoryBroker()
    broker.cluster.topics, broker.cluster.offsets["t"] = ["t"], log
    handler = ListOffsetsHandler(history, LakeOnlyTopics(history, lambda name, topic_id: None))
    T = ListOffsetsRequest.ListOffsetsTopic
    request: Any = ListOffsetsRequest(version=VERSION, replica_id=-1, isolation_level=0, topics=[T(
        version=VERSION, name="t", partitions=[T.ListOffsetsPartition(version=VERSION, partition_index=0,
                                                                      timestamp=timestamp)])])
    request.with_header(correlation_id=7, client_id="unit")
    payload = bytes(request.encode(version=VERSION, header=True))
    raw = await handler(parse_request_header(payload), payload, ProbeSession(broker), "unit")
    [topic] = ListOffsetsResponse.decode(bytes(raw)[4:], version=VERSION).topics
    [p] = topic.partitions
    return p.error_code, p.offset, p.timestamp


async def test_earliest_is_the_lakes_first_offset_below_the_log_start(history: History) -> None:
    assert (await list_offsets(history, EARLIEST))[:2] == (0, 0)


async def test_latest_passes_through(history: History) -> None:
    assert (await list_offsets(history, LATEST))[:2] == (0, 20)


async def test_a_timestamp_below_the_log_is_found_in_the_lake(history: History) -> None:
    # the fake broker answers any timestamp with its log end (20); the lake's first record at or after the
    # time is offset 0
    assert await list_offsets(history, LAKE_TIMESTAMP_MS) == (0, 0, LAKE_TIMESTAMP_MS)
