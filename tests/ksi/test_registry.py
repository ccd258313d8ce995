"""The embedded Schema Registry against real clients (confluent-kafka's SchemaRegistryClient and its Avro
serializers), raw HTTP for Confluent's error bodies, and the Avro compatibility rules on their own."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from ksi.brokers import free_port
from ksi.registry import RegistryServer, incompatibilities, parse, start_registry
from ksi.registry.compat import check_level

ORDER_V1 = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}],
}
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}]}
ORDER_BAD = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "customer", "type": "string"}]}


def avro(schema: Any) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


def loaded(schema: Schema) -> Any:
    assert schema.schema_str is not None
    return json.loads(schema.schema_str)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryServer]:
    server = start_registry("127.0.0.1", 0, tmp_path / "registry")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(registry: RegistryServer) -> Iterator[SchemaRegistryClient]:
    with SchemaRegistryClient({"url": registry.url}) as client:
        yield client


def http(registry: RegistryServer, method: str, path: str, body: Any = None) -> tuple[int, Any, str]:
    """One raw request: (status, decoded JSON body, content type)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(registry.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), response.headers["Content-Type"]
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), error.headers["Content-Type"]


# -- the real client ------------------------------------------------------------------------------------------


def test_ids_are_global_and_stable(client: SchemaRegistryClient, registry: RegistryServer) -> None:
    first = client.register_schema("orders-value", avro(ORDER_V1))
    assert client.register_schema("orders-value", avro(ORDER_V1)) == first
    # the same schema under another subject shares the id, as in Confluent
    assert client.register_schema("archive-value", avro(ORDER_V1)) == first
    # whitespace, key order, namespace spelling and docs do not make another schema
    respelled = {"fields": [{"type": "long", "name": "id", "doc": "the order"}, {"name": "amount", "type": "double"}],
                 "name": "shop.Order", "type": "record", "doc": "an order"}
    assert client.register_schema("orders-value", Schema(json.dumps(respelled, indent=4), "AVRO")) == first
    assert client.register_schema("copy-value", Schema(json.dumps(respelled), "AVRO")) == first
    assert client.get_versions("orders-value") == [1]
    assert client.get_versions("archive-value") == [1]
    # an id always answers with the text it was first registered with (raw HTTP: no client cache)
    assert json.loads(http(registry, "GET", f"/schemas/ids/{first}")[1]["schema"]) == ORDER_V1
    assert json.loads(http(registry, "GET", "/subjects/copy-value/versions/1")[1]["schema"]) == ORDER_V1
    # a logical type changes what a reader decodes, so it is another schema
    when = client.register_schema("when-value", avro({"type": "long", "logicalType": "timestamp-millis"}))
    plain = client.register_schema("plain-value", avro("long"))
    assert len({first, when, plain}) == 3


def test_read_back(client: SchemaRegistryClient) -> None:
    id1 = client.register_schema("orders-value", avro(ORDER_V1))
    id2 = client.register_schema("orders-value", avro(ORDER_V2))
    assert id2 != id1
    assert loaded(client.get_schema(id1)) == ORDER_V1
    assert client.get_schema(id1).schema_type == "AVRO"
    latest = client.get_latest_version("orders-value")
    assert (latest.subject, latest.version, latest.schema_id) == ("orders-value", 2, id2)
    assert loaded(latest.schema) == ORDER_V2
    assert client.get_version("orders-value", 1).schema_id == id1
    assert client.get_versions("orders-value") == [1, 2]
    found = client.lookup_schema("orders-value", avro(ORDER_V1))
    assert (found.subject, found.version, found.schema_id) == ("orders-value", 1, id1)
    assert client.get_subjects() == ["orders-value"]
    assert client.get_schema_types() == ["AVRO", "JSON", "PROTOBUF"]
    assert client.get_subjects_by_schema_id(id1) == ["orders-value"]
    assert [(v.subject, v.version) for v in client.get_schema_versions(id2)] == [("orders-value", 2)]

    with pytest.raises(SchemaRegistryError) as missing_subject:
        client.lookup_schema("nobody-value", avro(ORDER_V1))
    assert missing_subject.value.error_code == 40401
    with pytest.raises(SchemaRegistryError) as missing_schema:
        client.lookup_schema("orders-value", avro(ORDER_BAD))
    assert missing_schema.value.error_code == 40403
    with pytest.raises(SchemaRegistryError) as missing_id:
        client.get_schema(999)
    assert missing_id.value.error_code == 40403


