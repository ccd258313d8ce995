"""``ksi verify TOPIC``: the lake against the broker, record by record, and what the lake leaves out.

Per partition:

* **Compared**: every offset both hold (from the later of the lake's first offset and the log start, to the
  earlier of the lake's last offset and the high watermark): each record's fields that the table's layout
  carries exactly (:func:`fidelity`, the README's fidelity table) must be the broker's; the others are
  reported as not compared, with what the layout does to them.  The ksi layout carries key, value bytes (as
  ksi serves them: typed columns re-encoded), headers and timestamp; Kafka Connect and Streambased tables
  carry the timestamp only (no key, no headers, values rebuilt as Avro from columns); AutoMQ keeps keys as
  strings and tombstones as empty values, which are not counted as mismatches.  An offset the broker holds a
  record at and the lake does not is a mismatch too, except a tombstone where the layout's writer drops them.
* **Holes** inside the lake: offsets with no record (transaction markers, tombstones or keys a writer drops,
  aborted records where the writer reads read_committed): listed as ranges, and counted as explained (the
  broker holds no record there either, or a tombstone the writer drops; beyond what the broker holds: the
  writer's commit state says it read past them) or unexplained (beyond the broker, no commit state).
* **Isolation**: the broker is read read_uncommitted for the ksi layout (its archive keeps aborted records,
  marked) and read_committed for the others (their writers keep committed records only).
* **The seam**: offsets between the lake's end and the log start are explained (the writer's commit state
  says it read them) or lost (it did not, or keeps no state and the topic's ``seam_holes`` is ``error``).
* **Duplicates**: offsets the table stores more than once, and those whose copies differ.

Exit status 1 on a mismatch or lost offsets, 0 otherwise; a progress line on stderr every
``progress_seconds`` (5 by default; ``ksi verify --progress-seconds``).
Reads through the lake side (``ksi.lake``) and the broker with confluent-kafka: no proxy involved.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from .config import Config, TopicConfig

if TYPE_CHECKING:
    from .lake.layouts import ResolvedLayout
    from .lake.table import LakeTable

__all__ = ["Fidelity", "PartitionReport", "fidelity", "print_verify", "verify_topic"]

PROGRESS_SECONDS = 5.0
MAX_LISTED = 10  # mismatches and holes listed per partition (all are counted)
KAFKA_TIMEOUT_SECONDS = 10.0

Record = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]  # offset, ts, key, value, headers


FIELDS = ("timestamp", "key", "value", "headers")


@dataclass(frozen=True)
class Fidelity:
    """What a layout carries of a record: the fields compared exactly, and why the others are not."""

    compared: tuple[str, ...]
    not_compared: dict[str, str] = field(default_factory=dict)  # field -> what the layout does to it
    empty_tombstones: bool = False   # a null value is stored as empty bytes (AutoMQ)
    string_keys: bool = False        # keys are stored as strings: bytes that are not UTF-8 are replaced (AutoMQ)
    drops_tombstones: bool = False   # the writer drops records with a null value (Kafka Connect's sink)
    read_committed: bool = True      # the writer keeps committed records only


def fidelity(layout: ResolvedLayout) -> Fidelity:
    """The fields of ``layout`` compared exactly with the broker's (the README's fidelity table)."""
    name = layout.name
    typed = layout.raw_value is None or bool(layout.value_columns)
    rebuilt = "rebuilt: Avro from the table's columns"
    if name == "ksi":
        return Fidelity(FIELDS, read_committed=False)
    if name == "redpanda":
        if typed:
            return Fidelity(("timestamp", "key", "headers"), {"value": rebuilt + " (schema mode)"})
        return Fidelity(FIELDS)
    if name == "automq":
        if typed:
            return Fidelity(("timestamp", "key", "headers"), {"value": rebuilt}, string_keys=True)
        return Fidelity(FIELDS, empty_tombstones=True, string_keys=True)
    lost = "lost: the layout has no column for it"
    return Fidelity(("timestamp",), {"key": lost, "headers": lost, "value": rebuilt},
                    drops_tombstones=name == "kafka-connect")


@dataclass
class PartitionReport:
    partition: int
    lake_first: int | None = None
    lake_last: int | None = None
    lake_records: int = 0
    log_start: int | None = None
    high_watermark: int | None = None
    compared: tuple[int, int] | None = None  # offsets compared, first and last
    equal: int = 0
    mismatches: list[str] = field(default_factory=list)
    mismatch_count: int = 0
    holes: list[tuple[int, int]] = field(default_factory=list)
    hole_offsets: int = 0
    holes_explained: int = 0         # hole offsets the broker or the writer's commit state explains
    holes_unexplained: int = 0       # hole offsets nothing explains (beyond the broker, no commit state)
    not_compared: dict[str, str] = field(default_factory=dict)  # field -> why (the layout rebuilds or loses it)
    rebuilt: int = 0                 # records whose fields differ only as the layout rebuilds them
    seam: str | None = None          # "explained a..b", "lost a..b", "unknown a..b" or None
    lost: bool = False
    archive_lost: list[tuple[int, int]] = field(default_factory=list)  # ranges ksi archive recorded as lost
    duplicates: int = 0
    differing_duplicates: int = 0

    @property
    def ok(self) -> bool:
        return not self.mismatch_count and not self.lost


def _lake_records(lake: LakeTable, partition: int, counts: Counter[str]) -> Iterator[Record]:
    """Every record the lake serves for the partition, in offset order (as ksi would serve it)."""
    plan = lake.plan
    wanted = plan.partitions.get(partition)
    if wanted is None:
        return
    c = 0
    while c < wanted.components:
        read_plan = lake.read_plan(plan, partition, c, None)
        result = lake.read(plan, read_plan, None)
        counts.update(result.counts)
        for span in result.spans:
            if span.partition != partition or span.records is None:
                continue
            cols = span.records.columns
            headers = cols.headers.to_pylist() if cols.headers is not None else [None] * len(cols)
            for o, ts, k, v, hs in zip(cols.offsets.tolist(), cols.timestamps.tolist(), cols.keys.to_pylist(),
                                       cols.values.to_pylist(), headers, strict=True):
                yield o, ts, k, v, [(h["key"].decode() if isinstance(h["key"], bytes) else h["key"], h["value"])
                                    for h in hs or []]
        c = max(read_plan.served.get(partition, [c])) + 1


def _broker_records(consumer: Any, topic: str, partition: int, first: int, last: int) -> Iterator[Record]:
    from confluent_kafka import TopicPartition

    consumer.assign([TopicPartition(topic, partition, first)])
    deadline = time.monotonic() + KAFKA_TIMEOUT_SECONDS
    try:
        while True:
            messages = consumer.consume(1000, 0.5)
            if not messages:
                if time.monotonic() > deadline:
                    return
                continue
            deadline = time.monotonic() + KAFKA_TIMEOUT_SECONDS
            for m in messages:
                if m.error() is not None:
                    if m.error().code() == -191:  # _PARTITION_EOF: read to the end
                        return
                    continue
                if m.offset() > last:
                    return
                yield m.offset(), m.timestamp()[1], m.key(), m.value(), list(m.headers() or [])
    finally:
        consumer.unassign()


def _differences(lake: Record, broker: Record, kept: Fidelity) -> tuple[list[str], bool]:
    """The compared fields that differ, and whether any field differs only as the layout rebuilds it."""
    differ, rebuilt = [], False
    for name, a, b in zip(FIELDS, lake[1:], broker[1:], strict=True):
        if name not in kept.compared or a == b:
            continue
        tombstone = name == "value" and kept.empty_tombstones and b is None and a == b""
        replaced = name == "key" and kept.string_keys and isinstance(b, bytes) and not _utf8(b)
        if tombstone or replaced:
            rebuilt = True
        else:
            differ.append(name)
    return differ, rebuilt


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def verify_partition(lake: LakeTable, consumer: Any, topic: TopicConfig, partition: int,
                     marks: tuple[int, int] | None, writer_next: int | None,
                     progress: Callable[[PartitionReport], None], kept: Fidelity | None = None) -> PartitionReport:
    ranges = lake.offset_ranges()
    known = ranges.get(partition)
    kept = kept or fidelity(lake.layout)
    report = PartitionReport(partition, not_compared=dict(kept.not_compared))
    if marks is not None:
        report.log_start, report.high_watermark = marks
    if known is not None:
        report.lake_first, report.lake_last = known.first, known.last
    counts: Counter[str] = Counter()
    overlap = None
    if known is not None and marks is not None:
        first, last = max(known.first, marks[0]), min(known.last, marks[1] - 1)
        if first <= last:
            overlap = (first, last)
            report.compared = overlap
    broker = iter(_broker_records(consumer, topic.name, partition, *overlap)) if overlap else iter(())
    pending = next(broker, None)
    previous = None
    for record in _lake_records(lake, partition, counts):
        offset = record[0]
        report.lake_records += 1
        progress(report)
        if previous is not None and offset > previous + 1:
            _hole(report, previous + 1, offset - 1, overlap, writer_next)
        previous = offset
        if overlap is None or not overlap[0] <= offset <= overlap[1]:
            continue
        while pending is not None and pending[0] < offset:  # the broker has a record the lake lacks
            _missing(report, pending, kept)
            pending = next(broker, None)
        if pending is None or pending[0] > offset:
            _mismatch(report, f"offset {offset}: the lake holds a record the broker does not have")
            continue
        differs, rebuilt = _differences(record, pending, kept)
        if differs:
            _mismatch(report, f"offset {offset}: {', '.join(differs)} differ")
        else:
            report.equal += 1
            report.rebuilt += rebuilt
        pending = next(broker, None)
    while overlap is not None and pending is not None and pending[0] <= overlap[1]:
        _missing(report, pending, kept)
        pending = next(broker, None)
    report.duplicates, report.differing_duplicates = counts["duplicate"], counts["differing_duplicate"]
    report.archive_lost = lake.lost(partition)
    report.lost = bool(report.archive_lost)
    if known is not None and marks is not None and known.next < marks[0]:
        span = f"{known.next}..{marks[0] - 1}"
        if writer_next is not None and writer_next >= marks[0]:
            report.seam = f"explained {span} (the writer read up to {min(writer_next, marks[0]) - 1})"
        elif writer_next is not None:
            lost_from = max(writer_next, known.next)
            report.seam = f"lost {lost_from}..{marks[0] - 1} (the writer read up to {writer_next - 1})"
            report.lost = True
        elif topic.seam_holes == "skip":
            report.seam = f"skipped {span} (no writer commit state; seam_holes = \"skip\")"
        else:
            report.seam = f"unknown {span} (no writer commit state: lost, or offsets without records)"
            report.lost = True
    return report


def _hole(report: PartitionReport, first: int, last: int, overlap: tuple[int, int] | None,
          writer_next: int | None) -> None:
    """Offsets ``first..last`` hold no record in the lake.  Where the broker holds them too, a record it holds
    there is counted by :func:`_missing` (a mismatch, or a dropped tombstone); the hole is explained so far.
    Beyond the broker, the writer's commit state explains it when the writer read past it."""
    report.hole_offsets += last - first + 1
    if len(report.holes) < MAX_LISTED:
        report.holes.append((first, last))
    checked = 0
    if overlap is not None:
        checked = max(0, min(last, overlap[1]) - max(first, overlap[0]) + 1)
    rest = last - first + 1 - checked
    report.holes_explained += checked
    if writer_next is not None and last < writer_next:
        report.holes_explained += rest
    else:
        report.holes_unexplained += rest


