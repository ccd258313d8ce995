"""Go's Sarama (Debian's 1.22.1) through ksi, on a noida-db topic whose offsets below 100 exist only in an
Iceberg table: partition consumers from the oldest offset and a consumer group that commits in the lake
and resumes there, offset-exact.  The programs are in tests/integration/go (see jvm_programs.py)."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest

from clients import Record
from jvm_programs import JvmMissing, go_binary, run_lines
from ksi.brokers import BrokerProcess
from test_history import PARTITIONS, PER_PARTITION
from test_history_clients import history_topic, table_of

LOG_START = 100
TOTAL = PARTITIONS * PER_PARTITION
SARAMA_VERSION = "2.1.0"  # Fetch v10, record batches with headers


def go(program: str, request: dict[str, Any], timeout: float = 90) -> list[dict[str, Any]]:
    try:
        binary = go_binary(program)
    except JvmMissing as exc:
        pytest.fail(str(exc))
    return run_lines([str(binary), json.dumps(request)], f"{program} {request.get('mode', '')}", timeout)


def records_of(lines: list[dict[str, Any]]) -> dict[tuple[int, int], Record]:
    got: dict[tuple[int, int], Record] = {}
    for line in lines:
        if line["type"] != "record":
            continue
        key = (line["p"], line["o"])
        assert key not in got, f"duplicate record at {key}"
        value = None if line["v"] is None else base64.b64decode(line["v"])
        assert value is not None
        got[key] = Record(None if line["k"] is None else base64.b64decode(line["k"]), value,
                          tuple((k, base64.b64decode(v or "")) for k, v in line.get("h", [])))
    return got


def test_sarama_partition_consumers_and_a_group_across_the_seam(
        noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    lake, props = catalog
    topic, originals = history_topic(noida, lake, "sarama", archived_below=120, log_start=LOG_START)
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props},
                      topics=[{"name": topic, "table": table_of(topic), "layout": "ksi"}])
    base = {"bootstrap": proxy.bootstrap, "topic": topic, "version": SARAMA_VERSION}

    # A PartitionConsumer per partition from OffsetOldest (ListOffsets EARLIEST: the lake's first offset)
    # to the high watermark: lake then log, headers included.
    lines = go("sarama", {**base, "mode": "partitions"})
    assert records_of(lines) == originals
    lines = go("sarama", {**base, "mode": "partitions", "offsets": {"0": 42, "1": 150}})
    assert records_of(lines) == {k: r for k, r in originals.items() if k[1] >= (42 if k[0] == 0 else 150)}

    # A group member reads 30 records (all in the lake), marks them and commits on Close; the next member
    # of the group resumes from those cold commits and reads the rest across the seam.
    group = f"sarama-{uuid.uuid4().hex[:6]}"
    first = go("sarama", {**base, "mode": "group", "group": group, "count": 30})
    assert [line["partitions"] for line in first if line["type"] == "claims"] == [list(range(PARTITIONS))]
    got_first = records_of(first)
    assert len(got_first) == 30 and all(o < LOG_START for _, o in got_first)
    rest = records_of(go("sarama", {**base, "mode": "group", "group": group, "count": TOTAL - 30}))
    assert not set(got_first) & set(rest), "the second member re-read committed records"
    assert {**got_first, **rest} == originals


def test_sarama_producer_partition_consumers_and_metadata_against_tansu(
        tansu: BrokerProcess, ksi_proxy: Any) -> None:
    """Sarama against the other real broker, through ksi: the SyncProducer, a PartitionConsumer per partition
    and a Metadata request.  Its consumer group cannot join tansu (JoinGroup v1 answered MEMBER_ID_REQUIRED,
    79, directly too: see test_client_matrix.py); through ksi it ends with tansu's own error, not a hang."""
    proxy = ksi_proxy(tansu)
    topic = f"sarama-tansu-{uuid.uuid4().hex[:6]}"
    tansu.create_topic(topic, PARTITIONS)
    base = {"bootstrap": proxy.bootstrap, "topic": topic, "version": SARAMA_VERSION}
    records = [Record(b"key-%d" % (i % 7), b"value-%d" % i, (("seq", b"%d" % i),)) for i in range(60)]
    go("sarama", {**base, "mode": "produce", "records": [
        {"k": base64.b64encode(r.key or b"").decode(), "v": base64.b64encode(r.value).decode(),
         "h": [[k, base64.b64encode(v).decode()] for k, v in r.headers]} for r in records]})
    # a count, not the high watermark: tansu's ListOffsets LATEST lags its log end (docs/pipeline.md)
    got = records_of(go("sarama", {**base, "mode": "partitions", "count": len(records)}))
    assert sorted(got.values(), key=lambda r: r.value) == sorted(records, key=lambda r: r.value)
    for partition in range(PARTITIONS):
        offsets = sorted(o for p, o in got if p == partition)
        assert offsets == list(range(len(offsets))), f"partition {partition}: {offsets}"
        values = [got[(partition, o)].value for o in offsets]
        assert values == [r.value for r in records if r.value in values], "out of order"
    (topics,) = go("sarama", {**base, "mode": "topics"})
    assert topics["topics"][topic] == PARTITIONS
    try:
        go("sarama", {**base, "mode": "group", "group": f"g-{uuid.uuid4().hex[:6]}", "count": 1}, timeout=60)
    except AssertionError as exc:
        assert "Error code = 79" in str(exc), str(exc)[-2000:]
    else:
        raise AssertionError("Sarama joined a group on tansu: move sarama-tansu into the client matrix")
