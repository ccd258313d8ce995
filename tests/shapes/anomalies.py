"""What a topic held -> what a writer keeps: holes, duplicates, transactions, compaction, bad values.

Each function takes :class:`~tests.shapes.records.KafkaRecords` (the topic as a consumer would see it)
and returns the records a writer leaves in its table, vectorized.  Which writer does what is in
``docs/writers.md``: e.g. Kafka Connect drops tombstones and keeps aborted records, Redpanda, AutoMQ and
ksi keep only committed records; :meth:`TransactionalTopic.as_written_by` applies that per layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .records import KafkaRecords

__all__ = [
    "READS_COMMITTED",
    "TransactionalTopic",
    "compact",
    "drop_tombstones",
    "duplicate",
    "holes",
    "invalid_values",
    "transactional",
    "with_tombstones",
]

# layouts whose writer reads with read_committed (aborted records never reach the table)
READS_COMMITTED = {"ksi": True, "redpanda": True, "automq": True, "kafka-connect": False, "streambased": True}


def _rank_in_partition(records: KafkaRecords) -> np.ndarray:
    """Each record's 0-based position within its partition, in offset order."""
    p = records.partition.to_numpy(zero_copy_only=False)
    o = records.offset.to_numpy(zero_copy_only=False)
    order = np.lexsort((o, p))
    ranks = np.empty(len(p), dtype=np.int64)
    sorted_p = p[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_p)) + 1]
    run_start = np.repeat(starts, np.diff(np.r_[starts, len(p)]))
    ranks[order] = np.arange(len(p)) - run_start
    return ranks


def with_tombstones(records: KafkaRecords, every: int = 10, seed: int = 0) -> KafkaRecords:
    """About one record in ``every`` becomes a tombstone (null value; its typed value null too)."""
    rng = np.random.default_rng(seed)
    mask = pa.array(rng.integers(0, every, size=len(records)) == 0)
    value = pc.if_else(mask, pa.nulls(len(records), pa.binary()), records.value)
    typed = records.typed
    if typed is not None:
        typed = pa.StructArray.from_arrays(typed.flatten(), fields=list(typed.type),
                                           mask=pc.or_(mask, pc.is_null(typed)))
    return KafkaRecords(records.partition, records.offset, records.timestamp_ms, records.key, value, records.headers,
                        records.timestamp_type, typed, records.topic)


def drop_tombstones(records: KafkaRecords) -> KafkaRecords:
    """What Kafka Connect's Iceberg sink keeps ("ignore tombstones"): a hole at every tombstone."""
    return records.filter(pc.is_valid(records.value))


@dataclass(frozen=True)
class TransactionalTopic:
    """A partition log written by a transactional producer: data records at their offsets, one control
    marker offset after each transaction (in no table), some transactions aborted."""

    records: KafkaRecords        # every data record, committed and aborted, at its offset
    aborted: pa.Array            # bool per record
    markers: dict[int, list[int]]  # partition -> offsets of the commit/abort markers

    def committed(self) -> KafkaRecords:
        """What a read_committed reader sees (Redpanda, AutoMQ, ksi write this)."""
        return self.records.filter(pc.invert(self.aborted))

    def as_written_by(self, layout: str) -> KafkaRecords:
        return self.committed() if READS_COMMITTED[layout] else self.records


def transactional(records: KafkaRecords, records_per_transaction: int = 10, abort_every: int = 3) -> TransactionalTopic:
    """Renumber ``records`` as a transactional producer leaves them: per partition, transactions of
    ``records_per_transaction`` records each followed by a marker offset; every ``abort_every``-th
    transaction (0 = none) aborted."""
    k = records_per_transaction
    rank = _rank_in_partition(records)
    txn = rank // k
    partitions = records.partition.to_numpy(zero_copy_only=False)
    # offset = partition's first offset + rank + markers before it
    base = {int(p): int(pc.min(records.offset.filter(pc.equal(records.partition, p))).as_py())
            for p in np.unique(partitions)} if len(records) else {}
    starts = np.array([base[int(p)] for p in partitions], dtype=np.int64) if len(records) else np.array([], np.int64)
    offsets = starts + rank + txn
    aborted = (txn % abort_every == abort_every - 1) if abort_every else np.zeros(len(records), dtype=bool)
    markers: dict[int, list[int]] = {}
    for p in np.unique(partitions):
        mask = partitions == p
        n_txn = int(txn[mask].max()) + 1
        # transaction t holds offsets base + t*(k+1) ... and its marker follows its last record
        counts = np.bincount(txn[mask], minlength=n_txn)
        markers[int(p)] = [base[int(p)] + t * (k + 1) + int(counts[t]) for t in range(n_txn)]
    renumbered = KafkaRecords(records.partition, pa.array(offsets), records.timestamp_ms, records.key, records.value,
                              records.headers, records.timestamp_type, records.typed, records.topic)
    return TransactionalTopic(renumbered, pa.array(aborted), markers)


