"""`ksi dev`, the embedded default, as a user starts it: a demo topic whose first offsets live only in
Iceberg (archived by the Spark pipeline, then deleted from the broker), read from the beginning; its steps
and banner; and its life cycle: kill -9 leaves nothing running, the next start on the same directory
needs no Spark job, and a second ksi dev on the same directory is refused."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from dev_run import REPO_ROOT, DevRun

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


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_ksi_dev_serves_a_demo_topic_whose_first_part_is_only_in_iceberg(ksi_dev: DevRun) -> None:
    text = ksi_dev.log()
    steps = re.findall(r"ksi\.dev: \[(\d)/6\]", text)
    assert steps[:6] == ["1", "2", "3", "4", "5", "6"], text[-3000:]
    assert "offsets below 100 per partition only in Iceberg" in text, text[-3000:]
    assert text.index("ksi listening") < text.index("ksi dev is up")  # up only after the proxy answered
    broker = re.search(r"broker \(direct, without history\): (127\.0\.0\.1:\d+)", text)
    assert broker is not None, text[-3000:]
    assert f"--registry {ksi_dev.registry_url}" in text  # the banner's consumer command is complete

    got = read_from_beginning(ksi_dev.bootstrap)
    assert len(got) == RECORDS and all((p, 0) in got for p in range(PARTITIONS))
    assert all(value[:1] == b"\x00" for value in got.values())  # Avro in Schema Registry framing

    direct = Consumer({"bootstrap.servers": broker.group(1), "group.id": "dev-probe"})
    try:
        starts = [direct.get_watermark_offsets(TopicPartition("demo", p), timeout=10)[0] for p in range(PARTITIONS)]
    finally:
        direct.close()
    assert all(start >= 100 for start in starts)  # Kafka alone no longer has the first offsets
    assert {k: v for k, v in got.items() if k[1] >= 150}  # and the rest came from the broker


def test_ksi_dev_after_kill_9_leaves_nothing_and_restarts_without_spark(ksi_dev: DevRun) -> None:
    children = ksi_dev.children()
    assert children[0]["name"] == "broker (noida-db)"
    assert ksi_dev.process is not None
    ksi_dev.process.send_signal(signal.SIGKILL)
    ksi_dev.process.wait()
    deadline = time.monotonic() + 10
    while any(alive(int(c["pid"])) for c in children) and time.monotonic() < deadline:  # type: ignore[call-overload]
        time.sleep(0.1)
    assert not [c for c in children if alive(int(c["pid"]))], children  # type: ignore[call-overload]

    text = ksi_dev.start()  # same directory and ports
    assert "no Spark job needed" in text and "(kept from an earlier run)" in text, text[-3000:]
    assert len(read_from_beginning(ksi_dev.bootstrap)) == RECORDS

    second = subprocess.run([sys.executable, "-m", "ksi", "dev", "--data-dir", str(ksi_dev.data_dir), "--port", "0"],
                            capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, env=ksi_dev.env(), check=False)
    assert second.returncode == 1
    assert second.stderr.strip() == (f"ksi dev: another ksi dev (pid {ksi_dev.process.pid}) is running with"
                                     f" {ksi_dev.data_dir}: stop it (Ctrl-C, or kill {ksi_dev.process.pid}) or give"
                                     " this one another --data-dir")
