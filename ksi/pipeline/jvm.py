"""The driver JVM's start: options that make it start in about a second, and its class-data sharing archive.

Spark's driver JVM is on the critical path of every ``ksi archive`` run that uses Spark, and on a small
machine its start is mostly class loading and JIT compilation (profile in docs/pipeline.md: 2.9 s and 4.8
CPU-seconds to a ready SparkContext on the project's 2-core VM, JDK 17).  Three options cut it:

* **Application class-data sharing** (AppCDS, JDK 13+): the classes Spark loads to start are parsed,
  verified and laid out once, into an archive that later JVMs map.  The archive is made by a JVM that
  ran with ``-XX:ArchiveClassesAtExit`` (dumped when it exits), once per Java build, pyspark version and
  option set (:func:`archive_path`): ``python -m ksi.pipeline.jars`` (run by the install script) makes them,
  and so does the first ``ksi archive`` run that finds its own missing (it then exits a few seconds later).
  A JVM that cannot use an archive (another JDK) starts without it, silently.
* **C1 only** (``-XX:TieredStopAtLevel=1``): the driver of an archive run schedules tasks and moves a few
  kilobytes per task; it never runs long enough for C2's optimisations to pay for their compile time.
* **Serial GC**: one GC thread instead of one per core, and a smaller footprint, for a heap that holds
  little more than Spark's own bookkeeping.

Measured (docs/pipeline.md): 1.1 s and 1.4 CPU-seconds to a ready SparkContext, 205 MiB RSS.  Only the
driver gets these options; executors on a cluster are the cluster's.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .jars import jar_cache_dir

__all__ = ["FAST_START_OPTIONS", "archive_path", "cds_options", "install_archive", "java_release"]

FAST_START_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
# A class the archive cannot hold (old class file versions, generated accessors) is a warning per class at dump
# time, and an unusable archive one more at start: neither is the user's business.
QUIET_CDS = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def java_release(java_home: str) -> str:
    """The Java build at ``java_home`` (its ``release`` file, else the ``java`` binary's identity)."""
    release = Path(java_home) / "release"
    try:
        return release.read_text(encoding="utf-8", errors="replace")
    except OSError:
        java = Path(java_home) / "bin" / "java"
        stat = java.stat()
        return f"{os.path.realpath(java)} {stat.st_size} {stat.st_mtime_ns}"


def archive_path(java_home: str, purpose: str, options: tuple[str, ...]) -> Path:
    """Where the class-data archive for this Java build, pyspark version, ``purpose`` and JVM ``options`` is."""
    import pyspark

    key = hashlib.sha256("\0".join([java_release(java_home), pyspark.__version__, purpose, *options]).encode())
    return jar_cache_dir() / "cds" / f"spark-{purpose}-{key.hexdigest()[:16]}.jsa"


def cds_options(java_home: str, purpose: str, options: tuple[str, ...], dump: bool = True
                ) -> tuple[list[str], Path | None]:
    """JVM options that use the archive, or, when it does not exist yet and ``dump``, make one when the JVM
    exits; and the path the dump goes to (moved into place by :func:`install_archive` once the JVM has exited:
    only an owner that stops the JVM itself should ask for a dump)."""
    target = archive_path(java_home, purpose, options)
    if target.is_file():
        return [f"-XX:SharedArchiveFile={target}", *QUIET_CDS], None
    if not dump:
        return [], None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only environment: start without an archive
        return [], None
    _sweep(target.parent)
    path = target.with_name(f"{target.stem}.{os.getpid()}.tmp")
    return [f"-XX:ArchiveClassesAtExit={path}", *QUIET_CDS], path


def _sweep(directory: Path) -> None:
    """Delete the dumps of processes that are gone (their JVM wrote one but nobody installed it)."""
    for leftover in directory.glob("*.tmp"):
        try:
            os.kill(int(leftover.name.rsplit(".", 2)[-2]), 0)
        except ProcessLookupError:
            leftover.unlink(missing_ok=True)
        except (ValueError, PermissionError, IndexError):
            continue


def install_archive(dump: Path) -> bool:
    """Move a finished dump into place (atomically: concurrent runs may each have made one); whether it was."""
    target = dump.with_name(dump.name.split(".", 1)[0] + ".jsa")
    try:
        if dump.stat().st_size == 0:
            dump.unlink()
            return False
        os.replace(dump, target)
    except OSError:
        return False
    return True
