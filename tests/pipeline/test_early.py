"""``ksi archive``'s early read (:mod:`ksi.pipeline.early`): a small run's Kafka read begun in a child process
before the planning, against the real broker and catalog.  The driver's tasks take what it read where it
starts where theirs do and read only the rest themselves: records produced since it started, a range it does
not have, everything when the child failed.  Every offset is archived once, and aborted transactions are
marked as by a task's own read."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections import Counter
from typing import Any

from ksi.pipeline import cli
from ksi.pipeline.archive import archive_topic
from ksi.pipeline.early import EarlyRead
from ksi.pipeline.tasks import InlineEngine

from .kafka_helpers import produce, table_offsets
from .test_transactions import END, PARTITIONS, aborted, produce_transactions


def _every_offset_once(stop: int) -> Counter[tuple[int, int]]:
    return Counter({(p, o): 1 for p in range(PARTITIONS) for o in range(stop)})


def finished(early: EarlyRead) -> EarlyRead:
    """``early`` once its child has read every range it was given (so the driver's tasks claim none of them)."""
    assert early.process is not None
    assert early.process.wait(60) == 0
    return early


class Taken:
    """Which ranges an early read gave the tasks: ``(partition, start, its stop)``, or None where it had none."""

    def __init__(self, early: EarlyRead) -> None:
        self.early, self.taken = early, []
        self._take = early.take
        early.take = self.take  # type: ignore[method-assign]

    def take(self, topic: str, partition: int, start: int) -> Any:
        got = self._take(topic, partition, start)
        self.taken.append((partition, start, got.stop) if got is not None else None)
        return got


def test_a_small_run_reads_before_planning_and_archives_every_offset_once(
        noida: Any, lake: Any, make_config: Any, capsys: Any) -> None:
    topic = f"early-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 40)
    _, path = make_config(topic, table)
    assert cli.archive_main(["--config", str(path)]) == 0            # no table yet: from the log start
    produce(noida.bootstrap, topic, PARTITIONS, 25, first=40)
    assert cli.archive_main(["--config", str(path)]) == 0            # the archived offsets from the catalog
    captured = capsys.readouterr()
    assert captured.err.count("the Kafka read began before planning, in a child process") == 2
    assert table_offsets(lake.table(table)) == _every_offset_once(65)
    assert not [d for d in os.listdir(tempfile.gettempdir()) if d.startswith(f"ksi-archive-early-{os.getpid()}-")]


def test_records_produced_after_the_early_read_began_are_read_by_the_task(
        noida: Any, lake: Any, make_config: Any) -> None:
    topic = f"early-more-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 30)
    config, _ = make_config(topic, table)
    early = finished(EarlyRead(noida.bootstrap, {}, 30.0, {topic: [(p, 0, 30) for p in range(PARTITIONS)]}))
    taken = Taken(early)
    produce(noida.bootstrap, topic, PARTITIONS, 20, first=30)        # the plan's ranges now end at 50
    try:
        result = archive_topic(InlineEngine(early), config, config.config.topics[0])
    finally:
        early.close()
    assert taken.taken == [(p, 0, 30) for p in reversed(range(PARTITIONS))]  # the tasks take the last first
    assert result.rows == PARTITIONS * 50
    assert table_offsets(lake.table(table)) == _every_offset_once(50)
    assert not os.path.exists(early.directory)


def test_without_a_usable_early_read_the_tasks_read_everything_themselves(
        noida: Any, lake: Any, make_config: Any) -> None:
    topic = f"early-none-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 30)
    config, _ = make_config(topic, table)
    # partition 0 read from another start than the plan's; partition 1 from a broker that is not there
    other_start = finished(EarlyRead(noida.bootstrap, {}, 30.0, {topic: [(0, 10, 30)]}))
    no_broker = finished(EarlyRead("127.0.0.1:1", {}, 1.0, {topic: [(1, 20, 30)]}))
    taken = [Taken(other_start), Taken(no_broker)]
    try:
        archive_topic(InlineEngine(other_start), config, config.config.topics[0], until=20)
        archive_topic(InlineEngine(no_broker), config, config.config.topics[0])  # from 20: the child failed
    finally:
        other_start.close()
        no_broker.close()
    assert taken[0].taken == [None, None] and taken[1].taken == [None, None]
    assert table_offsets(lake.table(table)) == _every_offset_once(30)


def test_aborted_transactions_read_early_are_kept_and_marked(noida: Any, lake: Any, make_config: Any) -> None:
    topic = f"early-txn-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce_transactions(noida.bootstrap, topic)
    config, _ = make_config(topic, table)
    early = finished(EarlyRead(noida.bootstrap, {}, 30.0, {topic: [(p, 0, END) for p in range(PARTITIONS)]}))
    taken = Taken(early)
    try:
        archive_topic(InlineEngine(early), config, config.config.topics[0])
    finally:
        early.close()
    assert taken.taken == [(p, 0, END) for p in reversed(range(PARTITIONS))]
    rows = lake.table(table).scan(selected_fields=("kafka_partition", "kafka_offset", "kafka_aborted")).to_arrow()
    marked = {(p, o) for p, o, a in zip(*(rows.column(n).to_pylist() for n in rows.column_names), strict=True) if a}
    assert marked == {(p, 5 * t + i) for p in range(PARTITIONS) for t in range(12) if aborted(t) for i in range(4)}
    assert rows.num_rows == PARTITIONS * 12 * 4                       # the markers are not records


def test_a_range_the_child_has_not_begun_is_read_by_the_task_and_skipped_by_the_child(
        noida: Any, lake: Any, make_config: Any) -> None:
    """The driver's tasks claim what the child has not reached (ksi.pipeline.early.claim): here every range,
    asked for before the child's interpreter has started."""
    topic = f"early-claim-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, PARTITIONS, 30)
    config, _ = make_config(topic, table)
    archive_topic(None, config, config.config.topics[0], until=0)     # the table, before the early read
    early = EarlyRead(noida.bootstrap, {}, 30.0, {topic: [(p, 0, 30) for p in range(PARTITIONS)]})
    try:
        assert [early.take(topic, p, 0) for p in range(PARTITIONS)] == [None] * PARTITIONS
        archive_topic(InlineEngine(early), config, config.config.topics[0])
        finished(early)
        assert not [name for name in os.listdir(early.directory) if name.endswith(".arrow")]  # it read nothing
    finally:
        early.close()
    assert table_offsets(lake.table(table)) == _every_offset_once(30)
