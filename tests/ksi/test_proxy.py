"""The proxy in-process against a fake 3-broker cluster: routing, rewriting, ordering and robustness."""

from __future__ import annotations

import logging
import struct
from typing import Any

import pytest
import trio
from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest

from ksi.config import parse_config
from ksi.metrics import CLIENT_ERRORS
from ksi.server import Proxy
from protocol import FrameReader, api, frame, response_body_offset

from .fakes import FakeCluster


class RawClient:
    """A Kafka client reduced to the wire: encode with the codec, read frames back."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reader = FrameReader(1 << 24)
        self.next_id = 0

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def send(self, request: Any, version: int) -> int:
        self.next_id += 1
        request.with_header(correlation_id=self.next_id, client_id="raw-test")
        await self.stream.send_all(frame(bytes(request.encode(version=version, header=True))))
        return self.next_id

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive_frame(self) -> bytes | None:
        while (f := self.reader.next_frame()) is None:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.reader.receive_data(data)
        return f

    async def receive(self, response_cls: Any, version: int) -> tuple[int, Any]:
        raw = await self.receive_frame()
        assert raw is not None, "proxy closed the connection"
        correlation_id = struct.unpack_from(">i", raw)[0]
        entry = api(response_cls.API_KEY)
        assert entry is not None
        offset = response_body_offset(raw, entry.response_header_version(version))
        return correlation_id, response_cls.decode(raw[offset:], version=version)

    async def call(self, request: Any, response_cls: Any, version: int) -> Any:
        sent = await self.send(request, version)
        correlation_id, response = await self.receive(response_cls, version)
        assert correlation_id == sent
        return response

    async def closed_by_proxy(self) -> bool:
        with trio.fail_after(5):
            try:
                return await self.receive_frame() is None
            except trio.BrokenResourceError:
                return True

    async def aclose(self) -> None:
        await self.stream.aclose()


def make_config(bootstrap_port: int, extra: dict[str, Any] | None = None, **proxy: Any) -> Any:
    return parse_config({
        "proxy": {"listen": "127.0.0.1:0", "broker_port_base": 0, "shutdown_grace_seconds": 2, **proxy},
        "upstream": {"bootstrap_servers": f"127.0.0.1:{bootstrap_port}", "connect_timeout_seconds": 1,
                     "metadata_refresh_seconds": 0.5},
        **(extra or {}),
    }, "test.toml")


async def start_proxy(nursery: trio.Nursery, bootstrap_port: int, extra: dict[str, Any] | None = None,
                      **proxy: Any) -> Proxy:
    return await nursery.start(Proxy(make_config(bootstrap_port, extra, **proxy)).run)


async def metadata(client: RawClient, version: int = 9) -> Any:
    return await client.call(MetadataRequest(version=version, topics=[]), MetadataResponse, version)


@pytest.mark.parametrize("version", [1, 9, 12])
async def test_metadata_names_a_proxy_port_per_broker_and_each_routes_to_its_broker(nursery: trio.Nursery,
                                                                                     version: int) -> None:
    cluster = await FakeCluster.start(nursery)
    proxy = await start_proxy(nursery, cluster.brokers[0].port)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    response = await metadata(client, version)
    real_ports = {b.port for b in cluster.brokers}
    ports = {b.node_id: b.port for b in response.brokers}
    assert set(ports) == {1, 2, 3}
    assert not set(ports.values()) & real_ports
    assert {b.host for b in response.brokers} == {"127.0.0.1"}
    for node_id, port in ports.items():
        direct = await RawClient.connect(port)
        answer = await metadata(direct, version)
        assert answer.controller_id == node_id  # the fake answers with its own id: routed to that broker
        assert {b.port for b in answer.brokers} == set(ports.values())
        await direct.aclose()


@pytest.mark.parametrize("version", [2, 4])
async def test_find_coordinator_and_describe_cluster_are_rewritten(nursery: trio.Nursery, version: int) -> None:
    cluster = await FakeCluster.start(nursery)
    proxy = await start_proxy(nursery, cluster.brokers[0].port)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    await metadata(client)
    request = FindCoordinatorRequest(version=version, key="g", key_type=0, coordinator_keys=["g"])
    found = await client.call(request, FindCoordinatorResponse, version)
    coordinator = found.coordinators[0] if version >= 4 else found
    assert coordinator.node_id == 3
    assert coordinator.port == proxy.cluster.ports[3]
    described = await client.call(DescribeClusterRequest(version=0, include_cluster_authorized_operations=False),
                                  DescribeClusterResponse, 0)
    assert sorted(b.port for b in described.brokers) == sorted(proxy.cluster.ports.values())


async def test_api_versions_intersected_and_too_new_version_gets_error_35(nursery: trio.Nursery) -> None:
    cluster = await FakeCluster.start(nursery, (1,))
    proxy = await start_proxy(nursery, cluster.brokers[0].port)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    versions = await client.call(ApiVersionsRequest(version=3, client_software_name="t",
                                                    client_software_version="1"), ApiVersionsResponse, 3)
    keys = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
    assert 68 not in keys and keys[17] == (1, 1)

    too_new = ApiVersionsRequest(version=3, client_software_name="t", client_software_version="1")
    too_new.with_header(correlation_id=77, client_id="future")
    data = bytearray(too_new.encode(version=3, header=True))
    struct.pack_into(">h", data, 2, 99)  # api_version 99
    await client.send_raw(frame(bytes(data)))
    raw = await client.receive_frame()
    assert raw is not None and struct.unpack_from(">i", raw)[0] == 77
    answer = ApiVersionsResponse.decode(raw[4:], version=0)
    assert answer.error_code == 35 and answer.api_keys[0].api_key == 18
    # The connection keeps working.
    assert (await metadata(client)).cluster_id == "fake"


async def test_responses_leave_in_request_order(nursery: trio.Nursery) -> None:
    cluster = await FakeCluster.start(nursery, (1,))
    proxy = await start_proxy(nursery, cluster.brokers[0].port)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    await metadata(client)
    cluster.brokers[0].delay[3] = 0.3  # the broker is slow to answer Metadata ...
    first = await client.send(MetadataRequest(version=9, topics=[]), 9)
    too_new = ApiVersionsRequest(version=3, client_software_name="t", client_software_version="1")
    too_new.with_header(correlation_id=1000, client_id="x")
    data = bytearray(too_new.encode(version=3, header=True))
    struct.pack_into(">h", data, 2, 99)
    await client.send_raw(frame(bytes(data)))  # ... while ksi answers this one itself at once
    order = []
    for _ in range(2):
        raw = await client.receive_frame()
        assert raw is not None
        order.append(struct.unpack_from(">i", raw)[0])
    assert order == [first, 1000]


async def test_produce_with_acks_0_gets_no_response(nursery: trio.Nursery) -> None:
    cluster = await FakeCluster.start(nursery, (1,))
    proxy = await start_proxy(nursery, cluster.brokers[0].port)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    await client.send(ProduceRequest(version=7, transactional_id=None, acks=0, timeout_ms=100, topic_data=[]), 7)
    response = await metadata(client)  # the next response is Metadata's, not a Produce answer
    assert response.cluster_id == "fake"
    assert (0, 7) in cluster.brokers[0].received


@pytest.mark.parametrize("bad", [
    pytest.param(struct.pack(">i", 3) + b"\x00\x03\x00", id="header-shorter-than-minimum"),
    pytest.param(struct.pack(">i", 10) + b"\x00\x03\x00\x09\x00\x00\x00\x01\x7f\x00", id="client-id-overruns"),
    pytest.param(struct.pack(">i", 10) + b"\x00\x63\x00\x00\x00\x00\x00\x01\xff\xff", id="unknown-api-key-99"),
    pytest.param(struct.pack(">i", 10) + b"\x00\x03\x00\x63\x00\x00\x00\x01\xff\xff", id="metadata-v99"),
    pytest.param(struct.pack(">i", 2_000_000), id="over-max-frame-bytes"),
    pytest.param(struct.pack(">i", -1), id="negative-size"),
])
async def test_bad_frames_close_only_that_connection(nursery: trio.Nursery, bad: bytes) -> None:
    cluster = await FakeCluster.start(nursery, (1,))
    proxy = await start_proxy(nursery, cluster.brokers[0].port, max_frame_bytes=1_000_000)
    bystander = await RawClient.connect(proxy.bound.bootstrap.port)
    await metadata(bystander)
    before = sum(s.value for m in CLIENT_ERRORS.collect() for s in m.samples if s.name.endswith("_total"))
    offender = await RawClient.connect(proxy.bound.bootstrap.port)
    await offender.send_raw(bad)
    assert await offender.closed_by_proxy()
    after = sum(s.value for m in CLIENT_ERRORS.collect() for s in m.samples if s.name.endswith("_total"))
    assert after == before + 1
    assert (await metadata(bystander)).cluster_id == "fake"


async def test_client_disconnecting_mid_request_leaves_others_served(nursery: trio.Nursery) -> None:
    cluster = await FakeCluster.start(nursery, (1,))
    proxy = await start_proxy(nursery, cluster.brokers[0].port)
    quitter = await RawClient.connect(proxy.bound.bootstrap.port)
    await quitter.send_raw(struct.pack(">i", 100) + b"\x00\x03\x00\x09")  # 8 of 104 bytes, then gone
    await quitter.aclose()
    # And one that leaves with a slow request in flight.
    cluster.brokers[0].delay[3] = 0.2
    leaver = await RawClient.connect(proxy.bound.bootstrap.port)
    await leaver.send(MetadataRequest(version=9, topics=[]), 9)
    await leaver.aclose()
    await trio.sleep(0.3)
    cluster.brokers[0].delay.clear()
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    assert (await metadata(client)).cluster_id == "fake"


async def test_unreachable_broker_closes_the_client_and_recovers(nursery: trio.Nursery) -> None:
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    proxy = await start_proxy(nursery, dead_port)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    await client.send(MetadataRequest(version=9, topics=[]), 9)
    assert await client.closed_by_proxy()
    # The broker comes up on that port: new connections work without restarting ksi.
    cluster = FakeCluster()
    from .fakes import FakeBroker
    cluster.brokers.append(await nursery.start(FakeBroker(1, cluster, port=dead_port).serve))
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    assert (await metadata(client)).cluster_id == "fake"


async def test_broker_dying_mid_request_closes_its_clients_only_until_restart(nursery: trio.Nursery) -> None:
    cluster = await FakeCluster.start(nursery, (1, 2))
    proxy = await start_proxy(nursery, cluster.brokers[0].port)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    await metadata(client)
    other = await RawClient.connect(proxy.cluster.ports[2])
    victim = cluster.brokers[0]
    victim.delay[3] = 5
    await client.send(MetadataRequest(version=9, topics=[]), 9)
    await trio.sleep(0.1)
    victim.kill()
    assert await client.closed_by_proxy()
    assert (await metadata(other)).controller_id == 2  # the other broker's clients are unaffected
    await cluster.restart(victim, nursery)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    assert (await metadata(client)).controller_id == 1


async def test_graceful_shutdown_finishes_in_flight_requests(nursery: trio.Nursery) -> None:
    cluster = await FakeCluster.start(nursery, (1,))
    proxy = await start_proxy(nursery, cluster.brokers[0].port)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    await metadata(client)
    cluster.brokers[0].delay[3] = 0.5
    sent = await client.send(MetadataRequest(version=9, topics=[]), 9)
    await trio.sleep(0.1)
    proxy.stop()
    correlation_id, response = await client.receive(MetadataResponse, 9)
    assert correlation_id == sent and response.cluster_id == "fake"
    assert await client.closed_by_proxy()
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", proxy.bound.bootstrap.port)


@pytest.mark.parametrize("with_history", [False, True], ids=["pass-through", "history-configured"])
async def test_fetch_v16_node_endpoints_name_proxy_ports(nursery: trio.Nursery, tmp_path: Any,
                                                         with_history: bool) -> None:
    cluster = await FakeCluster.start(nursery)
    extra = None
    if with_history:  # Fetch then goes through the history router; endpoints must still be rewritten
        extra = {"catalog": {"uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path}"},
                 "topics": [{"name": "t", "table": "history.t"}]}
    proxy = await start_proxy(nursery, cluster.brokers[0].port, extra)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    await metadata(client)
    T = FetchRequest.FetchTopic
    request = FetchRequest(version=16, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                               version=16, topic_id=cluster.topic_id, partitions=[T.FetchPartition(
                                   version=16, partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])],
                           forgotten_topics_data=[], rack_id="")
    response = await client.call(request, FetchResponse, 16)
    assert [(n.node_id, n.port) for n in response.node_endpoints] == [(3, proxy.cluster.ports[3])]


def raw_value_table(tmp_path: Any, name: str, n: int) -> dict[str, str]:
    """A ksi-layout table ``name`` holding offsets 0..n-1 of partition 0, values b"v<offset>"; the catalog's
    properties."""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    from ksi.history.ksi_table import arrow_schema, partition_spec, raw_value_schema, sort_order

    props = {"uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path}"}
    catalog = SqlCatalog("lake", **props)
    catalog.create_namespace("history")
    table = catalog.create_table(name, schema=raw_value_schema(), partition_spec=partition_spec(),
                                 sort_order=sort_order())
    table.append(pa.table({
        "kafka_partition": pa.array([0] * n, pa.int32()), "kafka_offset": pa.array(range(n), pa.int64()),
        "kafka_timestamp": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
        "kafka_timestamp_type": pa.array([0] * n, pa.int32()), "kafka_key": pa.nulls(n, pa.binary()),
        "kafka_headers": pa.nulls(n, arrow_schema().field("kafka_headers").type),
        "kafka_value": pa.array([b"v%d" % i for i in range(n)], pa.binary()),
        "kafka_value_schema_id": pa.nulls(n, pa.int32())}, schema=arrow_schema()))
    return props


@pytest.mark.parametrize("refused", ["", "describe", "read"], ids=["authorised", "refused", "describe-only"])
async def test_cold_reads_only_for_clients_the_broker_accepts(nursery: trio.Nursery, tmp_path: Any,
                                                              refused: str) -> None:
    """Before serving a partition from the lake, ksi asks the broker on the client's own connection
    (ListOffsets, authorised as DESCRIBE, then a Fetch at the end, authorised as READ); a refusal
    (TOPIC_AUTHORIZATION_FAILED) comes back to the client from the cold path too, with no data."""
    props = raw_value_table(tmp_path, "history.t", 10)
    cluster = await FakeCluster.start(nursery)
    cluster.topics, cluster.offsets = ["t"], {"t": (100, 200)}
    if refused == "describe":
        cluster.refuse["t"] = 29  # TOPIC_AUTHORIZATION_FAILED
    elif refused == "read":
        cluster.deny_read["t"] = 29  # may list offsets, may not fetch
    proxy = await start_proxy(nursery, cluster.brokers[0].port,
                              {"catalog": {"name": "lake", **props}, "topics": [{"name": "t", "table": "history.t"}]})
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    T = FetchRequest.FetchTopic
    request = FetchRequest(version=12, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                               version=12, topic="t", partitions=[T.FetchPartition(
                                   version=12, partition=0, current_leader_epoch=-1, fetch_offset=3,
                                   last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])],
                           forgotten_topics_data=[], rack_id="")
    response = await client.call(request, FetchResponse, 12)
    [partition] = response.responses[0].partitions
    if refused:
        assert (partition.error_code, partition.records) == (29, b"")
    else:
        assert partition.error_code == 0 and b"v3" in partition.records and partition.high_watermark == 200
    assert (2, 2) in cluster.brokers[0].received  # asked on the client's own connection (bootstrap = broker 1)
    assert (1, 4) in cluster.brokers[0].received or refused == "describe"  # and the READ probe


async def test_a_writer_group_whose_coordinator_is_another_broker_is_not_a_gap(nursery: trio.Nursery, tmp_path: Any,
                                                                               caplog: pytest.LogCaptureFixture
                                                                               ) -> None:
    """A hole at the seam (the lake ends at 9, the log starts at 100) whose writer is a sink that commits what it
    read to a consumer group: on a cluster, the broker the client reads from is often not the group's
    coordinator and answers OffsetFetch NOT_COORDINATOR.  That is "cannot tell now" (a retriable error, no gap
    counted), not lost data; a connection to the coordinator learns the offset and steps over the hole."""
    from kafka.record.default_records import DefaultRecordBatch

    from ksi.metrics import LAKE_GAPS

    caplog.set_level(logging.INFO)
    props = raw_value_table(tmp_path, "history.t", 10)
    cluster = await FakeCluster.start(nursery)
    cluster.topics, cluster.offsets, cluster.coordinator = ["t"], {"t": (100, 200)}, 2
    cluster.group_offsets[("sink", "t", 0)] = 100
    proxy = await start_proxy(nursery, cluster.brokers[0].port, {"catalog": {"name": "lake", **props}, "topics": [
        {"name": "t", "table": "history.t", "writer_group": "sink"}]})

    async def fetch_at(client: RawClient, offset: int) -> Any:
        T = FetchRequest.FetchTopic
        request = FetchRequest(version=12, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                               isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                                   version=12, topic="t", partitions=[T.FetchPartition(
                                       version=12, partition=0, current_leader_epoch=-1, fetch_offset=offset,
                                       last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])],
                               forgotten_topics_data=[], rack_id="")
        [partition] = (await client.call(request, FetchResponse, 12)).responses[0].partitions
        return partition

    gaps = LAKE_GAPS.labels("t")._value.get()
    client = await RawClient.connect(proxy.bound.bootstrap.port)  # broker 1: not the coordinator
    assert (await fetch_at(client, 3)).error_code == 0  # the lake's: the log start (100) is known now
    answer = await fetch_at(client, 50)
    assert (answer.error_code, answer.records) == (56, b"")  # KAFKA_STORAGE_ERROR: retriable
    assert LAKE_GAPS.labels("t")._value.get() == gaps
    assert "cannot say now which offsets the writer group 'sink' read (NOT_COORDINATOR" in caplog.text
    assert "refusing to skip" not in caplog.text

    ports = {b.node_id: b.port for b in (await metadata(client)).brokers}
    coordinator = await RawClient.connect(ports[2])
    assert (await fetch_at(coordinator, 3)).error_code == 0
    answer = await fetch_at(coordinator, 50)
    assert answer.error_code == 0
    batch = DefaultRecordBatch(bytes(answer.records))
    assert batch.is_control_batch and (batch.base_offset, batch.base_offset + batch.last_offset_delta) == (50, 99)
