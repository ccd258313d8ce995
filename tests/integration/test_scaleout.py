"""Three ksi instances as one service behind a real load balancer (Debian's HAProxy, TCP mode, round robin,
a frontend for the bootstrap and one for the broker), all on one host: each instance listens on ports of
its own and advertises the balancer's port for the broker (``proxy.advertised_ports``).

A history topic (the lake holds offsets 0..7999 of each partition, the broker 6000 on) is replayed
across the seam by 8 assigned consumers and a consumer group of two, every offset exactly once and every
record as produced, while connections rotate (``proxy.connection_max_age_seconds``) and one instance is
killed with SIGKILL mid-replay; the group's committed offsets end at the end of each partition.  Then the
killed instance comes back and the rotating connections spread onto it again.  Also: ``ksi serve`` refuses
to start when a configured port is taken, naming the port and the key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from pyiceberg.catalog.sql import SqlCatalog

from conftest import REPO_ROOT, to_toml
from ksi.brokers import BrokerProcess, free_port
from ksi.history.ksi_table import arrow_schema, partition_spec, raw_value_schema, sort_order
from ksi.lake.commits import ARCHIVED_OFFSETS
from tests.haproxy import HAProxy, Route, find_haproxy

PARTITIONS = 4
PER_PARTITION = 12_500
ARCHIVED_BELOW = 8_000    # the lake holds 0..7999 of each partition
LOG_START = 6_000         # the broker deletes below this: 6000..7999 are in both
INSTANCES = 3
MAX_AGE_SECONDS = 4.0
READERS = 8
# Records per second each consumer reads at most: a reader's replay (50,000 records) takes 25 s and a group
# member's half 12.5 s, so the kill lands mid-replay for every one of them, on a fast machine too.
PACE = 2_000
BASE_TS = (int(time.time()) - 3600) * 1000  # noida-db's time retention is 7 days


def key_of(partition: int, offset: int) -> bytes | None:
    return None if offset % 31 == 0 else f"k{partition}-{offset}".encode()


def value_of(partition: int, offset: int) -> bytes:
    return f"{partition}:{offset}:".encode().ljust(60 + offset % 80, b"x")


def headers_of(partition: int, offset: int) -> list[tuple[str, str | bytes | None]] | None:
    return [("n", str(offset).encode())] if offset % 3 == 0 else None


def check_record(message: Any) -> tuple[int, int]:
    p, o = message.partition(), message.offset()
    assert (message.key(), message.value()) == (key_of(p, o), value_of(p, o)), f"partition {p} offset {o} differs"
    assert (message.headers() or None) == headers_of(p, o), f"partition {p} offset {o}: headers differ"
    assert message.timestamp()[1] == BASE_TS + o, f"partition {p} offset {o}: timestamp differs"
    return p, o


# -- the service ------------------------------------------------------------------------------------------


@dataclass
class Instance:
    """One ``ksi serve``: its own bootstrap and broker ports, the balancer's port advertised."""

    index: int
    config_path: Path
    log_path: Path
    bootstrap_port: int
    broker_port: int
    metrics_port: int
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    starts: int = 0

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
                   PYTHONUNBUFFERED="1")
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
            log.flush()
            self.process = subprocess.Popen([sys.executable, "-m", "ksi", "serve", "--config", str(self.config_path)],
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            cwd=REPO_ROOT, env=env)
        deadline = time.monotonic() + 30
        while True:
            assert self.process.poll() is None, f"ksi {self.index} exited while starting\n{self.log_tail()}"
            try:
                self.metrics()
                return
            except OSError:
                assert time.monotonic() < deadline, f"ksi {self.index} did not start\n{self.log_tail()}"
                time.sleep(0.1)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int:
        if self.process is None or self.process.poll() is not None:
            return 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"ksi {self.index} did not stop on SIGTERM\n{self.log_tail()}") from None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())

    def metric(self, name: str, listener: str) -> float:
        prefix = f'{name}{{listener="{listener}"}} '
        for line in self.metrics().splitlines():
            if line.startswith(prefix):
                return float(line[len(prefix):])
        return 0.0

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"--- {self.log_path} ---\n" + "\n".join(text.splitlines()[-lines:])


