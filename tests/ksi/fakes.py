"""A fake Kafka cluster for protocol corners no real single-node broker here can produce:
several brokers, slow responses, a broker that dies mid-request, ACLs that allow DESCRIBE but not READ,
a successful SASL login (no broker installable here keeps SCRAM users: tansu's --authentication
rejects every user, see tests/integration/test_auth.py), and what the Java client does that the single-node
brokers here never ask of it: leader epochs in Metadata with OffsetsForLeaderEpoch (neither noida-db nor tansu
reports an epoch), and fetch sessions granted (KIP-227).  Built on the same codec as ksi."""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import trio
from kafka.protocol.admin import DescribeClusterResponse
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata import ApiVersionsResponse, FindCoordinatorResponse, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from protocol import FrameReader, api, encode_body, encode_response_header, frame, parse_request_header


@dataclass
class FakeBroker:
    node_id: int
    cluster: FakeCluster
    port: int = 0
    delay: dict[int, float] = field(default_factory=dict)  # api key -> seconds before answering
    received: list[tuple[int, int]] = field(default_factory=list)  # (api key, version)
    scope: trio.CancelScope | None = None

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as self.scope:
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
            self.port = listeners[0].socket.getsockname()[1]
            task_status.started(self)
            await trio.serve_listeners(self._handle, listeners)

    def kill(self) -> None:
        assert self.scope is not None
        self.scope.cancel()

    async def _handle(self, stream: trio.SocketStream) -> None:
        reader = FrameReader(1 << 24)
        session: dict[str, Any] = {}  # this connection's SASL state
        async with stream:
            while data := await stream.receive_some(65536):
                reader.receive_data(data)
                while (request := reader.next_frame()) is not None:
                    header = parse_request_header(request)
                    self.received.append((header.api_key, header.api_version))
                    await trio.sleep(self.delay.get(header.api_key, 0))
                    body = self.answer(header.api_key, header.api_version, request[header.body_offset:], session)
                    if body is None:
                        continue
                    entry = api(header.api_key)
                    assert entry is not None
                    head = encode_response_header(header.correlation_id,
                                                  entry.response_header_version(header.api_version))
                    await stream.send_all(frame(head + body))

    def answer(self, key: int, version: int, body: Any = b"", session: dict[str, Any] | None = None) -> bytes | None:
        brokers = self.cluster.brokers
        session = {} if session is None else session
        if key == 17:  # SaslHandshake: PLAIN only
            mechanism = SaslHandshakeRequest.decode(body, version=version).mechanism
            session["mechanism"] = mechanism
            return encode_body(SaslHandshakeResponse(version=version, error_code=0 if mechanism == "PLAIN" else 33,
                                                     mechanisms=["PLAIN"]), version)
        if key == 36:  # SaslAuthenticate, PLAIN: authzid NUL user NUL password against cluster.users
            auth = bytes(SaslAuthenticateRequest.decode(body, version=version).auth_bytes)
            _, user, password = auth.decode().split("\x00")
            ok = self.cluster.users.get(user) == password
            if ok:
                session["principal"] = f"User:{user}"
            return encode_body(SaslAuthenticateResponse(
                version=version, error_code=0 if ok else 58, error_message=None if ok else "Authentication failed",
                auth_bytes=b"", session_lifetime_ms=0), version)
        if key == 18:  # ApiVersions: everything ksi knows, plus one key it does not (68)
            V = ApiVersionsResponse.ApiVersion
            keys = [V(version=version, api_key=k, min_version=0, max_version=api(k).max_version)  # type: ignore[union-attr]
                    for k in (0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 17, 18, 23, 36, 60)]
            keys.append(V(version=version, api_key=68, min_version=0, max_version=0))
            return encode_body(ApiVersionsResponse(version=version, error_code=0, api_keys=keys, throttle_time_ms=0),
                               version)
        if key == 3:
            B = MetadataResponse.MetadataResponseBroker
            return encode_body(MetadataResponse(
                version=version, throttle_time_ms=0,
                brokers=[B(version=version, node_id=b.node_id, host="127.0.0.1", port=b.port, rack=None)
                         for b in brokers],
                cluster_id="fake", controller_id=self.node_id,
                topics=[self._topic(t, version) for t in self.cluster.topics],
                authorized_operations=set()), version)
        if key == 2:  # ListOffsets: the cluster's log start / end per topic, or its refusal
            request = ListOffsetsRequest.decode(body, version=version)
            T = ListOffsetsResponse.ListOffsetsTopicResponse
            topics = []
            for t in request.topics:
                parts = []
                for p in t.partitions:
                    start, end = self.cluster.offsets.get(t.name, (0, 0))
                    parts.append(T.ListOffsetsPartitionResponse(
                        version=version, partition_index=p.partition_index,
                        error_code=self.cluster.refuse.get(t.name, 0), timestamp=-1,
                        offset=start if p.timestamp == -2 else end))
                topics.append(T(version=version, name=t.name, partitions=parts))
            return encode_body(ListOffsetsResponse(version=version, throttle_time_ms=0, topics=topics), version)
        if key == 10:
            coordinator = brokers[-1]
            if version >= 4:
                C = FindCoordinatorResponse.Coordinator
                return encode_body(FindCoordinatorResponse(version=version, throttle_time_ms=0, coordinators=[
                    C(version=version, key="g", node_id=coordinator.node_id, host="127.0.0.1", port=coordinator.port,
                      error_code=0, error_message=None)]), version)
            return encode_body(FindCoordinatorResponse(version=version, throttle_time_ms=0, error_code=0,
                                                       error_message=None, node_id=coordinator.node_id,
                                                       host="127.0.0.1", port=coordinator.port), version)
        if key == 60:
            B2 = DescribeClusterResponse.DescribeClusterBroker
            return encode_body(DescribeClusterResponse(
                version=version, throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=1,
                cluster_id="fake", controller_id=self.node_id,
                brokers=[B2(version=version, broker_id=b.node_id, host="127.0.0.1", port=b.port, rack=None)
                         for b in brokers], authorized_operations=set()), version)
        if key == 23:
            return self._offsets_for_leader_epoch(OffsetForLeaderEpochRequest.decode(body, version=version), version)
        if key == 1 and self.cluster.logs:  # only then is a Fetch decoded (the fuzz tests send broken ones)
            logged = self._fetch_log(FetchRequest.decode(body, version=version), version)
            if logged is not None:
                return logged
        if key == 1 and version == 4:  # ksi's READ probe: the partition's end, or the READ refusal
            request = FetchRequest.decode(body, version=version)
            R = FetchResponse
            return encode_body(R(version=version, throttle_time_ms=0, responses=[R.FetchableTopicResponse(
                version=version, topic=t.topic, partitions=[R.FetchableTopicResponse.PartitionData(
                    version=version, partition_index=p.partition, error_code=self.cluster.deny_read.get(t.topic, 0),
                    high_watermark=self.cluster.offsets.get(t.topic, (0, 0))[1],
                    last_stable_offset=self.cluster.offsets.get(t.topic, (0, 0))[1], aborted_transactions=[],
                    records=b"") for p in t.partitions]) for t in request.topics]), version)
        if key == 1:  # Fetch: "not the leader, it is now the last broker" (KIP-951 node endpoints)
            leader = brokers[-1]
            R = FetchResponse
            error, session_id, name = 6, 0, "t"
            if self.cluster.session_log is not None:  # a broker that grants KIP-227 sessions and keeps offsets
                request = FetchRequest.decode(body, version=version)
                self.cluster.session_log.append((request.session_id, request.session_epoch))
                session_id = 77 if (request.session_id, request.session_epoch) == (0, 0) else 0
                p, name = request.topics[0].partitions[0], request.topics[0].topic
                log_start = self.cluster.offsets.get(name, (0, 0))[0]
                error = 1 if p.fetch_offset < log_start else 0  # OFFSET_OUT_OF_RANGE below the log start
            part = R.FetchableTopicResponse.PartitionData(
                version=version, partition_index=0, error_code=error, high_watermark=-1, last_stable_offset=-1,
                log_start_offset=-1, aborted_transactions=None, preferred_read_replica=-1, records=b"")
            endpoints = [R.NodeEndpoint(version=version, node_id=leader.node_id, host="127.0.0.1", port=leader.port,
                                        rack=None)] if version >= 16 else None
            topic = R.FetchableTopicResponse(version=version, topic=name, partitions=[part])
            if version >= 13:
                topic.topic_id = self.cluster.topic_id
            return encode_body(R(version=version, throttle_time_ms=0, error_code=0, session_id=session_id,
                                 responses=[topic],
                                 **({"node_endpoints": endpoints} if endpoints else {})), version)
        if key == 9:  # OffsetFetch: the group's committed offsets, from its coordinator only
            request = OffsetFetchRequest.decode(body, version=version)
            OT = OffsetFetchResponse.OffsetFetchResponseTopic
            error = 0 if self.node_id == self.cluster.coordinator else 16  # NOT_COORDINATOR (v0-v1: per partition)
            return encode_body(OffsetFetchResponse(version=version, throttle_time_ms=0, error_code=error, topics=[OT(
                version=version, name=t.name, partitions=[OT.OffsetFetchResponsePartition(
                    version=version, partition_index=p, committed_offset=self.cluster.group_offsets.get(
                        (request.group_id, t.name, p), -1) if not error else -1,
                    committed_leader_epoch=-1, metadata="", error_code=error) for p in t.partition_indexes])
                for t in request.topics]), version)
        if key == 0:
            return None  # only reached with acks=0 in the tests
        raise AssertionError(f"fake broker got unexpected api {key}")

    def _fetch_log(self, request: Any, version: int) -> bytes | None:
        """A Fetch of a topic with a log (:meth:`FakeCluster.add_log`): its batches from the fetch offset on.
        Sessions, when the cluster grants them: a request of session epoch 0 opens one (a new id); a later
        epoch is answered for the partitions it lists (enough for a client whose position moved)."""
        names = [self.cluster.topic_name(t.topic_id if version >= 13 else t.topic) for t in request.topics]
        if not any(name in self.cluster.logs for name in names):
            return None
        if version != 4:  # not ksi's READ probe
            self.cluster.fetch_sessions.append((request.session_id, request.session_epoch))
        session_id = 0
        if self.cluster.grant_sessions and version >= 7 and request.session_epoch >= 0:
            session_id = request.session_id or next(self.cluster.session_ids)
        R = FetchResponse
        responses = []
        for topic, name in zip(request.topics, names, strict=True):
            log = self.cluster.logs.get(name or "")
            parts = []
            for p in topic.partitions:
                error, records = 3, b""  # UNKNOWN_TOPIC_OR_PARTITION
                if log is not None and p.partition == 0:
                    error, records = log.read(p.fetch_offset)
                end = log.end if log is not None else -1
                parts.append(R.FetchableTopicResponse.PartitionData(
                    version=version, partition_index=p.partition, error_code=error, high_watermark=end,
                    last_stable_offset=end, log_start_offset=log.start if log is not None else -1,
                    aborted_transactions=[], preferred_read_replica=-1, records=records))
            entry = R.FetchableTopicResponse(version=version, partitions=parts)
            if version >= 13:
                entry.topic_id = topic.topic_id
            else:
                entry.topic = topic.topic
            responses.append(entry)
        return encode_body(R(version=version, throttle_time_ms=0, error_code=0, session_id=session_id,
                             responses=responses), version)

    def _offsets_for_leader_epoch(self, request: Any, version: int) -> bytes:
        """As a Kafka broker whose epoch cache holds one epoch (the cluster's leader epoch, from the log
        start): that epoch ends at the log end; an older one is answered with the first cached epoch's start
        (the log start); a newer one is unknown (epoch and offset -1)."""
        R = OffsetForLeaderEpochResponse
        topics = []
        for t in request.topics:
            log = self.cluster.logs.get(t.topic)
            parts = []
            for p in t.partitions:
                self.cluster.epoch_requests.append((t.topic, p.partition, p.current_leader_epoch, p.leader_epoch))
                current = self.cluster.leader_epoch
                if log is None:
                    answer = (3, -1, -1)
                elif p.current_leader_epoch not in (-1, current):
                    answer = (74 if p.current_leader_epoch < current else 59, -1, -1)  # FENCED / UNKNOWN
                elif p.leader_epoch == current:
                    answer = (0, current, log.end)
                elif p.leader_epoch < current:
                    answer = (0, p.leader_epoch, log.start)
                else:
                    answer = (0, -1, -1)
                parts.append(R.OffsetForLeaderTopicResult.EpochEndOffset(
                    version=version, error_code=answer[0], partition=p.partition, leader_epoch=answer[1],
                    end_offset=answer[2]))
            topics.append(R.OffsetForLeaderTopicResult(version=version, topic=t.topic, partitions=parts))
        return encode_body(R(version=version, throttle_time_ms=0, topics=topics), version)

    def _topic(self, name: str, version: int) -> Any:
        T = MetadataResponse.MetadataResponseTopic
        leader = self.cluster.brokers[-1].node_id
        return T(version=version, error_code=0, name=name, topic_id=self.cluster.topic_id, is_internal=False,
                 partitions=[T.MetadataResponsePartition(version=version, error_code=0, partition_index=0,
                                                         leader_id=leader, leader_epoch=self.cluster.leader_epoch,
                                                         replica_nodes=[leader],
                                                         isr_nodes=[leader], offline_replicas=[])])


