"""Broker faults while consumers read a history topic through ksi: nothing lost, nothing duplicated.

The topic's first COLD offsets per partition exist only in the Iceberg table (archived, then deleted from
the broker); the rest is hot, and a producer keeps adding to it through ksi.  Consumers read through ksi
from the beginning while the broker (noida-db, persistent, restarted on the same port so ksi's upstream
address stays valid) is killed with SIGKILL twice: once while they are in the cold part, once while they
are in the hot part.  The producer keeps producing through each outage.

What the assertions are, exactly (``verify`` of scripts/soaklib/checks.py, shared with the soak):

* consumers by assignment (confluent-kafka, kafka-python, aiokafka) track their own position: every
  offset of every partition from the lake's first to the final end is delivered exactly once, in order,
  with the key, value, headers and timestamp that were produced there;
* a confluent-kafka consumer group committing after every batch: every offset delivered, nothing skipped,
  and a record delivered twice only when the group rewound to an offset it had itself committed (a
  rebalance after the broker restart resumes from the last commit the broker kept: Kafka's at-least-once
  for groups); any other re-delivery counts as a duplicate and fails the test.

noida writes its state to disk once a second, so a kill -9 loses the last second of acknowledged writes
(a broker property, not ksi's).  The test therefore quiesces the producer and waits until the broker's
state file holds every acknowledged record before each kill; the consumers are not paused by that.

``test_soak_script_runs_clean`` runs scripts/soak.py (``make soak``) for 20 s so CI exercises it too.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ksi.brokers import start_noida

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # the soak's parts: scripts/soaklib
from soaklib.checks import verify
from soaklib.consumers import ConsumerThread
from soaklib.faults import kill_broker, noida_committed
from soaklib.lake import archive_range, create_table, watermarks
from soaklib.producers import Producers, produce_sync
from soaklib.records import Ledger

REPO_ROOT = Path(__file__).resolve().parents[2]

PARTITIONS = 2
COLD = 1000          # offsets per partition only in the lake (a multiple of produce_sync's 20-record flushes)
HOT = 200            # offsets per partition in the broker when the consumers start
VALUE_BYTES = 1000   # ~250 records per 256 KiB cold batch: the cold part is several fetches per partition
RATE = 150           # records/s the producer adds through ksi, through both faults
OUTAGE_S = 3.0       # long enough for ksi's discovery (every 1 s here) to notice
WAIT_S = 60.0        # bound on every wait below (none is a speed assertion)


class Gate:
    """Holds consumers at an offset: a consumer about to take an offset >= ``limit`` of its partition waits
    (without taking it) until the limit is lifted.  Lets the test kill the broker while every gated
    consumer is known to be in the cold part, or in the hot part."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._limit: int | None = None
        self.waiting: set[str] = set()

    def close_at(self, limit: int) -> None:
        with self._lock:
            self._limit = limit
            self.waiting.clear()
            self._lock.notify_all()

    def open(self) -> None:
        with self._lock:
            self._limit = None
            self.waiting.clear()
            self._lock.notify_all()

    def hook(self, name: str) -> Any:
        def hook(partition: int, offset: int) -> None:
            with self._lock:
                while self._limit is not None and offset >= self._limit:
                    self.waiting.add(name)
                    self._lock.wait(0.1)
                self.waiting.discard(name)
        return hook

    def wait_all(self, names: set[str], consumers: list[Any]) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            with self._lock:
                if names <= self.waiting:
                    return
            for c in consumers:
                assert c.error is None, f"{c.label} failed: {c.error!r}"
            assert time.monotonic() < deadline, f"consumers not at the gate: {names - self.waiting}"
            time.sleep(0.02)


def _positions(consumers: list[Any]) -> dict[str, list[int]]:
    return {c.label: [t.position for t in c.traces] for c in consumers}


def _count(text: str, needle: str) -> int:
    return text.count(needle)


