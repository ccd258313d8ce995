"""The subprocess drivers: kafkajs (``kafkajs_client.js`` under node) and Debian's ``kcat``."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clients import (
    CONSUME_TIMEOUT_S,
    FETCH_MAX_WAIT_MS,
    HEARTBEAT_INTERVAL_MS,
    INSTALL_HINT,
    RECEIVE_MESSAGE_MAX_BYTES,
    SESSION_TIMEOUT_MS,
    Client,
    ClientMissing,
    Consumed,
    Record,
)

__all__ = ["KafkajsClient", "KcatClient", "make"]

HERE = Path(__file__).resolve().parent
PROCESS_TIMEOUT_S = CONSUME_TIMEOUT_S + 20


def make(name: str, broker_kind: str) -> Client:
    if name == "kafkajs":
        return KafkajsClient(broker_kind)
    if name == "kcat":
        return KcatClient(broker_kind)
    raise ValueError(name)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _run(argv: list[str], what: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        stderr = (exc.stderr or b"").decode(errors="replace")[-3000:]
        raise AssertionError(f"{what} did not finish in {PROCESS_TIMEOUT_S:.0f} s; stderr:\n{stderr}") from None
    if done.returncode != 0:
        raise AssertionError(
            f"{what} exited with {done.returncode}\nstdout: {done.stdout.decode(errors='replace')[-3000:]}\n"
            f"stderr: {done.stderr.decode(errors='replace')[-3000:]}"
        )
    return done


class KafkajsClient:
    name = "kafkajs"
    text_only = False

    def __init__(self, broker_kind: str) -> None:
        self.broker_kind = broker_kind
        self.node = shutil.which("node")
        if self.node is None:
            raise ClientMissing(f"kafkajs needs `node` on PATH (Debian: apt-get install nodejs npm); {INSTALL_HINT}")
        if not (HERE / "node_modules" / "kafkajs" / "package.json").is_file():
            raise ClientMissing(f"kafkajs is not installed in {HERE}/node_modules: {INSTALL_HINT}")

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.node is not None
        done = _run([self.node, str(HERE / "kafkajs_client.js"), json.dumps(request)], f"kafkajs {request['op']}")
        answer: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
        return answer

    def produce(self, bootstrap: str, topic: str, records: Sequence[Record]) -> None:
        self._call({
            "op": "produce",
            "brokers": [bootstrap],
            "topic": topic,
            "idempotent": False,
            "records": [
                {"key": _b64(r.key), "value": _b64(r.value), "headers": [[k, _b64(v)] for k, v in r.headers]}
                for r in records
            ],
        })

    def consume(self, bootstrap: str, topic: str, group: str, count: int) -> list[Consumed]:
        answer = self._call({
            "op": "consume",
            "brokers": [bootstrap],
            "topic": topic,
            "groupId": group,
            "count": count,
            "timeoutMs": int(CONSUME_TIMEOUT_S * 1000),
            "sessionTimeout": SESSION_TIMEOUT_MS,
            "heartbeatInterval": HEARTBEAT_INTERVAL_MS,
            "maxWaitTimeInMs": FETCH_MAX_WAIT_MS,
        })
        out = []
        for r in answer["records"]:
            headers = tuple((name, _unb64(value) or b"") for name, value in r["headers"])
            value = _unb64(r["value"])
            assert value is not None, f"kafkajs returned a null value: {r}"
            out.append(Consumed(Record(_unb64(r["key"]), value, headers), r["partition"], r["offset"]))
        return out

    def topics(self, bootstrap: str) -> dict[str, int]:
        topics: dict[str, int] = self._call({"op": "metadata", "brokers": [bootstrap]})["topics"]
        return topics


class KcatClient:
    """Debian's kcat 1.7 (librdkafka 2.0).  Keys and values are lines of text; ``-H`` gives every record
    of one invocation the same headers."""

    name = "kcat"
    text_only = True
    KEY_DELIMITER = "\t"

    def __init__(self, broker_kind: str) -> None:
        self.broker_kind = broker_kind
        kcat = shutil.which("kcat")
        if kcat is None:
            raise ClientMissing(f"`kcat` is not on PATH (Debian package kcat): {INSTALL_HINT}")
        self.kcat = kcat

    def _base(self, bootstrap: str) -> list[str]:
        return [self.kcat, "-b", bootstrap, "-q", "-m", "15",
                "-X", f"receive.message.max.bytes={RECEIVE_MESSAGE_MAX_BYTES}"]

    def produce(self, bootstrap: str, topic: str, records: Sequence[Record]) -> None:
        headers = {r.headers for r in records}
        assert len(headers) == 1, "kcat gives every record of one call the same headers"
        lines = []
        for r in records:
            assert r.key is not None and self.KEY_DELIMITER.encode() not in r.key + r.value
            assert b"\n" not in r.key + r.value
            lines.append(r.key + self.KEY_DELIMITER.encode() + r.value + b"\n")
        argv = self._base(bootstrap) + ["-P", "-t", topic, "-K", "\\t", "-X", "linger.ms=5"]
        for name, value in headers.pop():
            argv += ["-H", f"{name}={value.decode()}"]
        _run(argv, "kcat -P", stdin=b"".join(lines))

    def consume(self, bootstrap: str, topic: str, group: str, count: int) -> list[Consumed]:
        argv = self._base(bootstrap) + [
            "-G", group, "-J", "-c", str(count),  # no -o: in -G mode it overrides the committed offsets
            "-X", "auto.offset.reset=earliest",
            "-X", f"session.timeout.ms={SESSION_TIMEOUT_MS}",
            "-X", f"heartbeat.interval.ms={HEARTBEAT_INTERVAL_MS}",
            "-X", f"fetch.wait.max.ms={FETCH_MAX_WAIT_MS}",
            topic,
        ]
        done = _run(argv, "kcat -G")
        out = []
        for line in done.stdout.decode().splitlines():
            if not line.strip():
                continue
            msg = json.loads(line)
            flat = msg.get("headers") or []
            headers = tuple((flat[i], flat[i + 1].encode()) for i in range(0, len(flat), 2))
            key = None if msg["key"] is None else msg["key"].encode()
            out.append(Consumed(Record(key, msg["payload"].encode(), headers), msg["partition"], msg["offset"]))
        return out

    def topics(self, bootstrap: str) -> dict[str, int]:
        done = _run(self._base(bootstrap) + ["-L", "-J"], "kcat -L")
        metadata = json.loads(done.stdout.decode())
        return {t["topic"]: len(t["partitions"]) for t in metadata["topics"]}
