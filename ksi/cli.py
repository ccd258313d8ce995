"""The ``ksi`` command line: ``serve``, ``dev``, ``status``, ``registry``, and the pipeline's ``archive`` and
``compact`` (parsed in ksi/pipeline/cli.py)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from . import __version__
from .config import Config, ConfigError, load_config
from .serving import (
    CONFIG_HELP,
    ConfigNotFound,
    find_config,
    freeze_when_started,
    registry_problem,
    run_proxy,
    setup_logging,
    startup_failed,
)

__all__ = ["main"]

log = logging.getLogger("ksi")

DESCRIPTION = """\
ksi (Kafka Service for Iceberg) is a Kafka-protocol proxy: point a Kafka client's bootstrap at it and it
reaches the real cluster through ksi, which rewrites broker addresses so every connection stays on the
proxy. Topics configured with an Iceberg table are served as one log: old offsets from the lake, new ones
from Kafka.

Start with `ksi dev` (everything on loopback, with a demo topic), then `ksi status` next to it.
"""

def _load(command: str, path: str | None) -> Config | None:
    """The config to use, or None after printing why there is none (the caller exits 2)."""
    try:
        return load_config(find_config(path))
    except ConfigNotFound as exc:
        print(f"ksi {command}: {exc}", file=sys.stderr)
    except ConfigError as exc:
        print(f"ksi {command}: configuration error: {exc}", file=sys.stderr)
    return None


def cmd_serve(args: argparse.Namespace) -> int:
    config = _load("serve", args.config)
    if config is None:
        return 2
    from .allocator import leave_out_pandas, limit_arenas

    limit_arenas()  # before any thread allocates: peak RSS (see ksi.allocator)
    leave_out_pandas()  # 32 MiB that nothing in the proxy uses (see ksi.allocator)
    setup_logging(args.log_level or config.proxy.log_level)
    from .tls import TlsSetupError, client_context, server_context

    try:  # certificates and keys are checked before anything listens
        if config.proxy.tls is not None:
            server_context(config.proxy.tls)
        if config.upstream.tls is not None:
            client_context(config.upstream.tls)
    except TlsSetupError as exc:
        print(f"ksi serve: {config.source}: {exc}", file=sys.stderr)
        return 2
    if config.schema_registry.url and config.topics:  # told once at start; ksi serves and asks again later
        problem = registry_problem(config.schema_registry.url, f" in {config.source}")
        if problem is not None:
            log.warning("%s; values decoded into columns are re-encoded once it answers", problem)
    import trio  # here, not at the top: ksi archive, compact, status and verify never run the event loop

    try:
        trio.run(run_proxy, config, freeze_when_started)
    except BaseException as exc:  # noqa: BLE001 - startup_failed re-raises all but start-up failures
        return startup_failed("serve", exc, config)
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    from .allocator import limit_arenas
    from .dev import run_dev

    limit_arenas()  # it runs the proxy in this process, as ksi serve does
    setup_logging(args.log_level or "info")
    return run_dev(args)


def cmd_status(args: argparse.Namespace) -> int:
    from .status import print_status

    config = _load("status", args.config)
    if config is None:
        return 2
    setup_logging("warning")
    return print_status(config, as_json=args.json)


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import print_verify

    config = _load("verify", args.config)
    if config is None:
        return 2
    setup_logging("warning")
    try:
        return print_verify(config, args.topic, args.partition, as_json=args.json,
                            progress_seconds=args.progress_seconds)
    except ValueError as exc:
        print(f"ksi verify: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the lake or the broker cannot be read: one line, not a traceback
        from .serving import one_line

        print(f"ksi verify: {args.topic}: {one_line(exc)}", file=sys.stderr)
        return 1


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
    parser.add_argument("--version", action="version", version=f"ksi {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    serve = sub.add_parser("serve", help="run the proxy with a config file until SIGINT/SIGTERM",
                           description="Run the ksi proxy. It listens on proxy.listen (the bootstrap address to "
                                       "give clients) plus one port per upstream broker, and stops gracefully on "
                                       "SIGINT or SIGTERM: new connections are refused and in-flight requests "
                                       "get proxy.shutdown_grace_seconds to finish.")
    serve.add_argument("--config", "-c", metavar="FILE", help=CONFIG_HELP)
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                       help="overrides proxy.log_level")
    serve.set_defaults(func=cmd_serve)

    dev = sub.add_parser("dev", help="start the embedded default: broker, catalog and proxy on loopback",
                         description="Start everything on loopback under a data directory: a Kafka-compatible "
                                     "broker (noida-db), the Schema Registry, a SQLite Iceberg catalog with a local "
                                     "warehouse, and the proxy in front of them, with a demo topic whose first offsets "
                                     "were archived into Iceberg by the archive pipeline (its local engine, no Spark) "
                                     "and deleted from the broker. "
                                     "Says it is up only once every part has answered, then prints the bootstrap "
                                     "address and commands to try. The data directory is kept across runs "
                                     "(--reset starts afresh). Ctrl-C stops everything it started; so does kill -9 "
                                     "(the broker and the archive run die with it, and the next start stops anything "
                                     "left over). "
                                     "Needs the dev extra: pip install 'ksi[dev]'.")
    dev.add_argument("--data-dir", default=".ksi-dev", help="where the broker, catalog and warehouse keep data"
                                                            " (default: ./.ksi-dev)")
    dev.add_argument("--port", type=int, default=9192, help="the proxy's bootstrap port (default 9192; brokers"
                                                            " follow it)")
    dev.add_argument("--broker-port", type=int, default=0, help="the embedded broker's port (default: a free one)")
    dev.add_argument("--metrics-port", type=int, default=9404, help="Prometheus /metrics port (default 9404)")
    dev.add_argument("--registry-port", type=int, default=8081, help="the embedded Schema Registry's port"
                                                                    " (default 8081)")
    dev.add_argument("--reset", action="store_true", help="remove everything under the data directory first (broker"
                                                           " data, catalog, warehouse, registry) and start afresh")
    dev.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    dev.set_defaults(func=cmd_dev)

    status = sub.add_parser("status", help="per topic and partition: lake offsets, Kafka watermarks, gaps",
                            description="For every [[topics]] entry: the offsets the Iceberg table holds per "
                                        "partition and its current snapshot, the broker's log-start offset and high "
                                        "watermark, the hot watermark (= log start: below it ksi reads the lake), "
                                        "and any gap between the lake's end and the log start (lost data). Exits 1 "
                                        "if a table is unusable or a gap exists.")
    status.add_argument("--config", "-c", metavar="FILE", help=CONFIG_HELP)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    verify = sub.add_parser("verify", help="compare a topic's lake with its broker, record by record",
                            description="Compare the lake with the broker for one [[topics]] entry, per partition: "
                                        "every offset both hold, field by field (key, value bytes as ksi serves "
                                        "them, headers, timestamp), the fields the table's layout carries exactly "
                                        "(the others are reported as not compared); the holes inside the lake "
                                        "(offsets without a record: transaction markers, dropped tombstones, "
                                        "compacted keys), explained or not; the seam between the lake's end and "
                                        "the log start (explained by the writer's commit state, or lost); and "
                                        "offsets the table stores twice. Prints a progress line on stderr every "
                                        "few seconds. Exits 1 on a mismatch or lost offsets, 2 on a bad config or "
                                        "an unknown topic.")
    verify.add_argument("topic", metavar="TOPIC", help="a topic configured in [[topics]]")
    verify.add_argument("--config", "-c", metavar="FILE", help=CONFIG_HELP)
    verify.add_argument("--partition", "-p", type=int, action="append", metavar="P",
                        help="only this partition (repeatable; default: all)")
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.add_argument("--progress-seconds", type=float, default=5.0, metavar="S",
                        help="seconds between progress lines on stderr (default 5; 0: after every record)")
    verify.set_defaults(func=cmd_verify)

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
        if argv is None and args_list[0] == "archive":  # this process's own command, not a caller's
            from .allocator import leave_out_pandas

            leave_out_pandas()  # nothing in the driver uses it; its import is 0.15 s of every run (ksi.allocator)
        from .pipeline.cli import archive_main, compact_main, exit_now

        code = (archive_main if args_list[0] == "archive" else compact_main)(args_list[1:])
        if argv is None:  # this process's own command line: end it without the interpreter's teardown
            exit_now(code)
        return code
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
