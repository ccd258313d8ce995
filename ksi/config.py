"""ksi's configuration: one TOML file, validated before anything listens.

Every error names the file and the dotted key (``proxy.listen``, ``topics[2].layout``) so a user can
go straight to the line.  Values are frozen dataclasses; nothing here touches the network.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LAYOUTS",
    "CatalogConfig",
    "Config",
    "ConfigError",
    "HostPort",
    "MetricsConfig",
    "ProxyConfig",
    "SchemaRegistryConfig",
    "TopicConfig",
    "UpstreamConfig",
    "load_config",
    "parse_config",
    "read_toml",
]

LAYOUTS = ("ksi", "redpanda", "automq", "kafka-connect", "streambased")
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
SEAM_HOLES = ("error", "skip")
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024


class ConfigError(Exception):
    """A configuration problem, phrased as ``FILE: KEY: what is wrong``."""

    def __init__(self, source: str, key: str, message: str) -> None:
        self.source = source
        self.key = key
        super().__init__(f"{source}: {key}: {message}")


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS for one side: ksi's listeners (server) or its connections to the cluster (client)."""

    cert_file: str | None = None   # PEM certificate chain (a listener's own; a client certificate upstream)
    key_file: str | None = None    # its PEM private key
    ca_file: str | None = None     # CAs to verify the peer with (listener: client certificates)
    require_client_cert: bool = False  # listener only: refuse clients without a certificate from ca_file
    check_hostname: bool = True        # upstream only: the broker's certificate must name its host


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    listen: HostPort = HostPort("127.0.0.1", 9192)
    advertised_host: str = "127.0.0.1"
    broker_port_base: int = 9193
    node_ports: dict[int, int] = field(default_factory=dict)
    # What clients are told, when it differs from where ksi listens (a load balancer, NAT, several
    # instances on one host): a port per node id, or a base that numbers nodes as broker_port_base does.
    advertised_ports: dict[int, int] = field(default_factory=dict)
    advertised_port_base: int = 0  # 0: advertise the port ksi listens on
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    shutdown_grace_seconds: float = 10.0
    request_timeout_seconds: float = 120.0
    idle_timeout_seconds: float = 600.0
    # Close a client connection between requests once it is this old (0: never), so clients spread over
    # the instances behind a load balancer again after one comes back.
    connection_max_age_seconds: float = 0.0
    log_level: str = "info"
    tls: TlsConfig | None = None

    def node_port_key(self, node_id: int) -> str:
        """The config key that chose the port ksi listens on for ``node_id``."""
        return f"proxy.node_ports.{node_id}" if node_id in self.node_ports else "proxy.broker_port_base"


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    bootstrap_servers: tuple[HostPort, ...] = (HostPort("127.0.0.1", 9092),)
    connect_timeout_seconds: float = 5.0
    metadata_refresh_seconds: float = 30.0
    tls: TlsConfig | None = None


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    listen: HostPort | None = None


@dataclass(frozen=True, slots=True)
class CatalogConfig:
    name: str = "lake"
    properties: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SchemaRegistryConfig:
    url: str | None = None


@dataclass(frozen=True, slots=True)
class HistoryConfig:
    """How cold reads are done: row groups read in windows of rows, encoded batches cached."""

    cache_bytes: int = 64 << 20      # encoded batches kept for re-reads (scan resistant), across all topics
    spill_bytes: int = 1 << 30       # ... and, evicted from memory, in a spill file of this size (0: none)
    spill_dir: str | None = None     # where the spill file goes (default: the system's temporary directory)
    window_rows: int = 32768         # rows a row group is streamed, indexed and encoded in
    read_threads: int = max(2, min(8, os.cpu_count() or 2))  # concurrent lake reads a consumer waits for (worker
    #                                  threads), and as many reads ahead: one per core (2 at least, 8 at most)
    prefetch: bool = True            # read what follows while the consumer takes what it was given
    max_cursors: int = 64            # row-group cursors kept open between reads (~1 MiB each): streams at once
    max_read_bytes: int = 64 << 20   # bytes one lake read decodes at most (about): windows and reads sized by it
    catalog_retry_seconds: float = 10.0  # how often an unreachable catalog is tried again (when asked)


