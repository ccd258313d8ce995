"""ksi under soak: ``python -m ksi serve`` as a child process on fixed ports, and its config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ksi.brokers import BrokerProcess, stop_process, wait_listening

__all__ = ["KsiProcess", "ksi_config"]

REPO_ROOT = Path(__file__).resolve().parents[2]


class KsiProcess:
    """``python -m ksi serve`` on fixed ports (so a restart keeps every client's addresses)."""

    def __init__(self, config_path: Path, log_path: Path, bootstrap_port: int) -> None:
        self.config_path, self.log_path, self.port = config_path, log_path, bootstrap_port
        self.process: subprocess.Popen[bytes] | None = None
        self.bootstrap = f"127.0.0.1:{bootstrap_port}"

    def start(self, timeout: float = 30) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "ksi", "serve", "--config", str(self.config_path)],
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            cwd=REPO_ROOT, env=env)
        problem = wait_listening(self.process, "127.0.0.1", self.port, timeout)
        if problem is not None:
            raise RuntimeError(f"ksi {problem}; see {self.log_path}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout: float = 20) -> int:
        if self.process is None:
            return 0
        stop_process(self.process, timeout)
        return self.process.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""


def ksi_config(bootstrap_port: int, base_port: int, metrics_port: int, broker: BrokerProcess,
               catalog_props: dict[str, str], topic: str, table: str, prefer_lake: bool) -> str:
    return f"""\
[proxy]
listen = "127.0.0.1:{bootstrap_port}"
advertised_host = "127.0.0.1"
broker_port_base = {base_port}

[upstream]
bootstrap_servers = "{broker.bootstrap}"
metadata_refresh_seconds = 2

[metrics]
listen = "127.0.0.1:{metrics_port}"

[catalog]
name = "lake"
uri = "{catalog_props['uri']}"
warehouse = "{catalog_props['warehouse']}"

[history]
window_rows = 8192

[[topics]]
name = "{topic}"
table = "{table}"
layout = "ksi"
prefer_lake = {"true" if prefer_lake else "false"}
"""
