"""The Fetch request scanner against kafka-python's encoder (Kafka's own schema), every version it scans."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest

from protocol import MalformedFrame, decode_body, encode_body
from protocol.fetch_request_scan import patch_sessionless, scan_fetch_request

VERSIONS = list(range(4, 18 + 1))
T = FetchRequest.FetchTopic
P = T.FetchPartition


def key(name: str, version: int) -> str | uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_DNS, name) if version >= 13 else name


def request(version: int, topics: list[tuple[str, list[tuple[int, int]]]], session: tuple[int, int] = (0, -1),
            forgotten: list[tuple[str, list[int]]] | None = None) -> FetchRequest:
    entries = []
    for name, partitions in topics:
        topic = T(version=version, partitions=[P(version=version, partition=index, current_leader_epoch=3,
                                                 fetch_offset=offset, last_fetched_epoch=2, log_start_offset=-1,
                                                 partition_max_bytes=1 << 20) for index, offset in partitions])
        if version >= 13:
            topic.topic_id = key(name, version)
        else:
            topic.topic = name
        entries.append(topic)
    gone = []
    for name, partitions in forgotten or []:
        entry = FetchRequest.ForgottenTopic(version=version, partitions=partitions)
        if version >= 13:
            entry.topic_id = key(name, version)
        else:
            entry.topic = name
        gone.append(entry)
    return FetchRequest(version=version, replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=50 << 20,
                        isolation_level=1, session_id=session[0], session_epoch=session[1], topics=entries,
                        forgotten_topics_data=gone, rack_id="rack-a")


@pytest.mark.parametrize("version", VERSIONS)
def test_partitions_and_offsets_match_the_codec(version: int) -> None:
    topics = [("orders", [(0, 12), (3, 2**40)]), ("t2", [(1, 0)]), ("empty", [])]
    scan = scan_fetch_request(encode_body(request(version, topics), version), version)
    assert scan.topics == tuple((key(n, version), tuple(ps)) for n, ps in topics)
    assert scan.sessionless and scan.forgotten == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_session_fields_are_read_and_patched_in_place(version: int) -> None:
    message = request(version, [("orders", [(0, 5)])], session=(77, 4),
                      forgotten=[("old", [1, 2])] if version >= 7 else None)
    body = bytearray(encode_body(message, version))
    scan = scan_fetch_request(body, version)
    if version < 7:  # no sessions before v7
        assert (scan.session_id, scan.session_epoch, scan.session_at, scan.sessionless) == (0, -1, -1, True)
        return
    assert (scan.session_id, scan.session_epoch, scan.forgotten, scan.sessionless) == (77, 4, 1, False)
    with pytest.raises(ValueError):
        patch_sessionless(body, scan)  # an incremental session's request is not a full fetch
    body = bytearray(encode_body(request(version, [("orders", [(0, 5)])], session=(0, 0)), version))
    scan = scan_fetch_request(body, version)
    assert (scan.session_id, scan.session_epoch, scan.sessionless) == (0, 0, False)
    patch_sessionless(memoryview(body), scan)
    decoded = decode_body(FetchRequest, version, bytes(body))
    assert (decoded.session_id, decoded.session_epoch) == (0, -1)
    assert decoded.topics[0].partitions[0].fetch_offset == 5 and decoded.rack_id == ("rack-a" if version >= 11 else "")


@pytest.mark.parametrize("version", [4, 12, 13, 18])
def test_truncated_or_trailing_bytes_are_malformed(version: int) -> None:
    body = encode_body(request(version, [("orders", [(0, 5), (1, 6)])]), version)
    for cut in range(len(body)):
        with pytest.raises(MalformedFrame):
            scan_fetch_request(body[:cut], version)
    with pytest.raises(MalformedFrame):
        scan_fetch_request(body + b"\x00", version)


@settings(max_examples=60, deadline=None)
@given(version=st.sampled_from(VERSIONS),
       topics=st.lists(st.tuples(st.text(min_size=1, max_size=8),
                                 st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(-2, 2**62)), max_size=5)),
                       max_size=4))
def test_any_request_scans_as_the_codec_encodes_it(version: int,
                                                   topics: list[tuple[str, list[tuple[int, int]]]]) -> None:
    scan = scan_fetch_request(memoryview(encode_body(request(version, topics), version)), version)
    assert scan.topics == tuple((key(n, version), tuple(ps)) for n, ps in topics)
