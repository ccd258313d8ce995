"""What several ksi instances of one service need from each one, in-process against the fake cluster: the
advertised address of every broker comes from the configuration (advertised ports apart from the ports ksi
listens on), a configured port that cannot be bound stops start-up with the port and the key named, topic
ids are known before any client's Metadata passed through, and a connection max age closes connections
between requests only (in virtual time)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import MetadataRequest

from ksi.config import ConfigError, parse_config
from ksi.server import ListenError, Proxy, discover_nodes
from protocol import frame

from .fakes import FakeBroker, FakeCluster
from .test_connection import Client, MemoryBroker, correlation, open_connection
from .test_proxy import RawClient, make_config, metadata, raw_value_table, start_proxy


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def taken_port() -> tuple[trio.socket.SocketType, int]:
    """A listening socket on a free port: the port is taken until the socket is closed."""
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


async def free_ports(n: int) -> list[int]:
    socks = [await taken_port() for _ in range(n)]
    for sock, _ in socks:
        sock.close()
    return [port for _, port in socks]


# -- advertised ports ---------------------------------------------------------------------------------


async def test_advertised_ports_are_told_to_clients_and_ksi_listens_on_its_own(nursery: trio.Nursery) -> None:
    """Behind a balancer (or with several instances on one host) clients must be told the balancer's port
    per broker, while ksi listens on its own: pinned per node, or numbered from a base like the listen ports."""
    cluster = await FakeCluster.start(nursery, (1, 2, 3))
    one, three, base = await free_ports(3)
    proxy = await start_proxy(nursery, cluster.brokers[0].port, broker_port_base=base,
                              node_ports={"1": one, "3": three}, advertised_host="lb.example",
                              advertised_ports={"1": 19001}, advertised_port_base=29000)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    answer = await metadata(client)
    told = {b.node_id: (b.host, b.port) for b in answer.brokers}
    # node 1: its advertised port; node 2, the first numbered from broker_port_base: the first from 29000;
    # node 3: pinned with no advertised port, so advertised where it listens
    assert told == {1: ("lb.example", 19001), 2: ("lb.example", 29000), 3: ("lb.example", three)}
    assert proxy.cluster.ports == {1: one, 2: base, 3: three}
    for port in proxy.cluster.ports.values():  # ksi's own ports route to their brokers
        direct = await RawClient.connect(port)
        assert (await metadata(direct)).brokers
        await direct.aclose()


async def test_every_instance_configured_alike_advertises_the_same_addresses(nursery: trio.Nursery) -> None:
    cluster = await FakeCluster.start(nursery, (1, 2))
    answers = []
    for _ in range(2):
        proxy = await start_proxy(nursery, cluster.brokers[0].port, advertised_host="ksi.example",
                                  advertised_ports={"1": 9093, "2": 9094})
        client = await RawClient.connect(proxy.bound.bootstrap.port)
        answers.append(sorted((b.node_id, b.host, b.port) for b in (await metadata(client)).brokers))
    assert answers[0] == answers[1] == [(1, "ksi.example", 9093), (2, "ksi.example", 9094)]


def test_advertised_port_settings_are_checked() -> None:
    def config(**proxy: Any) -> Any:
        return parse_config({"proxy": proxy, "upstream": {"bootstrap_servers": "k:9092"}}, "ksi.toml")

    assert config(advertised_ports={"1": 9093}).proxy.advertised_ports == {1: 9093}
    assert config(connection_max_age_seconds=300).proxy.connection_max_age_seconds == 300.0
    for proxy, message in [
        ({"advertised_ports": {"x": 9093}}, "ksi.toml: proxy.advertised_ports.x: node id must be an integer"),
        ({"advertised_ports": {"1": 70000}}, "ksi.toml: proxy.advertised_ports.1: must be a port number"),
        ({"advertised_ports": {"1": 9093, "2": 9093}},
         "proxy.advertised_ports.2: port 9093 is already proxy.advertised_ports.1's"),
        ({"node_ports": {"1": 9093, "2": 9093}}, "proxy.node_ports.2: port 9093 is already"),
        ({"advertised_port_base": 0x10000}, "proxy.advertised_port_base: must be a port number"),
        ({"broker_port_base": 0, "advertised_port_base": 9300}, "proxy.advertised_port_base: needs broker_port_base"),
        ({"connection_max_age_seconds": -1}, "proxy.connection_max_age_seconds: must be >= 0"),
    ]:
        with pytest.raises(ConfigError) as caught:
            config(**proxy)
        assert message in str(caught.value)


# -- ports that cannot be bound -------------------------------------------------------------------------


async def test_a_taken_bootstrap_port_is_a_start_up_error_naming_the_port_and_key(nursery: trio.Nursery) -> None:
    cluster = await FakeCluster.start(nursery, (1,))
    sock, port = await taken_port()
    with sock:
        proxy = Proxy(make_config(cluster.brokers[0].port, listen=f"127.0.0.1:{port}"))
        with pytest.raises(ListenError) as caught:  # raised by run() itself, not inside an exception group
            await proxy.run()
    assert str(caught.value) == (f"cannot listen on 127.0.0.1:{port} (proxy.listen in test.toml, the bootstrap"
                                 " listener): address already in use")
    assert caught.value.key == "proxy.listen"


@pytest.mark.parametrize("pinned", [True, False], ids=["node_ports", "broker_port_base"])
async def test_a_taken_broker_port_is_a_start_up_error_and_nothing_is_served(nursery: trio.Nursery,
                                                                          pinned: bool) -> None:
    cluster = await FakeCluster.start(nursery, (1,))
    sock, port = await taken_port()
    [bootstrap] = await free_ports(1)
    ports: dict[str, Any] = {"node_ports": {"1": port}} if pinned else {"broker_port_base": port}
    with sock:
        proxy = Proxy(make_config(cluster.brokers[0].port, listen=f"127.0.0.1:{bootstrap}", **ports))
        with pytest.raises(ListenError) as caught:
            await proxy.run()
        with pytest.raises(OSError):  # the bootstrap port was bound, never served, and is closed again
            await trio.open_tcp_stream("127.0.0.1", bootstrap)
    key = "proxy.node_ports.1" if pinned else "proxy.broker_port_base"
    assert str(caught.value) == (f"cannot listen on 127.0.0.1:{port} ({key} in test.toml, broker 1):"
                                 " address already in use")


async def test_a_taken_metrics_port_is_a_start_up_error(nursery: trio.Nursery) -> None:
    cluster = await FakeCluster.start(nursery, (1,))
    sock, port = await taken_port()
    with sock:
        proxy = Proxy(make_config(cluster.brokers[0].port, {"metrics": {"listen": f"127.0.0.1:{port}"}}))
        with pytest.raises(ListenError, match=rf"cannot listen on 127.0.0.1:{port} \(metrics.listen in test.toml"):
            await proxy.run()


async def test_ksi_dev_listens_on_a_free_port_instead(nursery: trio.Nursery) -> None:
    cluster = await FakeCluster.start(nursery, (1,))
    sock, port = await taken_port()
    with sock:
        proxy = Proxy(make_config(cluster.brokers[0].port, node_ports={"1": port}), strict_ports=False)
        with pytest.raises(ListenError):  # pinned ports are bound at start-up, dev or not
            await proxy.run()
        proxy = Proxy(make_config(cluster.brokers[0].port, broker_port_base=port), strict_ports=False)
        await nursery.start(proxy.run)
        client = await RawClient.connect(proxy.bound.bootstrap.port)
        [told] = (await metadata(client)).brokers
        assert told.port == proxy.cluster.ports[1] != port


async def test_a_broker_that_appears_later_on_a_taken_port_is_advertised_and_bound_once_free(
        nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    """While serving, a new broker whose port is taken is an error in the log, not a different port: it is
    advertised at its configured address (another instance may serve it) and bound at a later discovery."""
    cluster = await FakeCluster.start(nursery, (1,))
    sock, port = await taken_port()
    proxy = await start_proxy(nursery, cluster.brokers[0].port, node_ports={"1": (await free_ports(1))[0]},
                              broker_port_base=port)
    cluster.brokers.append(await nursery.start(FakeBroker(2, cluster).serve))
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    told = {b.node_id: b.port for b in (await metadata(client)).brokers}
    assert told[2] == port and 2 not in proxy.cluster.ports
    assert f"cannot listen on 127.0.0.1:{port} (proxy.broker_port_base in test.toml, broker 2)" in caplog.text
    sock.close()
    with trio.fail_after(10):  # discovery every 0.5 s (make_config); a failed port is tried again after that
        while proxy.cluster.ports.get(2) != port:
            await trio.sleep(0.1)
    direct = await RawClient.connect(port)
    assert (await metadata(direct)).controller_id == 2


# -- topic ids ------------------------------------------------------------------------------------------


async def test_discovery_learns_topic_ids(nursery: trio.Nursery) -> None:
    cluster = await FakeCluster.start(nursery, (1, 2))
    cluster.topics = ["t", "u"]
    nodes, topics = await discover_nodes(make_config(cluster.brokers[0].port), with_topics=True)
    assert sorted(n.node_id for n in nodes) == [1, 2]
    assert topics == {"t": cluster.topic_id, "u": cluster.topic_id}
    _, none = await discover_nodes(make_config(cluster.brokers[0].port))
    assert none is None


async def test_a_fetch_by_topic_id_is_served_from_the_lake_before_any_metadata_passed(nursery: trio.Nursery,
                                                                                      tmp_path: Any) -> None:
    """Another instance answered the client's Metadata; this one gets the Fetch v13 by topic id first."""
    props = raw_value_table(tmp_path, "history.t", 10)
    cluster = await FakeCluster.start(nursery, (1,))
    cluster.topics, cluster.offsets = ["t"], {"t": (5, 10)}
    proxy = await start_proxy(nursery, cluster.brokers[0].port, {"catalog": props,
                                                                 "topics": [{"name": "t", "table": "history.t"}]})
    client = await RawClient.connect(proxy.cluster.ports[1])
    T = FetchRequest.FetchTopic
    request = FetchRequest(version=13, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                               version=13, topic_id=cluster.topic_id, partitions=[T.FetchPartition(
                                   version=13, partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])],
                           forgotten_topics_data=[], rack_id="")
    response = await client.call(request, FetchResponse, 13)
    [part] = response.responses[0].partitions
    assert part.error_code == 0 and part.log_start_offset == 0 and len(part.records) > 0


