"""Table contents are untrusted input (issue 12): hostile rows in every layout (tests.shapes.strategies: partitions
beyond the topic's, negative, duplicate and far-future offsets, huge values, nulls in every nullable column,
wrong-but-castable column types), read through the lake side.  Whatever the rows, a read either serves records
or raises LakeError (which the Kafka side answers with a per-partition error); what it serves is each valid
(partition, offset) exactly once, in offset order, and nothing else.  ``make fuzz`` runs these longer."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ksi.config import TopicConfig
from ksi.lake.index import MAX_OFFSET
from ksi.lake.layouts import LayoutError
from ksi.lake.table import LakeError, LakeTable
from tests.shapes.build import write_rows
from tests.shapes.strategies import FuzzTable, layout_tables

from .tables import catalog

EXAMPLES = int(os.environ.get("KSI_FUZZ_EXAMPLES", "12"))
RAW_VARIANTS = [("ksi", {}), ("redpanda", {}), ("redpanda", {"version": "v24.3"}), ("automq", {})]
TYPED_VARIANTS = [("kafka-connect", {}), ("kafka-connect", {"metadata": "nested", "schemaless": True}),
                  ("redpanda", {"mode": "schema"}), ("automq", {"value": "typed", "key_type": "raw"})]


@pytest.fixture(scope="module")
def registry_url(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from ksi.registry import start_registry

    server = start_registry("127.0.0.1", 0, tmp_path_factory.mktemp("registry"))
    yield server.url
    server.stop()


def valid_keys(fuzz: FuzzTable, table: LakeTable) -> set[tuple[int, int]]:
    """The (partition, offset) pairs of rows a reader may serve: both present and non-negative."""
    layout = table.layout
    rows = fuzz.rows

    def column(path: str) -> np.ndarray:
        parts = path.split(".")
        array = rows.column(parts[0]).combine_chunks()
        for part in parts[1:]:
            array = pc.struct_field(array, part)
        return np.asarray(pc.fill_null(array.cast(pa.int64()), -1))

    p, o = column(layout.partition), column(layout.offset)
    ok = (p >= 0) & (o >= 0) & (o < MAX_OFFSET)
    return set(zip(p[ok].tolist(), o[ok].tolist(), strict=True))


def served_keys(table: LakeTable) -> list[tuple[int, int]]:
    plan = table.plan
    out: list[tuple[int, int]] = []
    for partition, partition_plan in plan.partitions.items():
        c = 0
        while c < partition_plan.components:
            read_plan = table.read_plan(plan, partition, c, None)
            result = table.read(plan, read_plan, None)
            for span in result.spans:
                if span.partition == partition and span.records is not None:
                    offsets = span.records.columns.offsets
                    assert (np.diff(offsets) > 0).all(), "offsets not strictly increasing"
                    out += [(partition, int(x)) for x in offsets]
            c = max(read_plan.served.get(partition, [c])) + 1
    return out


VARIANTS = [(n, o, False) for n, o in RAW_VARIANTS] + [(n, o, True) for n, o in TYPED_VARIANTS]


@pytest.mark.parametrize(("layout", "options", "typed"), VARIANTS, ids=[f"{n}-{o}" for n, o, _ in VARIANTS])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_rows_are_served_as_records_or_refused_with_lake_error(layout: str, options: dict[str, Any],
                                                                         typed: bool, registry_url: str,
                                                                         data: Any) -> None:
    from ksi.registry.client import RegistryClient

    fuzz = data.draw(layout_tables(layout, options, max_rows=40))
    files = data.draw(st.integers(1, 3))
    with tempfile.TemporaryDirectory() as tmp:
        lake = catalog(Path(tmp))
        write_rows(lake, "t.fuzz", fuzz.layout, fuzz.rows, files=files, commits=data.draw(st.integers(1, files)))
        topic = f"fuzz{data.draw(st.integers(0, 10**9))}"  # each table's derived schema under its own subject
        table = LakeTable(lake, TopicConfig(name=topic, table="t.fuzz", layout=layout),
                          registry=RegistryClient(registry_url) if typed else None, window_rows=7)
        try:
            ranges = table.offset_ranges()
        except LakeError as exc:
            assert isinstance(exc.__cause__, (LayoutError, type(None))) or "cannot" in str(exc)
            return
        assert all(p >= 0 and r.first >= 0 and r.first <= r.last for p, r in ranges.items())
        try:
            served = served_keys(table)
        except LakeError:
            return  # a per-partition error on the Kafka side: the connection and the other topics keep working
        assert len(served) == len(set(served)), "an offset served twice"
        assert set(served) == valid_keys(fuzz, table)
