"""A small run's Kafka read, begun before the planning's imports: ``ksi archive``'s early read.

A run small enough for the driver (:class:`ksi.pipeline.tasks.InlineEngine`) spends most of its time before it
reads a record: importing PyIceberg, SQLAlchemy and pyarrow, and opening the catalog (~0.6 s of one core,
py-spy), then reading (~0.5 s per 200k records, most of it confluent-kafka's message objects and the lists
Arrow's columns are built from).  Neither needs the other when the run's offsets are known before those
imports, which :mod:`ksi.pipeline.quickplan` tells for a SQLite catalog with local metadata (the broker's
watermarks, and the archived offsets from the table's current metadata file).  So the read starts at once
in a child process (``python -m ksi.pipeline.early DIR``, the ranges as JSON on its stdin), on the other
core, while the driver imports and plans.

The child reads each range with :func:`ksi.pipeline.reader.read_raw` (the same read as a task's, aborted
transactions included) into an Arrow IPC file in ``DIR``, a directory of the driver's own, and prints one
JSON line per range done (or failed).  A task of the driver's (:func:`ksi.pipeline.tasks.run_task`) takes a
range's file when its own range starts where the early one does: it decodes the values and writes data
files from it as from a read of its own, and reads from Kafka only what its range has past the early
range's end (records produced since).  Anything else (the plan moved, the child failed or was slow to
start) is read as without it: the early read can save time, never change what a run commits.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import IO, Any

__all__ = ["EarlyBatches", "EarlyRead", "main"]

DIR_PREFIX = "ksi-archive-early-"


@dataclass
class EarlyBatches:
    """What the child read of one range: its raw batches (``ksi.pipeline.reader.RAW_SCHEMA``), covering every
    record of ``[start, stop)``, and their key, value and header bytes."""

    start: int
    stop: int
    batches: list[Any]
    kafka_bytes: int


class EarlyRead:
    """The child process reading ``ranges`` (topic -> ``[(partition, start, stop), ...]``) as ``spec`` (a
    :class:`ksi.pipeline.reader.ReadSpec`'s bootstrap, consumer settings and poll timeout) says."""

    def __init__(self, bootstrap: str, consumer: dict[str, str], poll_timeout_seconds: float,
                 ranges: dict[str, list[tuple[int, int, int]]]) -> None:
        from ..brokers import set_parent_death_signal
        from .spark import _scratch_dir

        self.directory = _scratch_dir(DIR_PREFIX)
        payload = {"bootstrap": bootstrap, "consumer": consumer, "poll_timeout_seconds": poll_timeout_seconds,
                   "ranges": {topic: [list(r) for r in rs] for topic, rs in ranges.items()}}
        self._index = {(topic, p, start): i for i, (topic, (p, start, _)) in
                       enumerate((topic, r) for topic, rs in ranges.items() for r in rs)}
        self._done: dict[tuple[str, int, int], dict[str, Any]] = {}
        self._mine: set[int] = set()  # the ranges this process claimed
        self.process: subprocess.Popen[str] | None = subprocess.Popen(
            [sys.executable, "-m", "ksi.pipeline.early", self.directory], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            preexec_fn=set_parent_death_signal)  # noqa: PLW1509 - prctl() only, as ksi.brokers
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.write(json.dumps(payload))
            self.process.stdin.close()

    def take(self, topic: str, partition: int, start: int) -> EarlyBatches | None:
        """The early read of ``topic``/``partition`` from ``start`` (waiting for the child to finish it), or None
        when there is none: another start, a range the child has not begun (it is the caller's now: the child
        skips it, see :func:`claim`), or the child failed."""
        import pyarrow as pa

        key = (topic, partition, start)
        index = self._index.get(key)
        if index is None or index in self._mine:
            return None
        if claim(self.directory, index):
            self._mine.add(index)
            return None
        while key not in self._done and self.process is not None:
            assert self.process.stdout is not None
            line = self.process.stdout.readline()
            if not line:
                self._stop()
                break
            with contextlib.suppress(ValueError, KeyError, TypeError):
                done = json.loads(line)
                self._done[(done["topic"], done["partition"], done["start"])] = done
        done = self._done.pop(key, None)
        if done is None or "error" in done:
            return None
        path = done["path"]
        try:
            with pa.memory_map(path) as source:  # the batches keep the mapping, not a copy
                reader = pa.ipc.open_file(source)
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        except (OSError, pa.ArrowInvalid):
            return None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return EarlyBatches(start, done["stop"], batches, done["bytes"])

    def _stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait()
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.process = None

    def close(self) -> None:
        """Stop the child (if still reading) and delete what it wrote."""
        self._stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def claim(directory: str, index: int) -> bool:
    """Whether this process is the first to claim range ``index`` (the child before it reads it, a task of the
    driver's when it reaches it): the one that claims it reads it.  So the driver's tasks, which take the
    ranges in the reverse order once the driver has planned (:class:`ksi.pipeline.tasks.InlineEngine`), read
    what the child has not reached, and the two share the work instead of one waiting for the other."""
    try:
        os.close(os.open(os.path.join(directory, f"{index}.claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _read(directory: str, payload: dict[str, Any], out: IO[str]) -> None:
    import pyarrow as pa

    from .reader import RAW_SCHEMA, ReadSpec, read_raw

    gc.disable()  # millions of short-lived message objects without cycles (as ksi.pipeline.tasks.run_task)
    count = 0
    for topic, ranges in payload["ranges"].items():
        spec = ReadSpec(bootstrap=payload["bootstrap"], topic=topic, output_schema=RAW_SCHEMA,
                        consumer=payload["consumer"], poll_timeout_seconds=payload["poll_timeout_seconds"])
        for partition, start, stop in ranges:
            index, count = count, count + 1
            path = os.path.join(directory, f"{index}.arrow")
            done: dict[str, Any] = {"topic": topic, "partition": partition, "start": start, "stop": stop}
            counter = [0]
            if not claim(directory, index):  # the driver reads it
                continue
            try:
                with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, RAW_SCHEMA) as writer:
                    for batch in read_raw(spec, partition, start, stop, counter):
                        writer.write_batch(batch)
                done.update(path=path, bytes=counter[0])
            except Exception as exc:  # noqa: BLE001 - the driver's own read of the range reports it
                done["error"] = f"{type(exc).__name__}: {exc}"
            out.write(json.dumps(done) + "\n")
            out.flush()


def main(argv: list[str]) -> int:
    """``python -m ksi.pipeline.early DIR``: the child (see the module docstring)."""
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        print("usage: python -m ksi.pipeline.early DIR  (ranges as JSON on stdin; started by ksi archive)",
              file=sys.stderr)
        return 2
    _read(argv[0], json.load(sys.stdin), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