@dataclass(frozen=True, slots=True)
class TopicConfig:
    name: str
    table: str
    layout: str = "ksi"
    prefer_lake: bool = False
    compression: str = "none"
    # Principals ("User:NAME", "User:ANONYMOUS" for unauthenticated clients, "*" for everyone) that may read
    # the topic while it exists only in the lake.  Default: nobody (the cluster cannot authorise a topic
    # it does not have, so ksi does not guess).
    lake_only_readers: tuple[str, ...] = ()
    # Offsets missing between the lake's end and the log start, when the table's writer keeps no record of
    # the offsets it read: "error" (report a gap, do not skip) or "skip" (step over them, as explained holes).
    seam_holes: str = "error"
    # The consumer group of a writer that commits the offsets it read to Kafka (Iceberg's Kafka Connect sink:
    # "connect-<connector name>"): its committed offsets tell explained holes at the seam from lost data.
    writer_group: str | None = None

    def may_read_lake_only(self, principal: str) -> bool:
        return "*" in self.lake_only_readers or principal in self.lake_only_readers


@dataclass(frozen=True, slots=True)
class Config:
    source: str = "<defaults>"
    proxy: ProxyConfig = ProxyConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    metrics: MetricsConfig = MetricsConfig()
    catalog: CatalogConfig | None = None
    schema_registry: SchemaRegistryConfig = SchemaRegistryConfig()
    history: HistoryConfig = HistoryConfig()
    topics: tuple[TopicConfig, ...] = ()


