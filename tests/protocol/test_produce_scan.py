"""The Produce response tag scanner against kafka-python's encoder (Kafka's own schema), v9-v13."""

from __future__ import annotations

import uuid

import pytest
from kafka.protocol.producer import ProduceResponse

from protocol import MalformedFrame, encode_body
from protocol.produce_scan import produce_response_tags
from protocol.rewrite import parse_endpoints

VERSIONS = list(range(9, 13 + 1))
R = ProduceResponse
P = R.TopicProduceResponse.PartitionProduceResponse


def response(version: int, node_endpoints: bool, leader: bool) -> ProduceResponse:
    partitions = [P(version=version, index=i, error_code=6 if leader else 0, base_offset=10 * i,
                    log_append_time_ms=-1, log_start_offset=0, error_message="moved" if i else None,
                    record_errors=[P.BatchIndexAndErrorMessage(version=version, batch_index=0,
                                                               batch_index_error_message="bad")] if i else [])
                  for i in range(3)]
    if leader and version >= 10:
        for p in partitions:
            p.current_leader = P.LeaderIdAndEpoch(version=version, leader_id=2, leader_epoch=5)
    topic = R.TopicProduceResponse(version=version, partition_responses=partitions)
    if version >= 13:
        topic.topic_id = uuid.uuid4()
    else:
        topic.name = "orders"
    message = R(version=version, responses=[topic, topic], throttle_time_ms=0)
    if node_endpoints and version >= 10:
        message.node_endpoints = [R.NodeEndpoint(version=version, node_id=2, host="broker-2", port=9092, rack=None)]
    return message


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("leader", [False, True], ids=["no-leader-change", "leader-moved"])
def test_tags_match_the_codec(version: int, leader: bool) -> None:
    with_endpoints = encode_body(response(version, True, leader), version)
    without = encode_body(response(version, False, leader), version)
    assert produce_response_tags(with_endpoints, version) == ((0,) if version >= 10 else ())
    assert produce_response_tags(without, version) == ()
    # the address rewrite decodes only the responses that name brokers
    assert parse_endpoints(0, version, without) is None
    found = parse_endpoints(0, version, with_endpoints)
    assert (found is not None) == (version >= 10)


@pytest.mark.parametrize("version", [9, 10, 13])
def test_truncated_or_trailing_bytes_are_malformed(version: int) -> None:
    body = encode_body(response(version, True, True), version)
    for cut in range(len(body)):
        with pytest.raises(MalformedFrame):
            produce_response_tags(body[:cut], version)
    with pytest.raises(MalformedFrame):
        produce_response_tags(body + b"\x00", version)
