"""Fetch below v4 through ksi: lake answers in the message formats those versions allow (magic 0 for
Fetch v0-v1, magic 1 for v2-v3, as Kafka 3.x brokers convert them), never magic-2 record batches.

Checked with raw Fetch requests (kafka-python's codec over a socket, every version 0-4) and with a real
client that reads nothing else: segmentio kafka-go 0.2.1 (Debian's), which speaks only Fetch v2 and
ListOffsets v1 and failed on ksi's lake batches with "unsupported message version 2 found in fetch
response" before the conversion.  Only offsets in the lake are read: noida-db advertises Fetch v0-v3
but closes the connection on them (for its own, hot, offsets a Kafka 3.x broker converts)."""

from __future__ import annotations

import base64
import json
import socket
import struct
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.record import MemoryRecords

from jvm_programs import JvmMissing, go_binary, run_lines
from ksi.brokers import BrokerProcess
from test_history import BASE_TS, PARTITIONS
from test_history_clients import history_topic, table_of

LOG_START = 100


def raw_fetch(bootstrap: str, topic: str, partition: int, offset: int, version: int,
              partition_max_bytes: int = 1 << 20) -> Any:
    """One Fetch of ``version`` on a fresh connection to ``bootstrap``; the decoded partition answer."""
    host, port = bootstrap.rsplit(":", 1)
    F = FetchRequest
    request = F(version=version, replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=1 << 24, isolation_level=0,
                topics=[F.FetchTopic(version=version, topic=topic, partitions=[F.FetchTopic.FetchPartition(
                    version=version, partition=partition, fetch_offset=offset,
                    partition_max_bytes=partition_max_bytes)])])
    request.with_header(correlation_id=7, client_id="old-fetch-test")
    data = bytes(request.encode(version=version, header=True))
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(struct.pack(">i", len(data)) + data)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
            chunk = sock.recv(1 << 20)
            assert chunk, f"ksi closed the connection on Fetch v{version}"
            buf += chunk
    response = FetchResponse.decode(buf[4:], version=version, header=True)
    assert response.header.correlation_id == 7
    (topic_answer,) = response.responses
    (answer,) = topic_answer.partitions
    return answer


def messages(records: bytes) -> list[tuple[int, int, int | None, bytes | None, bytes | None, int]]:
    """(magic, offset, timestamp, key, value, header count) of every record, CRCs checked."""
    out = []
    reader = MemoryRecords(records)
    while (batch := reader.next_batch()) is not None:
        assert batch.validate_crc()
        for r in batch:
            out.append((batch.magic, r.offset, r.timestamp, r.key, r.value, len(list(r.headers))))
    return out


def test_raw_fetch_v0_to_v4_and_kafka_go_read_the_lake(noida: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    lake, props = catalog
    topic, originals = history_topic(noida, lake, "oldfetch", archived_below=120, log_start=LOG_START)
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props},
                      topics=[{"name": topic, "table": table_of(topic), "layout": "ksi", "compression": "lz4"}])

    for version, magic in ((0, 0), (1, 0), (2, 1), (3, 1), (4, 2)):
        answer = raw_fetch(proxy.bootstrap, topic, 0, 10, version)
        assert answer.error_code == 0 and answer.high_watermark == 200, version
        got = messages(answer.records)
        assert got and {m[0] for m in got} == {magic}, version
        if magic == 2:  # a batch may start below the offset asked for, as a broker's does; clients skip those
            got = [m for m in got if m[1] >= 10]
        # the lake holds 0..119
        assert [m[1] for m in got] == list(range(10, 10 + len(got))) and got[-1][1] < 120, version
        for m_magic, offset, timestamp, key, value, headers in got:
            original = originals[(0, offset)]
            assert (key, value) == (original.key, original.value), (version, offset)
            assert timestamp == (None if m_magic == 0 else BASE_TS + offset * 1000), (version, offset)
            assert headers == (2 if m_magic == 2 else 0)  # the old formats have no headers

    # A small partition_max_bytes: whole messages only, and at least one.
    answer = raw_fetch(proxy.bootstrap, topic, 1, 50, 2, partition_max_bytes=100)
    got = messages(answer.records)
    assert got and got[0][:2] == (1, 50) and (len(answer.records) <= 100 or len(got) == 1)

    try:
        binary = go_binary("kafkago")
    except JvmMissing as exc:
        pytest.fail(str(exc))
    for partition in range(PARTITIONS):
        lines = run_lines([str(binary), json.dumps({"bootstrap": proxy.bootstrap, "topic": topic,
                                                    "partition": partition, "from": 0, "to": LOG_START})],
                          "kafka-go", timeout=60)
        done = lines[-1]
        assert done["type"] == "done" and done["first"] == 0  # ListOffsets v1 EARLIEST: the lake's first
        got_go = {(r["p"], r["o"]): (base64.b64decode(r["k"]), base64.b64decode(r["v"]), r["ts"])
                  for r in lines if r["type"] == "record"}
        assert got_go == {k: (r.key, r.value, BASE_TS + k[1] * 1000) for k, r in originals.items()
                          if k[0] == partition and k[1] < LOG_START}
