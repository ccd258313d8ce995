"""One ``ksi dev`` for the session, as a user starts it (``python -m ksi dev``, free ports, a data directory of
its own), shared by tests/integration/test_dev.py and test_readme.py: the first start runs the demo's
archive, so it is paid for once.  A test may kill it and start it again on the same directory and ports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ksi.brokers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 300.0  # the first start runs the demo archive on a loaded 2-core machine


def ksi_env() -> dict[str, str]:
    """The environment ksi's processes get in the tests: this checkout's ksi first on the path."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONFAULTHANDLER": "1"}


@dataclass
class DevRun:
    data_dir: Path
    log_dir: Path
    port: int = field(default_factory=lambda: free_port(count=2))  # ksi dev listens on --port and --port + 1
    metrics_port: int = field(default_factory=free_port)
    registry_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    starts: int = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def registry_url(self) -> str:
        return f"http://127.0.0.1:{self.registry_port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "ksi.toml"

    def env(self) -> dict[str, str]:
        return ksi_env()

    def launch(self, *extra: str) -> subprocess.Popen[bytes]:
        """Start ksi dev without waiting for it."""
        self.starts += 1
        self.log_path = self.log_dir / f"dev-{self.starts}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ksi", "dev", "--data-dir", str(self.data_dir), "--port", str(self.port),
                 "--metrics-port", str(self.metrics_port), "--registry-port", str(self.registry_port), *extra],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=self.env())
        return self.process

    def start(self, *extra: str) -> str:
        """Start ksi dev and wait for "ksi dev is up"; returns its log so far."""
        process = self.launch(*extra)
        deadline = time.monotonic() + UP_TIMEOUT_S
        while "ksi dev is up" not in self.log() and time.monotonic() < deadline:
            assert process.poll() is None, self.log()[-4000:]
            time.sleep(0.5)
        text = self.log()
        assert "ksi dev is up" in text, text[-4000:]
        return text

    def processes(self) -> list[str]:
        """Every running process (but this one) whose command line or working directory refers to the data
        directory, as "pid: command line"."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                cwd = os.readlink(entry / "cwd")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state not in ("Z", "X") and (str(self.data_dir) in cmdline or Path(cwd).is_relative_to(self.data_dir)):
                found.append(f"{entry.name}: {cmdline[:200]}")
        return found

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def children(self) -> list[dict[str, object]]:
        """The processes ksi dev recorded in its state file."""
        state = json.loads((self.data_dir / "ksi-dev.json").read_text())
        return list(state["children"])

    def stop(self, sig: signal.Signals = signal.SIGINT, timeout: float = 60) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise AssertionError(f"ksi dev did not stop within {timeout} s of {sig.name}\n"
                                     f"{self.log()[-3000:]}") from None
        return self.process.returncode


@pytest.fixture(scope="session")
def ksi_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevRun]:
    run = DevRun(data_dir=tmp_path_factory.mktemp("ksi-dev") / "data", log_dir=tmp_path_factory.mktemp("ksi-dev-logs"))
    run.start()
    yield run
    code = run.stop()
    assert code == 0, run.log()[-3000:]
