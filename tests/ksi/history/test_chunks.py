from __future__ import annotations

import numpy as np
import pyarrow as pa
from kafka.record import MemoryRecords

from ksi.history.chunks import Chunk, encode_span
from ksi.lake.columns import Columns
from ksi.lake.records import PartitionRecords
from ksi.lake.table import Span


def chunk(start: int, stop: int, batches: list[tuple[int, int, int]]) -> Chunk:
    """batches: (base offset, last offset, size in bytes)."""
    return Chunk(start, stop, np.array([b for b, _, _ in batches], dtype=np.int64),
                 np.array([la for _, la, _ in batches], dtype=np.int64),
                 tuple(bytes([i]) * size for i, (_, _, size) in enumerate(batches)))


def test_take_starts_at_the_batch_holding_the_offset_and_honours_the_budget() -> None:
    c = chunk(100, 200, [(100, 109, 10), (110, 119, 10), (125, 140, 10)])  # 120..124 is a gap
    a, b, d = b"\x00" * 10, b"\x01" * 10, b"\x02" * 10
    assert c.take(100, 1000) == ([a, b, d], True)
    assert c.take(105, 15) == ([a], False)   # the batch holding 105, then no room for the next
    assert c.take(105, 1) == ([a], False)    # at least one whole batch (KIP-74)
    assert c.take(121, 100) == ([d], True)   # in the gap: the first batch after it
    assert c.take(141, 100) == ([], True)    # covered, but no record at or after it here
    assert c.nbytes == 30 and c.covers(199) and not c.covers(200)


def test_a_span_with_aborted_records_is_served_without_them_to_read_committed() -> None:
    """Records of aborted transactions (the lake's ``kafka_aborted``) go to read_uncommitted consumers only;
    for read_committed their offsets are holes, stepped over like any other.  Both encodings are one value of
    the cache; a span without aborted records has only one."""
    offsets = np.arange(10, 20, dtype=np.int64)
    columns = Columns(offsets=offsets, timestamps=offsets * 1000, keys=pa.array([None] * 10, pa.binary()),
                            values=pa.array([b"v%d" % o for o in offsets], pa.binary()))
    aborted = np.isin(offsets, [13, 14, 15, 19])
    span = Span(0, 10, 21, PartitionRecords(0, columns, None, aborted))
    encoded = encode_span(span)
    assert encoded.committed is not None and encoded.nbytes > sum(map(len, encoded.batches))

    def served(isolation: int, offset: int = 10) -> list[int]:
        batches, whole = encoded.take(offset, 1 << 20, isolation)
        assert whole
        records = MemoryRecords(b"".join(batches))
        out = []
        while (batch := records.next_batch()) is not None:
            out += [r.offset for r in batch]
        return out

    assert served(0) == list(range(10, 20))
    assert served(1) == [10, 11, 12, 16, 17, 18]
    assert [o for o in served(1, 13) if o >= 13] == [16, 17, 18]  # (a client skips a batch's records below)
    assert served(1, 19) == []  # only an aborted record left: nothing, and the reader goes on past the chunk
    plain = encode_span(Span(0, 10, 21, PartitionRecords(0, columns, None)))
    assert plain.committed is None and plain.take(10, 1 << 20, 1) == plain.take(10, 1 << 20, 0)