def _missing(report: PartitionReport, broker: Record, kept: Fidelity) -> None:
    """The broker holds a record at an offset the lake has none at."""
    if kept.drops_tombstones and broker[3] is None:
        return  # a tombstone the writer drops: the hole is explained
    report.holes_explained -= 1
    report.holes_unexplained += 1
    _mismatch(report, f"offset {broker[0]}: the broker holds a record, the lake none")


def _mismatch(report: PartitionReport, text: str) -> None:
    report.mismatch_count += 1
    if len(report.mismatches) < MAX_LISTED:
        report.mismatches.append(text)


def verify_topic(config: Config, name: str, partitions: list[int] | None = None,
                 progress_to: TextIO | None = sys.stderr,
                 progress_seconds: float = PROGRESS_SECONDS) -> list[PartitionReport]:
    """Verify one configured topic; raise ValueError naming what is wrong with the request.  A progress line
    goes to ``progress_to`` every ``progress_seconds`` (0: after every record read)."""
    from confluent_kafka import Consumer

    from .lake.catalog import load_catalog
    from .lake.table import LakeTable
    from .registry.client import RegistryClient
    from .status import _broker_watermarks, _kafka_config, writer_group_offsets

    topic = next((t for t in config.topics if t.name == name), None)
    if topic is None:
        known = ", ".join(t.name for t in config.topics) or "none"
        raise ValueError(f"topic {name!r} is not configured in {config.source} ([[topics]]: {known})")
    registry = RegistryClient(config.schema_registry.url) if config.schema_registry.url else None
    lake = LakeTable(load_catalog(config), topic, registry)
    ranges = lake.offset_ranges()
    kept = fidelity(lake.layout)
    kafka = {**_kafka_config(config), "group.id": "ksi-verify", "enable.partition.eof": True,
             "isolation.level": "read_committed" if kept.read_committed else "read_uncommitted"}
    consumer = Consumer(kafka)
    last_line = [time.monotonic()]

    def progress(report: PartitionReport) -> None:
        now = time.monotonic()
        if progress_to is not None and now - last_line[0] >= progress_seconds:
            last_line[0] = now
            print(f"ksi verify: {name} partition {report.partition}: {report.lake_records:,} lake records read,"
                  f" {report.equal:,} equal to the broker's, {report.mismatch_count} mismatch(es)", file=progress_to,
                  flush=True)

    try:
        marks, problem = _broker_watermarks(consumer, kafka["bootstrap.servers"], name)
        if problem is not None and problem != "not in Kafka":
            raise ValueError(problem)
        group = writer_group_offsets(config, topic, sorted(set(ranges) | set(marks))) if topic.writer_group else {}
        wanted = partitions if partitions is not None else sorted(set(ranges) | set(marks))
        return [verify_partition(lake, consumer, topic, p, marks.get(p), group.get(p, lake.writer_next(p)), progress,
                                 kept) for p in wanted]
    finally:
        consumer.close()


