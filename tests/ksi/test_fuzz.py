"""Fuzzing: bad bytes from clients never take ksi down, never leak, and only ever close the one connection.

Two layers, both with Hypothesis:

* **The running proxy** (ksi's ``Proxy`` on a trio loop in a background thread, in front of a fake broker
  that, like a real one, closes a connection whose request it cannot parse; two history topics are
  configured, one of them lake-only, so the requests ksi itself decodes, Fetch, ListOffsets, Metadata
  and Produce, are fuzzed too).  Inputs: random bytes; size-prefixed frames with a valid request header
  for every (api key, version) ksi accepts, some it does not, and random, truncated or mutated bodies;
  valid requests with flipped, cut or inserted bytes.  After each input: the proxy thread is alive, ksi
  logged no error and no traceback, a fresh client's ApiVersions and Metadata are answered, every
  connection is gone once its client is, and the metrics' label sets stay bounded.
* **The sans-IO protocol package**: any bytes into framing, header parsing, ``expects_response``,
  response headers, ApiVersions intersection and address rewriting give a result or the package's own
  :class:`protocol.ProtocolError`, never another exception.

CI runs each property with ``max_examples`` from the ``ci`` profile (well under 30 s in total).  Longer:
``KSI_FUZZ_EXAMPLES=20000 pytest tests/ksi/test_fuzz.py`` or ``scripts/fuzz.py --seconds 600`` (make fuzz),
which runs these same properties round after round until the time is up.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.admin import DescribeClusterRequest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest

from ksi.config import parse_config
from ksi.history.lake_only import lake_topic_id
from ksi.metrics import BYTES, FRAMES, REQUEST_LATENCY
from ksi.server import Proxy
from protocol import (
    FrameReader,
    FrameTooLarge,
    ProtocolError,
    api,
    encode_body,
    expects_response,
    frame,
    intersect_api_versions,
    known_api_keys,
    parse_endpoints,
    parse_request_header,
    response_body_offset,
    response_correlation_id,
)
from protocol.api_versions import MIN_VERSIONS
from protocol.header import read_uvarint, skip_tagged_fields
from protocol.rewrite import REWRITTEN_APIS

from .fakes import FakeBroker, FakeCluster

# -- how long to fuzz -----------------------------------------------------------------------------------

EXAMPLES = int(os.environ.get("KSI_FUZZ_EXAMPLES", "0") or 0)
# CI: a failure shrinks to one minimal example (shrinking proxy round trips is what takes the time).
settings.register_profile("ci", max_examples=150, deadline=None, print_blob=True, report_multiple_bugs=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.function_scoped_fixture])
settings.register_profile("long", parent=settings.get_profile("ci"), max_examples=max(EXAMPLES, 1),
                          report_multiple_bugs=True)
PROFILE = settings.get_profile("long" if EXAMPLES else "ci")
# The sans-IO properties are ~1000x cheaper than a proxy round trip: give them more examples.
PURE = settings(PROFILE, max_examples=PROFILE.max_examples * 4)

MAX_FRAME_BYTES = 64 * 1024        # ksi's limit here: small, so "over the limit" is one short write away
REQUEST_TIMEOUT_SECONDS = 2.0      # a request the fake broker never answers ends its connection after this
SETTLE_SECONDS = 15.0              # bounded wait for a connection to end (never a timing assertion)

KNOWN = sorted(known_api_keys())
ACCEPTED = [(k, v) for k in KNOWN for v in range(api(k).max_version + 1)]  # type: ignore[union-attr]
KNOWN_NAMES = {api(k).name for k in KNOWN}  # type: ignore[union-attr]
HISTORY_TOPIC, LAKE_ONLY_TOPIC = "t", "lake"

examples_run = {"proxy": 0, "pure": 0}  # read by scripts/fuzz.py


# -- a broker that behaves like one on garbage --------------------------------------------------------


@dataclass
class FuzzBroker(FakeBroker):
    """The fake broker, but a request it cannot decode or does not serve closes the connection, as a
    Kafka broker does with a request it cannot parse, instead of failing the test's nursery."""

    refused: int = 0

    async def _handle(self, stream: trio.SocketStream) -> None:
        reader = FrameReader(1 << 24)
        async with stream:
            try:
                while data := await stream.receive_some(65536):
                    reader.receive_data(data)
                    while (request := reader.next_frame()) is not None:
                        header = parse_request_header(request)
                        entry = api(header.api_key)
                        assert entry is not None and header.body_offset is not None
                        body = request[header.body_offset:]
                        message = entry.request.decode(body, version=header.api_version)
                        if header.api_key == 0:  # Produce: answered only when acks=0 (nothing to send)
                            if message.acks == 0:
                                continue
                            raise ValueError("the fuzz broker does not store records")
                        answer = self.answer(header.api_key, header.api_version, body)
                        assert answer is not None
                        head = struct.pack(">i", header.correlation_id)
                        if entry.response_header_version(header.api_version) >= 1:
                            head += b"\x00"
                        await stream.send_all(frame(head + answer))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            except Exception:  # noqa: BLE001 - any request it cannot serve: close, like a broker
                self.refused += 1


