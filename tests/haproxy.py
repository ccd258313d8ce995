"""HAProxy from Debian's package (``scripts/install-test-deps.sh`` installs it) as the TCP load balancer in
front of several ksi instances, for tests/integration/test_scaleout.py and bench/scaleout.py.

One frontend per route (the bootstrap, and one per broker), each balancing round robin over its servers
in TCP mode, with health checks (a TCP connect every ``check_ms``), ``option redispatch`` so that a
connection to a dead server is retried on another, and a stats socket for ``show stat``.  HAProxy runs in
the foreground (``-db``) in a process group of its own and is stopped with SIGTERM.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ksi.brokers import stop_process

__all__ = ["HAProxy", "Route", "find_haproxy"]

INSTALL_HINT = "run scripts/install-test-deps.sh (Debian: apt-get install haproxy)"


def find_haproxy() -> str:
    found = shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/bin/haproxy") if os.access(p, os.X_OK)), None)
    if found is None:
        raise FileNotFoundError(f"HAProxy is not installed: {INSTALL_HINT}")
    return found


@dataclass(frozen=True)
class Route:
    """A frontend on ``port`` balancing over ``servers`` (``(host, port)``, named ``<name>-<i>``)."""

    name: str
    port: int
    servers: tuple[tuple[str, int], ...]


class HAProxy:
    def __init__(self, routes: list[Route], workdir: Path, host: str = "127.0.0.1", check_ms: int = 500) -> None:
        self.routes, self.workdir, self.host, self.check_ms = routes, workdir, host, check_ms
        self.config_path = workdir / "haproxy.cfg"
        self.log_path = workdir / "haproxy.log"
        self.socket_path = workdir / "haproxy.sock"
        self.process: subprocess.Popen[bytes] | None = None

    def config(self) -> str:
        lines = [
            "global",
            "    maxconn 4096",
            f"    stats socket {self.socket_path} mode 600 level admin",
            "defaults",
            "    mode tcp",
            "    balance roundrobin",
            "    timeout connect 2s",
            "    timeout client 10m",
            "    timeout server 10m",
            "    retries 3",
            "    option redispatch",
            f"    default-server inter {self.check_ms}ms fastinter {self.check_ms}ms fall 1 rise 1",
        ]
        for route in self.routes:
            lines += ["", f"frontend {route.name}", f"    bind {self.host}:{route.port}",
                      f"    default_backend {route.name}-servers", "", f"backend {route.name}-servers"]
            lines += [f"    server {route.name}-{i} {host}:{port} check"
                      for i, (host, port) in enumerate(route.servers)]
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 20.0) -> None:
        binary = find_haproxy()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config(), encoding="utf-8")
        check = subprocess.run([binary, "-c", "-f", str(self.config_path)], capture_output=True, text=True,
                               check=False)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c rejected {self.config_path}:\n{check.stdout}{check.stderr}")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([binary, "-db", "-f", str(self.config_path)], stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        for route in self.routes:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"haproxy exited with {self.process.returncode}:\n{self.log_text()}")
                try:
                    socket.create_connection((self.host, route.port), timeout=0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(f"haproxy did not listen on {self.host}:{route.port}:\n"
                                           f"{self.log_text()}") from None
                    time.sleep(0.05)
        # servers count as down until their first health check passes: wait for that, so the first clients
        # are not turned away
        while not all(row["status"].startswith("UP")
                      for route in self.routes for row in self.servers(route.name).values()):
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"haproxy's servers did not all pass a health check in {timeout:g} s")
            time.sleep(0.05)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stats(self) -> list[dict[str, str]]:
        """``show stat``: one row per frontend, server and backend (``pxname``, ``svname``, ``scur`` sessions
        now, ``stot`` in all, ``status`` UP/DOWN, ...)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(b"show stat\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        text = b"".join(chunks).decode().lstrip("# ")
        return list(csv.DictReader(io.StringIO(text)))

    def servers(self, route: str) -> dict[str, dict[str, str]]:
        """Server name -> its ``show stat`` row, for one route (``route`` is its name)."""
        return {row["svname"]: row for row in self.stats()
                if row["pxname"] == f"{route}-servers" and row["svname"] not in ("BACKEND", "FRONTEND")}

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_process(process, 10, group=True)
