"""``ksi status``: per topic and partition, what the lake holds, what Kafka holds, and where they meet.

Reads the catalog through PyIceberg (metadata and statistics only) and the broker through confluent-kafka
(watermarks, and the timestamp of the first record the lake does not hold yet, for the lag in seconds);
touches no proxy.  Draws one bar per partition (``--json`` for machines).  Exit status 0 when every
configured topic is readable end to end, 1 when a table or the broker is unusable or a gap exists (so it
can gate a deployment or a cron alert).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .config import Config, TopicConfig

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from pyiceberg.catalog import Catalog

    from .lake.table import OffsetRange

__all__ = ["PartitionStatus", "collect_status", "print_status", "render", "to_json", "writer_group_offsets"]

KAFKA_TIMEOUT_SECONDS = 10.0


@dataclass
class PartitionStatus:
    topic: str
    table: str
    partition: int
    lake_first: int | None
    lake_last: int | None
    snapshot_id: int | None
    log_start_offset: int | None
    high_watermark: int | None
    prefer_lake: bool = False
    lake_only: bool = False           # the topic exists only in the lake (served read-only by ksi)
    next_timestamp_ms: int | None = None  # timestamp of the first record not in the lake, if Kafka has one
    problem: str | None = None
    writer_next: int | None = None    # the next offset the table's writer would write (its commit state)
    seam_holes: str = "error"         # the topic's setting when the writer keeps no commit state
    lost: list[tuple[int, int]] = field(default_factory=list)  # ranges ksi archive recorded as lost (first, last)

    @property
    def lake_next(self) -> int | None:
        """The first offset the lake's writer has not read: past its last row, and past the holes after it
        that the writer's commit state says it read (a transaction's commit marker, a dropped tombstone), as
        ``ksi archive --follow`` counts its lag; for a partition the lake has nothing of, where an archive
        would start: the log start."""
        if self.lake_last is None:
            return self.log_start_offset
        return max(self.lake_last + 1, self.writer_next or 0)

    @property
    def hot_watermark(self) -> int | None:
        """Where ksi stops reading the lake: the log start, or the lake's end with prefer_lake."""
        if self.log_start_offset is None:
            return None
        if self.prefer_lake and self.lake_last is not None:
            return max(self.log_start_offset, self.lake_last + 1)
        return self.log_start_offset

    @property
    def gap(self) -> tuple[int, int] | None:
        """Offsets between the lake's end and the log start that are lost: in neither, and not holes the
        writer read and skipped (its commit state says how far it read; without one, ``seam_holes``
        decides), first and last."""
        if self.lake_last is None or self.log_start_offset is None or self.lake_only:
            return None
        first = self.lake_last + 1
        if self.writer_next is not None:
            first = max(first, self.writer_next)
        elif self.seam_holes == "skip":
            return None
        if first < self.log_start_offset:
            return first, self.log_start_offset - 1
        return None

    @property
    def lag_records(self) -> int | None:
        """How far the lake is behind the log: high watermark - lake next offset."""
        if self.high_watermark is None or self.lake_next is None or self.lake_only:
            return None
        return max(0, self.high_watermark - self.lake_next)

    def lag_seconds(self, now: float) -> float | None:
        """Age of the first record not in the lake (0 when the lake holds everything)."""
        if self.lag_records == 0:
            return 0.0
        if self.next_timestamp_ms is None:
            return None
        return max(0.0, round(now - self.next_timestamp_ms / 1000, 3))

    def failed(self) -> bool:
        return bool(self.gap or self.lost or self.problem)


# -- gathering ------------------------------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    from .serving import one_line

    error: Any = exc.args[0] if exc.args else None
    if callable(getattr(error, "str", None)):  # confluent-kafka's KafkaError: its text, not its repr
        return str(error.str())
    return one_line(exc)


def _kafka_config(config: Config) -> dict[str, Any]:
    return {"bootstrap.servers": ",".join(map(str, config.upstream.bootstrap_servers)), "group.id": "ksi-status",
            "enable.auto.commit": False, "enable.partition.eof": True, "socket.timeout.ms": 5000,
            "log_level": 0,  # librdkafka's own connection-refused lines: the problem column says it once
            "logger": _quiet, "error_cb": _quiet}


def _quiet(*args: object) -> None:
    pass


