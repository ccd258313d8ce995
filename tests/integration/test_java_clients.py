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
from pathlib import Path
from typing import Any

import pytest

import test_seam as seam
from clients import Record
from jvm_programs import JvmMissing, java_command, parse_lines, run_lines
from ksi.brokers import BrokerProcess, start_tansu
from test_auth import SECRET_PASSWORD
from test_history import BASE_TS, PARTITIONS, PER_PARTITION, archive
from test_history_clients import history_topic, table_of
from test_tls import pki  # noqa: F401 (a fixture)
from tests.shapes import write_table

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
    for ts, offset in zip(stamps, (42, 99, 100, 150), strict=True):
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
    """A position with a leader epoch (from a hot record, or a commit made after one) moved into the lake.
    The Java client would validate it with OffsetsForLeaderEpoch before fetching when it knows the
    partition leader's epoch; noida-db's Metadata gives none (leader_epoch -1) and tansu offers no
    OffsetsForLeaderEpoch, so here it fetches at once.  ksi forwards OffsetsForLeaderEpoch untouched; a
    Kafka broker answers an epoch older than its cache with the first cached epoch's start offset, which
    is at or past the log start, so a cold position is never taken for a truncation."""
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


def java_refused(main: str, request: dict[str, Any], timeout: float = 90) -> tuple[str, str]:
    """Run a program that must fail: its stdout and stderr."""
    try:
        argv = java_command(main, json.dumps(request))
    except JvmMissing as exc:
        pytest.fail(str(exc))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode != 0, f"{main} should have failed:\n{done.stdout[-2000:]}"
    return done.stdout, done.stderr


def test_tls_as_the_java_client_does_it(noida: BrokerProcess, ksi_proxy: Any, catalog: Any,
                                        pki: dict[str, tuple[str, str]]) -> None:  # noqa: F811 - the fixture
    """ksi's TLS listener with a client certificate required, and the Java client's own TLS (JSSE) with
    PEM trust and key stores and hostname verification (its default), across the seam."""
    lake, props = catalog
    topic, originals = history_topic(noida, lake, "javatls", archived_below=120, log_start=LOG_START)
    (ca, _), (server_cert, server_key), (client_cert, client_key) = pki["ca"], pki["server"], pki["client"]
    proxy = proxy_for(ksi_proxy, noida, props, {"name": topic},
                      proxy={"tls": {"cert_file": server_cert, "key_file": server_key, "ca_file": ca,
                                     "require_client_cert": True}})
    keystore = Path(client_cert).with_name("client-keystore.pem")  # Kafka's PEM keystore: key + chain
    keystore.write_text(Path(client_key).read_text() + Path(client_cert).read_text())
    tls = {"security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.location": ca}
    with_cert = {**tls, "ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore)}
    lines = java("JavaConsumer", {"bootstrap": proxy.bootstrap, "topic": topic, "seek": "beginning",
                                  "untilEnd": True, "props": with_cert})
    assert records_of(lines) == originals
    # Without a client certificate the handshake fails, and nothing is read.
    out, err = java_refused("JavaConsumer", {"bootstrap": proxy.bootstrap, "topic": topic, "seek": "beginning",
                                             "untilEnd": True, "metadataMs": 5000, "props": tls})
    assert '"record"' not in out and ("SSL" in err or "TimeoutException" in err), err[-2000:]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_sasl_as_the_java_client_does_it(mechanism: str, ksi_proxy: Any, catalog: Any, tmp_path: Path) -> None:
    """SASL from the Java client passes through ksi to the broker on the client's own connection.  The
    only enforcing broker installable here (tansu --authentication) offers only SCRAM and can hold no
    users (see test_auth.py), so what is tested against it is a login the broker refuses, each way the
    broker refuses it: PLAIN is not offered (tansu logs NoSharedMechanism and closes the connection, as it
    does without ksi), SCRAM for an unknown user fails (SaslAuthenticationException, the broker's verdict).
    Either way: no records, hot or cold.  A PLAIN login the broker accepts, with the Java client, is
    tested against the fake broker (tests/ksi/test_java_sasl_plain.py)."""
    lake, props = catalog
    archive(lake, "history.secret", {(0, o): {"timestamp": (1, BASE_TS + o), "key": b"k", "value": b"secret-%d" % o,
                                               "headers": None} for o in range(20)}, below=20)
    broker = start_tansu(log_path=tmp_path / "tansu-auth.log", authentication=True)
    try:
        proxy = ksi_proxy(broker, catalog={"name": "lake", **props},
                          topics=[{"name": "secret", "table": "history.secret", "prefer_lake": True}])
        module = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}[mechanism]
        sasl = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
                "sasl.jaas.config": f'{module} required username="mallory" password="{SECRET_PASSWORD}";',
}
        out, err = java_refused("JavaConsumer", {"bootstrap": proxy.bootstrap, "topic": "secret",
                                                 "seek": "beginning", "untilEnd": True, "metadataMs": 20000,
                                                 "props": sasl})
        assert '"record"' not in out and "secret-" not in out
        if mechanism == "PLAIN":
            assert "terminated during authentication" in err, err[-3000:]
            assert "NoSharedMechanism" in broker.log_path.read_text(errors="replace")
        else:
            assert "SaslAuthenticationException" in err, err[-3000:]
        assert SECRET_PASSWORD not in proxy.log_text()
    finally:
        broker.stop()


