"""A PostgreSQL server from Debian's packages (scripts/install-spark-deps.sh installs them), for tests that
need a real catalog database: started on a free port in a directory of its own, and stoppable, freezable
and restartable for the outage tests."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ksi.brokers import free_port

__all__ = ["PostgresServer", "running_postgres"]


class PostgresServer:
    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin_dir, self.root, self.data = bin_dir, root, root / "data"
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses to run as root: run the server as Debian's postgres user
            self.as_user = ["runuser", "-u", "postgres", "--"]
            root.chmod(0o755)
            self.data.mkdir()
            shutil.chown(self.data, "postgres", "postgres")
        subprocess.run([*self.as_user, str(bin_dir / "initdb"), "-D", str(self.data), "-U", "ksi", "-A", "trust"],
                       check=True, capture_output=True)
        self.running = self.paused = False

    @property
    def uri(self) -> str:
        return f"postgresql+psycopg2://ksi@127.0.0.1:{self.port}/postgres"

    def _pids(self) -> list[int]:
        main = int((self.data / "postmaster.pid").read_text().split()[0])
        children = Path(f"/proc/{main}/task/{main}/children").read_text().split()
        return [main, *map(int, children)]

    def _signal(self, sig: signal.Signals) -> None:
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):  # a backend that just ended
                os.kill(pid, sig)

    def pause(self) -> None:
        """The server stops answering but keeps its sockets: connections are accepted by the kernel and then
        nothing comes back (a host that hangs, or a network that drops the answers)."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    def _ctl(self, *args: str, check: bool = True) -> None:
        subprocess.run([*self.as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), *args],
                       check=check, capture_output=True, timeout=60)

    def start(self) -> None:
        self._ctl("-l", str(self.data / "server.log"), "-w", "start",
                  "-o", f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1")
        self.running = True

    def stop(self) -> None:
        self._ctl("-m", "fast", "-w", "stop")  # clients' connections are closed: the catalog is gone
        self.running = False

    def kill(self) -> None:
        if self.paused:
            self.resume()
        self._ctl("-m", "immediate", "stop", check=False)
        self.running = False


@contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """A started server, removed with its data afterwards; the test fails if PostgreSQL is not installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.fail("PostgreSQL is not installed: run scripts/install-spark-deps.sh")
    # outside pytest's tmp dirs (mode 0700): the server may run as another user
    root = Path(tempfile.mkdtemp(prefix="ksi-pg-"))
    try:
        server = PostgresServer(Path(found[-1]).parent, root)
        server.start()
        try:
            yield server
        finally:
            if server.running:
                server.kill()
    finally:
        shutil.rmtree(root, ignore_errors=True)
