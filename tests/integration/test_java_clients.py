"""The Apache Kafka Java client (kafka-clients 3.9.1, what Flink, Kafka Streams and Spark's Kafka source run
on) through ksi, on a noida-db topic whose offsets below 100 exist only in an Iceberg table.

The Java client differs from librdkafka where a proxy can go wrong: it checks every batch's CRC and
layout strictly, asks for fetch sessions (KIP-227; ksi answers session id 0, so it sends full fetches),
tracks leader epochs (records from the lake carry none) and validates a position that has one with
OffsetsForLeaderEpoch after a seek, uses ListOffsets v7+ and Metadata v12 with topic ids, and commits
with the leader epoch of the last record.  Each test drives the small programs in
tests/integration/java (see jvm_programs.py) and parses the JSON lines they print."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
import uuid
from typing import Any

import pytest
from clients import Record
from jvm_programs import JvmMissing, java_command, parse_lines, run_lines
from test_history import BASE_TS, PARTITIONS, PER_PARTITION
from test_history_clients import history_topic, table_of

from ksi.brokers import BrokerProcess

LOG_START = 100   # the broker's log starts here; offsets below exist only in the lake
TOTAL = PARTITIONS * PER_PARTITION


def java(main: str, request: dict[str, Any], timeout: float = 120) -> list[dict[str, Any]]:
    try:
        argv = java_command(main, json.dumps(request))
    except JvmMissing as exc:
        pytest.fail(str(exc))
    return run_lines(argv, f"java {main} {request.get('group') or ''}", timeout)


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def as_record(line: dict[str, Any]) -> Record:
    value = unb64(line["v"])
    assert value is not None
    return Record(unb64(line["k"]), value, tuple((k, unb64(v) or b"") for k, v in line["h"]))


def records_of(lines: list[dict[str, Any]]) -> dict[tuple[int, int], Record]:
    got: dict[tuple[int, int], Record] = {}
    for line in lines:
        if line["type"] == "record":
            key = (line["p"], line["o"])
            assert key not in got, f"duplicate record at {key}"
            got[key] = as_record(line)
    return got


def records_at_least_once(lines: list[dict[str, Any]]) -> dict[tuple[int, int], Record]:
    """The records of a group member whose commits may have been refused: a record may come again, but
    only after a refused commit, and then as it came the first time."""
    got: dict[tuple[int, int], Record] = {}
    refused = False
    for line in lines:
        if line["type"] == "commit" and line["error"] is not None:
            refused = True
        elif line["type"] == "record":
            key = (line["p"], line["o"])
            if key in got:
                assert refused, f"{key} delivered twice with no refused commit before"
                assert got[key] == as_record(line), key
            got[key] = as_record(line)
    return got


def proxy_for(ksi_proxy: Any, noida: BrokerProcess, props: dict[str, str], *topics: dict[str, Any],
              **sections: Any) -> Any:
    return ksi_proxy(noida, catalog={"name": "lake", **props},
                     topics=[{"table": table_of(t["name"]), "layout": "ksi", **t} for t in topics], **sections)


def test_assign_seek_offsets_admin_and_both_isolation_levels_across_the_seam(
        noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    lake, props = catalog
    topic, originals = history_topic(noida, lake, "java", archived_below=120, log_start=LOG_START)
    proxy = proxy_for(ksi_proxy, noida, props, {"name": topic})

    # assign + seekToBeginning, read to the end offsets: every offset once, lake then log, byte for byte.
    for isolation in ("read_uncommitted", "read_committed"):
        lines = java("JavaConsumer", {"bootstrap": proxy.bootstrap, "topic": topic, "seek": "beginning",
                                      "untilEnd": True, "props": {"isolation.level": isolation}})
        assert records_of(lines) == originals, isolation
        stamps = {(r["p"], r["o"]): (r["ts"], r["tstype"]) for r in lines if r["type"] == "record"}
        assert stamps == {k: (BASE_TS + k[1] * 1000, "CreateTime") for k in originals}, isolation
        # Lake batches carry no leader epoch (-1): the Java client then keeps no epoch for the position.
        assert {r["epoch"] for r in lines if r["type"] == "record" and r["o"] < LOG_START} == {-1}

    # seek to a cold offset on one partition and a hot one on the other (one Fetch, split by ksi).
    lines = java("JavaConsumer", {"bootstrap": proxy.bootstrap, "topic": topic, "seek": {"0": 42, "1": 150},
                                  "untilEnd": True})
    assert records_of(lines) == {k: r for k, r in originals.items() if k[1] >= (42 if k[0] == 0 else 150)}

    # Offsets as the consumer and the AdminClient ask for them: EARLIEST from the lake, LATEST from the
    # broker, timestamps below the log start answered from the lake.
    stamps = [BASE_TS + 42 * 1000, BASE_TS + 99 * 1000 - 1, BASE_TS + 100 * 1000, BASE_TS + 150 * 1000]
    (answer,) = java("JavaOffsets", {"bootstrap": proxy.bootstrap, "topic": topic, "timestamps": stamps})
    every = {str(p) for p in range(PARTITIONS)}
    assert answer["beginning"] == answer["adminEarliest"] == dict.fromkeys(every, 0)
    assert answer["end"] == answer["adminLatest"] == dict.fromkeys(every, PER_PARTITION)
    for ts, offset in zip(stamps, (42, 99, 100, 150)):
        assert answer["forTimes"][str(ts)] == answer["adminForTimes"][str(ts)] == dict.fromkeys(every, offset)
    described = answer["describe"]["partitions"]
    assert [p["p"] for p in described] == list(range(PARTITIONS))
    assert all(p["leader"] >= 0 and p["leader"] in p["replicas"] and p["leader"] in p["isr"] for p in described)


def test_group_joins_commits_rebalances_and_resumes_across_the_seam(
        noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    lake, props = catalog
    topic, originals = history_topic(noida, lake, "javagroup", archived_below=120, log_start=LOG_START)
    proxy = proxy_for(ksi_proxy, noida, props, {"name": topic})

    # One member reads 30 records (all in the lake) and commits; a new member of the same group resumes
    # from those cold commits and reads the rest, across the seam.
    group = f"java-{uuid.uuid4().hex[:6]}"
    base = {"bootstrap": proxy.bootstrap, "topic": topic, "group": group, "commit": True}
    first = java("JavaConsumer", {**base, "count": 30, "props": {"max.poll.records": "10"}})
    assert [line["partitions"] for line in first if line["type"] == "assigned"] == [list(range(PARTITIONS))]
    assert all(line["error"] is None for line in first if line["type"] == "commit")
    got_first = records_of(first)
    assert len(got_first) == 30 and all(o < LOG_START for _, o in got_first)
    rest = java("JavaConsumer", {**base, "count": TOTAL - 30, "idleMs": 15000})
    got_rest = records_of(rest)
    assert not set(got_first) & set(got_rest), "the second member re-read committed records"
    assert {**got_first, **got_rest} == originals
    (answer,) = java("JavaOffsets", {"bootstrap": proxy.bootstrap, "topic": topic, "group": group})
    assert answer["groupOffsets"] == {str(p): PER_PARTITION for p in range(PARTITIONS)}

    # A two-member rebalance in the middle of the lake: member A reads slowly, B joins, the partitions
    # are split between them and both read on, committing after every poll.  Delivery is at least once
    # (noida refuses commits while the group prepares a rebalance, see ARCHITECTURE.md), so a record may
    # come twice, but each one as produced, and the group's commits end at the high watermarks.
    group = f"java-{uuid.uuid4().hex[:6]}"
    slow = {**base, "group": group, "idleMs": 5000, "pollSleepMs": 300, "props": {"max.poll.records": "5"}}
    a = subprocess.Popen(java_command("JavaConsumer", json.dumps(slow)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    a_lines: list[str] = []
    reader = threading.Thread(target=lambda: a_lines.extend(iter(a.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    deadline = time.monotonic() + 60
    while sum('"record"' in line for line in a_lines) < 20 and time.monotonic() < deadline and a.poll() is None:
        time.sleep(0.1)
    b_lines = java("JavaConsumer", {**slow, "pollSleepMs": 0, "props": {}})
    try:
        a.wait(90)
    except subprocess.TimeoutExpired:
        a.kill()
        raise
    reader.join(10)
    assert a.returncode == 0, a.stderr.read()  # type: ignore[union-attr]
    a_parsed = parse_lines("".join(a_lines))
    a_assigned = [line["partitions"] for line in a_parsed if line["type"] == "assigned"]
    b_assigned = [line["partitions"] for line in b_lines if line["type"] == "assigned"]
    assert a_assigned[0] == list(range(PARTITIONS)) and len(a_assigned) >= 2, a_assigned
    assert b_assigned and b_assigned[0] and len(a_assigned[1]) < PARTITIONS, (a_assigned, b_assigned)
    a_records, b_records = records_at_least_once(a_parsed), records_at_least_once(b_lines)
    assert any(o < LOG_START for _, o in b_records), "B should have taken over a partition inside the lake"
    assert {**a_records, **b_records} == originals
    (answer,) = java("JavaOffsets", {"bootstrap": proxy.bootstrap, "topic": topic, "group": group})
    assert answer["groupOffsets"] == {str(p): PER_PARTITION for p in range(PARTITIONS)}


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_every_codec_ksi_serves(noida: BrokerProcess, ksi_proxy: Any, catalog: Any, compression: str) -> None:
    lake, props = catalog
    topic, originals = history_topic(noida, lake, f"java{compression}", archived_below=120, log_start=LOG_START)
    proxy = proxy_for(ksi_proxy, noida, props, {"name": topic, "compression": compression})
    lines = java("JavaConsumer", {"bootstrap": proxy.bootstrap, "topic": topic, "seek": "beginning",
                                  "untilEnd": True, "props": {"check.crcs": "true"}})
    assert records_of(lines) == originals


def test_seek_with_a_leader_epoch_into_the_lake(noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    """A position with a leader epoch (from a hot record, or a commit made after one) is validated by the
    Java client with OffsetsForLeaderEpoch before it fetches; ksi passes that to the broker, whose answer
    (the epoch's end offset) is at or past the cold offset, so no truncation is detected and the client
    reads the lake."""
    lake, props = catalog
    topic, originals = history_topic(noida, lake, "javaepoch", archived_below=120, log_start=LOG_START)
    proxy = proxy_for(ksi_proxy, noida, props, {"name": topic})
    hot = java("JavaConsumer", {"bootstrap": proxy.bootstrap, "topic": topic, "seek": {"0": 190},
                                "partitions": [0], "untilEnd": True})
    epochs = {line["epoch"] for line in hot if line["type"] == "record"}
    assert len(epochs) == 1
    (epoch,) = epochs
    lines = java("JavaConsumer", {"bootstrap": proxy.bootstrap, "topic": topic, "partitions": [0],
                                  "seekEpoch": {"0": [10, max(epoch, 0)]}, "untilEnd": True})
    assert records_of(lines) == {k: r for k, r in originals.items() if k[0] == 0 and k[1] >= 10}
