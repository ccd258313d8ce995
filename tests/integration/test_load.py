"""ksi under load and abuse: a real ``ksi serve`` in front of a real broker (noida-db) and a real catalog.

Held open at the same time: 500 client connections that each did ApiVersions and Metadata, 50 that
connected and sent nothing, and a client that pipelines Fetch requests for a topic whose every Fetch
response is 2 MiB (noida ignores fetch size limits) and never reads its socket, until its TCP window is
full.  Meanwhile frames over ``proxy.max_frame_bytes`` and random bytes arrive on more connections.  While
all of that is going on, a confluent-kafka consumer reads a history topic from offset 0 (the lake below
the broker's log start, the broker above it) and must get every offset exactly once, including the
records a confluent-kafka producer appends meanwhile.

ksi must stay up, log no traceback, answer its metrics endpoint (which must show the connections held),
keep serving a fresh client, and keep its RSS under a bound derived from its own limits (see
``rss_bound``).  The figures (connections held, baseline and peak RSS, the slow client's requests) are
printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import random
import re
import resource
import struct
import threading
import time
import urllib.request
import uuid
from typing import Any

import trio
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)

from ksi.brokers import BrokerProcess
from protocol import FrameReader, frame, response_body_offset
from test_history import BASE_TS, archive, consumer_config, read_all, strip

CLIENTS = 500            # connections that do ApiVersions + Metadata, then stay open
IDLE = 50                # connections that send nothing
OVERSIZED = 20           # connections that announce a frame over proxy.max_frame_bytes
RANDOM = 20              # connections that send random bytes
MAX_FRAME_BYTES = 8 << 20
PARTITIONS = 2
PER_PARTITION = 200      # history topic: offsets 0..119 in the lake, the broker's log starts at 100
APPENDED = 100           # records the producer appends per partition while the load is on
BULK_RECORDS, BULK_VALUE = 2048, 1024   # the slow client's topic: 2 MiB, all of it in every Fetch response
SLOW_CLIENT_MAX_REQUESTS = 50_000
DEADLINE_S = 45.0        # bounded waits (never a timing assertion)

# What ksi may hold beyond its idle baseline (see rss_bound).
PER_CONNECTION_BYTES = 64 << 10   # a client connection and its broker connection (measured: ~30 KiB)
BACKLOG_BYTES = 16 << 20          # broker responses ksi holds for a client that does not read, at most
                                  # (ksi.connection.RESPONSE_BACKLOG_BYTES), plus the one that crossed it
SLACK_BYTES = 32 << 20            # allocator fragmentation, metrics, the cold cache of this small topic


def rss_bound(baseline: int, connections: int) -> int:
    """The most ksi's RSS may reach: its baseline, a fixed cost per connection held, what a client that
    does not read may make it hold (its backlog of broker responses, one more response, one frame being
    read), and slack.  Not a multiple of the slow client's pipelined requests: ksi must stop reading a
    broker connection (and building history responses) for a client that does not take them."""
    return (baseline + connections * PER_CONNECTION_BYTES + BACKLOG_BYTES + 2 * MAX_FRAME_BYTES
            + SLACK_BYTES)


# -- a client reduced to the wire -----------------------------------------------------------------------


def encode(request: Any, version: int, correlation_id: int) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="load")
    return frame(bytes(request.encode(version=version, header=True)))


HELLO = (encode(ApiVersionsRequest(version=3, client_software_name="load", client_software_version="1"), 3, 1)
         + encode(MetadataRequest(version=12, topics=None, allow_auto_topic_creation=False,
                                  include_topic_authorized_operations=False), 12, 2))


async def read_frame(stream: trio.SocketStream, reader: FrameReader) -> bytes:
    while (f := reader.next_frame()) is None:
        data = await stream.receive_some(1 << 16)
        assert data, "ksi closed the connection of a well-behaved client"
        reader.receive_data(data)
    return bytes(f)


async def hello(stream: trio.SocketStream, topic: str) -> None:
    """ApiVersions v3 and Metadata v12 on ``stream``, both answered correctly."""
    reader = FrameReader(1 << 24)
    await stream.send_all(HELLO)
    raw = await read_frame(stream, reader)
    assert struct.unpack_from(">i", raw)[0] == 1
    versions = ApiVersionsResponse.decode(raw[4:], version=3)
    assert versions.error_code == 0 and {1, 3, 18} <= {k.api_key for k in versions.api_keys}
    raw = await read_frame(stream, reader)
    assert struct.unpack_from(">i", raw)[0] == 2
    metadata = MetadataResponse.decode(raw[response_body_offset(raw, 1):], version=12)
    assert topic in {t.name for t in metadata.topics}


async def closed_by_ksi(stream: trio.SocketStream) -> bool:
    """Read until ksi closes the connection (True), within the deadline."""
    with trio.move_on_after(DEADLINE_S):
        try:
            while await stream.receive_some(1 << 16):
                pass
        except trio.BrokenResourceError:
            pass
        return True
    return False


def fetch_frame(topic: str, correlation_id: int) -> bytes:
    T = FetchRequest.FetchTopic
    request = FetchRequest(version=12, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=[T(
                               version=12, topic=topic, partitions=[T.FetchPartition(
                                   version=12, partition=0, current_leader_epoch=-1, fetch_offset=0,
                                   last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])],
                           forgotten_topics_data=[], rack_id="")
    return encode(request, 12, correlation_id)


# -- ksi's side -----------------------------------------------------------------------------------------


def proc_status(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` memory figure in bytes (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def open_files_limit(pid: int) -> int:
    with open(f"/proc/{pid}/limits", encoding="ascii") as limits:
        for line in limits:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no open files limit")


def metric(text: str, name: str, **labels: str) -> float:
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^{re.escape(name)}{{{re.escape(selector)}}} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def raise_open_files_limit(wanted: int) -> None:
    """This process (and the ksi it starts, which inherits it) needs a socket per connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard),
                                                    hard))


