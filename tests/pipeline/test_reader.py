"""How an archive task tells aborted records from gaps (``ksi.pipeline.reader._settle``), on consumer messages
as confluent-kafka delivers them (stand-ins with its accessors): the offsets a read_committed read left out
are read again read_uncommitted, only where it left gaps, and what only that read delivers is kept, marked."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ksi.pipeline.reader import ReadSpec, _gaps, _settle, metadata_arrow_fields


@dataclass
class Message:
    at: int

    def offset(self) -> int:
        return self.at

    def partition(self) -> int:
        return 0

    def key(self) -> bytes:
        return b"k%d" % self.at

    def value(self) -> bytes:
        return b"v%d" % self.at

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_700_000_000_000 + self.at

    def error(self) -> None:
        return None


class Uncommitted:
    """What a read_uncommitted read delivers: every data record; the spans it was asked for."""

    def __init__(self, records: list[int]) -> None:
        self.records, self.asked = records, []

    def read(self, start: int, stop: int) -> list[Message]:
        self.asked.append((start, stop))
        return [Message(o) for o in self.records if start <= o < stop]


SPEC = ReadSpec(bootstrap="unused", topic="t", output_schema=pa.schema(metadata_arrow_fields()))


def test_a_range_without_gaps_is_read_once() -> None:
    uncommitted = Uncommitted(list(range(10)))
    batch, _ = _settle([Message(o) for o in range(10)], 0, 10, SPEC, uncommitted)
    assert batch.column("kafka_offset").to_pylist() == list(range(10))
    assert batch.column("kafka_aborted").null_count == 10 and uncommitted.asked == []


def test_records_only_read_uncommitted_delivers_are_kept_in_offset_order_and_marked() -> None:
    # committed 0..3, aborted 5..8 (marker 4 and 9), committed 10..12 (marker 13), compacted away: 15
    data = [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 14]
    committed = [0, 1, 2, 3, 10, 11, 12, 14]
    uncommitted = Uncommitted(data)
    batch, _ = _settle([Message(o) for o in committed], 0, 16, SPEC, uncommitted)
    assert batch.column("kafka_offset").to_pylist() == data
    assert [o for o, a in zip(data, batch.column("kafka_aborted").to_pylist(), strict=True) if a] == [5, 6, 7, 8]
    assert batch.column("kafka_value").to_pylist()[4] == b"v5"
    assert uncommitted.asked == [(4, 16)]  # one read, from the first gap to the end of the last


def test_gaps_holding_no_aborted_record_keep_the_committed_records_only() -> None:
    uncommitted = Uncommitted([0, 2, 4])
    batch, _ = _settle([Message(o) for o in (0, 2, 4)], 0, 6, SPEC, uncommitted)
    assert batch.column("kafka_offset").to_pylist() == [0, 2, 4] and batch.column("kafka_aborted").null_count == 3
    assert uncommitted.asked == [(1, 6)]


def test_gaps_are_what_neither_records_nor_markers_take() -> None:
    controls = np.array([[5, 5], [9, 12]], np.int64)
    assert _gaps(np.array([2, 3, 4, 6, 13], np.int64), controls, 0, 20).tolist() == [[0, 2], [7, 9], [14, 20]]
    assert _gaps(np.array([0, 1], np.int64), np.zeros((0, 2), np.int64), 0, 2).tolist() == []
    assert _gaps(np.zeros(0, np.int64), np.zeros((0, 2), np.int64), 4, 7).tolist() == [[4, 7]]
