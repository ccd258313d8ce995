"""The ``ksi`` command line: ``ksi serve``, ``ksi dev`` (more commands join as the pipeline lands)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

import trio

from .config import Config, ConfigError, load_config

__all__ = ["main"]

log = logging.getLogger("ksi")

DESCRIPTION = """\
ksi (Kafka Service for Iceberg) is a Kafka-protocol proxy: point a Kafka client's bootstrap at it and it
reaches the real cluster through ksi, which rewrites broker addresses so every connection stays on the
proxy. Topics configured with an Iceberg table are served as one log: old offsets from the lake, new ones
from Kafka.
"""


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


async def run_proxy(config: Config, *, strict_ports: bool = True) -> None:
    """Run the proxy until SIGINT or SIGTERM, then shut down gracefully.  A start-up error (a port that
    cannot be bound: ``ksi.server.ListenError``) is raised as itself, not inside an exception group."""
    from .server import ListenError, Proxy

    proxy = Proxy(config, strict_ports=strict_ports)
    failed: ListenError | None = None
    async with trio.open_nursery() as nursery:
        try:
            await nursery.start(proxy.run)
        except ListenError as exc:
            failed = exc  # re-raised outside the nursery, which would wrap it in a group
        else:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    log.info("received %s", signal.Signals(signum).name)
                    proxy.stop()
                    break
    if failed is not None:
        raise failed


def _load(path: str) -> Config | None:
    """The config at ``path``, or None after printing the error (the caller exits 2)."""
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"ksi: configuration error: {exc}", file=sys.stderr)
        return None


def cmd_serve(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 2
    setup_logging(args.log_level or config.proxy.log_level)
    from .tls import TlsSetupError, client_context, server_context

    try:  # certificates and keys are checked before anything listens
        if config.proxy.tls is not None:
            server_context(config.proxy.tls)
        if config.upstream.tls is not None:
            client_context(config.upstream.tls)
    except TlsSetupError as exc:
        log.error("%s: %s", config.source, exc)
        return 2
    from .server import ListenError

    try:
        trio.run(run_proxy, config)
    except ListenError as exc:  # names the address, the key and the file
        print(f"ksi serve: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        log.error("cannot start: %s (check proxy.listen and proxy.broker_port_base in %s)", exc, config.source)
        return 1
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    from .dev import run_dev

    setup_logging(args.log_level or "info")
    return run_dev(args)


def cmd_status(args: argparse.Namespace) -> int:
    from .status import print_status

    config = _load(args.config)
    if config is None:
        return 2
    setup_logging("warning")
    return print_status(config, as_json=args.json)


def cmd_registry(args: argparse.Namespace) -> int:
    from .config import ConfigError, _parse_host_port
    from .registry import run_registry

    setup_logging(args.log_level or "info")
    try:
        listen = _parse_host_port(args.listen, lambda msg: ConfigError("--listen", "listen", msg))
    except ConfigError as exc:
        print(f"ksi registry: {exc}", file=sys.stderr)
        return 2
    return run_registry(listen.host, listen.port, args.data_dir)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ksi", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    serve = sub.add_parser("serve", help="run the proxy with a config file until SIGINT/SIGTERM",
                           description="Run the ksi proxy. It listens on proxy.listen (the bootstrap address to "
                                       "give clients) plus one port per upstream broker, and stops gracefully on "
                                       "SIGINT or SIGTERM: new connections are refused and in-flight requests "
                                       "get proxy.shutdown_grace_seconds to finish.")
    serve.add_argument("--config", "-c", required=True, metavar="FILE", help="the TOML config file (see README)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                       help="overrides proxy.log_level")
    serve.set_defaults(func=cmd_serve)

    dev = sub.add_parser("dev", help="start the embedded default: broker, catalog and proxy on loopback",
                         description="Start everything on loopback under a data directory: a Kafka-compatible "
                                     "broker (noida-db), a SQLite Iceberg catalog with a local warehouse, and the "
                                     "proxy in front of them, with a demo topic holding records to read. Prints "
                                     "the bootstrap address to give a client; Ctrl-C stops everything it started.")
    dev.add_argument("--data-dir", default=".ksi-dev", help="where the broker, catalog and warehouse keep data"
                                                            " (default: ./.ksi-dev)")
    dev.add_argument("--port", type=int, default=9192, help="the proxy's bootstrap port (default 9192; brokers"
                                                            " follow it)")
    dev.add_argument("--broker-port", type=int, default=0, help="the embedded broker's port (default: a free one)")
    dev.add_argument("--metrics-port", type=int, default=9404, help="Prometheus /metrics port (default 9404)")
    dev.add_argument("--registry-port", type=int, default=8081, help="the embedded Schema Registry's port"
                                                                    " (default 8081)")
    dev.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    dev.set_defaults(func=cmd_dev)

    status = sub.add_parser("status", help="per topic and partition: lake offsets, Kafka watermarks, gaps",
                            description="For every [[topics]] entry: the offsets the Iceberg table holds per "
                                        "partition and its current snapshot, the broker's log-start offset and high "
                                        "watermark, the hot watermark (= log start: below it ksi reads the lake), "
                                        "and any gap between the lake's end and the log start (lost data). Exits 1 "
                                        "if a table is unusable or a gap exists.")
    status.add_argument("--config", "-c", required=True, metavar="FILE")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    registry = sub.add_parser("registry", help="run the embedded Schema Registry alone",
                              description="Run ksi's embedded Schema Registry: the Confluent Schema Registry REST "
                                          "API that clients use (register, look up by id, subject and version, "
                                          "latest, list subjects, compatibility, config), with Avro compatibility "
                                          "checking, persisted in DATA_DIR/registry.db. `ksi dev` starts one too. "
                                          "Against an external registry (Confluent, Karapace, Apicurio) ksi is only "
                                          "a client and this is not needed.")
    registry.add_argument("--listen", default="127.0.0.1:8081", help="HOST:PORT (default 127.0.0.1:8081)")
    registry.add_argument("--data-dir", default=".ksi-registry", help="where schemas are kept (default"
                                                                      " ./.ksi-registry)")
    registry.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    registry.set_defaults(func=cmd_registry)

    # -- the PySpark pipeline (ksi/pipeline/cli.py parses its own options; main() hands it the rest) --
    sub.add_parser("archive", add_help=False,
                   help="archive Kafka offsets into the topics' Iceberg tables with Spark, exactly once")
    sub.add_parser("compact", add_help=False,
                   help="compact, expire snapshots and remove orphan files of the topics' tables with Spark")
    return parser


PIPELINE_COMMANDS = ("archive", "compact")


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in PIPELINE_COMMANDS:
        from .pipeline.cli import archive_main, compact_main

        return (archive_main if args_list[0] == "archive" else compact_main)(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