@dataclass
class FakeLog:
    """Partition 0 of a topic the fake brokers serve records for: offsets ``start`` to ``end - 1``."""

    start: int
    end: int
    batches: list[tuple[int, int, bytes]]  # (base offset, last offset, RecordBatch bytes)

    def read(self, offset: int) -> tuple[int, bytes]:
        """(error code, records) of a Fetch at ``offset``: every batch from the one holding it on."""
        if not self.start <= offset <= self.end:
            return 1, b""  # OFFSET_OUT_OF_RANGE
        return 0, b"".join(batch for _, last, batch in self.batches if last >= offset)


@dataclass
class FakeCluster:
    brokers: list[FakeBroker] = field(default_factory=list)
    topic_id: uuid.UUID = field(default_factory=uuid.uuid4)
    topics: list[str] = field(default_factory=list)                     # topics Metadata lists
    offsets: dict[str, tuple[int, int]] = field(default_factory=dict)   # topic -> (log start, log end)
    refuse: dict[str, int] = field(default_factory=dict)                # topic -> ListOffsets error code
    deny_read: dict[str, int] = field(default_factory=dict)             # topic -> Fetch error (DESCRIBE, no READ)
    users: dict[str, str] = field(default_factory=dict)                 # SASL PLAIN user -> password
    coordinator: int = 3                                                # node id of every group's coordinator
    group_offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)  # (group, topic, partition)
    session_log: list[tuple[int, int]] | None = None  # set: a Fetch of "t"/"u" grants sessions, logs (id, epoch)
    leader_epoch: int = 0                                               # every partition's, in Metadata
    logs: dict[str, FakeLog] = field(default_factory=dict)              # topic -> records Fetch serves
    grant_sessions: bool = False                                        # KIP-227 fetch sessions
    fetch_sessions: list[tuple[int, int]] = field(default_factory=list)  # (id, epoch) of each log Fetch
    epoch_requests: list[tuple[str, int, int, int]] = field(default_factory=list)  # OffsetsForLeaderEpoch
    session_ids: Iterator[int] = field(default_factory=lambda: itertools.count(101))

    @classmethod
    async def start(cls, nursery: trio.Nursery, node_ids: tuple[int, ...] = (1, 2, 3)) -> FakeCluster:
        cluster = cls()
        for node_id in node_ids:
            cluster.brokers.append(await nursery.start(FakeBroker(node_id, cluster).serve))
        return cluster

    def topic_name(self, name_or_id: str | uuid.UUID) -> str | None:
        """A Fetch's topic by name, or by id (every topic has the cluster's one id: the first with a log)."""
        if isinstance(name_or_id, str):
            return name_or_id
        return next(iter(self.logs), None) if name_or_id == self.topic_id else None

    def add_log(self, topic: str, start: int, end: int, batch_size: int = 10) -> None:
        """``topic``'s partition 0 holds offsets ``start..end-1`` (value b"v<offset>", no key, timestamp
        1,700,000,000,000 ms as tests/ksi/test_proxy.raw_value_table's), in batches of ``batch_size``
        stamped with the cluster's leader epoch; Metadata lists it and ListOffsets answers its range."""
        import numpy as np
        import pyarrow as pa

        from ksi.lake.columns import Columns
        from protocol.records import encode_batch

        batches = []
        for base in range(start, end, batch_size):
            last = min(end, base + batch_size) - 1
            n = last - base + 1
            columns = Columns(np.arange(base, last + 1, dtype=np.int64),
                              np.full(n, 1_700_000_000_000, dtype=np.int64), pa.nulls(n, pa.binary()),
                              pa.array([b"v%d" % o for o in range(base, last + 1)], pa.binary()))
            batches.append((base, last, encode_batch(columns, partition_leader_epoch=self.leader_epoch)))
        self.logs[topic] = FakeLog(start, end, batches)
        self.offsets[topic] = (start, end)
        if topic not in self.topics:
            self.topics.append(topic)

    async def restart(self, broker: FakeBroker, nursery: trio.Nursery) -> None:
        fresh = FakeBroker(broker.node_id, self, port=broker.port)
        self.brokers[self.brokers.index(broker)] = await nursery.start(fresh.serve)


async def sleep_forever() -> None:
    await trio.sleep(math.inf)
