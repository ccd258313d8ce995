"""examples/grafana against a real Prometheus (Debian's `prometheus`) scraping two real `ksi serve` (one
with a history topic, one pass-through) while consumers read, one of them the history topic across the
seam: the provisioning files and the Prometheus config are valid, every panel's PromQL evaluates without
error, every panel whose metrics ksi exports returns series, the seam panels among them (with the seam's
offsets exact), and the history instance alone shows the history topic's hot Fetch bytes.  (Grafana
itself installs from no registry this project uses, so the dashboard is checked through the queries
Grafana would send.)"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import struct
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO_ROOT
from ksi.brokers import BrokerProcess, free_port
from test_history import PARTITIONS, PER_PARTITION, archive, produce, read_all, strip

GRAFANA = REPO_ROOT / "examples" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "ksi.json"
# Grafana's variables, as Grafana would expand them for a query over the last minutes.
VARIABLES = {"$__rate_interval": "1m", "$topic": ".*"}
# Metrics the dashboard shows that another process sets: the proxy defines them (one registry) but never
# sets them, so their panels are evaluated here, not required to have data.
ELSEWHERE = {
    "ksi_archive_lag_records": "`ksi archive --follow --metrics-port` (the pipeline)",
    "ksi_archive_lag_seconds": "`ksi archive --follow --metrics-port` (the pipeline)",
}
# Panels that must have data after the test's traffic (the seam's among them).
REQUIRED = {"Offsets at the seam", "Lost offsets (in neither the lake nor Kafka)", "Overlap: offsets in both",
            "Lag in records (ksi's view)", "Fetch bytes/s: hot (broker) and cold (lake)",
            "Cold partition fetches/s by topic", "Requests/s by API", "Bytes/s by direction", "Client connections",
            "Request latency p99 by API", "Lake read p99 by topic", "Lake reads/s by topic", "Cache size",
            "Client errors/s", "Broker errors/s", "Lake errors/s", "Gaps refused/s"}
METRIC = re.compile(r"\bksi_[a-z0-9_]+")


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def expand(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    return expr


def base_name(sample: str) -> str:
    return re.sub(r"_(bucket|sum|count|created)$", "", sample)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    binary = shutil.which("prometheus")
    assert binary is not None, "Debian's prometheus is missing: scripts/install-test-deps.sh installs it"
    port = free_port()
    started: list[subprocess.Popen[bytes]] = []

    def start(targets: list[str]) -> str:
        config = tmp_path / "prometheus.yml"
        # examples/grafana/prometheus.yml with the test's targets and a short scrape interval (whose timeout,
        # the same, is generous for a loaded machine)
        example = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
        example["global"]["scrape_interval"] = example["global"]["scrape_timeout"] = "2s"
        example["scrape_configs"] = [{**example["scrape_configs"][0], "static_configs": [{"targets": targets}]}]
        config.write_text(yaml.safe_dump(example))
        check = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True,
                               check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed with the process below
        process = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                    f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                   stdout=log, stderr=subprocess.STDOUT)
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return url
            except OSError:
                pass
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def query(url: str, expr: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=30) as answer:
        return json.loads(answer.read())  # type: ignore[no-any-return]


def test_provisioning_files_name_the_dashboard_and_its_data_source() -> None:
    datasource = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "ksi.yaml").read_text())
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "ksi.yaml").read_text())
    assert datasource["apiVersion"] == provider["apiVersion"] == 1
    [source] = datasource["datasources"]
    assert source["type"] == "prometheus" and provider["providers"][0]["type"] == "file"
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["panels"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        assert panel["targets"] and all(t["datasource"]["uid"] == source["uid"] for t in panel["targets"])
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"]["uid"] == source["uid"]


def bad_frame(bootstrap: str) -> None:
    """A frame whose header does not decode: ksi counts a malformed client request."""
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", 3) + b"\xff\xff\xff")
        sock.settimeout(10)
        with contextlib.suppress(OSError):
            sock.recv(1)


def test_every_panel_queries_a_real_prometheus_scraping_ksi(noida: BrokerProcess, ksi_proxy: Any, catalog: Any,
                                                            prometheus: Any) -> None:
    lake, props = catalog
    topic = f"dash-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, PARTITIONS)
    originals = strip(produce(noida.bootstrap, topic))
    archive(lake, f"history.{topic.replace('-', '_')}", originals, below=100)
    for p in range(PARTITIONS):
        noida.delete_records(topic, p, 50)
    proxy = ksi_proxy(noida, catalog={"name": "lake", **props},
                      topics=[{"name": topic, "table": f"history.{topic.replace('-', '_')}", "layout": "ksi"}])
    passthrough = ksi_proxy(noida)  # a second ksi without [[topics]], in the same Prometheus job
    url = prometheus([p.metrics_url.split("//")[1].split("/")[0] for p in (proxy, passthrough)])

    replayed = strip(read_all(proxy.bootstrap, topic, PARTITIONS * PER_PARTITION))  # cold, then hot
    assert len(replayed) == PARTITIONS * PER_PARTITION
    plain = f"plain-{uuid.uuid4().hex[:8]}"  # a topic without history, through the pass-through ksi
    noida.create_topic(plain, PARTITIONS)
    produce(noida.bootstrap, plain)
    assert len(strip(read_all(passthrough.bootstrap, plain, PARTITIONS * PER_PARTITION))) == PARTITIONS * PER_PARTITION
    bad_frame(proxy.bootstrap)
    exported_text = ""
    for each in (proxy, passthrough):
        with urllib.request.urlopen(each.metrics_url, timeout=10) as answer:
            exported_text += answer.read().decode()
    defined = {base_name(m) for m in re.findall(r"^# TYPE (\S+)", exported_text, re.M)}
    exported = {base_name(line.split("{")[0].split(" ")[0]) for line in exported_text.splitlines()
                if line.startswith("ksi_")}
    # Wait until Prometheus has scraped each ksi successfully at least twice since the traffic (a rate needs
    # two samples of every series, including those the traffic's last moments created).
    after_traffic = time.time()
    deadline = time.monotonic() + 120
    while True:
        since = max(1, int(time.time() - after_traffic))
        answer = query(url, f'min(sum_over_time(up{{job="ksi"}}[{since}s]))')  # good scrapes of each target
        if answer["data"]["result"] and float(answer["data"]["result"][0]["value"][1]) >= 2:
            break
        assert time.monotonic() < deadline, f"prometheus never scraped ksi since the traffic: {answer}"
        time.sleep(0.5)

    with_series, pending = [], []
    for panel in panels():
        for target in panel["targets"]:
            names = {base_name(n) for n in METRIC.findall(target["expr"])}
            unknown = names - defined - {base_name(n) for n in ELSEWHERE}
            assert not unknown, f"panel {panel['title']!r} names metrics ksi does not define: {unknown}"
            answer = query(url, expand(target["expr"]))
            assert answer["status"] == "success", (panel["title"], answer)
            if answer["data"]["result"]:
                with_series.append(panel["title"])
            else:
                assert not names <= exported, f"panel {panel['title']!r} returned no series: {target['expr']}"
                pending.append((panel["title"], sorted(names - exported)))
    titles = set(with_series)
    assert titles >= REQUIRED, (REQUIRED - titles, pending)
    # the seam of every partition, offset-exact: the lake holds 0..99, the broker 50..PER_PARTITION - 1
    history, plain_instance = (p.metrics_url.split("//")[1].split("/")[0] for p in (proxy, passthrough))
    for metric, value in (("ksi_lake_first_offset", 0), ("ksi_lake_next_offset", 100), ("ksi_log_start_offset", 50),
                          ("ksi_high_watermark", PER_PARTITION)):
        series = query(url, f'{metric}{{topic="{topic}"}}')["data"]["result"]
        assert sorted((r["metric"]["partition"], r["metric"]["instance"], float(r["value"][1])) for r in series) == \
            [(str(p), history, value) for p in range(PARTITIONS)], (metric, series)
    # the history topic's hot part (offsets 100 on) came through the history instance itself, not only the
    # pass-through one (the dashboard's panel sums both)
    # (the counter's value: its first scrape may come after the traffic, so an increase() could be 0)
    hot = query(url, f'sum(ksi_frame_bytes_total{{direction="server_to_proxy", api="Fetch",'
                     f' instance="{history}"}})')["data"]["result"]
    assert hot and float(hot[0]["value"][1]) > 0, hot
    assert history != plain_instance
    deadline = time.monotonic() + 60
    while True:  # the malformed frame sent above, counted and scraped
        client_errors = query(url, "sum by (kind) (ksi_client_errors_total)")["data"]["result"]
        if any(r["metric"].get("kind") == "malformed" for r in client_errors):
            break
        assert time.monotonic() < deadline, (client_errors, query(url, "up"), proxy.log_tail(20))
        time.sleep(0.5)
    # Panels without data: only those of metrics ksi defines but has not set in this run (the archive lag,
    # set by `ksi archive --follow`; cache hits and evictions, which one consumer reading once need not cause).
    for title, missing in pending:
        assert title not in REQUIRED and set(missing) <= defined, (title, missing)
    print("panels with series:", len(with_series), "pending:", pending)
