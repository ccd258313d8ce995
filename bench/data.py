"""The benchmark's records: made column-wise (tests.shapes), produced to the broker with the offsets, keys,
headers and timestamps the lake's tables hold, and checked on the way back.

Every read is checked: per partition, the count and a BLAKE2 digest of (offset, timestamp, key, value,
headers) in offset order must equal the produced records'.  A fast but wrong read says so.
"""

from __future__ import annotations

import hashlib
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import Message, Producer

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.shapes import KafkaRecords, synthetic, synthetic_slices  # noqa: E402

__all__ = [
    "PRODUCER_CONFIG",
    "Digest",
    "compare",
    "consumed_digests",
    "expected_digests",
    "produce",
    "recent_start_ms",
    "record_slices",
    "records",
]

PRODUCER_CONFIG: dict[str, Any] = {
    "linger.ms": 20, "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576, "compression.type": "none", "enable.idempotence": False,
    "acks": "all", "message.max.bytes": 16 << 20,
}


def recent_start_ms(records: int) -> int:
    """Timestamps that end about an hour ago: noida applies its 7-day retention to records' own timestamps."""
    return (int(time.time()) - 3600) * 1000 - records


def records(n: int, partitions: int, seed: int = 7) -> KafkaRecords:
    return synthetic(n, partitions, seed=seed, start_ms=recent_start_ms(n))


def record_slices(n: int, partitions: int, seed: int = 7, slice_rows: int = 500_000) -> Any:
    return synthetic_slices(n, partitions, seed=seed, slice_rows=slice_rows, start_ms=recent_start_ms(n))


def produce(bootstrap: str, topic: str, data: KafkaRecords | Any, log: Any = print) -> float:
    """Produce every record to its partition in offset order, with its key, header and timestamp; the
    broker's offsets then equal the records' (an empty topic, contiguous offsets).  Seconds taken."""
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
    started = time.perf_counter()
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    done = 0
    for part in ([data] if isinstance(data, KafkaRecords) else data):
        ordered = part.sorted()
        partitions = ordered.partition.to_numpy()
        keys, values = ordered.key.to_pylist(), ordered.value.to_pylist()
        stamps = ordered.timestamp_ms.to_numpy()
        headers = [[(h["key"], h["value"]) for h in hs] if hs else None for hs in ordered.headers.to_pylist()]
        for i in range(len(ordered)):
            while True:
                try:
                    producer.produce(topic, values[i], keys[i], partition=int(partitions[i]),
                                     timestamp=int(stamps[i]), headers=headers[i], on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 50_000 == 0:
                producer.poll(0)
        done += len(ordered)
        log(f"  produced {done:,} records to {topic}")
    producer.flush(300)
    if errors:
        raise SystemExit(f"produce to {topic} failed: {errors[:3]}")
    return time.perf_counter() - started


@dataclass
class Digest:
    count: int = 0
    digest: Any = field(default_factory=lambda: hashlib.blake2b(digest_size=16))

    def add(self, offset: int, timestamp: int, key: bytes | None, value: bytes | None,
            headers: list[tuple[str, bytes | None]]) -> None:
        self.count += 1
        h = self.digest
        h.update(struct.pack(">qq", offset, timestamp))
        for part in (key, value):
            h.update(b"\x00" if part is None else b"\x01" + struct.pack(">i", len(part)) + part)
        for k, v in headers:
            h.update(k.encode() + b"\x00" + (b"" if v is None else v))

    def hex(self) -> str:
        return str(self.digest.hexdigest())


def expected_digests(data: KafkaRecords, offsets: dict[int, tuple[int, int]] | None = None) -> dict[int, Digest]:
    """Per partition, the digest of the records (optionally only offsets first..last per partition)."""
    ordered = data.sorted()
    out: dict[int, Digest] = {}
    rows = zip(ordered.partition.to_pylist(), ordered.offset.to_pylist(), ordered.timestamp_ms.to_pylist(),
               ordered.key.to_pylist(), ordered.value.to_pylist(), ordered.headers.to_pylist(), strict=True)
    for p, o, ts, k, v, hs in rows:
        if offsets is not None and not offsets[p][0] <= o <= offsets[p][1]:
            continue
        out.setdefault(p, Digest()).add(o, ts, k, v, [(h["key"], h["value"]) for h in hs] if hs else [])
    return out


def consumed_digests(messages: list[Message]) -> dict[int, Digest]:
    """The same digest of consumed messages (sorted by partition and offset first)."""
    out: dict[int, Digest] = {}
    for m in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        headers = [(k, v) for k, v in (m.headers() or [])]
        out.setdefault(m.partition(), Digest()).add(m.offset(), m.timestamp()[1], m.key(), m.value(), headers)
    return out


def compare(expected: dict[int, Digest], got: dict[int, Digest]) -> str | None:
    """None when equal; else what differs, per partition."""
    problems = []
    for p in sorted(set(expected) | set(got)):
        e, g = expected.get(p), got.get(p)
        if e is None or g is None or e.count != g.count or e.hex() != g.hex():
            problems.append(f"partition {p}: expected {e.count if e else 0} records, got {g.count if g else 0}"
                            + ("" if e is None or g is None or e.count != g.count else " (contents differ)"))
    return "; ".join(problems) or None


def partition_ranges(data: KafkaRecords) -> dict[int, tuple[int, int]]:
    """Per partition, the first and last offset."""
    table = pa.table({"p": data.partition, "o": data.offset}).group_by("p").aggregate([("o", "min"), ("o", "max")])
    return {int(p): (int(lo), int(hi)) for p, lo, hi in zip(*(table.column(c).to_pylist()
                                                                 for c in ("p", "o_min", "o_max")), strict=True)}


def counts(data: KafkaRecords) -> Counter[int]:
    return Counter({int(p): int(c) for p, c in enumerate(np.bincount(data.partition.to_numpy()))})
