"""ClientConnection over memory streams (trio.testing.memory_stream_pair), with a fake broker on the other
end of a memory stream too, and trio's MockClock for everything that waits: request and idle timeouts and
the connect backoff run in virtual time, never in real sleeps."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from ksi.cluster import Cluster
from ksi.config import HostPort
from ksi.connection import ClientConnection
from ksi.context import ProxyContext
from ksi.filters import Defer, Filter, FilterChain, Request, Session, build_chain
from ksi.history.topic_ids import TopicIds
from ksi.upstream import UpstreamError
from protocol import FrameReader, api, encode_response_header, frame, parse_request_header, response_body_offset

from .fakes import FakeCluster
from .test_proxy import make_config

BROKER = HostPort("127.0.0.1", 9092)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class MemoryBroker:
    """The fake cluster's broker 1 answering over memory streams; ``silent`` API keys are never answered,
    ``delay`` holds an answer back (virtual seconds)."""

    def __init__(self) -> None:
        self.cluster = FakeCluster()
        from .fakes import FakeBroker

        self.broker = FakeBroker(1, self.cluster, port=9092)
        self.cluster.brokers.append(self.broker)
        self.received: list[bytes] = []
        self.silent: set[int] = set()
        self.delay: dict[int, float] = {}
        self.connections = 0
        self.refuse = 0  # connection attempts to fail before one succeeds

    async def serve(self, stream: trio.abc.Stream) -> None:
        reader = FrameReader(1 << 24)
        async with stream:
            while data := await stream.receive_some(65536):
                reader.receive_data(data)
                while (request := reader.next_frame()) is not None:
                    self.received.append(bytes(request))
                    header = parse_request_header(request)
                    if header.api_key in self.silent:
                        continue
                    await trio.sleep(self.delay.get(header.api_key, 0))
                    body = self.broker.answer(header.api_key, header.api_version, request[header.body_offset:])
                    if body is None:
                        continue
                    entry = api(header.api_key)
                    assert entry is not None
                    head = encode_response_header(header.correlation_id,
                                                  entry.response_header_version(header.api_version))
                    await stream.send_all(frame(head + body))

    def dialer(self, nursery: trio.Nursery) -> Callable[..., Any]:
        async def dial(targets: list[HostPort], timeout: float,  # noqa: ASYNC109 - ksi.upstream.connect's signature
                       tls: Any) -> tuple[trio.abc.Stream, HostPort]:
            if self.refuse:
                self.refuse -= 1
                raise UpstreamError("cannot reach the Kafka cluster (refused)")
            self.connections += 1
            ours, theirs = trio.testing.memory_stream_pair()
            nursery.start_soon(self.serve, theirs)
            return ours, targets[0]
        return dial


class Client:
    """The client end of a memory stream: frames out, frames in."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = FrameReader(1 << 24)

    async def send(self, message: Any, version: int, correlation_id: int) -> None:
        message.with_header(correlation_id=correlation_id, client_id="mem")
        await self.stream.send_all(frame(bytes(message.encode(version=version, header=True))))

    async def receive(self) -> bytes | None:
        while (f := self.reader.next_frame()) is None:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.reader.receive_data(data)
        return bytes(f)


async def open_connection(nursery: trio.Nursery, broker: MemoryBroker, chain: FilterChain | None = None,
                          backoffs: dict[Any, Any] | None = None,
                          **proxy: Any) -> tuple[Client, ClientConnection, trio.Event]:
    config = make_config(9092, **proxy)

    async def open_listener(node_id: int, port: int) -> int:
        return 40000 + node_id

    ctx = ProxyContext(config=config, cluster=Cluster(config.proxy, open_listener), draining=trio.Event(),
                       connections=set(), topic_ids=TopicIds(), connect=broker.dialer(nursery), chain=chain,
                       backoffs={} if backoffs is None else backoffs)
    ours, theirs = trio.testing.memory_stream_pair()
    connection = ClientConnection(theirs, "bootstrap", lambda: [BROKER], ctx, peer="memory")
    done = trio.Event()

    async def run() -> None:
        try:
            await connection.serve()
        finally:
            done.set()

    nursery.start_soon(run)
    return Client(ours), connection, done


def correlation(raw: bytes) -> int:
    return int(struct.unpack_from(">i", raw)[0])


