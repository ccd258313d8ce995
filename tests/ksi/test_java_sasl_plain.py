"""SASL/PLAIN as the Java client does it (kafka-clients 3.9.1: SaslHandshake v1, then the PLAIN token in a
SaslAuthenticate v2), through ksi, with a login the broker accepts.  No broker installable here keeps
users (tests/integration/test_auth.py), so the broker is the fake one, which accepts PLAIN logins; the
client is the real Java client, run as a process (tests/integration/java/JavaConsumer.java).  The
principal ksi learns from the exchange decides who may read a lake-only topic (lake_only_readers)."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest
import trio

from tests.integration.jvm_programs import JvmMissing, java_command, parse_lines

from .fakes import FakeCluster
from .test_proxy import raw_value_table, start_proxy

PASSWORDS = {"alice": "alice-Java-Secret-1", "bob": "bob-Java-Secret-2"}


async def java_consumer(port: int, user: str, password: str) -> tuple[int, list[dict[str, Any]], str]:
    sasl = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
                                f'username="{user}" password="{password}";',
            "default.api.timeout.ms": "20000"}
    try:
        argv = java_command("JavaConsumer", json.dumps({"bootstrap": f"127.0.0.1:{port}", "topic": "lo",
                                                        "seek": "beginning", "untilEnd": True, "props": sasl}))
    except JvmMissing as exc:
        pytest.fail(str(exc))
    with trio.fail_after(90):
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False,
                                      stdin=b"")
    return done.returncode, parse_lines(done.stdout.decode()), done.stderr.decode()


async def test_java_client_logs_in_with_plain_and_reads_a_lake_only_topic(
        nursery: trio.Nursery, tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    props = raw_value_table(tmp_path, "history.open", 10)
    cluster = await FakeCluster.start(nursery)
    cluster.topics, cluster.users = ["t"], dict(PASSWORDS)
    proxy = await start_proxy(nursery, cluster.brokers[0].port, {"catalog": {"name": "lake", **props}, "topics": [
        {"name": "lo", "table": "history.open", "lake_only_readers": ["User:alice"]}]})
    with trio.fail_after(10):
        while proxy.history.lake_only != {"lo"}:
            await trio.sleep(0.05)
    port = proxy.bound.bootstrap.port

    code, lines, err = await java_consumer(port, "alice", PASSWORDS["alice"])
    assert code == 0, err[-3000:]
    records = [(line["p"], line["o"], line["v"]) for line in lines if line["type"] == "record"]
    assert records == [(0, o, base64.b64encode(b"v%d" % o).decode()) for o in range(10)]

    code, lines, err = await java_consumer(port, "bob", PASSWORDS["bob"])  # logged in, not on the list
    assert code != 0 and not [line for line in lines if line["type"] == "record"]
    assert "TopicAuthorizationException" in err, err[-3000:]

    code, lines, err = await java_consumer(port, "alice", "wrong")
    assert code != 0 and "SaslAuthenticationException" in err, err[-3000:]

    text = caplog.text
    assert "authenticated the client as User:alice" in text
    for secret in (*PASSWORDS.values(), "wrong\""):
        assert secret not in text