def test_evolution_accepted_and_refused(client: SchemaRegistryClient) -> None:
    client.register_schema("orders-value", avro(ORDER_V1))
    assert client.test_compatibility("orders-value", avro(ORDER_V2)) is True
    client.register_schema("orders-value", avro(ORDER_V2))
    assert client.test_compatibility("orders-value", avro(ORDER_BAD)) is False
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema("orders-value", avro(ORDER_BAD))
    assert refused.value.http_status_code == 409
    assert refused.value.error_code == 409
    assert "customer" in refused.value.error_message
    assert client.get_versions("orders-value") == [1, 2]

    assert client.get_compatibility() == "BACKWARD"
    client.set_compatibility("orders-value", "NONE")
    assert client.get_compatibility("orders-value") == "NONE"
    assert client.get_compatibility() == "BACKWARD"
    client.register_schema("orders-value", avro(ORDER_BAD))
    assert client.get_versions("orders-value") == [1, 2, 3]


def test_forward_and_transitive_levels(client: SchemaRegistryClient) -> None:
    client.set_compatibility(level="FORWARD")
    client.register_schema("orders-value", avro(ORDER_V1))
    # FORWARD: the old schema reads new data, so a new field needs no default ...
    client.register_schema("orders-value", avro(ORDER_BAD))
    # ... but dropping a field the old schema needs (no default there) breaks it
    dropped = {**ORDER_V1, "fields": [ORDER_V1["fields"][0]]}
    assert client.test_compatibility("orders-value", avro(dropped)) is False

    # BACKWARD_TRANSITIVE checks every version: dropping b's default reads v2 data, not v1's
    client.set_compatibility("events-value", "BACKWARD_TRANSITIVE")
    a = {"name": "a", "type": "int"}
    client.register_schema("events-value", avro({"type": "record", "name": "E", "fields": [a]}))
    client.register_schema("events-value", avro({"type": "record", "name": "E", "fields": [
        a, {"name": "b", "type": "int", "default": 0}]}))
    no_default = avro({"type": "record", "name": "E", "fields": [a, {"name": "b", "type": "int"}]})
    assert client.test_compatibility("events-value", no_default) is False
    assert client.test_compatibility("events-value", no_default, version=2) is True
    client.set_compatibility("events-value", "BACKWARD")
    assert client.test_compatibility("events-value", no_default) is True


def test_avro_serializer_round_trip(client: SchemaRegistryClient) -> None:
    ctx = SerializationContext("orders", MessageField.VALUE)
    serialize_v1 = AvroSerializer(client, json.dumps(ORDER_V1))
    record = {"id": 7, "amount": 12.5}
    wire = serialize_v1(record, ctx)
    assert wire is not None
    schema_id = client.get_latest_version("orders-value").schema_id
    # Confluent's wire format: magic byte 0, the schema id as a 4-byte big-endian int, the Avro body
    assert wire[0] == 0
    assert struct.unpack(">I", wire[1:5])[0] == schema_id
    assert AvroDeserializer(client)(wire, ctx) == record

    # evolve: a producer on v2 registers it, and a v2 reader fills the default into v1 records
    serialize_v2 = AvroSerializer(client, json.dumps(ORDER_V2))
    wire2 = serialize_v2({"id": 8, "amount": 1.0, "currency": "USD"}, ctx)
    assert wire2 is not None and struct.unpack(">I", wire2[1:5])[0] != schema_id
    assert client.get_versions("orders-value") == [1, 2]
    read_v2 = AvroDeserializer(client, json.dumps(ORDER_V2))
    assert read_v2(wire, ctx) == {"id": 7, "amount": 12.5, "currency": "EUR"}
    assert read_v2(wire2, ctx) == {"id": 8, "amount": 1.0, "currency": "USD"}

    # a producer with an incompatible schema is refused by the registry
    with pytest.raises(SchemaRegistryError) as refused:
        AvroSerializer(client, json.dumps(ORDER_BAD))({"id": 1, "amount": 2.0, "customer": "c"}, ctx)
    assert refused.value.error_code == 409