async def test_an_unfiltered_request_reaches_the_broker_with_only_its_correlation_id_changed(
        nursery: trio.Nursery) -> None:
    broker = MemoryBroker()
    client, _, _ = await open_connection(nursery, broker)
    request = MetadataRequest(version=1, topics=[])
    await client.send(ProduceRequest(version=7, transactional_id=None, acks=0, timeout_ms=100, topic_data=[]), 7, 41)
    await client.send(request, 1, 42)
    raw = await client.receive()
    assert raw is not None and correlation(raw) == 42
    assert MetadataResponse.decode(raw[4:], version=1).brokers[0].port == 40001  # rewritten by its filter
    produce, metadata = broker.received
    request.with_header(correlation_id=42, client_id="mem")
    sent = bytes(request.encode(version=1, header=True))
    assert metadata[:4] == sent[:4] and metadata[8:] == sent[8:]    # only the correlation id differs
    assert produce[:2] == b"\x00\x00"                                # acks=0: forwarded, never answered


async def test_responses_keep_request_order_across_a_slow_broker(nursery: trio.Nursery,
                                                                  autojump_clock: trio.testing.MockClock) -> None:
    broker = MemoryBroker()
    broker.delay[3] = 5.0  # the broker holds Metadata for five virtual seconds ...
    client, _, _ = await open_connection(nursery, broker)
    await client.send(MetadataRequest(version=1, topics=[]), 1, 1)
    too_new = ApiVersionsRequest(version=3, client_software_name="t", client_software_version="1")
    too_new.with_header(correlation_id=2, client_id="mem")
    data = bytearray(too_new.encode(version=3, header=True))
    struct.pack_into(">h", data, 2, 99)  # ... while ksi answers this ApiVersions v99 itself at once
    await client.stream.send_all(frame(bytes(data)))
    start = trio.current_time()
    first, second = await client.receive(), await client.receive()
    assert first is not None and second is not None
    assert [correlation(first), correlation(second)] == [1, 2]
    assert trio.current_time() - start >= 5.0
    assert ApiVersionsResponse.decode(second[4:], version=0).error_code == 35


async def test_a_malformed_request_closes_the_connection_after_earlier_answers(nursery: trio.Nursery) -> None:
    """Kafka reads a connection's next request only after answering the last, so a request it cannot read
    closes the connection after the answers before it: ksi does the same."""
    broker = MemoryBroker()
    client, connection, done = await open_connection(nursery, broker)
    await client.send(MetadataRequest(version=1, topics=[]), 1, 7)
    await client.stream.send_all(struct.pack(">i", 3) + b"\x00\x03\x00")  # shorter than any header
    raw = await client.receive()
    assert raw is not None and correlation(raw) == 7
    assert await client.receive() is None
    await done.wait()
    assert "malformed request header" in str(connection._error)


