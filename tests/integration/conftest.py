"""Fixtures for tests against real brokers and a real ``ksi serve`` process.

* ``tansu``, ``noida`` (session): one broker process each, started by :mod:`ksi.brokers`.
* ``broker``: parametrized over both.
* ``ksi_proxy``: a factory, ``ksi_proxy(broker, **sections) -> Proxy``, that writes a config to
  ``tmp_path``, runs ``python -m ksi serve --config PATH`` and waits for its bootstrap port.  Keyword
  arguments are merged into the config's sections (``ksi_proxy(b, proxy={"log_level": "debug"})``;
  ``topics=[...]`` and ``catalog={...}`` add those sections).  At teardown every proxy is stopped with
  SIGTERM, and the test fails if one exited non-zero or logged a Python traceback.

Dev aid only: ``KSI_TEST_DIRECT=1`` makes ``ksi_proxy`` hand back the broker's own bootstrap instead of
starting ksi, to check the tests themselves against the bare broker.  CI never sets it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dev_run import ksi_dev  # noqa: F401  (one `ksi dev` for the session: test_dev.py, test_readme.py)
from ksi.brokers import BrokerProcess, free_port, start_noida, start_tansu, stop_process, wait_listening

REPO_ROOT = Path(__file__).resolve().parents[2]
PROXY_READY_TIMEOUT_S = 20.0
PROXY_STOP_TIMEOUT_S = 20.0
DIRECT = os.environ.get("KSI_TEST_DIRECT") == "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


def pytest_report_header() -> list[str]:
    if DIRECT:
        return ["KSI_TEST_DIRECT=1: clients talk to the brokers directly, NOT through ksi (dev aid)"]
    return []


# -- brokers ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = start_tansu(log_path=tmp_path_factory.mktemp("tansu") / "tansu.log")
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def noida(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("noida")
    broker = start_noida(data, log_path=data / "noida.log")
    yield broker
    broker.stop()


@pytest.fixture(params=["tansu", "noida"])
def broker(request: pytest.FixtureRequest) -> BrokerProcess:
    running: BrokerProcess = request.getfixturevalue(request.param)
    return running


# -- the proxy --------------------------------------------------------------------------------------


@dataclass
class Proxy:
    """A running ``ksi serve`` (or, with KSI_TEST_DIRECT=1, just the broker's address)."""

    broker: BrokerProcess
    bootstrap: str
    metrics_url: str | None = None
    config_path: Path | None = None
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def stop(self, timeout: float = PROXY_STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait (SIGKILL after ``timeout``), return the exit code.  Idempotent."""
        if self.process is None:
            return 0
        if not stop_process(self.process, timeout):
            raise AssertionError(f"ksi did not stop within {timeout} s of SIGTERM\n{self.log_tail()}")
        return self.process.returncode

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``, from ksi's /metrics (parsed by
        prometheus_client's own text parser); 0 when there are none."""
        from prometheus_client.parser import text_string_to_metric_families

        assert self.metrics_url is not None, "this proxy has no metrics listener"
        with urllib.request.urlopen(self.metrics_url, timeout=5) as answer:
            text = answer.read().decode()
        return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                   if sample.name == name and labels.items() <= sample.labels.items())

    def log_text(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        tail = "\n".join(self.log_text().splitlines()[-lines:])
        return f"--- last {lines} lines of {self.log_path} ---\n{tail}"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML: {value!r}")


def _toml_key(key: Any) -> str:
    text = str(key)
    return text if text.replace("_", "").replace("-", "").isalnum() else _toml_value(text)


def to_toml(config: dict[str, Any]) -> str:
    """Enough TOML for ksi's config: tables of plain values, and arrays of tables (``topics``)."""
    lines: list[str] = []
    for section, body in config.items():
        if isinstance(body, list):
            for entry in body:
                lines.append(f"[[{section}]]")
                lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in entry.items()]
                lines.append("")
        else:
            lines.append(f"[{section}]")
            lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in body.items()]
            lines.append("")
    return "\n".join(lines)


def _wait_for_port(proxy: Proxy, host: str, port: int, timeout: float) -> None:
    assert proxy.process is not None
    problem = wait_listening(proxy.process, host, port, timeout)
    if problem is not None:
        proxy.stop()
        raise AssertionError(f"ksi {problem}\n{proxy.log_tail()}")
        time.sleep(0.05)


@pytest.fixture
def ksi_proxy(tmp_path: Path) -> Iterator[Callable[..., Proxy]]:
    started: list[Proxy] = []

    def start(broker: BrokerProcess, **sections: Any) -> Proxy:
        if DIRECT:
            proxy = Proxy(broker=broker, bootstrap=broker.bootstrap)
            started.append(proxy)
            return proxy
        index = len(started)
        listen_port, base_port, metrics_port = free_port(), free_port(), free_port()
        config: dict[str, Any] = {
            "proxy": {
                "listen": f"127.0.0.1:{listen_port}",
                "advertised_host": "127.0.0.1",
                "broker_port_base": base_port,
            },
            "upstream": {"bootstrap_servers": broker.bootstrap},
            "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
        }
        for name, value in sections.items():
            if isinstance(value, dict) and isinstance(config.get(name), dict):
                config[name] = {**config[name], **value}
            else:
                config[name] = value
        config_path = tmp_path / f"ksi-{index}.toml"
        config_path.write_text(to_toml(config), encoding="utf-8")
        log_path = tmp_path / f"ksi-{index}.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
                   PYTHONUNBUFFERED="1")
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "ksi", "serve", "--config", str(config_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env,
            )
        proxy = Proxy(
            broker=broker,
            bootstrap=f"127.0.0.1:{listen_port}",
            metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
            config_path=config_path,
            log_path=log_path,
            process=process,
        )
        started.append(proxy)
        _wait_for_port(proxy, "127.0.0.1", listen_port, PROXY_READY_TIMEOUT_S)
        return proxy

    yield start

    problems = []
    for proxy in started:
        if proxy.process is None:
            continue
        try:
            code = proxy.stop()
        except AssertionError as exc:
            problems.append(str(exc))
            continue
        if code != 0:
            problems.append(f"ksi exited with code {code}\n{proxy.log_tail()}")
        elif "Traceback" in proxy.log_text():
            problems.append(f"ksi logged a traceback\n{proxy.log_tail(120)}")
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture
def catalog(tmp_path: Path) -> tuple[Any, dict[str, str]]:
    """An empty Iceberg catalog (PyIceberg's SqlCatalog on SQLite) with a `history` namespace."""
    from pyiceberg.catalog.sql import SqlCatalog

    (tmp_path / "warehouse").mkdir()
    props = {"uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": f"file://{tmp_path / 'warehouse'}"}
    catalog = SqlCatalog("lake", **props)
    catalog.create_namespace("history")
    return catalog, props
