"""The Fetch response scanner against kafka-python's encoder (Kafka's own schema), every version it encodes."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse

from protocol import MalformedFrame, encode_body
from protocol.fetch_scan import scan_fetch_response

VERSIONS = list(range(4, 18 + 1))
P = FetchResponse.FetchableTopicResponse.PartitionData


def response(version: int, topics: list[tuple[str, list[tuple[int, int, bytes | None, int]]]],
             node_endpoints: bool = False) -> FetchResponse:
    entries = []
    for name, partitions in topics:
        topic = FetchResponse.FetchableTopicResponse(version=version, partitions=[])
        if version >= 13:
            topic.topic_id = uuid.uuid5(uuid.NAMESPACE_DNS, name)
        else:
            topic.topic = name
        for index, error, records, aborted in partitions:
            p = P(version=version, partition_index=index, error_code=error, high_watermark=1000 + index,
                  last_stable_offset=900, log_start_offset=5, preferred_read_replica=-1, records=records,
                  aborted_transactions=[P.AbortedTransaction(version=version, producer_id=7, first_offset=3)
                                        for _ in range(aborted)])
            topic.partitions.append(p)
        entries.append(topic)
    message = FetchResponse(version=version, throttle_time_ms=0, error_code=0, session_id=1234, responses=entries)
    if node_endpoints and version >= 16:
        message.node_endpoints = [FetchResponse.NodeEndpoint(version=version, node_id=1, host="broker", port=9092,
                                                             rack=None)]
    return message


@pytest.mark.parametrize("version", VERSIONS)
def test_layout_matches_the_codec(version: int) -> None:
    topics = [("orders", [(0, 0, b"abc" * 50, 0), (3, 1, None, 2)]), ("t2", [(1, 0, b"", 1)])]
    body = encode_body(response(version, topics, node_endpoints=True), version)
    layout = scan_fetch_response(body, version)
    got = [(p.partition_index, p.error_code, p.high_watermark, p.records_size) for p in layout.partitions]
    assert got == [(0, 0, 1000, 150), (3, 1, 1003, -1), (1, 0, 1001, 0)]
    first = layout.partitions[0]
    assert bytes(body[first.records_start:first.records_start + first.records_size]) == b"abc" * 50
    assert layout.node_endpoints == (version >= 16)
    if version >= 7:
        assert int.from_bytes(body[layout.session_id_at:layout.session_id_at + 4], "big") == 1234
    assert layout.partitions[-1].end <= layout.tagged_at <= len(body)


# Responses' topics: (name, [(partition, error code, records or None, aborted transactions)])
TOPICS = st.lists(st.tuples(st.text(min_size=1, max_size=8),
                            st.lists(st.tuples(st.integers(0, 99), st.integers(0, 80),
                                               st.one_of(st.none(), st.binary(max_size=300)),
                                               st.integers(0, 3)), max_size=4)), max_size=4)


@settings(max_examples=60, deadline=None)
@given(version=st.sampled_from(VERSIONS), topics=TOPICS, endpoints=st.booleans())
def test_any_response_scans_and_every_cut_is_refused(version: int, topics: list, endpoints: bool) -> None:
    body = encode_body(response(version, topics, endpoints), version)
    layout = scan_fetch_response(body, version)
    assert [(p.partition_index, p.error_code) for p in layout.partitions] == \
        [(i, e) for _, ps in topics for i, e, _, _ in ps]
    for p, (_, _, records, _) in zip(layout.partitions, [x for _, ps in topics for x in ps], strict=True):
        assert (p.records_size == -1) if records is None else bytes(body[p.records_start:p.records_start
                                                                         + p.records_size]) == records
    for cut in range(len(body) - 1, max(len(body) - 40, -1), -1):
        with pytest.raises(MalformedFrame):
            scan_fetch_response(body[:cut], version)
    with pytest.raises(MalformedFrame):
        scan_fetch_response(body + b"\x00", version)


@pytest.mark.parametrize("version", [16, 17, 18])
def test_node_endpoints_are_read_and_replaced_without_touching_the_rest(version: int) -> None:
    from protocol.fetch_scan import NodeEndpoint, fetch_node_endpoints, with_node_endpoints

    message = response(version, [("orders", [(0, 0, b"records" * 40, 1), (1, 6, None, 0)])])
    message.node_endpoints = [
        FetchResponse.NodeEndpoint(version=version, node_id=2, host="kafka-2.internal", port=9092, rack="r1"),
        FetchResponse.NodeEndpoint(version=version, node_id=3, host="kafka-3.internal", port=9093, rack=None)]
    body = encode_body(message, version)
    layout = scan_fetch_response(body, version)
    found = fetch_node_endpoints(body, layout)
    assert [(e.node_id, e.host, e.port, e.rack) for e in found] == [(2, "kafka-2.internal", 9092, "r1"),
                                                                     (3, "kafka-3.internal", 9093, None)]
    replaced = with_node_endpoints(body, layout, [NodeEndpoint(e.node_id, f"proxy-{e.node_id}", 7000 + e.node_id,
                                                               e.rack, e.tagged) for e in found])
    assert replaced[:layout.tagged_at] == body[:layout.tagged_at]  # the partitions and records, byte for byte
    out = FetchResponse.decode(replaced, version=version)
    assert [(e.node_id, e.host, e.port, e.rack) for e in out.node_endpoints] == [(2, "proxy-2", 7002, "r1"),
                                                                                 (3, "proxy-3", 7003, None)]
    assert out.responses[0].partitions[0].records == b"records" * 40 and out.session_id == 1234
    message.node_endpoints = [FetchResponse.NodeEndpoint(version=version, node_id=n.node_id, host=n.host, port=n.port,
                                                         rack=n.rack) for n in out.node_endpoints]
    assert replaced == encode_body(message, version)  # what the codec itself writes
    without = encode_body(response(version, [("orders", [(0, 0, b"x", 0)])]), version)
    assert fetch_node_endpoints(without, scan_fetch_response(without, version)) == ()
    for cut in range(layout.tagged_at + 1, len(body)):
        with pytest.raises(MalformedFrame):
            scan_fetch_response(body[:cut], version)


@settings(max_examples=60, deadline=None)
@given(version=st.sampled_from(VERSIONS),
       topics=st.lists(st.tuples(st.text(min_size=1, max_size=8),
                                 st.lists(st.tuples(st.integers(0, 99), st.integers(0, 80),
                                                    st.one_of(st.none(), st.binary(max_size=300)),
                                                    st.integers(0, 3)), min_size=1, max_size=3)),
                       min_size=1, max_size=3),
       endpoints=st.booleans())
def test_a_head_scan_sees_every_partition_when_the_cut_is_in_the_last_records(version: int, topics: list,
                                                                              endpoints: bool) -> None:
    """A response's first bytes (the relay splices the rest on unread): every partition's error code when the
    cut is inside the last partition's records, else MalformedFrame (the caller reads it whole)."""
    body = encode_body(response(version, topics, endpoints), version)
    whole = scan_fetch_response(body, version)
    last = whole.partitions[-1]
    expected = [(p.topic, p.partition_index, p.error_code, p.records_start, p.records_size) for p in whole.partitions]
    for cut in range(len(body)):
        inside = last.records_size > 0 and last.records_start <= cut < last.records_start + last.records_size
        if not inside:
            with pytest.raises(MalformedFrame):
                scan_fetch_response(body[:cut], version, whole_size=len(body))
            continue
        head = scan_fetch_response(body[:cut], version, whole_size=len(body))
        assert [(p.topic, p.partition_index, p.error_code, p.records_start, p.records_size)
                for p in head.partitions] == expected
        assert head.tagged_at == -1 and head.partitions[-1].end == -1
        only = scan_fetch_response(body[:cut], version, error_code=7, whole_size=len(body))
        assert [p.partition_index for p in only.partitions] == [p.partition_index for p in whole.partitions
                                                                if p.error_code == 7]
