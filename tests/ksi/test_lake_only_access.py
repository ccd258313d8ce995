"""Lake-only topics follow the config's allow-list, default deny, keyed by the principal the broker
accepted on the client's own connection.  The fake broker is here only because it can accept a SASL
login: no broker installable on this machine keeps users (see tests/integration/test_auth.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from kafka.record import MemoryRecords

from ksi.history.lake_only import lake_topic_id
from protocol.errors import INVALID_TOPIC_EXCEPTION

from .fakes import FakeCluster
from .test_proxy import RawClient, raw_value_table, start_proxy

TOPIC_AUTHORIZATION_FAILED, SASL_AUTHENTICATION_FAILED = 29, 58
PASSWORDS = {"alice": "alice-Secret-1", "bob": "bob-Secret-2"}


async def login(client: RawClient, user: str, password: str) -> int:
    handshake = await client.call(SaslHandshakeRequest(version=1, mechanism="PLAIN"), SaslHandshakeResponse, 1)
    assert handshake.error_code == 0
    answer = await client.call(SaslAuthenticateRequest(version=2, auth_bytes=f"\0{user}\0{password}".encode()),
                               SaslAuthenticateResponse, 2)
    return int(answer.error_code)


async def fetch(client: RawClient, topic: str) -> Any:
    T = FetchRequest.FetchTopic
    request = FetchRequest(version=12, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                               version=12, topic=topic, partitions=[T.FetchPartition(
                                   version=12, partition=0, current_leader_epoch=-1, fetch_offset=2,
                                   last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])],
                           forgotten_topics_data=[], rack_id="")
    [partition] = (await client.call(request, FetchResponse, 12)).responses[0].partitions
    return partition


async def earliest(client: RawClient, topic: str) -> Any:
    T = ListOffsetsRequest.ListOffsetsTopic
    request = ListOffsetsRequest(version=2, replica_id=-1, isolation_level=0, topics=[T(
        version=2, name=topic, partitions=[T.ListOffsetsPartition(version=2, partition_index=0, timestamp=-2)])])
    [partition] = (await client.call(request, ListOffsetsResponse, 2)).topics[0].partitions
    return partition


async def metadata(client: RawClient, topics: list[str] | None) -> dict[str, int]:
    request = MetadataRequest(version=9, topics=None if topics is None else [
        MetadataRequest.MetadataRequestTopic(version=9, name=t) for t in topics],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    response = await client.call(request, MetadataResponse, 9)
    return {t.name: t.error_code for t in response.topics}


async def test_lake_only_readers_by_principal_default_deny(nursery: trio.Nursery, tmp_path: Any,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    props = raw_value_table(tmp_path, "history.open", 10)
    from pyiceberg.catalog.sql import SqlCatalog

    from ksi.history.ksi_table import partition_spec, raw_value_schema, sort_order

    SqlCatalog("lake", **props).create_table("history.closed", schema=raw_value_schema(),
                                             partition_spec=partition_spec(), sort_order=sort_order())
    cluster = await FakeCluster.start(nursery)
    cluster.topics, cluster.users = ["t"], dict(PASSWORDS)
    proxy = await start_proxy(nursery, cluster.brokers[0].port, {"catalog": {"name": "lake", **props}, "topics": [
        {"name": "lo", "table": "history.open", "lake_only_readers": ["User:alice"]},
        {"name": "nobody", "table": "history.closed"}]})
    with trio.fail_after(10):
        while proxy.history.lake_only != {"lo", "nobody"}:  # learnt from the cluster's topic names
            await trio.sleep(0.05)

    anonymous = await RawClient.connect(proxy.bound.bootstrap.port)
    assert "lo" not in await metadata(anonymous, None)           # hidden from an all-topics listing
    assert (await metadata(anonymous, ["lo"]))["lo"] == TOPIC_AUTHORIZATION_FAILED
    partition = await fetch(anonymous, "lo")
    assert (partition.error_code, partition.records) == (TOPIC_AUTHORIZATION_FAILED, b"")
    assert (await earliest(anonymous, "lo")).error_code == TOPIC_AUTHORIZATION_FAILED

    wrong = await RawClient.connect(proxy.bound.bootstrap.port)
    assert await login(wrong, "alice", "not-her-password") == SASL_AUTHENTICATION_FAILED
    partition = await fetch(wrong, "lo")                          # a failed login is still nobody
    assert (partition.error_code, partition.records) == (TOPIC_AUTHORIZATION_FAILED, b"")

    bob = await RawClient.connect(proxy.bound.bootstrap.port)
    assert await login(bob, "bob", PASSWORDS["bob"]) == 0
    assert (await fetch(bob, "lo")).error_code == TOPIC_AUTHORIZATION_FAILED  # authenticated, not allowed

    alice = await RawClient.connect(proxy.bound.bootstrap.port)
    assert await login(alice, "alice", PASSWORDS["alice"]) == 0
    assert (await metadata(alice, None))["lo"] == 0
    partition = await fetch(alice, "lo")
    assert partition.error_code == 0 and b"v2" in partition.records and partition.high_watermark == 10
    offsets = await earliest(alice, "lo")
    assert (offsets.error_code, offsets.offset) == (0, 0)
    # an empty allow-list is nobody, not everybody
    assert (await metadata(alice, ["nobody"]))["nobody"] == TOPIC_AUTHORIZATION_FAILED

    text = caplog.text
    assert "User:bob may not read lake-only topic lo" in text and "authenticated the client as User:alice" in text
    for secret in (*PASSWORDS.values(), "not-her-password"):
        assert secret not in text                                  # credentials never reach the log


async def open_to_all(nursery: trio.Nursery, tmp_path: Any) -> tuple[FakeCluster, Any]:
    """The fake cluster (topic ``t``) behind a proxy serving lake-only topic ``lo`` (offsets 0..9) to anyone."""
    props = raw_value_table(tmp_path, "history.open", 10)
    cluster = await FakeCluster.start(nursery)
    cluster.topics = ["t"]
    proxy = await start_proxy(nursery, cluster.brokers[0].port, {"catalog": {"name": "lake", **props}, "topics": [
        {"name": "lo", "table": "history.open", "lake_only_readers": ["*"]}]})
    with trio.fail_after(10):
        while proxy.history.lake_only != {"lo"}:
            await trio.sleep(0.05)
    return cluster, proxy


async def test_produce_naming_a_lake_only_topic_by_id_is_refused(nursery: trio.Nursery, tmp_path: Any) -> None:
    """Produce v13+ names topics by id: a lake-only topic named by its id is refused like one named by name
    (INVALID_TOPIC_EXCEPTION per partition, acks=1), and an acks=0 Produce to it closes the connection, as
    Kafka's broker closes it on an acks=0 Produce it refuses."""
    cluster, proxy = await open_to_all(nursery, tmp_path)
    T = ProduceRequest.TopicProduceData

    def produce(acks: int) -> ProduceRequest:
        return ProduceRequest(version=13, transactional_id=None, acks=acks, timeout_ms=100, topic_data=[T(
            version=13, topic_id=lake_topic_id("lo"), partition_data=[
                T.PartitionProduceData(version=13, index=0, records=b"")])])

    client = await RawClient.connect(proxy.bound.bootstrap.port)
    with trio.fail_after(10):
        response = await client.call(produce(1), ProduceResponse, 13)
    [topic] = response.responses
    assert topic.topic_id == lake_topic_id("lo")
    assert [p.error_code for p in topic.partition_responses] == [INVALID_TOPIC_EXCEPTION]
    assert "read-only" in topic.partition_responses[0].error_message
    assert all(key != 0 for key, _ in cluster.brokers[0].received)  # the broker never saw it

    quiet = await RawClient.connect(proxy.bound.bootstrap.port)
    await quiet.send(produce(0), 13)
    assert await quiet.closed_by_proxy()


