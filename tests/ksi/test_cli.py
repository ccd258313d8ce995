"""The command line as a user meets it: --version, where the config is found, start-up failures told in one
line (busy ports named with their config key, bad configs), and ksi dev's data directory (one ksi dev at a
time, leftovers of a killed one stopped, --reset).  Real processes and sockets, no mocks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ksi import __version__
from ksi.dev.state import DevState, DevStateError
from ksi.serving import ConfigNotFound, find_config, startup_error

REPO_ROOT = Path(__file__).resolve().parents[2]


def ksi(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ksi", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
                          check=False)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_version() -> None:
    result = ksi("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"ksi {__version__}"


def test_config_is_found_as_documented(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KSI_CONFIG", raising=False)
    with pytest.raises(ConfigNotFound, match="--config FILE, set KSI_CONFIG"):
        find_config(None, tmp_path)
    (tmp_path / ".ksi-dev").mkdir()
    (tmp_path / ".ksi-dev" / "ksi.toml").write_text("")
    assert find_config(None, tmp_path) == tmp_path / ".ksi-dev" / "ksi.toml"
    (tmp_path / "ksi.toml").write_text("")
    assert find_config(None, tmp_path) == tmp_path / "ksi.toml"
    monkeypatch.setenv("KSI_CONFIG", "/elsewhere.toml")
    assert find_config(None, tmp_path) == Path("/elsewhere.toml")
    assert find_config("given.toml", tmp_path) == Path("given.toml")


@pytest.mark.parametrize("command", ["status", "verify demo", "archive", "compact"])
def test_without_a_config_a_command_says_where_it_looked(tmp_path: Path, command: str) -> None:
    result = ksi(*command.split(), cwd=tmp_path, env={"KSI_CONFIG": ""})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"ksi {command.partition(' ')[0]}: no config file: give --config FILE, set KSI_CONFIG, or run where ksi.toml or"
        " .ksi-dev/ksi.toml is (`ksi dev` writes .ksi-dev/ksi.toml)"]


def test_a_bad_config_is_one_line_naming_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[upstream]\nbootstrap_servers = "x"\n')
    for command in ("serve", "status", "archive", "compact"):
        result = ksi(command, "--config", str(config))
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == (f"ksi {command}: configuration error: {config}: upstream.bootstrap_servers:"
                                         " must be HOST:PORT, got 'x'")


@pytest.mark.parametrize("command", ["archive", "compact"])
def test_the_pipeline_finds_its_config_as_serve_does(tmp_path: Path, command: str) -> None:
    (tmp_path / ".ksi-dev").mkdir()
    (tmp_path / ".ksi-dev" / "ksi.toml").write_text('[upstream]\nbootstrap_servers = "y"\n')
    result = ksi(command, cwd=tmp_path, env={"KSI_CONFIG": ""})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"ksi {command}: configuration error: {tmp_path / '.ksi-dev' / 'ksi.toml'}:"
                                     " upstream.bootstrap_servers: must be HOST:PORT, got 'y'")
    (tmp_path / "elsewhere.toml").write_text('[upstream]\nbootstrap_servers = "z"\n')
    result = ksi(command, cwd=tmp_path, env={"KSI_CONFIG": str(tmp_path / "elsewhere.toml")})
    assert result.stderr.strip().endswith("got 'z'"), result.stderr


@pytest.mark.parametrize("key", ["proxy.listen", "metrics.listen"])
def test_a_busy_port_is_one_line_naming_port_and_key(tmp_path: Path, busy_port: int, key: str) -> None:
    section, _ = key.split(".")
    listen = busy_port if section == "proxy" else 0
    config = tmp_path / "ksi.toml"
    config.write_text(f'[proxy]\nlisten = "127.0.0.1:{listen}"\nbroker_port_base = 0\n'
                      f'[upstream]\nbootstrap_servers = "127.0.0.1:9"\n'
                      + (f'[metrics]\nlisten = "127.0.0.1:{busy_port}"\n' if section == "metrics" else ""))
    result = ksi("serve", "--config", str(config))
    assert result.returncode == 1
    what = "the bootstrap listener" if section == "proxy" else "Prometheus /metrics"
    assert result.stderr.strip().splitlines() == [
        f"ksi serve: cannot listen on 127.0.0.1:{busy_port} ({key} in {config}, {what}): address already in use"]


def test_startup_error_unwraps_groups_and_leaves_bugs_alone() -> None:
    group = BaseExceptionGroup("x", [ExceptionGroup("y", [OSError(111, "Connection refused")])])
    assert startup_error(group, None) == "[Errno 111] Connection refused"
    assert startup_error(ExceptionGroup("z", [ValueError("a bug")]), None) is None
    assert startup_error(ExceptionGroup("z", [OSError(98, "in use"), KeyError("bug")]), None) is None


def test_ksi_dev_refuses_busy_ports_before_starting_anything(tmp_path: Path, busy_port: int) -> None:
    from ksi.brokers import free_port

    result = ksi("dev", "--data-dir", str(tmp_path / "dev"), "--port", str(free_port(count=2)), "--metrics-port",
                 str(free_port()), "--registry-port", str(busy_port))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"ksi dev: cannot listen on 127.0.0.1:{busy_port} (--registry-port {busy_port}): address already in use;"
        " pick another port with the option named"]
    assert not (tmp_path / "dev" / "broker").exists()


# -- ksi dev's data directory ------------------------------------------------------------------------------


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "300"], start_new_session=True)


def test_a_live_ksi_dev_keeps_its_directory(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        started = Path(f"/proc/{owner.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        (tmp_path / "ksi-dev.json").write_text(json.dumps(
            {"owner": {"name": "ksi dev", "pid": owner.pid, "started": started}, "children": []}))
        with pytest.raises(DevStateError, match=f"another ksi dev \\(pid {owner.pid}\\) is running"):
            DevState(tmp_path).claim()
    finally:
        owner.kill()
        owner.wait()


def test_leftovers_of_a_killed_ksi_dev_are_stopped_at_the_next_start(tmp_path: Path) -> None:
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    leftover = _sleeper()
    try:
        started = Path(f"/proc/{leftover.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        (tmp_path / "ksi-dev.json").write_text(json.dumps({
            "owner": {"name": "ksi dev", "pid": dead_owner.pid, "started": "1"},
            "children": [{"name": "broker (noida-db)", "pid": leftover.pid, "started": started},
                         {"name": "recycled pid", "pid": os.getpid(), "started": "1"}]}))  # not ours: kept
        lines = DevState(tmp_path).claim()
        assert lines == [f"stopped the broker (noida-db) (process group {leftover.pid}) that an earlier ksi dev left"
                         " running"]
        assert leftover.wait(timeout=10) == -signal.SIGTERM
    finally:
        if leftover.poll() is None:
            leftover.kill()
    state = json.loads((tmp_path / "ksi-dev.json").read_text())
    assert state["owner"]["pid"] == os.getpid() and state["children"] == []


def test_a_killed_ksi_devs_process_group_is_stopped_when_its_leader_is_gone(tmp_path: Path) -> None:
    """An archive run killed alone leaves what it started (a worker pool) in its process group: the next
    start stops that group, found by its id in /proc, although the recorded leader no longer runs."""
    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys\n"
                               "print(subprocess.Popen(['sleep', '300']).pid, flush=True)"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    started = Path(f"/proc/{leader.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    try:
        assert leader.wait(timeout=10) == 0  # the leader is gone, its child (reparented) is still running
        assert Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()[2] == str(leader.pid)
        (tmp_path / "ksi-dev.json").write_text(json.dumps({
            "owner": {"name": "ksi dev", "pid": leader.pid, "started": "1"},
            "children": [{"name": "archive run", "pid": leader.pid, "started": started}]}))
        lines = DevState(tmp_path).claim()
        assert lines == [f"stopped the archive run (process group {leader.pid}) that an earlier ksi dev left running"]
        deadline = time.monotonic() + 10
        while Path(f"/proc/{member}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # reaped by init once it died
        stat = Path(f"/proc/{member}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def test_reset_removes_only_a_ksi_dev_directory(tmp_path: Path) -> None:
    ours = tmp_path / "ours"
    (ours / "broker").mkdir(parents=True)
    (ours / "ksi.toml").write_text("# Written by `ksi dev`; a starting point\n")
    state = DevState(ours)
    state.claim()
    assert state.reset()
    assert sorted(p.name for p in ours.iterdir()) == ["ksi-dev.json"]

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("years of work")
    state = DevState(theirs)
    state.claim()
    with pytest.raises(DevStateError, match="does not look like a ksi dev data directory"):
        state.reset()
    assert (theirs / "thesis.tex").read_text() == "years of work"


def test_ksi_dev_names_the_missing_extra(tmp_path: Path) -> None:
    # a Python in which noida_db cannot be found, as after `pip install ksi` without the extra
    code = ("import sys, importlib.util as u; u.find_spec = (lambda f: (lambda n, *a: None if n == 'noida_db'"
            " else f(n, *a)))(u.find_spec); from ksi.cli import main; sys.exit(main(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", code, "dev", "--data-dir", str(tmp_path / "d")],
                            capture_output=True, text=True, timeout=30, cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == ("ksi dev: ksi dev needs noida-db (the broker), which ksi's dev extra brings:"
                                     " pip install 'ksi[dev]' (ksi alone is what serving needs)")


def serve(config: Path) -> subprocess.Popen[str]:
    """``ksi serve --config config`` as a user starts it, its output (stdout and stderr) on a pipe."""
    return subprocess.Popen([sys.executable, "-m", "ksi", "serve", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def test_unreachable_broker_catalog_and_registry_at_start_are_one_line_each(tmp_path: Path) -> None:
    """ksi serve keeps serving (and retrying) through outages at start, as the outage tests require; each
    unreachable part is told once, in one line naming it, with no traceback."""
    from ksi.brokers import free_port

    broker, registry = free_port(), free_port()
    config = tmp_path / "ksi.toml"
    config.write_text(f'[proxy]\nlisten = "127.0.0.1:0"\nbroker_port_base = 0\n'
                      f'[upstream]\nbootstrap_servers = "127.0.0.1:{broker}"\n'
                      f'[schema_registry]\nurl = "http://127.0.0.1:{registry}"\n'
                      f'[catalog]\nuri = "sqlite:///{tmp_path}/no/such/dir/catalog.db"\n'
                      f'warehouse = "file://{tmp_path}/warehouse"\n'
                      '[[topics]]\nname = "orders"\ntable = "history.orders"\n')
    process = serve(config)
    lines: list[str] = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("cluster discovery failed" in line for line in lines):
            lines.append(process.stdout.readline())
        assert process.poll() is None  # still serving
    finally:
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=30)
    text = "".join(lines) + rest
    assert process.returncode == 0, text
    assert "Traceback" not in text
    assert sum(f"schema registry http://127.0.0.1:{registry} (schema_registry.url in {config}) does not answer" in line
               for line in text.splitlines()) == 1, text
    assert sum("cannot open the Iceberg catalog" in line for line in text.splitlines()) == 1, text
    assert sum(f"cannot reach the Kafka cluster (127.0.0.1:{broker}" in line for line in text.splitlines()) == 1, text


def test_the_example_config_loads_and_shows_every_key_of_the_readme_table() -> None:
    """examples/ksi.toml ("each key is shown with its default") stays in step with the README's table."""
    import re

    from ksi.config import load_config

    example = REPO_ROOT / "examples" / "ksi.toml"
    config = load_config(example)
    assert config.topics and config.catalog is not None
    text = example.read_text()
    readme = (REPO_ROOT / "README.md").read_text()
    table = readme[readme.index("## Configuration"):readme.index("## Metrics")]
    missing = []
    for row in re.findall(r"^\| (`[^|]+) \|", table, re.M):
        for key in re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", row):  # proxy.listen, proxy.tls.cert_file, ...
            *sections, name = key.split(".")
            section = "[" + ".".join(sections) + "]"
            start = text.find(section)
            following = text[start:] if start >= 0 else ""
            if start < 0 or not re.search(rf"^#? ?{name} = ", following, re.M):
                missing.append(key)
    assert missing == [], f"README keys not shown in {example}: {missing}"


