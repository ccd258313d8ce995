"""The hot Fetch fast path (ksi/filters/history.py): a Fetch of a history topic that the lake has nothing for,
or that the broker holds too, goes on as its bytes from the task that read it, made sessionless in place;
OFFSET_OUT_OF_RANGE in its response hands it to the history router.  The fake broker grants fetch sessions
(no real broker here does for these clients) and answers OFFSET_OUT_OF_RANGE below its log start."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from kafka.protocol.consumer import FetchRequest, FetchResponse

from ksi.history.fetch import FetchHandler
from protocol.errors import KAFKA_STORAGE_ERROR, NONE, OFFSET_OUT_OF_RANGE

from .fakes import FakeCluster
from .test_proxy import RawClient, raw_value_table, start_proxy

T = FetchRequest.FetchTopic


def fetch(topic: str, offset: int, session: tuple[int, int]) -> Any:
    return FetchRequest(version=12, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                        isolation_level=0, session_id=session[0], session_epoch=session[1], topics=[T(
                            version=12, topic=topic, partitions=[T.FetchPartition(
                                version=12, partition=0, current_leader_epoch=-1, fetch_offset=offset,
                                last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])],
                        forgotten_topics_data=[], rack_id="")


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The fetch offsets of the Fetches the history router handled (the slow path)."""
    calls: list[int] = []
    original = FetchHandler.__call__

    async def spy(self: FetchHandler, header: Any, request: Any, upstream: Any, client: str, **kw: Any) -> Any:
        calls.append(FetchRequest.decode(bytes(request[header.body_offset:]), version=header.api_version)
                     .topics[0].partitions[0].fetch_offset)
        return await original(self, header, request, upstream, client, **kw)

    monkeypatch.setattr(FetchHandler, "__call__", spy)
    return calls


async def history_proxy(nursery: trio.Nursery, tmp_path: Any) -> tuple[FakeCluster, RawClient]:
    props = raw_value_table(tmp_path, "history.t", 10)  # the lake holds offsets 0..9 of t/0
    cluster = await FakeCluster.start(nursery)
    cluster.topics, cluster.offsets, cluster.session_log = ["t", "u"], {"t": (100, 200), "u": (10, 50)}, []
    proxy = await start_proxy(nursery, cluster.brokers[0].port,
                              {"catalog": {"name": "lake", **props}, "topics": [{"name": "t", "table": "history.t"}]})
    return cluster, await RawClient.connect(proxy.bound.bootstrap.port)


async def test_hot_fetch_is_forwarded_sessionless_from_the_reader(nursery: trio.Nursery, tmp_path: Any,
                                                                  routed: list[int]) -> None:
    cluster, client = await history_proxy(nursery, tmp_path)
    assert cluster.session_log is not None
    # The first Fetch of t: the lake's ranges are not known yet, the router reads them (and forwards it).
    first = await client.call(fetch("t", 150, (0, 0)), FetchResponse, 12)
    assert routed == [150] and first.session_id == 0 and cluster.session_log == [(0, -1)]
    # Then above the lake's end: forwarded by the fast path, the client's session request made sessionless.
    for session in [(0, 0), (0, -1)]:
        response = await client.call(fetch("t", 160, session), FetchResponse, 12)
        [partition] = response.responses[0].partitions
        assert (response.session_id, partition.error_code) == (0, NONE)
    assert routed == [150] and cluster.session_log == [(0, -1)] * 3
    # A topic without history keeps its fetch session, as the client asked for it, and its errors.
    response = await client.call(fetch("u", 15, (0, 0)), FetchResponse, 12)
    assert response.session_id == 77 and cluster.session_log[-1] == (0, 0) and routed == [150]
    response = await client.call(fetch("u", 5, (0, -1)), FetchResponse, 12)
    [partition] = response.responses[0].partitions
    assert partition.error_code == OFFSET_OUT_OF_RANGE and routed == [150]


async def test_offset_out_of_range_hands_the_fetch_to_the_router(nursery: trio.Nursery, tmp_path: Any,
                                                                 routed: list[int]) -> None:
    cluster, client = await history_proxy(nursery, tmp_path)
    await client.call(fetch("t", 150, (0, -1)), FetchResponse, 12)  # the router learns the lake's ranges
    # 50: above the lake's end (9), below the log start (100): forwarded, the broker answers OFFSET_OUT_OF_RANGE,
    # the router routes it again and finds the gap between lake and log (a retriable error, never a skip).
    response = await client.call(fetch("t", 50, (0, 0)), FetchResponse, 12)
    [partition] = response.responses[0].partitions
    assert partition.error_code == KAFKA_STORAGE_ERROR and response.session_id == 0
    assert routed == [150, 50]
    assert cluster.session_log == [(0, -1), (0, -1), (0, -1)]  # fast path, then the router's forward
    # Inside the lake: the router, from the start.
    response = await client.call(fetch("t", 3, (0, 0)), FetchResponse, 12)
    [partition] = response.responses[0].partitions
    assert partition.error_code == NONE and b"v3" in partition.records and routed == [150, 50, 3]


