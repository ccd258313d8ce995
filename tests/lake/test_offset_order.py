"""ksi.lake.records._offset_order: a read's rows in (partition, offset) order, rows of one offset in the
table's order, whichever way it gets there (the rows as they come, their runs put in order, or a sort)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ksi.lake import records
from ksi.lake.records import _offset_order


@st.composite
def reads(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of files as writers leave them: each file holds a stretch of offsets of some partitions,
    interleaved, in offset order or not; the files in any order; some offsets twice (a file written twice,
    overlapping stretches); a choice of the rows, in row order."""
    partitions = draw(st.integers(1, 4))
    ends = [draw(st.integers(0, 3)) for _ in range(partitions)]
    files: list[list[tuple[int, int]]] = []
    for _ in range(draw(st.integers(1, 8))):
        rows: list[tuple[int, int]] = []
        for p in range(partitions):
            if draw(st.booleans()) and files:
                ends[p] -= draw(st.integers(0, 3))  # overlaps the stretch before
            size = draw(st.integers(0, 40))
            rows += [(p, o) for o in range(ends[p], ends[p] + size)]
            ends[p] += size + draw(st.sampled_from([0, 0, 2]))
        order = draw(st.sampled_from(["interleaved", "by partition", "shuffled"]))
        if order == "interleaved":
            rows.sort(key=lambda r: (r[1], r[0]))
        elif order == "shuffled":
            rows = draw(st.permutations(rows))
        files.append(rows)
    files = draw(st.permutations(files))
    rows = [r for f in files for r in f] or [(0, 0)]
    p = np.array([r[0] for r in rows], dtype=np.int64)
    o = np.array([r[1] for r in rows], dtype=np.int64)
    kept = draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    chosen = np.flatnonzero(kept) if any(kept) else np.arange(len(rows))
    return p, o, chosen.astype(np.intp)


@settings(max_examples=400, deadline=None)
@given(reads(), st.sampled_from([1, 4, 16]))
def test_offset_order_is_a_stable_sort_by_partition_and_offset(read: tuple[np.ndarray, ...], min_run: int) -> None:
    p, o, chosen = read
    records.MIN_RUN_ROWS, saved = min_run, records.MIN_RUN_ROWS
    try:
        order, p_sorted, o_sorted = _offset_order(p, o, chosen)
    finally:
        records.MIN_RUN_ROWS = saved
    expected = chosen[np.lexsort((o[chosen], p[chosen]))]
    assert order.tolist() == expected.tolist()
    assert p_sorted.tolist() == p[expected].tolist()
    assert o_sorted.tolist() == o[expected].tolist()


def test_files_of_interleaved_partitions_in_any_file_order_are_put_in_order_by_their_runs() -> None:
    """A streaming sink's files read in the snapshot's order: each file's stretch of each partition is one run,
    so the rows are put in order without a sort of the rows (the runs path answers, and equals np.lexsort)."""
    rng = np.random.default_rng(3)
    stretches = []
    first = [0, 0, 0, 0]
    for _ in range(32):
        p = rng.integers(0, 4, 2000)
        o = np.empty(2000, dtype=np.int64)
        for q in range(4):
            at = p == q
            o[at] = first[q] + np.arange(at.sum())
            first[q] += int(at.sum())
        stretches.append((p, o))
    shuffled = [stretches[i] for i in rng.permutation(32)]
    p = np.concatenate([s[0] for s in shuffled])
    o = np.concatenate([s[1] for s in shuffled])
    by_partition = np.argsort(p.astype(np.int16), kind="stable")
    assert records._run_order(p[by_partition], o[by_partition]) is not None  # the runs path answers
    order, _, o_sorted = _offset_order(p, o, np.arange(len(p)))
    assert order.tolist() == np.lexsort((o, p)).tolist()
    assert all((o_sorted[p[order] == q] == np.arange(first[q])).all() for q in range(4))
