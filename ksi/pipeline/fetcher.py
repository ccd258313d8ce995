"""One Kafka partition's offset range, fetched by ksi itself for the archive: Fetch requests on a socket of its
own, each response's records read from the socket as they arrive, a chunk at a time, and handed over as
complete record batches, which the reading task decodes into columns (:mod:`protocol.batch_columns`).

Why not a client library: a consumer library makes an object per record, and the task a column out of each
attribute of each (measured: ~5 us a record in the task's thread, on top of the library's own thread); and the
library keeps a whole Fetch response parsed in memory, which on a broker that ignores fetch size limits (the
embedded noida-db answers with a partition's whole tail) grows with the backlog, not with any setting.  Here a
response is read in chunks of at most :data:`CHUNK_BYTES`, at most :data:`QUEUED_CHUNKS` of them wait for the
task, and once the range's last offset has arrived the connection is closed, whatever is still unread: a
task's memory is bounded by those two numbers whatever the broker sends.

What it speaks (:mod:`protocol.fetch_client`): Fetch v4-v11 (isolation level, aborted transactions;
sessionless), Metadata v4 to find the partition's leader (never creating the topic), ApiVersions v0; plaintext
or TLS (``security.protocol`` ``plaintext`` or ``ssl``, with librdkafka's ``ssl.*`` file settings).  It takes
the ``archive.consumer`` properties listed in :data:`SPOKEN` and :data:`IGNORED`; :func:`unsupported` names any
other (SASL, for one), and the archive then reads with librdkafka instead (:mod:`ksi.pipeline.reader`).

Reads are ``read_committed``: the broker returns records up to the last stable offset with the list of
aborted transactions, whose records the decoder marks (the archive keeps them for read_uncommitted readers).

Retriable errors (a leader moving, a broker restarting, the connection dropping) are retried on a fresh
leader lookup with backoff for as long as the task's ``poll_timeout_seconds`` allows without progress; an
offset out of range (retention passed the range's start) and refusals are errors at once, naming the topic,
partition and offset.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from protocol import fetch_client as wire
from protocol.batch_columns import split_batches
from protocol.errors import (
    KAFKA_STORAGE_ERROR,
    LEADER_NOT_AVAILABLE,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    UNKNOWN_TOPIC_OR_PARTITION,
    MalformedFrame,
    error_name,
)

__all__ = ["CHUNK_BYTES", "IGNORED", "QUEUED_CHUNKS", "READ_COMMITTED", "READ_UNCOMMITTED", "SPOKEN", "Chunk",
           "FetchError", "RangeFetch", "unsupported"]

CHUNK_BYTES = 4 << 20          # a response is read and handed over this much at a time
QUEUED_CHUNKS = 4              # chunks read ahead of the task at most
FETCH_VERSIONS = (4, 11)       # v4: isolation level and aborted transactions; v12+ is flexible (not needed)
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
EMPTY_BACKOFF = 0.02           # after an empty answer (a broker that does not hold Fetches for max_wait)
_LAST_BASE = struct.Struct(">q")   # a batch's base offset, at its start ...
_LAST_DELTA = struct.Struct(">i")  # ... and its last offset delta, 23 bytes in
RETRY_BACKOFF = (0.1, 2.0)     # first and longest wait between retries of a retriable error
# Partition errors after which the leader is looked up again and the fetch retried.
# (7 REQUEST_TIMED_OUT, 74 FENCED_LEADER_EPOCH, 75 UNKNOWN_LEADER_EPOCH)
RETRIABLE = frozenset({UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, 7,
                       KAFKA_STORAGE_ERROR, 74, 75})

# librdkafka properties this reader applies, and those it has no use for (a consumer group's, librdkafka's
# own queueing and logging); any other property in archive.consumer sends the archive to librdkafka.
SPOKEN = frozenset({
    "bootstrap.servers", "client.id", "fetch.max.bytes", "max.partition.fetch.bytes", "fetch.wait.max.ms",
    "fetch.min.bytes", "socket.timeout.ms", "socket.connection.setup.timeout.ms", "check.crcs",
    "security.protocol", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification",
})
IGNORED = frozenset({
    "group.id", "enable.auto.commit", "enable.auto.offset.store", "isolation.level", "enable.partition.eof",
    "auto.offset.reset", "fetch.queue.backoff.ms", "receive.message.max.bytes", "queued.max.messages.kbytes",
    "queued.min.messages", "log_level", "session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms",
    "statistics.interval.ms", "api.version.request", "fetch.error.backoff.ms",
})


class FetchError(RuntimeError):
    """The range cannot be read (the message names topic, partition and offset)."""


class _Retriable(Exception):
    """A failure worth a fresh leader lookup and another try."""


def unsupported(properties: dict[str, str]) -> str | None:
    """The first of ``properties`` (librdkafka names) this reader does not apply, else None."""
    for key, value in sorted(properties.items()):
        if key not in SPOKEN and key not in IGNORED:
            return key
        if key == "security.protocol" and str(value).lower() not in ("plaintext", "ssl"):
            return f"{key}={value}"
    return None


@dataclass(frozen=True, slots=True)
class Chunk:
    """Complete record batches of one Fetch response: ``data[starts[0]:end]``, and the aborted transactions
    (producer id, first offset) that response listed."""

    data: bytearray
    starts: list[int]
    aborted: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class _Settings:
    brokers: tuple[tuple[str, int], ...]
    client_id: str
    max_bytes: int
    partition_max_bytes: int
    max_wait_ms: int
    min_bytes: int
    socket_timeout: float
    connect_timeout: float
    tls: ssl.SSLContext | None
    verify_crc: bool

    @classmethod
    def of(cls, bootstrap: str, properties: dict[str, str]) -> _Settings:
        props = {k: str(v) for k, v in properties.items()}
        servers = props.get("bootstrap.servers", bootstrap)
        brokers = []
        for item in servers.split(","):
            host, _, port = item.strip().rpartition(":")
            if not host or not port.isdigit():
                raise FetchError(f"bootstrap server {item!r} is not HOST:PORT")
            brokers.append((host.strip("[]"), int(port)))
        tls = None
        if props.get("security.protocol", "plaintext").lower() == "ssl":
            try:
                tls = ssl.create_default_context(cafile=props.get("ssl.ca.location"))
                if "ssl.certificate.location" in props:
                    tls.load_cert_chain(props["ssl.certificate.location"], props.get("ssl.key.location"),
                                        props.get("ssl.key.password"))
            except (OSError, ssl.SSLError) as exc:
                raise FetchError(f"archive.consumer: the ssl.* files cannot be used: {exc}") from None
            if props.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
                tls.check_hostname = False
            if props.get("enable.ssl.certificate.verification", "true").lower() == "false":
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE

        def number(key: str, default: int) -> int:
            text = props.get(key, str(default))
            if not text.strip().isdigit():
                raise FetchError(f"archive.consumer: {key} must be a whole number, got {text!r}")
            return int(text)

        return cls(
            brokers=tuple(brokers),
            client_id=props.get("client.id", "ksi-archive"),
            max_bytes=number("fetch.max.bytes", 64 << 20),
            partition_max_bytes=number("max.partition.fetch.bytes", 8 << 20),
            max_wait_ms=number("fetch.wait.max.ms", 500),
            min_bytes=number("fetch.min.bytes", 1),
            socket_timeout=number("socket.timeout.ms", 60_000) / 1000,
            connect_timeout=number("socket.connection.setup.timeout.ms", 30_000) / 1000,
            tls=tls,
            verify_crc=props.get("check.crcs", "true").lower() != "false",
        )


class _Connection:
    """One blocking connection to a broker: requests out, responses read whole or field by field."""

    def __init__(self, host: str, port: int, settings: _Settings) -> None:
        self.where = f"{host}:{port}"
        try:
            sock = socket.create_connection((host, port), timeout=settings.connect_timeout)
        except OSError as exc:
            raise _Retriable(f"cannot connect to {self.where}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(settings.socket_timeout + settings.max_wait_ms / 1000)
        if settings.tls is not None:
            try:
                sock = settings.tls.wrap_socket(sock, server_hostname=host)
            except (OSError, ssl.SSLError) as exc:
                sock.close()
                raise FetchError(f"TLS with {self.where} failed: {exc}") from None
        self.sock = sock
        self.client_id = settings.client_id
        self._correlation = 0

    def send(self, encode: Callable[[int, str], bytes]) -> None:
        """Send the request ``encode(correlation_id, client_id)`` makes."""
        self._correlation += 1
        try:
            self.sock.sendall(encode(self._correlation, self.client_id))
        except OSError as exc:
            raise _Retriable(f"{self.where}: {exc}") from None

    def check_correlation(self, correlation: int) -> None:
        if correlation != self._correlation:
            raise FetchError(f"{self.where} answered correlation id {correlation}, not {self._correlation}")

    def exact(self, n: int) -> bytearray:
        out = bytearray(n)
        self.into(memoryview(out))
        return out

    def into(self, view: memoryview) -> None:
        got = 0
        try:
            while got < len(view):
                read = self.sock.recv_into(view[got:])
                if not read:
                    raise _Retriable(f"{self.where} closed the connection")
                got += read
        except OSError as exc:  # socket.timeout included
            raise _Retriable(f"{self.where}: {exc}") from None

    def response(self) -> tuple[int, memoryview]:
        """The next response frame whole: its size, and its body after the correlation id."""
        (size,) = struct.unpack(">i", self.exact(4))
        frame = self.exact(size)
        self.check_correlation(struct.unpack_from(">i", frame)[0])
        return size, memoryview(frame)[4:]

    def close(self) -> None:
        """Close it, waking a thread blocked reading it (a bare close would leave that thread waiting)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


