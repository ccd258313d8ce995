"""The demo ``ksi dev`` sets up: a topic of Avro records, its first offsets archived into Iceberg by the
archive pipeline (its local engine, as `ksi archive` runs on one machine) and then deleted from the broker,
and the config the proxy runs with.

    DATA_DIR/broker/       noida-db's Kafka service (a real Kafka-compatible broker process)
    DATA_DIR/catalog.db    the Iceberg catalog (PyIceberg SqlCatalog = Iceberg's JDBC catalog on SQLite)
    DATA_DIR/warehouse/    the Iceberg warehouse
    DATA_DIR/registry/     the embedded Schema Registry's schemas
    DATA_DIR/ksi.toml      the config the proxy runs with (copy it to start from for `ksi serve`)
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from ..brokers import BrokerProcess, set_parent_death_signal
from .state import CONFIG_MARKER, stop_group

__all__ = [
    "CATALOG_NAME",
    "DEMO_ARCHIVED",
    "DEMO_LOG_START",
    "DEMO_PARTITIONS",
    "DEMO_RECORDS",
    "DEMO_TABLE",
    "DEMO_TOPIC",
    "DemoError",
    "archive_demo",
    "catalog_properties",
    "delete_archived",
    "lake_holds_demo",
    "prepare_catalog",
    "seed_demo_topic",
    "write_config",
]

log = logging.getLogger("ksi.dev")

DEMO_TOPIC = "demo"
DEMO_TABLE = "history.demo"
DEMO_PARTITIONS = 4
DEMO_RECORDS = 1000
DEMO_ARCHIVED = 150     # per partition, offsets below this are archived into Iceberg by the pipeline
DEMO_LOG_START = 100    # ... and offsets below this are then deleted from the broker: the lake's alone
CATALOG_NAME = "lake"


class DemoError(Exception):
    """A demo step failed; the message says which and why, in one line."""


def catalog_properties(data_dir: Path) -> dict[str, str]:
    return {"uri": f"sqlite:///{data_dir / 'catalog.db'}", "warehouse": f"file://{data_dir / 'warehouse'}"}


def write_config(path: Path, port: int, broker: str, metrics_port: int, data_dir: Path, registry: str) -> None:
    catalog = catalog_properties(data_dir)
    path.write_text(f"""\
{CONFIG_MARKER}; a starting point for `ksi serve --config`.
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
uri = "{catalog['uri']}"
warehouse = "{catalog['warehouse']}"

# The demo topic's first offsets live only in this table (archived by `ksi archive`'s pipeline).
[[topics]]
name = "{DEMO_TOPIC}"
table = "{DEMO_TABLE}"
layout = "ksi"
""", encoding="utf-8")


def prepare_catalog(data_dir: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    (data_dir / "warehouse").mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog(CATALOG_NAME, **catalog_properties(data_dir))
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


def demo_values(registry_url: str) -> list[bytes]:
    """The demo records' values: Avro with Schema Registry framing, the schema registered as demo-value."""
    import io
    import json
    import struct

    import fastavro

    from ..registry.client import RegistryClient

    schema_id = RegistryClient(registry_url).register(f"{DEMO_TOPIC}-value", json.dumps(DEMO_SCHEMA))
    parsed = fastavro.parse_schema(DEMO_SCHEMA)
    values = []
    for i in range(DEMO_RECORDS):
        body = io.BytesIO()
        fastavro.schemaless_writer(body, parsed, {"order_id": i, "user": f"user-{i % 50}", "amount": i * 3 % 97 + 0.5,
                                                  "note": None if i % 4 else f"gift wrap #{i}"})
        values.append(struct.pack(">bI", 0, schema_id) + body.getvalue())
    return values