def _broker_watermarks(consumer: Consumer, bootstrap: str, topic: str) -> tuple[dict[int, tuple[int, int]], str | None]:
    from confluent_kafka import KafkaException, TopicPartition

    try:
        metadata = consumer.list_topics(topic, timeout=KAFKA_TIMEOUT_SECONDS)
        info = metadata.topics.get(topic)
        if info is None or info.error is not None:
            return {}, "not in Kafka"
        marks = {}
        for p in sorted(info.partitions):
            marks[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=KAFKA_TIMEOUT_SECONDS,
                                                      cached=False)
        return marks, None
    except KafkaException as exc:
        return {}, f"Kafka unreachable at {bootstrap} (upstream.bootstrap_servers): {_first_line(exc)}"


def writer_group_offsets(config: Config, topic: TopicConfig, partitions: list[int]) -> dict[int, int]:
    """The offsets the topic's writer group (``writer_group``: a sink committing what it read) committed."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({**_kafka_config(config), "group.id": topic.writer_group})
    try:
        committed = consumer.committed([TopicPartition(topic.name, p) for p in partitions],
                                       timeout=KAFKA_TIMEOUT_SECONDS)
    except KafkaException:
        return {}
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}


def _first_timestamps(consumer: Consumer, topic: str, offsets: dict[int, int]) -> dict[int, int]:
    """The timestamp (ms) of the first record at or after ``offsets[p]`` in each partition, as far as Kafka
    answers within the timeout."""
    from confluent_kafka import TopicPartition

    if not offsets:
        return {}
    consumer.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
    found: dict[int, int] = {}
    done: set[int | None] = set()
    deadline = time.monotonic() + KAFKA_TIMEOUT_SECONDS
    try:
        while len(done) < len(offsets) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            partition = message.partition()
            if partition is not None and message.error() is None and partition not in found:
                found[partition] = message.timestamp()[1]
            done.add(partition)  # a record, the partition's end, or an error: no more to learn here
    finally:
        consumer.unassign()
    return found


def collect_status(config: Config) -> list[PartitionStatus]:
    from confluent_kafka import Consumer

    rows: list[PartitionStatus] = []
    catalog: Catalog | None = None
    catalog_error = None
    if config.topics:
        from .lake.catalog import load_catalog

        try:
            catalog = load_catalog(config)
        except Exception as exc:  # noqa: BLE001 - an unreachable catalog is a row of the status table, not a crash
            catalog_error = f"catalog unavailable ({config.source}: [catalog]): {_first_line(exc)}"
    consumer = Consumer(_kafka_config(config))
    try:
        for topic in config.topics:
            rows.extend(_topic_rows(config, topic, consumer, catalog, catalog_error))
    finally:
        consumer.close()
    return rows


def _topic_rows(config: Config, topic: TopicConfig, consumer: Consumer, catalog: Catalog | None,
                catalog_error: str | None) -> list[PartitionStatus]:
    from .lake.table import LakeError, LakeTable

    marks, kafka_problem = _broker_watermarks(consumer, _kafka_config(config)["bootstrap.servers"], topic.name)
    ranges: dict[int, OffsetRange] = {}
    snapshot = None
    problem = catalog_error
    lake: LakeTable | None = None
    if catalog is not None:
        try:
            lake = LakeTable(catalog, topic)
            ranges = lake.offset_ranges()
            snapshot = lake.snapshot_id
        except LakeError as exc:
            problem = f"table {topic.table}: {_first_line(exc)}"
            lake = None
    writer_group = writer_group_offsets(config, topic, sorted(marks)) if topic.writer_group else {}
    lake_only = kafka_problem == "not in Kafka" and bool(ranges)
    rows = []
    for p in sorted(set(ranges) | set(marks)) or [-1]:
        lake_range = ranges.get(p)
        low_high = marks.get(p)
        problems = [problem] if problem else []
        if low_high is None and not lake_only:
            problems.append(kafka_problem or "partition not in Kafka")
        row_problem = "; ".join(problems) or None
        rows.append(PartitionStatus(
            topic=topic.name, table=topic.table, partition=p,
            lake_first=lake_range.first if lake_range else None,
            lake_last=lake_range.last if lake_range else None,
            snapshot_id=snapshot,
            log_start_offset=low_high[0] if low_high else None,
            high_watermark=low_high[1] if low_high else None,
            prefer_lake=topic.prefer_lake, lake_only=lake_only, problem=row_problem,
            writer_next=(lake.writer_next(p) if lake is not None else None) if p not in writer_group
            else writer_group[p], seam_holes=topic.seam_holes, lost=lake.lost(p) if lake is not None else [],
        ))
    behind = {r.partition: max(r.lake_next or 0, r.log_start_offset or 0)
              for r in rows if r.lag_records and r.problem is None}
    for partition, timestamp in _first_timestamps(consumer, topic.name, behind).items():
        for row in rows:
            if row.partition == partition:
                row.next_timestamp_ms = timestamp
    return rows


# -- showing --------------------------------------------------------------------------------------------------

BAR_WIDTH = 40
UNICODE_CELLS = {"lake": "█", "both": "▓", "log": "░", "gap": "╳", "none": "·"}
ASCII_CELLS = {"lake": "#", "both": "=", "log": "-", "gap": "X", "none": "."}


def _cells() -> dict[str, str]:
    try:
        "".join(UNICODE_CELLS.values()).encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return ASCII_CELLS
    return UNICODE_CELLS


def _bar(row: PartitionStatus, cells: dict[str, str]) -> str:
    """One cell per slice of the offsets from the first one anyone holds up to the high watermark."""
    lake = (row.lake_first, row.lake_last + 1) if row.lake_first is not None and row.lake_last is not None else None
    log = (row.log_start_offset, row.high_watermark) if row.log_start_offset is not None \
        and row.high_watermark is not None else None
    ends = [e for pair in (lake, log) if pair for e in pair]
    if not ends:
        return cells["none"] * BAR_WIDTH
    low, high = min(ends), max(ends)
    if high <= low:
        return cells["none"] * BAR_WIDTH
    out = []
    for i in range(BAR_WIDTH):
        start = low + (high - low) * i // BAR_WIDTH
        end = max(start + 1, low + (high - low) * (i + 1) // BAR_WIDTH)
        in_lake = lake is not None and start < lake[1] and end > lake[0]
        in_log = log is not None and start < log[1] and end > log[0]
        out.append(cells["both"] if in_lake and in_log else cells["lake"] if in_lake else cells["log"] if in_log
                   else cells["gap"])
    return "".join(out)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _range(first: int | None, end: int | None) -> str:
    if first is None or end is None:
        return "-"
    return "empty" if end <= first else f"{first}..{end - 1}"


def render(rows: list[PartitionStatus], now: float) -> str:
    """The picture: per topic a header, per partition a bar and the numbers behind it."""
    cells = _cells()
    lines = []
    for topic in dict.fromkeys(r.topic for r in rows):
        mine = [r for r in rows if r.topic == topic]
        first = mine[0]
        snapshot = f"snapshot {first.snapshot_id}" if first.snapshot_id is not None else "no snapshot"
        kind = "  (lake-only: served read-only)" if first.lake_only else ""
        lines.append(f"{topic} <- {first.table} ({snapshot}){kind}")
        for r in mine:
            part = f"{r.partition:>4}" if r.partition >= 0 else "   -"
            lake_end = r.lake_last + 1 if r.lake_last is not None else None
            facts = [f"lake {_range(r.lake_first, lake_end)}", f"log {_range(r.log_start_offset, r.high_watermark)}",
                     f"hot wm {r.hot_watermark if r.hot_watermark is not None else '-'}"]
            if r.lag_records is not None:
                facts.append(f"lag {r.lag_records} rec / {_duration(r.lag_seconds(now))}")
            if r.gap:
                facts.append(f"LOST {r.gap[0]}..{r.gap[1]}")
            facts += [f"LOST {first}..{last} (archive)" for first, last in r.lost]
            if r.problem:
                facts.append(r.problem)
            lines.append(f"{part} |{_bar(r, cells)}| " + "  ".join(facts))
    if rows:
        lines.append(f"     {cells['lake']} lake only  {cells['both']} lake and Kafka  {cells['log']} Kafka only"
                     f"  {cells['gap']} in neither (lost)")
    return "\n".join(lines)


def to_json(rows: list[PartitionStatus], now: float) -> str:
    return json.dumps([{**asdict(r), "lake_next": r.lake_next, "hot_watermark": r.hot_watermark, "gap": r.gap,
                        "lag_records": r.lag_records, "lag_seconds": r.lag_seconds(now)} for r in rows], indent=2)


def print_status(config: Config, as_json: bool = False) -> int:
    rows = collect_status(config)
    now = time.time()
    if as_json:
        print(to_json(rows, now))
    elif rows:
        print(render(rows, now))
    else:
        print(f"no [[topics]] configured in {config.source}", file=sys.stderr)
    return 1 if any(r.failed() for r in rows) else 0
