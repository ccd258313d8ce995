from __future__ import annotations

import uuid

import pytest
from kafka.protocol.admin import DescribeClusterResponse
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsResponse, FindCoordinatorResponse, MetadataResponse

from protocol import encode_body, intersect_api_versions, parse_endpoints, unsupported_version_response

PROXY_PORTS = {1: 9193, 2: 9194, 3: 9195}


def proxy_address(node_id: int) -> tuple[str, int]:
    return "proxy.example", PROXY_PORTS[node_id]


def metadata(version: int) -> bytes:
    R = MetadataResponse
    brokers = [R.MetadataResponseBroker(version=version, node_id=n, host=f"kafka-{n}.internal", port=9092, rack="r1")
               for n in (1, 2, 3)]
    topic = R.MetadataResponseTopic(version=version, error_code=0, name="payments", topic_id=uuid.uuid4(),
                                    is_internal=False, partitions=[], authorized_operations=set())
    message = R(version=version, throttle_time_ms=0, brokers=brokers, cluster_id="c", controller_id=2,
                topics=[topic], authorized_operations=set())
    return encode_body(message, version)


@pytest.mark.parametrize("version", [0, 1, 5, 9, 12])
def test_metadata_brokers_become_proxy_listeners(version: int) -> None:
    endpoints = parse_endpoints(3, version, metadata(version))
    assert endpoints is not None
    assert ([(n.node_id, n.host, n.port) for n in endpoints.nodes]
            == [(n, f"kafka-{n}.internal", 9092) for n in (1, 2, 3)])
    rewritten = MetadataResponse.decode(endpoints.encode(proxy_address), version=version)
    assert ([(b.node_id, b.host, b.port) for b in rewritten.brokers]
            == [(n, "proxy.example", PROXY_PORTS[n]) for n in (1, 2, 3)])
    assert rewritten.topics[0].name == "payments"
    assert version == 0 or rewritten.controller_id == 2


def test_unknown_tagged_fields_survive_a_rewrite() -> None:
    version = 12
    body = metadata(version)
    # Append an unknown top-level tagged field (tag 9, 3 bytes): replace the empty tag buffer at the end.
    assert body[-1] == 0
    body = body[:-1] + bytes([1, 9, 3]) + b"xyz"
    endpoints = parse_endpoints(3, version, body)
    assert endpoints is not None
    out = endpoints.encode(proxy_address)
    assert out.endswith(bytes([1, 9, 3]) + b"xyz")
    # and the rest of the message is whole (the tag buffer is encoded into a buffer of its own)
    rewritten = MetadataResponse.decode(out, version=version)
    original = MetadataResponse.decode(body, version=version)
    assert len(out) > len(body) - 40
    assert (rewritten.throttle_time_ms, rewritten.cluster_id, [t.name for t in rewritten.topics]) == \
        (original.throttle_time_ms, original.cluster_id, [t.name for t in original.topics])
    assert [b.node_id for b in rewritten.brokers] == [b.node_id for b in original.brokers]
    assert {b.host for b in rewritten.brokers} == {"proxy.example"}


@pytest.mark.parametrize("version", [0, 1, 3])
def test_find_coordinator_single(version: int) -> None:
    message = FindCoordinatorResponse(version=version, throttle_time_ms=0, error_code=0, error_message=None,
                                      node_id=2, host="kafka-2.internal", port=9092)
    endpoints = parse_endpoints(10, version, encode_body(message, version))
    assert endpoints is not None
    out = FindCoordinatorResponse.decode(endpoints.encode(proxy_address), version=version)
    assert (out.node_id, out.host, out.port) == (2, "proxy.example", 9194)


def test_find_coordinator_error_is_not_rewritten() -> None:
    message = FindCoordinatorResponse(version=3, throttle_time_ms=0, error_code=15, error_message="not available",
                                      node_id=-1, host="", port=-1)
    assert parse_endpoints(10, 3, encode_body(message, 3)) is None


