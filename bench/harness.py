"""What every ksi benchmark needs: ksi as a child process (config, CPU, RSS, py-spy), the machine's name,
alternating rounds, percentiles, a process tree's memory and a py-spy profile summary.  Every benchmark
uses it.

CPU is utime + stime of the ksi process, all threads, from /proc/PID/stat; memory is /proc/PID/status.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ksi.brokers import free_port, stop_process, wait_listening

__all__ = [
    "KsiProcess", "find_py_spy", "machine", "memory", "percentile", "rounds", "summarise_profile", "toml_value", "tree",
]

# librdkafka's receive buffer: noida ignores fetch size limits, so a fetch answer can be far larger than
# fetch.max.bytes.  ksi gets the same limit as its max_frame_bytes.
MAX_FRAME_BYTES = 512 * 1024 * 1024


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


PLACEMENTS = {
    "shared": "every process on every CPU (the default)",
    "ksi-own-cpu": "ksi alone on the last CPU, the broker and the clients on the others (a proxy on a host of "
                   "its own)",
    "beside-broker": "the clients on the first CPUs, the broker and ksi on the last (ksi on the broker's host)",
}


def placement(name: str) -> tuple[set[int] | None, set[int] | None, set[int] | None]:
    """The CPUs of the clients, the broker and ksi for a ``--placement`` (None: unpinned)."""
    if name == "shared":
        return None, None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise ValueError(f"needs at least 2 CPUs, this process may use {cpus}")
    first, last = set(cpus[:-1]), {cpus[-1]}
    return (first, first, last) if name == "ksi-own-cpu" else (first, last, last)


def add_placement_option(parser: argparse.ArgumentParser) -> None:
    """``--placement``, for :func:`placement_of`."""
    parser.add_argument("--placement", choices=tuple(PLACEMENTS), default="shared",
                        help="which CPUs the processes run on, the same in every path (os.sched_setaffinity): "
                             + "; ".join(f"{name}: {what}" for name, what in PLACEMENTS.items()))


def placement_of(parser: argparse.ArgumentParser, args: argparse.Namespace) \
        -> tuple[set[int] | None, set[int] | None, set[int] | None]:
    """:func:`placement` of ``--placement``, or the parser's error naming the CPUs this process may use."""
    try:
        return placement(args.placement)
    except ValueError as exc:
        parser.error(f"--placement {args.placement}: {exc}")


