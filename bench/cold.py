"""Cold-path benchmark (issue 5): the same records read straight from the broker, through ksi while the
broker still has them, and through ksi after they exist only in Iceberg, side by side in one run.

    .venv/bin/python bench/cold.py                          # 1,000,000 records, seek test at 1M and 10M rows
    .venv/bin/python bench/cold.py --records 200000 --seek-rows 1000000 --concurrent 8
    make bench N=200000                                     # the same through make (BENCH_ARGS for the rest)

What it does, all on loopback, in a temporary directory:

1. Starts noida-db (its DeleteRecords really moves the log start) and the embedded Schema Registry, and
   produces --records records round-robin over --partitions partitions: 10-byte keys, ~100-byte Avro
   values (a record of 2 longs, a double, 2 short strings and a nullable string) with Schema Registry
   framing, two headers, explicit timestamps.  The data is generated column-wise (numpy / Arrow) and the
   Avro bodies by ksi's vectorized encoder, so the same columns also become the lake table.
2. Writes the same records to a ksi-layout Iceberg table (PyIceberg SqlCatalog on SQLite): typed Avro
   columns + kafka_value_schema_id, partitioned by kafka_partition, sorted by offset, row groups of
   --row-group-rows rows (the archive pipeline's default 16 MiB row groups hold about that many).
3. direct / pass-through: reads all records from the broker, and through ksi (the topic configured with
   that table, as in production: the lake already holds the offsets, the broker still does too), plus a
   ksi with no [[topics]] at all; --repeats alternating rounds.
4. Deletes every record from the broker (DeleteRecords up to the high watermark), and per round starts a
   fresh ksi and reads everything twice: "cold, first read" (nothing cached in ksi) and "cold, warm" (a
   second consumer, new group, same ksi process).  The table shows the best round and every round; the
   targets are judged on the median round (2 cores shared by broker, ksi and consumer: rounds vary).
5. Seek: lake-only tables of --seek-rows rows (raw ~100-byte values, written in 1M-row appends); a
   consumer assigns a random partition at a random offset in the middle and the time to its first record
   is measured, a few times per size.
6. Concurrency: --concurrent lake-only topics of records/concurrent records each, one consumer thread per
   topic at once, through one fresh ksi; its peak RSS and the aggregate throughput.

Every read is checked: per partition, the count and a BLAKE2 digest of (offset, timestamp, key, value,
headers) in offset order must equal those of the generated records.  A fast but wrong read says so.

Every consumer uses the same confluent-kafka settings (printed).  ksi's CPU is utime + stime of the ksi
process (all threads) over the measured read; its peak RSS is VmHWM, reset (``/proc/PID/clear_refs``)
before each measured phase, so each row's peak is that phase's own.  MB = 10^6 bytes of record payload
(key + value + header keys and values), the same for every path.  --profile samples the ksi process
with py-spy during the cold reads and prints where its time goes (results then include the sampler's
overhead).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

# bench/ is on sys.path when this runs as a script: the consumer and producer settings are passthrough.py's
from passthrough import CONSUMER_CONFIG, MAX_FRAME_BYTES, PRODUCER_CONFIG

from ksi.avro import (
    arrow_type,
    decode_values,
    encode_values,
    iceberg_struct,
    parse_schema,
)
from ksi.brokers import BrokerProcess, free_port, start_noida
from ksi.history.ksi_table import (
    partition_spec,
    raw_value_schema,
    sort_order,
    value_columns,
)
from ksi.registry import RegistryServer, start_registry
from ksi.registry.client import RegistryClient

# Recent timestamps: noida applies time-based retention (7 days) to the records' own timestamps.
BASE_TS_MS = (int(time.time()) - 3600) * 1000
SEEK_PAUSE_SECONDS = 1.0
STALL_SECONDS = 60.0  # a read that makes no progress for this long gives up (and says so)
KEY_BYTES = 10
HEADER_KEYS = ("trace", "src")
HEADER_SRC = b"bench"
WORDS = (b"the quick brown fox jumps over a lazy dog order user item price status shipped paid refund "
         b"cart basket delivery warehouse 0123456789 alpha beta gamma delta").split()
VALUE_SCHEMA = {"type": "record", "name": "Event", "namespace": "ksi.bench", "fields": [
    {"name": "id", "type": "long"},
    {"name": "user_id", "type": "long"},
    {"name": "amount", "type": "double"},
    {"name": "country", "type": "string"},
    {"name": "status", "type": "string"},
    {"name": "note", "type": ["null", "string"], "default": None},
]}
COUNTRIES = ["DE", "FR", "US", "GB", "IN", "BR", "JP", "NL", "SE", "ES", "IT", "PL"]
STATUSES = ["new", "paid", "shipped", "delivered", "refunded", "cancelled", "on_hold", "returned"]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- data, column-wise -------------------------------------------------------------------------------


BINARY, STRING = pa.binary(), pa.string()


def fixed_width(data: np.ndarray, n: int, kind: pa.DataType = BINARY) -> pa.Array:
    """``n`` values of ``len(data) // n`` bytes each, from one contiguous uint8 array."""
    width = len(data) // n if n else 0
    offsets = np.arange(n + 1, dtype=np.int32) * width
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))])


