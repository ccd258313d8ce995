#!/usr/bin/env python3
"""Fuzz ksi for a while: the properties of tests/ksi/test_fuzz_proxy.py and test_fuzz_protocol.py, round
after round, until time is up.

    .venv/bin/python scripts/fuzz.py                  # 10 minutes (make fuzz)
    .venv/bin/python scripts/fuzz.py --seconds 60     # make fuzz FUZZ_SECONDS=60
    .venv/bin/python scripts/fuzz.py --examples 500   # examples per property per round

One in-process ksi (a ``Proxy`` with two history topics, one lake-only, in front of a fake broker) serves
every round; each round runs each property with ``--examples`` fresh random examples (Hypothesis' example
database in ``.hypothesis/`` replays earlier failures first).  After every input the property checks
that ksi is up, logged no error or traceback, answers a fresh client, and holds no connection of a client
that has left.  A failure prints Hypothesis' falsifying example and ksi's log lines and exits 1.

Memory: the process's RSS (ksi runs in it) is printed after each round; if it grows by more than
``--max-growth-mb`` between the end of the first round and the end of the run, that is a leak: exit 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("KSI_FUZZ_SECONDS", "600")),
                        help="how long to fuzz (default 600, or $KSI_FUZZ_SECONDS)")
    parser.add_argument("--examples", type=int, default=300, help="examples per property per round (default 300)")
    parser.add_argument("--max-growth-mb", type=float, default=100.0,
                        help="RSS growth after the first round that counts as a leak (default 100 MiB)")
    args = parser.parse_args()

    # The properties read their example count when the module is imported.
    os.environ["KSI_FUZZ_EXAMPLES"] = str(args.examples)
    sys.path.insert(0, str(REPO))
    os.chdir(REPO)  # Hypothesis keeps its example database in ./.hypothesis
    from tests.ksi import fuzzing, test_fuzz_protocol, test_fuzz_proxy
    from tests.ksi.fuzz_target import FuzzTarget

    proxy_properties, pure_properties = test_fuzz_proxy.PROPERTIES, test_fuzz_protocol.PURE_PROPERTIES
    runs = fuzzing.examples_run

    deadline = time.monotonic() + args.seconds
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ksi-fuzz-") as workdir:
        target = FuzzTarget(Path(workdir)).start()
        failed = False
        first_round_rss = None
        peak = rss_mib()
        rounds = 0
        try:
            target.check("start-up")
            while time.monotonic() < deadline:
                for prop in proxy_properties + pure_properties:
                    if time.monotonic() >= deadline:
                        break
                    try:
                        prop(target) if prop in proxy_properties else prop()
                    except Exception:  # noqa: BLE001 - Hypothesis has printed the falsifying example
                        traceback.print_exc()
                        print(f"\nFAILED: {prop.__name__}", file=sys.stderr)
                        failed = True
                        break
                else:
                    rounds += 1  # (a round cut short by the deadline is not counted)
                if failed:
                    break
                now = rss_mib()
                peak = max(peak, now)
                first_round_rss = first_round_rss if first_round_rss is not None else now
                print(f"round {rounds}: {time.monotonic() - started:7.0f} s, proxy inputs {runs['proxy']},"
                      f" protocol inputs {runs['pure']}, RSS {now:.0f} MiB,"
                      f" ksi log lines {sum(target.log.counts.values())}", flush=True)
        finally:
            target.stop()
    growth = (rss_mib() - first_round_rss) if first_round_rss is not None else 0.0
    print(f"\n{rounds} round(s) in {time.monotonic() - started:.0f} s: {runs['proxy']} inputs to the"
          f" running proxy, {runs['pure']} to the protocol package; peak RSS {peak:.0f} MiB,"
          f" growth after the first round {growth:+.0f} MiB")
    if target.crash is not None:
        print(f"ksi crashed: {target.crash!r}", file=sys.stderr)
        return 1
    if failed:
        return 1
    if growth > args.max_growth_mb:
        print(f"RSS grew by {growth:.0f} MiB after the first round (limit {args.max_growth_mb:g}): a leak?",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