def pin(cpus: set[int] | None) -> None:
    """This process, and every process it starts from now on, on ``cpus`` (None: left as it is)."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


class KsiProcess:
    """``python -m ksi serve`` with optional catalog and topics; CPU, RSS and an optional py-spy."""

    def __init__(self, workdir: Path, name: str, upstream: str, *, catalog: dict[str, str] | None = None,
                 topics: list[dict[str, Any]] | None = None, proxy: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, metrics: bool = True,
                 history: dict[str, Any] | None = None, cpus: set[int] | None = None) -> None:
        self.name = name
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{free_port()}/metrics" if metrics else None
        sections: dict[str, dict[str, Any]] = {
            "proxy": {"listen": self.bootstrap, "advertised_host": "127.0.0.1", "broker_port_base": free_port(),
                      "max_frame_bytes": MAX_FRAME_BYTES, "log_level": "warning", **(proxy or {})},
            "upstream": {"bootstrap_servers": [upstream]},
        }
        if self.metrics_url is not None:
            sections["metrics"] = {"listen": self.metrics_url.split("/")[2]}
        if catalog is not None:
            sections["catalog"] = {"name": "lake", **catalog}
        if history:
            sections["history"] = dict(history)
        lines = []
        for section, body in sections.items():
            lines.append(f"[{section}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in body.items()]
            lines.append("")
        for topic in topics or []:
            lines.append("[[topics]]")
            lines += [f"{k} = {toml_value(v)}" for k, v in topic.items()]
            lines.append("")
        self.config_path = workdir / f"ksi-{name}.toml"
        self.config_path.write_text("\n".join(lines))
        self.log_path = workdir / f"ksi-{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            # ``cpus``: ksi and every thread it starts run on those CPUs only (util-linux's taskset execs it)
            ([] if cpus is None else ["taskset", "-c", ",".join(map(str, sorted(cpus)))])
            + [sys.executable, "-m", "ksi", "serve", "--config", str(self.config_path)],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
        )
        self._spy: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._wait_listening(60.0)

    def _wait_listening(self, timeout: float) -> None:
        problem = wait_listening(self.process, "127.0.0.1", self.port, timeout)
        if problem is not None:
            raise SystemExit(f"ksi ({self.name}) {problem}\n{self.log_tail()}")

    def cpu_seconds(self) -> float:
        """utime + stime of the ksi process, all threads (fields 14 and 15 of /proc/PID/stat)."""
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_kib(self, key: str) -> int:
        """A line of /proc/PID/status in KiB: VmRSS (now) or VmHWM (peak resident set)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def peak_mib(self) -> float:
        """Peak resident memory of ksi and every process it started (VmHWM each, summed), in MiB."""
        total = 0
        for pid in tree(self.process.pid):
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
            except OSError:
                continue
        return total / 1024

    def _metrics_text(self) -> str:
        """ksi's /metrics as it is now."""
        import urllib.request

        assert self.metrics_url is not None, "ksi started without metrics"
        with urllib.request.urlopen(self.metrics_url, timeout=5) as answer:
            return str(answer.read().decode())

    def _samples(self) -> Iterator[tuple[str, str]]:
        """Each sample line of ksi's /metrics as (name with its labels, value); none without metrics."""
        if self.metrics_url is None:
            return
        for line in self._metrics_text().splitlines():
            name, _, value = line.partition(" ")
            yield name, value

    def metrics(self, names: tuple[str, ...]) -> dict[str, float]:
        """The current values of some unlabelled gauges from ksi's /metrics (missing ones left out)."""
        return {name: float(value) for name, value in self._samples() if name in names}

    def totals(self, names: tuple[str, ...]) -> dict[str, float]:
        """Counters from ksi's /metrics summed over their labels (missing ones are 0)."""
        found = dict.fromkeys(names, 0.0)
        for name, value in self._samples():
            base = name.split("{", 1)[0]
            if base in found:
                found[base] += float(value)
        return found

    def lake_planned(self, topic: str, partitions: int, timeout: float = 120.0) -> float:
        """Wait until ksi has planned ``topic``'s table (its start-up work: imports, the catalog, the plan),
        seen as every partition's ``ksi_lake_next_offset`` gauge on /metrics; the seconds it took.  For a
        topic the broker serves whole, when the lake's low watermark cannot tell (:func:`reads.lake_ready`)."""
        started = time.perf_counter()
        while True:
            lines = [line for line in self._metrics_text().splitlines()
                     if line.startswith("ksi_lake_next_offset{") and f'topic="{topic}"' in line]
            if all(any(f'partition="{p}"' in line for line in lines) for p in range(partitions)):
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                raise SystemExit(f"ksi ({self.name}) did not plan {topic} within {timeout:.0f} s\n{self.log_tail()}")
            time.sleep(0.05)

    def watch_metrics(self, names: tuple[str, ...], every: float = 0.25) -> dict[str, float]:
        """Start polling gauges in the background; the dict returned holds each one's peak so far (until
        :meth:`stop`)."""
        import threading

        peaks: dict[str, float] = {}

        def poll() -> None:
            while self.process.poll() is None and not self._stopping:
                try:
                    for name, value in self.metrics(names).items():
                        peaks[name] = max(peaks.get(name, value), value)
                except OSError:
                    pass
                time.sleep(every)

        threading.Thread(target=poll, daemon=True).start()
        return peaks

    def start_profile(self, py_spy: str, output: Path, rate: int = 200, gil: bool = False) -> None:
        """py-spy on ksi until :meth:`stop_profile`; ``gil``: only the thread holding the GIL is sampled, so
        the samples over ``rate`` are the seconds the GIL was held."""
        self._spy = subprocess.Popen([py_spy, "record", "--pid", str(self.process.pid), "--format", "raw",
                                      "--rate", str(rate), "--output", str(output), "--threads",
                                      *(["--gil"] if gil else [])],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # let it attach

    def stop_profile(self) -> None:
        spy, self._spy = self._spy, None
        if spy is None:
            return
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last lines of {self.log_path} ---\n" + "\n".join(text)

    def tracebacks(self) -> bool:
        return "Traceback" in self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self._stopping = True
        self.stop_profile()
        stop_process(self.process, 30)
        self._log.close()


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def memory(pids: list[int]) -> tuple[int, int]:
    """(RSS, PSS) bytes summed over ``pids``."""
    rss = pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss, pss


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{model}, {os.cpu_count()} cores{mem}, Linux {platform.release()}"


def find_py_spy(wanted: str | None) -> str | None:
    if wanted is None:
        return None
    if wanted != "auto":
        return wanted
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if not found:
        raise SystemExit("--profile needs py-spy (pip install py-spy), or --py-spy PATH")
    return found


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; NaN when there are none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def rounds(paths: list[str], repeats: int) -> list[str]:
    """direct, ksi, ksi, direct, direct, ksi, ...: each path goes first equally often."""
    order: list[str] = []
    for r in range(repeats):
        order += paths if r % 2 == 0 else paths[::-1]
    return order


# -- py-spy profiles -----------------------------------------------------------------------------------

# Leaf frames where a thread waits (py-spy does not always see these as idle): not work.
IDLE_LEAVES = ("_worker (concurrent/futures/thread.py:81)", "WorkerThread._work (trio/_core/_thread_cache.py:211)",
               "EpollIOManager.get_events", "_PollLikeSelector.select", "Condition.wait", "socket.accept",
               "BaseServer.serve_forever", "Event.wait", "Thread.join")
# Frames every stack has (thread start-up, the event loop's own frames, worker plumbing): not informative.
PLUMBING = ("threading.py", "<frozen runpy>", "trio/_core/_run.py", "trio/_threads.py", "trio/_core/_thread_cache.py",
            "outcome/_impl.py", "ksi/__main__.py", "ksi/cli.py", "concurrent/futures/thread.py")


def summarise_profile(path: Path, top: int = 22, rate: int = 200) -> list[str]:
    """py-spy's raw (collapsed) stacks: the frames with the most busy samples, inclusive and self."""
    if not path.exists():
        return [f"(no profile at {path})"]
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = idle = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";")]
        if len(frames) < 2 or frames[-1].startswith(IDLE_LEAVES):
            idle += count
            continue
        total += count
        threads[_role(frames)] += count
        for frame in dict.fromkeys(frames[1:]):
            if not any(marker in frame for marker in PLUMBING):
                inclusive[frame] += count
        own[frames[-1]] += count
    if not total:
        return ["(no busy samples)"]
    out = [f"{total} busy samples at {rate}/s (= {total / rate:.1f} thread-seconds; {idle} waiting samples left out);"
           " by thread: " + ", ".join(f"{t} {c / total:.0%}" for t, c in threads.most_common(5))]
    out.append("inclusive (% of busy samples with the frame on the stack):")
    out += [f"  {c / total:6.1%}  {f}" for f, c in inclusive.most_common(top)]
    out.append("self (% of busy samples with the frame on top):")
    out += [f"  {c / total:6.1%}  {f}" for f, c in own.most_common(top)]
    return out


def _role(frames: list[str]) -> str:
    """What a sampled thread was (py-spy's thread names are stale: trio renames its workers per job)."""
    text = ";".join(frames)
    if "unrolled_run" in text:
        return "event loop"
    if "to_thread_run_sync" in text:
        return "trio worker threads"
    if "concurrent/futures/thread.py" in text:
        return "PyIceberg/pyarrow thread pool"
    if "socketserver.py" in text:
        return "metrics HTTP"
    return "other"


def _short(frame: str) -> str:
    """``func (path/to/site-packages/pkg/mod.py:123)`` -> ``func (pkg/mod.py:123)``."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", "/work/main/", "/work/wt/", "lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where})" if where else name
