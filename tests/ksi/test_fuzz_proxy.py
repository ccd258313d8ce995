"""Fuzzing the running proxy: random bytes, fuzzed frames for every (api key, version) ksi accepts, and
mutated valid requests (cold and hot Fetches, ListOffsets, Metadata, Produce to a lake-only topic), one
connection per input.  After each: ksi is up, logged no error or traceback, serves a fresh client, and
holds no connection of a client that has left (see tests/ksi/fuzzing.py for the profiles)."""

from __future__ import annotations

import itertools
import socket
import struct
import uuid
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.admin import DescribeClusterRequest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from ksi.history.lake_only import lake_topic_id
from protocol import api, known_api

from .fuzz_target import HISTORY_TOPIC, LAKE_ONLY_TOPIC, MAX_FRAME_BYTES, FuzzTarget, exchange, request_frame
from .fuzzing import ACCEPTED, KNOWN, PROFILE, default_body, examples_run, headers, mutated, request_header, sized

__all__ = ["PROPERTIES"]


# -- fixtures -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    running = FuzzTarget(tmp_path_factory.mktemp("fuzz")).start()
    try:
        running.check("start-up")
        yield running
    finally:
        running.stop()
    assert running.crash is None, f"the proxy crashed: {running.crash!r}"


def _fetch(version: int, topic: str, partition: int, offset: int, topic_id: uuid.UUID) -> bytes:
    T = FetchRequest.FetchTopic
    p = T.FetchPartition(version=version, partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                         last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
    t = T(version=version, partitions=[p])
    if version >= 13:
        t.topic_id = topic_id
    else:
        t.topic = topic
    request = FetchRequest(version=version, replica_id=-1, max_wait_ms=10, min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=[t], forgotten_topics_data=[],
                           rack_id="")
    return request_frame(request, version)


def _list_offsets(version: int, topic: str, timestamp: int) -> bytes:
    T = ListOffsetsRequest.ListOffsetsTopic
    request = ListOffsetsRequest(version=version, replica_id=-1, isolation_level=0, topics=[T(
        version=version, name=topic, partitions=[T.ListOffsetsPartition(
            version=version, partition_index=0, current_leader_epoch=-1, timestamp=timestamp, max_num_offsets=1)])])
    return request_frame(request, version)


def _produce(version: int, topic: str, acks: int, topic_id: uuid.UUID) -> bytes:
    T = ProduceRequest.TopicProduceData
    data = T(version=version, partition_data=[T.PartitionProduceData(version=version, index=0, records=b"")])
    if version >= 13:
        data.topic_id = topic_id
    else:
        data.name = topic
    return request_frame(ProduceRequest(version=version, transactional_id=None, acks=acks, timeout_ms=100,
                                        topic_data=[data]), version)


def _metadata(version: int, topics: list[str] | None) -> bytes:
    T = MetadataRequest.MetadataRequestTopic
    listed = None if topics is None else [T(version=version, name=n, topic_id=uuid.UUID(int=0)) for n in topics]
    return request_frame(MetadataRequest(version=version, topics=listed, allow_auto_topic_creation=False,
                                         include_topic_authorized_operations=False), version)


def valid_requests(topic_id: uuid.UUID) -> list[bytes]:
    """Well-formed requests that reach every path where ksi decodes a request itself."""
    lake_id = lake_topic_id(LAKE_ONLY_TOPIC)
    out = [request_frame(ApiVersionsRequest(version=v, client_software_name="f", client_software_version="1"), v)
           for v in range(4)]
    for v in (0, 1, 4, 9, 12):
        for topics in (None, [], [HISTORY_TOPIC], [LAKE_ONLY_TOPIC], [HISTORY_TOPIC, LAKE_ONLY_TOPIC, "other"]):
            if v == 0 and topics is None:
                continue
            out.append(_metadata(v, topics))
    for v in (4, 11, 12, 13, 16):
        for topic, tid in ((HISTORY_TOPIC, topic_id), (LAKE_ONLY_TOPIC, lake_id)):
            for offset in (0, 3, 9, 10, 15, 30):
                out.append(_fetch(v, topic, 0, offset, tid))
            out.append(_fetch(v, topic, 1, 0, tid))
    for v in (1, 2, 5, 7):
        for topic in (HISTORY_TOPIC, LAKE_ONLY_TOPIC):
            for timestamp in (-2, -1, 1_700_000_000_003):
                out.append(_list_offsets(v, topic, timestamp))
    for v in (3, 7, 9, 13):
        for topic, tid in ((HISTORY_TOPIC, topic_id), (LAKE_ONLY_TOPIC, lake_id)):
            for acks in (0, 1):
                out.append(_produce(v, topic, acks, tid))
    for v in (2, 4):
        out.append(request_frame(FindCoordinatorRequest(version=v, key="g", key_type=0, coordinator_keys=["g"]), v))
    out.append(request_frame(DescribeClusterRequest(version=0, include_cluster_authorized_operations=False), 0))
    return out


@st.composite
def framed_requests(draw: st.DrawFn) -> bytes:
    """One size-prefixed frame: a request header and a random, default, truncated or mutated body."""
    api_key, version, head = draw(headers())
    body = draw(st.one_of(
        st.binary(max_size=200),
        st.just(default_body(api_key, version)),
        st.just(default_body(api_key, version)).flatmap(mutated),
        st.just(default_body(api_key, version)).flatmap(lambda b: st.integers(0, len(b)).map(lambda n: b[:n])),
    ))
    payload = head + body
    size = draw(st.one_of(st.just(len(payload)), st.just(len(payload)), st.integers(-(1 << 31), (1 << 31) - 1),
                          st.integers(0, len(payload) + 8)))
    return struct.pack(">i", size) + payload


def connection_inputs(topic_id: uuid.UUID) -> st.SearchStrategy[list[bytes]]:
    """What one connection sends: up to three frames (valid, mutated, fuzzed) or raw bytes, in chunks."""
    valid = valid_requests(topic_id)
    one = st.one_of(
        framed_requests(),
        st.sampled_from(valid),
        st.sampled_from(valid).flatmap(lambda f: mutated(f, start=4).map(sized)),   # flipped, size fixed up
        st.sampled_from(valid).flatmap(mutated),                       # size prefix too
        st.binary(max_size=300),                                                    # raw bytes
        st.binary(max_size=300).map(sized),                                         # raw bytes as a frame
        st.sampled_from([struct.pack(">i", MAX_FRAME_BYTES + 1), struct.pack(">i", 0x7FFFFFFF),
                         struct.pack(">i", -1), struct.pack(">i", MAX_FRAME_BYTES) + b"\x00\x03\x00\x09"]),
    )
    return st.lists(one, min_size=1, max_size=3).flatmap(
        lambda frames: st.just(b"".join(frames)).flatmap(
            lambda wire: st.lists(st.integers(1, max(1, len(wire))), max_size=4).map(
                lambda cuts: _split(wire, cuts))))


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(data)})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a] or [b""]


