"""Drivers for the client conformance matrix: one small, uniform face over seven Kafka clients.

Each driver produces records, consumes them in a consumer group (committing before it returns) and reads
topic metadata, using only that client's public API.  The Python clients run in-process; kafkajs, kcat, the
Java client and Sarama run as subprocesses (``kafkajs_client.js`` here, Debian's ``kcat``, the programs
in ``tests/integration/java`` and ``tests/integration/go/sarama``).  A client that is not installed
fails the test with the command that installs it: the matrix is never silently smaller.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "CLIENT_NAMES",
    "INSTALL_HINT",
    "Client",
    "ClientMissing",
    "Consumed",
    "Record",
    "check_consumed",
    "make_client",
    "make_records",
]

CLIENT_NAMES = ("confluent-kafka", "kafka-python", "aiokafka", "kafkajs", "kcat", "java", "sarama")
INSTALL_HINT = "run `make test` (or `bash scripts/install-test-deps.sh`) to install the test clients"

# Settings shared by every driver, chosen for fast tests against loopback brokers.
SESSION_TIMEOUT_MS = 6000  # tansu holds a JoinGroup for session.timeout/2 before answering
HEARTBEAT_INTERVAL_MS = 1000
FETCH_MAX_WAIT_MS = 100
CONSUME_TIMEOUT_S = 40.0
# noida ignores fetch size limits, so librdkafka must accept responses as large as a whole partition.
RECEIVE_MESSAGE_MAX_BYTES = 1_000_000_000


class ClientMissing(Exception):
    """The client program or package is not installed; the message says how to install it."""


@dataclass(frozen=True, slots=True)
class Record:
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Consumed:
    record: Record
    partition: int
    offset: int


class Client(Protocol):
    name: str
    text_only: bool  # True: printable keys/values only, one fixed header set per produce call (kcat)

    def produce(self, bootstrap: str, topic: str, records: Sequence[Record]) -> None:
        """Send every record and wait until all are acknowledged."""

    def consume(self, bootstrap: str, topic: str, group: str, count: int) -> list[Consumed]:
        """Join ``group``, read ``count`` records (from the earliest offset when the group has no
        commit), commit what was read, leave the group."""

    def topics(self, bootstrap: str) -> dict[str, int]:
        """Topic name -> partition count, from a Metadata request."""


def make_client(name: str, broker_kind: str) -> Client:
    """The driver for client ``name`` tuned for ``broker_kind``; raises :class:`ClientMissing`."""
    if name in ("confluent-kafka", "kafka-python", "aiokafka"):
        from clients import python_clients

        return python_clients.make(name, broker_kind)
    if name in ("kafkajs", "kcat"):
        from clients import external

        return external.make(name, broker_kind)
    if name in ("java", "sarama"):
        from clients import jvm_clients

        return jvm_clients.make(name, broker_kind)
    raise ValueError(f"unknown client {name!r}; known: {', '.join(CLIENT_NAMES)}")


def make_records(client: Client, start: int, count: int) -> list[Record]:
    """``count`` records numbered from ``start``: ten keys (so several records share a partition and
    their order is checked), binary values with NUL and newline bytes, two headers each.  For a
    text-only client: printable values and one header set for the whole call."""
    records = []
    for i in range(start, start + count):
        key: bytes | None = f"key-{i % 10}".encode()
        if client.text_only:
            value = f"value {i} from {client.name} \u00e9\u6f22".encode()
            headers: tuple[tuple[str, bytes], ...] = (("source", client.name.encode()), ("run", b"matrix"))
        else:
            value = f"value-{i}|".encode() + bytes((i * 37 + j) % 256 for j in range(i % 41))
            headers = (("source", client.name.encode()), ("seq", str(i).encode()), ("bin", b"\x00\xff\n"))
            if i % 25 == 7:
                key = None
        records.append(Record(key, value, headers))
    return records


def check_consumed(expected: Sequence[Record], consumed: Sequence[Consumed]) -> None:
    """Assert ``consumed`` is exactly ``expected`` (no loss, no duplicate, same bytes), offsets are unique
    and records sharing a key arrive in the order they were produced."""
    got = sorted((c.record for c in consumed), key=_sort_key)
    want = sorted(expected, key=_sort_key)
    if got != want:
        missing = [r for r in want if r not in got]
        extra = [r for r in got if r not in want]
        raise AssertionError(
            f"consumed {len(got)} records, expected {len(want)}; "
            f"missing {len(missing)} (first: {missing[:2]}), unexpected {len(extra)} (first: {extra[:2]})"
        )
    positions = [(c.partition, c.offset) for c in consumed]
    assert len(set(positions)) == len(positions), f"duplicate partition/offset pairs: {sorted(positions)}"
    by_key: dict[bytes, list[Consumed]] = defaultdict(list)
    for c in sorted(consumed, key=lambda c: (c.partition, c.offset)):
        if c.record.key is not None:
            by_key[c.record.key].append(c)
    for key, items in by_key.items():
        assert len({c.partition for c in items}) == 1, f"key {key!r} was spread over partitions"
        order = [c.record for c in items]
        produced = [r for r in expected if r.key == key]
        assert order == produced, f"key {key!r}: records arrived out of order"


def _sort_key(record: Record) -> tuple[bytes, bytes, tuple[tuple[str, bytes], ...]]:
    return (record.key or b"", record.value, record.headers)