def test_the_proxy_process_leaves_pandas_out_and_pyiceberg_reads_without_it(tmp_path: Path) -> None:
    """ksi serve makes ``import pandas`` fail in its process (32 MiB nothing there uses; pyarrow.dataset would
    import it): PyIceberg's Arrow I/O and Arrow itself work without it, and what asks for pandas is told why."""
    script = (
        "import sys\n"
        "from ksi.allocator import leave_out_pandas\n"
        "leave_out_pandas()\n"
        "import pyarrow as pa, pyarrow.parquet as pq\n"
        "import pyiceberg.io.pyarrow, pyiceberg.catalog.sql\n"
        "assert 'pandas' not in sys.modules\n"
        f"pq.write_table(pa.table({{'x': [1, 2]}}), {str(tmp_path / 'x.parquet')!r})\n"
        f"assert pq.read_table({str(tmp_path / 'x.parquet')!r}).column('x').to_pylist() == [1, 2]\n"
        "try:\n"
        "    import pandas\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "left out of this ksi process" in done.stdout


def test_sigterm_as_soon_as_ksi_listens_ends_it(tmp_path: Path) -> None:
    """A signal that arrives while the lake's first planning is in flight (a few ms after "ksi listening") ends
    ksi serve at once: nothing that runs beside the proxy waits for a planning the stop cut short (it hung in
    trio's loop until killed: tests/integration/test_scaleout.py, and 4 of 10 such starts by hand)."""
    from pyiceberg.catalog.sql import SqlCatalog

    from ksi.brokers import free_port, start_noida
    from ksi.pipeline.archive import ensure_table
    from ksi.pipeline.settings import ArchiveSettings

    broker = start_noida(tmp_path / "broker")
    try:
        props = {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}
        (tmp_path / "warehouse").mkdir()
        catalog = SqlCatalog("lake", **props)
        catalog.create_namespace("history")
        ensure_table(catalog, "history.orders", ArchiveSettings(), "orders")
        broker.create_topic("orders", 1)
        for attempt in range(3):
            config = tmp_path / f"ksi-{attempt}.toml"
            config.write_text(f'[proxy]\nlisten = "127.0.0.1:{free_port()}"\nbroker_port_base = 0\n'
                              f'[upstream]\nbootstrap_servers = "{broker.bootstrap}"\n'
                              f'[catalog]\nname = "lake"\nuri = "{props["uri"]}"\nwarehouse = "{props["warehouse"]}"\n'
                              '[[topics]]\nname = "orders"\ntable = "history.orders"\n')
            process = serve(config)
            assert process.stdout is not None
            lines = []
            while not lines or "ksi listening" not in lines[-1]:
                lines.append(process.stdout.readline())
                assert lines[-1], "".join(lines)
            process.send_signal(signal.SIGTERM)
            try:
                rest, _ = process.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                raise AssertionError(f"ksi serve did not end on SIGTERM (start {attempt + 1})") from None
            assert process.returncode == 0, "".join(lines) + rest
    finally:
        broker.stop()
