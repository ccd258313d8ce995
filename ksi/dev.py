"""``ksi dev``: the embedded default, everything on loopback under one data directory.

    DATA_DIR/broker/       noida-db's Kafka service (a real Kafka-compatible broker process)
    DATA_DIR/catalog.db    the Iceberg catalog (PyIceberg SqlCatalog = Iceberg's JDBC catalog on SQLite)
    DATA_DIR/warehouse/    the Iceberg warehouse
    DATA_DIR/registry/     the embedded Schema Registry's schemas
    DATA_DIR/ksi.toml      the config the proxy runs with (copy it to start from for `ksi serve`)

A demo topic with Avro records is created on first start; its first offsets are archived into Iceberg by
the Spark pipeline and deleted from the broker, so they live only in the lake.  Then the proxy runs in
the foreground until Ctrl-C, and everything started here is stopped on the way out.
"""

from __future__ import annotations

import argparse
import functools
import logging
import subprocess
import sys
from pathlib import Path

import trio

from .config import load_config

__all__ = ["run_dev", "DEMO_TOPIC"]

log = logging.getLogger("ksi.dev")

DEMO_TOPIC = "demo"
DEMO_TABLE = "history.demo"
DEMO_PARTITIONS = 4
DEMO_RECORDS = 1000
DEMO_ARCHIVED = 150     # per partition, offsets below this are archived into Iceberg by the Spark pipeline
DEMO_LOG_START = 100    # ... and offsets below this are then deleted from the broker: the lake's alone
CATALOG_NAME = "lake"


def _write_config(path: Path, port: int, broker: str, metrics_port: int, data_dir: Path, registry: str) -> None:
    path.write_text(f"""\
# Written by `ksi dev`; a starting point for `ksi serve --config`.
[proxy]
listen = "127.0.0.1:{port}"
advertised_host = "127.0.0.1"
broker_port_base = {port + 1}

[upstream]
bootstrap_servers = "{broker}"

[metrics]
listen = "127.0.0.1:{metrics_port}"

[schema_registry]
url = "{registry}"

[catalog]
name = "{CATALOG_NAME}"
uri = "sqlite:///{data_dir / 'catalog.db'}"
warehouse = "file://{data_dir / 'warehouse'}"

# The demo topic's first offsets live only in this table (archived by `ksi archive`'s Spark job).
[[topics]]
name = "{DEMO_TOPIC}"
table = "{DEMO_TABLE}"
layout = "ksi"
""", encoding="utf-8")


