"""Faults: quiesce the producers, wait until noida's state file holds every acknowledged record, then kill -9
the broker (or ksi) and start it again."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from ksi.brokers import BrokerProcess

from .lake import Archiver
from .producers import Producers
from .proxy import KsiProcess
from .records import Ledger

__all__ = ["inject", "kill_broker", "noida_committed", "noida_persisted", "wait_persisted"]


def noida_persisted(data_dir: Path, topic: str) -> dict[int, int] | None:
    """High watermark per partition of ``topic`` in noida's state file (None while it is unreadable)."""
    try:
        state = json.loads((data_dir / "kafka.json").read_bytes())
        for name, body in state["topics"]:
            if name == topic:
                return {int(pid): int(p["high_watermark"]) for pid, p in body["partitions"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {}


def noida_committed(data_dir: Path, group: str, topic: str) -> dict[int, int]:
    """The offsets ``group`` has committed for ``topic`` in noida's state file: after a kill -9, exactly
    what the restarted broker answers OffsetFetch with."""
    state = json.loads((data_dir / "kafka.json").read_bytes())
    return {int(p): int(offset) for (g, t, p), offset in state.get("committed_offsets", [])
            if g == group and t == topic}


def wait_persisted(broker: BrokerProcess, topic: str, ends: list[int], timeout: float = 20) -> None:
    """Wait until the broker's on-disk state holds every acknowledged record (noida writes it once a
    second); only then does a kill -9 lose nothing that was acknowledged."""
    if broker.kind != "noida" or broker.data_dir is None:
        return
    deadline = time.monotonic() + timeout
    while True:
        persisted = noida_persisted(broker.data_dir, topic)
        if persisted is not None and all(persisted.get(p, 0) >= end for p, end in enumerate(ends)):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"noida did not persist {topic} up to {ends} within {timeout} s (state: {persisted})")
        time.sleep(0.05)


def kill_broker(broker: BrokerProcess, producers: Producers, ledger: Ledger, topic: str) -> None:
    """Quiesce the producers, wait until the broker's state is on disk, then kill -9 it."""
    producers.quiesce()
    wait_persisted(broker, topic, [ledger.end(p) for p in range(ledger.partitions)])
    broker.kill()


def inject(fault: str, broker: BrokerProcess, ksi: KsiProcess | None, producers: Producers, ledger: Ledger,
           topic: str, archiver: Archiver, outage: float, say: Callable[[str], None],
           positions: Callable[[], str]) -> str:
    with archiver.lock:  # no archive round while the broker is down
        if fault == "broker":
            kill_broker(broker, producers, ledger, topic)
            producers.resume()  # producing through the outage, into the clients' queues
            say(f"FAULT: broker killed (kill -9) at ends {[ledger.end(p) for p in range(ledger.partitions)]}, "
                f"{positions()}; restarting it in {outage:g} s")
            time.sleep(outage)
            broker.start()
            say(f"broker back on {broker.bootstrap}")
            return f"broker kill -9, {outage:g} s down"
        assert ksi is not None
        producers.quiesce()  # an unanswered Produce would be retried: a duplicate without idempotence
        ksi.kill()
        producers.resume()
        say(f"FAULT: ksi killed (kill -9), {positions()}; restarting it in {outage:g} s")
        time.sleep(outage)
        ksi.start()
        say("ksi back")
        return f"ksi kill -9, {outage:g} s down"