def read_toml(path: str | Path) -> dict[str, Any]:
    """The TOML document at ``path``; raise :class:`ConfigError` naming the file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, "<file>", f"cannot read: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "<file>", f"not valid TOML: {exc}") from None


def load_config(path: str | Path) -> Config:
    """Read and validate ``path``; raise :class:`ConfigError` naming the file and key."""
    return parse_config(read_toml(path), str(path))


class Section:
    """Typed accessors over one TOML table that remember the dotted path for errors (the proxy's sections
    and the pipeline's, :mod:`ksi.pipeline.settings`; ``listed_in`` names the document listing every key)."""

    def __init__(self, source: str, prefix: str, data: Any, listed_in: str = "README") -> None:
        if not isinstance(data, dict):
            raise ConfigError(source, prefix, f"must be a table, got {type(data).__name__}")
        self.source, self.prefix, self.data, self.listed_in = source, prefix, data, listed_in
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def fail(self, name: str, message: str) -> ConfigError:
        return ConfigError(self.source, self.key(name), message)

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = None, required: bool = False) -> Any:
        self.used.add(name)
        if name not in self.data:
            if required:
                raise self.fail(name, "is required")
            return default
        value = self.data[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            raise self.fail(name, f"must be {_kind_names(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise self.fail(name, f"must be {_kind_names(kinds)}, got {type(value).__name__} {value!r}")
        return value

    def host_port(self, name: str, default: HostPort | None = None, required: bool = False) -> HostPort | None:
        value = self.get(name, str, None, required)
        if value is None:
            return default
        return _parse_host_port(value, lambda msg: self.fail(name, msg))

    def positive(self, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
        value = self.get(name, kind, default)
        if value <= 0:
            raise self.fail(name, f"must be > 0, got {value!r}")
        return value

    def non_negative(self, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
        value = self.get(name, kind, default)
        if value < 0:
            raise self.fail(name, f"must be >= 0, got {value!r}")
        return value

    def table(self, name: str) -> dict[str, str]:
        """A table of plain values as strings (booleans as ``true``/``false``), such as Spark settings."""
        value = self.get(name, dict, {})
        out = {}
        for key, item in value.items():
            if isinstance(item, (dict, list)):
                raise self.fail(f"{name}.{key}", "must be a plain value")
            out[str(key)] = str(item).lower() if isinstance(item, bool) else str(item)
        return out

    def section(self, name: str) -> Section:
        self.used.add(name)
        return Section(self.source, self.key(name), self.data.get(name, {}), self.listed_in)

    def reject_unknown(self, also_allowed: tuple[str, ...] = ()) -> None:
        for name in self.data:
            if name not in self.used and name not in also_allowed:
                raise self.fail(name, f"unknown key (check the spelling; {self.listed_in} lists every key)")


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             dict: "a table", list: "a list"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _parse_host_port(value: str, fail: Callable[[str], Exception]) -> HostPort:
    host, sep, port_text = value.strip().rpartition(":")
    if not sep or not host:
        raise fail(f"must be HOST:PORT, got {value!r}")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise fail(f"port must be a number, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise fail(f"port must be 0-65535, got {port}")
    return HostPort(host, port)


def _port(section: Section, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 65535:
        raise section.fail(name, f"must be a port number 1-65535, got {value!r}")
    return value


def _node_ports(section: Section, name: str) -> dict[int, int]:
    """A table of node id -> port (``node_ports = { "1" = 9301 }``)."""
    ports: dict[int, int] = {}
    for node, port in section.get(name, dict, {}).items():
        try:
            node_id = int(node)
        except ValueError:
            raise section.fail(f"{name}.{node}", "node id must be an integer") from None
        ports[node_id] = _port(section, f"{name}.{node}", port)
        twin = [n for n, other in ports.items() if other == port and n != node_id]
        if twin:
            raise section.fail(f"{name}.{node}", f"port {port} is already {section.key(name)}.{twin[0]}'s: each broker"
                               " needs a port of its own")
    return ports


def _tls(parent: Section, server: bool) -> TlsConfig | None:
    """``[proxy.tls]`` (server side) or ``[upstream.tls]`` (client side); None when absent."""
    if "tls" not in parent.data:
        return None
    t = parent.section("tls")
    files = {}
    for name in ("cert_file", "key_file", "ca_file"):
        path = t.get(name, str, None)
        if path is not None and not Path(path).is_file():
            raise t.fail(name, f"no such file: {path}")
        files[name] = path
    tls = TlsConfig(**files,
                    require_client_cert=t.get("require_client_cert", bool, False) if server else False,
                    check_hostname=t.get("check_hostname", bool, True) if not server else True)
    if server and (tls.cert_file is None or tls.key_file is None):
        raise t.fail("cert_file" if tls.cert_file is None else "key_file", "is required for TLS on ksi's listeners")
    if (tls.cert_file is None) != (tls.key_file is None):
        raise t.fail("key_file" if tls.key_file is None else "cert_file", "cert_file and key_file go together")
    if tls.require_client_cert and tls.ca_file is None:
        raise t.fail("ca_file", "is required to check client certificates (require_client_cert = true)")
    t.reject_unknown()
    return tls


def parse_config(raw: dict[str, Any], source: str = "<config>") -> Config:
    root = Section(source, "", raw)

    p = root.section("proxy")
    listen = p.host_port("listen", HostPort("127.0.0.1", 9192))
    assert listen is not None
    node_ports = _node_ports(p, "node_ports")
    advertised_ports = _node_ports(p, "advertised_ports")
    log_level = p.get("log_level", str, "info").lower()
    if log_level not in LOG_LEVELS:
        raise p.fail("log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    base_default = listen.port + 1 if listen.port else 0
    proxy = ProxyConfig(
        listen=listen,
        advertised_host=p.get("advertised_host", str,
                              listen.host if listen.host not in ("0.0.0.0", "::") else "127.0.0.1"),
        broker_port_base=p.get("broker_port_base", int, base_default),
        node_ports=node_ports,
        max_frame_bytes=p.positive("max_frame_bytes", int, DEFAULT_MAX_FRAME_BYTES),
        shutdown_grace_seconds=float(p.positive("shutdown_grace_seconds", (int, float), 10.0)),
        request_timeout_seconds=float(p.positive("request_timeout_seconds", (int, float), 120.0)),
        idle_timeout_seconds=float(p.positive("idle_timeout_seconds", (int, float), 600.0)),
        connection_max_age_seconds=float(p.get("connection_max_age_seconds", (int, float), 0.0)),
        advertised_ports=advertised_ports,
        advertised_port_base=p.get("advertised_port_base", int, 0),
        log_level=log_level,
        tls=_tls(p, server=True),
    )
    if proxy.broker_port_base and not 0 < proxy.broker_port_base <= 65535:
        raise p.fail("broker_port_base", f"must be a port number, got {proxy.broker_port_base}")
    if proxy.connection_max_age_seconds < 0:
        raise p.fail("connection_max_age_seconds",
                     f"must be >= 0 (0: no limit), got {proxy.connection_max_age_seconds:g}")
    if proxy.advertised_port_base:
        if not 0 < proxy.advertised_port_base <= 65535:
            raise p.fail("advertised_port_base", f"must be a port number, got {proxy.advertised_port_base}")
        if not proxy.broker_port_base:
            raise p.fail("advertised_port_base", "needs broker_port_base (ephemeral broker ports have no number to"
                         " advertise at an offset from); pin advertised_ports per node instead")
    p.reject_unknown()

    u = root.section("upstream")
    servers_raw = u.get("bootstrap_servers", (str, list), required=True)
    items = servers_raw.split(",") if isinstance(servers_raw, str) else servers_raw
    servers = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise u.fail("bootstrap_servers", f"each entry must be HOST:PORT, got {item!r}")
        servers.append(_parse_host_port(item, lambda msg: u.fail("bootstrap_servers", msg)))
    upstream = UpstreamConfig(
        bootstrap_servers=tuple(servers),
        connect_timeout_seconds=float(u.positive("connect_timeout_seconds", (int, float), 5.0)),
        metadata_refresh_seconds=float(u.positive("metadata_refresh_seconds", (int, float), 30.0)),
        tls=_tls(u, server=False),
    )
    u.reject_unknown()

    m = root.section("metrics")
    metrics = MetricsConfig(listen=m.host_port("listen"))
    m.reject_unknown()

    catalog = None
    if "catalog" in raw:
        c = root.section("catalog")
        name = c.get("name", str, "lake")
        props: dict[str, str] = {}
        for key, value in c.data.items():
            if key == "name":
                continue
            if isinstance(value, (dict, list)):
                raise c.fail(key, "catalog properties must be plain values")
            props[key] = str(value).lower() if isinstance(value, bool) else str(value)
            c.used.add(key)
        if "uri" not in props:
            raise c.fail("uri", "is required (for example sqlite:////abs/path/catalog.db)")
        catalog = CatalogConfig(name=name, properties=props)

    s = root.section("schema_registry")
    registry = SchemaRegistryConfig(url=s.get("url", str, None))
    if registry.url is not None and not registry.url.startswith(("http://", "https://")):
        raise s.fail("url", f"must start with http:// or https://, got {registry.url!r}")
    s.reject_unknown()

    h = root.section("history")
    defaults = HistoryConfig()
    history = HistoryConfig(
        cache_bytes=h.get("cache_bytes", int, defaults.cache_bytes),
        spill_bytes=h.get("spill_bytes", int, defaults.spill_bytes),
        spill_dir=h.get("spill_dir", str, defaults.spill_dir),
        window_rows=h.positive("window_rows", int, defaults.window_rows),
        read_threads=h.positive("read_threads", int, defaults.read_threads),
        prefetch=h.get("prefetch", bool, defaults.prefetch),
        max_cursors=h.positive("max_cursors", int, defaults.max_cursors),
        max_read_bytes=h.positive("max_read_bytes", int, defaults.max_read_bytes),
        catalog_retry_seconds=float(h.positive("catalog_retry_seconds", (int, float), defaults.catalog_retry_seconds)),
    )
    if history.cache_bytes < 0:
        raise h.fail("cache_bytes", f"must be >= 0 (0 turns the cache off), got {history.cache_bytes}")
    if history.spill_bytes < 0:
        raise h.fail("spill_bytes", f"must be >= 0 (0: no spill file), got {history.spill_bytes}")
    if history.spill_dir is not None and not os.path.isdir(history.spill_dir):
        raise h.fail("spill_dir", f"{history.spill_dir!r} is not a directory")
    if "chunk_bytes" in (h.data or {}):
        raise h.fail("chunk_bytes", "is no longer used: cold reads are sized in row-group windows"
                                    " (history.window_rows); remove the key")
    h.reject_unknown()

    topics: list[TopicConfig] = []
    topic_list = root.get("topics", list, [])
    seen: set[str] = set()
    for i, entry in enumerate(topic_list):
        t = Section(source, f"topics[{i}]", entry)
        topic = TopicConfig(
            name=t.get("name", str, required=True),
            table=t.get("table", str, required=True),
            layout=t.get("layout", str, "ksi"),
            prefer_lake=t.get("prefer_lake", bool, False),
            compression=t.get("compression", str, "none"),
            lake_only_readers=tuple(t.get("lake_only_readers", list, [])),
            seam_holes=t.get("seam_holes", str, "error"),
            writer_group=t.get("writer_group", str, None),
        )
        if topic.seam_holes not in SEAM_HOLES:
            raise t.fail("seam_holes", f"must be one of {', '.join(SEAM_HOLES)}, got {topic.seam_holes!r}")
        for reader in topic.lake_only_readers:
            if not isinstance(reader, str) or not (reader == "*" or (reader.startswith("User:") and len(reader) > 5)):
                raise t.fail("lake_only_readers", f'entries are "User:NAME", "User:ANONYMOUS" or "*", got {reader!r}')
        if topic.compression not in COMPRESSIONS:
            raise t.fail("compression", f"must be one of {', '.join(COMPRESSIONS)}, got {topic.compression!r}")
        if topic.layout not in LAYOUTS:
            raise t.fail("layout", f"must be one of {', '.join(LAYOUTS)}, got {topic.layout!r}")
        if "." not in topic.table:
            raise t.fail("table", f"must be NAMESPACE.TABLE, got {topic.table!r}")
        if topic.name in seen:
            raise t.fail("name", f"topic {topic.name!r} is configured twice")
        if catalog is None:
            raise t.fail("table", "needs a [catalog] section to read tables from")
        seen.add(topic.name)
        t.reject_unknown()
        topics.append(topic)

    # [spark], [archive] and [compact] belong to the pipeline (ksi.pipeline.settings), which checks them.
    root.reject_unknown(("catalog", "spark", "archive", "compact"))
    return Config(source=source, proxy=proxy, upstream=upstream, metrics=metrics, catalog=catalog,
                  schema_registry=registry, history=history, topics=tuple(topics))
