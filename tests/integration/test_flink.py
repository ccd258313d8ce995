"""Flink backfills through ksi: the job in examples/flink-backfill (a KafkaSource from the earliest offset,
flink-connector-kafka 4.0.1-2.0 on Flink 2.0.0) run on one in-process MiniCluster, on a noida-db topic
whose offsets below the broker's log start exist only in an Iceberg table.

* bounded (earliest -> the end offsets at start): every offset once, lake then log, then the job finishes;
* unbounded: starts in the lake, crosses the seam, keeps reading records produced while it runs (through
  ksi), and is stopped once it has all of them.

What the Kafka source does beyond a plain consumer: it lists partitions through an AdminClient
(describeTopics, and listOffsets for EARLIEST and LATEST, to set starting and stopping offsets) and
assigns them to readers itself, without a consumer group, and its split readers seek to those offsets."""

from __future__ import annotations

import base64
import subprocess
import threading
import time
import urllib.request
from typing import Any

import pytest
from confluent_kafka import Producer

from jvm_programs import JvmMissing, java_command, parse_lines
from ksi.brokers import BrokerProcess
from test_history import BASE_TS, PARTITIONS, PER_PARTITION
from test_history_clients import history_topic, table_of

LOG_START = 100
MORE = 50  # records per partition produced while the unbounded job runs


def lines_of(text: list[str]) -> list[dict[str, Any]]:
    return parse_lines("".join(text))


def records(lines: list[dict[str, Any]]) -> dict[tuple[int, int], tuple[bytes | None, bytes | None, int]]:
    got: dict[tuple[int, int], tuple[bytes | None, bytes | None, int]] = {}
    for line in lines:
        if "p" in line:
            key = (line["p"], line["o"])
            assert key not in got, f"duplicate record at {key}"
            got[key] = (None if line["k"] is None else base64.b64decode(line["k"]),
                        None if line["v"] is None else base64.b64decode(line["v"]), line["ts"])
    return got


def test_bounded_and_unbounded_backfills_across_the_seam(noida: BrokerProcess, ksi_proxy: Any,
                                                         catalog: Any) -> None:
    lake, props = catalog
    topic, originals = history_topic(noida, lake, "flink", archived_below=120, log_start=LOG_START)
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props},
                      topics=[{"name": topic, "table": table_of(topic), "layout": "ksi"}])
    expected = {k: (r.key, r.value, BASE_TS + k[1] * 1000) for k, r in originals.items()}
    job = ["KsiBackfill", "--bootstrap", proxy.bootstrap, "--topic", topic]
    try:
        argv = java_command("FlinkRun", *job, "--then", *job, "--mode", "unbounded", heap="768m")
    except JvmMissing as exc:
        pytest.fail(str(exc))
    flink = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    err: list[str] = []
    threads = [threading.Thread(target=lambda s=s, into=into: into.extend(iter(s.readline, "")), daemon=True)
               for s, into in ((flink.stdout, out), (flink.stderr, err))]
    for t in threads:
        t.start()

    def wait_for(what: str, done: Any, timeout: float = 120) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = lines_of(out)
            if done(lines):
                return lines
            if flink.poll() is not None:
                time.sleep(0.5)  # the readers' last lines
                lines = lines_of(out)
                if done(lines):
                    return lines
                break
            time.sleep(0.2)
        flink.kill()
        raise AssertionError(f"Flink: {what} did not happen (exit {flink.poll()}); last output:\n"
                             f"{''.join(out[-5:])}\nstderr:\n{''.join(err)[-4000:]}")

    try:
        # The bounded backfill: earliest (the lake's first offset) to the end offsets at start, then done.
        lines = wait_for("the bounded job's end", lambda ls: any(x.get("type") == "finished" for x in ls))
        finished = next(i for i, x in enumerate(lines) if x.get("type") == "finished")
        assert records(lines[:finished]) == expected

        # The unbounded job reads the same history, crosses the seam, and takes new records as they come.
        lines = wait_for("the unbounded job reaching the seam",
                         lambda ls: len(records(ls[finished + 1:])) >= len(expected))
        assert records(lines[finished + 1:]) == expected
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 5})
        for p in range(PARTITIONS):
            for i in range(MORE):
                offset = PER_PARTITION + i
                producer.produce(topic, key=f"late-{p}-{i}".encode(), value=f"after the start {offset}".encode(),
                                 partition=p, timestamp=BASE_TS + offset * 1000)
        assert producer.flush(30) == 0
        more = {(p, PER_PARTITION + i): (f"late-{p}-{i}".encode(), f"after the start {PER_PARTITION + i}".encode(),
                                         BASE_TS + (PER_PARTITION + i) * 1000)
                for p in range(PARTITIONS) for i in range(MORE)}
        lines = wait_for("the unbounded job reading the new records",
                         lambda ls: len(records(ls[finished + 1:])) >= len(expected) + len(more))
        assert records(lines[finished + 1:]) == {**expected, **more}
        assert flink.stdin is not None
        flink.stdin.write("stop\n")
        flink.stdin.flush()
        assert flink.wait(60) == 0, "".join(err)[-4000:]
    finally:
        if flink.poll() is None:
            flink.kill()
            flink.wait()
    for t in threads:
        t.join(10)
    assert any(x.get("type") == "cancelled" for x in lines_of(out))
    metrics = urllib.request.urlopen(proxy.metrics_url).read().decode()
    assert f'ksi_cold_fetches_total{{topic="{topic}"}}' in metrics  # the history came from the lake
