"""Archive tasks and the engines that run them: Spark, or local worker processes.

One task = one Kafka partition's offset range ``[start, stop)``: a consumer reads it
(:mod:`ksi.pipeline.reader`), Arrow writes it into Parquet data files of the topic's table (and of its
dead-letter table, for values that do not decode; :mod:`ksi.pipeline.files`), and the task returns a
:class:`TaskResult` describing the files.  Nothing is committed by a task: the driver commits every
task's files with the archived offsets in one snapshot (:mod:`ksi.pipeline.commit`).  A task imports
pyarrow, numpy and confluent-kafka, not PyIceberg.

Engines run a run's tasks in parallel and return their results in task order:

* :class:`SparkEngine` (``archive.engine = "spark"``, the default): one Spark task per range
  (``RDD.map`` over the ranges, results collected to the driver), on ``local[*]`` or a cluster.  Spark's
  Python daemon is :mod:`ksi.pipeline.daemon`, which imports this module before it forks the workers, and
  the workers are reused; the JVM only schedules (no Iceberg jar, no SQL: :mod:`ksi.pipeline.spark`).
* :class:`InlineEngine`: the tasks in the driver itself, for a run of at most ``archive.inline_max_records``
  records on a ``local[...]`` master: below that, starting a JVM and its Python workers costs more than
  the work (docs/pipeline.md has the measurements).  The progress line names it.
* :class:`LocalEngine` (``archive.engine = "local"``): a pool of worker processes on this machine
  (``forkserver`` with this module preloaded; the workers stay for the next round of a ``--follow``).
  No JVM at all: ``ksi dev``'s demo archive uses it, so ``make run`` needs no Java.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow.compute as pc

# imported here so that forked workers (forkserver preload, Spark's daemon) start with them loaded; the
# tasks need pyarrow, numpy and confluent-kafka, not PyIceberg (ksi.pipeline.files)
import pyarrow.parquet  # noqa: F401

from .files import DataFileWriter, NewFile, TableTarget, conform, new_prefix
from .reader import ERROR_COLUMN, ReadSpec, read_range
from .settings import runs_inline

with contextlib.suppress(ImportError):  # the executors' confluent-kafka; a task that needs it reports it missing
    import confluent_kafka  # noqa: F401

__all__ = [
    "ArchiveJob",
    "Engine",
    "InlineEngine",
    "LocalEngine",
    "SparkEngine",
    "SparkProgress",
    "TaskResult",
    "local_parallelism",
    "open_engine",
    "run_task",
    "warm",
]

Chunk = tuple[int, int, int]          # (partition, start, stop)
OnProgress = Callable[[int, int, int], None]   # (tasks done, tasks, records read so far)


@dataclass(frozen=True)
class ArchiveJob:
    """What every task of one run shares; pickled to the workers."""

    run_id: str
    read: ReadSpec
    table: TableTarget
    dead_letters: TableTarget | None = None


@dataclass
class TaskResult:
    partition: int
    start: int
    stop: int
    rows: int = 0
    kafka_bytes: int = 0
    files: list[NewFile] = field(default_factory=list)
    dead_letter_files: list[NewFile] = field(default_factory=list)
    dead_letters: int = 0
    seconds: float = 0.0


def run_task(job: ArchiveJob, chunk: Chunk) -> TaskResult:
    """Read ``chunk`` from Kafka and write it as data files (uncommitted)."""
    _use_system_allocator()
    partition, start, stop = chunk
    started = time.monotonic()
    result = TaskResult(partition, start, stop)
    writer = DataFileWriter(job.table, new_prefix(job.run_id, partition, start), partition)
    dead: DataFileWriter | None = None
    counter = [0]
    # The consumer's messages and their header tuples are millions of short-lived container objects with
    # no cycles; Python's cyclic collector would walk them over and over (measured: 3.2x slower tasks).
    collecting = gc.isenabled()
    gc.disable()
    try:
        for batch in read_range(job.read, partition, start, stop, counter):
            if ERROR_COLUMN in batch.schema.names:
                errors = batch.column(batch.schema.get_field_index(ERROR_COLUMN))
                if errors.null_count < len(errors):
                    assert job.dead_letters is not None
                    bad = batch.filter(pc.is_valid(errors))
                    bad = bad.rename_columns(["error" if n == ERROR_COLUMN else n for n in bad.schema.names])
                    if dead is None:
                        dead = DataFileWriter(job.dead_letters, new_prefix(job.run_id, partition, start), partition)
                    dead.write(conform(bad, dead.arrow_schema))
                    result.dead_letters += bad.num_rows
                batch = batch.drop_columns([ERROR_COLUMN])
            writer.write(conform(batch, writer.arrow_schema))
            result.rows += batch.num_rows
        result.files = writer.close()
        result.dead_letter_files = dead.close() if dead is not None else []
    except BaseException:
        writer.abort()
        if dead is not None:
            dead.abort()
        raise
    finally:
        if collecting:
            gc.enable()
    result.kafka_bytes = counter[0]
    result.seconds = time.monotonic() - started
    return result


def _use_system_allocator() -> None:
    """Arrow's buffers from the C library's allocator, which returns a written row group's memory to the
    system at once; Arrow's default (mimalloc) keeps it, ~70 MiB more per worker (measured)."""
    import pyarrow as pa

    if pa.default_memory_pool().backend_name != "system":
        pa.set_memory_pool(pa.system_memory_pool())