@dataclass
class Service:
    broker: BrokerProcess
    node_id: int
    topic: str
    instances: list[Instance]
    balancer: HAProxy
    bootstrap: str

    @property
    def listener(self) -> str:
        return f"broker-{self.node_id}"


def archive(catalog: SqlCatalog, table_name: str, topic: str) -> None:
    """Offsets 0..ARCHIVED_BELOW-1 of each partition in ksi's layout, committed with the next offset per
    partition in the snapshot summary, as ``ksi archive`` commits."""
    rows = [(p, o) for p in range(PARTITIONS) for o in range(ARCHIVED_BELOW)]
    headers_type = arrow_schema().field("kafka_headers").type
    data = pa.table({
        "kafka_partition": pa.array([p for p, _ in rows], pa.int32()),
        "kafka_offset": pa.array([o for _, o in rows], pa.int64()),
        "kafka_timestamp": pa.array([(BASE_TS + o) * 1000 for _, o in rows], pa.timestamp("us", tz="UTC")),
        "kafka_timestamp_type": pa.array([0] * len(rows), pa.int32()),
        "kafka_key": pa.array([key_of(p, o) for p, o in rows], pa.binary()),
        "kafka_headers": pa.array([[{"key": k, "value": v} for k, v in headers_of(p, o) or []] for p, o in rows],
                                  headers_type),
        "kafka_value": pa.array([value_of(p, o) for p, o in rows], pa.binary()),
        "kafka_value_schema_id": pa.nulls(len(rows), pa.int32()),
    }, schema=arrow_schema())
    table = catalog.create_table(table_name, schema=raw_value_schema(), partition_spec=partition_spec(),
                                 sort_order=sort_order())
    table.append(data, snapshot_properties={
        ARCHIVED_OFFSETS: json.dumps({str(p): ARCHIVED_BELOW for p in range(PARTITIONS)}), "ksi.topic": topic})


def produce(bootstrap: str, topic: str, first: int, last: int) -> None:
    # batches of at most 100 records: noida-db's DeleteRecords drops whole batches
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 100,
                         "queue.buffering.max.messages": 1_000_000})
    for p in range(PARTITIONS):
        for o in range(first, last):
            producer.produce(topic, key=key_of(p, o), value=value_of(p, o), headers=headers_of(p, o), partition=p,
                             timestamp=BASE_TS + o)
        producer.poll(0)
    assert producer.flush(60) == 0


