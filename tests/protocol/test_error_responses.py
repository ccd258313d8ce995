"""Errors as answers: Kafka's error response for each API ksi answers itself, every partition or topic of
the request carrying the code (Kafka's ``getErrorResponse``), at every version the codec knows."""

from __future__ import annotations

import uuid

import pytest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from protocol import api, decode_body, encode_body
from protocol.error_responses import ANSWERABLE, error_response
from protocol.errors import KAFKA_STORAGE_ERROR, UNKNOWN_SERVER_ERROR, error_name

TOPIC_ID = uuid.uuid4()


def request(key: int, version: int) -> object:
    if key == 1:
        T = FetchRequest.FetchTopic
        topic = T(version=version, topic="t", partitions=[T.FetchPartition(version=version, partition=p,
                                                                          fetch_offset=5) for p in (0, 2)])
        if version >= 13:
            topic.topic_id = TOPIC_ID
        return FetchRequest(version=version, max_wait_ms=0, min_bytes=1, topics=[topic])
    if key == 2:
        T2 = ListOffsetsRequest.ListOffsetsTopic
        return ListOffsetsRequest(version=version, topics=[T2(version=version, name="t", partitions=[
            T2.ListOffsetsPartition(version=version, partition_index=p, timestamp=-2) for p in (0, 2)])])
    if key == 3:
        topic = MetadataRequest.MetadataRequestTopic(version=version, name="t")
        return MetadataRequest(version=version, topics=[topic])
    if key == 17:
        return SaslHandshakeRequest(version=version, mechanism="PLAIN")
    if key == 18:
        return ApiVersionsRequest(version=version, client_software_name="c", client_software_version="1")
    if key == 36:
        return SaslAuthenticateRequest(version=version, auth_bytes=b"\0u\0p")
    T0 = ProduceRequest.TopicProduceData
    data = T0(version=version, partition_data=[T0.PartitionProduceData(version=version, index=p, records=b"")
                                               for p in (0, 2)])
    if version >= 13:
        data.topic_id = TOPIC_ID
    else:
        data.name = "t"
    return ProduceRequest(version=version, acks=1, timeout_ms=100, topic_data=[data])


@pytest.mark.parametrize("key", sorted(ANSWERABLE))
def test_every_partition_or_topic_carries_the_error(key: int) -> None:
    entry = api(key)
    assert entry is not None
    for version in range(entry.max_version + 1):
        if (key == 1 and version < 4) or (key == 2 and version == 0):
            continue  # versions no broker here serves; the builder covers them, the request helper does not
        message = decode_body(entry.request, version, encode_body(request(key, version), version))
        body = error_response(key, version, message, KAFKA_STORAGE_ERROR, "lake unreadable")
        assert body is not None
        answer = decode_body(entry.response, 0 if key == 18 else version, body)  # ApiVersions errors: v0 bodies
        if key == 1:
            assert version < 7 or answer.error_code == KAFKA_STORAGE_ERROR  # the top-level code is v7+
            codes = [p.error_code for t in answer.responses for p in t.partitions]
            assert codes == ([] if version >= 13 else [KAFKA_STORAGE_ERROR] * 2)  # v13+: top level only
        elif key == 2:
            assert [(p.partition_index, p.error_code) for t in answer.topics for p in t.partitions] == [
                (0, KAFKA_STORAGE_ERROR), (2, KAFKA_STORAGE_ERROR)]
        elif key == 3:
            assert [(t.name, t.error_code) for t in answer.topics] == [("t", KAFKA_STORAGE_ERROR)]
        elif key == 17:
            assert (answer.error_code, answer.mechanisms) == (KAFKA_STORAGE_ERROR, [])
        elif key == 18:
            assert (answer.error_code, answer.api_keys) == (KAFKA_STORAGE_ERROR, [])
        elif key == 36:
            assert (answer.error_code, answer.error_message, answer.auth_bytes) == (
                KAFKA_STORAGE_ERROR, "lake unreadable", b"")
        else:
            [topic] = answer.responses
            assert (topic.topic_id if version >= 13 else topic.name) == (TOPIC_ID if version >= 13 else "t")
            assert [(p.index, p.error_code) for p in topic.partition_responses] == [
                (0, KAFKA_STORAGE_ERROR), (2, KAFKA_STORAGE_ERROR)]
            if version >= 8:
                assert topic.partition_responses[0].error_message == "lake unreadable"


def test_apis_without_an_error_response_say_so() -> None:
    assert error_response(19, 3, object(), UNKNOWN_SERVER_ERROR) is None  # CreateTopics: ksi never handles it
    assert error_name(KAFKA_STORAGE_ERROR) == "KAFKA_STORAGE_ERROR" and error_name(12345) == "error 12345"
