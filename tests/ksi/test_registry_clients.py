"""Every request confluent-kafka's serializers make in ordinary produce and consume is answered as Confluent's
registry answers it, and none of them logs a WARNING: the sync and async Avro serializer and deserializer
(default settings, use.latest.version, auto-registration off), the association lookups of their default
subject name strategy, and the registry client's own listing calls."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import AsyncSchemaRegistryClient, SchemaRegistryClient
from confluent_kafka.schema_registry._async.avro import AsyncAvroDeserializer, AsyncAvroSerializer
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from ksi.registry import RegistryServer, start_registry

SCHEMA = json.dumps({"type": "record", "name": "Reading", "namespace": "plant",
                     "fields": [{"name": "sensor", "type": "string"}, {"name": "value", "type": "double"}]})
RECORD = {"sensor": "t1", "value": 21.5}
ANSWERED = re.compile(r"schema registry (\w+) (\S+) -> (\d+)")


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryServer]:
    server = start_registry("127.0.0.1", 0, tmp_path / "registry")
    try:
        yield server
    finally:
        server.stop()


def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("ksi") and r.levelno >= logging.WARNING]


def produce_and_consume(url: str, topic: str) -> None:
    ctx = SerializationContext(topic, MessageField.VALUE)
    with SchemaRegistryClient({"url": url}) as producer_side, SchemaRegistryClient({"url": url}) as consumer_side:
        value = AvroSerializer(producer_side, SCHEMA)(RECORD, ctx)
        assert value is not None and value[0] == 0
        assert AvroDeserializer(consumer_side)(value, ctx) == RECORD
        # a producer that only uses what is registered, and one that follows the latest version
        for conf in ({"auto.register.schemas": False}, {"auto.register.schemas": False, "use.latest.version": True}):
            again = AvroSerializer(consumer_side, SCHEMA, conf=conf)(RECORD, ctx)
            assert again == value
        assert consumer_side.get_subjects() == [f"{topic}-value"]
        assert consumer_side.get_latest_version(f"{topic}-value").version == 1
        assert consumer_side.get_compatibility() == "BACKWARD"


async def produce_and_consume_async(url: str, topic: str) -> None:
    ctx = SerializationContext(topic, MessageField.VALUE)
    client = AsyncSchemaRegistryClient({"url": url})
    serializer = await AsyncAvroSerializer(client, SCHEMA)
    value = await serializer(RECORD, ctx)
    deserializer = await AsyncAvroDeserializer(AsyncSchemaRegistryClient({"url": url}))
    assert await deserializer(value, ctx) == RECORD


def test_async_serializers_get_only_answers_and_no_warning(registry: RegistryServer,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="ksi.registry")
    asyncio.run(produce_and_consume_async(registry.url, "readings-async"))
    statuses = [int(m[3]) for r in caplog.records if (m := ANSWERED.search(r.getMessage()))]
    assert statuses and all(status == 200 for status in statuses), caplog.text
    assert warnings_logged(caplog) == []


def test_every_request_of_an_ordinary_run_is_answered_200(registry: RegistryServer,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="ksi.registry")
    produce_and_consume(registry.url, "orders")
    seen = [(m[1], m[2].split("?")[0], int(m[3])) for r in caplog.records if (m := ANSWERED.search(r.getMessage()))]
    assert ("GET", "/associations/resources/-/orders", 200) in seen  # the default subject name strategy's lookup
    assert [s for s in seen if s[2] != 200] == []
    assert warnings_logged(caplog) == []


def call(registry: RegistryServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(registry.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_associations_read_as_confluent_answers_when_there_are_none(registry: RegistryServer) -> None:
    assert call(registry, "GET", "/associations/resources/-/orders?resourceType=topic&associationType=value") \
        == (200, [])
    assert call(registry, "GET", "/associations/resources/lkc-1/orders") == (200, [])
    assert call(registry, "GET", "/associations/resources/some-id") == (200, [])
    assert call(registry, "GET", "/associations/subjects/orders-value") == (200, [])
    assert call(registry, "DELETE", "/associations/resources/some-id") == (
        404, {"error_code": 40410, "message": "Association for 'some-id' not found."})
    status, body = call(registry, "POST", "/associations", {"resourceName": "orders", "resourceNamespace": "-",
                                                            "associations": [{"subject": "orders-value"}]})
    assert status == 422 and body["error_code"] == 42205 and "not supported" in body["message"]