# -- the topics -----------------------------------------------------------------------------------------


def history_topic(noida: BrokerProcess, lake: Any) -> tuple[str, dict[tuple[int, int], bytes]]:
    """Offsets 0..199 per partition; the lake holds 0..119 and the broker's log starts at 100."""
    topic = f"load-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": noida.bootstrap, "linger.ms": 0, "batch.num.messages": 10})
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            producer.produce(topic, key=b"k%d" % i, value=b"before %d/%d" % (p, i), partition=p,
                             timestamp=BASE_TS + i * 1000)
            if i % 10 == 9:
                producer.flush(10)  # small batches: DeleteRecords drops whole batches
    assert producer.flush(30) == 0
    records = strip(read_all(noida.bootstrap, topic, PARTITIONS * PER_PARTITION))
    assert len(records) == PARTITIONS * PER_PARTITION
    archive(lake, f"history.{topic.replace('-', '_')}", records, below=120)
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, 100)
    return topic, {k: v["value"] for k, v in records.items()}


def bulk_topic(noida: BrokerProcess) -> str:
    topic = f"bulk-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": noida.bootstrap, "linger.ms": 5})
    for _ in range(BULK_RECORDS):
        producer.produce(topic, value=b"b" * BULK_VALUE, partition=0)
    assert producer.flush(30) == 0
    return topic


# -- the clients that keep working ----------------------------------------------------------------------


def produce_during_load(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes]:
    """Append APPENDED records per partition through ksi; every one must be acknowledged."""
    delivered: dict[tuple[int, int], bytes] = {}
    errors: list[Any] = []

    def report(err: Any, message: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered[(message.partition(), message.offset())] = message.value()

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "message.timeout.ms": 30000,
                         "enable.idempotence": False})
    for i in range(APPENDED):
        for p in range(PARTITIONS):
            producer.produce(topic, value=b"during %d/%d" % (p, i), partition=p, on_delivery=report)
        producer.poll(0)
        time.sleep(0.002)
    assert producer.flush(DEADLINE_S) == 0
    assert not errors, errors[:3]
    return delivered