def test_broker_killed_mid_cold_and_mid_hot_loses_and_duplicates_nothing(
        tmp_path: Path, ksi_proxy: Any, catalog: Any) -> None:
    lake, props = catalog
    broker = start_noida(tmp_path / "noida", log_path=tmp_path / "noida.log")  # this test's own: it kills it
    producers = Producers()
    consumers: list[Any] = []
    try:
        topic = f"faults-{uuid.uuid4().hex[:8]}"
        table_name = f"history.{topic.replace('-', '_')}"
        broker.create_topic(topic, PARTITIONS)
        ledger = Ledger(PARTITIONS)

        # The cold part: produced, archived into a ksi-layout table, deleted from the broker.
        produce_sync(broker.bootstrap, topic, ledger, COLD, VALUE_BYTES, label="cold")
        table = create_table(lake, table_name)
        for p in range(PARTITIONS):
            assert archive_range(table, broker.bootstrap, topic, p, 0, COLD) == COLD
            broker.delete_records(topic, p, COLD)
        produce_sync(broker.bootstrap, topic, ledger, HOT, VALUE_BYTES, label="hot")
        assert [low for low, _ in watermarks(broker.bootstrap, topic, PARTITIONS)] == [COLD] * PARTITIONS

        proxy = ksi_proxy(broker, catalog={"name": "lake", **props},
                          topics=[{"name": topic, "table": table_name, "layout": "ksi"}],
                          upstream={"metadata_refresh_seconds": 1})
        producers.add("through-ksi", "confluent", proxy.bootstrap, topic, ledger, RATE, VALUE_BYTES)

        gate = Gate()
        gate.close_at(COLD // 2)
        gated = {"cf-assign": "confluent", "cf-group": "confluent-group", "kp-assign": "kafka-python"}
        for name, kind in gated.items():
            consumers.append(ConsumerThread(name, kind, proxy.bootstrap, topic, PARTITIONS,
                                                 hook=gate.hook(name), small_fetches=True))
        # Never held: it fetches (long polls at the tail) at the moment of each kill.
        consumers.append(ConsumerThread("aio-free", "aiokafka", proxy.bootstrap, topic, PARTITIONS))
        for c in consumers:
            c.start()

        group = next(c for c in consumers if c.kind == "confluent-group")
        kills: list[tuple[list[int], dict[int, int]]] = []  # per kill: the group's deliveries, its durable commits

        def kill_and_restart(phase: str) -> dict[str, list[int]]:
            kill_broker(broker, producers, ledger, topic)  # quiesce, wait until on disk, kill -9
            at_kill = _positions(consumers)
            # After a kill -9 the state file is exactly what the restarted broker starts from.
            kills.append(([len(t.offsets) for t in group.traces],
                          noida_committed(broker.data_dir, group.group_id, topic)))
            producers.resume()  # produces through the outage (into librdkafka's queue)
            if phase == "cold":
                gate.close_at(COLD + HOT // 2)  # released from the cold gate, held again in the hot part
            else:
                gate.open()
            time.sleep(OUTAGE_S)
            broker.start()  # same port, same data directory
            return at_kill

        # Fault 1: every gated consumer is in the cold part (below COLD in every partition).
        gate.wait_all(set(gated), consumers)
        cold_kill = kill_and_restart("cold")
        for name in gated:
            assert all(0 <= pos < COLD for pos in cold_kill[name] if pos >= 0), cold_kill
            assert max(cold_kill[name]) > 0, cold_kill

        # Fault 2: every gated consumer is in the hot part of at least one partition.
        gate.wait_all(set(gated), consumers)
        hot_kill = kill_and_restart("hot")
        for name in gated:
            assert max(hot_kill[name]) >= COLD, hot_kill

        time.sleep(1.0)  # some more records after the second restart
        producers.finish()
        end = [ledger.end(p) for p in range(PARTITIONS)]
        assert not ledger.failed and not ledger.twice
        for p in range(PARTITIONS):
            assert sorted(ledger.acked[p]) == list(range(end[p])), f"the broker lost or added offsets in {p}"
        for c in consumers:
            c.finish(end)
        deadline = time.monotonic() + WAIT_S
        for c in consumers:
            assert c.finished.wait(max(0.0, deadline - time.monotonic())), \
                f"{c.label} did not reach {end}: at {[t.position for t in c.traces]}\n{proxy.log_tail()}"
            assert c.error is None, f"{c.label}: {c.error!r}"

        verdicts = {}
        for c in consumers:
            for p in range(PARTITIONS):
                v = verify(c.traces[p], 0, end[p], ledger.acked[p], group=c.kind == "confluent-group")
                verdicts[(c.label, p)] = v
                assert v.ok, f"{c.label} partition {p}: {v}"
                if c.kind != "confluent-group":
                    assert v.consumed == end[p] and v.replayed == 0, (c.label, p, v)
                else:
                    assert v.consumed == end[p] + v.replayed, (c.label, p, v)
        # The group rewinds only after a kill, and only to the commit the broker kept through it (or to one
        # it made after the restart): never further back.
        for p in range(PARTITIONS):
            trace = group.traces[p]
            for index, came_from, went_to in verdicts[("cf-group", p)].rewinds:
                before = [k for k in kills if k[0][p] <= index]
                assert before, f"cf-group partition {p} rewound {came_from}->{went_to} before any fault"
                delivered, durable = before[-1]
                later_commits = {o for i, o in trace.commit_log if delivered[p] <= i <= index}
                assert went_to == durable.get(p, 0) or went_to in later_commits, \
                    (p, came_from, went_to, durable, sorted(later_commits))
        produced_during = sum(end) - PARTITIONS * (COLD + HOT)
        assert produced_during > 0

        # ksi saw both outages, kept rediscovering the cluster with backoff, and recovered each time.
        text = proxy.log_text()
        assert _count(text, "cluster discovery failed, retrying with backoff") >= 2, proxy.log_tail()
        assert _count(text, "cluster reachable again") >= 2, proxy.log_tail()
        assert "cannot reach the Kafka cluster" in text
        assert "closing the client connection so it reconnects" in text
        assert "Traceback" not in text
        print(f"faults: 2 broker kill -9 ({OUTAGE_S:g} s down each); produced {sum(end)} records "
              f"({produced_during} by the producer through ksi, across both faults); at the kills {cold_kill} "
              f"and {hot_kill}; group replays {sum(v.replayed for (n, _), v in verdicts.items() if n == 'cf-group')}; "
              f"group assignments {group.assignments}, rewinds "
              f"{[verdicts[('cf-group', p)].rewinds for p in range(PARTITIONS)]}, durable commits "
              f"{[k[1] for k in kills]}; ksi log lines about the outage: "
              f"{_count(text, 'closing the client connection so it reconnects')}")
    finally:
        producers.stop.set()
        producers.allowed.set()
        for c in consumers:
            c.abort()
        for c in consumers:
            c.join(30)
        broker.stop()


def test_soak_script_runs_clean(tmp_path: Path) -> None:
    """scripts/soak.py for 20 s: mixed producers, cold and hot consumers, archive rounds moving the log
    start, a broker kill -9 half way; its final table shows nothing lost or duplicated."""
    command = [sys.executable, str(REPO_ROOT / "scripts" / "soak.py"), "--seconds", "20", "--partitions", "2",
               "--rate", "300", "--seed", "600", "--archive-every", "4", "--outage", "2",
               "--progress-every", "5", "--drain-seconds", "60", "--data-dir", str(tmp_path / "soak")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=REPO_ROOT, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "FAULT: broker killed (kill -9)" in output and "broker back on" in output, output
    assert "RESULT: OK" in output, output
    rows = re.findall(r"^\s+(\d+) (\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$",
                      output, re.MULTILINE)
    consumers = {r[1] for r in rows}
    assert {"cold-group", "cold-kp", "hot-cf", "hot-aio", "cold-late"} <= consumers, output
    assert len(rows) == 2 * len(consumers), output
    for _, _name, _start, _end, produced, consumed, lost, skipped, dup, replayed, bad in rows:
        assert (lost, skipped, dup, bad) == ("0", "0", "0", "0"), output
        assert int(consumed) == int(produced) + int(replayed) and int(produced) > 0, output
    archived = re.search(r"archiver: (\d+) rounds, (\d+) rows to the lake", output)
    assert archived is not None and int(archived.group(1)) >= 3 and int(archived.group(2)) > 0, output
