"""A real History over a real SqlCatalog table: topic ``t``, partition 0, offsets 0..9 in the lake (values
b"v<offset>", timestamps 1_700_000_000_000 ms), its cold reader serving."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ksi.history.service import History

from ..test_proxy import make_config, raw_value_table

LAKE_TIMESTAMP_MS = 1_700_000_000_000


@pytest.fixture
async def history(tmp_path: Path, nursery: trio.Nursery) -> History:
    props = raw_value_table(tmp_path, "history.t", 10)
    history = History(make_config(9092, {"catalog": {"name": "lake", **props},
                                         "topics": [{"name": "t", "table": "history.t"}]}))
    await history.start()
    await nursery.start(history.serve)
    history.set_upstream_topics({"t"})
    return history