@pytest.fixture(scope="module")
def service(noida: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    try:
        find_haproxy()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    root = tmp_path_factory.mktemp("scaleout")
    (root / "warehouse").mkdir()
    props = {"uri": f"sqlite:///{root / 'catalog.db'}", "warehouse": f"file://{root / 'warehouse'}"}
    catalog = SqlCatalog("lake", **props)
    catalog.create_namespace("history")
    topic = f"scale-{uuid.uuid4().hex[:8]}"
    table = f"history.{topic.replace('-', '_')}"
    noida.create_topic(topic, PARTITIONS)
    produce(noida.bootstrap, topic, 0, PER_PARTITION)
    archive(catalog, table, topic)
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, LOG_START)
    node_id = next(iter(Consumer({"bootstrap.servers": noida.bootstrap, "group.id": "x"}).list_topics(
        timeout=10).brokers))

    bootstrap_front, broker_front = free_port(), free_port()
    instances = []
    for i in range(INSTANCES):
        instance = Instance(i, root / f"ksi-{i}.toml", root / f"ksi-{i}.log", free_port(), free_port(), free_port())
        instance.config_path.write_text(to_toml({
            "proxy": {"listen": f"127.0.0.1:{instance.bootstrap_port}", "advertised_host": "127.0.0.1",
                      "node_ports": {str(node_id): instance.broker_port},
                      "advertised_ports": {str(node_id): broker_front},
                      "connection_max_age_seconds": MAX_AGE_SECONDS, "max_frame_bytes": 256 << 20},
            "upstream": {"bootstrap_servers": noida.bootstrap},
            "metrics": {"listen": f"127.0.0.1:{instance.metrics_port}"},
            "catalog": {"name": "lake", **props},
            "topics": [{"name": topic, "table": table}],
        }), encoding="utf-8")
        instances.append(instance)
    balancer = HAProxy([Route("bootstrap", bootstrap_front, tuple(("127.0.0.1", i.bootstrap_port) for i in instances)),
                        Route(f"broker-{node_id}", broker_front,
                              tuple(("127.0.0.1", i.broker_port) for i in instances))], root / "haproxy")
    try:
        for instance in instances:
            instance.start()
        balancer.start()
        yield Service(noida, node_id, topic, instances, balancer, f"127.0.0.1:{bootstrap_front}")
    finally:
        balancer.stop()
        problems = []
        for instance in instances:  # every instance is stopped, whatever one of them did
            try:
                code = instance.stop()
            except AssertionError as exc:
                problems.append(str(exc))
                continue
            if code != 0:
                problems.append(f"ksi {instance.index} exited with {code}\n{instance.log_tail()}")
            elif "Traceback" in instance.log_path.read_text(errors="replace"):
                problems.append(f"ksi {instance.index} logged a traceback\n{instance.log_tail(150)}")
        if problems:
            pytest.fail("\n\n".join(problems), pytrace=False)


# -- consumers ---------------------------------------------------------------------------------------------


def consumer_config(bootstrap: str, group: str | None = None) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "group.id": group or f"r-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.queue.backoff.ms": 10,
            "receive.message.max.bytes": 256_000_000, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
            "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "log.connection.close": False,
            "max.partition.fetch.bytes": 256 * 1024, "log_level": 3}


