"""What a soak record carries, and the ledger of every record a producer had acknowledged."""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["Headers", "Ledger", "digest", "make_record", "signed64"]


def digest(key: bytes | None, value: bytes | None, headers: Any, timestamp_ms: int) -> int:
    """One 64-bit number for what a consumer must get back: key, value, headers and timestamp.

    Python's hash of a tuple of bytes is stable within a process (producers and consumers share one)."""
    normalized = tuple((k, bytes(v) if v is not None else None) for k, v in (headers or ()))
    return hash((key, value, normalized, timestamp_ms))


Headers = list[tuple[str, str | bytes | None]]


def make_record(producer: str, seq: int, partition: int, value_bytes: int) -> tuple[bytes | None, bytes | None,
                                                                                    Headers, int]:
    """Key (null every 13th), value (null about every 97th, else ``value_bytes`` long), headers, timestamp."""
    key = None if seq % 13 == 0 else f"{producer}-{partition}-{seq}".encode()
    if seq % 97 == 5 and key is not None:  # a null value (kafka-python refuses a record with neither)
        value = None
    else:
        head = f"{producer}|{partition}|{seq}|".encode()
        value = head + b"x" * max(0, value_bytes - len(head))
    headers: Headers = [("producer", producer.encode()), ("seq", str(seq).encode())]
    if seq % 3 == 0:
        headers.append(("empty", b""))
    return key, value, headers, int(time.time() * 1000)


class Ledger:
    """Every record a producer had acknowledged: partition -> offset -> digest."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._lock = threading.Lock()
        self.acked: list[dict[int, int]] = [{} for _ in range(partitions)]
        self.failed: list[str] = []
        self.twice: list[tuple[int, int]] = []  # an offset acknowledged for two different records

    def ack(self, partition: int, offset: int, value: int) -> None:
        with self._lock:
            if offset in self.acked[partition] and self.acked[partition][offset] != value:
                self.twice.append((partition, offset))
            self.acked[partition][offset] = value

    def fail(self, error: str) -> None:
        with self._lock:
            self.failed.append(error)

    def end(self, partition: int) -> int:
        """One past the highest acknowledged offset."""
        with self._lock:
            acked = self.acked[partition]
            return max(acked) + 1 if acked else 0

    def count(self) -> int:
        with self._lock:
            return sum(len(a) for a in self.acked)


def signed64(value: int) -> int:
    """``value`` as a signed 64-bit number (what an ``array("q")`` holds)."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)
