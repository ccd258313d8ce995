"""ksi.brokers: the launcher the tests, ``ksi dev`` and the benchmark stand on."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ksi.brokers import BrokerError, BrokerProcess, find_noida, find_tansu, free_port, start_noida, start_tansu


def produce(broker: BrokerProcess, topic: str, count: int, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1})
    for i in range(count):
        producer.produce(topic, value=f"v{i}".encode(), partition=partition)
    assert producer.flush(15) == 0


def watermarks(broker: BrokerProcess, topic: str, partition: int = 0) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watermarks"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        return low, high
    finally:
        consumer.close()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def wait_group_gone(pgid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group_alive(pgid)


def test_binaries_are_found() -> None:
    assert Path(find_tansu()).name == "tansu" and os.access(find_tansu(), os.X_OK)
    assert Path(find_noida()).name == "noida-db" and os.access(find_noida(), os.X_OK)


def test_noida_keeps_data_across_restart_and_deletes_records(tmp_path: Path) -> None:
    with start_noida(tmp_path / "data") as broker:
        assert broker.bootstrap == f"127.0.0.1:{broker.port}"
        broker.create_topic("kept", 2)
        broker.create_topic("kept", 2)  # exists already: fine
        produce(broker, "kept", 10)
        broker.delete_records("kept", 0, 4)
        assert watermarks(broker, "kept") == (4, 10)

        port, pgid = broker.port, broker.process.pid if broker.process else -1
        broker.restart()
        assert broker.port == port and broker.running
        assert wait_group_gone(pgid), "the old process group outlived restart()"
        assert watermarks(broker, "kept") == (4, 10)
    assert not broker.running
    broker.stop()  # idempotent


def test_tansu_kill_and_restart_starts_empty(tmp_path: Path) -> None:
    broker = start_tansu(log_path=tmp_path / "tansu.log")
    try:
        broker.create_topic("gone", 1)
        produce(broker, "gone", 3)
        with pytest.raises(NotImplementedError):
            broker.delete_records("gone", 0, 1)
        assert broker.process is not None
        pgid = broker.process.pid
        broker.kill()
        assert not broker.running and wait_group_gone(pgid)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", broker.port), timeout=1).close()
        broker.start()
        broker.create_topic("gone", 1)  # memory only: the topic went with the process
        assert "gone" in Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x"}).list_topics(
            timeout=10).topics
    finally:
        broker.stop()
    assert "listening on" in (tmp_path / "tansu.log").read_text()


def test_start_failure_reports_the_log_tail(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BrokerError) as info:
            start_tansu(port=port, log_path=tmp_path / "busy.log")
    message = str(info.value)
    assert "busy.log" in message and "tansu" in message


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_stop_signals_the_whole_group(tmp_path: Path) -> None:
    broker = start_noida(tmp_path / "data")
    assert broker.process is not None
    pgid = broker.process.pid
    assert os.getpgid(broker.process.pid) == pgid, "broker must lead its own process group"
    broker.stop(timeout=5)
    assert wait_group_gone(pgid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