def compact(records: KafkaRecords) -> KafkaRecords:
    """Log compaction: the last record per (partition, key) stays (null keys stay: a compacted topic
    refuses them, so real data has none).  The removed offsets are holes."""
    rank = np.arange(len(records))
    t = pa.table({"p": records.partition, "k": records.key, "o": records.offset, "i": pa.array(rank)})
    keyed = t.filter(pc.is_valid(t["k"]))
    last = keyed.group_by(["p", "k"], use_threads=False).aggregate([("o", "max")])
    winners = keyed.join(last, keys=["p", "k"], use_threads=False)
    keep = np.zeros(len(records), dtype=bool)
    w = winners.filter(pc.equal(winners["o"], winners["o_max"]))
    keep[w["i"].to_numpy()] = True
    keep[np.flatnonzero(pc.is_null(records.key).to_numpy(zero_copy_only=False))] = True
    return records.filter(pa.array(keep))


def duplicate(records: KafkaRecords, fraction: float = 0.01, *, differing: bool = False, seed: int = 0) -> KafkaRecords:
    """An at-least-once sink's retry: a random ``fraction`` of the records written again after the rest
    (same partition and offset); ``differing`` changes the copies' value bytes (a byte flipped), as
    a re-read after the data changed, or a bug, would."""
    rng = np.random.default_rng(seed)
    n = max(1, int(len(records) * fraction)) if len(records) else 0
    idx = np.sort(rng.choice(len(records), size=n, replace=False)) if n else np.array([], dtype=np.int64)
    copies = records.take(pa.array(idx, pa.int64()))
    if differing and len(copies):
        values = copies.value.to_pylist()
        flipped = [None if v is None else (bytes([v[0] ^ 0xFF]) + v[1:] if v else b"\x00") for v in values]
        copies = KafkaRecords(copies.partition, copies.offset, copies.timestamp_ms, copies.key,
                              pa.array(flipped, pa.binary()), copies.headers, copies.timestamp_type, copies.typed,
                              copies.topic)
    return KafkaRecords.concat([records, copies])


def invalid_values(records: KafkaRecords, every: int = 20, seed: int = 0) -> KafkaRecords:
    """About one value in ``every`` does not decode: its typed value is null while its bytes are not
    (Redpanda's schema modes send such records to ``<topic>~dlq``)."""
    if records.typed is None:
        raise ValueError("invalid_values needs typed values")
    rng = np.random.default_rng(seed)
    bad = pa.array(rng.integers(0, every, size=len(records)) == 0)
    typed = pa.StructArray.from_arrays(records.typed.flatten(), fields=list(records.typed.type),
                                       mask=pc.or_(bad, pc.is_null(records.typed)))
    return KafkaRecords(records.partition, records.offset, records.timestamp_ms, records.key, records.value,
                        records.headers, records.timestamp_type, typed, records.topic)


def holes(table_records: KafkaRecords, topic_records: KafkaRecords) -> dict[int, list[int]]:
    """Offsets per partition that the topic has and the table does not (for asserting on a reader)."""
    out: dict[int, list[int]] = {}
    have = set(zip(table_records.partition.to_pylist(), table_records.offset.to_pylist(), strict=True))
    for p, o in zip(topic_records.partition.to_pylist(), topic_records.offset.to_pylist(), strict=True):
        if (p, o) not in have:
            out.setdefault(p, []).append(o)
    return {p: sorted(v) for p, v in out.items()}