class Reader(threading.Thread):
    """An assigned consumer reading every partition from offset 0 to the end, slowly enough that the kill
    lands mid-replay; keeps polling at the end (holding its connections) until told to stop."""

    def __init__(self, bootstrap: str, topic: str, end: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.end = bootstrap, topic, end
        self.seen: dict[int, set[int]] = {p: set() for p in range(PARTITIONS)}
        self.count = 0
        self.duplicates: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self.stop_event = threading.Event()
        self.failure: BaseException | None = None

    def done(self) -> bool:
        return all(len(self.seen[p]) >= self.end for p in range(PARTITIONS))

    def run(self) -> None:
        try:
            consumer = Consumer(consumer_config(self.bootstrap))
            consumer.assign([TopicPartition(self.topic, p, 0) for p in range(PARTITIONS)])
            try:
                while not self.stop_event.is_set():
                    messages = consumer.consume(500, 0.5)
                    for message in messages:
                        if message.error():
                            self.errors.append(str(message.error()))
                            continue
                        p, o = check_record(message)
                        if o in self.seen[p]:
                            self.duplicates.append((p, o))
                        self.seen[p].add(o)
                        self.count += 1
                    time.sleep(max(0.02, len(messages) / PACE))
            finally:
                consumer.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.failure = exc


class GroupMember(threading.Thread):
    """A member of a consumer group that commits what it processed (asynchronously as it goes, synchronously
    when partitions are revoked and at the end).  Its partitions stay paused until the group is stable (the
    two members' assignments cover the topic): the first rebalances then cannot hand a processed but
    uncommitted record to the other member.  A rebalance after that is counted (ksi must cause none)."""

    def __init__(self, bootstrap: str, topic: str, group: str, assignments: dict[int, list[int]], index: int
                 ) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.assignments, self.index = assignments, index  # shared by the members: index -> partitions
        self.seen: list[tuple[int, int]] = []
        self.stable = False
        self.rebalances_after_stable = 0
        self.stop_event = threading.Event()
        self.committed = threading.Event()
        self.release = threading.Event()
        self.failure: BaseException | None = None

    def _assign(self, consumer: Any, partitions: list[Any]) -> None:
        self.assignments[self.index] = sorted(tp.partition for tp in partitions)
        if self.stable:
            self.rebalances_after_stable += 1
            return
        consumer.assign(partitions)
        consumer.pause(partitions)

    def _revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self.assignments[self.index] = []
        if partitions and self.stable and not self.committed.is_set():  # leaving: committed already
            commit(consumer, consumer.position(partitions))

    def _group_stable(self) -> bool:
        owned = [p for partitions in list(self.assignments.values()) for p in partitions]
        return (len(self.assignments) == 2 and all(self.assignments.values())
                and sorted(owned) == list(range(PARTITIONS)))

    def run(self) -> None:
        try:
            consumer = Consumer(consumer_config(self.bootstrap, self.group))
            consumer.subscribe([self.topic], on_assign=self._assign, on_revoke=self._revoke)
            processed = 0
            try:
                while not self.stop_event.is_set():
                    messages = consumer.consume(500, 0.5)
                    if not self.stable:
                        assert not messages, "a paused partition delivered records"
                        if self._group_stable():
                            self.stable = True
                            consumer.resume([TopicPartition(self.topic, p) for p in self.assignments[self.index]])
                        continue
                    for message in messages:
                        if not message.error():
                            self.seen.append(check_record(message))
                    processed += len(messages)
                    if messages and processed % 2000 < len(messages):
                        consumer.commit(asynchronous=True)
                    time.sleep(max(0.02, len(messages) / PACE))
                mine = self.assignments.get(self.index, [])
                commit(consumer, consumer.position([TopicPartition(self.topic, p) for p in mine]))
            finally:
                # leave only once every member committed: a member leaving starts a rebalance, and noida-db
                # refuses commits while one is pending (ILLEGAL_GENERATION)
                self.committed.set()
                self.release.wait(60)
                consumer.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.failure = exc


def commit(consumer: Any, offsets: list[Any], attempts: int = 10) -> None:
    """Commit synchronously; a commit cut off by a connection closing (an instance killed) is retried, as
    an application retries a failed commit."""
    offsets = [tp for tp in offsets if tp.offset >= 0]
    if not offsets:
        return
    for attempt in range(attempts):
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
            return
        except KafkaException:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)