def _fork_context() -> Any:
    # forkserver, not fork: the driver has librdkafka and catalog threads, which a fork would copy mid-flight
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["ksi.pipeline.tasks"])
    return context


def warm(_: object = None) -> int:
    """A task that does nothing: it makes an engine start its worker processes."""
    return os.getpid()


def _worker_init() -> None:
    # Ctrl-C reaches the whole process group: the driver decides when to stop (after the round, in --follow)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A worker dies with its driver, even after kill -9.  Its parent is the fork server, not the driver, and
    # the fork server exits only once every worker has closed its copy of the server's liveness pipe, so
    # the kernel's parent-death signal (PR_SET_PDEATHSIG) would never fire: the workers, the fork server and
    # the resource tracker would all outlive the driver.  The driver's sentinel pipe ends when it does.
    driver = multiprocessing.parent_process()
    if driver is not None:
        threading.Thread(target=_exit_with, args=(driver.sentinel,), name="ksi-driver-watch", daemon=True).start()


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


class Engine(Protocol):
    name: str
    parallelism: int

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], on_progress: OnProgress | None = None,
            rows: Callable[[Any], int] | None = None) -> list[Any]:
        """``fn`` over ``items`` as parallel tasks (``fn`` and the items are pickled to wherever they run); the
        results in item order.  ``on_progress(done, total, rows)``, with ``rows(result)`` summed (-1: unknown)."""
        ...

    def run(self, job: ArchiveJob, chunks: Sequence[Chunk], on_progress: OnProgress | None = None
            ) -> list[TaskResult]: ...

    def close(self) -> None: ...


def _task_rows(result: TaskResult) -> int:
    return result.rows


def local_parallelism(master: str) -> int:
    """Worker processes for a ``local``, ``local[N]`` or ``local[*]`` master."""
    inside = master[len("local"):].strip("[]").split(",")[0] if master.startswith("local") else ""
    if inside in ("", "*"):
        return os.cpu_count() or 1
    try:
        return max(1, int(inside))
    except ValueError:
        return os.cpu_count() or 1


class LocalEngine:
    """Tasks in a pool of worker processes (see the module docstring)."""

    name = "local"

    def __init__(self, parallelism: int) -> None:
        self.parallelism = max(1, parallelism)
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        pool = ProcessPoolExecutor(self.parallelism, mp_context=_fork_context(), initializer=_worker_init)
        for _ in range(self.parallelism):  # start the workers now, not at the first task
            pool.submit(warm)
        return pool

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], on_progress: OnProgress | None = None,
            rows: Callable[[Any], int] | None = None) -> list[Any]:
        futures: list[Future[Any]] = []
        try:
            futures = [self._pool.submit(fn, item) for item in items]
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=1.0, return_when=FIRST_EXCEPTION)
                for future in done:
                    error = future.exception()
                    if error is not None:
                        raise error
                if on_progress is not None:
                    finished = [f.result() for f in futures if f.done()]
                    on_progress(len(finished), len(futures), sum(map(rows, finished)) if rows else -1)
        except BrokenProcessPool:
            # a worker died (killed, out of memory): this run fails, the next one (--follow) gets new workers
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._start()
            raise
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        return [f.result() for f in futures]

    def run(self, job: ArchiveJob, chunks: Sequence[Chunk], on_progress: OnProgress | None = None
            ) -> list[TaskResult]:
        return self.map(functools.partial(run_task, job), chunks, on_progress, _task_rows)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class InlineEngine:
    """The tasks one after another in this process: for a small run on one machine, where starting Spark (or
    the local worker processes) would cost more than the work saves by running in parallel; the driver has
    imported everything a task needs while planning."""

    name = "inline"
    parallelism = 1

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], on_progress: OnProgress | None = None,
            rows: Callable[[Any], int] | None = None) -> list[Any]:
        results: list[Any] = []
        for item in items:
            results.append(fn(item))
            if on_progress is not None:
                on_progress(len(results), len(items), sum(map(rows, results)) if rows else -1)
        return results

    def run(self, job: ArchiveJob, chunks: Sequence[Chunk], on_progress: OnProgress | None = None
            ) -> list[TaskResult]:
        return self.map(functools.partial(run_task, job), chunks, on_progress, _task_rows)

    def close(self) -> None:
        pass