def _prepare_catalog(data_dir: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    (data_dir / "warehouse").mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog(CATALOG_NAME, uri=f"sqlite:///{data_dir / 'catalog.db'}",
                         warehouse=f"file://{data_dir / 'warehouse'}")
    if ("history",) not in catalog.list_namespaces():
        catalog.create_namespace("history")


DEMO_SCHEMA = {
    "type": "record", "name": "Order", "namespace": "ksi.demo",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


def _demo_values(registry_url: str) -> list[bytes]:
    """The demo records' values: Avro with Schema Registry framing, the schema registered as demo-value."""
    import io
    import json
    import struct

    import fastavro

    from .registry.client import RegistryClient

    schema_id = RegistryClient(registry_url).register(f"{DEMO_TOPIC}-value", json.dumps(DEMO_SCHEMA))
    parsed = fastavro.parse_schema(DEMO_SCHEMA)
    values = []
    for i in range(DEMO_RECORDS):
        body = io.BytesIO()
        fastavro.schemaless_writer(body, parsed, {"order_id": i, "user": f"user-{i % 50}", "amount": i * 3 % 97 + 0.5,
                                                  "note": None if i % 4 else f"gift wrap #{i}"})
        values.append(struct.pack(">bI", 0, schema_id) + body.getvalue())
    return values


def _seed_demo_topic(bootstrap: str, registry_url: str) -> int:
    """Create the demo topic and give it records, once. Returns how many records it holds."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if DEMO_TOPIC not in admin.list_topics(timeout=10).topics:
        for future in admin.create_topics([NewTopic(DEMO_TOPIC, DEMO_PARTITIONS, 1)]).values():
            future.result(timeout=10)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ksi-dev-probe"})
    try:
        held = sum(consumer.get_watermark_offsets(TopicPartition(DEMO_TOPIC, p), timeout=10)[1]
                   for p in range(DEMO_PARTITIONS))
    finally:
        consumer.close()
    if held:
        return held
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 25})
    for i, value in enumerate(_demo_values(registry_url)):
        producer.produce(DEMO_TOPIC, key=f"user-{i % 50}", value=value, headers=[("source", b"ksi-dev")])
        if i % 25 == 24:
            producer.flush(10)  # small batches: the broker deletes whole batches when the log start moves
    if producer.flush(30):
        raise RuntimeError("demo records were not all delivered to the embedded broker")
    return DEMO_RECORDS


_ARCHIVE_IN_CHILD = (
    "import sys; from ksi.pipeline import archive_demo; "
    "archive_demo(sys.argv[1], topic=sys.argv[2], table=sys.argv[3], until=int(sys.argv[4]))")


def _archive_demo(config_path: Path, broker: object) -> str:
    """Archive the demo topic's first offsets with the Spark pipeline, then delete them from the broker,
    so a consumer reading from the beginning crosses from Iceberg into Kafka.  Returns a status line;
    a failure (no Java, say) is logged and the demo is served from Kafka alone.

    Spark runs in a child Python: the proxy process never hosts a JVM gateway (its threads and memory
    would outlive the job and share the proxy's shutdown)."""
    log.info("archiving offsets below %d of each %s partition into %s with Spark (local[2]); the first"
             " start takes a while", DEMO_ARCHIVED, DEMO_TOPIC, DEMO_TABLE)
    job = subprocess.run([sys.executable, "-c", _ARCHIVE_IN_CHILD, str(config_path), DEMO_TOPIC, DEMO_TABLE,
                          str(DEMO_ARCHIVED)], check=False)
    if job.returncode != 0:  # the pipeline's own message (what to fix) went to stderr above
        log.error("could not archive the demo topic (the Spark job exited with %d); it is served from Kafka"
                  " alone", job.returncode)
        return "served from Kafka alone (archiving failed, see above)"
    try:
        for partition in range(DEMO_PARTITIONS):
            broker.delete_records(DEMO_TOPIC, partition, DEMO_LOG_START)  # type: ignore[attr-defined]
    except Exception as exc:
        log.error("could not delete the archived demo offsets from the broker: %s; they are served from Kafka", exc)
        return "served from Kafka (deleting the archived offsets failed, see above)"
    return (f"offsets below {DEMO_LOG_START} per partition only in Iceberg ({DEMO_TABLE}),"
            f" {DEMO_LOG_START}..{DEMO_ARCHIVED - 1} in both, the rest in Kafka")


def run_dev(args: argparse.Namespace) -> int:
    from .brokers import BrokerError, free_port, start_noida
    from .cli import run_proxy
    from .registry import start_registry

    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    broker_port = args.broker_port or free_port()
    log.info("starting the embedded broker (noida-db) on 127.0.0.1:%d, data in %s", broker_port, data_dir / "broker")
    try:
        broker = start_noida(data_dir / "broker", port=broker_port, log_path=data_dir / "broker.log")
    except BrokerError as exc:
        log.error("cannot start the embedded broker: %s", exc)
        return 1
    registry = None
    try:
        registry = start_registry("127.0.0.1", args.registry_port, data_dir / "registry")
        _prepare_catalog(data_dir)
        held = _seed_demo_topic(broker.bootstrap, registry.url)
        config_path = data_dir / "ksi.toml"
        _write_config(config_path, args.port, broker.bootstrap, args.metrics_port, data_dir, registry.url)
        where = _archive_demo(config_path, broker)
        config = load_config(config_path)
        bootstrap = f"127.0.0.1:{args.port}"
        print(f"""
ksi dev is up.
  bootstrap (give this to clients): {bootstrap}
  topic '{DEMO_TOPIC}': {held} records over {DEMO_PARTITIONS} partitions, Avro values (schema {DEMO_TOPIC}-value)
    {where}
  schema registry: {registry.url}
  metrics: http://127.0.0.1:{args.metrics_port}/metrics
  config:  {config_path}
Try:
  kcat -b {bootstrap} -C -t {DEMO_TOPIC} -o beginning -e
  python examples/consumer.py --bootstrap {bootstrap} --topic {DEMO_TOPIC}
Ctrl-C stops ksi and the broker.
""", file=sys.stderr, flush=True)
        trio.run(functools.partial(run_proxy, config, strict_ports=False))  # a taken broker port: a free one
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if registry is not None:
            registry.stop()
        log.info("stopping the embedded broker")
        broker.stop()