def test_find_coordinator_batched_v4() -> None:
    C = FindCoordinatorResponse.Coordinator
    message = FindCoordinatorResponse(version=4, throttle_time_ms=0, coordinators=[
        C(version=4, key="g1", node_id=3, host="kafka-3.internal", port=9092, error_code=0, error_message=None),
        C(version=4, key="g2", node_id=-1, host="", port=-1, error_code=15, error_message="x"),
    ])
    endpoints = parse_endpoints(10, 4, encode_body(message, 4))
    assert endpoints is not None
    out = FindCoordinatorResponse.decode(endpoints.encode(proxy_address), version=4)
    assert [(c.key, c.host, c.port) for c in out.coordinators] == [("g1", "proxy.example", 9195), ("g2", "", -1)]


def test_describe_cluster() -> None:
    B = DescribeClusterResponse.DescribeClusterBroker
    message = DescribeClusterResponse(version=1, throttle_time_ms=0, error_code=0, error_message=None,
                                      endpoint_type=1, cluster_id="c", controller_id=1,
                                      brokers=[B(version=1, broker_id=1, host="kafka-1.internal", port=9092,
                                                 rack=None)],
                                      authorized_operations=set())
    endpoints = parse_endpoints(60, 1, encode_body(message, 1))
    assert endpoints is not None
    out = DescribeClusterResponse.decode(endpoints.encode(proxy_address), version=1)
    assert (out.brokers[0].host, out.brokers[0].port) == ("proxy.example", 9193)


def fetch_response(version: int, node_endpoints: list | None) -> bytes:
    R = FetchResponse
    part = R.FetchableTopicResponse.PartitionData(version=version, partition_index=0, error_code=6,
                                                  high_watermark=10, last_stable_offset=10, log_start_offset=0,
                                                  aborted_transactions=None, preferred_read_replica=-1,
                                                  records=b"")
    kwargs = {"node_endpoints": node_endpoints} if node_endpoints is not None else {}
    message = R(version=version, throttle_time_ms=0, error_code=0, session_id=0,
                responses=[R.FetchableTopicResponse(version=version, topic_id=uuid.uuid4(), partitions=[part])],
                **kwargs)
    return encode_body(message, version)


def test_fetch_node_endpoints_v16() -> None:
    ep = FetchResponse.NodeEndpoint(version=16, node_id=2, host="kafka-2.internal", port=9092, rack=None)
    endpoints = parse_endpoints(1, 16, fetch_response(16, [ep]))
    assert endpoints is not None
    out = FetchResponse.decode(endpoints.encode(proxy_address), version=16)
    assert [(n.node_id, n.host, n.port) for n in out.node_endpoints] == [(2, "proxy.example", 9194)]


def test_fetch_without_endpoints_or_before_v16_is_left_alone() -> None:
    assert parse_endpoints(1, 16, fetch_response(16, None)) is None
    assert parse_endpoints(1, 15, fetch_response(15, None)) is None


def api_versions(version: int, keys: list[tuple[int, int, int]]) -> bytes:
    V = ApiVersionsResponse.ApiVersion
    message = ApiVersionsResponse(version=version, error_code=0, throttle_time_ms=0,
                                  api_keys=[V(version=version, api_key=k, min_version=lo, max_version=hi)
                                            for k, lo, hi in keys])
    return encode_body(message, version)


@pytest.mark.parametrize("version", [0, 3])
def test_api_versions_intersection(version: int) -> None:
    broker = [(0, 0, 99), (1, 4, 99), (17, 0, 1), (68, 0, 1), (3, 0, 5)]
    out = ApiVersionsResponse.decode(intersect_api_versions(api_versions(version, broker), version), version=version)
    ranges = {k.api_key: (k.min_version, k.max_version) for k in out.api_keys}
    assert ranges[0] == (0, 13)           # capped at what ksi's codec knows
    assert ranges[1] == (4, 18)           # the broker's floor kept
    assert ranges[17] == (1, 1)           # SaslHandshake v0 (raw tokens) is not offered
    assert 68 not in ranges               # unknown to ksi: dropped
    assert ranges[3] == (0, 5)


def test_unsupported_api_versions_answer_is_v0_with_error_35() -> None:
    out = ApiVersionsResponse.decode(unsupported_version_response(), version=0)
    assert out.error_code == 35
    assert [(k.api_key, k.min_version) for k in out.api_keys] == [(18, 0)]