# -- connection max age (virtual time) --------------------------------------------------------------------


async def metadata_call(client: Client, correlation_id: int) -> bytes | None:
    await client.send(MetadataRequest(version=1, topics=[]), 1, correlation_id)
    return await client.receive()


async def test_max_age_closes_a_busy_connection_between_requests(nursery: trio.Nursery,
                                                                 autojump_clock: trio.testing.MockClock) -> None:
    broker = MemoryBroker()
    broker.delay[3] = 4.0  # each answer takes 4 virtual seconds: a request is in flight most of the time
    client, connection, done = await open_connection(nursery, broker, connection_max_age_seconds=60)
    start = trio.current_time()
    answered = 0
    while True:
        raw = await metadata_call(client, answered + 1)
        if raw is None:
            break
        assert correlation(raw) == answered + 1
        answered += 1
    await done.wait()
    # every request sent before the close was answered; the close came after the last answer, at 54-64 s
    assert broker.received and len(broker.received) == answered
    assert 54 <= trio.current_time() - start <= 64
    assert "connection_max_age_seconds" in str(connection._error)


async def test_max_age_closes_an_idle_connection_and_waits_for_a_partial_request(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    broker = MemoryBroker()
    client, _, done = await open_connection(nursery, broker, connection_max_age_seconds=60)
    assert await metadata_call(client, 1) is not None
    request = MetadataRequest(version=1, topics=[])
    request.with_header(correlation_id=2, client_id="mem")
    data = frame(bytes(request.encode(version=1, header=True)))
    await client.stream.send_all(data[:5])  # half a request when the age passes: not closed under it
    await trio.sleep(120)
    assert not done.is_set()
    await client.stream.send_all(data[5:])
    raw = await client.receive()
    assert raw is not None and correlation(raw) == 2
    assert await client.receive() is None  # then closed at once: it is past its age and nothing is owed
    await done.wait()


async def test_no_max_age_by_default(nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    broker = MemoryBroker()
    client, _, done = await open_connection(nursery, broker)
    for i in range(10):
        assert await metadata_call(client, i) is not None
        await trio.sleep(500)  # under the idle timeout each time; 5000 s in all
    assert not done.is_set()


async def test_max_age_over_real_sockets_closes_between_requests(nursery: trio.Nursery) -> None:
    cluster = await FakeCluster.start(nursery, (1,))
    proxy = await start_proxy(nursery, cluster.brokers[0].port, connection_max_age_seconds=0.5)
    client = await RawClient.connect(proxy.bound.bootstrap.port)
    await metadata(client)
    await trio.sleep(0.7)
    assert await client.closed_by_proxy()
    fresh = await RawClient.connect(proxy.bound.bootstrap.port)  # the client reconnects and is served
    assert (await metadata(fresh)).cluster_id == "fake"
