"""The floor of any proxy (issue 18): 8 producers and 8 consumers through a native relay, against direct and ksi.

    make bench-hop                                  # 5 rounds, 120,000 records of 1 KiB per producer
    .venv/bin/python bench/hop.py --rounds 3 --records 30000
    .venv/bin/python bench/hop.py --mode copy       # the native relay with read(2)/write(2) instead of splice(2)

Issue 18 asks pass-through throughput of 0.95x direct for every traffic shape.  On a machine whose cores the
clients and the broker fill, whatever a proxy spends is taken from them, and so is what the extra hop costs
the kernel (a second loopback connection per client, its segments, wake-ups and context switches).  This
measures that cost without ksi's own: the same 8+8 clients (``bench/passthrough.py``'s throughput run: each
producer and consumer a process of its own, one partition each, 1 KiB values) on three paths, the order
rotating every round:

* **direct**: tansu (memory storage);
* **native relay**: ``bench/relay_native.c`` (epoll; each client connection relayed to a broker connection of
  its own, bytes passed on as they come, never parsed; with splice(2), socket -> pipe -> socket, the bytes
  never reach user space), and tansu advertising the relay's port, so that every request of every client
  goes through it (a relay that does not rewrite Metadata needs the broker to advertise it);
* **ksi**: ``python -m ksi serve`` with no ``[[topics]]``, tansu advertising itself (ksi rewrites Metadata).

Each path gets a fresh tansu (the advertised address is fixed when it starts).  Reported: MB/s per round,
the ratio to the same round's direct run, and the CPU seconds of the relay or of ksi.  The native relay
needs gcc (built into ``.cache/bench``, as ``bench/relay_loop.py`` does).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import KsiProcess, machine
from ksi.brokers import free_port, start_tansu
from passthrough import process_cpu_seconds, throughput
from relay_loop import native_relay

PATHS = ("direct", "native relay", "ksi")
WORKERS = 8


def one_run(path: str, workdir: Path, name: str, relay_binary: str, mode: str, records: int, size: int
            ) -> tuple[float, float]:
    """MB/s of one 8+8 run on ``path``, and the CPU seconds of the relay or ksi during it."""
    relay: subprocess.Popen[bytes] | None = None
    ksi: KsiProcess | None = None
    if path == "native relay":
        port, broker_port = free_port(), free_port()
        relay = subprocess.Popen([relay_binary, str(port), "127.0.0.1", str(broker_port)]
                                 + (["splice"] if mode == "splice" else []))
        time.sleep(0.2)
        broker = start_tansu(broker_port, workdir / f"tansu-{name}.log", advertised_port=port)
        bootstrap = f"127.0.0.1:{port}"
    else:
        broker = start_tansu(log_path=workdir / f"tansu-{name}.log")
        bootstrap = broker.bootstrap
    try:
        if path == "ksi":
            ksi = KsiProcess(workdir, name, broker.bootstrap)
            bootstrap = ksi.bootstrap
        broker.create_topic(name, WORKERS)
        run = throughput("ksi" if ksi is not None else path, bootstrap, broker, ksi, name, records, size, WORKERS)
        cpu = process_cpu_seconds(relay.pid) if relay is not None else (run.cpu_seconds or 0.0)
        return run.mb_per_second, cpu
    finally:
        if ksi is not None:
            ksi.stop()
        if relay is not None:
            relay.kill()
            relay.wait()
        broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="runs per path, the order rotating (default 5)")
    parser.add_argument("--records", type=int, default=120_000, help="records per producer (default 120,000)")
    parser.add_argument("--size", type=int, default=1024, help="value bytes (default 1024)")
    parser.add_argument("--mode", choices=("splice", "copy"), default="splice",
                        help="the native relay's data path: splice(2) (default) or read(2)/write(2)")
    args = parser.parse_args()
    relay_binary = native_relay()
    if relay_binary is None:
        print("bench/hop.py needs gcc to build bench/relay_native.c", file=sys.stderr)
        return 2
    rates: dict[str, list[float]] = {p: [] for p in PATHS}
    cpus: dict[str, list[float]] = {p: [] for p in PATHS}
    started = time.monotonic()
    print(f"# The hop's floor, {time.strftime('%Y-%m-%d %H:%M')}, {machine()}\n")
    print(f"{WORKERS} producers + {WORKERS} consumers, {args.records:,} records of {args.size} bytes per producer, "
          f"tansu, every process on every CPU; native relay: {args.mode}\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="ksi-hop-") as tmp:
        workdir = Path(tmp)
        for r in range(args.rounds):
            order = PATHS[r % len(PATHS):] + PATHS[:r % len(PATHS)]
            for path in order:
                mbs, cpu = one_run(path, workdir, f"hop{r}{path[0]}", relay_binary, args.mode, args.records,
                                   args.size)
                rates[path].append(mbs)
                cpus[path].append(cpu)
                print(f"round {r + 1}/{args.rounds} {path}: {mbs:.1f} MB/s, its CPU {cpu:.2f} s", flush=True)
    mb = WORKERS * args.records * args.size / 1e6
    print("\n| path | MB/s per round | ratio to the round's direct | median | CPU ms per MB |")
    print("|---|---|---|---:|---:|")
    for path in PATHS:
        ratios = [x / d for x, d in zip(rates[path], rates["direct"], strict=True)]
        cpu = "" if path == "direct" else f"{statistics.median(cpus[path]) * 1000 / mb:.2f}"
        print(f"| {path} | {', '.join(f'{x:.0f}' for x in rates[path])} | {', '.join(f'{x:.2f}' for x in ratios)} "
              f"| {statistics.median(ratios):.2f} | {cpu} |")
    print(f"\n({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
