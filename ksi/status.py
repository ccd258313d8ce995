"""``ksi status``: per topic and partition, what the lake holds, what Kafka holds, and where they meet.

Reads the catalog through PyIceberg (metadata and statistics only) and the broker's watermarks through
confluent-kafka; touches no proxy.  Exit status 0 when every configured topic is readable end to end,
1 when a table is unusable or a gap exists (so it can gate a deployment or a cron alert).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

from .config import Config

__all__ = ["PartitionStatus", "collect_status", "print_status"]


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
    problem: str | None = None

    @property
    def hot_watermark(self) -> int | None:
        return self.log_start_offset

    @property
    def gap(self) -> tuple[int, int] | None:
        if self.lake_last is None or self.log_start_offset is None:
            return None
        if self.lake_last + 1 < self.log_start_offset:
            return self.lake_last + 1, self.log_start_offset - 1
        return None


def _broker_watermarks(config: Config, topic: str) -> tuple[dict[int, tuple[int, int]], str | None]:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    bootstrap = ",".join(map(str, config.upstream.bootstrap_servers))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ksi-status", "enable.auto.commit": False,
                         "socket.timeout.ms": 5000})
    try:
        metadata = consumer.list_topics(topic, timeout=config.upstream.connect_timeout_seconds * 2)
        info = metadata.topics.get(topic)
        if info is None or info.error is not None:
            return {}, f"not in Kafka ({info.error if info is not None else 'unknown topic'})"
        marks = {}
        for p in sorted(info.partitions):
            marks[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False)
        return marks, None
    except KafkaException as exc:
        return {}, f"Kafka unreachable: {exc}"
    finally:
        consumer.close()


def collect_status(config: Config) -> list[PartitionStatus]:
    from .lake.table import LakeError, LakeTable
    from .lake.catalog import load_catalog

    rows: list[PartitionStatus] = []
    catalog: Any = None
    catalog_error = None
    if config.topics:
        try:
            catalog = load_catalog(config)
        except Exception as exc:
            catalog_error = f"catalog unavailable: {exc}"
    for topic in config.topics:
        marks, kafka_problem = _broker_watermarks(config, topic.name)
        ranges: dict[int, Any] = {}
        snapshot = None
        problem = catalog_error
        if catalog is not None:
            lake = LakeTable(catalog, topic)
            try:
                ranges = lake.offset_ranges()
                snapshot = lake.snapshot_id
            except LakeError as exc:
                problem = str(exc)
        partitions = sorted(set(ranges) | set(marks)) or [-1]
        for p in partitions:
            lake_range = ranges.get(p)
            low_high = marks.get(p)
            rows.append(PartitionStatus(
                topic=topic.name, table=topic.table, partition=p,
                lake_first=lake_range.first if lake_range else None,
                lake_last=lake_range.last if lake_range else None,
                snapshot_id=snapshot,
                log_start_offset=low_high[0] if low_high else None,
                high_watermark=low_high[1] if low_high else None,
                problem=problem or (kafka_problem if not low_high else None),
            ))
    return rows


def _fmt(value: Any) -> str:
    return "-" if value is None else str(value)


def print_status(config: Config, as_json: bool = False) -> int:
    rows = collect_status(config)
    if as_json:
        print(json.dumps([{**asdict(r), "hot_watermark": r.hot_watermark, "gap": r.gap} for r in rows], indent=2))
    else:
        header = ("topic", "part", "lake offsets", "snapshot", "log start", "high wm", "hot wm", "gap / problem")
        table = [header]
        for r in rows:
            lake = f"{r.lake_first}..{r.lake_last}" if r.lake_first is not None else "-"
            gap = f"LOST {r.gap[0]}..{r.gap[1]}" if r.gap else ""
            table.append((r.topic, _fmt(r.partition if r.partition >= 0 else None), lake, _fmt(r.snapshot_id),
                          _fmt(r.log_start_offset), _fmt(r.high_watermark), _fmt(r.hot_watermark),
                          "; ".join(x for x in (gap, r.problem or "") if x)))
        widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
        for row in table:
            print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
        if not rows:
            print("no [[topics]] configured", file=sys.stderr)
    return 1 if any(r.gap or r.problem for r in rows) else 0