def seed_demo_topic(bootstrap: str, registry_url: str) -> tuple[int, bool]:
    """Create the demo topic and give it records, once.  Returns how many records it holds and whether
    they were produced just now."""
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
        return held, False
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 25})
    for i, value in enumerate(demo_values(registry_url)):
        producer.produce(DEMO_TOPIC, key=f"user-{i % 50}", value=value, headers=[("source", b"ksi-dev")])
        if i % 25 == 24:
            producer.flush(10)  # small batches: the broker deletes whole batches when the log start moves
    if producer.flush(30):
        raise DemoError(f"demo records were not all delivered to the broker at {bootstrap}")
    return DEMO_RECORDS, True


def lake_holds_demo(data_dir: Path) -> bool:
    """Whether the demo table already holds every offset below DEMO_ARCHIVED of every partition (a second
    start then needs no archive run)."""
    from pyiceberg.catalog.sql import SqlCatalog

    from ..config import TopicConfig
    from ..lake.table import LakeTable

    try:
        catalog = SqlCatalog(CATALOG_NAME, **catalog_properties(data_dir))
        ranges = LakeTable(catalog, TopicConfig(name=DEMO_TOPIC, table=DEMO_TABLE)).offset_ranges()
    except Exception:  # noqa: BLE001 - no table yet, or one that cannot be read: the archive job decides
        return False
    return all(p in ranges and ranges[p].first == 0 and ranges[p].last >= DEMO_ARCHIVED - 1
               for p in range(DEMO_PARTITIONS))


# The archive runs in a child Python, the leader of a process group of its own (whatever it starts joins
# the group): the proxy process never hosts the pipeline's threads, memory or worker processes, and one
# killpg stops all of it.  Its errors come back as one line on stderr.  This is `ksi archive`'s local engine
# (tasks in worker processes, or in the child itself for a run as small as the demo's): no Spark, no JVM.
_ARCHIVE_IN_CHILD = """\
import sys
try:
    from ksi.pipeline import archive_demo
    archive_demo(sys.argv[1], topic=sys.argv[2], table=sys.argv[3], until=int(sys.argv[4]))
except KeyboardInterrupt:
    sys.exit(130)
except ImportError as exc:
    if (exc.name or "").split(".")[0] not in ("pyspark", "py4j", "pandas", "snowpark_connect_deps_iceberg"):
        raise
    print(f"ksi dev: archiving needs {exc.name}, which is not installed: pip install 'ksi[dev]'", file=sys.stderr)
    sys.exit(3)
except Exception as exc:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    print(f"ksi dev: archiving failed: {lines[0] if lines else type(exc).__name__}", file=sys.stderr)
    sys.exit(1)
"""


def archive_demo(config_path: Path, on_start: object = None) -> None:
    """Archive the demo topic's first offsets with the archive pipeline's local engine, in a child process
    that leads its own process group and dies with this one (its progress lines go to stderr).  Ctrl-C or
    SIGTERM here stops the whole group.  Raises DemoError when the run fails; the child has printed why."""
    process = subprocess.Popen([sys.executable, "-c", _ARCHIVE_IN_CHILD, str(config_path), DEMO_TOPIC, DEMO_TABLE,
                                str(DEMO_ARCHIVED)], start_new_session=True,
                               preexec_fn=set_parent_death_signal)  # noqa: PLW1509 - as ksi.brokers: prctl() only
    if callable(on_start):
        on_start(process.pid)
    try:
        code = process.wait()
    except BaseException:
        stop_group(process.pid)
        process.wait()
        raise
    if code != 0:
        raise DemoError(f"the archive run exited with {code} (its reason is printed above)")


def delete_archived(broker: BrokerProcess) -> None:
    """Move each demo partition's log start to DEMO_LOG_START: the offsets below live only in the lake."""
    try:
        for partition in range(DEMO_PARTITIONS):
            broker.delete_records(DEMO_TOPIC, partition, DEMO_LOG_START)
    except Exception as exc:  # noqa: BLE001 - whatever DeleteRecords raises: said in one line
        raise DemoError(f"could not delete the archived demo offsets from the broker: {exc}") from None
