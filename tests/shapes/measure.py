"""Build times of the table builder, per shape: ``python -m tests.shapes.measure [--rows N ...]``.

Each build runs in a child process (so its peak RSS is its own) on a SqlCatalog in a temporary
directory, from :func:`~tests.shapes.records.synthetic_slices` (about 130-byte records, 4 partitions,
500,000-record slices).  Prints one line per build and a Markdown table at the end.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

# shape -> (layout, layout options, hours the timestamps span, rows per file as a fraction of N)
BUILDS: dict[str, tuple[str, dict[str, Any], float, float | None]] = {
    "one-file": ("redpanda", {}, 1, None),                       # one file, one row group (a translation)
    "streaming": ("automq", {}, 1, 1 / 1000),                    # 1,000 files, a snapshot per 4
    "hourly": ("redpanda", {}, 48, 1 / 192),                     # hour(redpanda.timestamp), files per partition
    "daily": ("kafka-connect", {}, 24 * 30, 1 / 1000),           # day(ts) over 30 days
    "archive": ("ksi", {}, 1, 1 / 64),                           # 16 archive runs x 4 partitions
    "large": ("automq", {"files_per_commit": 10}, 1, 1 / 1000),  # 1,000 files, 100 manifests
}


def build(shape: str, rows: int, workdir: str) -> dict[str, Any]:
    from pyiceberg.catalog.sql import SqlCatalog

    from .build import write_table
    from .records import synthetic_slices

    layout, options, hours, per_file = BUILDS[shape]
    options = dict(options)
    if per_file is not None:
        options["rows_per_file"] = max(1, int(rows * per_file))
    typed = layout in ("kafka-connect", "streambased")
    catalog = SqlCatalog("lake", uri=f"sqlite:///{workdir}/catalog.db", warehouse=f"file://{workdir}/warehouse")
    started = time.perf_counter()
    report = write_table(catalog, f"bench.{shape.replace('-', '_')}",
                         synthetic_slices(rows, 4, slice_rows=500_000, typed=typed,
                                          ms_per_record=hours * 3_600_000 / rows),
                         layout=layout, shape=shape, **options)
    seconds = time.perf_counter() - started
    return {"shape": shape, "layout": layout, "rows": report.rows, "files": report.files,
            "row_groups": report.row_groups, "snapshots": report.snapshots, "mib": report.bytes / 2**20,
            "seconds": seconds, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--shapes", nargs="+", default=list(BUILDS), choices=list(BUILDS))
    parser.add_argument("--child", nargs=2, metavar=("SHAPE", "ROWS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory(prefix="shapes-") as workdir:
            print(json.dumps(build(args.child[0], int(args.child[1]), workdir)))
        return 0
    results = []
    for rows in args.rows:
        for shape in args.shapes:
            out = subprocess.run([sys.executable, "-m", "tests.shapes.measure", "--child", shape, str(rows)],
                                 capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(f"{shape} {rows:,}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                return 1
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results.append(r)
            print(f"{r['shape']:10} {r['layout']:14} {r['rows']:>11,} rows  {r['files']:>5} files  "
                  f"{r['row_groups']:>5} row groups  {r['snapshots']:>4} snapshots  {r['mib']:>7.0f} MiB  "
                  f"{r['seconds']:>6.1f} s  peak RSS {r['rss_mib']:.0f} MiB", flush=True)
    print("\n| shape | layout | rows | files | row groups | snapshots | MiB | seconds | peak RSS MiB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['shape']} | {r['layout']} | {r['rows']:,} | {r['files']} | {r['row_groups']} | {r['snapshots']} "
              f"| {r['mib']:.0f} | {r['seconds']:.1f} | {r['rss_mib']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
