"""Lake state ksi cannot trust, confined: an unreadable file whose statistics name an impossible partition
range, and a failure no check foresaw while loading or refreshing a table (issue 12)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ksi.config import parse_config
from ksi.history.service import History
from ksi.lake.index import TablePlan
from ksi.lake.planner import MAX_NAMED_PARTITIONS, Planner
from ksi.lake.table import LakeTable
from tests.ksi.test_proxy import raw_value_table


def test_an_unreadable_file_with_impossible_partition_bounds_marks_every_partition() -> None:
    planner = Planner("t", cursors=None, window_rows=1000)  # type: ignore[arg-type]  # _with_broken reads none
    plan = planner._with_broken(TablePlan(None, (), ()), {"a.parquet": ("gone", (0, 2**31 - 1))})
    assert plan.all_unavailable is not None and "a.parquet" in plan.all_unavailable and not plan.unavailable
    plan = planner._with_broken(TablePlan(None, (), ()), {"b.parquet": ("gone", (2, 4))})
    assert sorted(plan.unavailable) == [2, 3, 4] and plan.all_unavailable is None
    plan = planner._with_broken(TablePlan(None, (), ()), {"c.parquet": ("gone", (0, MAX_NAMED_PARTITIONS - 1))})
    assert len(plan.unavailable) == MAX_NAMED_PARTITIONS and plan.all_unavailable is None


def history(tmp_path: Path) -> History:
    props = raw_value_table(tmp_path, "history.t", 10)
    return History(parse_config({"upstream": {"bootstrap_servers": "127.0.0.1:9"},
                                 "catalog": {"name": "lake", **props},
                                 "topics": [{"name": "t", "table": "history.t"}]}, "test.toml"))


@pytest.mark.parametrize("stage", ["load", "offset_ranges"])
async def test_an_unexpected_failure_of_a_table_is_the_lakes_not_the_process(tmp_path: Path, monkeypatch: Any,
                                                                             stage: str) -> None:
    def broken(self: LakeTable) -> Any:
        raise RuntimeError("a bug no check foresaw")

    monkeypatch.setattr(LakeTable, stage, broken)
    lake = history(tmp_path)
    await lake.start()
    assert await lake.ranges("t") == {}
    assert "RuntimeError: a bug no check foresaw" in (lake.unavailable("t") or "")  # retriable, not "no history"
    await lake._plan_all()  # the start-up planning task survives it too
