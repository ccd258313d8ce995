"""Fixtures for the PySpark pipeline's tests: real Spark (local mode, one session for the whole run), a real
broker (noida-db: DeleteRecords really moves the log start), the embedded Schema Registry and a SQLite
Iceberg catalog shared by Spark (Iceberg's JDBC catalog) and PyIceberg (SqlCatalog).

* ``noida``, ``registry``, ``lake``, ``spark`` (session scope).
* ``make_config(topic, table, **sections) -> (PipelineConfig, Path)``: a config for one topic on those, also
  written as TOML for subprocesses.
* ``start_proxy(config_path) -> Proxy``: a real ``python -m ksi serve`` on that config, stopped at teardown.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ksi.brokers import BrokerProcess, free_port, start_noida
from ksi.config import CatalogConfig, parse_config
from ksi.pipeline.settings import PipelineConfig, SparkSettings, parse_pipeline_sections

REPO_ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("spark", "archive", "compact")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def noida(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("pipeline-noida")
    broker = start_noida(data, log_path=data / "noida.log")
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from ksi.registry import start_registry

    server = start_registry("127.0.0.1", 0, tmp_path_factory.mktemp("pipeline-registry"))
    yield server
    server.stop()


@dataclass
class Lake:
    catalog: Any
    properties: dict[str, str]

    def table(self, name: str) -> Any:
        return self.catalog.load_table(name)


@pytest.fixture(scope="session")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    from pyiceberg.catalog.sql import SqlCatalog

    root = tmp_path_factory.mktemp("pipeline-lake")
    (root / "warehouse").mkdir()
    props = {"uri": f"sqlite:///{root / 'catalog.db'}", "warehouse": f"file://{root / 'warehouse'}"}
    catalog = SqlCatalog("lake", **props)
    catalog.create_namespace("history")
    return Lake(catalog, props)


@pytest.fixture(scope="session")
def spark(lake: Lake) -> Iterator[Any]:
    from ksi.pipeline.spark import get_spark

    session = get_spark(SparkSettings(master="local[2]", conf={"spark.sql.shuffle.partitions": "4"}),
                        CatalogConfig("lake", lake.properties))
    yield session
    session.stop()


def to_toml(config: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f'"{k}" = {value(x)}' for k, x in v.items()) + " }"
        raise TypeError(v)

    lines: list[str] = []
    for section, body in config.items():
        if isinstance(body, list):
            for entry in body:
                lines += [f"[[{section}]]", *(f"{k} = {value(v)}" for k, v in entry.items()), ""]
        else:
            lines += [f"[{section}]", *(f'"{k}" = {value(v)}' if "." in k else f"{k} = {value(v)}"
                                        for k, v in body.items()), ""]
    return "\n".join(lines)


@pytest.fixture
def make_config(noida: BrokerProcess, lake: Lake, tmp_path: Path) -> Callable[..., tuple[PipelineConfig, Path]]:
    def make(topic: str, table: str, catalog: dict[str, str] | None = None, **sections: Any
             ) -> tuple[PipelineConfig, Path]:
        raw: dict[str, Any] = {
            "upstream": {"bootstrap_servers": noida.bootstrap},
            "catalog": catalog or {"name": "lake", **lake.properties},
            "topics": [{"name": topic, "table": table}],
            "spark": {"master": "local[2]"},
            "archive": {"progress_seconds": 2},
        }
        for name, body in sections.items():
            raw[name] = {**raw[name], **body} if isinstance(raw.get(name), dict) else body
        path = tmp_path / f"{topic}.toml"
        path.write_text(to_toml(raw), encoding="utf-8")
        config = parse_config({k: v for k, v in raw.items() if k not in SECTIONS}, str(path))
        return parse_pipeline_sections(raw, config), path

    return make


@dataclass
class Proxy:
    bootstrap: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[Callable[[Path], Proxy]]:
    started: list[Proxy] = []

    def start(config_path: Path) -> Proxy:
        text = config_path.read_text(encoding="utf-8")
        port = free_port()
        # the proxy's own config: the pipeline's file plus a [proxy] section (its [spark]/[archive]/[compact]
        # sections are dropped in case this ksi's config loader does not know them)
        kept, skip = [], False
        for line in text.splitlines():
            if line.startswith("["):
                skip = line.strip("[] ") in SECTIONS
            if not skip:
                kept.append(line)
        proxy_config = tmp_path / f"proxy-{len(started)}.toml"
        proxy_config.write_text(f'[proxy]\nlisten = "127.0.0.1:{port}"\nbroker_port_base = {free_port()}\n'
                                + "\n".join(kept) + "\n", encoding="utf-8")
        log_path = tmp_path / f"proxy-{len(started)}.log"
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
        with open(log_path, "wb") as log:
            process = subprocess.Popen([sys.executable, "-m", "ksi", "serve", "--config", str(proxy_config)],
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       cwd=REPO_ROOT, env=env)
        proxy = Proxy(f"127.0.0.1:{port}", process, log_path)
        started.append(proxy)
        deadline = time.monotonic() + 20
        while True:
            if process.poll() is not None:
                raise AssertionError(f"ksi serve exited with {process.returncode}:\n{proxy.log_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return proxy
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"ksi serve did not listen:\n{proxy.log_text()[-3000:]}") from None
                time.sleep(0.05)

    yield start
    for proxy in started:
        if proxy.process.poll() is None:
            proxy.process.send_signal(signal.SIGTERM)
            try:
                proxy.process.wait(20)
            except subprocess.TimeoutExpired:
                proxy.process.kill()
                proxy.process.wait()
