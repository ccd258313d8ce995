"""The JVM and Go drivers: the Apache Kafka Java client (kafka-clients 3.9.1; ``JavaProducer`` and
``JavaConsumer`` in tests/integration/java) and Go's Sarama (Debian's 1.22.1; tests/integration/go/sarama),
built and cached by ``jvm_programs``."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from clients import CONSUME_TIMEOUT_S, Client, ClientMissing, Consumed, Record
from jvm_programs import JvmMissing, go_binary, java_command, run_lines

__all__ = ["JavaClient", "SaramaClient", "make"]

PROCESS_TIMEOUT_S = CONSUME_TIMEOUT_S + 30  # a JVM's start on a loaded machine included
SARAMA_VERSION = "2.1.0"  # Fetch v10 and Produce v7: record batches with headers


def make(name: str, broker_kind: str) -> Client:
    try:
        if name == "java":
            return JavaClient(broker_kind)
        if name == "sarama":
            return SaramaClient(broker_kind)
    except JvmMissing as exc:
        raise ClientMissing(str(exc)) from None
    raise ValueError(name)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _wire(records: Sequence[Record]) -> list[dict[str, Any]]:
    return [{"k": _b64(r.key), "v": _b64(r.value), "h": [[k, _b64(v)] for k, v in r.headers]} for r in records]


def _consumed(lines: list[dict[str, Any]]) -> list[Consumed]:
    out = []
    for line in lines:
        if line["type"] == "record":
            value = _unb64(line["v"])
            assert value is not None, f"null value: {line}"
            headers = tuple((k, _unb64(v) or b"") for k, v in line["h"])
            out.append(Consumed(Record(_unb64(line["k"]), value, headers), line["p"], line["o"]))
    return out


class JavaClient:
    name = "java"
    text_only = False

    def __init__(self, broker_kind: str) -> None:
        self.broker_kind = broker_kind
        java_command("JavaConsumer")  # raises JvmMissing now, not in the middle of a test

    def _run(self, main: str, request: dict[str, Any]) -> list[dict[str, Any]]:
        return run_lines(java_command(main, json.dumps(request)), f"java {main} {request.get('op', '')}",
                         PROCESS_TIMEOUT_S)

    def produce(self, bootstrap: str, topic: str, records: Sequence[Record]) -> None:
        (done,) = self._run("JavaProducer", {"op": "produce", "bootstrap": bootstrap, "topic": topic,
                                             "records": _wire(records)})
        assert done["count"] == len(records) and not done["errors"], done

    def consume(self, bootstrap: str, topic: str, group: str, count: int) -> list[Consumed]:
        lines = self._run("JavaConsumer", {"bootstrap": bootstrap, "topic": topic, "group": group, "count": count,
                                           "commit": True, "idleMs": int(CONSUME_TIMEOUT_S * 1000),
                                           "props": {"max.poll.records": str(min(count, 500))}})
        refused = [line for line in lines if line["type"] == "commit" and line["error"] is not None]
        assert not refused, refused
        return _consumed(lines)

    def topics(self, bootstrap: str) -> dict[str, int]:
        (line,) = self._run("JavaProducer", {"op": "topics", "bootstrap": bootstrap})
        topics: dict[str, int] = line["topics"]
        return topics


class SaramaClient:
    name = "sarama"
    text_only = False

    def __init__(self, broker_kind: str) -> None:
        self.broker_kind = broker_kind
        self.binary = str(go_binary("sarama"))

    def _run(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        request = {"version": SARAMA_VERSION, "timeoutMs": int(CONSUME_TIMEOUT_S * 1000), **request}
        return run_lines([self.binary, json.dumps(request)], f"sarama {request['mode']}", PROCESS_TIMEOUT_S)

    def produce(self, bootstrap: str, topic: str, records: Sequence[Record]) -> None:
        (done,) = self._run({"mode": "produce", "bootstrap": bootstrap, "topic": topic, "records": _wire(records)})
        assert done["count"] == len(records), done

    def consume(self, bootstrap: str, topic: str, group: str, count: int) -> list[Consumed]:
        return _consumed(self._run({"mode": "group", "bootstrap": bootstrap, "topic": topic, "group": group,
                                    "count": count}))

    def topics(self, bootstrap: str) -> dict[str, int]:
        (line,) = self._run({"mode": "topics", "bootstrap": bootstrap})
        topics: dict[str, int] = line["topics"]
        return topics