def test_restart_keeps_ids_versions_and_config(tmp_path: Path) -> None:
    data_dir = tmp_path / "registry"
    with start_registry("127.0.0.1", 0, data_dir) as first, SchemaRegistryClient({"url": first.url}) as client:
        id1 = client.register_schema("orders-value", avro(ORDER_V1))
        id2 = client.register_schema("orders-value", avro(ORDER_V2))
        client.register_schema("gone-value", avro("string"))
        client.delete_subject("gone-value")
        client.set_compatibility("orders-value", "FULL")
        client.set_compatibility(level="FORWARD")
    with start_registry("127.0.0.1", 0, data_dir) as second, SchemaRegistryClient({"url": second.url}) as client:
        assert client.get_subjects() == ["orders-value"]
        assert client.get_subjects(deleted=True) == ["gone-value", "orders-value"]
        assert client.get_versions("orders-value") == [1, 2]
        assert client.get_latest_version("orders-value").schema_id == id2
        assert loaded(client.get_schema(id1)) == ORDER_V1
        assert client.get_compatibility("orders-value") == "FULL"
        assert client.get_compatibility() == "FORWARD"
        assert client.register_schema("orders-value", avro(ORDER_V1)) == id1
        assert client.register_schema("other-value", avro("int")) == max(id1, id2) + 2


def test_deletes(client: SchemaRegistryClient, registry: RegistryServer) -> None:
    id1 = client.register_schema("orders-value", avro(ORDER_V1))
    client.register_schema("orders-value", avro(ORDER_V2))
    with pytest.raises(SchemaRegistryError) as not_soft:
        client.delete_version("orders-value", 1, permanent=True)
    assert not_soft.value.error_code == 40407
    assert client.delete_version("orders-value", 1) == 1
    assert client.get_versions("orders-value") == [2]
    assert client.get_versions("orders-value", deleted=True) == [1, 2]
    with pytest.raises(SchemaRegistryError) as gone:
        client.get_version("orders-value", 1)
    assert gone.value.error_code == 40402
    assert client.get_version("orders-value", 1, deleted=True).schema_id == id1
    # a soft-deleted schema still decodes: its id keeps answering
    assert loaded(client.get_schema(id1)) == ORDER_V1

    with pytest.raises(SchemaRegistryError) as subject_not_soft:
        client.delete_subject("orders-value", permanent=True)
    assert subject_not_soft.value.error_code == 40405
    assert client.delete_subject("orders-value") == [2]
    assert client.get_subjects() == []
    assert http(registry, "DELETE", "/subjects/orders-value")[1]["error_code"] == 40404
    assert client.delete_subject("orders-value", permanent=True) == [1, 2]
    assert client.get_subjects(deleted=True) == []
    # a new life for the subject starts again at version 1 with the same global id
    assert client.register_schema("orders-value", avro(ORDER_V1)) == id1
    assert client.get_versions("orders-value") == [1]


def test_json_and_protobuf_are_opaque(client: SchemaRegistryClient) -> None:
    json_schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    proto = 'syntax = "proto3";\nmessage M { int32 a = 1; }\n'
    jid = client.register_schema("j-value", Schema(json_schema, "JSON"))
    pid = client.register_schema("p-value", Schema(proto, "PROTOBUF"))
    assert client.get_schema(jid).schema_type == "JSON"
    assert loaded(client.get_schema(jid)) == json.loads(json_schema)
    assert client.get_schema(pid).schema_type == "PROTOBUF"
    assert client.get_schema(pid).schema_str == proto
    assert client.get_latest_version("p-value").schema.schema_type == "PROTOBUF"
    # no compatibility checking for them: any change registers
    client.register_schema("j-value", Schema('{"type": "string"}', "JSON"))
    assert client.get_versions("j-value") == [1, 2]


