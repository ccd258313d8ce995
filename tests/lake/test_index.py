"""Where a partition's offsets are: pieces grouped into components, lookups past holes, complete components."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ksi.lake.index import NO_TIMESTAMP, FileIndex, IndexColumns, PartitionPlan, TablePlan, index_window, piece_key


def plan(pieces: list[tuple[int, int, int]]) -> PartitionPlan:
    """pieces: (window, first, last) of one file and row group."""
    n = len(pieces)
    return PartitionPlan.of(0, np.zeros(n, np.int32), np.zeros(n, np.int32),
                            np.array([w for w, _, _ in pieces], np.int32),
                            np.array([f for _, f, _ in pieces], np.int64),
                            np.array([la for _, _, la in pieces], np.int64),
                            np.array([la - f + 1 for _, f, la in pieces], np.int64), np.full(n, NO_TIMESTAMP, np.int64))


def test_overlapping_pieces_form_one_component_and_holes_separate_components() -> None:
    p = plan([(2, 200, 299), (0, 0, 99), (1, 50, 149), (3, 305, 400)])  # windows 0 and 1 overlap: a retry's copies
    assert p.components == 3
    assert [p.component_range(c) for c in range(3)] == [(0, 149), (200, 299), (305, 400)]
    assert sorted(piece.window for piece in p.pieces(0)) == [0, 1] and p.duplicates(0) and not p.duplicates(1)
    assert p.locate(0) == 0 and p.locate(149) == 0
    assert p.locate(150) == 1 and p.locate(199) == 1   # a hole: the next component
    assert p.locate(302) == 2 and p.locate(401) is None
    assert (p.first_offset, p.last_offset) == (0, 400)


def test_index_window_counts_bad_rows_and_groups_by_partition() -> None:
    columns = {1: pa.array([0, 1, 0, None, 1, 0], pa.int32()), 2: pa.array([5, 7, 3, 9, None, -1], pa.int64()),
               3: pa.array([10, 20, 30, 40, 50, 60], pa.int64())}
    grouped, bad = index_window(columns, IndexColumns(1, 2, (3,)))
    assert bad == 3  # null partition, null offset, negative offset
    rows = sorted(zip(grouped.partition.tolist(), grouped.first.tolist(), grouped.last.tolist(), grouped.rows.tolist(),
                      grouped.max_timestamp.tolist(), strict=True))
    assert rows == [(0, 3, 5, 2, 30), (1, 7, 7, 1, 20)]


def test_complete_components_need_every_piece_read() -> None:
    def index(path: str, entries: list[tuple[int, int, int, int]]) -> FileIndex:
        """entries: (window, partition, first, last)"""
        arr = np.array(entries, np.int64).reshape(-1, 4)
        return FileIndex(path, np.zeros(len(arr), np.int32), arr[:, 0].astype(np.int32), arr[:, 1].astype(np.int32),
                         arr[:, 2], arr[:, 3], arr[:, 3] - arr[:, 2] + 1, np.full(len(arr), NO_TIMESTAMP, np.int64))

    # partition 1's offsets 10..29 are split over windows 0 and 1 (one component: they overlap)
    table = TablePlan.build(1, (), (), [index("a", [(0, 0, 0, 9), (0, 1, 10, 25), (1, 0, 10, 19), (1, 1, 20, 29)])])
    assert table.partitions[1].components == 1 and table.partitions[0].components == 2
    assert table.window_rows == {piece_key(0, 0, 0): 26, piece_key(0, 0, 1): 20}
    assert table.complete_components(np.array([piece_key(0, 0, 0)])) == {0: [0]}
    assert table.complete_components(np.array([piece_key(0, 0, 0), piece_key(0, 0, 1)])) == {0: [0, 1], 1: [0]}
