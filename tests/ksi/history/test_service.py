"""History (ksi/history/service.py), the Kafka side's shared state: the faults every fetch runs into are
logged once per partition, then at most every REPEAT_LOG_SECONDS of trio's clock (virtual time here), and
counted every time."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from ksi.history.service import History
from ksi.lake.catalog import REPEAT_LOG_SECONDS
from ksi.metrics import REGISTRY

from ..test_proxy import make_config

GAP = "offsets 10..14 are in neither the lake nor Kafka"


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def gaps_counted() -> float:
    return REGISTRY.get_sample_value("ksi_lake_gaps_total", {"topic": "t"}) or 0.0


async def test_a_gap_is_logged_once_per_partition_then_every_repeat_log_seconds(
        tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    history = History(make_config(9092, {
        "catalog": {"name": "lake", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path}"},
        "topics": [{"name": "t", "table": "history.t"}]}))
    counted = gaps_counted()

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if GAP in r.getMessage()]

    with caplog.at_level(logging.ERROR, logger="ksi.history"):
        history.report_gap("t", 0, 10, 15, "client-1")
        history.report_gap("t", 0, 10, 15, "client-2")
        assert len(logged()) == 1 and logged()[0].startswith("client-1: topic t partition 0: ")
        history.report_gap("t", 1, 10, 15, "client-2")  # another partition: its own line
        assert len(logged()) == 2
        await trio.sleep(REPEAT_LOG_SECONDS * 0.9)
        history.report_gap("t", 0, 10, 15, "client-3")
        assert len(logged()) == 2
        await trio.sleep(REPEAT_LOG_SECONDS * 0.1)
        history.report_gap("t", 0, 10, 15, "client-4")
        assert len(logged()) == 3 and logged()[-1].startswith("client-4: ")
    assert gaps_counted() - counted == 5  # every gap answered is counted, logged or not