def test_references(client: SchemaRegistryClient, registry: RegistryServer) -> None:
    address = {"type": "record", "name": "Address", "namespace": "shop", "fields": [{"name": "city", "type": "string"}]}
    client.register_schema("address", avro(address))
    customer = {"type": "record", "name": "Customer", "namespace": "shop",
                "fields": [{"name": "name", "type": "string"}, {"name": "home", "type": "shop.Address"}]}
    with pytest.raises(SchemaRegistryError) as unresolved:
        client.register_schema("customer-value", avro(customer))
    assert unresolved.value.error_code == 42201
    ref = SchemaReference("shop.Address", "address", 1)
    cid = client.register_schema("customer-value", Schema(json.dumps(customer), "AVRO", [ref]))
    fetched = client.get_schema(cid)
    assert [(r.name, r.subject, r.version) for r in fetched.references or ()] == [("shop.Address", "address", 1)]
    assert client.get_referenced_by("address", 1) == [cid]
    with pytest.raises(SchemaRegistryError) as referenced:
        client.delete_version("address", 1)
    assert referenced.value.error_code == 42206

    ctx = SerializationContext("customer", MessageField.VALUE)
    serializer = AvroSerializer(client, Schema(json.dumps(customer), "AVRO", [ref]),
                                conf={"auto.register.schemas": False, "use.latest.version": True})
    wire = serializer({"name": "Ada", "home": {"city": "London"}}, ctx)
    assert AvroDeserializer(client)(wire, ctx) == {"name": "Ada", "home": {"city": "London"}}


# -- raw HTTP: Confluent's error bodies ---------------------------------------------------------------------


def test_error_bodies(registry: RegistryServer) -> None:
    schema = {"schema": json.dumps(ORDER_V1)}
    status, body, content_type = http(registry, "GET", "/subjects/nope/versions")
    assert (status, body) == (404, {"error_code": 40401, "message": "Subject 'nope' not found."})
    assert content_type == "application/vnd.schemaregistry.v1+json"

    assert http(registry, "POST", "/subjects/orders-value/versions", schema)[:2] == (200, {"id": 1})
    status, body, _ = http(registry, "GET", "/subjects/orders-value/versions/7")
    assert (status, body) == (404, {"error_code": 40402, "message": "Version 7 not found."})
    status, body, _ = http(registry, "GET", "/schemas/ids/42")
    assert (status, body) == (404, {"error_code": 40403, "message": "Schema 42 not found"})
    for bad_version in ("0", "abc", "-2"):
        status, body, _ = http(registry, "GET", f"/subjects/orders-value/versions/{bad_version}")
        assert (status, body["error_code"]) == (422, 42202)
    for bad_schema in ({"schema": "{not json"}, {"schema": '{"type": "nope"}'}, {},
                       {"schema": '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}, '
                                  '{"name": "a", "type": "int"}]}'},
                       {"schema": '["int", "int"]'}, {"schema": '"int"', "schemaType": "XML"}):
        status, body, _ = http(registry, "POST", "/subjects/orders-value/versions", bad_schema)
        assert (status, body["error_code"]) == (422, 42201), bad_schema
    status, body, _ = http(registry, "POST", "/subjects/orders-value/versions", {"schema": json.dumps(ORDER_BAD)})
    assert (status, body["error_code"]) == (409, 409)
    assert body["message"].startswith('Schema being registered is incompatible with an earlier schema for subject '
                                      '"orders-value"')
    status, body, _ = http(registry, "PUT", "/config", {"compatibility": "SIDEWAYS"})
    assert (status, body["error_code"]) == (422, 42203)
    status, body, _ = http(registry, "GET", "/config/orders-value")
    assert (status, body["error_code"]) == (404, 40408)
    assert http(registry, "GET", "/config/orders-value?defaultToGlobal=true")[:2] == (
        200, {"compatibilityLevel": "BACKWARD"})
    assert http(registry, "GET", "/nowhere")[:2] == (404, {"error_code": 404, "message": "HTTP 404 Not Found"})
    assert http(registry, "PUT", "/subjects")[:2] == (
        405, {"error_code": 405, "message": "HTTP 405 Method Not Allowed"})


