"""FetchHandler (ksi/history/fetch.py) planning, called directly: a real History over a real SqlCatalog table,
the fake broker answering on the client's connection (ProbeSession).  The lake holds offsets 0..9 of
partition 0 of topic ``t``; what the broker says its log holds decides each case: cold (served from the lake
up to the log start, nothing forwarded) and a refusal (the broker's verdict, with no data).  (The fake broker
answers no full Fetch, so the hot and mixed cases are tested over real brokers: tests/integration.)"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.record import MemoryRecords

from ksi.filters.api import Spliced
from ksi.history.fetch import FetchHandler
from ksi.history.lake_only import LakeOnlyTopics
from ksi.history.service import History
from ksi.history.topic_ids import TopicIds
from protocol import parse_request_header
from protocol.errors import TOPIC_AUTHORIZATION_FAILED

from ..test_connection import MemoryBroker, ProbeSession

FETCH, LIST_OFFSETS = 1, 2


def fetch_request(offset: int, version: int = 12) -> tuple[Any, bytes]:
    T = FetchRequest.FetchTopic
    request = FetchRequest(version=version, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                               version=version, topic="t", partitions=[T.FetchPartition(
                                   version=version, partition=0, current_leader_epoch=-1, fetch_offset=offset,
                                   last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])],
                           forgotten_topics_data=[], rack_id="")
    request.with_header(correlation_id=7, client_id="unit")
    payload = bytes(request.encode(version=version, header=True))
    return parse_request_header(payload), payload


async def answer(history: History, session: ProbeSession, offset: int) -> Any:
    handler = FetchHandler(history, TopicIds(), LakeOnlyTopics(history, lambda name, topic_id: None))
    header, payload = fetch_request(offset)
    raw = await handler(header, payload, session, "unit")
    assert isinstance(raw, Spliced)
    data = b"".join(bytes(part) for part in raw)
    [topic] = FetchResponse.decode(data[5:], version=12).responses  # correlation id, header tagged fields
    [partition] = topic.partitions
    return partition


def offsets(records: bytes) -> list[int]:
    batches, out = MemoryRecords(bytes(records)), []
    while (batch := batches.next_batch()) is not None:
        out += [record.offset for record in batch]
    return out


async def test_cold_offsets_are_served_from_the_lake_up_to_the_log_start(history: History) -> None:
    broker = MemoryBroker()
    broker.cluster.topics, broker.cluster.offsets["t"] = ["t"], (6, 20)
    session = ProbeSession(broker)
    partition = await answer(history, session, 2)
    assert partition.error_code == 0
    assert (partition.high_watermark, partition.log_start_offset) == (20, 0)  # the broker's end, the lake's start
    assert offsets(partition.records) == [0, 1, 2, 3, 4, 5]  # the batch holding 2, to the log start
    # asked: the watermarks (EARLIEST, LATEST) and the READ probe (a Fetch v4); the client's Fetch not forwarded
    assert session.asked == [LIST_OFFSETS, LIST_OFFSETS, FETCH]


async def test_a_partition_the_broker_refuses_gets_its_verdict_and_no_data(history: History) -> None:
    broker = MemoryBroker()
    broker.cluster.topics, broker.cluster.offsets["t"] = ["t"], (6, 20)
    broker.cluster.deny_read["t"] = TOPIC_AUTHORIZATION_FAILED
    partition = await answer(history, ProbeSession(broker), 2)
    assert (partition.error_code, partition.records) == (TOPIC_AUTHORIZATION_FAILED, b"")
