"""What the soak says: progress lines while it runs, and the final table per partition and consumer."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .checks import Verdict, verify
from .consumers import ConsumerThread
from .lake import Archiver
from .producers import Producers
from .proxy import KsiProcess
from .records import Ledger

__all__ = ["Printer", "progress", "report"]

log = logging.getLogger("soak")


def progress(elapsed: float, ledger: Ledger, archiver: Archiver, consumers: list[ConsumerThread]) -> str:
    ends = [ledger.end(p) for p in range(ledger.partitions)]
    parts = [f"t={elapsed:5.0f}s produced {ledger.count()} ends {ends} lake<{archiver.lake_next} "
             f"log start {archiver.log_start}"]
    for c in consumers:
        behind = sum(max(0, e - max(t.position, 0)) for e, t in zip(ends, c.traces, strict=True))
        parts.append(f"{c.label} {c.consumed()} (behind {behind})")
    return " | ".join(parts)


class Printer:
    def __call__(self, text: str) -> None:
        print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)
        log.info("%s", text)


def report(say: Callable[[str], None], ledger: Ledger, consumers: list[ConsumerThread], end: list[int],
           unfinished: list[str], faults: list[str], archiver: Archiver, ksi: KsiProcess | None,
           producers: Producers) -> bool:
    ok = True
    header = (f"{'partition':>9} {'consumer':<11} {'start':>6} {'end':>7} {'produced':>8} {'consumed':>8} "
              f"{'lost':>5} {'skipped':>7} {'dup':>4} {'replayed':>8} {'bad':>4}")
    lines = [header, "-" * len(header)]
    totals: dict[str, Verdict] = {}
    problems: list[str] = []
    for p in range(ledger.partitions):
        expected = ledger.acked[p]
        missing_acks = end[p] - len(expected)
        if missing_acks:
            ok = False
            problems.append(f"partition {p}: {missing_acks} offsets below {end[p]} were never acknowledged to a "
                            "producer (the broker lost or added records)")
        for c in consumers:
            start = c.expected_start(p)
            start = 0 if start is None else start
            v = verify(c.traces[p], start, end[p], expected, group=c.kind == "confluent-group")
            t = totals.setdefault(c.label, Verdict())
            for name in ("consumed", "lost", "skipped", "dup", "replayed", "bad", "outside"):
                setattr(t, name, getattr(t, name) + getattr(v, name))
            lines.append(f"{p:>9} {c.label:<11} {start:>6} {end[p]:>7} {end[p] - start:>8} {v.consumed:>8} "
                         f"{v.lost:>5} {v.skipped:>7} {v.dup:>4} {v.replayed:>8} {v.bad:>4}")
            if not v.ok:
                ok = False
                problems.append(f"partition {p} {c.label}: {v.first_problem}")
    lines.append("-" * len(header))
    for label, t in totals.items():
        lines.append(f"{'all':>9} {label:<11} {'':>6} {'':>7} {'':>8} {t.consumed:>8} {t.lost:>5} {t.skipped:>7} "
                     f"{t.dup:>4} {t.replayed:>8} {t.bad:>4}")
    say("final table:\n" + "\n".join(lines))
    log_text = ksi.log_text() if ksi is not None else ""
    tracebacks = log_text.count("Traceback")
    gaps = log_text.count("are in neither the lake nor Kafka")
    say(f"produced {ledger.count()} records ({sum(t.sent for t in producers.threads)} by the soak producers), "
        f"failed deliveries {len(ledger.failed)}; faults: {', '.join(faults) or 'none'}; archiver: "
        f"{archiver.rounds} rounds, {archiver.rows} rows to the lake, {archiver.failures} failed rounds; lake "
        f"< {archiver.lake_next}, log start {archiver.log_start}")
    say("consumers: " + "; ".join(f"{c.label}: {c.assignments} assignment(s), {c.commit_failures} failed commits, "
                                  f"{len(c.errors)} client errors" if c.kind == "confluent-group"
                                  else f"{c.label}: {len(c.errors)} client errors" for c in consumers))
    say(f"ksi log: {tracebacks} tracebacks, {gaps} gap reports (false alarms unless records were lost), "
        f"{log_text.count('closing the client connection so it reconnects')} client connections closed for an "
        f"upstream error, {log_text.count('cluster discovery failed')} discovery failures, "
        f"{log_text.count('cluster reachable again')} recoveries")
    if ledger.failed:
        ok = False
        problems.append(f"{len(ledger.failed)} deliveries failed, e.g. {ledger.failed[0]}")
    if ledger.twice:
        ok = False
        problems.append(f"offsets acknowledged twice: {ledger.twice[:5]}")
    if unfinished:
        ok = False
        problems.append(f"consumers that did not reach the end: {', '.join(unfinished)}")
    if tracebacks:
        ok = False
        problems.append(f"ksi logged {tracebacks} traceback(s): see {ksi.log_path if ksi else '?'}")
    for problem in problems:
        say(f"PROBLEM: {problem}")
    say("RESULT: " + ("OK: nothing lost, nothing duplicated" if ok else "FAILED"))
    return ok