def test_http_shapes(registry: RegistryServer) -> None:
    schema = {"schema": json.dumps(ORDER_V1)}
    http(registry, "POST", "/subjects/orders%2Fv/versions", schema)  # an encoded '/' stays in the subject
    assert http(registry, "GET", "/subjects")[1] == ["orders/v"]
    status, body, _ = http(registry, "POST", "/subjects/orders%2Fv", schema)
    assert (status, body) == (200, {"subject": "orders/v", "version": 1, "id": 1, "schema": json.dumps(
        ORDER_V1, separators=(",", ":"))})
    request = urllib.request.Request(registry.url + "/subjects/orders%2Fv/versions/latest/schema")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.loads(response.read()) == ORDER_V1
    status, body, _ = http(registry, "POST", "/compatibility/subjects/orders%2Fv/versions/latest?verbose=true",
                           {"schema": json.dumps(ORDER_BAD)})
    assert status == 200 and body["is_compatible"] is False
    assert any("READER_FIELD_MISSING_DEFAULT_VALUE" in m for m in body["messages"])
    assert http(registry, "POST", "/compatibility/subjects/orders%2Fv/versions",
                {"schema": json.dumps(ORDER_V2)})[1] == {"is_compatible": True}
    # nothing registered yet: anything is compatible with "latest"
    assert http(registry, "POST", "/compatibility/subjects/new/versions/latest", schema)[1] == {"is_compatible": True}
    assert http(registry, "GET", "/schemas/ids/1/versions")[1] == [{"subject": "orders/v", "version": 1}]
    assert http(registry, "PUT", "/config/orders%2Fv", {"compatibility": "full"})[1] == {"compatibility": "FULL"}
    assert http(registry, "DELETE", "/config/orders%2Fv")[1] == {"compatibilityLevel": "FULL"}
    assert http(registry, "GET", "/mode")[1] == {"mode": "READWRITE"}
    assert http(registry, "GET", "/subjects/")[1] == ["orders/v"]
    assert http(registry, "POST", "/subjects//versions", schema)[0] == 404


def test_concurrent_registrations(registry: RegistryServer) -> None:
    """Threads registering at once get one id per distinct schema and gapless versions per subject."""
    def work(worker: int) -> list[int]:
        ids = []
        with SchemaRegistryClient({"url": registry.url}) as client:
            for n in range(10):
                fields = [{"name": f"f{i}", "type": "int", "default": 0} for i in range(n)]
                # every worker registers the same 10 schemas, each under its own subject and a shared one
                ids.append(client.register_schema(f"w{worker}-value", avro(record("R", *fields))))
                client.register_schema("shared-value", avro(record("R", *fields)))
        return ids

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(work, range(6)))
    assert all(ids == results[0] for ids in results)
    assert len(set(results[0])) == 10
    with SchemaRegistryClient({"url": registry.url}) as client:
        assert client.get_versions("shared-value") == list(range(1, 11))
        assert sorted(client.get_version("shared-value", v).schema_id for v in range(1, 11)) == sorted(results[0])


def test_run_registry_stops_on_sigterm(tmp_path: Path) -> None:
    code = ("import logging, sys\n"
            "from ksi.registry import run_registry\n"
            "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
            f"sys.exit(run_registry('127.0.0.1', 0, {str(tmp_path)!r}))\n")
    with subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            assert "schema registry at http://127.0.0.1:" in line
            url = line.split("schema registry at ")[1].split()[0]
            with urllib.request.urlopen(url + "/subjects", timeout=10) as response:
                assert json.loads(response.read()) == []
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert (tmp_path / "registry.db").exists()


def test_stop_ends_keep_alive_connections(client: SchemaRegistryClient, registry: RegistryServer) -> None:
    client.get_subjects()  # leaves a keep-alive connection open
    started = time.monotonic()
    registry.stop()
    assert time.monotonic() - started < 5


# -- Avro compatibility rules ------------------------------------------------------------------------------------