# -- ksi in a background thread -------------------------------------------------------------------------


class Captured(logging.Handler):
    """ksi's log records: errors and tracebacks are failures; the rest is only counted."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.errors: list[str] = []
        self.counts: dict[int, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.levelno] = self.counts.get(record.levelno, 0) + 1
        if record.levelno >= logging.ERROR or record.exc_info:
            self.errors.append(self.format(record))


@dataclass
class FuzzTarget:
    """A running ``Proxy`` with history topics, in front of a :class:`FuzzBroker`, on its own thread."""

    workdir: Path
    proxy: Proxy | None = None
    crash: BaseException | None = None
    log: Captured = field(default_factory=Captured)
    topic_id: uuid.UUID = field(default_factory=uuid.uuid4)
    _token: Any = None
    _stop: trio.Event | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _saved_logger: tuple[int, bool] = (logging.NOTSET, True)
    _catalog: dict[str, str] = field(default_factory=dict)

    @property
    def port(self) -> int:
        assert self.proxy is not None and self.proxy.bound is not None
        return self.proxy.bound.bootstrap.port

    def start(self) -> FuzzTarget:
        logger = logging.getLogger("ksi")
        self._saved_logger = (logger.level, logger.propagate)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # thousands of refused-connection warnings: counted here, not printed
        self.log.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(self.log)
        self._catalog = make_lake(self.workdir)
        self._thread = threading.Thread(target=self._run, name="ksi-fuzz", daemon=True)
        self._thread.start()
        if not self._ready.wait(60) or self.crash is not None or self.proxy is None:
            raise RuntimeError(f"the fuzz target did not start: {self.crash!r}")
        return self

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - reported by check()
            self.crash = exc
        finally:
            self._ready.set()

    def _config(self, broker_port: int) -> Any:
        return parse_config({
            "proxy": {"listen": "127.0.0.1:0", "broker_port_base": 0, "shutdown_grace_seconds": 1,
                      "max_frame_bytes": MAX_FRAME_BYTES, "request_timeout_seconds": REQUEST_TIMEOUT_SECONDS},
            "upstream": {"bootstrap_servers": f"127.0.0.1:{broker_port}", "connect_timeout_seconds": 1,
                         "metadata_refresh_seconds": 0.5},
            "catalog": {"name": "lake", **self._catalog},
            "topics": [{"name": HISTORY_TOPIC, "table": "history.t"},
                       {"name": LAKE_ONLY_TOPIC, "table": "history.lake", "lake_only_readers": ["*"]}],
        }, "fuzz.toml")

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            cluster = FakeCluster(topic_id=self.topic_id, topics=[HISTORY_TOPIC], offsets={HISTORY_TOPIC: (5, 20)})
            cluster.brokers.append(await nursery.start(FuzzBroker(1, cluster).serve))
            self.proxy = await nursery.start(Proxy(self._config(cluster.brokers[0].port)).run)
            with trio.fail_after(30):  # discovery has told ksi which configured topic Kafka lacks
                while LAKE_ONLY_TOPIC not in self.proxy.history.lake_only:
                    await trio.sleep(0.02)
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def stop(self) -> None:
        if self._token is not None and self._thread is not None and self._thread.is_alive():
            assert self._stop is not None
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            self._thread.join(30)
        logger = logging.getLogger("ksi")
        logger.removeHandler(self.log)
        logger.setLevel(self._saved_logger[0])
        logger.propagate = self._saved_logger[1]

    # -- the property checked after every input ------------------------------------------------------

    def connections(self) -> int:
        assert self.proxy is not None
        return len(self.proxy.ctx.connections)

    def check(self, what: str, still_open: int = 0) -> None:
        """ksi is up, logged nothing bad, serves a fresh client, and holds no connection of a gone client
        (``still_open``: connections the test itself keeps open)."""
        self._settle(what, still_open)
        probe(self.port, self.topic_id)
        self._settle(what, still_open)
        for metric in (FRAMES, BYTES, REQUEST_LATENCY):
            # One label value per API ksi knows, and at most one for all others: a client cannot mint series.
            strangers = {s.labels.get("api") for m in metric.collect() for s in m.samples} - KNOWN_NAMES
            assert len(strangers) <= 1, (f"{metric._name} has series for {len(strangers)} APIs ksi does not know"
                                         f" after {what}: {sorted(strangers)[:5]}...")

    def _settle(self, what: str, still_open: int) -> None:
        """Wait (bounded) until ksi has ended the connections of gone clients and every task is idle."""
        assert self.crash is None and self._thread is not None and self._thread.is_alive(), \
            f"the proxy stopped after {what}: {self.crash!r}"
        deadline = time.monotonic() + SETTLE_SECONDS
        while self.connections() != still_open and time.monotonic() < deadline:
            time.sleep(0.001)
        assert self.connections() == still_open, \
            f"{self.connections() - still_open} connection(s) still open after their clients left ({what})"
        # A connection leaves the set before its last log line: let every task run until blocked.
        trio.from_thread.run(trio.testing.wait_all_tasks_blocked, 0.001, trio_token=self._token)
        assert not self.log.errors, f"ksi logged an error after {what}:\n" + "\n".join(self.log.errors[-3:])


def make_lake(workdir: Path) -> dict[str, str]:
    """A SQLite catalog with two ksi-layout tables of 10 records (offsets 0..9) in partition 0."""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    from ksi.history.ksi_table import (
        arrow_schema,
        partition_spec,
        raw_value_schema,
        sort_order,
    )

    workdir.mkdir(parents=True, exist_ok=True)
    props = {"uri": f"sqlite:///{workdir / 'catalog.db'}", "warehouse": f"file://{workdir}"}
    catalog = SqlCatalog("lake", **props)
    catalog.create_namespace("history")
    n = 10
    rows = pa.table({
        "kafka_partition": pa.array([0] * n, pa.int32()), "kafka_offset": pa.array(range(n), pa.int64()),
        "kafka_timestamp": pa.array([1_700_000_000_000_000 + i * 1000 for i in range(n)], pa.timestamp("us", tz="UTC")),
        "kafka_timestamp_type": pa.array([0] * n, pa.int32()), "kafka_key": pa.nulls(n, pa.binary()),
        "kafka_headers": pa.nulls(n, arrow_schema().field("kafka_headers").type),
        "kafka_value": pa.array([b"v%d" % i for i in range(n)], pa.binary()),
        "kafka_value_schema_id": pa.nulls(n, pa.int32())}, schema=arrow_schema())
    for name in ("t", "lake"):
        table = catalog.create_table(f"history.{name}", schema=raw_value_schema(), partition_spec=partition_spec(),
                                     sort_order=sort_order())
        table.append(rows)
    return props


# -- a client reduced to a blocking socket --------------------------------------------------------------


def request_frame(message: Any, version: int, correlation_id: int = 1, client_id: str | None = "fuzz") -> bytes:
    message.with_header(correlation_id=correlation_id, client_id=client_id)
    return frame(bytes(message.encode(version=version, header=True)))


def read_frame(sock: socket.socket, reader: FrameReader) -> bytes:
    while (f := reader.next_frame()) is None:
        data = sock.recv(65536)
        assert data, "ksi closed a healthy client's connection"
        reader.receive_data(data)
    return bytes(f)


def probe(port: int, topic_id: uuid.UUID) -> None:
    """A fresh, well-behaved client: ApiVersions v3 and Metadata v12 are answered correctly."""
    with socket.create_connection(("127.0.0.1", port), timeout=SETTLE_SECONDS) as sock:
        reader = FrameReader(1 << 24)
        sock.sendall(request_frame(ApiVersionsRequest(version=3, client_software_name="probe",
                                                      client_software_version="1"), 3, 11)
                     + request_frame(MetadataRequest(version=12, topics=None, allow_auto_topic_creation=False,
                                                     include_topic_authorized_operations=False), 12, 12))
        raw = read_frame(sock, reader)
        assert struct.unpack_from(">i", raw)[0] == 11
        versions = ApiVersionsResponse.decode(raw[4:], version=3)
        assert versions.error_code == 0 and {18, 3, 1} <= {k.api_key for k in versions.api_keys}
        raw = read_frame(sock, reader)
        assert struct.unpack_from(">i", raw)[0] == 12
        metadata = MetadataResponse.decode(raw[response_body_offset(raw, 1):], version=12)
        assert metadata.cluster_id == "fake"
        assert {t.name for t in metadata.topics} == {HISTORY_TOPIC, LAKE_ONLY_TOPIC}
        assert all(b.port != 0 for b in metadata.brokers)


def exchange(port: int, chunks: list[bytes]) -> bytes:
    """Send ``chunks``, half-close, and read until ksi closes the connection; returns what ksi sent.

    Once the client has said all it will, ksi answers what it read and ends the connection (a partial
    frame ends it at once); the only wait is for a request the fake broker never answers
    (proxy.request_timeout_seconds)."""
    received = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=SETTLE_SECONDS) as sock:
        try:
            for chunk in chunks:
                sock.sendall(chunk)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # EPIPE, ECONNRESET, ENOTCONN: ksi already refused what came first
            return bytes(received)
        deadline = time.monotonic() + SETTLE_SECONDS + REQUEST_TIMEOUT_SECONDS * 4
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                return bytes(received)
            except TimeoutError:
                data = None
            if not data:
                if data is None or time.monotonic() > deadline:
                    raise AssertionError("ksi kept a half-closed connection open with nothing left to answer")
                return bytes(received)
            received += data


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


# -- strategies: requests ksi must survive -------------------------------------------------------------


def _header(api_key: int, version: int, correlation_id: int, client_id: bytes | None, flexible: bool,
            tags: bytes) -> bytes:
    head = struct.pack(">hhi", api_key, version, correlation_id)
    head += struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    return head + (tags if flexible else b"")


@st.composite
def headers(draw: st.DrawFn, keys: list[tuple[int, int]] = ACCEPTED) -> tuple[int, int, bytes]:
    """(api key, version, encoded request header): mostly a pair ksi accepts, sometimes one it does not."""
    api_key, version = draw(st.one_of(
        st.sampled_from(keys),
        st.sampled_from(keys).map(lambda kv: (kv[0], kv[1] + 1)),                        # one version too new
        st.tuples(st.integers(0, 0x7FFF), st.integers(0, 40)),                          # any key
        st.tuples(st.integers(-0x8000, 0x7FFF), st.integers(-0x8000, 0x7FFF)),          # anything at all
    ))
    entry = api(api_key)
    flexible = entry is not None and entry.is_flexible(version)
    client_id = draw(st.one_of(st.none(), st.binary(max_size=20), st.just(b"ksi-fuzz")))
    tags = draw(st.one_of(st.just(b"\x00"), st.binary(max_size=8)))
    correlation_id = draw(st.integers(-(1 << 31), (1 << 31) - 1))
    return api_key, version, _header(api_key, version, correlation_id, client_id, flexible, tags)


def default_body(api_key: int, version: int) -> bytes:
    """A valid body of every field's default for an (api key, version) ksi knows."""
    entry = api(api_key)
    if entry is None or not entry.supports(version):
        return b""
    return encode_body(entry.request(version=version), version)