def print_verify(config: Config, name: str, partitions: list[int] | None = None, as_json: bool = False,
                 out: TextIO = sys.stdout, progress_seconds: float = PROGRESS_SECONDS) -> int:
    reports = verify_topic(config, name, partitions, progress_seconds=progress_seconds)
    if as_json:
        print(json.dumps({"topic": name, "ok": all(r.ok for r in reports),
                          "partitions": [asdict(r) | {"ok": r.ok} for r in reports]}, indent=1), file=out)
    else:
        for r in reports:
            lake = f"lake {r.lake_first}..{r.lake_last} ({r.lake_records:,} records)" if r.lake_first is not None \
                else "lake: nothing"
            log = f"log {r.log_start}..{r.high_watermark - 1}" if r.log_start is not None and r.high_watermark \
                else "log: nothing"
            compared = (f"compared {r.compared[0]}..{r.compared[1]}: {r.equal:,} equal" if r.compared
                        else "nothing held by both")
            print(f"{name} partition {r.partition}: {'OK' if r.ok else 'FAILED'}  {lake}  {log}  {compared}", file=out)
            if r.not_compared:
                print("    not compared (rebuilt/lost in this layout): "
                      + "; ".join(f"{f}: {why}" for f, why in r.not_compared.items()), file=out)
            if r.rebuilt:
                print(f"    {r.rebuilt:,} equal record(s) differ only as the layout keeps them (a tombstone as empty"
                      " bytes, a key that is not UTF-8 as a string)", file=out)
            for line in r.mismatches:
                print(f"    mismatch: {line}", file=out)
            if r.mismatch_count > len(r.mismatches):
                print(f"    ... {r.mismatch_count - len(r.mismatches)} more mismatch(es)", file=out)
            if r.hole_offsets:
                listed = ", ".join(f"{a}..{b}" for a, b in r.holes)
                print(f"    holes in the lake: {r.hole_offsets:,} offset(s) without a record ({listed}"
                      f"{', ...' if r.hole_offsets > sum(b - a + 1 for a, b in r.holes) else ''}):"
                      f" {r.holes_explained:,} explained (no record in the log there either, a tombstone the writer"
                      f" drops, or the writer read past them), {r.holes_unexplained:,} not", file=out)
            if r.seam:
                print(f"    seam: {r.seam}", file=out)
            for first, last in r.archive_lost:
                print(f"    lost {first}..{last}: deleted from Kafka before ksi archive read them (ksi.lost-offsets)",
                      file=out)
            if r.duplicates:
                print(f"    duplicates: {r.duplicates:,} row(s) store an offset again ({r.differing_duplicates:,}"
                      " with other contents: the earliest commit's row is served)", file=out)
    return 0 if all(r.ok for r in reports) else 1
