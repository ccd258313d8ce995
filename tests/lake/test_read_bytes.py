"""Bytes in flight are bounded in bytes, not rows: a row group of large values (256 KiB each, one row group
of 60 MiB) is streamed a few rows at a time and read a few MiB at a time (``history.max_read_bytes``), so
the Arrow memory a replay needs stays near the bound whatever the row group holds; without the bound, the
one window holds it whole.

Each replay runs in a process of its own: Arrow's pool reports its peak since the process started
(``max_memory``), and tracemalloc the peak of Python's allocations (the encoded batches)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from .tables import REDPANDA, Row, arrow_rows, catalog

ROWS = 240
VALUE_BYTES = 256 << 10          # 60 MiB of values in one data file, one row group
CACHE_BYTES = 8 << 20
BOUND = 2 << 20                  # max_read_bytes for the bounded replay

REPLAY = r'''
import hashlib, json, sys, tracemalloc
import pyarrow as pa, trio
from pyiceberg.catalog.sql import SqlCatalog
from kafka.record.default_records import DefaultRecordBatch
from ksi.config import TopicConfig
from ksi.history.chunks import encode_span
from ksi.lake.cache import ChunkCache
from ksi.lake.files import Cursors
from ksi.lake.reader import ColdReader
from ksi.lake.table import FIRST_READ_WINDOWS, LakeTable

tmp, max_read_bytes, cache_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lake = SqlCatalog("lake", uri=f"sqlite:///{tmp}/catalog.db", warehouse=f"file://{tmp}/warehouse")
table = LakeTable(lake, TopicConfig(name="large", table="t.large", layout="redpanda"),
                  cursors=Cursors(window_bytes=max_read_bytes // FIRST_READ_WINDOWS))
table.offset_ranges()
reader = ColdReader(ChunkCache(cache_bytes), threads=2, max_read_bytes=max_read_bytes)
digests = {}
in_flight = [0]

async def main():
    async with trio.open_nursery() as nursery:
        await nursery.start(reader.serve)
        offset = 0
        while True:
            got = await reader.read(table, encode_span, 0, offset, None, None, 1 << 20, reader=1)
            in_flight[0] = max(in_flight[0], reader.in_flight_bytes)
            if not got:
                break
            for data in got:
                for record in DefaultRecordBatch(data):
                    digests[record.offset] = hashlib.sha256(record.value).hexdigest()
                    offset = record.offset + 1
        nursery.cancel_scope.cancel()

tracemalloc.start()
trio.run(main)
print(json.dumps({"digests": digests, "arrow_peak": pa.default_memory_pool().max_memory(),
                  "python_peak": tracemalloc.get_traced_memory()[1], "in_flight_peak": in_flight[0],
                  "windows": table.plan.partitions[0].components}))
'''


def value(offset: int) -> bytes:
    return np.random.default_rng(offset).bytes(VALUE_BYTES)  # incompressible


def replay(tmp_path: Path, max_read_bytes: int) -> dict[str, object]:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", REPLAY, str(tmp_path), str(max_read_bytes), str(CACHE_BYTES)],
                          cwd=root, capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_a_row_group_of_large_values_is_read_within_max_read_bytes(tmp_path: Path) -> None:
    import hashlib

    lake = catalog(tmp_path)
    # Pages of 4 values (1 MiB: the page size writers aim at; a page is the least Parquet decodes).
    table = lake.create_table("t.large", schema=REDPANDA, properties={"write.parquet.row-group-limit": "1000000",
                                                                      "write.parquet.page-row-limit": "4"})
    table.append(arrow_rows(table, [Row(0, o, value=value(o)) for o in range(ROWS)]))
    want = {str(o): hashlib.sha256(value(o)).hexdigest() for o in range(ROWS)}

    bounded = replay(tmp_path, BOUND)
    assert bounded["digests"] == want  # every record once, its value exact
    assert isinstance(bounded["arrow_peak"], int) and isinstance(bounded["python_peak"], int)
    assert bounded["arrow_peak"] <= 8 * BOUND, bounded["arrow_peak"]   # 16 MiB, of a 60 MiB row group
    assert bounded["python_peak"] <= CACHE_BYTES + 8 * BOUND, bounded["python_peak"]
    assert 0 < bounded["in_flight_peak"] <= 2 * BOUND  # type: ignore[operator]

    whole = replay(tmp_path, 1 << 30)  # no bound to speak of: one window holds the row group
    assert whole["digests"] == want
    assert whole["arrow_peak"] >= ROWS * VALUE_BYTES, whole["arrow_peak"]  # type: ignore[operator]