# -- properties: the running proxy ---------------------------------------------------------------------


def _fuzz_proxy(target: FuzzTarget, chunks: list[bytes]) -> None:
    examples_run["proxy"] += 1
    target.log.errors.clear()  # each example answers for its own log lines (a failed one, while shrinking)
    exchange(target.port, chunks)
    target.check(f"sending {b''.join(chunks)[:200]!r}")


@PROFILE
@given(data=st.data())
def test_proxy_survives_any_client_bytes(target: FuzzTarget, data: st.DataObject) -> None:
    chunks = data.draw(connection_inputs(target.topic_id), label="chunks")
    _fuzz_proxy(target, chunks)


@PROFILE
@given(data=st.data())
def test_proxy_survives_mutated_valid_requests_after_a_good_one(target: FuzzTarget, data: st.DataObject) -> None:
    """A well-behaved start (ApiVersions, then a valid request), then a mutated copy of a valid request."""
    valid = valid_requests(target.topic_id)
    good = data.draw(st.sampled_from(valid), label="good")
    bad = data.draw(st.sampled_from(valid).flatmap(lambda f: mutated(f, start=4)), label="bad")
    _fuzz_proxy(target, [valid[3], good, sized(bad[4:])])


@PROFILE
@given(key_version=st.sampled_from(ACCEPTED), data=st.data())
def test_proxy_survives_every_accepted_api_with_a_broken_body(target: FuzzTarget, key_version: tuple[int, int],
                                                              data: st.DataObject) -> None:
    """Every (api key, version) ksi accepts, each drawn evenly, with a truncated or mutated default body."""
    api_key, version = key_version
    body = default_body(api_key, version)
    broken = data.draw(st.one_of(st.integers(0, len(body)).map(lambda n: body[:n]), mutated(body),
                                 st.binary(max_size=64)), label="body")
    head = request_header(api_key, version, 5, b"fuzz", known_api(api_key).is_flexible(version), b"\x00")
    _fuzz_proxy(target, [sized(head + broken)])


def test_oversized_frames_and_silence_leave_ksi_serving(target: FuzzTarget) -> None:
    """The fixed cases: frames over the limit (refused from their size prefix alone), and a connection
    that sends nothing while others are served."""
    with socket.create_connection(("127.0.0.1", target.port)) as silent:
        for prefix in (MAX_FRAME_BYTES + 1, 0x7FFFFFFF, -1, -0x80000000):
            assert exchange(target.port, [struct.pack(">i", prefix) + b"\x00" * 64]) == b""
            target.check(f"a frame of {prefix} bytes", still_open=1)
        silent.settimeout(0.2)
        with pytest.raises(TimeoutError):
            silent.recv(1)  # still open: ksi waits for a request (proxy.idle_timeout_seconds)
    target.check("closing the silent connection")


def test_every_accepted_api_has_a_default_request() -> None:
    """The strategies above cover each (api key, version) ksi accepts with a valid default body."""
    for api_key, version in ACCEPTED:
        body = default_body(api_key, version)
        entry = api(api_key)
        assert entry is not None
        entry.request.decode(body, version=version)
    assert len(ACCEPTED) == sum(known_api(k).max_version + 1 for k in KNOWN)


# The properties scripts/fuzz.py runs round after round (each takes the running target).
PROPERTIES: list[Callable[..., None]] = [
    test_proxy_survives_any_client_bytes,
    test_proxy_survives_mutated_valid_requests_after_a_good_one,
    test_proxy_survives_every_accepted_api_with_a_broken_body,
]
