"""Running the proxy in the foreground, as ``ksi serve`` and ``ksi dev`` do: logging, the config file to
use, signals, and start-up failures told in one line.

Both commands import from here; neither imports the other.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from .config import Config, ConfigError

if TYPE_CHECKING:
    from .server import Proxy

__all__ = [
    "CONFIG_ENV",
    "CONFIG_HELP",
    "ConfigNotFound",
    "find_config",
    "freeze_when_started",
    "listen_problem",
    "one_line",
    "registry_problem",
    "run_proxy",
    "setup_logging",
    "startup_error",
    "startup_failed",
]

log = logging.getLogger("ksi")

CONFIG_ENV = "KSI_CONFIG"
# Looked for in the working directory, in this order, when neither --config nor KSI_CONFIG names a file.
# `ksi dev` writes the second one, so `ksi status` next to a running `ksi dev` needs no arguments.
CONFIG_CANDIDATES = ("ksi.toml", ".ksi-dev/ksi.toml")


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


class ConfigNotFound(Exception):
    """No config file was named and none was found where one is looked for."""


CONFIG_HELP = ("the TOML config file (see README); default: $KSI_CONFIG, else ./ksi.toml, else ./.ksi-dev/ksi.toml"
               " (written by `ksi dev`)")


def find_config(given: str | None, cwd: Path | None = None) -> Path:
    """The config file a command uses: ``--config``, else ``$KSI_CONFIG``, else ``./ksi.toml``, else
    ``./.ksi-dev/ksi.toml`` (the one ``ksi dev`` writes).  A file that is named must exist."""
    if given:
        return Path(given)
    named = os.environ.get(CONFIG_ENV)
    if named:
        return Path(named)
    here = cwd or Path.cwd()
    for candidate in CONFIG_CANDIDATES:
        if (here / candidate).is_file():
            return here / candidate
    raise ConfigNotFound(f"no config file: give --config FILE, set {CONFIG_ENV}, or run where "
                         f"{' or '.join(CONFIG_CANDIDATES)} is (`ksi dev` writes .ksi-dev/ksi.toml)")


async def run_proxy(config: Config, on_ready: Callable[[Proxy], Awaitable[None]] | None = None, *,
                    strict_ports: bool = True) -> None:
    """Run the proxy until SIGINT or SIGTERM, then shut down gracefully.

    ``on_ready(proxy)``, if given, runs as a task once the proxy listens (``ksi dev`` checks every part
    there before it says it is up); whatever it raises stops the proxy and propagates.  With
    ``strict_ports`` a broker port that cannot be bound stops the start (``ksi.server.ListenError``);
    without, a free port is taken instead (``ksi dev`` only: one instance, nothing else advertises it).
    """
    import trio

    from .server import Proxy

    proxy = Proxy(config, strict_ports=strict_ports)
    # Signals are caught from the start: one that arrives while ports are bound and the cluster is first
    # asked (up to STARTUP_DISCOVERY_SECONDS) stops the proxy as soon as it serves, not the process.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def serve(*, task_status: trio.TaskStatus[Proxy] = trio.TASK_STATUS_IGNORED) -> None:
                try:
                    await proxy.run(task_status=task_status)
                finally:  # what runs beside the proxy ends with it: ``on_ready`` (freeze_when_started waits
                    nursery.cancel_scope.cancel()  # for a planning that a signal at start-up cut short)

            await nursery.start(serve)
            if on_ready is not None:
                nursery.start_soon(on_ready, proxy)
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                proxy.stop()
                break


async def freeze_when_started(proxy: Proxy) -> None:
    """Once the proxy is up (its tables planned, when it serves history), move every object Python's cyclic
    collector tracks into its permanent generation (``gc.freeze``): they live as long as the process, and a
    full collection scanned them all (about 167,000 objects, 155 ms measured, during which no request moves).
    For ``ksi serve``'s process only: frozen objects' cycles are never collected."""
    import gc

    if proxy.history is not None:
        await proxy.history.planned.wait()
    gc.collect()
    gc.freeze()


def registry_problem(url: str, where: str, timeout: float = 3.0) -> str | None:
    """A line saying the Schema Registry at ``url`` does not answer, or None if it answers anything."""
    from .registry.client import RegistryClient

    problem = RegistryClient(url, timeout_seconds=timeout).problem()
    if problem is None:
        return None
    return f"schema registry {url} (schema_registry.url{where}) does not answer: {problem}"


# -- start-up failures in one line ---------------------------------------------------------------------------

LISTEN_ERRNOS = {errno.EADDRINUSE: "address already in use", errno.EACCES: "permission denied",
                 errno.EADDRNOTAVAIL: "address not available on this machine"}


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def one_line(exc: BaseException) -> str:
    """The first line of an error's message (drivers append hints and links on further lines)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def _is_startup_failure(exc: BaseException) -> bool:
    """Errors meant for the user (a port, a file, a config key, an unreachable service), not bugs."""
    if isinstance(exc, (OSError, ConfigError)):
        return True
    kind = type(exc)
    return kind.__module__.startswith("ksi.") and kind.__name__.endswith("Error")


def _probe(host: str, port: int) -> int | None:
    """The errno binding ``host:port`` fails with now, or None if it would succeed (or cannot be told)."""
    if port == 0:
        return None
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as trio and http.server bind
            sock.bind((host or "0.0.0.0", port))
    except OSError as exc:
        return exc.errno
    return None


def listen_problem(ports: list[tuple[str, str, int]], where: str = "") -> str | None:
    """For ``(key, host, port)`` triples, a line naming the first that cannot be bound, else None."""
    for key, host, port in ports:
        code = _probe(host, port)
        if code is not None:
            reason = LISTEN_ERRNOS.get(code, os.strerror(code).lower())
            return f"cannot listen on {host}:{port} ({key}{where}): {reason}"
    return None


def _config_ports(config: Config) -> list[tuple[str, str, int]]:
    proxy = config.proxy
    ports = [("proxy.listen", proxy.listen.host, proxy.listen.port)]
    if config.metrics.listen is not None:
        ports.append(("metrics.listen", config.metrics.listen.host, config.metrics.listen.port))
    return ports


def startup_error(exc: BaseException, config: Config | None) -> str | None:
    """One line saying why ksi could not start, or None when ``exc`` is not a start-up failure (a bug:
    let its traceback show).  Unwraps the ExceptionGroups trio raises; an ``OSError`` from binding,
    which does not say which address, is matched to the config key whose port is busy."""
    leaves = list(_leaves(exc))
    failures = [leaf for leaf in leaves if _is_startup_failure(leaf)]
    if not failures or len(failures) != len(leaves):
        return None
    first = failures[0]
    where = f" in {config.source}" if config is not None else ""
    if isinstance(first, OSError) and first.errno in LISTEN_ERRNOS and not first.filename:
        found = listen_problem(_config_ports(config), where) if config is not None else None
        if found is not None:
            return found
        return (f"cannot listen: {LISTEN_ERRNOS[first.errno]} (check proxy.listen, proxy.broker_port_base"
                f" and metrics.listen{where})")
    text = one_line(first)
    return f"{text}{where}" if isinstance(first, OSError) else text


def startup_failed(command: str, exc: BaseException, config: Config | None) -> int:
    """Print why ``ksi COMMAND`` could not start, in one line, and return its exit status (1); re-raise
    ``exc`` when it is not a start-up failure (a bug: let its traceback show)."""
    line = startup_error(exc, config)
    if line is None:
        raise exc
    print(f"ksi {command}: {line}", file=sys.stderr)
    return 1
