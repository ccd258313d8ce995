"""Run ksi's PySpark pipeline from your own code: archive a topic into Iceberg, then compact its table.

    python examples/spark_archive.py --config ksi.toml --topic orders [--master local[4]] [--compact]

The config is the same TOML file `ksi serve` uses; it needs [upstream], [catalog] (with a warehouse) and a
[[topics]] entry for the topic, and may have [spark], [archive] and [compact] sections (docs/pipeline.md).
This is what `ksi archive` / `ksi compact` do, spelled out: one SparkSession for the process, then one
call per topic.  Run it again whenever you like: each run archives only what the table does not hold yet.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from ksi.pipeline.archive import archive_topic
from ksi.pipeline.compact import compact_table
from ksi.pipeline.settings import load_pipeline_config, select_topics, with_overrides
from ksi.pipeline.spark import get_spark


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--topic", action="append", help="default: every [[topics]] entry")
    parser.add_argument("--master", help="e.g. local[4], spark://host:7077 (default: spark.master or local[*])")
    parser.add_argument("--compact", action="store_true", help="also compact the tables afterwards")
    args = parser.parse_args()

    pipeline = load_pipeline_config(args.config)
    pipeline = dataclasses.replace(pipeline, spark=with_overrides(pipeline.spark, master=args.master))
    spark = get_spark(pipeline.spark, pipeline.config.catalog)  # jars, catalog and extensions from the config

    for topic in select_topics(pipeline.config, args.topic):
        result = archive_topic(spark, pipeline, topic, progress=lambda line: print(line, file=sys.stderr))
        print(result.summary_line())
        for r in result.ranges:
            print(f"  partition {r.partition}: archived up to offset {r.stop} (log starts at {r.log_start})")
        if args.compact:
            print(compact_table(spark, pipeline, topic).summary_line())
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
