"""Spark's Python daemon with the archive task's imports done once (``spark.python.daemon.module``).

Spark starts ``python -m pyspark.daemon`` on each executor and forks a Python worker from it per task
slot.  Started as ``python -m ksi.pipeline.daemon`` instead, the daemon imports pyarrow, numpy,
confluent-kafka and ksi's task code before forking, so no task pays for those imports (measured: about
6 s of a 2M-record run's worker time went to importing, once per task) and the workers share those pages.
"""

from __future__ import annotations

from pyspark import daemon

import ksi.pipeline.tasks  # noqa: F401  (the point of this module: import before the fork)

if __name__ == "__main__":
    daemon.manager()  # type: ignore[no-untyped-call]  # pyspark's daemon module is unannotated
