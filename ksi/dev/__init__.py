"""``ksi dev``: a broker, the Schema Registry, an Iceberg catalog and the proxy on loopback, with a demo
topic whose first offsets live only in Iceberg.

    run.py     the command: ports, steps with progress lines, "up" only once every part answered
    demo.py    the demo topic, its Avro values, the archive of its first offsets, the config
    checks.py  the questions each part must answer before ksi dev says it is up
    state.py   the data directory: one ksi dev at a time, leftovers of a killed one stopped, --reset
"""

from __future__ import annotations

from .demo import DEMO_TOPIC
from .run import EXTRA, run_dev

__all__ = ["DEMO_TOPIC", "EXTRA", "run_dev"]
