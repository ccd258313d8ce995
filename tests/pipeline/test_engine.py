"""The local engine outlives a worker that dies (kill -9, out of memory): that run fails, the next gets
new workers; nothing a failed run wrote is committed."""

from __future__ import annotations

import os
import signal
import time
import uuid
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pytest

from ksi.pipeline.archive import archive_topic, open_catalog
from ksi.pipeline.offsets import read_archived_offsets
from ksi.pipeline.tasks import LocalEngine

from .kafka_helpers import produce, table_offsets


def test_a_killed_worker_fails_one_run_and_the_next_run_gets_new_workers(noida: Any, lake: Any,
                                                                          make_config: Any) -> None:
    topic = f"engine-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, 2)
    produce(noida.bootstrap, topic, 2, 100)
    config, _ = make_config(topic, table)
    engine = LocalEngine(2)
    try:
        deadline = time.monotonic() + 30
        while len(engine._pool._processes or {}) < 2:  # the workers have started
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(next(iter(engine._pool._processes)), signal.SIGKILL)
        time.sleep(0.5)
        with pytest.raises(BrokenProcessPool):
            archive_topic(engine, config, config.config.topics[0])
        assert read_archived_offsets(open_catalog(config.config).load_table(table)).next_offsets == {}
        result = archive_topic(engine, config, config.config.topics[0])
        assert result.rows == 200
    finally:
        engine.close()
    counts = table_offsets(lake.table(table))
    assert set(counts.values()) == {1} and len(counts) == 200