class SparkEngine:
    """One Spark task per range on a SparkContext (see the module docstring)."""

    name = "spark"

    def __init__(self, spark: Any, owner: Any = None) -> None:
        """``spark``: a SparkContext or a SparkSession; ``owner``: the :class:`ksi.pipeline.spark.SparkStart`
        that started it, stopped by :meth:`close` (None: the caller's, left running)."""
        self.context = spark.sparkContext if hasattr(spark, "sparkContext") else spark
        self._owner = owner
        self.parallelism = max(1, int(self.context.defaultParallelism))

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], on_progress: OnProgress | None = None,
            rows: Callable[[Any], int] | None = None) -> list[Any]:
        context = self.context
        group = f"ksi-{uuid.uuid4().hex}"
        context.setJobGroup(group, f"ksi: {getattr(getattr(fn, 'func', fn), '__name__', 'tasks')}")
        try:
            with SparkProgress(context, group, on_progress):
                blobs = (context.parallelize(list(items), numSlices=max(1, len(items)))
                         .map(lambda item: pickle.dumps(fn(item)))
                         .collect())
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)
        return [pickle.loads(blob) for blob in blobs]

    def run(self, job: ArchiveJob, chunks: Sequence[Chunk], on_progress: OnProgress | None = None
            ) -> list[TaskResult]:
        return self.map(functools.partial(run_task, job), chunks, on_progress)

    def close(self) -> None:
        if self._owner is not None:
            self._owner.stop()


class SparkProgress:
    """Reports a running Spark job group's task progress every second from a daemon thread."""

    def __init__(self, context: Any, group: str, on_progress: OnProgress | None) -> None:
        self.context, self.group, self.on_progress = context, group, on_progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"progress-{group}", daemon=True)

    def __enter__(self) -> SparkProgress:
        if self.on_progress is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _run(self) -> None:
        assert self.on_progress is not None
        tracker = self.context.statusTracker()
        while not self._stop.wait(1.0):
            try:
                done = total = 0
                for job_id in tracker.getJobIdsForGroup(self.group):
                    job = tracker.getJobInfo(job_id)
                    for stage_id in job.stageIds if job else ():
                        stage = tracker.getStageInfo(stage_id)
                        if stage is not None:
                            done += stage.numCompletedTasks
                            total += stage.numTasks
            except Exception:  # noqa: BLE001 - the session is shutting down
                return
            if total:
                self.on_progress(done, total, -1)


def open_engine(pipeline: Any, records: int | None = None, start: Any = None) -> Engine:
    """The engine ``archive.engine`` names for this pipeline: Spark (``spark``, the default) or local worker
    processes (``local``).  On a ``local[...]`` master a run of at most ``archive.inline_max_records`` records
    (``records``; None: unknown, e.g. ``--follow``) runs in this process instead (:class:`InlineEngine`: no
    JVM, no worker processes).  ``start``: a :class:`ksi.pipeline.spark.SparkStart` begun before planning,
    used or cancelled here."""
    settings = pipeline.archive
    master = pipeline.spark.master
    small = records is not None and records <= settings.inline_max_records
    if settings.engine == "local":
        if start is not None:
            start.cancel()
        parallelism = local_parallelism(master)
        if parallelism == 1 or small:
            return InlineEngine()
        return LocalEngine(parallelism)
    if runs_inline(pipeline, records):
        if start is not None:
            start.cancel()
        return InlineEngine()
    if start is not None:
        return SparkEngine(start.context(), start)
    from .spark import get_context

    context, owner = get_context(pipeline.spark)
    return SparkEngine(context, owner)