async def test_request_timeout_in_virtual_time(nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    broker = MemoryBroker()
    broker.silent.add(3)
    client, connection, done = await open_connection(nursery, broker, request_timeout_seconds=30)
    start = trio.current_time()
    await client.send(MetadataRequest(version=1, topics=[]), 1, 1)
    assert await client.receive() is None
    await done.wait()
    waited = trio.current_time() - start
    assert 30 <= waited <= 30 * 1.25  # checked every eighth of the timeout
    assert isinstance(connection._error, UpstreamError) and "request_timeout_seconds" in str(connection._error)


async def test_idle_timeout_in_virtual_time(nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    broker = MemoryBroker()
    client, connection, done = await open_connection(nursery, broker, idle_timeout_seconds=600)
    await client.send(MetadataRequest(version=1, topics=[]), 1, 1)
    assert await client.receive() is not None
    answered = trio.current_time()
    await done.wait()
    assert 600 <= trio.current_time() - answered <= 600 * 1.25
    assert "no request for 600 s" in str(connection._error)


async def test_connect_backoff_in_virtual_time(nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    """While the broker refuses connections, each client connection closes only after the shared backoff
    (100 ms doubling), so clients reconnect no faster than they would back off."""
    broker = MemoryBroker()
    broker.refuse = 2
    waits, backoffs = [], {}  # type: ignore[var-annotated]
    for _ in range(3):
        client, _, done = await open_connection(nursery, broker, backoffs=backoffs)
        start = trio.current_time()
        await client.send(MetadataRequest(version=1, topics=[]), 1, 1)
        answer = await client.receive()
        waits.append(trio.current_time() - start)
        if answer is None:
            await done.wait()
    assert waits[:2] == pytest.approx([0.1, 0.2])
    assert broker.connections == 1  # the third attempt connected and was answered


async def with_filter_last(nursery: trio.Nursery, broker: MemoryBroker, last: Filter) -> Client:
    """A connection whose chain is ksi's own with ``last`` appended."""
    config = make_config(9092)

    async def open_listener(node_id: int, port: int) -> int:
        return 40000 + node_id

    chain = build_chain(Cluster(config.proxy, open_listener), TopicIds())
    client, _, _ = await open_connection(nursery, broker, FilterChain([*chain.filters, last]))
    return client


class Exploding(Filter):
    """A filter with a bug: Kafka's broker answers UNKNOWN_SERVER_ERROR for a request whose handling fails."""

    name = "exploding"

    def wants_request(self, api_key: int, api_version: int) -> bool:
        return api_key in (0, 3)

    def on_request(self, request: Request, session: Session) -> Any:
        if request.header.api_key == 3:
            return Defer(self.later)
        raise RuntimeError("bug")

    async def later(self, *args: Any) -> bytes:
        raise KeyError("bug")


async def test_a_failing_filter_answers_unknown_server_error_and_keeps_the_connection(
        nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    broker = MemoryBroker()
    client = await with_filter_last(nursery, broker, Exploding())
    T = ProduceRequest.TopicProduceData
    produce = ProduceRequest(version=7, transactional_id=None, acks=1, timeout_ms=100, topic_data=[
        T(version=7, name="t", partition_data=[T.PartitionProduceData(version=7, index=3, records=b"")])])
    await client.send(produce, 7, 1)
    await client.send(MetadataRequest(version=9, topics=[MetadataRequest.MetadataRequestTopic(version=9, name="t")]),
                      9, 2)
    raw = await client.receive()
    assert raw is not None and correlation(raw) == 1
    [topic] = ProduceResponse.decode(raw[4:], version=7).responses
    assert (topic.name, topic.partition_responses[0].index, topic.partition_responses[0].error_code) == ("t", 3, -1)
    raw = await client.receive()
    assert raw is not None and correlation(raw) == 2
    answer = MetadataResponse.decode(raw[response_body_offset(raw, 1):], version=9)
    assert [(t.name, t.error_code) for t in answer.topics] == [("t", -1)]
    assert "the exploding filter failed on Produce v7" in caplog.text
    await client.send(MetadataRequest(version=1, topics=[]), 1, 3)  # still open, still served
    raw = await client.receive()
    assert raw is not None and correlation(raw) == 3


class ExplodingOnLogin(Filter):
    """A bug in a filter that sees SaslHandshake, SaslAuthenticate and ApiVersions."""

    name = "exploding"

    def wants_request(self, api_key: int, api_version: int) -> bool:
        return api_key in (17, 18, 36)

    def on_request(self, request: Request, session: Session) -> Any:
        raise RuntimeError("bug")


async def test_a_failing_sasl_or_api_versions_filter_answers_and_keeps_the_connection(
        nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    """Kafka answers these too with their error response (``getErrorResponse``), not by closing."""
    broker = MemoryBroker()
    client = await with_filter_last(nursery, broker, ExplodingOnLogin())
    await client.send(SaslHandshakeRequest(version=1, mechanism="PLAIN"), 1, 1)
    await client.send(SaslAuthenticateRequest(version=2, auth_bytes=b"\0user\0password"), 2, 2)
    await client.send(ApiVersionsRequest(version=3, client_software_name="mem", client_software_version="1"), 3, 3)
    raw = await client.receive()
    assert raw is not None and correlation(raw) == 1
    handshake = SaslHandshakeResponse.decode(raw[4:], version=1)
    assert (handshake.error_code, handshake.mechanisms) == (-1, [])
    raw = await client.receive()
    assert raw is not None and correlation(raw) == 2
    authenticate = SaslAuthenticateResponse.decode(raw[response_body_offset(raw, 1):], version=2)
    assert (authenticate.error_code, authenticate.auth_bytes) == (-1, b"")
    raw = await client.receive()
    assert raw is not None and correlation(raw) == 3
    versions = ApiVersionsResponse.decode(raw[4:], version=0)  # header v0 and, for an error, a v0 body
    assert (versions.error_code, versions.api_keys) == (-1, [])
    assert "the exploding filter failed on SaslHandshake v1" in caplog.text
    await client.send(MetadataRequest(version=1, topics=[]), 1, 4)  # still open, still served
    raw = await client.receive()
    assert raw is not None and correlation(raw) == 4
    assert not any(parse_request_header(r).api_key in (17, 36) for r in broker.received)


class ProbeSession:
    """The history router's view of a client connection, answering from the fake broker."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.marks: dict[Any, Any] = {}
        self.denied: set[str] = set()
        self.principal = "User:ANONYMOUS"
        self.asked: list[int] = []

    async def call(self, payload: bytes, api_name: str) -> bytes:
        header = parse_request_header(payload)
        self.asked.append(header.api_key)
        body = self.broker.broker.answer(header.api_key, header.api_version, payload[header.body_offset:])
        assert body is not None
        return struct.pack(">i", header.correlation_id) + body


async def test_watermarks_are_kept_for_one_second_in_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    """The broker's log start and verdict are asked on the client's own connection and kept for
    WATERMARK_TTL_SECONDS of trio's clock (here a mock clock: virtual time)."""
    from ksi.history import watermarks

    broker = MemoryBroker()
    broker.cluster.offsets["t"] = (100, 200)
    session = ProbeSession(broker)
    learnt: list[tuple[str, int, int]] = []

    def note(topic: str, partition: int, offset: int) -> None:
        learnt.append((topic, partition, offset))

    await watermarks.learn(session, [("t", 0)], 0, note)
    assert session.asked == [2, 2, 1]  # EARLIEST, LATEST, then the READ probe
    marks = watermarks.marks_of(session, "t", 0)
    assert isinstance(marks, watermarks.Watermarks)
    assert (marks.log_start_offset, marks.high_watermark) == (100, 200) and learnt == [("t", 0, 100)]
    await trio.sleep(watermarks.WATERMARK_TTL_SECONDS * 0.9)
    await watermarks.learn(session, [("t", 0)], 0, note)
    assert session.asked == [2, 2, 1]  # still fresh: not asked again
    await trio.sleep(watermarks.WATERMARK_TTL_SECONDS * 0.2)
    assert watermarks.marks_of(session, "t", 0) is None
    broker.cluster.offsets["t"] = (150, 250)
    await watermarks.learn(session, [("t", 0)], 0, note)
    assert session.asked == [2, 2, 1, 2, 2, 1]
    marks = watermarks.marks_of(session, "t", 0)
    assert isinstance(marks, watermarks.Watermarks) and marks.log_start_offset == 150


async def test_frames_sent_at_once_on_one_broker_connection_go_whole_and_in_turn() -> None:
    """The upstream connection writes one frame at a time: while a write waits (a lockstep stream waits for
    the reader), the forwarded request and ksi's own requests behind it wait for their turn, in order, and a
    waiter that is cancelled gives its turn up."""
    from ksi.upstream import UpstreamConnection

    ours, theirs = trio.testing.lockstep_stream_pair()
    upstream = UpstreamConnection(ours, BROKER, 1 << 20)

    def request(correlation_id: int, size: int) -> bytearray:
        body = struct.pack(">hhih", 18, 0, correlation_id, -1) + bytes([correlation_id]) * size
        return bytearray(frame(body))

    gives_up = trio.CancelScope()

    async def third() -> None:
        with gives_up:
            await upstream.forward(request(3, 100), "third", "ApiVersions")

    reader = FrameReader(1 << 20)
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(upstream.forward, request(1, 5000), "first", "ApiVersions")
        await trio.testing.wait_all_tasks_blocked()  # the first write waits for the reader
        nursery.start_soon(upstream.send, bytes(request(2, 3000))[4:], "ApiVersions", False)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(third)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(upstream.forward, request(4, 2000), "fourth", "ApiVersions")
        await trio.testing.wait_all_tasks_blocked()
        gives_up.cancel()  # the third never had the turn: cancelled while it waited
        while len(got) < 3:
            reader.receive_data(await theirs.receive_some(700))
            while (whole := reader.next_frame()) is not None:
                got.append(bytes(whole))
    # whole frames, each the request's own bytes after ksi's correlation id, in the order they asked
    assert [(parse_request_header(f).correlation_id, len(f), set(f[10:])) for f in got] == [
        (1, 5010, {1}), (2, 3010, {2}), (4, 2010, {4})]
    assert reader.buffered == 0


async def test_relay_sockets_have_no_notsent_low_watermark() -> None:
    """trio limits unsent bytes in the kernel to 16 KiB per socket; ksi's sockets go back to the system's
    default, so a whole frame can be written at once to a client that reads slowly."""
    from ksi import rawio

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with listeners[0], await trio.open_tcp_stream("127.0.0.1", port) as stream:
        lowat = trio.socket.TCP_NOTSENT_LOWAT
        assert stream.getsockopt(trio.socket.IPPROTO_TCP, lowat) == 1 << 14  # trio's own setting
        rawio.relay_socket(stream)
        assert stream.getsockopt(trio.socket.IPPROTO_TCP, lowat) == 0  # the sysctl's, unlimited by default
        rawio.relay_socket(trio.testing.memory_stream_pair()[0])  # other streams: nothing to set
