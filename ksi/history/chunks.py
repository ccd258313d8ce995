"""Cold records as Kafka record batches: a span of one partition's offsets, encoded once, taken many times.

A :class:`Chunk` is the record batches of the offsets ``[start, stop)`` of one partition (gaps kept: the
records the lake holds in that range, with their original offsets), built by :func:`encode_span` from
what the cold reader read.  A Fetch at offset ``o`` takes the batches from the one holding ``o`` (or the
first after it: a hole is stepped over, as a broker steps over compacted offsets; a consumer skips the
records of that first batch below ``o``, as it does with a broker's batches), up to its byte budget and
always at least one batch (KIP-74).

A span holding records of aborted transactions (``kafka_aborted``) is encoded twice: every record, for
read_uncommitted consumers, and without the aborted ones (their offsets become holes, stepped over like any
other), for read_committed ones; the second encoding rides in the same cache entry (:attr:`Chunk.committed`),
so the two views never mix and spans without aborted records cost nothing more.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from protocol.records import RecordColumns, encode_batches, timestamp_runs

from ..lake.columns import Columns
from ..lake.spill import Read
from ..lake.table import Span

__all__ = ["BATCH_BYTES", "READ_COMMITTED", "Chunk", "SpilledChunk", "encode_span"]

BATCH_BYTES = 256 << 10   # records per served batch, before compression: a fetch's unit of bytes
_BASE = struct.Struct(">q")        # a batch's base offset, at byte 0
_LAST_DELTA = struct.Struct(">i")  # its last offset delta, at byte 23
READ_COMMITTED = 1                 # a Fetch's isolation_level


@dataclass(frozen=True, slots=True, eq=False)
class Chunk:
    start: int                       # first offset covered
    stop: int                        # first offset not covered
    bases: npt.NDArray[np.int64]     # each batch's base offset
    lasts: npt.NDArray[np.int64]     # each batch's last offset
    batches: tuple[bytes, ...]
    ends: npt.NDArray[np.int64] = field(init=False)  # cumulative bytes after each batch
    committed: Chunk | None = None   # read_committed's batches when the span holds aborted records

    def __post_init__(self) -> None:
        object.__setattr__(self, "ends", np.cumsum([len(b) for b in self.batches], dtype=np.int64))

    @property
    def nbytes(self) -> int:
        own = int(self.ends[-1]) if len(self.batches) else 0
        return own + (self.committed.nbytes if self.committed is not None else 0)

    def covers(self, offset: int) -> bool:
        return self.start <= offset < self.stop

    def take(self, offset: int, max_bytes: int, isolation_level: int = 0,
             exact: bool = False) -> tuple[list[bytes], bool]:
        """The batches from the one holding ``offset`` (or the first after it) on, within ``max_bytes`` but at
        least one (empty when no record at or after ``offset`` is in this chunk); and whether they reach the
        chunk's end (only then may a response go on with the next chunk: no offset left out between).
        ``isolation_level`` 1 (read_committed) leaves out the records of aborted transactions.  ``exact``:
        nothing (and False) when the batch holding ``offset`` starts below it: a response going on after
        another chunk must not repeat offsets (a client skips records below its fetch offset in what a Fetch
        brings, not below where the response's previous batch ended)."""
        if isolation_level == READ_COMMITTED and self.committed is not None:
            return self.committed.take(offset, max_bytes, exact=exact)
        chosen = _chosen(self.bases, self.lasts, self.ends, offset, max_bytes, exact)
        if chosen is None:
            return [], False
        first, last = chosen
        return list(self.batches[first:last]), last >= len(self.batches)

    def spill_parts(self) -> list[bytes]:
        """Its batches, then read_committed's (kept in the spill file when memory evicts it)."""
        return list(self.batches) + (list(self.committed.batches) if self.committed is not None else [])

    def spilled(self, read: Read) -> SpilledChunk:
        """A stand-in answering from :meth:`spill_parts`' bytes through ``read``."""
        own = int(self.ends[-1]) if len(self.batches) else 0
        committed = None
        if self.committed is not None:
            committed = SpilledChunk(self.committed.start, self.committed.stop, self.committed.bases,
                                     self.committed.lasts, self.committed.ends, read, own)
        return SpilledChunk(self.start, self.stop, self.bases, self.lasts, self.ends, read, 0, committed)


@dataclass(frozen=True, slots=True, eq=False)
class SpilledChunk:
    """A :class:`Chunk` evicted from memory into the spill file (:mod:`ksi.lake.spill`): the same answers, its
    batches read back from the file (one read of the consecutive batches a take gives).  Raises
    :class:`ksi.lake.spill.Evicted` when the file no longer holds them."""

    start: int
    stop: int
    bases: npt.NDArray[np.int64]
    lasts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    read: Read
    at: int = 0                          # where its batches begin in the entry's bytes
    committed: SpilledChunk | None = None
    nbytes = 0                           # none in memory

    def covers(self, offset: int) -> bool:
        return self.start <= offset < self.stop

    def take(self, offset: int, max_bytes: int, isolation_level: int = 0,
             exact: bool = False) -> tuple[list[bytes], bool]:
        """As :meth:`Chunk.take`."""
        if isolation_level == READ_COMMITTED and self.committed is not None:
            return self.committed.take(offset, max_bytes, exact=exact)
        chosen = _chosen(self.bases, self.lasts, self.ends, offset, max_bytes, exact)
        if chosen is None:
            return [], False
        first, last = chosen
        if first == last:
            return [], True
        before = int(self.ends[first - 1]) if first else 0
        return [self.read(self.at + before, int(self.ends[last - 1]) - before)], last >= len(self.bases)


def _chosen(bases: npt.NDArray[np.int64], lasts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], offset: int,
            max_bytes: int, exact: bool) -> tuple[int, int] | None:
    """The batches ``[first, last)`` a take gives (see :meth:`Chunk.take`): from the one holding ``offset`` on,
    within ``max_bytes`` but at least one; empty (both the count) when none is at or after ``offset``; None when
    ``exact`` and the batch holding ``offset`` starts below it."""
    count = len(bases)
    first = int(np.searchsorted(lasts, offset, side="left"))
    if first >= count:
        return count, count
    if exact and int(bases[first]) < offset:
        return None
    before = int(ends[first - 1]) if first else 0
    return first, max(int(np.searchsorted(ends, before + max_bytes, side="right")), first + 1)