class RangeFetch:
    """Reads ``topic``/``partition`` from ``start`` until the record batch holding ``stop - 1`` (or any
    offset past it) has arrived, in a thread of its own, ahead of the caller by at most
    :data:`QUEUED_CHUNKS` chunks.  Iterating gives the :class:`Chunk` s in offset order; the batches may
    begin below ``start`` and end past ``stop`` (the caller keeps the offsets it asked for)."""

    def __init__(self, bootstrap: str, properties: dict[str, str], topic: str, partition: int, start: int,
                 stop: int, poll_timeout_seconds: float = 60.0, isolation_level: int = READ_COMMITTED) -> None:
        self.topic, self.partition, self.start, self.stop = topic, partition, start, stop
        self.isolation_level = isolation_level
        self.received = 0  # bytes of records read from the broker so far
        self.settings = _Settings.of(bootstrap, properties)
        self.poll_timeout = poll_timeout_seconds
        self._queue: queue.Queue[Chunk | BaseException | None] = queue.Queue(QUEUED_CHUNKS)
        self._closed = threading.Event()
        self._connection: _Connection | None = None
        self._thread = threading.Thread(target=self._run, name=f"ksi-fetch-{topic}-{partition}", daemon=True)
        self._thread.start()

    @property
    def where(self) -> str:
        return f"{self.topic}/{self.partition}"

    def __iter__(self) -> Iterator[Chunk]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(queue.Empty):  # unblock the thread if it waits to hand over a chunk
            while True:
                self._queue.get_nowait()
        connection = self._connection
        if connection is not None:
            connection.close()
        self._thread.join(timeout=5)

    # -- the thread ---------------------------------------------------------------------------------

    def _put(self, item: Chunk | BaseException | None) -> bool:
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            self._fetch_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the task, which raises it
            if not self._closed.is_set():
                failure = exc if isinstance(exc, (FetchError, MalformedFrame)) else FetchError(f"{self.where}: {exc!r}")
                self._put(failure)
            return
        finally:
            if self._connection is not None:
                self._connection.close()
        self._put(None)

    def _fetch_all(self) -> None:
        offset = self.start
        progress = time.monotonic()
        backoff = RETRY_BACKOFF[0]
        last_error = ""
        version = FETCH_VERSIONS[1]
        while offset < self.stop and not self._closed.is_set():
            try:
                if self._connection is None:
                    self._connection, version = self._leader()
                offset, done = self._fetch_once(self._connection, version, offset)
            except _Retriable as exc:
                last_error = str(exc)
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None
                if time.monotonic() - progress > self.poll_timeout:
                    raise FetchError(f"{self.where}: no progress for {self.poll_timeout:.0f} s at offset {offset} "
                                     f"while reading [{self.start}, {self.stop}): {last_error}") from None
                time.sleep(backoff)
                backoff = min(backoff * 2, RETRY_BACKOFF[1])
                continue
            if done is None:  # an answer without a batch
                if time.monotonic() - progress > self.poll_timeout:
                    raise FetchError(f"{self.where}: no record for {self.poll_timeout:.0f} s at offset {offset} "
                                     f"while reading [{self.start}, {self.stop}); is the broker reachable?")
                time.sleep(EMPTY_BACKOFF)
                continue
            progress = time.monotonic()
            backoff = RETRY_BACKOFF[0]
            if done:
                return

    def _leader(self) -> tuple[_Connection, int]:
        """A connection to the partition's leader, and the Fetch version to speak with it."""
        failures = []
        metadata = None
        for host, port in self.settings.brokers:
            try:
                connection = _Connection(host, port, self.settings)
            except _Retriable as exc:
                failures.append(str(exc))
                continue
            try:
                connection.send(lambda c, client: wire.metadata_request(c, client, self.topic))
                _size, body = connection.response()
                metadata = wire.decode_metadata(body, self.topic)
                break
            except (_Retriable, MalformedFrame) as exc:
                failures.append(str(exc))
            finally:
                connection.close()
        if metadata is None:
            raise _Retriable("no bootstrap server answered: " + "; ".join(failures))
        code = UNKNOWN_TOPIC_OR_PARTITION if metadata.topic_error is None else metadata.topic_error
        if code != NONE:
            if code in RETRIABLE:
                raise _Retriable(f"{self.topic}: {error_name(code)}")
            raise FetchError(f"{self.where}: Metadata says {error_name(code)}")
        if self.partition not in metadata.partitions:
            raise _Retriable(f"{self.where}: no such partition in Metadata")
        error, leader = metadata.partitions[self.partition]
        if leader not in metadata.brokers:
            raise _Retriable(f"{self.where}: no leader ({error_name(error)})")
        host, port = metadata.brokers[leader]
        connection = _Connection(host, port, self.settings)
        try:
            connection.send(wire.api_versions_request)
            _size, body = connection.response()
            _error, versions = wire.decode_api_versions(body)
        except BaseException:
            connection.close()
            raise
        low, high = versions.get(wire.FETCH, (0, -1))
        if high < FETCH_VERSIONS[0] or low > FETCH_VERSIONS[1]:
            connection.close()
            raise FetchError(f"{connection.where} offers Fetch v{low}-v{high}, not v{FETCH_VERSIONS[0]}-"
                             f"v{FETCH_VERSIONS[1]} (needed for transactions); set archive.reader = \"librdkafka\"")
        return connection, min(high, FETCH_VERSIONS[1])

    def _fetch_once(self, connection: _Connection, version: int, offset: int) -> tuple[int, bool | None]:
        """One Fetch at ``offset``: its batches handed over as they arrive.  Returns the next offset and
        whether the range is complete (None: the answer held no complete batch)."""
        s = self.settings
        connection.send(lambda c, client: wire.fetch_request(
            c, client, version, self.topic, self.partition, offset, max_wait_ms=s.max_wait_ms,
            min_bytes=s.min_bytes, max_bytes=s.max_bytes, partition_max_bytes=s.partition_max_bytes,
            isolation_level=self.isolation_level))
        records, aborted = self._read_head(connection, version, offset)
        if records <= 0:
            return offset, None
        return self._read_records(connection, records, aborted, offset)

    def _read_head(self, connection: _Connection, version: int, offset: int
                   ) -> tuple[int, tuple[tuple[int, int], ...]]:
        """The response up to its records: their size (-1: none), and the aborted transactions."""
        (size,) = struct.unpack(">i", connection.exact(4))
        fixed, error_at = wire.fetch_response_head(version)
        head = connection.exact(fixed)
        connection.check_correlation(struct.unpack_from(">i", head)[0])
        if error_at is not None:
            (error,) = struct.unpack_from(">h", head, error_at)
            if error != NONE:
                raise _Retriable(f"{self.where}: Fetch failed: {error_name(error)}")
        (topics,) = struct.unpack_from(">i", head, fixed - 4)
        read = fixed
        if topics != 1:
            connection.exact(size - read)
            raise _Retriable(f"{self.where}: a Fetch response with {topics} topics")
        (name_length,) = struct.unpack(">h", connection.exact(2))
        connection.exact(name_length)
        part = wire.fetch_partition_head(connection.exact(wire.PartitionHead.size(version)), version)
        read += 2 + name_length + wire.PartitionHead.size(version)
        if part.count != 1 or part.index != self.partition:
            connection.exact(size - read)
            raise _Retriable(f"{self.where}: a Fetch response for another partition")
        aborted: tuple[tuple[int, int], ...] = ()
        if part.aborted > 0:
            raw = connection.exact(16 * part.aborted)
            read += 16 * part.aborted
            aborted = tuple((int(pid), int(first)) for pid, first in struct.iter_unpack(">qq", raw))
        tail = connection.exact(wire.fetch_partition_tail(version))
        read += len(tail)
        (records,) = struct.unpack_from(">i", tail, len(tail) - 4)
        if records > size - read:
            raise FetchError(f"{self.where}: a Fetch response whose records overrun it")
        error = part.error
        if error != NONE:
            if records > 0:
                connection.exact(records)
            if error == OFFSET_OUT_OF_RANGE:
                raise FetchError(f"{self.where}: offset {offset} is out of range on the broker (its log start passed "
                                 f"it) while reading [{self.start}, {self.stop})")
            if error in RETRIABLE:
                raise _Retriable(f"{self.where}: {error_name(error)}")
            raise FetchError(f"{self.where}: Fetch at offset {offset} refused: {error_name(error)}")
        if size - read != max(records, 0):
            raise FetchError(f"{self.where}: {size - read - max(records, 0)} unexpected bytes after the records")
        return records, aborted

    def _read_records(self, connection: _Connection, records: int, aborted: tuple[tuple[int, int], ...],
                      offset: int) -> tuple[int, bool | None]:
        """Read ``records`` bytes of batches in chunks, handing each chunk's complete batches over; stop
        reading (and drop the connection) once a batch reaches ``stop - 1``."""
        carry = b""
        left = records
        handed = False
        while left:
            want = min(CHUNK_BYTES, left)
            buf = bytearray(len(carry) + want)
            buf[:len(carry)] = carry
            connection.into(memoryview(buf)[len(carry):])
            left -= want
            self.received += want
            starts, end = split_batches(buf)
            carry = bytes(memoryview(buf)[end:])
            if not starts:
                continue
            last = starts[-1]
            next_offset = _LAST_BASE.unpack_from(buf, last)[0] + _LAST_DELTA.unpack_from(buf, last + 23)[0] + 1
            if next_offset <= offset:  # nothing new (a broker answering below the fetch offset)
                continue
            if not self._put(Chunk(buf, starts, aborted)):
                return offset, True
            handed = True
            offset = next_offset
            if offset >= self.stop:
                connection.close()  # the rest of the answer is not needed: the next Fetch would open anew
                self._connection = None
                return offset, True
        if not handed:
            if carry:  # one batch larger than the partition's fetch limit: ask for more next time
                self.settings = _grown(self.settings)
            return offset, None
        return offset, offset >= self.stop


def _grown(settings: _Settings) -> _Settings:
    from dataclasses import replace

    return replace(settings, partition_max_bytes=settings.partition_max_bytes * 2,
                   max_bytes=max(settings.max_bytes, settings.partition_max_bytes * 2))
