"""protocol.fetch_client, the archive reader's hand-written messages, against kafka-python's codec: the same
request bytes for every Fetch version it speaks, and the codec's responses read back."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse

from protocol import fetch_client as wire
from protocol.errors import MalformedFrame


def codec(request: object, version: int, correlation_id: int, client_id: str) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id=client_id)  # type: ignore[attr-defined]
    payload = bytes(request.encode(version=version, header=True))  # type: ignore[attr-defined]
    return struct.pack(">i", len(payload)) + payload


@pytest.mark.parametrize("version", range(4, 12))
def test_fetch_requests_are_the_codecs_bytes(version: int) -> None:
    part = {"partition": 3, "fetch_offset": 123456789012, "partition_max_bytes": 8 << 20}
    if version >= 5:
        part["log_start_offset"] = -1
    if version >= 9:
        part["current_leader_epoch"] = -1
    fields = {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 64 << 20, "isolation_level": 1}
    if version >= 7:
        fields.update(session_id=0, session_epoch=-1, forgotten_topics_data=[])
    if version >= 11:
        fields["rack_id"] = ""
    request = FetchRequest(version=version, topics=[FetchRequest.FetchTopic(
        version=version, topic="tópico", partitions=[FetchRequest.FetchTopic.FetchPartition(version=version, **part)])],
        **fields)
    ours = wire.fetch_request(7, "ksi-archive", version, "tópico", 3, 123456789012, max_wait_ms=500, min_bytes=1,
                              max_bytes=64 << 20, partition_max_bytes=8 << 20, isolation_level=1)
    assert ours == codec(request, version, 7, "ksi-archive")


def test_metadata_and_api_versions_requests_are_the_codecs_bytes() -> None:
    request = MetadataRequest(version=4, allow_auto_topic_creation=False,
                              topics=[MetadataRequest.MetadataRequestTopic(version=4, name="orders")])
    assert wire.metadata_request(9, "c", "orders") == codec(request, 4, 9, "c")
    assert wire.api_versions_request(2, "c") == codec(ApiVersionsRequest(version=0), 0, 2, "c")


def test_responses_the_codec_encodes_are_read() -> None:
    versions = ApiVersionsResponse(version=0, error_code=0, api_keys=[
        ApiVersionsResponse.ApiVersion(version=0, api_key=1, min_version=4, max_version=17),
        ApiVersionsResponse.ApiVersion(version=0, api_key=3, min_version=0, max_version=12)])
    assert wire.decode_api_versions(bytes(versions.encode(version=0))) == (0, {1: (4, 17), 3: (0, 12)})
    P = MetadataResponse.MetadataResponseTopic.MetadataResponsePartition
    metadata = MetadataResponse(version=4, throttle_time_ms=0, cluster_id=None, controller_id=2, brokers=[
        MetadataResponse.MetadataResponseBroker(version=4, node_id=1, host="a", port=9092, rack=None),
        MetadataResponse.MetadataResponseBroker(version=4, node_id=2, host="b", port=9093, rack="r1")],
        topics=[MetadataResponse.MetadataResponseTopic(version=4, error_code=0, name=name, is_internal=False,
                                                       partitions=[P(version=4, error_code=0, partition_index=i,
                                                                     leader_id=1 + i % 2, replica_nodes=[1, 2],
                                                                     isr_nodes=[2]) for i in range(3)])
                for name in ("other", "orders")])
    found = wire.decode_metadata(bytes(metadata.encode(version=4)), "orders")
    assert found.brokers == {1: ("a", 9092), 2: ("b", 9093)}
    assert found.topic_error == 0 and found.partitions == {0: (0, 1), 1: (0, 2), 2: (0, 1)}
    assert wire.decode_metadata(bytes(metadata.encode(version=4)), "missing").topic_error is None
    with pytest.raises(MalformedFrame):
        wire.decode_metadata(bytes(metadata.encode(version=4))[:-7], "orders")
