"""Large frames relayed unread (splice(2): ksi.rawio.splice, docs/passthrough.md) over real TCP sockets on
loopback, with the test playing both the client and the broker byte by byte: frames intact and in order
among small ones, the threshold, a response that is not at the head of the queue, peers that go away
mid-splice, and the streams that cannot splice."""

from __future__ import annotations

import os
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing
from kafka.protocol.consumer import FetchResponse

from ksi import rawio
from ksi.cluster import Cluster
from ksi.config import HostPort
from ksi.connection import ClientConnection
from ksi.context import ProxyContext
from ksi.filters import Defer, Filter, FilterChain, Request, Response, Session, build_chain
from ksi.filters.history import HistoryFilter
from ksi.history.topic_ids import TopicIds
from ksi.slots import ClientGone
from ksi.upstream import UpstreamError
from protocol import FrameReader, RequestHeader, api, encode_body, encode_response_header, parse_request_header
from protocol.errors import KAFKA_STORAGE_ERROR, NONE, OFFSET_OUT_OF_RANGE

from .test_proxy import make_config

BROKER = HostPort("127.0.0.1", 9092)
_I32 = struct.Struct(">i")
PRODUCE, FETCH, DESCRIBE_CLUSTER = 0, 1, 60

pytestmark = pytest.mark.skipif(not rawio._SPLICE, reason="no splice(2) here, or KSI_SPLICE=0")


async def tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    ours = trio.socket.socket()
    await ours.connect(listener.getsockname())
    theirs, _ = await listener.accept()
    listener.close()
    return trio.SocketStream(ours), trio.SocketStream(theirs)


def request(api_key: int, correlation_id: int, body_bytes: int, acks: int = -1) -> bytes:
    """A request frame: Produce v9 (header v2, then a null transactional id and ``acks``) or Fetch v12, with
    ``body_bytes`` of random bytes after what ksi reads of it."""
    head = struct.pack(">hhih", api_key, 9 if api_key == PRODUCE else 12, correlation_id, 4) + b"test" + b"\x00"
    if api_key == PRODUCE:
        head += b"\x00" + struct.pack(">hi", acks, 30_000)
    elif api_key == DESCRIBE_CLUSTER:
        head = struct.pack(">hhih", api_key, 0, correlation_id, 4) + b"test" + b"\x00"
    payload = head + os.urandom(body_bytes)
    return _I32.pack(len(payload)) + payload


def response(correlation_id: int, body_bytes: int) -> bytes:
    payload = _I32.pack(correlation_id) + b"\x00" + os.urandom(body_bytes)  # response header v1, then the body
    return _I32.pack(len(payload)) + payload


def same_but_correlation(got: bytes, sent: bytes) -> bool:
    """A frame as relayed: the same bytes but the correlation id (request: after api key and version)."""
    return len(got) == len(sent) and got[:8] == sent[:8] and got[12:] == sent[12:]


async def read_frames(stream: trio.abc.Stream, count: int) -> list[bytes]:
    reader, out = FrameReader(1 << 26), []
    while len(out) < count:
        data = await stream.receive_some(1 << 20)
        if not data:
            break
        reader.receive_data(data)
        while (f := reader.next_sized()) is not None:
            out.append(bytes(f))
    return out