@st.composite
def mutated(draw: st.DrawFn, data: bytes, start: int = 0) -> bytes:
    """``data`` with a few bytes (from ``start`` on) flipped, cut, inserted or overwritten."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "set", "truncate"]))
        if len(out) <= start:
            kind = "insert"
        at = draw(st.integers(start, max(start, len(out) - 1)))
        if kind == "flip":
            out[at] ^= draw(st.integers(1, 255))
        elif kind == "set":
            value = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))
            width = draw(st.integers(1, 4))
            out[at:at + width] = bytes([value]) * width
        elif kind == "cut":
            del out[at:at + draw(st.integers(1, 8))]
        elif kind == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del out[at:]
    return bytes(out)


def sized(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


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
    head = _header(api_key, version, 5, b"fuzz", api(api_key).is_flexible(version), b"\x00")  # type: ignore[union-attr]
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


# -- properties: the sans-IO protocol package ----------------------------------------------------------


@PURE
@given(st.lists(st.binary(max_size=300), max_size=8), st.integers(0, 1 << 20))
def test_frame_reader_returns_frames_or_refuses_the_size(chunks: list[bytes], limit: int) -> None:
    """Any bytes in any chunks: the frames handed out plus what stays buffered are exactly the input."""
    examples_run["pure"] += 1
    reader, out = FrameReader(limit), bytearray()
    wire = b"".join(chunks)
    try:
        for chunk in chunks:
            reader.receive_data(chunk)
            while (f := reader.next_frame()) is not None:
                assert len(f) <= limit
                out += struct.pack(">i", len(f)) + bytes(f)
    except FrameTooLarge as exc:
        assert exc.size < 0 or exc.size > limit
        assert wire[len(out):len(out) + 4] == struct.pack(">i", exc.size)
        return
    assert bytes(out) + wire[len(out):] == wire and reader.buffered == len(wire) - len(out)


@st.composite
def request_bytes(draw: st.DrawFn) -> bytes:
    api_key, version, head = draw(headers())
    tail = draw(st.one_of(st.binary(max_size=100), st.just(default_body(api_key, version)),
                          st.just(default_body(api_key, version)).flatmap(mutated)))
    whole = head + tail
    return whole[:draw(st.integers(0, len(whole)))] if draw(st.booleans()) else whole


@PURE
@given(st.one_of(request_bytes(), st.binary(max_size=200)))
def test_request_header_parsing_gives_a_header_or_a_protocol_error(data: bytes) -> None:
    examples_run["pure"] += 1
    try:
        header = parse_request_header(data)
    except ProtocolError:
        return
    assert (header.api_key, header.api_version, header.correlation_id) == struct.unpack_from(">hhi", data)
    assert header.api_key >= 0 and header.api_version >= 0
    if header.body_offset is not None:
        assert 8 <= header.body_offset <= len(data)
    if api(header.api_key) is None:
        assert header.body_offset is None
        return
    with contextlib.suppress(ProtocolError):
        assert expects_response(data, header) in (True, False)


@PURE
@given(st.binary(max_size=64), st.sampled_from([0, 1]))
def test_response_header_gives_an_offset_or_a_protocol_error(data: bytes, header_version: int) -> None:
    examples_run["pure"] += 1
    try:
        assert response_correlation_id(data) == struct.unpack_from(">i", data)[0]
        offset = response_body_offset(data, header_version)
    except ProtocolError:
        return
    assert 4 <= offset <= len(data)


@PURE
@given(st.binary(max_size=64), st.integers(0, 60))
def test_tagged_fields_and_varints_give_a_position_or_a_protocol_error(data: bytes, pos: int) -> None:
    examples_run["pure"] += 1
    for read in (read_uvarint, skip_tagged_fields):
        try:
            result = read(data, pos)
        except ProtocolError:
            continue
        end = result[1] if isinstance(result, tuple) else result
        assert pos < end <= len(data)


def _responses() -> list[tuple[int, int, bytes]]:
    """Valid broker responses that ksi decodes (ApiVersions, and every API it rewrites), as bodies."""
    cluster = FakeCluster(topics=[HISTORY_TOPIC])
    for node_id, port in ((1, 9092), (2, 9093)):
        cluster.brokers.append(FakeBroker(node_id, cluster, port=port))
    broker = cluster.brokers[0]
    out = []
    for key in sorted(REWRITTEN_APIS) + [18]:
        entry = api(key)
        assert entry is not None
        for version in range(entry.max_version + 1):
            try:
                body = broker.answer(key, version, default_body(key, version))
            except Exception:  # noqa: BLE001 - a version the fake does not answer
                continue
            if body is not None:
                out.append((key, version, body))
    return out


RESPONSES = _responses()


@st.composite
def response_bodies(draw: st.DrawFn) -> tuple[int, int, bytes]:
    key, version, body = draw(st.sampled_from(RESPONSES))
    body = draw(st.one_of(mutated(body), st.integers(0, len(body)).map(lambda n: body[:n]), st.binary(max_size=80)))
    return key, version, body


@PURE
@given(response_bodies())
def test_address_rewriting_gives_endpoints_or_a_protocol_error(case: tuple[int, int, bytes]) -> None:
    """What a broker sends back is decoded by ksi for the APIs that name brokers: bad bytes must be a
    ProtocolError (the connection's caller turns it into one closed client connection)."""
    examples_run["pure"] += 1
    key, version, body = case
    if key == 18:
        try:
            answer = intersect_api_versions(body, version)
        except ProtocolError:
            return
        decoded = ApiVersionsResponse.decode(answer, version=version if answer[:2] == b"\x00\x00" else 0)
        for entry in decoded.api_keys:
            ours = api(entry.api_key)
            assert ours is not None and MIN_VERSIONS.get(entry.api_key, 0) <= entry.min_version
            assert entry.min_version <= entry.max_version <= ours.max_version
        return
    try:
        endpoints = parse_endpoints(key, version, body)
    except ProtocolError:
        return
    if endpoints is not None:
        rewritten = endpoints.encode(lambda node_id: ("127.0.0.1", 40000 + (node_id & 0xFFF)))
        again = parse_endpoints(key, version, rewritten)
        assert again is not None
        assert {(n.node_id, n.host, n.port) for n in again.nodes} == {
            (n.node_id, "127.0.0.1", 40000 + (n.node_id & 0xFFF)) for n in endpoints.nodes}


def test_every_accepted_api_has_a_default_request() -> None:
    """The strategies above cover each (api key, version) ksi accepts with a valid default body."""
    for api_key, version in ACCEPTED:
        body = default_body(api_key, version)
        entry = api(api_key)
        assert entry is not None
        entry.request.decode(body, version=version)
    assert len(ACCEPTED) == sum(api(k).max_version + 1 for k in KNOWN)  # type: ignore[union-attr]


__all__ = ["PROPERTIES", "PURE_PROPERTIES", "FuzzTarget", "examples_run"]

# The properties scripts/fuzz.py runs round after round (the proxy ones take the running target).
PROPERTIES: list[Callable[..., None]] = [
    test_proxy_survives_any_client_bytes,
    test_proxy_survives_mutated_valid_requests_after_a_good_one,
    test_proxy_survives_every_accepted_api_with_a_broken_body,
]
PURE_PROPERTIES: list[Callable[..., None]] = [
    test_frame_reader_returns_frames_or_refuses_the_size,
    test_request_header_parsing_gives_a_header_or_a_protocol_error,
    test_response_header_gives_an_offset_or_a_protocol_error,
    test_tagged_fields_and_varints_give_a_position_or_a_protocol_error,
    test_address_rewriting_gives_endpoints_or_a_protocol_error,
]