def record(name: str, *fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def kinds(reader: Any, writer: Any) -> list[tuple[str, str]]:
    found = incompatibilities(parse("AVRO", json.dumps(reader)), parse("AVRO", json.dumps(writer)))
    return [(i.kind, i.path) for i in found]


@pytest.mark.parametrize(("reader", "writer", "expected"), [
    # primitives and promotions
    ("int", "int", []),
    ("long", "int", []),
    ("float", "long", []),
    ("double", "float", []),
    ("string", "bytes", []),
    ("bytes", "string", []),
    ("int", "long", [("TYPE_MISMATCH", "")]),
    ("float", "double", [("TYPE_MISMATCH", "")]),
    ("boolean", "null", [("TYPE_MISMATCH", "")]),
    # records: added fields need defaults, removed ones do not matter, types resolve recursively
    (record("R", {"name": "a", "type": "int"}, {"name": "b", "type": "int", "default": 0}),
     record("R", {"name": "a", "type": "int"}), []),
    (record("R", {"name": "a", "type": "int"}, {"name": "b", "type": "int"}),
     record("R", {"name": "a", "type": "int"}), [("READER_FIELD_MISSING_DEFAULT_VALUE", "/fields/1")]),
    (record("R", {"name": "a", "type": "int"}),
     record("R", {"name": "a", "type": "int"}, {"name": "b", "type": "string"}), []),
    (record("R", {"name": "a", "type": "long"}), record("R", {"name": "a", "type": "int"}), []),
    (record("R", {"name": "a", "type": "int"}), record("R", {"name": "a", "type": "string"}),
     [("TYPE_MISMATCH", "/fields/0/type")]),
    # names: unqualified names match across namespaces; aliases let a record or a field be renamed
    (record("R", namespace="x"), record("R", namespace="y"), []),
    (record("S"), record("R"), [("NAME_MISMATCH", "/name")]),
    (record("S", aliases=["R"]), record("R"), []),
    (record("n.S", aliases=["R"]), record("n.R"), []),
    (record("R", {"name": "total", "type": "int", "aliases": ["amount"]}),
     record("R", {"name": "amount", "type": "int"}), []),
    # enums
    ({"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}, {"type": "enum", "name": "E", "symbols": ["A", "B"]},
     []),
    ({"type": "enum", "name": "E", "symbols": ["A"]}, {"type": "enum", "name": "E", "symbols": ["A", "B"]},
     [("MISSING_ENUM_SYMBOLS", "/symbols")]),
    ({"type": "enum", "name": "E", "symbols": ["A", "U"], "default": "U"},
     {"type": "enum", "name": "E", "symbols": ["A", "B"]}, []),
    # fixed
    ({"type": "fixed", "name": "F", "size": 4}, {"type": "fixed", "name": "F", "size": 4}, []),
    ({"type": "fixed", "name": "F", "size": 8}, {"type": "fixed", "name": "F", "size": 4},
     [("FIXED_SIZE_MISMATCH", "/size")]),
    # arrays and maps
    ({"type": "array", "items": "long"}, {"type": "array", "items": "int"}, []),
    ({"type": "array", "items": "int"}, {"type": "array", "items": "string"}, [("TYPE_MISMATCH", "/items")]),
    ({"type": "map", "values": "double"}, {"type": "map", "values": "float"}, []),
    ({"type": "map", "values": "int"}, {"type": "map", "values": "long"}, [("TYPE_MISMATCH", "/values")]),
    ({"type": "map", "values": "int"}, {"type": "array", "items": "int"}, [("TYPE_MISMATCH", "")]),
    # unions
    (["null", "string"], "string", []),
    (["null", "long"], "int", []),
    (["null", "string"], "int", [("MISSING_UNION_BRANCH", "")]),
    (["null", "string", "int"], ["null", "string"], []),
    (["null", "string"], ["null", "string", "int"], [("MISSING_UNION_BRANCH", "/2")]),
    ("string", ["null", "string"], [("TYPE_MISMATCH", "/0")]),
    ("long", ["int", "long"], []),
])
def test_compat_rules(reader: Any, writer: Any, expected: list[tuple[str, str]]) -> None:
    assert kinds(reader, writer) == expected


def test_compat_recursive_and_named_references() -> None:
    node = record("Node", {"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"]})
    wider = record("Node", {"name": "value", "type": "long"}, {"name": "next", "type": ["null", "Node"]})
    assert kinds(wider, node) == []
    assert kinds(node, wider) == [("TYPE_MISMATCH", "/fields/0/type")]
    pair = record("Pair", {"name": "a", "type": {"type": "fixed", "name": "F", "size": 2}}, {"name": "b", "type": "F"})
    pair_wide = record("Pair", {"name": "a", "type": {"type": "fixed", "name": "F", "size": 3}},
                       {"name": "b", "type": "F"})
    assert [k for k, _ in kinds(pair_wide, pair)] == ["FIXED_SIZE_MISMATCH"]


def test_levels() -> None:
    v1 = parse("AVRO", json.dumps(record("R", {"name": "a", "type": "int"})))
    v2 = parse("AVRO", json.dumps(record("R", {"name": "a", "type": "int"}, {"name": "b", "type": "int",
                                                                              "default": 0})))
    added = parse("AVRO", json.dumps(record("R", {"name": "a", "type": "int"}, {"name": "b", "type": "int"})))
    assert check_level(v2, [(1, v1)], "BACKWARD") == []
    assert check_level(added, [(1, v1)], "BACKWARD") != []
    assert check_level(added, [(1, v1)], "FORWARD") == []
    assert check_level(added, [(1, v1)], "FULL") != []
    assert check_level(added, [(1, v1)], "NONE") == []
    # added without a default is fine after v2 (which has b) but not after v1: only TRANSITIVE sees v1
    assert check_level(added, [(1, v1), (2, v2)], "BACKWARD") == []
    messages = check_level(added, [(1, v1), (2, v2)], "BACKWARD_TRANSITIVE")
    assert "{oldSchemaVersion: 1}" in messages and "{compatibility: 'BACKWARD_TRANSITIVE'}" in messages
    json_schema = parse("JSON", '{"type": "object"}')
    assert check_level(json_schema, [(1, parse("JSON", '{"type": "string"}'))], "FULL_TRANSITIVE") == []
    assert check_level(json_schema, [(1, v1)], "BACKWARD") != []


def test_identity_form() -> None:
    plain = parse("AVRO", json.dumps(record("R", {"name": "a", "type": "int"}, namespace="n")))
    spelled = parse("AVRO", '{"name": "n.R", "doc": "x", "type": "record", "fields": '
                            '[{"type": {"type": "int"}, "name": "a", "doc": "y"}]}')
    assert plain.key == spelled.key
    assert plain.identity == '{"name":"n.R","type":"record","fields":[{"name":"a","type":"int"}]}'
    with_default = parse("AVRO", json.dumps(record("R", {"name": "a", "type": "int", "default": 1}, namespace="n")))
    assert with_default.key != plain.key
    assert parse("JSON", '{"a": 1}').key != parse("AVRO", '"int"').key


# -- ksi's own client, as the pipeline and `ksi serve` use it -------------------------------------------------


def test_the_pipeline_reads_every_avro_version_through_ksis_client(registry: RegistryServer) -> None:
    from ksi.pipeline.values import RegistryUnavailable, registry_versions
    from ksi.registry.client import RegistryClient
    from ksi.serving import registry_problem

    ours = RegistryClient(registry.url)
    first = ours.register("orders-value", json.dumps(ORDER_V1))
    second = ours.register("orders-value", json.dumps(ORDER_V2))
    found = registry_versions(registry.url, "orders-value")
    assert sorted(found) == sorted({first, second}) and json.loads(found[second]) == ORDER_V2
    assert registry_versions(registry.url, "nobody-value") == {}  # an unknown subject: raw bytes
    assert registry_problem(registry.url, " in ksi.toml") is None

    down = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RegistryUnavailable, match=r"check schema_registry\.url, or remove it"):
        registry_versions(down, "orders-value")
    problem = registry_problem(down, " in ksi.toml")
    assert problem is not None and problem.startswith(f"schema registry {down} (schema_registry.url in ksi.toml)"
                                                      " does not answer: ")
