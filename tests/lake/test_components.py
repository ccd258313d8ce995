"""ksi.lake.table._only_components: a read serves only the rows of the components it covered whole."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ksi.lake.table import _only_components

PARTITIONS = 3


@st.composite
def reads(draw: st.DrawFn) -> tuple[pa.Table, dict[int, Any], dict[int, list[int]]]:
    """Per partition, components as non-overlapping offset ranges, each after the one before it, next to it or
    past a gap of offsets no component holds; a read covering some of them; rows of any partition at any
    offset, nulls among them, in any order."""
    plans: dict[int, Any] = {}
    covered: dict[int, list[int]] = {}
    for part in range(PARTITIONS):
        first, last, at = [], [], draw(st.integers(0, 5))
        for _ in range(draw(st.integers(1, 12))):
            at += draw(st.sampled_from([0, 0, 1, 3]))  # next to the one before, or past a gap
            size = draw(st.integers(1, 6))
            first.append(at)
            last.append(at + size - 1)
            at += size
        plans[part] = SimpleNamespace(component_first=np.array(first, dtype=np.int64),
                                      component_last=np.array(last, dtype=np.int64))
        chosen = draw(st.lists(st.integers(0, len(first) - 1), unique=True))
        if chosen or draw(st.booleans()):
            covered[part] = sorted(chosen)
    rows = draw(st.lists(st.tuples(st.none() | st.integers(-1, PARTITIONS), st.none() | st.integers(-1, 80)),
                         min_size=1, max_size=120))
    table = pa.table({"p": pa.array([p for p, _ in rows], pa.int32()), "o": pa.array([o for _, o in rows], pa.int64()),
                      "row": pa.array(range(len(rows)), pa.int64())})
    return table, plans, covered


def kept_by_model(table: pa.Table, plans: dict[int, Any], covered: dict[int, list[int]]) -> list[int]:
    """Row numbers whose partition is covered and whose offset lies inside one of its covered components."""
    kept = []
    for row, (p, o) in enumerate(zip(table["p"].to_pylist(), table["o"].to_pylist(), strict=True)):
        if p not in covered or o is None:
            continue
        plan = plans[p]
        inside = [c for c in range(len(plan.component_first))
                  if plan.component_first[c] <= o <= plan.component_last[c]]
        if inside and inside[0] in covered[p]:
            kept.append(row)
    return kept


@settings(max_examples=300, deadline=None)
@given(reads())
def test_a_read_keeps_exactly_the_rows_of_the_components_it_covered(read: tuple[pa.Table, dict[int, Any],
                                                                                 dict[int, list[int]]]) -> None:
    table, plans, covered = read
    layout = SimpleNamespace(partition="p", offset="o")
    plan = SimpleNamespace(partitions=plans)
    kept = _only_components(table, layout, plan, covered)  # type: ignore[arg-type]
    assert kept["row"].to_pylist() == kept_by_model(table, plans, covered)


def test_many_ranges_take_the_component_lookup_and_keep_the_same_rows() -> None:
    """Every other component covered (more ranges than are compared row by row): the same rows as the model."""
    first = np.arange(0, 200, 10, dtype=np.int64)
    plans = {0: SimpleNamespace(component_first=first, component_last=first + 7)}
    covered = {0: list(range(0, 20, 2))}
    offsets = list(range(205))
    table = pa.table({"p": pa.array([0] * len(offsets), pa.int32()), "o": pa.array(offsets, pa.int64()),
                      "row": pa.array(offsets, pa.int64())})
    kept = _only_components(table, SimpleNamespace(partition="p", offset="o"),  # type: ignore[arg-type]
                            SimpleNamespace(partitions=plans), covered)  # type: ignore[arg-type]
    assert kept["row"].to_pylist() == kept_by_model(table, plans, covered)
    assert kept["row"].to_pylist()[:9] == [0, 1, 2, 3, 4, 5, 6, 7, 20]