async def test_fetch_naming_a_lake_only_topic_by_id_is_served_from_the_lake(nursery: trio.Nursery,
                                                                            tmp_path: Any) -> None:
    """Fetch v13+ names topics by id (the issue's "probably not recognised"): a lake-only topic named by the id
    ksi gave it in Metadata is recognised and served from the lake, offset-exact, and the broker never sees
    the Fetch."""
    cluster, proxy = await open_to_all(nursery, tmp_path)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    request = MetadataRequest(version=12, topics=[MetadataRequest.MetadataRequestTopic(version=12, name="lo")],
                              allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    listed = {t.name: t for t in (await client.call(request, MetadataResponse, 12)).topics}
    assert (listed["lo"].error_code, listed["lo"].topic_id) == (0, lake_topic_id("lo"))

    T = FetchRequest.FetchTopic
    for version in (13, 16):
        fetch = FetchRequest(version=version, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                             isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                                 version=version, topic_id=lake_topic_id("lo"), partitions=[T.FetchPartition(
                                     version=version, partition=0, current_leader_epoch=-1, fetch_offset=7,
                                     last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])],
                             forgotten_topics_data=[], rack_id="")
        with trio.fail_after(10):
            response = await client.call(fetch, FetchResponse, version)
        [topic] = response.responses
        assert topic.topic_id == lake_topic_id("lo")
        [partition] = topic.partitions
        assert (partition.error_code, partition.high_watermark, partition.log_start_offset) == (0, 10, 0)
        batches = MemoryRecords(bytes(partition.records))
        served = []
        while (batch := batches.next_batch()) is not None:
            served += [(record.offset, record.value) for record in batch]
        # the batch holding offset 7 (a batch may start below the offset asked, as a broker's does), to the end
        assert served == [(o, f"v{o}".encode()) for o in range(served[0][0], 10)] and served[0][0] <= 7
    assert all(key != 1 for key, _ in cluster.brokers[0].received)  # the broker never saw a Fetch
