"""The lake's catalog session (ksi/lake/catalog.py) in virtual time: ranges kept for RANGES_TTL_SECONDS then
refreshed, and a catalog down at start tried again only every catalog_retry_seconds, then served.

Its calls to the catalog run in threads that a request waits for a bounded time; here they run at once on
the event loop (``inline_calls``), so that trio's MockClock, which jumps as soon as every task waits, never
races a thread: what is tested is the session's bookkeeping of time, on a real SqlCatalog and table."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from pyiceberg.catalog.sql import SqlCatalog

import ksi.lake.catalog
from ksi.config import Config, parse_config
from ksi.lake.catalog import RANGES_TTL_SECONDS, LakeCatalog
from ksi.lake.table import OffsetRange

from .tables import Row, arrow_rows, catalog, write

RETRY_SECONDS = 5.0


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class InlineCall(ksi.lake.catalog._Call):
    """A catalog call run at once, on the event loop."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.started = trio.current_time()
        self.done = trio.Event()
        self.result: Any = None
        self.error: Exception | None = None
        self.taken = False
        try:
            self.result = fn()
        except Exception as exc:  # noqa: BLE001 - the outcome, as the threaded call keeps it
            self.error = exc
        self.done.set()


@pytest.fixture
def inline_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ksi.lake.catalog, "_Call", InlineCall)


def config_for(tmp: Path) -> Config:
    return parse_config({
        "proxy": {"listen": "127.0.0.1:0", "broker_port_base": 0},
        "upstream": {"bootstrap_servers": "127.0.0.1:9092"},
        "catalog": {"name": "lake", "uri": f"sqlite:///{tmp / 'catalog.db'}",
                    "warehouse": f"file://{tmp / 'warehouse'}"},
        "history": {"catalog_retry_seconds": RETRY_SECONDS},
        "topics": [{"name": "orders", "table": "t.orders", "layout": "redpanda"}],
    }, "test.toml")


def rows(first: int, stop: int) -> list[Row]:
    return [Row(0, o, key=b"k", value=b"v%d" % o) for o in range(first, stop)]


def spans(ranges: dict[int, OffsetRange]) -> dict[int, tuple[int, int]]:
    return {p: (r.first, r.next) for p, r in ranges.items()}


async def test_ranges_are_kept_for_their_ttl_then_refreshed(tmp_path: Path, autojump_clock: trio.testing.MockClock,
                                                            inline_calls: None) -> None:
    write(catalog(tmp_path), "orders", [rows(0, 10)])
    refreshed: list[tuple[str, dict[int, tuple[int, int]]]] = []
    lake = LakeCatalog(config_for(tmp_path), on_ranges=lambda topic, ranges: refreshed.append((topic, spans(ranges))))
    await lake.start()
    assert spans(await lake.ranges("orders")) == {0: (0, 10)}

    table = SqlCatalog("lake", uri=f"sqlite:///{tmp_path / 'catalog.db'}",
                       warehouse=f"file://{tmp_path / 'warehouse'}").load_table("t.orders")
    table.append(arrow_rows(table, rows(10, 15)))  # the archive commits a new snapshot

    await trio.sleep(RANGES_TTL_SECONDS / 2)
    assert spans(await lake.ranges("orders")) == {0: (0, 10)}  # kept: younger than the TTL
    await trio.sleep(RANGES_TTL_SECONDS / 2)
    assert spans(await lake.ranges("orders")) == {0: (0, 15)}  # refreshed: the new snapshot planned
    assert refreshed == [("orders", {0: (0, 10)}), ("orders", {0: (0, 15)})]
    assert lake.unavailable("orders") is None and lake.stale("orders") is None


async def test_a_catalog_down_at_start_is_tried_again_after_catalog_retry_seconds(
        tmp_path: Path, autojump_clock: trio.testing.MockClock, inline_calls: None,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ksi.lake")
    later = tmp_path / "later"  # the catalog's database cannot be opened until its directory exists
    lake = LakeCatalog(config_for(later))
    await lake.start()
    assert await lake.ranges("orders") == {}
    reason = lake.unavailable("orders")
    assert reason is not None and "cannot open the Iceberg catalog 'lake'" in reason
    assert "tried again every 5 s" in caplog.text

    later.mkdir()
    write(catalog(later), "orders", [rows(0, 10)])  # the catalog is back
    await trio.sleep(RETRY_SECONDS - 0.5)
    assert await lake.ranges("orders") == {}  # not asked again before catalog_retry_seconds
    assert lake.unavailable("orders") == reason
    await trio.sleep(0.5)
    assert spans(await lake.ranges("orders")) == {0: (0, 10)}
    assert lake.unavailable("orders") is None
    assert "the Iceberg catalog 'lake' is reachable again" in caplog.text
