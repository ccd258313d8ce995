"""The fuzzers' target: ksi's ``Proxy`` on a trio loop in a background thread, with two history topics (one
lake-only), in front of a fake broker that closes a connection whose request it cannot parse, as a real
one does; and a client reduced to a blocking socket."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse

from ksi.config import parse_config
from ksi.metrics import BYTES, FRAMES, REQUEST_LATENCY
from ksi.server import Proxy
from protocol import FrameReader, api, frame, parse_request_header, response_body_offset

from .fakes import FakeBroker, FakeCluster
from .fuzzing import KNOWN_NAMES

__all__ = ["HISTORY_TOPIC", "LAKE_ONLY_TOPIC", "MAX_FRAME_BYTES", "FuzzTarget", "exchange", "request_frame"]

MAX_FRAME_BYTES = 64 * 1024        # ksi's limit here: small, so "over the limit" is one short write away
REQUEST_TIMEOUT_SECONDS = 2.0      # a request the fake broker never answers ends its connection after this
SETTLE_SECONDS = 15.0              # bounded wait for a connection to end (never a timing assertion)

HISTORY_TOPIC, LAKE_ONLY_TOPIC = "t", "lake"


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