def encode_span(span: Span, compression: str = "none") -> Chunk:
    """Encode a span's records as record batches of up to BATCH_BYTES (a batch never mixes timestamp types,
    and a LogAppendTime batch never spans two append times); with a second encoding without the records of
    aborted transactions when it holds any."""
    records = span.records
    if records is None or not len(records.columns):
        empty = np.zeros(0, dtype=np.int64)
        return Chunk(span.start, span.stop, empty, empty, ())
    committed = None
    if records.aborted is not None:
        keep = np.flatnonzero(~records.aborted)
        types = records.timestamp_types
        committed = _encode(span.start, span.stop, _take(records.columns, keep),
                            None if types is None else types[keep], compression)
    return _encode(span.start, span.stop, records.columns, records.timestamp_types, compression, committed)


def _take(columns: RecordColumns, rows: npt.NDArray[np.intp]) -> RecordColumns:
    indices = pa.array(rows, pa.int64())
    return Columns(offsets=columns.offsets[rows], timestamps=columns.timestamps[rows],
                         keys=columns.keys.take(indices), values=columns.values.take(indices),
                         headers=None if columns.headers is None else columns.headers.take(indices))


def _encode(start: int, stop: int, columns: RecordColumns, timestamp_types: npt.NDArray[np.int8] | None,
            compression: str, committed: Chunk | None = None) -> Chunk:
    if not len(columns):
        empty = np.zeros(0, dtype=np.int64)
        return Chunk(start, stop, empty, empty, (), committed)
    level = 1 if compression == "gzip" else None  # gzip's default level 6 costs 4x the CPU for ~10% size
    runs = ([(0, len(columns), 0)] if timestamp_types is None
            else timestamp_runs(timestamp_types, columns.timestamps))
    batches: list[bytes] = []
    for first, end, timestamp_type in runs:
        batches += encode_batches(columns.slice(first, end), max_batch_bytes=BATCH_BYTES,
                                  timestamp_type=timestamp_type, compression=compression, compression_level=level)
    bases = np.fromiter((_BASE.unpack_from(b, 0)[0] for b in batches), dtype=np.int64, count=len(batches))
    deltas = np.fromiter((_LAST_DELTA.unpack_from(b, 23)[0] for b in batches), dtype=np.int64, count=len(batches))
    return Chunk(start, stop, bases, bases + deltas, tuple(batches), committed)