def wait_for(condition: Any, timeout: float, what: str | Any) -> None:
    """Wait for ``condition()``; ``what`` (or ``what()``, for the state at the time) says what was awaited."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
        time.sleep(0.2)


def progress(readers: list[Reader], members: list[GroupMember]) -> str:
    lines = [f"reader {i}: " + ", ".join(f"p{p} {len(r.seen[p])} (max {max(r.seen[p], default=-1)})"
                                         for p in range(PARTITIONS)) + f"; errors {r.errors[-3:]}; {r.failure!r}"
             for i, r in enumerate(readers)]
    lines += [f"group member {m.index}: {len(m.seen)} records, assigned {m.assignments.get(m.index)}, {m.failure!r}"
              for m in members]
    return "\n".join(lines)


# -- the tests ---------------------------------------------------------------------------------------------


def test_three_instances_behind_haproxy_replay_exactly_through_a_kill_and_spread_again(service: Service) -> None:
    total = PARTITIONS * PER_PARTITION
    victim = service.instances[1]
    group = f"g-{uuid.uuid4().hex[:8]}"
    assignments: dict[int, list[int]] = {}
    readers = [Reader(service.bootstrap, service.topic, PER_PARTITION) for _ in range(READERS)]
    members = [GroupMember(service.bootstrap, service.topic, group, assignments, i) for i in range(2)]

    def under_way() -> list[int]:
        return [r.count for r in readers] + [sum(len(m.seen) for m in members)]

    for member in members:
        member.start()
    try:
        # the group first (it reads only once both members are assigned), then the readers; once every one
        # of them has read something, mid-replay and still in the lake's part of the topic: kill -9 the
        # instance in the middle
        wait_for(lambda: under_way()[-1] > 0, 120, lambda: f"the group under way:\n{progress(readers, members)}")
        for reader in readers:
            reader.start()
        wait_for(lambda: min(under_way()) > 0, 120,
                 lambda: f"every reader and the group under way:\n{progress(readers, members)}")
        assert victim.metric("ksi_client_connections_active", service.listener) > 0, \
            "the balancer sent no client to the instance about to be killed"
        before = under_way()
        victim.kill()
        after = under_way()
        # the kill landed mid-replay for each of the 8 readers and for the group: none had nothing, none all
        assert all(0 < b <= a < total for b, a in zip(before, after, strict=True)), (before, after, total)
        wait_for(lambda: all(r.done() for r in readers) and sum(len(m.seen) for m in members) >= total, 120,
                 lambda: f"every reader and the group to finish:\n{progress(readers, members)}")
        for reader in readers:
            assert reader.failure is None, reader.failure
            assert reader.duplicates == []
            assert all(reader.seen[p] == set(range(PER_PARTITION)) for p in range(PARTITIONS))
        # the group: every offset exactly once across its members, committed up to each partition's end
        assert all(m.failure is None for m in members), [m.failure for m in members]
        assert all(m.rebalances_after_stable == 0 for m in members), "the group rebalanced during the replay"
        seen = sorted(o for m in members for o in m.seen)
        assert seen == sorted((p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION))
        for member in members:
            member.stop_event.set()
        for member in members:
            assert member.committed.wait(60)
        for member in members:
            member.release.set()
            member.join(60)
        assert all(m.failure is None for m in members), [m.failure for m in members]
        checker = Consumer(consumer_config(service.bootstrap, group))
        try:
            committed = checker.committed([TopicPartition(service.topic, p) for p in range(PARTITIONS)], timeout=20)
        finally:
            checker.close()
        assert [tp.offset for tp in committed] == [PER_PARTITION] * PARTITIONS

        # the killed instance comes back: rotating connections (max age) spread onto it again, while new
        # records arrive and every reader still gets each exactly once
        live = [i for i in service.instances if i is not victim]
        assert all(i.metric("ksi_client_connections_active", service.listener) > 0 for i in live)
        victim.start()
        produce(service.broker.bootstrap, service.topic, PER_PARTITION, PER_PARTITION + 500)
        for reader in readers:
            reader.end = PER_PARTITION + 500
        wait_for(lambda: victim.metric("ksi_client_connections_active", service.listener) >= 2, 60,
                 f"clients on the restarted instance\n{victim.log_tail()}")
        wait_for(lambda: all(r.done() for r in readers), 120,
                 lambda: f"the readers to read the new records:\n{progress(readers, members)}")
        for reader in readers:
            assert reader.failure is None, reader.failure
            assert reader.duplicates == []
            assert all(reader.seen[p] == set(range(PER_PARTITION + 500)) for p in range(PARTITIONS))
        aged_out = sum(i.metric("ksi_client_connections_aged_out_total", service.listener) for i in service.instances)
        assert aged_out > 0
        servers = service.balancer.servers(service.listener)
        assert all(row["status"] == "UP" for row in servers.values()), servers
    finally:
        for reader in readers:
            reader.stop_event.set()
        for member in members:
            member.stop_event.set()
            member.release.set()
        for thread in [*readers, *members]:
            if thread.ident is not None:  # started
                thread.join(60)


def test_serve_refuses_to_start_on_a_taken_port_naming_port_and_key(noida: BrokerProcess, tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "ksi.toml"
        config.write_text(to_toml({"proxy": {"listen": f"127.0.0.1:{free_port()}", "node_ports": {"1": port}},
                                   "upstream": {"bootstrap_servers": noida.bootstrap}}), encoding="utf-8")
        result = subprocess.run([sys.executable, "-m", "ksi", "serve", "--config", str(config)], check=False,
                                capture_output=True,
                                text=True, timeout=60, cwd=REPO_ROOT,
                                env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port} (proxy.node_ports.1 in {config}, broker 1): address already in use" \
        in result.stderr
    assert "Traceback" not in result.stderr
