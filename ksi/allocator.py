"""The process's memory allocators, set up for a proxy that holds few, large, short-lived buffers.

Cold reads decode Arrow columns and encode record batches of megabytes each, in worker threads, and free
them once the cache has taken the bytes.  Two defaults keep that freed memory in the process:

* Arrow's own pool (mimalloc) keeps freed memory for reuse: with reads of every size in turn it measured
  about 100 MiB more peak RSS for the same reads (``bench/cold.py``).  ksi gives Arrow the C library's
  allocator instead, unless ``ARROW_DEFAULT_MEMORY_POOL`` says otherwise.
* glibc's malloc gives each thread an arena of its own (up to 8 per core) and keeps the free pages of each
  heap until a free at the top lets it shrink; its mmap threshold rises with every large block freed, so
  later blocks of that size come from those heaps too.  :func:`trim` (``malloc_trim``) hands the free
  pages of every arena back after a lake read, once the process's resident memory is above what it is
  expected to hold (:func:`tune`'s ``keep_bytes``).
* The arenas are capped at ``ARENAS`` (unless ``MALLOC_ARENA_MAX`` is set), one per two cores: one on a
  2-core machine, where the event loop and both read threads then share glibc's main heap.  That cap has to
  be set before a second thread allocates (:func:`limit_arenas`, first thing in ``ksi serve``): an arena a
  thread has made stays, and later threads share the ones there are.  Set when the history service started,
  as it was until stop 38, the cap of two left six thread-arena heaps besides the main heap by the time 8
  consumers read (64 MiB-aligned heaps in /proc/PID/maps; 13 with glibc left alone, none now).  Measured on
  10M-row tables, 2-core AMD EPYC (2026-12-08, ``ksi serve`` with ``MALLOC_ARENA_MAX=1`` against the cap of
  two set late): 8 consumers of the archive table peaked at 472-497 MiB against 523-552 (four runs each way),
  of the one-file table at 463-466 against 489-502; one consumer of the archive table at 440-458 against
  489-517; the same records per second and ksi CPU (0.37-0.40 cores against 0.38-0.40 with 8 consumers).
  With the cap set first thing: 489 and 505 MiB (8 consumers, archive).  First reads of the 1M-row tables
  (``bench/cold.py --large 0``, one run against three of the code before): 4.8 / 7.2 / 5.0 / 4.7 CPU-s per GB
  (one-file, streaming, hourly, archive) against 4.8-5.3 / 6.8-7.0 / 4.5-5.1 / 5.2-6.3, peaks 367-423 MiB
  against 361-497.  Machines with more cores get more arenas, untested here.
* Below that, freed pages are kept for the next read: every page handed back is faulted in again, zeroed,
  when a later read allocates it.  Trimming after every read (at most every 0.2 s) doubled a first read's
  page faults (bench/cold.py's 1M-row tables: 82-131k against 35-85k) for 6-13% more of its CPU (2026-11-29,
  fresh ksi processes alternating: 12.9 CPU-s against 11.4 over six reads, 23.0 against 21.6 over twelve),
  while the read's peak RSS moved by -7 to +58 MiB (322-427 MiB); never trimming let 8 consumers of a 10M-row
  table peak at 528 MiB, trimming above 384 MiB at 426-457 (413-447 trimming always).
* Reading a table of 10M rows, ksi's resident memory stays above that 384 MiB (217 MiB once the 5,000-file
  streaming table is planned, the cache and the reads in flight on top), so reads trimmed whenever the
  interval allowed, and at 0.2 s that was after nearly every read: 131-137k page faults per million records
  on the streaming and one-file tables.  Trimming at most once a second (TRIM_EVERY_SECONDS) halved them
  (52-66k; 38-44k at 2 s, 24k never trimming) for 10-20% less CPU per record on those two (one consumer,
  fresh ksi processes alternating, two pairs a shape: streaming 20.5-20.9 -> 17.0-18.9 CPU-s per GB, one-file
  11.7-13.2 -> 9.3-11.6; hourly and archive within their spread), one consumer's peak at 403-475 MiB against
  400-491 and 8 consumers' at 402-467 against 394-436 (2026-11-29, stop 36).  Never trimming let one
  consumer alone peak at 497-520 MiB.

Elsewhere (musl, macOS) the C library is left alone; ``KSI_MALLOC_TUNE=0`` leaves glibc alone too (to
compare, as the measurements above did).

And a module the proxy never uses stays out of it: PyIceberg's Arrow I/O imports ``pyarrow.dataset``, which
imports pandas whenever it is installed (the ``spark`` extra installs it), for 32 MiB of resident memory
(measured: 204 MiB after ksi serve's imports with it, 172 without).  :func:`leave_out_pandas` makes
``import pandas`` fail in ``ksi serve``'s process, which pyarrow takes as "pandas is not installed".
``ksi archive``'s driver leaves it out too: there it is time, 0.15 s of a run's ~0.9 s of imports (py-spy),
which every run pays before it reads a record; its tasks (Spark's Python workers, the local engine's
forkserver) are other processes and import what they import.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.abc
import os
import sys
import time
from functools import cache
from typing import Any

__all__ = ["ARENAS", "leave_out_pandas", "limit_arenas", "resident_bytes", "trim", "tune"]

ARENAS = max(1, min(8, (os.cpu_count() or 2) // 2))  # more arenas, more peak RSS (see the docstring)
M_ARENA_MAX = -8  # glibc's mallopt parameter


@cache
def _glibc() -> Any | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas() -> None:
    """Cap glibc's arenas at ARENAS: before the process starts a second thread (see the module's docstring)."""
    libc = _glibc()
    if libc is not None and "MALLOC_ARENA_MAX" not in os.environ and os.environ.get("KSI_MALLOC_TUNE", "1") != "0":
        libc.mallopt(M_ARENA_MAX, ARENAS)


def tune(keep_bytes: int = 0) -> None:
    """Arrow on the C library's allocator, glibc's arenas capped (if :func:`limit_arenas` was not called
    earlier, for threads started from now on); once per process, before reads start.  ``keep_bytes``:
    :func:`trim` hands free pages back only while the process's resident memory is above it."""
    _keep[0] = keep_bytes
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())
    limit_arenas()


TRIM_EVERY_SECONDS = 1.0  # at most one malloc_trim a second: see the module's docstring
_last_trim = [0.0]
_keep = [0]               # tune's keep_bytes
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """The process's resident memory (Linux's /proc/self/statm), None where that cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def trim() -> None:
    """Give the C library's free pages back to the system (after a read freed its buffers) when the process's
    resident memory is above tune's ``keep_bytes``, at most every TRIM_EVERY_SECONDS."""
    libc = _glibc()
    if libc is None or os.environ.get("KSI_MALLOC_TUNE", "1") == "0":
        return
    now = time.monotonic()
    if now - _last_trim[0] >= TRIM_EVERY_SECONDS:
        _last_trim[0] = now
        resident = resident_bytes() if _keep[0] else None
        if resident is None or resident > _keep[0]:
            libc.malloc_trim(0)


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r} (left out of this ksi process: see ksi.allocator)",
                                      name=name)


def leave_out_pandas() -> None:
    """``import pandas`` fails in this process from now on (before anything imported it): for the proxy's
    process and ``ksi archive``'s driver, where nothing uses it."""
    if "pandas" not in sys.modules and not any(isinstance(f, _NoPandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoPandas())