def var_strings(rng: np.random.Generator, pool: np.ndarray, n: int, lo: int, hi: int,
                kind: pa.DataType = STRING) -> pa.Array:
    """``n`` ASCII strings of lo..hi bytes: consecutive pieces of ``pool`` from a random place (no Python
    per row, no per-byte index arrays)."""
    lengths = rng.integers(lo, hi + 1, size=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = np.resize(np.roll(pool, -int(rng.integers(0, len(pool)))), int(offsets[-1]))
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


_POOL: np.ndarray | None = None


def text_pool() -> np.ndarray:
    """8 MiB of words (so repeats are ~100k values apart, as far as a row group reaches)."""
    global _POOL
    if _POOL is None:
        rng = np.random.default_rng(0)
        _POOL = np.frombuffer(b" ".join(rng.choice(WORDS, size=1_400_000)), dtype=np.uint8)[: 8 << 20].copy()
    return _POOL


def digits(numbers: np.ndarray, width: int) -> np.ndarray:
    """Zero-padded decimal digits of ``numbers``, ``width`` ASCII bytes each, as an (n, width) uint8 array."""
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return ((numbers[:, None] // powers) % 10 + ord("0")).astype(np.uint8)


@dataclass
class Dataset:
    """Records in production order (record i goes to partition i % P at offset i // P)."""

    partitions: int
    partition: np.ndarray      # int32
    offset: np.ndarray         # int64
    timestamp_ms: np.ndarray   # int64
    keys: pa.Array             # binary, KEY_BYTES each
    trace: pa.Array            # binary, 8 bytes each: the "trace" header's value
    values: pa.Array           # binary: framed Avro (magic 0, schema id, body) or raw bytes
    typed: pa.StructArray | None  # the Avro values as typed columns (None: raw values)

    def __len__(self) -> int:
        return len(self.offset)

    def payload_bytes(self) -> int:
        """key + value + header keys and values, summed over all records (what MB/s counts)."""
        headers = len(self) * (sum(len(k) for k in HEADER_KEYS) + 8 + len(HEADER_SRC))
        keys = pc.sum(pc.binary_length(self.keys)).as_py() or 0
        return int(keys + (pc.sum(pc.binary_length(self.values)).as_py() or 0) + headers)

    def sorted_order(self) -> np.ndarray:
        """Row order by (partition, offset)."""
        return np.lexsort((self.offset, self.partition))


def make_dataset(n: int, partitions: int, seed: int, schema_id: int | None, first_id: int = 0) -> Dataset:
    """``n`` records; Avro values framed with ``schema_id``, or ~100 raw bytes when ``schema_id`` is None."""
    rng = np.random.default_rng(seed)
    pool = text_pool()
    index = np.arange(n, dtype=np.int64)
    keys = fixed_width(np.concatenate([np.full((n, 1), ord("k"), np.uint8), digits(index + first_id, KEY_BYTES - 1)],
                                      axis=1).ravel(), n)
    trace = fixed_width(rng.integers(0, 256, size=n * 8, dtype=np.uint8), n)
    typed = None
    if schema_id is not None:
        note_null = rng.random(n) < 0.2
        note = pc.if_else(pa.array(note_null), pa.scalar(None, pa.string()), var_strings(rng, pool, n, 65, 95))
        typed = pa.StructArray.from_arrays([
            pa.array(index + first_id),
            pa.array(rng.integers(0, 1 << 40, size=n, dtype=np.int64)),
            pa.array(np.round(rng.random(n) * 1000, 2)),
            pa.array(COUNTRIES).take(pa.array(rng.integers(0, len(COUNTRIES), size=n))),
            pa.array(STATUSES).take(pa.array(rng.integers(0, len(STATUSES), size=n))),
            note,
        ], fields=list(arrow_type(parse_schema(VALUE_SCHEMA))))
        bodies = encode_values(typed, parse_schema(VALUE_SCHEMA))
        values = pc.binary_join_element_wise(pa.scalar(struct.pack(">bI", 0, schema_id), pa.binary()),
                                             bodies.cast(pa.binary()), pa.scalar(b"", pa.binary()))
    else:
        values = var_strings(rng, pool, n, 90, 110, pa.binary())
    return Dataset(partitions=partitions, partition=(index % partitions).astype(np.int32),
                   offset=index // partitions, timestamp_ms=BASE_TS_MS + index, keys=keys, trace=trace,
                   values=values, typed=typed)


def check_avro(data: Dataset, sample: int = 2000) -> None:
    """The generated bodies decode (fastavro) back to the generated columns: the values are real Avro."""
    assert data.typed is not None
    head = data.values.slice(0, sample)
    decoded = decode_values(pc.binary_slice(head, 5, 1 << 20).cast(pa.binary()), parse_schema(VALUE_SCHEMA))
    if decoded.to_pylist() != data.typed.slice(0, sample).to_pylist():
        raise SystemExit("generated Avro values do not decode to the generated columns")


# -- checksums -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionSum:
    count: int
    digest: str
    ordered: bool = True


def record_blob(offset: int, ts: int, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> bytes:
    return (struct.pack("<qqi", offset, ts, len(key)) + key + struct.pack("<i", len(value)) + value
            + b"".join(k.encode() + (v or b"") for k, v in headers))


def expected_sums(data: Dataset) -> dict[int, PartitionSum]:
    """Per partition, the digest the consumer side computes with :func:`record_blob` (column-wise here)."""
    n = len(data)
    order = data.sorted_order()
    lengths = pc.binary_length(data.values).to_numpy(zero_copy_only=False).astype(np.int32)
    prefix = np.empty((n, 24 + KEY_BYTES), dtype=np.uint8)
    prefix[:, 0:8] = data.offset.astype("<i8").view(np.uint8).reshape(n, 8)
    prefix[:, 8:16] = data.timestamp_ms.astype("<i8").view(np.uint8).reshape(n, 8)
    prefix[:, 16:20] = np.full(n, KEY_BYTES, dtype="<i4").view(np.uint8).reshape(n, 4)
    prefix[:, 20:20 + KEY_BYTES] = np.frombuffer(data.keys.buffers()[2], np.uint8)[: n * KEY_BYTES].reshape(n, -1)
    prefix[:, 20 + KEY_BYTES:] = lengths.astype("<i4").view(np.uint8).reshape(n, 4)
    trace = np.frombuffer(data.trace.buffers()[2], np.uint8)[: n * 8].reshape(n, 8)
    suffix = np.concatenate([np.tile(np.frombuffer(HEADER_KEYS[0].encode(), np.uint8), (n, 1)), trace,
                             np.tile(np.frombuffer(HEADER_KEYS[1].encode() + HEADER_SRC, np.uint8), (n, 1))], axis=1)
    blobs = pc.binary_join_element_wise(fixed_width(prefix.ravel(), n), data.values.cast(pa.binary()),
                                        fixed_width(suffix.ravel(), n), pa.scalar(b"", pa.binary()))
    blobs = blobs.take(pa.array(order)).cast(pa.large_binary())
    offsets = np.frombuffer(blobs.buffers()[1], np.int64)[blobs.offset: blobs.offset + n + 1]
    buffer = memoryview(blobs.buffers()[2])
    counts = np.bincount(data.partition, minlength=data.partitions)
    sums: dict[int, PartitionSum] = {}
    row = 0
    for p in range(data.partitions):
        count = int(counts[p])
        digest = hashlib.blake2b(buffer[offsets[row]: offsets[row + count]], digest_size=16).hexdigest()
        sums[p] = PartitionSum(count, digest)
        row += count
    return sums


def consumed_sums(messages: list[Message]) -> dict[int, PartitionSum]:
    by_partition: dict[int, list[bytes]] = {}
    last: dict[int, int] = {}
    ordered: dict[int, bool] = {}
    for m in messages:
        p, o = m.partition(), m.offset()
        by_partition.setdefault(p, []).append(record_blob(o, m.timestamp()[1], m.key() or b"", m.value() or b"",
                                                          m.headers() or []))
        if last.get(p, -1) >= o:
            ordered[p] = False
        last[p] = o
    return {p: PartitionSum(len(blobs), hashlib.blake2b(b"".join(blobs), digest_size=16).hexdigest(),
                            ordered.get(p, True)) for p, blobs in by_partition.items()}


def compare(expected: dict[int, PartitionSum], got: dict[int, PartitionSum], errors: list[str]) -> str:
    """'ok', or what is wrong."""
    problems = []
    for p in sorted(set(expected) | set(got)):
        e, g = expected.get(p), got.get(p)
        if g is None:
            problems.append(f"p{p}: nothing read")
        elif e is None:
            problems.append(f"p{p}: unexpected partition")
        elif not g.ordered:
            problems.append(f"p{p}: offsets out of order")
        elif g.count != e.count:
            problems.append(f"p{p}: {g.count} records, expected {e.count}")
        elif g.digest != e.digest:
            problems.append(f"p{p}: checksum differs")
    if errors:
        problems.append(f"{len(errors)} consumer errors ({errors[0]})")
    return "ok" if not problems else "WRONG: " + "; ".join(problems[:4])


# -- ksi as a child process ----------------------------------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class KsiProcess:
    """``python -m ksi serve`` with catalog, registry and topics; CPU, RSS and an optional py-spy."""

    def __init__(self, workdir: Path, name: str, upstream: str, *, catalog: dict[str, str] | None = None,
                 registry_url: str | None = None, topics: list[dict[str, Any]] | None = None,
                 history: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{free_port()}/metrics"
        sections: dict[str, dict[str, Any]] = {
            "proxy": {"listen": self.bootstrap, "advertised_host": "127.0.0.1", "broker_port_base": free_port(),
                      "max_frame_bytes": MAX_FRAME_BYTES, "log_level": "warning"},
            "upstream": {"bootstrap_servers": [upstream]},
            "metrics": {"listen": self.metrics_url.split("/")[2]},
        }
        if catalog is not None:
            sections["catalog"] = {"name": "lake", **catalog}
        if registry_url is not None:
            sections["schema_registry"] = {"url": registry_url}
        if history and topics:
            sections["history"] = dict(history)
        lines = []
        for section, body in sections.items():
            lines.append(f"[{section}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in body.items()]
            lines.append("")
        for topic in topics or []:
            lines.append("[[topics]]")
            lines += [f"{k} = {toml_value(v)}" for k, v in topic.items()]
            lines.append("")
        self.config_path = workdir / f"ksi-{name}.toml"
        self.config_path.write_text("\n".join(lines))
        self.log_path = workdir / f"ksi-{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ksi", "serve", "--config", str(self.config_path)],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
        )
        self._spy: subprocess.Popen[bytes] | None = None
        self._wait_listening(60.0)
        self.rss_at_start_mib = self.memory_kib("VmRSS") / 1024

    def metrics(self) -> str:
        import urllib.request

        try:
            return urllib.request.urlopen(self.metrics_url, timeout=5).read().decode()
        except OSError:
            return ""

    def lake_read_seconds(self, topic: str) -> tuple[float, float]:
        """(sum, count) of ksi_lake_read_seconds for ``topic``: time to answer one partition's cold fetch."""
        total = count = 0.0
        label = f'{{topic="{topic}"}} '
        for line in self.metrics().splitlines():
            if line.startswith("ksi_lake_read_seconds_sum" + label):
                total = float(line.rsplit(" ", 1)[1])
            elif line.startswith("ksi_lake_read_seconds_count" + label):
                count = float(line.rsplit(" ", 1)[1])
        return total, count

    def lake_counters(self) -> tuple[float, float]:
        """(partition fetches answered from the lake, record batch bytes served from the lake) so far."""
        fetches = served = 0.0
        text = self.metrics()
        if not text:
            return float("nan"), float("nan")
        for line in text.splitlines():
            if line.startswith("ksi_cold_fetches_total{"):
                fetches += float(line.rsplit(" ", 1)[1])
            elif line.startswith("ksi_lake_read_bytes_total{"):
                served += float(line.rsplit(" ", 1)[1])
        return fetches, served

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"ksi ({self.name}) exited with code {self.process.returncode} while starting\n"
                                 f"{self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"ksi ({self.name}) did not listen within {timeout:.0f} s\n{self.log_tail()}")
                time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """utime + stime of the ksi process, all threads (fields 14 and 15 of /proc/PID/stat)."""
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def reset_peak(self) -> bool:
        """Reset VmHWM to the current RSS (Linux >= 4.0); False if the kernel refused."""
        try:
            Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")
            return True
        except OSError:
            return False

    def start_profile(self, py_spy: str, output: Path) -> None:
        self._spy = subprocess.Popen([py_spy, "record", "--pid", str(self.process.pid), "--format", "raw",
                                      "--rate", "200", "--output", str(output), "--threads"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # let it attach

    def stop_profile(self) -> None:
        spy, self._spy = self._spy, None
        if spy is None:
            return
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last lines of {self.log_path} ---\n" + "\n".join(text)

    def tracebacks(self) -> bool:
        return "Traceback" in self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.stop_profile()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


# Leaf frames where a thread waits (py-spy does not always see these as idle): not work.
IDLE_LEAVES = ("_worker (concurrent/futures/thread.py:81)", "WorkerThread._work (trio/_core/_thread_cache.py:211)",
               "EpollIOManager.get_events", "_PollLikeSelector.select", "Condition.wait", "socket.accept",
               "BaseServer.serve_forever", "Event.wait", "Thread.join")
# Frames every stack has (thread start-up, the event loop, worker plumbing): not informative.
PLUMBING = ("threading.py", "<frozen runpy>", "trio/_core/_run.py", "trio/_threads.py", "trio/_core/_thread_cache.py",
            "outcome/_impl.py", "ksi/__main__.py", "ksi/cli.py", "concurrent/futures/thread.py")


def summarise_profile(path: Path, top: int = 22) -> list[str]:
    """py-spy's raw (collapsed) stacks: the frames with the most busy samples, inclusive and self."""
    if not path.exists():
        return [f"(no profile at {path})"]
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = idle = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";")]
        if len(frames) < 2 or frames[-1].startswith(IDLE_LEAVES):
            idle += count
            continue
        total += count
        threads[_role(frames)] += count
        for frame in dict.fromkeys(frames[1:]):
            if not any(marker in frame for marker in PLUMBING):
                inclusive[frame] += count
        own[frames[-1]] += count
    if not total:
        return ["(no busy samples)"]
    out = [f"{total} busy samples at 200/s (= {total / 200:.1f} thread-seconds; {idle} waiting samples left out); "
           "by thread: " + ", ".join(f"{t} {c / total:.0%}" for t, c in threads.most_common(5))]
    out.append("inclusive (% of busy samples with the frame on the stack):")
    out += [f"  {c / total:6.1%}  {f}" for f, c in inclusive.most_common(top)]
    out.append("self (% of busy samples with the frame on top):")
    out += [f"  {c / total:6.1%}  {f}" for f, c in own.most_common(top)]
    return out


def _role(frames: list[str]) -> str:
    """What a sampled thread was (py-spy's thread names are stale: trio renames its workers per job)."""
    text = ";".join(frames)
    if "unrolled_run" in text:
        return "event loop"
    if "to_thread_run_sync" in text:
        return "trio worker threads"
    if "concurrent/futures/thread.py" in text:
        return "PyIceberg/pyarrow thread pool"
    if "socketserver.py" in text:
        return "metrics HTTP"
    return "other"


def _short(frame: str) -> str:
    """``func (path/to/site-packages/pkg/mod.py:123)`` -> ``func (pkg/mod.py:123)``."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where})" if where else name


# -- producing and consuming ---------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, data: Dataset) -> float:
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
    producer.list_topics(topic, timeout=10)
    keys, values, traces = data.keys.to_pylist(), data.values.to_pylist(), data.trace.to_pylist()
    partitions, timestamps = data.partition.tolist(), data.timestamp_ms.tolist()
    send = producer.produce
    n = len(data)
    start = time.perf_counter()
    step = max(100_000, n // 10)
    for i in range(n):
        headers = [(HEADER_KEYS[0], traces[i]), (HEADER_KEYS[1], HEADER_SRC)]
        while True:
            try:
                send(topic, values[i], keys[i], partition=partitions[i], timestamp=timestamps[i], headers=headers,
                     on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if (i + 1) % step == 0:
            log(f"produced {i + 1}/{n} ({(i + 1) / (time.perf_counter() - start):,.0f} rec/s)")
    left = producer.flush(300)
    elapsed = time.perf_counter() - start
    if failures or left:
        raise SystemExit(f"produce: {len(failures)} failed ({failures[:1]}), {left} undelivered")
    return elapsed


@dataclass
class Read:
    records: int
    seconds: float
    first_record_seconds: float
    messages: list[Message] = field(default_factory=list, repr=False)
    errors: list[str] = field(default_factory=list)
    stalled: bool = False


def consumer_config(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "group.id": f"bench-{time.monotonic_ns()}-{threading.get_ident()}",
            **CONSUMER_CONFIG}


def read_all(bootstrap: str, topic: str, partitions: int, records: int) -> Read:
    """Every record of ``topic`` from offset 0, kept for checking afterwards; timed from assign to the last."""
    consumer = Consumer(consumer_config(bootstrap))
    messages: list[Message] = []
    errors: list[str] = []
    try:
        consumer.list_topics(topic, timeout=10)  # bootstrap connection and metadata before the clock starts
        start = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        first = None
        last_progress = start
        stalled = False
        while len(messages) < records:
            batch = consumer.consume(10_000, timeout=0.5)
            now = time.perf_counter()
            if batch:
                good = [m for m in batch if m.error() is None]
                if len(good) != len(batch):
                    errors += [str(m.error()) for m in batch if m.error() is not None]
                if good:
                    messages += good
                    last_progress = now
                    if first is None:
                        first = now - start
            elif now - last_progress > STALL_SECONDS:
                stalled = True
                break
        elapsed = (last_progress if stalled else time.perf_counter()) - start
    finally:
        consumer.close()
    return Read(len(messages), elapsed, first or float("nan"), messages, errors, stalled)


# -- the lake -----------------------------------------------------------------------------------------


def open_catalog(workdir: Path) -> tuple[Any, dict[str, str]]:
    from pyiceberg.catalog.sql import SqlCatalog

    (workdir / "warehouse").mkdir(exist_ok=True)
    props = {"uri": f"sqlite:///{workdir / 'catalog.db'}", "warehouse": f"file://{workdir / 'warehouse'}"}
    catalog = SqlCatalog("lake", **props)
    catalog.create_namespace("bench")
    return catalog, props


def create_ksi_table(catalog: Any, name: str, typed: bool, row_group_rows: int) -> Any:
    table = catalog.create_table(name, schema=raw_value_schema(), partition_spec=partition_spec(),
                                 sort_order=sort_order(),
                                 properties={"write.parquet.row-group-limit": str(row_group_rows)})
    if typed:
        with table.update_schema() as update:
            update.union_by_name(value_columns(iceberg_struct(parse_schema(VALUE_SCHEMA))))
    return catalog.load_table(name)


def ksi_rows(table: Any, data: Dataset, schema_id: int | None) -> pa.Table:
    """``data`` as rows of the ksi layout (sorted by partition, offset), typed when ``data.typed`` is set."""
    n = len(data)
    target = table.schema().as_arrow()
    header_values = np.concatenate([np.frombuffer(data.trace.buffers()[2], np.uint8)[: n * 8].reshape(n, 8),
                                    np.tile(np.frombuffer(HEADER_SRC, np.uint8), (n, 1))], axis=1).ravel()
    value_offsets = np.zeros(2 * n + 1, dtype=np.int32)
    value_offsets[1::2] = np.arange(n, dtype=np.int32) * (8 + len(HEADER_SRC)) + 8
    value_offsets[2::2] = np.arange(1, n + 1, dtype=np.int32) * (8 + len(HEADER_SRC))
    entries = pa.StructArray.from_arrays([
        pa.array(list(HEADER_KEYS)).take(pa.array(np.tile(np.arange(2, dtype=np.int32), n))),
        pa.Array.from_buffers(pa.binary(), 2 * n, [None, pa.py_buffer(value_offsets), pa.py_buffer(header_values)]),
    ], names=["key", "value"])
    columns: dict[str, pa.Array] = {
        "kafka_partition": pa.array(data.partition, pa.int32()),
        "kafka_offset": pa.array(data.offset, pa.int64()),
        "kafka_timestamp": pa.array(data.timestamp_ms * 1000, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "kafka_timestamp_type": pa.array(np.zeros(n, dtype=np.int32)),
        "kafka_key": data.keys,
        "kafka_headers": pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)), entries),
    }
    if data.typed is not None:
        columns["kafka_value"] = pa.nulls(n, pa.binary())
        columns["kafka_value_schema_id"] = pa.array(np.full(n, schema_id, dtype=np.int32))
        for i, f in enumerate(data.typed.type):
            columns[f.name] = data.typed.field(i)
    else:
        columns["kafka_value"] = data.values
        columns["kafka_value_schema_id"] = pa.nulls(n, pa.int32())
    order = pa.array(data.sorted_order())
    arrays = [columns[f.name].cast(f.type).take(order) for f in target]
    return pa.Table.from_arrays(arrays, schema=target)


def write_ksi_table(catalog: Any, name: str, data: Dataset, schema_id: int | None, row_group_rows: int) -> float:
    start = time.perf_counter()
    table = create_ksi_table(catalog, name, data.typed is not None, row_group_rows)
    table.append(ksi_rows(table, data, schema_id))
    return time.perf_counter() - start


def data_files(catalog: Any, name: str) -> tuple[int, int, int]:
    """(data files, manifests, snapshots) of the table's current snapshot."""
    table = catalog.load_table(name)
    snapshot = table.current_snapshot()
    manifests = len(snapshot.manifests(table.io)) if snapshot else 0
    files = sum(1 for _ in table.scan().plan_files())
    return files, manifests, len(table.metadata.snapshots)


# -- measurements --------------------------------------------------------------------------------------


@dataclass
class Row:
    path: str
    what: str
    records: int
    seconds: float
    payload_bytes: int
    check: str
    ksi_cpu_seconds: float | None = None
    ksi_peak_rss_mib: float | None = None
    first_record_ms: float | None = None
    lake_fetches: float | None = None     # partition fetches ksi answered from the lake during the read
    lake_mb: float | None = None          # record batch MB ksi served from the lake during the read
    ksi_rss_at_start_mib: float | None = None
    rounds: list[float] = field(default_factory=list)  # records/s of every round, in order
    cpu_rounds: list[float] = field(default_factory=list)  # ksi CPU seconds of every round
    note: str = ""

    @property
    def cpu_median(self) -> float | None:
        return statistics.median(self.cpu_rounds) if self.cpu_rounds else self.ksi_cpu_seconds

    @property
    def median_rate(self) -> float:
        return statistics.median(self.rounds) if self.rounds else self.rate

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_second(self) -> float:
        return self.payload_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    @property
    def cpu_per_gb(self) -> float | None:
        """ksi CPU seconds per GB served, the median round's."""
        if self.cpu_median is None or not self.payload_bytes:
            return None
        return self.cpu_median / (self.payload_bytes / 1e9)

    @property
    def millicores_per_mbs(self) -> float | None:
        # (cpu / wall * 1000) / (MB / wall) = CPU milliseconds per MB
        if self.cpu_median is None or not self.payload_bytes:
            return None
        return self.cpu_median * 1000 / (self.payload_bytes / 1e6)


def measured_read(path: str, what: str, bootstrap: str, topic: str, data: Dataset,
                  expected: dict[int, PartitionSum], ksi: KsiProcess | None, reset_peak: bool = True) -> Row:
    if ksi is not None and reset_peak:
        ksi.reset_peak()
    cpu_before = ksi.cpu_seconds() if ksi else None
    lake_before = ksi.lake_counters() if ksi else None
    gc.disable()
    try:
        read = read_all(bootstrap, topic, data.partitions, len(data))
    finally:
        gc.enable()
    cpu = ksi.cpu_seconds() - cpu_before if ksi and cpu_before is not None else None
    lake_after = ksi.lake_counters() if ksi else None
    peak = ksi.memory_kib("VmHWM") / 1024 if ksi else None
    check = compare(expected, consumed_sums(read.messages), read.errors)
    if read.stalled:
        check = f"STALLED after {read.records}/{len(data)} records; " + check
    row = Row(path, what, read.records, read.seconds, data.payload_bytes() * read.records // max(len(data), 1),
              check, cpu, peak, read.first_record_seconds * 1000)
    if ksi is not None and lake_before is not None and lake_after is not None:
        row.lake_fetches = lake_after[0] - lake_before[0]
        row.lake_mb = (lake_after[1] - lake_before[1]) / 1e6
        row.ksi_rss_at_start_mib = ksi.rss_at_start_mib
    read.messages.clear()
    extra = (f", ksi {cpu:.2f} CPU s, peak RSS {peak:.0f} MiB, {row.lake_mb:.0f} MB from the lake"
             if cpu is not None and peak is not None else "")
    log(f"{path:28} {row.rate:>10,.0f} rec/s {row.mb_per_second:7.1f} MB/s {row.seconds:6.2f} s{extra}  [{check}]")
    return row


@dataclass
class SeekResult:
    rows: int
    layout: str  # how it was written
    files: int
    manifests: int
    snapshots: int
    build_seconds: float
    first_ms: float
    trials_ms: list[float]
    check: str
    read_ms: list[float] = field(default_factory=list)  # per seek: ksi's time to answer the cold fetch

    @property
    def read_median_ms(self) -> float:
        return statistics.median(self.read_ms) if self.read_ms else float("nan")

    @property
    def median_ms(self) -> float:
        return statistics.median(self.trials_ms) if self.trials_ms else float("nan")

    @property
    def max_ms(self) -> float:
        return max(self.trials_ms) if self.trials_ms else float("nan")


@dataclass(frozen=True)
class SeekTable:
    rows: int
    appends: int
    topic: str
    table: str

    @property
    def layout(self) -> str:
        return f"{self.appends} append{'s' if self.appends != 1 else ''}"


def build_seek_table(catalog: Any, spec: SeekTable, partitions: int, row_group_rows: int) -> float:
    """``spec.rows`` synthetic raw-value rows in ``spec.appends`` appends (each a snapshot with its own files
    and manifest, as an archive job appending over time leaves them; 1 append = a compacted table)."""
    start = time.perf_counter()
    table = create_ksi_table(catalog, spec.table, typed=False, row_group_rows=row_group_rows)
    append_rows = -(-spec.rows // spec.appends)
    chunk_rows = min(1_000_000, append_rows)  # generated and converted 1M rows at a time at most
    chunks_per_append = -(-append_rows // chunk_rows)
    done = 0
    pending: list[pa.Table] = []
    while done < spec.rows:
        n = min(chunk_rows, spec.rows - done)
        chunk = make_dataset(n, partitions, seed=done + 7, schema_id=None, first_id=done)
        # continue each partition's offsets: record i (global) -> partition i % P, offset i // P
        index = np.arange(done, done + n, dtype=np.int64)
        chunk.partition = (index % partitions).astype(np.int32)
        chunk.offset = index // partitions
        chunk.timestamp_ms = BASE_TS_MS + index
        pending.append(ksi_rows(table, chunk, None))
        done += n
        if len(pending) == chunks_per_append or done == spec.rows:
            # one append of several 1M-row chunks: PyIceberg splits it by partition, chunks stay in offset order
            table.append(pa.concat_tables(pending))
            pending = []
            log(f"seek table {spec.table}: {done:,}/{spec.rows:,} rows ({time.perf_counter() - start:.0f} s)")
    return time.perf_counter() - start


def first_record_after_seek(ksi: KsiProcess, consumer: Consumer, topic: str, partition: int, offset: int,
                            timeout: float = 30.0) -> tuple[float, float, str]:
    """(ms to the first record, ms ksi spent answering cold fetches meanwhile (the sum of its lake read
    histogram: the seek's fetch, plus the next one when librdkafka sent it before the record surfaced, which
    the first fetch's chunk then answers from the cache), check)."""
    before = ksi.lake_read_seconds(topic)
    start = time.perf_counter()
    consumer.assign([TopicPartition(topic, partition, offset)])
    try:
        while time.perf_counter() - start < timeout:
            message = consumer.poll(0.01)
            if message is None:
                continue
            elapsed = (time.perf_counter() - start) * 1000
            after = ksi.lake_read_seconds(topic)
            read_ms = (after[0] - before[0]) * 1000
            if message.error() is not None:
                return float("nan"), read_ms, f"error {message.error()}"
            if message.partition() != partition or message.offset() != offset:
                return elapsed, read_ms, (f"WRONG: got {message.partition()}/{message.offset()}, asked "
                                          f"{partition}/{offset}")
            return elapsed, read_ms, "ok"
        return float("nan"), float("nan"), "TIMEOUT"
    finally:
        consumer.unassign()
        # A fetch librdkafka sent after the first record is still being answered: let it finish, so the
        # next seek does not queue behind it.
        time.sleep(SEEK_PAUSE_SECONDS)


def seek_test(ksi: KsiProcess, catalog: Any, specs: list[tuple[SeekTable, float]], partitions: int,
              trials: int, rng: np.random.Generator) -> list[SeekResult]:
    results = []
    for spec, build_seconds in specs:
        rows, topic = spec.rows, spec.topic
        files, manifests, snapshots = data_files(catalog, spec.table)
        consumer = Consumer(consumer_config(ksi.bootstrap))
        try:
            consumer.list_topics(topic, timeout=10)
            per_partition = rows // partitions
            # the first fetch of this table in this ksi: its offset ranges are computed then
            first_ms, _, first_check = first_record_after_seek(ksi, consumer, topic, 0, per_partition // 2)
            checks = [first_check]
            times, reads = [], []
            for _ in range(trials):
                p = int(rng.integers(0, partitions))
                offset = int(rng.integers(per_partition // 4, 3 * per_partition // 4))
                elapsed, read_ms, check = first_record_after_seek(ksi, consumer, topic, p, offset)
                times.append(elapsed)
                reads.append(read_ms)
                checks.append(check)
        finally:
            consumer.close()
        bad = [c for c in checks if c != "ok"]
        result = SeekResult(rows, spec.layout, files, manifests, snapshots, build_seconds, first_ms, times,
                            "ok" if not bad else "; ".join(bad[:3]), reads)
        log(f"seek {rows:,} rows, {spec.layout}: first {first_ms:.0f} ms, then median {result.median_ms:.0f} ms, "
            f"max {result.max_ms:.0f} ms (ksi answering: median {result.read_median_ms:.0f} ms) [{result.check}]")
        results.append(result)
    return results


@dataclass
class ConcurrentResult:
    consumers: int
    records: int
    seconds: float
    payload_bytes: int
    ksi_cpu_seconds: float
    ksi_peak_rss_mib: float
    slowest_seconds: float
    fastest_seconds: float
    check: str

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def concurrent_test(ksi: KsiProcess, topics: list[tuple[str, Dataset, dict[int, PartitionSum]]]) -> ConcurrentResult:
    reads: dict[str, Read] = {}
    barrier = threading.Barrier(len(topics))

    def run(topic: str, data: Dataset) -> None:
        barrier.wait()
        reads[topic] = read_all(ksi.bootstrap, topic, data.partitions, len(data))

    ksi.reset_peak()
    cpu_before = ksi.cpu_seconds()
    threads = [threading.Thread(target=run, args=(t, d), name=f"consumer-{t}") for t, d, _ in topics]
    gc.disable()
    start = time.perf_counter()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.enable()
    elapsed = time.perf_counter() - start
    cpu = ksi.cpu_seconds() - cpu_before
    peak = ksi.memory_kib("VmHWM") / 1024
    checks = []
    for topic, data, expected in topics:
        read = reads.get(topic)
        if read is None:
            checks.append(f"{topic}: consumer failed")
            continue
        check = compare(expected, consumed_sums(read.messages), read.errors)
        if read.stalled:
            check = f"STALLED at {read.records}/{len(data)}; {check}"
        if check != "ok":
            checks.append(f"{topic}: {check}")
        read.messages.clear()
    total = sum(r.records for r in reads.values())
    payload = sum(d.payload_bytes() for _, d, _ in topics)
    result = ConcurrentResult(len(topics), total, elapsed, payload, cpu, peak,
                              max(r.seconds for r in reads.values()), min(r.seconds for r in reads.values()),
                              "ok" if not checks else "WRONG: " + "; ".join(checks[:3]))
    log(f"concurrent x{len(topics)}: {result.rate:,.0f} rec/s aggregate, ksi peak RSS {peak:.0f} MiB, "
        f"{cpu:.1f} CPU s [{result.check}]")
    return result


# -- report -------------------------------------------------------------------------------------------


def rows_pair(seeks: list[SeekResult]) -> tuple[SeekResult, SeekResult] | None:
    """The smallest and the largest table written alike (same number of appends): rows grow, metadata not."""
    for small in sorted(seeks, key=lambda s: s.rows):
        same = [s for s in seeks if s.layout == small.layout and s.rows > small.rows]
        if same:
            return small, max(same, key=lambda s: s.rows)
    return None


def seek_growth(seeks: list[SeekResult]) -> list[str]:
    out = []
    pair = rows_pair(seeks)
    if pair:
        a, b = pair
        out.append(f"- rows alone ({a.rows:,} -> {b.rows:,}, both {a.layout}, {a.files} -> {b.files} data files): "
                   f"seek median {b.median_ms / a.median_ms:.1f}x, first fetch {b.first_ms / a.first_ms:.1f}x")
    by_rows: dict[int, list[SeekResult]] = {}
    for s in seeks:
        by_rows.setdefault(s.rows, []).append(s)
    for rows, variants in sorted(by_rows.items()):
        if len(variants) > 1:
            lo, hi = min(variants, key=lambda s: s.manifests), max(variants, key=lambda s: s.manifests)
            out.append(f"- metadata alone ({rows:,} rows; {lo.manifests} -> {hi.manifests} manifests, {lo.files} -> "
                       f"{hi.files} data files): seek median {hi.median_ms / lo.median_ms:.1f}x, first fetch "
                       f"{hi.first_ms / lo.first_ms:.1f}x")
    smallest, largest = min(seeks, key=lambda s: s.rows), max(seeks, key=lambda s: (s.rows, s.manifests))
    if largest.rows > smallest.rows:
        out.append(f"- both, as appended ({smallest.rows:,}, {smallest.layout} -> {largest.rows:,}, {largest.layout}): "
                   f"seek median {largest.median_ms / smallest.median_ms:.1f}x")
    return [""] + out if out else []


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{model}, {os.cpu_count()} cores{mem}, Linux {platform.release()}"


def fmt(value: float | None, spec: str, missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def report(args: argparse.Namespace, settings: dict[str, Any], rows: list[Row], seeks: list[SeekResult],
           concurrent: ConcurrentResult | None, profiles: dict[str, list[str]], took: float) -> dict[str, Any]:
    print(f"# ksi cold-path benchmark: {args.records:,} records over {args.partitions} partitions")
    print()
    print(f"machine:   {machine()}")
    print(f"software:  python {platform.python_version()}, confluent-kafka {confluent_kafka.__version__}, "
          f"librdkafka {confluent_kafka.libversion()[0]}, pyarrow {pa.__version__}, broker noida-db")
    for key, value in settings.items():
        print(f"{key + ':':10} {value}")
    print()
    direct = next((r for r in rows if r.path == "direct"), None)
    print(f"## Reads ({args.records:,} records; MB = 10^6 B of key + value + headers; best of {args.repeats} "
          f"rounds: direct and pass-through alternating, cold with a fresh ksi per round)")
    print()
    print("| path | what | records/s (best) | MB/s (best) | ratio to direct (best) | ksi CPU s/GB | ksi millicores per MB/s | "
          "ksi peak RSS | first record | served from the lake | all rounds, records/s | median ratio | check |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
    for r in rows:
        ratio = r.rate / direct.rate if direct and direct.rate else None
        print(f"| {r.path} | {r.what} | {r.rate:,.0f} | {r.mb_per_second:.1f} | {fmt(ratio, '.2f')} | "
              f"{fmt(r.cpu_per_gb, '.1f')} | {fmt(r.millicores_per_mbs, '.1f')} | "
              f"{fmt(r.ksi_peak_rss_mib, '.0f')}{' MiB' if r.ksi_peak_rss_mib is not None else ''} | "
              f"{fmt(r.first_record_ms, '.0f')} ms | "
              f"{'—' if r.lake_mb is None else f'{r.lake_mb:.0f} MB in {r.lake_fetches:.0f} fetches'} | "
              f"{', '.join(f'{x / 1000:,.0f}k' for x in r.rounds)} | "
              f"{fmt(r.median_rate / direct.median_rate if direct and direct.median_rate else None, '.2f')} | "
              f"{r.check} |")
    print()
    starts = ", ".join(f"{r.path} {r.ksi_rss_at_start_mib:.0f} MiB" for r in rows if r.ksi_rss_at_start_mib)
    if starts:
        print(f"- ksi RSS right after start-up (included in its peak): {starts}")
    for r in rows:
        if r.note:
            print(f"- {r.path}: {r.note}")
    if seeks:
        print()
        print(f"## Time to first record after a seek (lake-only topic, ksi layout, raw ~100 B values, "
              f"{args.partitions} partitions; {args.seek_trials} seeks to random offsets in the middle quartiles)")
        print()
        print("| table rows | written in | data files | manifests | snapshots | first fetch of the table | "
              "seek median | seek max | ksi answering the fetch (median) | check |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for s in seeks:
            print(f"| {s.rows:,} | {s.layout} | {s.files} | {s.manifests} | {s.snapshots} | {s.first_ms:.0f} ms | "
                  f"{s.median_ms:.0f} ms | {s.max_ms:.0f} ms | {s.read_median_ms:.0f} ms | {s.check} |")
        print()
        print(f"The first fetch of a table includes computing its offset ranges; each seek is a new assign on a "
              f"connected consumer, {SEEK_PAUSE_SECONDS:.0f} s after the previous one (so no earlier fetch is "
              f"still in flight). Building the tables took "
              f"{', '.join(f'{s.build_seconds:.0f} s ({s.rows:,}, {s.layout})' for s in seeks)}.")
        for line in seek_growth(seeks):
            print(line)
    if concurrent:
        c = concurrent
        print()
        print(f"## {c.consumers} consumers at once, each replaying its own lake-only topic "
              f"({c.records // c.consumers:,} records each, typed Avro values), one fresh ksi")
        print()
        print("| consumers | records | aggregate records/s | MB/s | slowest / fastest consumer | ksi CPU s | "
              "ksi millicores per MB/s | ksi peak RSS | check |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        print(f"| {c.consumers} | {c.records:,} | {c.rate:,.0f} | {c.payload_bytes / c.seconds / 1e6:.1f} | "
              f"{c.slowest_seconds:.1f} s / {c.fastest_seconds:.1f} s | {c.ksi_cpu_seconds:.1f} | "
              f"{c.ksi_cpu_seconds * 1000 / (c.payload_bytes / 1e6):.1f} | {c.ksi_peak_rss_mib:.0f} MiB | {c.check} |")

    targets = []
    by_path = {r.path: r for r in rows}
    if direct:
        for path, goal in (("cold, first read", 0.5), ("cold, warm", 1.0), ("pass-through", 0.9)):
            r = by_path.get(path)
            if r is not None and direct.rate and direct.median_rate:
                ratio, median = r.rate / direct.rate, r.median_rate / direct.median_rate
                targets.append((f"{path} >= {goal}x direct (judged on the median of the rounds)",
                                f"median {median:.2f}x, best {ratio:.2f}x", median >= goal and r.check == "ok"))
    for path in ("pass-through", "cold, first read", "cold, warm"):
        r = by_path.get(path)
        if r is not None and r.millicores_per_mbs is not None:
            targets.append((f"ksi CPU <= 25 millicores per MB/s ({path})", f"{r.millicores_per_mbs:.1f}",
                            r.millicores_per_mbs <= 25))
    if seeks:
        most = max(s.rows for s in seeks)
        for big in (s for s in seeks if s.rows == most):
            label = (f"seek <= 100 ms at {big.rows:,} rows, {big.layout}"
                     + ("" if big.rows >= 10_000_000 else " (< 10M rows measured)"))
            targets.append((label, f"median {big.median_ms:.0f} ms, max {big.max_ms:.0f} ms",
                            big.max_ms <= 100 and big.check == "ok"))
        pair = rows_pair(seeks)
        if pair:
            a, b = pair
            growth = b.median_ms / a.median_ms
            label = (f"seek does not grow with rows ({a.rows:,} -> {b.rows:,} rows, both {a.layout}): "
                     f"at most 2x for {b.rows / a.rows:.0f}x the rows")
            targets.append((label, f"{growth:.1f}x", growth <= 2.0))
    if concurrent:
        targets.append((f"peak RSS <= 512 MiB with {concurrent.consumers} concurrent cold consumers",
                        f"{concurrent.ksi_peak_rss_mib:.0f} MiB",
                        concurrent.ksi_peak_rss_mib <= 512 and concurrent.check == "ok"))
    print()
    print("## Targets (reported, not asserted)")
    print()
    print("| target | measured | met |")
    print("|---|---|---|")
    for name, measured, met in targets:
        print(f"| {name} | {measured} | {'met' if met else 'NOT met'} |")
    for name, lines in profiles.items():
        print()
        print(f"## py-spy profile of ksi: {name}")
        print()
        print("```")
        print("\n".join(lines))
        print("```")
    print(f"\nbenchmark took {took:.0f} s")
    return {
        "settings": {**settings, "machine": machine(), "records": args.records, "partitions": args.partitions},
        "reads": [dict(asdict(r), records_per_second=r.rate, mb_per_second=r.mb_per_second,
                       cpu_seconds_per_gb=r.cpu_per_gb, millicores_per_mb_per_second=r.millicores_per_mbs,
                       ratio_to_direct=(r.rate / direct.rate if direct and direct.rate else None),
                       median_records_per_second=r.median_rate,
                       median_ratio_to_direct=(r.median_rate / direct.median_rate
                                               if direct and direct.median_rate else None)) for r in rows],
        "seek": [dict(asdict(s), median_ms=s.median_ms, max_ms=s.max_ms, read_median_ms=s.read_median_ms)
                 for s in seeks],
        "concurrent": dict(asdict(concurrent), records_per_second=concurrent.rate) if concurrent else None,
        "targets": [{"target": n, "measured": m, "met": met} for n, m, met in targets],
        "seconds": took,
    }


# -- orchestration -------------------------------------------------------------------------------------


def better(prev: Row | None, row: Row) -> Row:
    """The fastest correct round; a wrong round wins, so that it is reported."""
    if prev is None or (prev.check == "ok" and (row.check != "ok" or row.rate > prev.rate)):
        return row
    return prev


def rounds(paths: list[str], repeats: int) -> list[str]:
    order: list[str] = []
    for r in range(repeats):
        order += paths if r % 2 == 0 else paths[::-1]
    return order


def parse_setting(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise SystemExit(f"--history wants KEY=VALUE, got {item!r}")
    value: Any = text.strip()
    if value.lower() in ("true", "false"):
        value = value.lower() == "true"
    else:
        try:
            value = int(value.replace("_", ""))
        except ValueError:
            try:
                value = float(value)
            except ValueError:
                pass
    return key.strip(), value


def history_defaults() -> str:
    """ksi's [history] defaults as this checkout has them (the section may not exist in older trees)."""
    try:
        from ksi.config import HistoryConfig  # type: ignore[attr-defined]
    except ImportError:
        return "(no [history] section in this ksi)"
    defaults = HistoryConfig()
    return ", ".join(f"{name}={getattr(defaults, name)!r}" for name in getattr(defaults, "__slots__", ()))


def source_stamp() -> str:
    """The newest file under ksi/ and protocol/ (others edit the tree while benchmarks run: say which one ran)."""
    root = Path(__file__).resolve().parents[1]
    files = [f for d in ("ksi", "protocol") for f in (root / d).rglob("*.py")]
    if not files:
        return "unknown"
    newest = max(files, key=lambda f: f.stat().st_mtime)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(newest.stat().st_mtime))
    return f"newest file {newest.relative_to(root)} modified {when}"


def find_py_spy(wanted: str | None) -> str | None:
    if wanted is None:
        return None
    if wanted != "auto":
        return wanted
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if not found:
        raise SystemExit("--profile needs py-spy (pip install py-spy), or --py-spy PATH")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seek-rows", default="1000000,10000000",
                        help="comma-separated table sizes for the seek test (default 1000000,10000000)")
    parser.add_argument("--no-seek", action="store_true", help="skip the seek test")
    parser.add_argument("--seek-trials", type=int, default=8, help="seeks per table size (after a first fetch)")
    parser.add_argument("--concurrent", type=int, default=8, help="concurrent cold consumers (0: skip)")
    parser.add_argument("--compression", default="none", choices=("none", "gzip", "snappy", "lz4", "zstd"),
                        help="compression of the batches ksi serves from the lake")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per read path: direct and pass-through alternating, cold with a fresh ksi per round")
    parser.add_argument("--row-group-rows", type=int, default=100_000,
                        help="Parquet row group size of the lake tables, in rows")
    parser.add_argument("--append-rows", type=int, default=1_000_000,
                        help="rows per append (snapshot) of the seek tables (default 1000000)")
    parser.add_argument("--no-seek-compact", action="store_true",
                        help="skip the extra single-append copy of the largest seek table")
    parser.add_argument("--no-plain", action="store_true", help="skip the ksi-without-[[topics]] pass-through row")
    parser.add_argument("--keep", action="store_true", help="keep the data directory (printed)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--profile", dest="py_spy", action="store_const", const="auto",
                        help="sample every ksi with py-spy during its measured phase and print where its time goes")
    parser.add_argument("--py-spy", dest="py_spy", help="path of the py-spy binary (implies --profile)")
    parser.add_argument("--history", action="append", default=[], metavar="KEY=VALUE",
                        help="a [history] setting for every ksi that serves history, e.g. cache_bytes=268435456 "
                             "or prefetch=false (repeatable; default: ksi's defaults)")
    parser.add_argument("--ksi-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the ksi processes, e.g. ARROW_DEFAULT_MEMORY_POOL=system")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    seek_sizes = [] if args.no_seek else [int(s.replace("_", "")) for s in args.seek_rows.split(",") if s.strip()]
    py_spy = find_py_spy(args.py_spy)
    history_settings = dict(parse_setting(item) for item in args.history)
    ksi_env = dict(item.split("=", 1) for item in args.ksi_env)
    rng = np.random.default_rng(args.seed)
    bench_start = time.perf_counter()
    load_at_start = os.getloadavg()

    workdir = Path(tempfile.mkdtemp(prefix="ksi-cold-bench-"))
    log(f"data in {workdir}")
    broker: BrokerProcess | None = None
    registry: RegistryServer | None = None
    running: list[KsiProcess] = []
    rows: list[Row] = []
    seeks: list[SeekResult] = []
    concurrent: ConcurrentResult | None = None
    profiles: dict[str, list[str]] = {}
    settings: dict[str, Any] = {}

    def start_ksi(name: str, **kwargs: Any) -> KsiProcess:
        ksi = KsiProcess(workdir, name, broker.bootstrap, history=history_settings,  # type: ignore[union-attr]
                         env=ksi_env, **kwargs)
        running.append(ksi)
        return ksi

    def profile_path(label: str) -> Path:
        return workdir / f"profile-{re.sub(r'[^a-z0-9]+', '-', label.lower()).strip('-')}.txt"

    def profile_start(ksi: KsiProcess, label: str) -> None:
        if py_spy:
            ksi.start_profile(py_spy, profile_path(label))

    def profile_stop(ksi: KsiProcess, label: str) -> None:
        if py_spy:
            ksi.stop_profile()
            profiles[label] = summarise_profile(profile_path(label))

    def stop_ksi(ksi: KsiProcess) -> None:
        ksi.stop()
        running.remove(ksi)
        if ksi.tracebacks():
            log(f"ksi ({ksi.name}) logged a traceback:\n{ksi.log_tail(60)}")

    try:
        registry = start_registry("127.0.0.1", 0, workdir / "registry")
        broker = start_noida(workdir / "noida", free_port())
        catalog, catalog_props = open_catalog(workdir)
        topic, table_name = "bench-cold", "bench.cold"
        schema_id = RegistryClient(registry.url).register(f"{topic}-value", json.dumps(VALUE_SCHEMA))

        # -- data: produce, and the same records into the lake ------------------------------------------
        started = time.perf_counter()
        data = make_dataset(args.records, args.partitions, args.seed, schema_id)
        check_avro(data)
        expected = expected_sums(data)
        mean_value = pc.mean(pc.binary_length(data.values)).as_py()
        log(f"generated {len(data):,} records ({mean_value:.0f} B values on average) in "
            f"{time.perf_counter() - started:.1f} s")
        broker.create_topic(topic, args.partitions)
        seconds = produce(broker.bootstrap, topic, data)
        log(f"produced {len(data):,} records in {seconds:.1f} s")
        seconds = write_ksi_table(catalog, table_name, data, schema_id, args.row_group_rows)
        files, _, _ = data_files(catalog, table_name)
        log(f"wrote {table_name}: {len(data):,} rows, {files} data files, in {seconds:.1f} s")
        history_topic = {"name": topic, "table": table_name, "compression": args.compression}
        lake = {"catalog": catalog_props, "registry_url": registry.url}
        settings = {
            "consumer": {**CONSUMER_CONFIG, "assign": "all partitions from offset 0, consume(10000) until N"},
            "producer": PRODUCER_CONFIG,
            "records": f"keys {KEY_BYTES} B, Avro values {mean_value:.0f} B on average (framed: magic, schema id "
                       f"{schema_id}, body; fields id, user_id, amount, country, status, note), headers "
                       f"{HEADER_KEYS}, {data.payload_bytes() / len(data):.0f} B payload per record",
            "lake": f"PyIceberg SqlCatalog (SQLite) + local warehouse; ksi layout, typed Avro columns, "
                    f"{files} data files, Parquet row groups of {args.row_group_rows:,} rows, zstd",
            "served": f"compression={args.compression}",
            "source": source_stamp(),
            "ksi env": ", ".join(f"{k}={v}" for k, v in ksi_env.items()) or "(inherited)",
            "history": (", ".join(f"{k}={v!r}" for k, v in history_settings.items()) + " (set), defaults: "
                        if history_settings else "ksi's defaults: ") + history_defaults(),
            "ksi": "python -m ksi serve; CPU = utime + stime of the process (all threads) over a read, the "
                   "median round's; peak RSS = VmHWM reset before each read (start-up RSS included), the highest over the "
                   "rounds",
        }

        # -- direct and pass-through, while the broker has the records ----------------------------------
        hot = start_ksi("hot", topics=[history_topic], **lake)
        paths = ["direct", "pass-through"]
        bootstraps = {"direct": broker.bootstrap, "pass-through": hot.bootstrap}
        procs: dict[str, KsiProcess | None] = {"direct": None, "pass-through": hot}
        if not args.no_plain:
            plain = start_ksi("plain")
            paths.append("pass-through, no [[topics]]")
            bootstraps[paths[-1]], procs[paths[-1]] = plain.bootstrap, plain
        best: dict[str, Row] = {}
        peaks: dict[str, float] = {}
        lake_mb: dict[str, float] = {}
        rates: dict[str, list[float]] = {}
        cpus: dict[str, list[float]] = {}
        for path in paths:
            if procs[path] is not None:
                procs[path].reset_peak()  # type: ignore[union-attr]
        profile_start(hot, "pass-through (all rounds)")
        for path in rounds(paths, args.repeats):
            row = measured_read(path, "", bootstraps[path], topic, data, expected, procs[path], reset_peak=False)
            if row.ksi_peak_rss_mib is not None:
                peaks[path] = max(peaks.get(path, 0.0), row.ksi_peak_rss_mib)
            if row.lake_mb:
                lake_mb[path] = lake_mb.get(path, 0.0) + row.lake_mb
            rates.setdefault(path, []).append(row.rate)
            if row.ksi_cpu_seconds is not None:
                cpus.setdefault(path, []).append(row.ksi_cpu_seconds)
            best[path] = better(best.get(path), row)
        profile_stop(hot, "pass-through (all rounds)")
        for path in paths:
            row = best[path]
            row.ksi_peak_rss_mib = peaks.get(path)
            row.rounds, row.cpu_rounds = rates[path], cpus.get(path, [])
            if lake_mb.get(path):
                row.note = f"{lake_mb[path]:.0f} MB of its reads came from the lake: not a pure pass-through"
            row.what = {"direct": "consume N records straight from the broker (the reference)",
                        "pass-through": "through ksi, records still in the broker (topic configured with its "
                                        "table, which holds the same offsets)",
                        "pass-through, no [[topics]]": "through a ksi with no history configured"}[path]
            rows.append(row)
        stop_ksi(hot)
        if not args.no_plain:
            stop_ksi(plain)

        # -- cold: the broker no longer has the records ---------------------------------------------------
        for p in range(args.partitions):
            high = int((data.partition == p).sum())
            broker.delete_records(topic, p, high)
        log(f"deleted every record of {topic} from the broker (log start = high watermark)")
        cold_paths = {"cold, first read": "through ksi, records only in Iceberg, nothing cached (a fresh ksi "
                                          "process per round)",
                      "cold, warm": "the same again: a second consumer (new group), same ksi process"}
        best, peaks, rates, cpus = {}, {}, {}, {}
        for r in range(args.repeats):
            cold = start_ksi(f"cold-{r}", topics=[history_topic], **lake)
            for path, what in cold_paths.items():
                if r == 0:
                    profile_start(cold, path)
                row = measured_read(path, what, cold.bootstrap, topic, data, expected, cold)
                if r == 0:
                    profile_stop(cold, path)
                peaks[path] = max(peaks.get(path, 0.0), row.ksi_peak_rss_mib or 0.0)
                rates.setdefault(path, []).append(row.rate)
                cpus.setdefault(path, []).append(row.ksi_cpu_seconds or 0.0)
                best[path] = better(best.get(path), row)
            stop_ksi(cold)
        for path in cold_paths:
            best[path].ksi_peak_rss_mib, best[path].rounds = peaks[path], rates[path]
            best[path].cpu_rounds = cpus[path]
            rows.append(best[path])
        del data

        # -- seek ----------------------------------------------------------------------------------------------
        if seek_sizes:
            specs = [SeekTable(n, max(1, -(-n // args.append_rows)), f"bench-seek-{n}", f"bench.seek_{n}")
                     for n in seek_sizes]
            largest = max(specs, key=lambda t: t.rows)
            if largest.appends > 1 and not args.no_seek_compact:
                specs.append(SeekTable(largest.rows, 1, f"bench-seek-{largest.rows}-compact",
                                       f"bench.seek_{largest.rows}_compact"))
            built = [(spec, build_seek_table(catalog, spec, args.partitions, args.row_group_rows)) for spec in specs]
            seeker = start_ksi("seek", topics=[{"name": t.topic, "table": t.table, "lake_only_readers": ["*"]}
                                               for t in specs], **lake)
            profile_start(seeker, "seek test")
            seeks = seek_test(seeker, catalog, built, args.partitions, args.seek_trials, rng)
            profile_stop(seeker, "seek test")
            stop_ksi(seeker)

        # -- concurrent cold consumers -------------------------------------------------------------------------
        if args.concurrent > 0:
            per_topic = max(args.records // args.concurrent, args.partitions)
            topics = []
            for j in range(args.concurrent):
                part = make_dataset(per_topic, args.partitions, args.seed + 100 + j, schema_id)
                name = f"bench.conc_{j}"
                write_ksi_table(catalog, name, part, schema_id, args.row_group_rows)
                topics.append((f"bench-conc-{j}", part, expected_sums(part)))
            log(f"wrote {args.concurrent} lake-only tables of {per_topic:,} rows")
            many = start_ksi("concurrent", topics=[{"name": t, "table": f"bench.conc_{j}",
                                                    "compression": args.compression, "lake_only_readers": ["*"]}
                                                   for j, (t, _, _) in enumerate(topics)], **lake)
            profile_start(many, f"{args.concurrent} concurrent consumers")
            concurrent = concurrent_test(many, topics)
            profile_stop(many, f"{args.concurrent} concurrent consumers")
            stop_ksi(many)
    finally:
        for ksi in running:
            ksi.stop()
        if broker is not None:
            broker.stop()
        if registry is not None:
            registry.stop()
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    settings["load"] = (f"1-minute load average {load_at_start[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end "
                        f"(this benchmark's own processes included)")
    if py_spy:
        settings["profiler"] = "py-spy record --rate 200 on the ksi process: figures include its overhead"
    results = report(args, settings, rows, seeks, concurrent, profiles, time.perf_counter() - bench_start)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
        log(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
