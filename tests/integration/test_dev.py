"""`ksi dev`, the embedded default, as a user starts it: a demo topic whose first offsets live only in
Iceberg (archived by the Spark pipeline, then deleted from the broker), read from the beginning."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from conftest import REPO_ROOT

from ksi.brokers import free_port

PARTITIONS, RECORDS = 4, 1000


def read_from_beginning(bootstrap: str) -> dict[tuple[int, int], bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "dev-test", "enable.auto.commit": False,
                         "fetch.queue.backoff.ms": 10, "receive.message.max.bytes": 200_000_000})
    consumer.assign([TopicPartition("demo", p, 0) for p in range(PARTITIONS)])
    got: dict[tuple[int, int], bytes] = {}
    deadline = time.monotonic() + 60
    try:
        while len(got) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                got[(message.partition(), message.offset())] = message.value()
    finally:
        consumer.close()
    return got


def test_ksi_dev_serves_a_demo_topic_whose_first_part_is_only_in_iceberg(tmp_path: Path) -> None:
    port, metrics, registry = free_port(), free_port(), free_port()
    log_path = tmp_path / "dev.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "ksi", "dev", "--data-dir", str(tmp_path / "data"), "--port", str(port),
             "--metrics-port", str(metrics), "--registry-port", str(registry)],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"})  # a crash leaves its traceback in the log
    try:
        deadline = time.monotonic() + 240
        while "ksi listening" not in log_path.read_text() and time.monotonic() < deadline:
            assert process.poll() is None, log_path.read_text()[-3000:]
            time.sleep(0.5)
        text = log_path.read_text()
        assert "ksi listening" in text, text[-3000:]
        assert "offsets below 100 per partition only in Iceberg" in text, text[-3000:]
        broker = re.search(r"-> Kafka (127\.0\.0\.1:\d+)", text)
        assert broker is not None

        got = read_from_beginning(f"127.0.0.1:{port}")
        assert len(got) == RECORDS and all((p, 0) in got for p in range(PARTITIONS))
        assert all(value[:1] == b"\x00" for value in got.values())  # Avro in Schema Registry framing

        direct = Consumer({"bootstrap.servers": broker.group(1), "group.id": "dev-probe"})
        try:
            starts = [direct.get_watermark_offsets(TopicPartition("demo", p), timeout=10)[0] for p in range(PARTITIONS)]
        finally:
            direct.close()
        assert all(start >= 100 for start in starts)  # Kafka alone no longer has the first offsets
        direct_records = {k: v for k, v in got.items() if k[1] >= 150}
        assert direct_records  # and the rest came from the broker, through the same consumer
    finally:
        process.send_signal(signal.SIGINT)
        try:
            assert process.wait(timeout=30) == 0, log_path.read_text()[-3000:]
        finally:
            if process.poll() is None:
                process.kill()