def test_read_committed_across_a_seam_hole_of_commit_markers(noida: BrokerProcess, ksi_proxy: Any,
                                                             catalog: Any) -> None:
    """A topic a transactional producer wrote (nine records and a commit marker per ten offsets), archived by
    ksi below the log start 100, so the lake ends at offset 98 and offset 99 is a marker no table holds.
    ksi steps the Java client over it with a control batch: under both isolation levels every record comes
    once, tombstones included, the seam is crossed, and the position ends at the high watermark (130)."""
    lake, props = catalog
    topic = f"javaseam-{uuid.uuid4().hex[:6]}"
    produced = seam.produce_transactions(noida, topic)
    table = table_of(topic)
    layout, options, _, _ = seam.WRITERS["ksi"]
    write_table(lake, table, seam.lake_records(produced, drop_tombstones=False), layout=layout, **options)
    for p in range(seam.PARTITIONS):
        noida.delete_records(topic, p, seam.LOG_START)
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props}, topics=[{"name": topic, "table": table,
                                                                         "layout": layout}])
    want = {key: (value, ts) for key, (value, ts) in produced.items()}
    assert max(o for _, o in want if o < seam.LOG_START) == seam.LOG_START - 2  # the marker at 99 is the hole
    for isolation in ("read_committed", "read_uncommitted"):
        lines = java("JavaConsumer", {"bootstrap": proxy.bootstrap, "topic": topic, "seek": "beginning",
                                      "untilEnd": True, "props": {"isolation.level": isolation}})
        got: dict[tuple[int, int], tuple[bytes | None, int]] = {}
        for line in lines:
            if line["type"] == "record":
                assert (line["p"], line["o"]) not in got, (isolation, line["p"], line["o"])
                got[(line["p"], line["o"])] = (unb64(line["v"]), line["ts"])
        assert got == want, (isolation, sorted(set(got) ^ set(want))[:10])
        (done,) = [line for line in lines if line["type"] == "done"]
        assert done["positions"] == {str(p): seam.PER_PARTITION for p in range(seam.PARTITIONS)}, isolation


def test_group_protocol_consumer_is_refused_with_a_clear_error(noida: BrokerProcess, ksi_proxy: Any,
                                                               catalog: Any) -> None:
    """KIP-848's consumer group protocol (group.protocol=consumer) needs ConsumerGroupHeartbeat (API 68),
    which ksi leaves out of its ApiVersions answer (its codec, kafka-python's, has no message for it).  The
    Java client's heartbeat then fails fatally and its first poll throws UnsupportedVersionException ("The
    node does not support CONSUMER_GROUP_HEARTBEAT"): no record read, no hang.  The classic protocol works
    (test_group_joins_commits_rebalances_and_resumes_across_the_seam)."""
    lake, props = catalog
    topic, _ = history_topic(noida, lake, "java848", archived_below=120, log_start=LOG_START)
    proxy = proxy_for(ksi_proxy, noida, props, {"name": topic})
    out, err = java_refused("JavaConsumer", {"bootstrap": proxy.bootstrap, "topic": topic,
                                             "group": f"java848-{uuid.uuid4().hex[:6]}", "count": 10,
                                             "props": {"group.protocol": "consumer"}})
    assert '"record"' not in out
    assert "UnsupportedVersionException: The node does not support CONSUMER_GROUP_HEARTBEAT" in err, err[-3000:]
