"""LakeOnlyTopics (ksi/history/lake_only.py), called directly on a real History whose topic ``t`` (offsets
0..9 of partition 0 in the lake) is made lake-only: the frames that name it, by name or by topic id, and a
Produce split between the refused lake-only part and the part for the broker."""

from __future__ import annotations

import uuid
from typing import Any

from kafka.protocol.consumer import FetchRequest
from kafka.protocol.producer import ProduceRequest

from ksi.history.lake_only import LakeOnlyTopics, lake_topic_id
from ksi.history.service import History
from protocol import parse_request_header


def encoded(request: Any, version: int) -> bytes:
    request.with_header(correlation_id=7, client_id="unit")
    return bytes(request.encode(version=version, header=True))


def fetch_by_id(topic_id: uuid.UUID) -> bytes:
    T = FetchRequest.FetchTopic
    return encoded(FetchRequest(version=13, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                                isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                                    version=13, topic_id=topic_id, partitions=[T.FetchPartition(
                                        version=13, partition=0, current_leader_epoch=-1, fetch_offset=0,
                                        last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])],
                                forgotten_topics_data=[], rack_id=""), 13)


async def test_a_frame_names_a_lake_only_topic_by_name_or_by_id(history: History) -> None:
    learnt: list[tuple[str | None, uuid.UUID | None]] = []
    topics = LakeOnlyTopics(history, lambda name, topic_id: learnt.append((name, topic_id)))
    assert not topics.named_in(fetch_by_id(lake_topic_id("t")))  # t exists in Kafka: not lake-only
    history.set_upstream_topics(set())  # now it does not
    assert topics.names == {"t"}
    assert topics.named_in(fetch_by_id(lake_topic_id("t")))  # (a cheap pre-check: a frame that merely holds
    # the name's bytes says yes too, and the filter then decodes it; no lake-only topic at all says no)
    assert lake_topic_id("t") == lake_topic_id("t") != lake_topic_id("u")  # stable, and per name


async def test_a_produce_is_split_between_the_lake_only_part_and_the_brokers(history: History) -> None:
    history.set_upstream_topics(set())
    topics = LakeOnlyTopics(history, lambda name, topic_id: None)
    T = ProduceRequest.TopicProduceData
    for version in (9, 13):
        def entry(name: str, version: int = version) -> Any:
            data = T(version=version, partition_data=[T.PartitionProduceData(version=version, index=0, records=b"")])
            if version >= 13:
                data.topic_id = lake_topic_id(name)
            else:
                data.name = name
            return data

        payload = encoded(ProduceRequest(version=version, transactional_id=None, acks=1, timeout_ms=100,
                                         topic_data=[entry("t"), entry("hot")]), version)
        _, refused, forward = topics.split_produce(parse_request_header(payload), payload)
        assert len(refused) == 1 and forward is not None
        left = ProduceRequest.decode(forward[parse_request_header(forward).body_offset:], version=version)
        assert [(t.topic_id if version >= 13 else t.name) for t in left.topic_data] == [
            lake_topic_id("hot") if version >= 13 else "hot"]
        payload = encoded(ProduceRequest(version=version, transactional_id=None, acks=1, timeout_ms=100,
                                         topic_data=[entry("t")]), version)
        assert topics.split_produce(parse_request_header(payload), payload)[2] is None  # nothing for the broker