class Splices:
    """rawio.splice, counted: the bytes of each call by the stream they came from."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[trio.abc.Stream, int]] = []
        real = rawio.splice

        async def counted(source: trio.abc.Stream, destination: trio.abc.Stream, count: int,
                          pipe: rawio.Pipe) -> None:
            self.calls.append((source, count))
            await real(source, destination, count, pipe)

        monkeypatch.setattr(rawio, "splice", counted)

    def sizes_from(self, stream: trio.abc.Stream) -> list[int]:
        return [count for source, count in self.calls if source is stream]


class Proxied:
    """One client connection over TCP, its broker connection over TCP to the test (``broker``)."""

    def __init__(self) -> None:
        self.client: trio.SocketStream
        self.broker: trio.SocketStream
        self.proxy_side: trio.SocketStream  # ksi's end of the client connection
        self.upstream_side: trio.SocketStream  # ksi's end of the broker connection
        self.connection: ClientConnection
        self.done = trio.Event()
        self._dialed = trio.Event()

    async def broker_stream(self) -> trio.SocketStream:
        await self._dialed.wait()
        return self.broker


@asynccontextmanager
async def proxied(chain: Callable[[ProxyContext], FilterChain] | None = None) -> AsyncIterator[Proxied]:
    out = Proxied()
    config = make_config(9092)

    async def open_listener(node_id: int, port: int) -> int:
        return 40000 + node_id

    async def dial(targets: list[HostPort], timeout: float, tls: Any) -> tuple[trio.abc.Stream, HostPort]:  # noqa: ASYNC109
        out.upstream_side, out.broker = await tcp_pair()
        out._dialed.set()
        return out.upstream_side, targets[0]

    async with trio.open_nursery() as nursery:
        ctx = ProxyContext(config=config, cluster=Cluster(config.proxy, open_listener), draining=trio.Event(),
                           connections=set(), topic_ids=TopicIds(), connect=dial)
        ctx.chain = chain(ctx) if chain is not None else None
        out.client, out.proxy_side = await tcp_pair()
        out.connection = ClientConnection(out.proxy_side, "bootstrap", lambda: [BROKER], ctx, peer="test")

        async def run() -> None:
            try:
                await out.connection.serve()
            finally:
                out.done.set()

        nursery.start_soon(run)
        try:
            yield out
        finally:
            # (a client that closes with requests unanswered waits for their responses: the broker goes too)
            await out.client.aclose()
            if out._dialed.is_set():
                await out.broker.aclose()
            with trio.fail_after(5):
                await out.done.wait()


async def test_large_frames_are_spliced_intact_and_in_order_among_small_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    splices = Splices(monkeypatch)
    async with proxied() as p:
        # A small request first opens the broker connection (a connection's first request is read whole).
        first = request(PRODUCE, 1, 10)
        await p.client.send_all(first)
        broker = await p.broker_stream()
        [got] = await read_frames(broker, 1)
        assert same_but_correlation(got, first)
        ours = _I32.unpack_from(got, 8)[0]
        await broker.send_all(response(ours, 5))
        requests = [request(PRODUCE, 2, 1 << 20), request(PRODUCE, 3, 100), request(PRODUCE, 4, 0, acks=0),
                    request(PRODUCE, 5, 300_000), request(FETCH, 6, 40), request(PRODUCE, 7, 2 << 20, acks=0),
                    request(FETCH, 8, 20)]

        async def send() -> None:
            for r in requests:
                await p.client.send_all(r)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            received = await read_frames(broker, len(requests))
        assert len(received) == len(requests)
        for got, sent in zip(received, requests, strict=True):
            assert same_but_correlation(got, sent)
        ids = [_I32.unpack_from(f, 8)[0] for f in received]
        answered = [i for i, r in zip(ids, requests, strict=True) if struct.unpack_from(">h", r, 4 + 10 + 4 + 2)[0]
                    != 0 or r[5] == FETCH]
        # acks=0 Produce requests are not answered; the others are, with large and small responses mixed
        sizes = [3 << 20, 50, 500_000, 10, 70_000]
        responses = [response(i, size) for i, size in zip(answered, sizes, strict=True)]

        async def answer() -> None:
            await broker.send_all(b"".join(responses))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer)
            back = await read_frames(p.client, 1 + len(responses))
        assert [_I32.unpack_from(f, 4)[0] for f in back] == [1, 2, 3, 5, 6, 8]
        for got, sent in zip(back[1:], responses, strict=True):
            assert got[8:] == sent[8:] and len(got) == len(sent)
    # The large frames went through the pipes: requests from the client's socket, responses from the broker's.
    assert sum(splices.sizes_from(p.proxy_side)) > (1 << 20) + (2 << 20)
    assert sum(splices.sizes_from(p.upstream_side)) > (3 << 20)


async def test_a_frame_whose_unread_rest_is_under_the_threshold_is_read_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    splices = Splices(monkeypatch)
    monkeypatch.setattr(rawio, "SPLICE_MIN_BYTES", 256 * 1024)
    async with proxied() as p:
        await p.client.send_all(request(PRODUCE, 1, 10))
        broker = await p.broker_stream()
        await read_frames(broker, 1)
        small, large = request(PRODUCE, 2, 300_000), request(PRODUCE, 3, 2 << 20)
        await p.client.send_all(small)
        [got] = await read_frames(broker, 1)
        assert same_but_correlation(got, small)
        assert splices.calls == []  # 300 kB: the first 256 KiB read whole, the rest under the threshold
        await p.client.send_all(large)
        [got] = await read_frames(broker, 1)
        assert same_but_correlation(got, large)
        assert splices.sizes_from(p.proxy_side) != []


class Held(Filter):
    """DescribeCluster is answered by ksi, when the test says."""

    name = "held"

    def __init__(self) -> None:
        self.release = trio.Event()

    def wants_request(self, api_key: int, api_version: int) -> bool:
        return api_key == DESCRIBE_CLUSTER

    def on_request(self, request: Request, session: Session) -> Defer:
        return Defer(self.answer)

    async def answer(self, header: RequestHeader, frame: Any, session: Session, client: str) -> bytes:
        await self.release.wait()
        return b"\x00\x00\x00\x00" + b"held"


async def test_a_response_not_at_the_head_of_the_queue_is_read_whole_and_waits_its_turn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    splices = Splices(monkeypatch)
    held = Held()
    async with proxied(lambda ctx: FilterChain([held])) as p:
        await p.client.send_all(request(PRODUCE, 1, 10))
        broker = await p.broker_stream()
        [got] = await read_frames(broker, 1)
        await broker.send_all(response(_I32.unpack_from(got, 8)[0], 1))
        await p.client.send_all(request(DESCRIBE_CLUSTER, 2, 0) + request(FETCH, 3, 10))
        [fetch] = await read_frames(broker, 1)
        big = response(_I32.unpack_from(fetch, 8)[0], 2 << 20)
        await broker.send_all(big)
        await trio.sleep(0.2)
        held.release.set()
        back = await read_frames(p.client, 3)
        assert [_I32.unpack_from(f, 4)[0] for f in back] == [1, 2, 3]
        assert back[1][8:] == b"held" and back[2][8:] == big[8:]
    assert splices.sizes_from(p.upstream_side) == []


async def test_a_broker_closing_mid_splice_ends_the_connection_as_a_lost_broker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    splices = Splices(monkeypatch)
    async with proxied() as p:
        await p.client.send_all(request(FETCH, 1, 10))
        broker = await p.broker_stream()
        [got] = await read_frames(broker, 1)
        whole = response(_I32.unpack_from(got, 8)[0], 4 << 20)
        await broker.send_all(whole[:1 << 20])
        await trio.sleep(0.1)
        await broker.aclose()
        with trio.fail_after(5):
            await p.done.wait()
        # the client got part of the frame, then the end of the stream (it reconnects, as if the broker went)
        seen = 0
        while data := await p.client.receive_some(1 << 20):
            seen += len(data)
        assert 0 < seen < len(whole)
        assert isinstance(p.connection._error, UpstreamError)
        assert "connection lost" in str(p.connection._error)
    assert splices.sizes_from(p.upstream_side) != []


async def test_a_client_closing_mid_splice_ends_its_connection_only(monkeypatch: pytest.MonkeyPatch) -> None:
    splices = Splices(monkeypatch)
    async with proxied() as p:
        await p.client.send_all(request(PRODUCE, 1, 10))
        broker = await p.broker_stream()
        [got] = await read_frames(broker, 1)
        await broker.send_all(response(_I32.unpack_from(got, 8)[0], 1))
        await read_frames(p.client, 1)
        await p.client.send_all(request(PRODUCE, 2, 4 << 20)[:1 << 20])
        await trio.sleep(0.1)
        await p.client.aclose()
        with trio.fail_after(5):
            await p.done.wait()
        assert isinstance(p.connection._error, ClientGone)
        # ksi closed its broker connection: the broker saw part of the frame, then the end
        seen = 0
        while data := await broker.receive_some(1 << 20):
            seen += len(data)
        assert 0 < seen < 4 << 20
    assert splices.sizes_from(p.proxy_side) != []
    # and the proxy serves the next client
    async with proxied() as q:
        frame = request(PRODUCE, 1, 500_000)
        await q.client.send_all(frame)
        [got] = await read_frames(await q.broker_stream(), 1)
        assert same_but_correlation(got, frame)


async def test_a_client_gone_while_its_response_is_spliced_ends_its_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    Splices(monkeypatch)
    async with proxied() as p:
        await p.client.send_all(request(FETCH, 1, 10))
        broker = await p.broker_stream()
        [got] = await read_frames(broker, 1)

        async def answer() -> None:
            with trio.move_on_after(5), suppress(trio.BrokenResourceError):
                await broker.send_all(response(_I32.unpack_from(got, 8)[0], 32 << 20))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer)
            await p.client.receive_some(1 << 16)
            await p.client.aclose()
            with trio.fail_after(5):
                await p.done.wait()
        assert isinstance(p.connection._error, ClientGone)


async def test_tls_and_memory_streams_are_read_not_spliced() -> None:
    sock = trio.socket.socket()
    tls = trio.SSLStream(trio.SocketStream(sock), ssl.create_default_context(), server_hostname="localhost")
    ours, _ = trio.testing.memory_stream_pair()
    assert rawio.can_splice(trio.SocketStream(sock))
    assert not rawio.can_splice(tls)
    assert not rawio.can_splice(ours)
    assert not rawio.can_splice(trio.SocketStream(sock), ours)
    sock.close()


def test_the_default_chain_lets_a_produce_pass_unread() -> None:
    """Without lake-only topics no filter reads a Produce: it may be forwarded unread."""
    config = make_config(9092)
    chain = build_chain(Cluster(config.proxy, None), TopicIds())  # type: ignore[arg-type]
    assert chain.route(PRODUCE, 9).untouched


def test_the_history_filter_lets_a_fetch_response_pass_on_its_head_unless_a_history_partition_is_out_of_range(
        ) -> None:
    """HistoryFilter.relays_unread: the head of a Fetch response (up to inside its last partition's records) is
    enough to see every partition's error; OFFSET_OUT_OF_RANGE on a configured topic's partition means the
    response is read whole (and handed to the router by on_response)."""
    P = FetchResponse.FetchableTopicResponse.PartitionData
    history = SimpleNamespace(config=SimpleNamespace(topics=[SimpleNamespace(name="t")]),
                              config_for=lambda name: object() if name == "t" else None)
    router = SimpleNamespace(fetch=None, list_offsets=None, history=history, topic_ids=None)
    history_filter = HistoryFilter(router)  # type: ignore[arg-type]
    header = parse_request_header(request(FETCH, 9, 0)[4:])
    entry = api(FETCH)
    assert entry is not None

    def head_of(partitions: list[tuple[str, int, int, bytes]], noted: bool = True) -> tuple[Response, int]:
        topics = []
        for name in dict.fromkeys(p[0] for p in partitions):
            topics.append(FetchResponse.FetchableTopicResponse(version=12, topic=name, partitions=[
                P(version=12, partition_index=i, error_code=e, high_watermark=10, last_stable_offset=10,
                  log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1, records=r)
                for t, i, e, r in partitions if t == name]))
        body = encode_body(FetchResponse(version=12, throttle_time_ms=0, error_code=0, session_id=0,
                                         responses=topics), 12)
        whole = encode_response_header(9, 1) + body
        head = whole[:len(whole) - 200_000]
        req = Request(b"", header, entry)
        req.notes = {"history": True} if noted else None
        return Response(head, header, entry, True, req), len(whole) - len(head)

    big = os.urandom(300_000)
    assert history_filter.relays_unread(*head_of([("t", 0, NONE, b""), ("t", 1, NONE, big)]))
    assert not history_filter.relays_unread(*head_of([("t", 0, OFFSET_OUT_OF_RANGE, b""), ("t", 1, NONE, big)]))
    assert history_filter.relays_unread(*head_of([("u", 0, OFFSET_OUT_OF_RANGE, b""), ("t", 1, NONE, big)]))
    # the cut in a partition's records that is not the last: not this shape, read whole
    assert not history_filter.relays_unread(*head_of([("t", 0, NONE, big), ("t", 1, NONE, b"x" * 1000)]))
    # a Fetch that named no configured topic: its response is not looked at
    assert history_filter.relays_unread(*head_of([("t", 0, OFFSET_OUT_OF_RANGE, b""), ("t", 1, NONE, big)],
                                                 noted=False))
    # HistoryFilter.walks_unread, asked when relays_unread said no: a walk when the head ends in the first
    # partition's large records; none (read whole, then on_response) when the head shows a configured
    # partition out of range, which the router can still answer, or when the first records are small
    walked = [("t", 0, NONE, big), ("t", 1, NONE, b"x" * 1000)]
    assert history_filter.walks_unread(*head_of(walked)) is not None
    assert history_filter.walks_unread(*head_of([("t", 0, OFFSET_OUT_OF_RANGE, b""), *walked])) is None
    assert history_filter.walks_unread(*head_of([("u", 0, OFFSET_OUT_OF_RANGE, b""), *walked])) is not None
    small_first = [("t", 0, NONE, b"y" * 1000), ("t", 1, NONE, big), ("t", 2, NONE, b"x" * 1000)]
    assert not history_filter.relays_unread(*head_of(small_first))
    assert history_filter.walks_unread(*head_of(small_first)) is None


class NotingHistoryFilter(HistoryFilter):
    """The history filter, its request side reduced to noting every Fetch (as one that names a configured topic
    is noted), so that its response side meets the broker's bytes as they come."""

    def on_request(self, request: Request, session: Session) -> None:
        request.notes = {self.name: True}


async def test_a_fetch_response_of_several_partitions_is_relayed_in_segments_its_errors_checked_between(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Fetch response whose head does not reach its last partition (its first partition's records are larger
    than the head): relayed as it arrives, every partition's fields read before they go on and their records
    spliced between them (ksi.relay).  A configured topic's partition answered OFFSET_OUT_OF_RANGE behind
    records already on their way goes on as KAFKA_STORAGE_ERROR, and its next Fetch is the router's; another
    topic's error, and every other byte, goes on as the broker sent it."""
    splices = Splices(monkeypatch)
    relayed: list[tuple[str, int]] = []
    history = SimpleNamespace(config=SimpleNamespace(topics=[SimpleNamespace(name="t")]),
                              config_for=lambda name: object() if name == "t" else None,
                              out_of_range_relayed=lambda name, partition: relayed.append((name, partition)))
    router = SimpleNamespace(fetch=None, list_offsets=None, history=history, topic_ids=None)
    P = FetchResponse.FetchableTopicResponse.PartitionData

    def chain(ctx: ProxyContext) -> FilterChain:
        return FilterChain([NotingHistoryFilter(router)])  # type: ignore[arg-type]

    def fetch_response(correlation_id: int, errors: dict[tuple[str, int], int], big: bytes) -> bytes:
        topics = [FetchResponse.FetchableTopicResponse(version=12, topic=name, partitions=[
            P(version=12, partition_index=i, error_code=errors.get((name, i), NONE), high_watermark=10,
              last_stable_offset=10, log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1,
              records=b"" if (name, i) in errors else big[i:] + big[:i])
            for i in range(3)]) for name in ("t", "u")]
        payload = encode_response_header(correlation_id, 1) + encode_body(FetchResponse(
            version=12, throttle_time_ms=0, error_code=0, session_id=0, responses=topics), 12)
        return _I32.pack(len(payload)) + payload

    big = os.urandom(300_000)
    async with proxied(chain) as p:
        first = request(PRODUCE, 1, 10)  # a connection's first request is read whole
        await p.client.send_all(first)
        broker = await p.broker_stream()
        [got] = await read_frames(broker, 1)
        await broker.send_all(response(_I32.unpack_from(got, 8)[0], 5))
        await p.client.send_all(request(FETCH, 2, 40))
        [got] = await read_frames(broker, 1)
        sent = fetch_response(_I32.unpack_from(got, 8)[0], {("t", 1): OFFSET_OUT_OF_RANGE,
                                                            ("u", 2): OFFSET_OUT_OF_RANGE}, big)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker.send_all, sent)
            back = await read_frames(p.client, 2)
    want = fetch_response(2, {("t", 1): KAFKA_STORAGE_ERROR, ("u", 2): OFFSET_OUT_OF_RANGE}, big)
    assert back[1] == want
    assert relayed == [("t", 1)]
    # the four partitions' records, each spliced but for what was read with the fields before them
    spliced = splices.sizes_from(p.upstream_side)
    assert len(spliced) == 4 and sum(spliced) > 4 * len(big) - 4 * 64 * 1024, spliced


async def test_without_a_pipe_large_frames_are_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """No file descriptor left for a pipe: the frames are read and written as before, not refused."""
    splices = Splices(monkeypatch)
    monkeypatch.setattr(rawio.Pipe, "open", classmethod(lambda cls: None))
    async with proxied() as p:
        await p.client.send_all(request(PRODUCE, 1, 10, acks=0))
        broker = await p.broker_stream()
        await read_frames(broker, 1)
        large = request(PRODUCE, 2, 2 << 20)
        await p.client.send_all(large)
        [got] = await read_frames(broker, 1)
        assert same_but_correlation(got, large)
        big = response(_I32.unpack_from(got, 8)[0], 3 << 20)
        await broker.send_all(big)
        back = await read_frames(p.client, 1)
        assert back and back[-1][8:] == big[8:]
    assert splices.calls == []
