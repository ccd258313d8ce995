"""What the Java client (kafka-clients 3.9.1, tests/integration/java/JavaConsumer.java) does that the brokers
installable here never make it do, through ksi, against the fake broker: leader epochs and
OffsetsForLeaderEpoch validation after a seek (noida-db reports no leader epoch, tansu offers no
OffsetsForLeaderEpoch), metadata refreshed while reading across the seam, and fetch sessions (KIP-227) a
broker grants.  Partition 0 of topic "t" holds offsets 0..59 in the lake (values b"v<offset>") and 60..89 on
the broker, in batches stamped with leader epoch 5; lake batches carry leader epoch -1."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import trio

from tests.integration.jvm_programs import JvmMissing, java_command, parse_lines

from .fakes import FakeCluster
from .test_proxy import raw_value_table, start_proxy

LOG_START, END, EPOCH = 60, 90, 5


async def java_consumer(port: int, request: dict[str, Any]) -> tuple[int, list[dict[str, Any]], str]:
    try:
        argv = java_command("JavaConsumer", json.dumps({"bootstrap": f"127.0.0.1:{port}", "topic": "t",
                                                        "untilEnd": True, **request}))
    except JvmMissing as exc:
        pytest.fail(str(exc))
    with trio.fail_after(120):
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False, stdin=b"")
    return done.returncode, parse_lines(done.stdout.decode()), done.stderr.decode()


def read(lines: list[dict[str, Any]]) -> list[tuple[int, bytes, int]]:
    """(offset, value, leader epoch) of each record, in the order they came."""
    return [(line["o"], base64.b64decode(line["v"]), line["epoch"]) for line in lines if line["type"] == "record"]


def want(start: int) -> list[tuple[int, bytes, int]]:
    return [(o, b"v%d" % o, -1 if o < LOG_START else EPOCH) for o in range(start, END)]


async def history(nursery: trio.Nursery, tmp_path: Any, grant_sessions: bool = False) -> tuple[FakeCluster, int]:
    props = raw_value_table(tmp_path, "history.t", LOG_START)
    cluster = await FakeCluster.start(nursery, node_ids=(1,))
    cluster.leader_epoch, cluster.grant_sessions = EPOCH, grant_sessions
    cluster.add_log("t", LOG_START, END)
    proxy = await start_proxy(nursery, cluster.brokers[0].port,
                              {"catalog": {"name": "lake", **props}, "topics": [{"name": "t", "table": "history.t"}]})
    return cluster, proxy.bound.bootstrap.port


async def test_seek_with_a_leader_epoch_is_validated_and_reads_on_across_the_seam(
        nursery: trio.Nursery, tmp_path: Any) -> None:
    """The Java client validates a position that carries a leader epoch with OffsetsForLeaderEpoch (ksi
    forwards it to the broker) before it fetches.  The broker's answer for the current epoch is its log end,
    for an older one the log start: neither is below a position in the lake, so no seek is taken for a
    truncation, and the client reads on exactly: lake (epoch -1), seam, broker (epoch 5)."""
    cluster, port = await history(nursery, tmp_path)
    for offset, epoch in ((10, EPOCH), (10, 2), (LOG_START - 3, EPOCH), (LOG_START + 5, EPOCH)):
        cluster.epoch_requests.clear()
        code, lines, err = await java_consumer(port, {"seekEpoch": {"0": [offset, epoch]}})
        assert code == 0, err[-3000:]
        assert read(lines) == want(offset), (offset, epoch)
        assert [line["positions"] for line in lines if line["type"] == "done"] == [{"0": END}]
        assert ("t", 0, EPOCH, epoch) in cluster.epoch_requests, (offset, epoch, cluster.epoch_requests)


async def test_metadata_refreshed_while_reading_across_the_seam(nursery: trio.Nursery, tmp_path: Any) -> None:
    """metadata.max.age.ms of 100 with a slow reader: the Java client refreshes Metadata (leader epoch 5)
    many times while it reads the lake and crosses the seam, and reads every offset once, in order."""
    cluster, port = await history(nursery, tmp_path)
    received_before = len(cluster.brokers[0].received)
    code, lines, err = await java_consumer(port, {"seek": "beginning", "pollSleepMs": 50, "props": {
        "metadata.max.age.ms": "100", "max.poll.records": "4", "max.partition.fetch.bytes": "200"}})
    assert code == 0, err[-3000:]
    assert read(lines) == want(0)
    metadata = [k for k, _ in cluster.brokers[0].received[received_before:] if k == 3]
    assert len(metadata) >= 3, f"{len(metadata)} Metadata requests: the client should have refreshed"


async def test_fetch_sessions_the_broker_grants_are_not_passed_to_the_java_client(
        nursery: trio.Nursery, tmp_path: Any) -> None:
    """ksi answers Fetch with session id 0 and forwards it sessionless (session 0, epoch -1), so the broker
    opens no session and the Java client keeps sending full fetches; were the client's session fields
    forwarded, the broker would open a session the client would then use for incremental fetches, which ksi
    cannot split at the seam.  Here the client reads only the broker's part, where ksi takes nothing out of
    the Fetch."""
    cluster, port = await history(nursery, tmp_path, grant_sessions=True)
    code, lines, err = await java_consumer(port, {"seek": {"0": LOG_START}})
    assert code == 0, err[-3000:]
    assert read(lines) == want(LOG_START)
    assert cluster.fetch_sessions, "the Java client fetched nothing from the broker"
    assert set(cluster.fetch_sessions) == {(0, -1)}, cluster.fetch_sessions
    # and across the seam, where ksi splits the Fetch
    cluster.fetch_sessions.clear()
    code, lines, err = await java_consumer(port, {"seek": "beginning"})
    assert code == 0, err[-3000:]
    assert read(lines) == want(0)
    assert set(cluster.fetch_sessions) == {(0, -1)}, cluster.fetch_sessions
