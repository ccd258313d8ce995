"""The local engine's worker processes come from a fork server that has already imported the task code.

``forkserver`` (not ``fork``: the driver has librdkafka and catalog threads, which a fork would copy
mid-flight) with :mod:`ksi.pipeline.tasks` preloaded, so a worker starts in milliseconds with pyarrow,
PyIceberg and confluent-kafka imported.  This module imports nothing heavy itself: ``ksi archive`` calls
:func:`start_fork_server` first thing, and the server does its imports (about a second) in its own
process while the driver asks the catalog and the broker what is new.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

__all__ = ["fork_context", "start_fork_server"]


def fork_context() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["ksi.pipeline.tasks"])
    return context


def start_fork_server() -> None:
    """Start the fork server now; this does not wait for its imports."""
    from multiprocessing import forkserver

    fork_context()
    forkserver.ensure_running()
