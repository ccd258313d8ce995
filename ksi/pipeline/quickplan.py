"""What a run will read, known before the planning's imports: the broker's watermarks, and a quick estimate of
the records of a run from the catalog's database itself.

``ksi archive`` on a ``local[...]`` master starts Spark before it plans, so that the JVM's start overlaps
the planning (:mod:`ksi.pipeline.spark`); but a run with nothing new, or one small enough to run in the
driver, does not need Spark, and a JVM started and killed costs it 0.3 s on a quiet 2-core machine and up
to a second on a busy one (docs/pipeline.md).  :func:`records_to_read` answers first, in about 0.1 s,
without PyIceberg: ListOffsets (confluent-kafka), and for a SQLite catalog with local metadata the
archived offsets from the table's current metadata file (the snapshot summary's ``ksi.archived-offsets``,
as :mod:`ksi.pipeline.offsets` reads them with PyIceberg).  Anything it cannot read this way is None:
unknown, and Spark starts early as before.  The real plan is still made with PyIceberg afterwards; this
only decides whether to start Spark early, for a run that will be read in this process which ranges to start
reading while the driver imports and plans (:attr:`QuickPlan.ranges`, :func:`ksi.pipeline.reader.prefetch`), and
whether the run has nothing to do at all (:attr:`QuickPlan.up_to_date`): then it ends there, in about 0.3 s
instead of the 1 s the planning's imports (PyIceberg, SQLAlchemy) take.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .offsets import OFFSETS_PROPERTY, decode_offsets

__all__ = ["ArchiveError", "QuickPlan", "quick_plan", "records_to_read", "watermarks"]


class ArchiveError(RuntimeError):
    """The archive of a topic cannot proceed; the message names the topic and the fix."""


def watermarks(bootstrap: str, topic: str, timeout: float) -> dict[int, tuple[int, int]]:
    """partition -> (log-start offset, last stable offset), asked of the broker."""
    from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout * 1000), "log_level": 0})
    try:
        metadata = admin.list_topics(topic=topic, timeout=timeout)
    except KafkaException as exc:
        raise ArchiveError(f"cannot reach the Kafka cluster at {bootstrap}: {exc.args[0]}; check "
                           "upstream.bootstrap_servers and that the brokers are running") from None
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise ArchiveError(f"topic {topic!r} does not exist in the Kafka cluster at {bootstrap} "
                           f"({info.error if info is not None else 'unknown topic'}); check the topic name")
    partitions = sorted(info.partitions)
    result: dict[int, list[int]] = {p: [0, 0] for p in partitions}
    for index, spec in enumerate((OffsetSpec.earliest(), OffsetSpec.latest())):
        futures = admin.list_offsets({TopicPartition(topic, p): spec for p in partitions},
                                     isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout)
        for tp, future in futures.items():
            try:
                result[tp.partition][index] = future.result().offset
            except KafkaException as exc:
                raise ArchiveError(f"{topic}/{tp.partition}: ListOffsets failed: {exc.args[0]}") from None
    return {p: (low, high) for p, (low, high) in result.items()}


def records_to_read(pipeline: Any, topics: list[Any], timeout: float = 5.0) -> int | None:
    """How many records a run of ``topics`` would read (see the module docstring); None when not known."""
    plan = quick_plan(pipeline, topics, timeout)
    return None if plan is None else plan.records


@dataclass(frozen=True, slots=True)
class QuickPlan:
    """Per topic of ``topics``, partition -> ``(start, stop)``: the offsets a run would read, as the real plan
    (:func:`ksi.pipeline.archive.plan_ranges`) makes them from the same figures; and whether every topic is up
    to date: its table holds archived offsets for every partition, each exactly the broker's last stable
    offset (nothing to read, nothing lost, no table to create), so the run has nothing to do and can say so
    without the planning's imports."""

    ranges: list[dict[int, tuple[int, int]]]
    up_to_date: bool

    @property
    def records(self) -> int:
        """The records in :attr:`ranges`."""
        return sum(stop - start for partitions in self.ranges for start, stop in partitions.values())


def quick_plan(pipeline: Any, topics: list[Any], timeout: float = 5.0) -> QuickPlan | None:
    """The quick plan of a run of ``topics``; None when not known (see the module docstring)."""
    catalog = pipeline.config.catalog
    bootstrap = ",".join(map(str, pipeline.config.upstream.bootstrap_servers))
    result: list[dict[int, tuple[int, int]]] = []
    current = True
    for topic in topics:
        archived = _archived_offsets(catalog, topic.table) if catalog is not None else None
        if archived is None:
            return None
        try:
            marks = watermarks(bootstrap, topic.name, timeout)
        except ArchiveError:
            return None  # the plan says what is wrong
        result.append({p: (min(end, max(log_start, archived.get(p, log_start))), end)
                       for p, (log_start, end) in marks.items()})
        current = current and all(archived.get(p) == end for p, (_start, end) in marks.items())
    return QuickPlan(result, current and bool(topics))


def _archived_offsets(catalog: Any, table: str) -> dict[int, int] | None:
    """partition -> next offset from a SQLite catalog's current metadata file of ``table`` ({} when the table
    does not exist yet); None when that cannot be read this way."""
    uri = str(catalog.properties.get("uri", ""))
    if not uri.startswith("sqlite:///") or "." not in table:
        return None
    path = uri.split(":///", 1)[1].split("?", 1)[0]
    namespace, name = table.rsplit(".", 1)
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)) as db:
            row = db.execute("SELECT metadata_location FROM iceberg_tables WHERE catalog_name = ? AND "
                             "table_namespace = ? AND table_name = ?", (catalog.name, namespace, name)).fetchone()
    except sqlite3.Error:
        return None
    if row is None:
        return {}
    location = urlsplit(str(row[0]))
    if location.scheme not in ("", "file") or location.path.endswith(".gz.metadata.json"):
        return None
    try:
        with open(location.path if location.scheme else str(row[0]), encoding="utf-8") as f:
            metadata = json.load(f)
    except (OSError, ValueError):
        return None
    snapshots = {s.get("snapshot-id"): s for s in metadata.get("snapshots", [])}
    snapshot = snapshots.get(metadata.get("current-snapshot-id"))
    if snapshot is None:
        return {} if not snapshots else None
    while snapshot is not None:
        text = (snapshot.get("summary") or {}).get(OFFSETS_PROPERTY)
        if text is not None:
            try:
                return decode_offsets(text)
            except (ValueError, TypeError):
                return None
        snapshot = snapshots.get(snapshot.get("parent-snapshot-id"))
    return None  # expired: PyIceberg derives them from the files' statistics