def consume_everything(bootstrap: str, topic: str, expected: dict[tuple[int, int], bytes],
                       appended: threading.Event, more: dict[tuple[int, int], bytes]) -> dict[tuple[int, int], bytes]:
    """Read from offset 0 until every expected offset (and, once ``appended`` is set, every appended
    one) arrived; no offset twice."""
    consumer = Consumer(consumer_config(bootstrap))
    got: dict[tuple[int, int], bytes] = {}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if appended.is_set() and set(expected) | set(more) <= set(got):
                break
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            key = (message.partition(), message.offset())
            assert key not in got, f"offset {key} delivered twice"
            got[key] = message.value()
    finally:
        consumer.close()
    return got


# -- the test -------------------------------------------------------------------------------------------


async def test_500_connections_idle_slow_and_bad_clients_while_a_consumer_reads_every_offset(
        noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    lake, props = catalog
    connections = CLIENTS + IDLE + OVERSIZED + RANDOM + 16
    raise_open_files_limit(4 * connections)
    topic, originals = history_topic(noida, lake)
    bulk = bulk_topic(noida)
    proxy = ksi_proxy(noida, proxy={"max_frame_bytes": MAX_FRAME_BYTES},
                      catalog={"name": "lake", **props},
                      topics=[{"name": topic, "table": f"history.{topic.replace('-', '_')}"}])
    pid = proxy.process.pid
    host, port = proxy.bootstrap.split(":")
    limit = open_files_limit(pid)
    assert limit >= 2 * connections, f"ksi may open only {limit} files; it needs two per connection"

    async def connect() -> trio.SocketStream:
        return await trio.open_tcp_stream(host, int(port))

    # Baseline: ksi up, one client served, its cold path used once.
    first = await connect()
    await hello(first, topic)
    await first.aclose()
    baseline = await trio.to_thread.run_sync(lambda: read_all(proxy.bootstrap, topic, 10, timeout=20))
    assert baseline.pop("errors") == []
    rss_baseline = proc_status(pid, "VmRSS")

    held: list[trio.SocketStream] = []
    active: list[trio.SocketStream] = []
    figures: dict[str, Any] = {"rss_samples": []}
    slow_window_full = trio.Event()
    release = trio.Event()

    async def sample_rss() -> None:
        while not release.is_set():
            figures["rss_samples"].append(proc_status(pid, "VmRSS"))
            await trio.sleep(0.05)

    async def client() -> None:
        stream = await connect()
        held.append(stream)
        await hello(stream, topic)
        active.append(stream)

    async def idle() -> None:
        held.append(await connect())

    async def slow_client() -> None:
        """Pipelines Fetches of the bulk topic and never reads: ksi's writes to it block once its TCP
        window is full, and ksi must stop taking its requests instead of buffering their responses."""
        stream = await connect()
        held.append(stream)
        sent = 0
        while sent < SLOW_CLIENT_MAX_REQUESTS:
            with trio.move_on_after(2.0) as blocked:
                await stream.send_all(fetch_frame(bulk, sent))
            if blocked.cancelled_caught:
                break
            sent += 1
        figures["slow_requests"] = sent
        assert sent < SLOW_CLIENT_MAX_REQUESTS, "the slow client's window never filled: nothing was tested"
        slow_window_full.set()

    async def oversized(index: int) -> None:
        stream = await connect()
        prefix = (MAX_FRAME_BYTES + 1, 0x7FFFFFFF, -1)[index % 3]
        await stream.send_all(struct.pack(">i", prefix) + b"\x00" * 1024)
        assert await closed_by_ksi(stream), "ksi kept a connection that announced an oversized frame"
        await stream.aclose()

    async def garbage(index: int) -> None:
        rng = random.Random(index)
        stream = await connect()
        try:
            await stream.send_all(rng.randbytes(rng.randint(1, 4096)))
            await stream.send_eof()
        except trio.BrokenResourceError:
            pass  # ksi refused the first bytes already
        assert await closed_by_ksi(stream), "ksi kept a connection that sent random bytes and closed"
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample_rss)
        nursery.start_soon(slow_client)
        async with trio.open_nursery() as arrivals:
            for _ in range(CLIENTS):
                arrivals.start_soon(client)
            for _ in range(IDLE):
                arrivals.start_soon(idle)
            for i in range(OVERSIZED):
                arrivals.start_soon(oversized, i)
            for i in range(RANDOM):
                arrivals.start_soon(garbage, i)
        with trio.fail_after(DEADLINE_S):
            await slow_window_full.wait()

        # Everything is held open, the slow client's window is full: the consumer and the producer must
        # still be served, offset-exactly, and every held client must still get answers.
        appended = threading.Event()
        more: dict[tuple[int, int], bytes] = {}

        def produce() -> None:
            try:
                more.update(produce_during_load(proxy.bootstrap, topic))
            finally:
                appended.set()

        async with trio.open_nursery() as work:
            work.start_soon(trio.to_thread.run_sync, produce)
            got = await trio.to_thread.run_sync(consume_everything, proxy.bootstrap, topic, originals, appended, more)
        metrics = await trio.to_thread.run_sync(scrape, proxy.metrics_url)
        figures["held"] = metric(metrics, "ksi_client_connections_active", listener="bootstrap")
        async with trio.open_nursery() as again:
            for stream in active:
                again.start_soon(hello, stream, topic)
        late = await connect()  # and a client arriving now is served like the first
        await hello(late, topic)
        await late.aclose()
        release.set()

    rss_peak = max(figures["rss_samples"] + [proc_status(pid, "VmRSS")])
    hwm = proc_status(pid, "VmHWM")
    bound = rss_bound(rss_baseline, int(figures["held"]))
    for stream in held:
        await stream.aclose()

    print(f"\nload: {figures['held']:.0f} client connections held on ksi's bootstrap listener ({len(active)} that"
          f" did ApiVersions + Metadata twice, {IDLE} idle, 1 slow that wrote {figures['slow_requests']} Fetch"
          f" requests until its window was full), {OVERSIZED} oversized frames and {RANDOM} random-byte clients"
          f" refused; ksi open-files limit {limit}; ksi RSS baseline {rss_baseline / 2**20:.0f} MiB, peak sampled"
          f" {rss_peak / 2**20:.0f} MiB, VmHWM {hwm / 2**20:.0f} MiB, bound {bound / 2**20:.0f} MiB;"
          f" {len(got)} records consumed offset-exactly, {len(more)} produced during the load")

    assert proxy.process.poll() is None, "ksi exited under load"
    assert "Traceback" not in proxy.log_text(), proxy.log_tail(80)
    assert len(active) == CLIENTS
    assert figures["held"] >= CLIENTS + IDLE + 1
    # Every offset exactly once: the lake's 0..99, the broker's 100..199, and everything appended.
    assert len(more) == PARTITIONS * APPENDED
    assert got == {**originals, **more}
    assert metric(metrics, "ksi_client_errors_total", kind="too_large") >= OVERSIZED
    assert metric(metrics, "ksi_cold_fetches_total", topic=topic) >= 1
    assert hwm <= bound, (f"ksi's RSS peaked at {hwm / 2**20:.0f} MiB, over the bound of {bound / 2**20:.0f} MiB"
                          f" (baseline {rss_baseline / 2**20:.0f} MiB)")
    # And after all of it, ksi still serves and its metrics still answer.
    async with await connect() as after:
        await hello(after, topic)
    assert "ksi_client_connections_total" in await trio.to_thread.run_sync(scrape, proxy.metrics_url)
