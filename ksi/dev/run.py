"""``ksi dev``: the embedded default, everything on loopback under one data directory.

Steps, each with a progress line: check the ports; start the broker (noida-db), the Schema Registry and
the catalog; give the demo topic its records; archive its first offsets with the archive pipeline's local
engine (skipped when the lake already holds them) and delete them from the broker; start the proxy; ask
every part a real question.
Only then "ksi dev is up".  Ctrl-C (or SIGTERM) stops everything started here; so does ``kill -9``, for
the broker and the archive run die with this process (each leads a process group of its own, and the
archive's worker processes die with it), and the next start stops any recorded group left over.
"""

from __future__ import annotations

import argparse
import functools
import logging
import shlex
import shutil
import signal
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from types import FrameType
from typing import Any

import trio

from ..serving import one_line, run_proxy, startup_failed
from . import checks
from .demo import (
    DEMO_ARCHIVED,
    DEMO_LOG_START,
    DEMO_PARTITIONS,
    DEMO_TABLE,
    DEMO_TOPIC,
    DemoError,
    archive_demo,
    delete_archived,
    lake_holds_demo,
    prepare_catalog,
    seed_demo_topic,
    write_config,
)
from .state import DevState, DevStateError

__all__ = ["EXTRA", "run_dev"]

log = logging.getLogger("ksi.dev")

EXTRA = "pip install 'ksi[dev]'"
STEPS = 6


class _Terminated(BaseException):
    """SIGTERM while starting: unwind like Ctrl-C, so everything started so far is stopped."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


def _missing_extra() -> str | None:
    missing = [name for module, name in (("noida_db", "noida-db (the broker)"),) if find_spec(module) is None]
    if not missing:
        return None
    return (f"ksi dev needs {' and '.join(missing)}, which ksi's dev extra brings: {EXTRA}"
            " (ksi alone is what serving needs)")


def _broker_error(exc: Exception) -> str:
    """noida's own 'error:' line from the log tail in the exception, else the first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = next((line for line in lines if line.startswith("error:")), None)
    return f"{lines[0]}: {reason}" if reason and lines else one_line(exc)


def _step(number: int, text: str) -> None:
    log.info("[%d/%d] %s", number, STEPS, text)


def run_dev(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    missing = _missing_extra()
    if missing is not None:
        print(f"ksi dev: {missing}", file=sys.stderr)
        return 1
    state = DevState(data_dir)
    try:
        for line in state.claim():
            log.warning("%s", line)
        if args.reset and state.reset():
            log.info("--reset: removed everything under %s (broker data, catalog, warehouse, registry)", data_dir)
    except (DevStateError, OSError) as exc:
        print(f"ksi dev: {one_line(exc)}", file=sys.stderr)
        return 1
    # Ctrl-C and SIGTERM while starting unwind through the finally clauses that stop what was started; even
    # when SIGINT came in ignored (a background job of a script), ksi dev in front of a user stops on it.
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _on_sigterm),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    try:
        return _run(args, data_dir, state)
    except (KeyboardInterrupt, _Terminated):
        log.info("interrupted while starting; stopped everything started so far")
        return 130
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        state.release()


