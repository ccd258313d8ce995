"""Record batch encoding benchmark: protocol.records against kafka-python's per-record builder.

    .venv/bin/python bench/encode.py                      # 1,000,000 records, every compression
    .venv/bin/python bench/encode.py --records 200000 --compression none lz4
    .venv/bin/python bench/encode.py --profile            # cProfile of the fast encoder, no compression

Records look like a topic ksi serves from the lake: 8-byte keys, 100-byte text-like values (so the
codecs have something to compress), one 16-byte header, offsets with a few gaps, millisecond timestamps
that mostly rise.  The fast encoder turns all of them into 1 MiB batches (``encode_batches``); the
reference, kafka-python's ``DefaultRecordBatchBuilder`` (one ``append`` per record), encodes a
--reference-records subset into batches of the same size.  "to magic 1" is the conversion of those
batches for Fetch v2-v3 clients (``protocol.legacy_records.convert_batches``, a per-record loop), on the
same --reference-records subset.  MB/s counts the uncompressed records bytes (10^6 bytes), the same for
all.  Best of --repeats runs.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kafka.record.default_records import DefaultRecordBatchBuilder

from ksi.lake.columns import Columns
from protocol.legacy_records import convert_batches
from protocol.records import COMPRESSION_CODECS, RecordColumns, encode_batches

MIB = 1 << 20
WORDS = b"the quick brown fox jumps over a lazy dog order user item price status shipped paid 0123456789 ".split()


def fixed_width(data: np.ndarray, width: int) -> pa.Array:
    n = len(data) // width
    offsets = np.arange(n + 1, dtype=np.int32) * width
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def make_columns(n: int, value_bytes: int = 100, key_bytes: int = 8, seed: int = 0) -> RecordColumns:
    rng = np.random.default_rng(seed)
    offsets = 1_000_000 + np.cumsum(rng.choice([1, 1, 1, 1, 1, 1, 1, 2], size=n)).astype(np.int64)
    timestamps = (1_700_000_000_000 + np.cumsum(rng.integers(-2, 5, size=n))).astype(np.int64)
    text = np.frombuffer(b" ".join(rng.choice(WORDS, size=64 * 1024)), dtype=np.uint8)
    starts = rng.integers(0, len(text) - value_bytes, size=n)
    value_data = text[(starts[:, None] + np.arange(value_bytes)).ravel()]
    values = fixed_width(value_data, value_bytes)
    keys = fixed_width(rng.integers(0, 256, size=n * key_bytes, dtype=np.uint8), key_bytes)
    header_values = fixed_width(rng.integers(0, 256, size=n * 16, dtype=np.uint8), 16)
    header_keys = pa.array(["trace-id"]).take(np.zeros(n, dtype=np.int32))
    entries = pa.StructArray.from_arrays([header_keys, header_values], names=["key", "value"])
    headers = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), entries)
    return Columns(offsets, timestamps, keys, values, headers)


def reference_batches(columns: RecordColumns, compression: str, max_batch_bytes: int) -> list[bytes]:
    """kafka-python's builder, one append per record (producer id -1, as ksi writes them)."""
    codec = COMPRESSION_CODECS[compression]
    offsets, timestamps = columns.offsets.tolist(), columns.timestamps.tolist()
    keys, values = columns.keys.to_pylist(), columns.values.to_pylist()
    headers = [[] if h is None else [(e["key"], e["value"]) for e in h] for h in columns.headers.to_pylist()] \
        if columns.headers is not None else [[]] * len(offsets)
    out: list[bytes] = []
    i, n = 0, len(offsets)
    while i < n:
        builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, max_batch_bytes)
        base = offsets[i]
        while i < n:
            if builder.append(offsets[i] - base, timestamps[i], keys[i], values[i], headers[i]) is None:
                break
            i += 1
        out.append(bytes(builder.build()))
    return out


def best_of(repeats: int, fn: object) -> tuple[float, list[bytes]]:
    best, result = float("inf"), []
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--reference-records", type=int, default=100_000)
    parser.add_argument("--max-batch-bytes", type=int, default=MIB)
    codecs = list(COMPRESSION_CODECS)
    parser.add_argument("--compression", nargs="+", default=codecs, choices=codecs)
    parser.add_argument("--level", type=int, default=None, help="compression_level for the fast encoder")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--profile", action="store_true", help="cProfile one uncompressed run and exit")
    args = parser.parse_args()

    columns = make_columns(args.records)
    if args.profile:
        encode_batches(columns, max_batch_bytes=args.max_batch_bytes)
        profile = cProfile.Profile()
        profile.enable()
        encode_batches(columns, max_batch_bytes=args.max_batch_bytes)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(18)
        return

    plain = encode_batches(columns, max_batch_bytes=args.max_batch_bytes)
    records_bytes = sum(len(b) for b in plain) - 61 * len(plain)
    subset = columns.slice(0, args.reference_records)
    subset_bytes = records_bytes * len(subset) / len(columns)
    print(f"{len(columns):,} records, {records_bytes / len(columns):.1f} bytes each in {len(plain)} batches "
          f"of <= {args.max_batch_bytes:,} bytes; reference on {len(subset):,}")
    print(f"{'compression':<12}{'encoder':<11}{'records/s':>13}{'MB/s':>9}{'out/in':>8}")
    for compression in args.compression:
        seconds, batches = best_of(
            args.repeats,
            lambda: encode_batches(
                columns, max_batch_bytes=args.max_batch_bytes, compression=compression,  # noqa: B023 - called now
                compression_level=args.level,
            ),
        )
        ratio = sum(len(b) for b in batches) / sum(len(b) for b in plain)
        print(f"{compression:<12}{'ksi':<11}{len(columns) / seconds:>13,.0f}{records_bytes / seconds / 1e6:>9.1f}"
              f"{ratio:>8.3f}")
        if not args.no_reference:
            seconds, batches = best_of(1, lambda: reference_batches(subset, compression,  # noqa: B023 - called now
                                                                    args.max_batch_bytes))
            print(f"{'':<12}{'reference':<11}{len(subset) / seconds:>13,.0f}{subset_bytes / seconds / 1e6:>9.1f}")
        encoded = b"".join(encode_batches(subset, max_batch_bytes=args.max_batch_bytes, compression=compression))
        seconds, converted = best_of(args.repeats, lambda: [convert_batches(encoded, 1)])  # noqa: B023 - called now
        print(f"{'':<12}{'to magic 1':<11}{len(subset) / seconds:>13,.0f}{subset_bytes / seconds / 1e6:>9.1f}"
              f"{len(converted[0]) / len(encoded):>8.3f}")


if __name__ == "__main__":
    main()