@pytest.mark.parametrize("prefer_lake", [False, True])
async def test_a_range_both_hold_is_the_brokers_by_the_fast_path(nursery: trio.Nursery, tmp_path: Any,
                                                                 routed: list[int], prefer_lake: bool) -> None:
    """Offsets the lake holds and the broker still holds too (a replay of the overlap, a consumer near the tail
    of a topic archived continuously) are the broker's (ksi.history.seam): once a connection has learnt the
    log start, such a Fetch goes on as its bytes, not through the router; when retention moves the log start
    past it meanwhile, the broker's OFFSET_OUT_OF_RANGE hands it to the router, which serves the lake's
    records.  A topic with ``prefer_lake`` is the router's throughout."""
    props = raw_value_table(tmp_path, "history.t", 10)  # the lake holds offsets 0..9 of t/0
    cluster = await FakeCluster.start(nursery)
    cluster.topics, cluster.offsets, cluster.session_log = ["t"], {"t": (5, 200)}, []
    proxy = await start_proxy(nursery, cluster.brokers[0].port, {
        "catalog": {"name": "lake", **props},
        "topics": [{"name": "t", "table": "history.t", "prefer_lake": prefer_lake}]})
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    first = await client.call(fetch("t", 7, (0, -1)), FetchResponse, 12)  # the router learns the log start: 5
    [partition] = first.responses[0].partitions
    assert routed == [7] and partition.error_code == NONE
    assert (b"v7" in partition.records) is prefer_lake  # the lake's records, or the broker's (none here)
    again = await client.call(fetch("t", 7, (0, -1)), FetchResponse, 12)
    assert routed == ([7, 7] if prefer_lake else [7]) and again.responses[0].partitions[0].error_code == NONE
    cluster.offsets["t"] = (8, 200)  # retention moves the log start past 7
    moved = await client.call(fetch("t", 7, (0, -1)), FetchResponse, 12)
    [partition] = moved.responses[0].partitions
    assert routed[-1] == 7 and len(routed) == (3 if prefer_lake else 2)
    assert partition.error_code == NONE and b"v7" in partition.records  # served from the lake: no gap


async def test_a_fetch_the_router_hands_back_is_recovered_by_it_when_the_broker_answers_out_of_range(
        nursery: trio.Nursery, tmp_path: Any, routed: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The router hands a Fetch that is all the broker's back to be forwarded (its response relayed unread).
    When retention moves the log start between the router's ListOffsets and that Fetch, the broker's
    OFFSET_OUT_OF_RANGE brings it back to the router, which answers it itself this time: it learns the log
    start again and serves the lake's record, once (no second hand-back, no loop)."""
    props = raw_value_table(tmp_path, "history.t", 10)  # the lake holds offsets 0..9 of t/0
    cluster = await FakeCluster.start(nursery)
    cluster.topics, cluster.offsets, cluster.session_log = ["t"], {"t": (5, 200)}, []
    proxy = await start_proxy(nursery, cluster.brokers[0].port, {
        "catalog": {"name": "lake", **props}, "topics": [{"name": "t", "table": "history.t"}]})
    from ksi.history import watermarks

    learn = watermarks.learn
    learnt: list[int] = []

    async def then_retention(upstream: Any, wanted: Any, isolation: int, note: Any) -> None:
        await learn(upstream, wanted, isolation, note)
        learnt.append(cluster.offsets["t"][0])
        cluster.offsets["t"] = (8, 200)  # retention moves the log start past 7 right after ksi asked

    monkeypatch.setattr(watermarks, "learn", then_retention)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    response = await client.call(fetch("t", 7, (0, -1)), FetchResponse, 12)
    [partition] = response.responses[0].partitions
    assert partition.error_code == NONE and b"v7" in partition.records  # the lake's record: no gap, no skip
    # Handed back on log start 5; answered by the router, which learnt 8 when the broker said out of range.
    assert routed == [7, 7] and learnt[0] == 5 and learnt[-1] == 8
    assert cluster.session_log == [(0, -1), (0, -1)]  # the handed-back Fetch, the router's own