def _run(args: argparse.Namespace, data_dir: Path, state: DevState) -> int:
    from ..brokers import BrokerError, free_port, start_noida
    from ..config import load_config
    from ..registry import start_registry

    port_options = [(f"--port {args.port}, the proxy's bootstrap", args.port),
                    (f"--port {args.port} + 1, the proxy's port for the broker", args.port + 1),
                    (f"--metrics-port {args.metrics_port}", args.metrics_port),
                    (f"--registry-port {args.registry_port}", args.registry_port)]
    if args.broker_port:
        port_options.append((f"--broker-port {args.broker_port}", args.broker_port))
    busy = checks.check_ports(port_options)
    if busy is not None:
        print(f"ksi dev: {busy}", file=sys.stderr)
        return 1
    broker_port = args.broker_port or free_port()
    registry = None
    broker = None
    started = time.monotonic()
    try:
        _step(1, f"broker: noida-db on 127.0.0.1:{broker_port}, data in {data_dir / 'broker'}")
        try:
            broker = start_noida(data_dir / "broker", port=broker_port, log_path=data_dir / "broker.log",
                                 die_with_parent=True)
        except BrokerError as exc:
            print(f"ksi dev: the broker did not start: {_broker_error(exc)} (log: {data_dir / 'broker.log'})",
                  file=sys.stderr)
            return 1
        assert broker.process is not None
        state.add_child("broker (noida-db)", broker.process.pid)

        _step(2, f"schema registry on 127.0.0.1:{args.registry_port} and the Iceberg catalog in {data_dir}")
        try:
            registry = start_registry("127.0.0.1", args.registry_port, data_dir / "registry")
        except OSError as exc:
            raise DemoError(f"the schema registry cannot listen on 127.0.0.1:{args.registry_port}"
                            f" (--registry-port): {exc.strerror or exc}") from None
        try:
            prepare_catalog(data_dir)
        except Exception as exc:
            log.debug("preparing the catalog failed", exc_info=True)
            raise DemoError(f"the Iceberg catalog in {data_dir / 'catalog.db'}: {one_line(exc)}") from None

        try:
            held, produced = seed_demo_topic(broker.bootstrap, registry.url)
        except DemoError:
            raise
        except Exception as exc:
            log.debug("seeding the demo topic failed", exc_info=True)
            raise DemoError(f"giving topic {DEMO_TOPIC!r} its records: {one_line(exc)}") from None
        _step(3, f"topic {DEMO_TOPIC!r}: {held} Avro records over {DEMO_PARTITIONS} partitions"
                 f"{' (produced now)' if produced else ' (kept from an earlier run)'}")
        config_path = data_dir / "ksi.toml"
        write_config(config_path, args.port, broker.bootstrap, args.metrics_port, data_dir, registry.url)

        if lake_holds_demo(data_dir):
            _step(4, f"Iceberg: {DEMO_TABLE} already holds offsets below {DEMO_ARCHIVED} of every partition;"
                     " nothing to archive")
        else:
            _step(4, f"Iceberg: archiving offsets below {DEMO_ARCHIVED} of each partition into {DEMO_TABLE} with"
                     " the archive pipeline's local engine (as `ksi archive` runs on one machine, no Spark)")
            archive_demo(config_path, on_start=lambda pid: state.add_child("archive run", pid))
        delete_archived(broker)
        _step(5, f"broker: offsets below {DEMO_LOG_START} deleted; they live only in Iceberg now")

        config = load_config(config_path)
        _step(6, f"proxy on 127.0.0.1:{args.port}; asking every part a question before saying it is up")

        async def when_listening(proxy: Any) -> None:
            await trio.to_thread.run_sync(_check_everything, args, data_dir, broker.bootstrap, registry.url,
                                          abandon_on_cancel=True)
            print(_banner(args, data_dir, config_path, broker.bootstrap, registry.url, held,
                          time.monotonic() - started), file=sys.stderr, flush=True)

        try:
            # strict_ports=False: a taken broker port gets a free one
            trio.run(functools.partial(run_proxy, config, when_listening, strict_ports=False))
        except BaseException as exc:  # noqa: BLE001 - startup_failed re-raises all but start-up failures
            down = [leaf for leaf in _leaves(exc) if isinstance(leaf, checks.PartDown)]
            if down:
                print(f"ksi dev: {down[0]}; stopped everything", file=sys.stderr)
                return 1
            return startup_failed("dev", exc, config)
        return 0
    except DemoError as exc:
        print(f"ksi dev: {exc}; stopped everything", file=sys.stderr)
        return 1
    finally:
        if registry is not None:
            registry.stop()
        if broker is not None:
            log.info("stopping the broker")
            broker.stop()


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _check_everything(args: argparse.Namespace, data_dir: Path, broker: str, registry: str) -> None:
    checks.check_broker(broker)
    checks.check_registry(registry)
    checks.check_catalog(data_dir)
    checks.check_proxy(f"127.0.0.1:{args.port}", lake_first=0)
    checks.check_metrics(f"http://127.0.0.1:{args.metrics_port}/metrics")


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, quoted for a shell."""
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return shlex.quote(shown)


def _commands(args: argparse.Namespace, config_path: Path, registry: str) -> list[str]:
    """'Try:' commands that work as printed, from this working directory, with this installation."""
    bootstrap = f"127.0.0.1:{args.port}"
    python = Path(sys.executable)
    ksi = python.parent / "ksi"
    ksi_command = _shown(ksi) if ksi.is_file() else f"{_shown(python)} -m ksi"
    default_config = Path(".ksi-dev/ksi.toml").resolve()
    status = f"{ksi_command} status" + ("" if config_path == default_config else f" --config {_shown(config_path)}")
    lines = []
    kcat = f"kcat -b {bootstrap} -C -t {DEMO_TOPIC} -o beginning -e -f '%p %o %k\\n'"
    lines.append(kcat if shutil.which("kcat") else f"{kcat}    # needs kcat: apt-get install kcat")
    consumer = Path(__file__).resolve().parents[2] / "examples" / "consumer.py"
    if consumer.is_file():  # a checkout (make run); a pip-installed ksi has no examples/
        lines.append(f"{_shown(python)} {_shown(consumer)} --bootstrap {bootstrap} --topic {DEMO_TOPIC}"
                     f" --registry {registry}")
    lines.append(status)
    return lines


def _banner(args: argparse.Namespace, data_dir: Path, config_path: Path, broker: str, registry: str, held: int,
            seconds: float) -> str:
    try_lines = "\n".join(f"  {line}" for line in _commands(args, config_path, registry))
    return f"""
ksi dev is up ({seconds:.0f} s; broker, registry, catalog, proxy and metrics each answered).
  bootstrap (give this to clients): 127.0.0.1:{args.port}
  topic '{DEMO_TOPIC}': {held} records over {DEMO_PARTITIONS} partitions, Avro values (schema {DEMO_TOPIC}-value)
    offsets below {DEMO_LOG_START} per partition only in Iceberg ({DEMO_TABLE}), \
{DEMO_LOG_START}..{DEMO_ARCHIVED - 1} in both, the rest in Kafka
  broker (direct, without history): {broker}
  schema registry: {registry}
  metrics: http://127.0.0.1:{args.metrics_port}/metrics
  config:  {config_path}
  state:   {data_dir} (kept across runs; `ksi dev --reset` starts afresh)
Try:
{try_lines}
Ctrl-C stops ksi, the registry and the broker.
"""
