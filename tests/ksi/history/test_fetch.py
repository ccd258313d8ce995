"""FetchHandler (ksi/history/fetch.py) planning, called directly: a real History over a real SqlCatalog table,
the fake broker answering on the client's connection (ProbeSession).  The lake holds offsets 0..9 of
partition 0 of topic ``t``; what the broker says its log holds decides each case: cold (served from the lake
up to the log start, nothing forwarded) and a refusal (the broker's verdict, with no data).  (The fake broker
answers no full Fetch, so the hot and mixed cases are tested over real brokers: tests/integration.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.record import MemoryRecords

from ksi.filters.api import Spliced
from ksi.history.fetch import FetchHandler
from ksi.history.lake_only import LakeOnlyTopics
from ksi.history.service import History
from ksi.history.topic_ids import TopicIds
from protocol import parse_request_header
from protocol.errors import KAFKA_STORAGE_ERROR, TOPIC_AUTHORIZATION_FAILED

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



def two_partition_table(tmp_path: Any, n: int) -> dict[str, str]:
    """Topic ``t``'s ksi-layout table holding offsets 0..n-1 of partitions 0 and 1 (a data file each)."""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    from ksi.history.ksi_table import arrow_schema, partition_spec, raw_value_schema, sort_order

    props = {"uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path}"}
    catalog = SqlCatalog("lake", **props)
    catalog.create_namespace("history")
    table = catalog.create_table("history.t", schema=raw_value_schema(), partition_spec=partition_spec(),
                                 sort_order=sort_order())
    rows = 2 * n
    table.append(pa.table({
        "kafka_partition": pa.array([0] * n + [1] * n, pa.int32()),
        "kafka_offset": pa.array(list(range(n)) * 2, pa.int64()),
        "kafka_timestamp": pa.array([1_700_000_000_000_000] * rows, pa.timestamp("us", tz="UTC")),
        "kafka_timestamp_type": pa.array([0] * rows, pa.int32()), "kafka_key": pa.nulls(rows, pa.binary()),
        "kafka_headers": pa.nulls(rows, arrow_schema().field("kafka_headers").type),
        "kafka_value": pa.array([b"p%d-v%d" % (i // n, i % n) for i in range(rows)], pa.binary()),
        "kafka_value_schema_id": pa.nulls(rows, pa.int32())}, schema=arrow_schema()))
    return props


class TwoPartitions:
    """A FetchHandler over a real History of :func:`two_partition_table` (10 offsets each), the fake broker's
    log starting at 10 (every offset asked is cold)."""

    def __init__(self, history: History) -> None:
        broker = MemoryBroker()
        broker.cluster.topics, broker.cluster.offsets["t"] = ["t"], (10, 20)
        self.history = history
        self.session = ProbeSession(broker)
        self.handler = FetchHandler(history, TopicIds(), LakeOnlyTopics(history, lambda name, topic_id: None))

    async def fetch(self, *partitions: int) -> dict[int, Any]:
        """A Fetch v12 of offset 0 of ``partitions``; the response's partitions by index."""
        T = FetchRequest.FetchTopic
        request = FetchRequest(version=12, replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20,
                               isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                                   version=12, topic="t", partitions=[T.FetchPartition(
                                       version=12, partition=p, current_leader_epoch=-1, fetch_offset=0,
                                       last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
                                       for p in partitions])],
                               forgotten_topics_data=[], rack_id="")
        request.with_header(correlation_id=7, client_id="unit")
        payload = bytes(request.encode(version=12, header=True))
        raw = await self.handler(parse_request_header(payload), payload, self.session, "unit")
        data = b"".join(bytes(part) for part in raw)
        [topic] = FetchResponse.decode(data[5:], version=12).responses
        return {p.partition_index: p for p in topic.partitions}


async def two_partitions(tmp_path: Any, nursery: Any, **history_config: Any) -> TwoPartitions:
    from ..test_proxy import make_config

    props = two_partition_table(tmp_path, 10)
    history = History(make_config(9092, {"catalog": {"name": "lake", **props}, "history": history_config,
                                         "topics": [{"name": "t", "table": "history.t"}]}))
    await history.start()
    await nursery.start(history.serve)
    history.set_upstream_topics({"t"})
    return TwoPartitions(history)


@pytest.fixture
async def two(tmp_path: Any, nursery: Any) -> TwoPartitions:
    return await two_partitions(tmp_path, nursery)


async def test_partitions_read_already_are_answered_without_waiting_for_the_others(two: TwoPartitions) -> None:
    """As a broker answers a fetch with the partitions that have data: a partition whose records are cached is
    answered at once, and the read of one that is not is only started (its partition answers empty, no
    error); the next fetch for it, with nothing else ready, waits for that read and gets its records."""
    first = await two.fetch(0)  # nothing is ready: this fetch waits for partition 0's read
    assert offsets(first[0].records) == list(range(10))
    mixed = await two.fetch(0, 1)
    assert offsets(mixed[0].records) == list(range(10))
    assert (mixed[1].error_code, mixed[1].records) == (0, b"")  # being read, not waited for
    assert two.history.reader._reads or two.history.cache.covers("t", 1, 0)  # ... but started
    late = await two.fetch(1)
    assert offsets(late[1].records) == list(range(10))


async def test_a_read_that_fails_with_nobody_waiting_is_told_to_the_next_fetch(two: TwoPartitions,
                                                                               tmp_path: Path) -> None:
    """A read started for a fetch that did not wait for it (another partition had data) and then failed is
    not lost: the next fetch of that partition gets KAFKA_STORAGE_ERROR for it (retriable), and the partition
    with data is still served."""
    assert offsets((await two.fetch(0))[0].records) == list(range(10))
    [gone] = [f for f in tmp_path.rglob("*.parquet") if "kafka_partition=1" in str(f)]  # noqa: ASYNC240 - a test's setup
    gone.unlink()
    started = await two.fetch(0, 1)
    assert (started[1].error_code, started[1].records) == (0, b"")
    with trio.fail_after(10):
        while ("t", 1) not in two.history.reader._failed:
            await trio.sleep(0.01)
    told = await two.fetch(0, 1)
    assert offsets(told[0].records) == list(range(10))
    assert told[1].error_code == KAFKA_STORAGE_ERROR


async def test_a_read_not_waited_for_reaches_the_next_fetch_with_the_cache_off(tmp_path: Path, nursery: Any) -> None:
    """history.cache_bytes 0: a read started for a fetch that did not wait for it cannot be found in the
    cache, so its records are handed to the partition's next fetch (else every fetch would start the same
    read again and the partition never be served while another had data); taken once, they are gone."""
    two = await two_partitions(tmp_path, nursery, cache_bytes=0, prefetch=False)
    history = two.history
    await history.planned.wait()
    assert await history.read("t", 1, 3, 1 << 20, None, wait=False) is None  # started
    with trio.fail_after(10):
        while history.reader._reads:
            await trio.sleep(0.01)
    handed = await history.read("t", 1, 3, 1 << 20, None, wait=False)
    assert handed is not None and 3 in offsets(b"".join(handed))
    assert await history.read("t", 1, 3, 1 << 20, None, wait=False) is None  # read again: nothing is kept
