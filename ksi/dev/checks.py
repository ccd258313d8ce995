"""What ``ksi dev`` checks before it says it is up: every part answers a real request.

Each check returns nothing or raises :class:`PartDown` naming the part and what it answered.  They block
(confluent-kafka, urllib, PyIceberg), so the proxy's event loop runs them in a worker thread.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

from ..serving import listen_problem, one_line
from .demo import CATALOG_NAME, DEMO_PARTITIONS, DEMO_TABLE, DEMO_TOPIC, catalog_properties

__all__ = [
    "PartDown",
    "check_broker",
    "check_catalog",
    "check_metrics",
    "check_ports",
    "check_proxy",
    "check_registry",
]

TIMEOUT_SECONDS = 20.0


class PartDown(Exception):
    """A part of ksi dev did not answer."""

    def __init__(self, part: str, reason: str) -> None:
        self.part = part
        super().__init__(f"{part} did not answer: {reason}")


def check_ports(ports: list[tuple[str, int]]) -> str | None:
    """A line naming the first port ksi dev is about to listen on (``(option, port)``, on 127.0.0.1) that
    is not free, or None."""
    problem = listen_problem([(what, "127.0.0.1", port) for what, port in ports])
    return None if problem is None else f"{problem}; pick another port with the option named"


def _kafka_config(bootstrap: str) -> dict[str, str | int | float | bool]:
    return {"bootstrap.servers": bootstrap, "socket.timeout.ms": 10_000, "log_level": 0,
            "reconnect.backoff.max.ms": 500}


def check_broker(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient

    try:
        metadata = AdminClient(_kafka_config(bootstrap)).list_topics(DEMO_TOPIC, timeout=TIMEOUT_SECONDS)
    except Exception as exc:  # noqa: BLE001 - whatever fails, the broker is down for the demo: said in one line
        raise PartDown(f"the broker at {bootstrap}", one_line(exc)) from None
    topic = metadata.topics.get(DEMO_TOPIC)
    if topic is None or topic.error is not None or len(topic.partitions) != DEMO_PARTITIONS:
        raise PartDown(f"the broker at {bootstrap}", f"Metadata for {DEMO_TOPIC!r} is {topic}")


def check_registry(url: str) -> None:
    from ..registry.client import RegistryClient, RegistryClientError

    try:
        versions = RegistryClient(url, timeout_seconds=TIMEOUT_SECONDS).versions(f"{DEMO_TOPIC}-value", fresh=True)
    except RegistryClientError as exc:
        raise PartDown(f"the schema registry at {url}", one_line(exc)) from None
    if not versions:
        raise PartDown(f"the schema registry at {url}", f"no schema under {DEMO_TOPIC}-value")


def check_catalog(data_dir: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    try:
        SqlCatalog(CATALOG_NAME, **catalog_properties(data_dir)).load_table(DEMO_TABLE)
    except Exception as exc:  # noqa: BLE001 - whatever fails, the catalog is down for the demo: said in one line
        raise PartDown(f"the Iceberg catalog ({data_dir / 'catalog.db'})", one_line(exc)) from None


def check_proxy(bootstrap: str, lake_first: int | None) -> None:
    """Metadata and ListOffsets through the proxy: the topic is there, and (when the lake holds its first
    offsets) EARLIEST is the lake's first offset, so history is served."""
    from confluent_kafka import Consumer, TopicPartition

    part = f"the proxy at {bootstrap}"
    consumer = Consumer({**_kafka_config(bootstrap), "group.id": "ksi-dev-check", "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(DEMO_TOPIC, timeout=TIMEOUT_SECONDS)
        if DEMO_TOPIC not in metadata.topics or metadata.topics[DEMO_TOPIC].error is not None:
            raise PartDown(part, f"Metadata does not list {DEMO_TOPIC!r}")
        for partition in range(DEMO_PARTITIONS):
            low, _high = consumer.get_watermark_offsets(TopicPartition(DEMO_TOPIC, partition),
                                                       timeout=TIMEOUT_SECONDS, cached=False)
            if lake_first is not None and low != lake_first:
                raise PartDown(f"history through {part}", f"EARLIEST of {DEMO_TOPIC}[{partition}] is {low}, not the"
                               f" lake's first offset {lake_first} (is the catalog readable? see the log above)")
    except PartDown:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever fails, the proxy is down for the demo: said in one line
        raise PartDown(part, one_line(exc)) from None
    finally:
        consumer.close()


def check_metrics(url: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as answer:
            text = answer.read().decode()
    except (TimeoutError, OSError) as exc:
        raise PartDown(f"metrics at {url}", one_line(exc)) from None
    if "ksi_client_connections_total" not in text:
        raise PartDown(f"metrics at {url}", "no ksi metrics in the answer")
