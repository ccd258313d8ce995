"""Lake-only topics: a configured table whose Kafka topic does not exist is served as a read-only topic.

* **Metadata** lists it (when asked for all topics or for it by name) with one partition per Kafka
  partition in the table, led round-robin by the cluster's brokers (ksi's listener for that broker
  answers its fetches), and a topic id derived from the name.  Its name is taken out of the request
  the broker sees, so a broker that auto-creates topics never creates it.
* **Fetch** and **ListOffsets** are answered from the lake alone (see :mod:`ksi.history.routing`).
* **Produce** to it is refused per partition with INVALID_TOPIC_EXCEPTION and a message saying why;
  the rest of the request goes to the broker.
* **Who may read it**: the cluster cannot authorise a topic it does not have, so the topic's
  ``lake_only_readers`` decide, default nobody.  The principal is the one the broker accepted on the
  client's own connection (SASL user, TLS certificate, else ``User:ANONYMOUS``).  Anyone else gets
  TOPIC_AUTHORIZATION_FAILED for it (Metadata naming it, Fetch, ListOffsets) and does not see it in an
  all-topics Metadata, as a broker hides topics a client may not describe.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from kafka.protocol.api_message import ApiMessage, ApiMessageData
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from protocol import RequestHeader, decode_body, encode_body, encode_response_header, known_api
from protocol.error_responses import produce_topic_error
from protocol.errors import (
    INVALID_TOPIC_EXCEPTION,
    LEADER_NOT_AVAILABLE,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
)

from ..lake.table import OffsetRange
from ..upstream import decode_response
from .service import History
from .watermarks import Upstream

__all__ = ["MAX_PARTITIONS", "LakeOnlyTopics", "lake_only_partitions", "lake_topic_id"]

log = logging.getLogger("ksi.history")

METADATA = known_api(3)
PRODUCE = known_api(0)

_NAMESPACE = uuid.UUID("6b7369c0-1a4e-4b5e-9c3d-0000006b7369")


MAX_PARTITIONS = 10_000  # a lake-only topic's partitions: rows of higher partitions are not served


def lake_only_partitions(ranges: dict[int, OffsetRange]) -> int:
    """How many partitions a lake-only topic has: up to its highest partition with rows (partitions below it
    without rows are empty), never more than MAX_PARTITIONS (a table's rows are untrusted: one row with a
    partition of 2**31 - 1 must not make a topic of two billion partitions)."""
    held = [p for p in ranges if p < MAX_PARTITIONS]
    return max(held) + 1 if held else 0


def lake_topic_id(name: str) -> uuid.UUID:
    """A stable topic id for a lake-only topic (Fetch v13+ and Metadata v10+ name topics by id)."""
    return uuid.uuid5(_NAMESPACE, name)


class LakeOnlyTopics:
    def __init__(self, history: History, learn_topic_id: Callable[[str | None, uuid.UUID | None], None]) -> None:
        self.history = history
        self._learn_topic_id = learn_topic_id
        self._warned: set[str] = set()

    @property
    def names(self) -> frozenset[str]:
        return self.history.lake_only

    def named_in(self, request: bytes | memoryview) -> bool:
        """Cheap pre-check before decoding: does the frame mention a lake-only topic at all, by name or (Fetch
        v13+, Produce v13+) by its topic id's 16 bytes?"""
        data = bytes(request)
        return any(name.encode() in data or lake_topic_id(name).bytes in data for name in self.names)

    def may_read(self, name: str, upstream: Upstream, client: str) -> bool:
        """May this connection's principal read lake-only topic ``name``?  A refusal is logged once per
        connection and topic, with the principal (never a credential) and the setting that decides."""
        config = self.history.config_for(name)
        principal = upstream.principal
        if config is not None and config.may_read_lake_only(principal):
            return True
        if name not in upstream.denied:
            upstream.denied.add(name)
            log.warning("%s: %s may not read lake-only topic %s: not in its lake_only_readers (%s) in %s", client,
                        principal, name, ", ".join(config.lake_only_readers) if config and config.lake_only_readers
                        else "empty: nobody", self.history.config.source)
        return False

    # -- Metadata ------------------------------------------------------------------------------

    async def metadata(self, header: RequestHeader, request: bytes | memoryview, upstream: Upstream,
                       client: str) -> bytes | memoryview:
        """The broker's Metadata response with the lake-only topics added (before address rewriting)."""
        version = header.api_version
        assert header.body_offset is not None
        message = decode_body(MetadataRequest, version, request[header.body_offset:])
        lake_only = self.names
        asked: list[str] | None = None
        if message.topics is not None:
            names = [t.name for t in message.topics]
            asked = [n for n in names if n in lake_only]
            if not asked:
                return await upstream.call(bytes(request), "Metadata")
            message.topics = [t for t in message.topics if t.name not in lake_only]
        message.with_header(correlation_id=0, client_id=header.client_id)
        raw = await upstream.call(bytes(message.encode(version=version, header=True)), "Metadata")
        header_version = METADATA.response_header_version(version)
        response = decode_response(MetadataResponse, version, raw, header_version)
        if message.topics is not None and not message.topics and version == 0:
            response.topics = []  # v0 reads an empty list as "all topics"; the client asked only for lake-only ones
        wanted = sorted(asked if asked is not None else lake_only)
        for name in wanted:
            if self.may_read(name, upstream, client):
                response.topics.append(await self._topic(name, version, response.brokers))
            elif asked is not None:  # named: say it is refused; all topics: leave it out, as a broker does
                response.topics.append(self._refused_topic(name, version))
        return encode_response_header(header.correlation_id, header_version) + encode_body(response, version)

    @staticmethod
    def _refused_topic(name: str, version: int) -> ApiMessageData:
        T = MetadataResponse.MetadataResponseTopic
        topic = T(version=version, error_code=TOPIC_AUTHORIZATION_FAILED, name=name, is_internal=False, partitions=[])
        if version >= 10:
            topic.topic_id = uuid.UUID(int=0)
        return topic

    async def _topic(self, name: str, version: int, brokers: list[ApiMessageData]) -> ApiMessageData:
        T = MetadataResponse.MetadataResponseTopic
        P = T.MetadataResponsePartition
        topic_id = lake_topic_id(name)
        self._learn_topic_id(name, topic_id)
        topic = T(version=version, error_code=NONE, name=name, is_internal=False, partitions=[])
        if version >= 10:
            topic.topic_id = topic_id
        ranges = await self.history.ranges(name)
        if not ranges:
            # Not readable right now (catalog down, table empty): retriable, so clients ask again.
            topic.error_code = LEADER_NOT_AVAILABLE if name in self.history.problems else UNKNOWN_TOPIC_OR_PARTITION
            return topic
        if not brokers:
            topic.error_code = LEADER_NOT_AVAILABLE
            return topic
        nodes = sorted(b.node_id for b in brokers)
        beyond = [p for p in ranges if p >= MAX_PARTITIONS]
        if beyond and name not in self._warned:
            self._warned.add(name)
            config = self.history.config_for(name)
            log.error("lake-only topic %s: table %s holds rows of partition(s) %s, beyond the %d partitions a lake-only"
                      " topic may have: those rows are not served", name, config.table if config else "?",
                      ", ".join(map(str, sorted(beyond)[:5])), MAX_PARTITIONS)
        for index in range(lake_only_partitions(ranges)):
            leader = nodes[index % len(nodes)]
            partition = P(version=version, error_code=NONE, partition_index=index, leader_id=leader,
                          replica_nodes=[leader], isr_nodes=[leader])
            if version >= 7:
                partition.leader_epoch = 0
            if version >= 5:
                partition.offline_replicas = []
            topic.partitions.append(partition)
        return topic

    # -- Produce -------------------------------------------------------------------------------

    def _topic_name(self, topic: ApiMessageData, version: int) -> str | None:
        if version >= 13:
            return next((n for n in self.names if lake_topic_id(n) == topic.topic_id), None)
        return str(topic.name)

    def split_produce(self, header: RequestHeader, request: bytes | memoryview
                      ) -> tuple[ApiMessage, list[ApiMessageData], bytes | None]:
        """Decode a Produce naming lake-only topics: (the request, its lake-only topic entries, the request
        for the broker without them, or None when nothing is left for the broker)."""
        version = header.api_version
        assert header.body_offset is not None
        message = decode_body(ProduceRequest, version, request[header.body_offset:])
        refused = [t for t in message.topic_data if self._topic_name(t, version) in self.names]
        kept = [t for t in message.topic_data if t not in refused]
        forward = None
        if kept:
            message.topic_data = kept
            message.with_header(correlation_id=0, client_id=header.client_id)
            forward = bytes(message.encode(version=version, header=True))
        return message, refused, forward

    async def produce(self, header: RequestHeader, request: bytes | memoryview, upstream: Upstream,
                      client: str) -> bytes | memoryview:
        """Refuse the lake-only part of a Produce (acks != 0), forward the rest, one response."""
        version = header.api_version
        _, refused, forward = self.split_produce(header, request)
        header_version = PRODUCE.response_header_version(version)
        if forward is not None:
            raw = await upstream.call(forward, "Produce")
            response = decode_response(ProduceResponse, version, raw, header_version)
        else:
            response = ProduceResponse(version=version, responses=[], throttle_time_ms=0)
        for topic in refused:
            name = self._topic_name(topic, version)
            config = self.history.config_for(name) if name else None
            message = (f"topic {name} is read-only: it exists only in the Iceberg table"
                       f" {config.table if config else '?'}, served by ksi; produce to a Kafka topic instead")
            log.warning("%s: Produce refused: %s", client, message)
            response.responses.append(produce_topic_error(topic, version, INVALID_TOPIC_EXCEPTION, message))
        return encode_response_header(header.correlation_id, header_version) + encode_body(response, version)
