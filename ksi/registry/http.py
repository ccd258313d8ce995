"""The Confluent Schema Registry REST API, served by a threaded stdlib HTTP server beside the trio proxy.

``RegistryApi.handle`` turns one request (method, path with query, body bytes) into a ``Response``
without touching a socket; ``_Handler`` only moves bytes. Routes, bodies and errors follow Confluent's
API reference: JSON in and out as ``application/vnd.schemaregistry.v1+json``, errors as
``{"error_code": 40401, "message": "Subject 'x' not found."}``.

Associations (subject <-> topic links, which confluent-kafka's serializers look up on every new topic to
choose a subject) are read as Confluent's registry reads them when none exist: an empty list, so clients
fall back to their subject name strategy.  Creating them is refused with 42205 (this registry keeps none).

Not served: schema GUIDs (``/schemas/guids``), metadata and rule sets (ignored in a registration body),
contexts beyond the default one, changing the mode (always READWRITE), ``/subjects/{s}/metadata``,
creating associations, and the ``format``, ``normalize`` and ``fetchMaxId`` options (accepted, no effect).

Logging: a request the registry answers with a 404 (an unknown subject, version or id: clients ask such
questions in ordinary use) is logged at debug level; other client errors at info; server errors as errors.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from . import errors
from .schema import SCHEMA_TYPES, SchemaReference
from .store import SchemaStore, SubjectVersion, parse_version

__all__ = ["CONTENT_TYPE", "RegistryApi", "RegistryServer", "Response", "run_registry", "start_registry"]

log = logging.getLogger("ksi.registry")

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

Query = dict[str, str]
T = TypeVar("T")
# (api, path arguments, query, JSON body) -> what to answer: a JSON value or _Raw text
Handler = Callable[["RegistryApi", list[str], Query, object], object]


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = CONTENT_TYPE


@dataclass(frozen=True, slots=True)
class _Raw:
    """A handler result sent as it is (the ``/schema`` endpoints return the schema text itself)."""

    text: str


class RegistryApi:
    """The REST API over a ``SchemaStore``: one request in, one ``Response`` out."""

    def __init__(self, store: SchemaStore) -> None:
        self.store = store

    def handle(self, method: str, target: str, body: bytes = b"") -> Response:
        url = urlsplit(target)
        segments = [unquote(s) for s in url.path.split("/")[1:]]
        if segments and not segments[-1]:
            segments.pop()  # a trailing slash
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        subject = _subject_of(segments)
        try:
            handler, args = _route(method, segments)
            result = handler(self, args, query, _json_body(body) if method in ("POST", "PUT") else None)
        except errors.RegistryError as exc:
            where = f" (subject {subject!r})" if subject is not None else ""
            level = logging.DEBUG if exc.status == 404 else logging.INFO if exc.status < 500 else logging.ERROR
            log.log(level, "schema registry %s %s%s: %d %s", method, url.path, where, exc.error_code, exc.message)
            return Response(exc.status, _dump(exc.body()))
        except Exception:
            log.exception("schema registry %s %s failed (subject %r)", method, url.path, subject)
            error = errors.RegistryError(500, errors.STORE_ERROR, "Error in the backend datastore")
            return Response(500, _dump(error.body()))
        if isinstance(result, _Raw):
            return Response(200, result.text.encode())
        return Response(200, _dump(result))

    # -- schemas ---------------------------------------------------------------------------------------------

    def root(self, args: list[str], query: Query, body: object) -> object:
        return {}

    def schema_types(self, args: list[str], query: Query, body: object) -> object:
        return sorted(SCHEMA_TYPES)

    def list_schemas(self, args: list[str], query: Query, body: object) -> object:
        found = self.store.all_schemas(query.get("subjectPrefix", ""), _flag(query, "deleted"),
                                       _flag(query, "latestOnly"))
        return _page([_version_json(sv) for sv in found], query)

    def schema_by_id(self, args: list[str], query: Query, body: object) -> object:
        schema = self.store.schema_by_id(_schema_id(args[0]))
        out: dict[str, object] = {"schema": schema.text}
        if schema.schema_type != "AVRO":
            out["schemaType"] = schema.schema_type
        if schema.references:
            out["references"] = [r.to_json() for r in schema.references]
        return out

    def raw_schema_by_id(self, args: list[str], query: Query, body: object) -> object:
        return _Raw(self.store.schema_by_id(_schema_id(args[0])).text)

    def subjects_by_id(self, args: list[str], query: Query, body: object) -> object:
        held = self.store.subject_versions_of(_schema_id(args[0]), _flag(query, "deleted"))
        subjects = sorted({subject for subject, _ in held if subject.startswith(query.get("subject", ""))})
        return _page(subjects, query)

    def versions_by_id(self, args: list[str], query: Query, body: object) -> object:
        held = self.store.subject_versions_of(_schema_id(args[0]), _flag(query, "deleted"))
        return _page([{"subject": s, "version": v} for s, v in held if s.startswith(query.get("subject", ""))],
                     query)

    # -- subjects --------------------------------------------------------------------------------------------

    def list_subjects(self, args: list[str], query: Query, body: object) -> object:
        return _page(self.store.subjects(query.get("subjectPrefix", ""), _flag(query, "deleted"),
                                         _flag(query, "deleted_only")), query)

    def list_versions(self, args: list[str], query: Query, body: object) -> object:
        return _page(self.store.versions(args[0], _flag(query, "deleted"), _flag(query, "deleted_only")), query)

    def register(self, args: list[str], query: Query, body: object) -> object:
        return {"id": self.store.register(args[0], *_submitted(body))}

    def lookup(self, args: list[str], query: Query, body: object) -> object:
        return _version_json(self.store.lookup(args[0], *_submitted(body), deleted=_flag(query, "deleted")))

    def get_version(self, args: list[str], query: Query, body: object) -> object:
        return _version_json(self.store.version(args[0], parse_version(args[1]), _flag(query, "deleted")))

    def raw_version(self, args: list[str], query: Query, body: object) -> object:
        return _Raw(self.store.version(args[0], parse_version(args[1]), _flag(query, "deleted")).schema.text)

    def referenced_by(self, args: list[str], query: Query, body: object) -> object:
        return _page(self.store.referenced_by(args[0], parse_version(args[1])), query)

    def delete_subject(self, args: list[str], query: Query, body: object) -> object:
        return self.store.delete_subject(args[0], _flag(query, "permanent"))

    def delete_version(self, args: list[str], query: Query, body: object) -> object:
        return self.store.delete_version(args[0], parse_version(args[1]), _flag(query, "permanent"))

    # -- compatibility and config ----------------------------------------------------------------------------

    def compatibility(self, args: list[str], query: Query, body: object) -> object:
        version = parse_version(args[1]) if len(args) > 1 else None
        messages = self.store.test_compatibility(args[0], version, *_submitted(body))
        out: dict[str, object] = {"is_compatible": not messages}
        if _flag(query, "verbose"):
            out["messages"] = messages
        return out

    def get_config(self, args: list[str], query: Query, body: object) -> object:
        if not args:
            return {"compatibilityLevel": self.store.compatibility(None)}
        level = self.store.compatibility(args[0])
        if level is None:
            if not _flag(query, "defaultToGlobal"):
                raise errors.subject_compatibility_not_configured(args[0])
            level = self.store.compatibility(None)
        return {"compatibilityLevel": level}

    def put_config(self, args: list[str], query: Query, body: object) -> object:
        if not isinstance(body, dict):
            raise errors.invalid_compatibility_level()
        level = body.get("compatibility", body.get("compatibilityLevel"))
        if not isinstance(level, str):
            raise errors.invalid_compatibility_level()
        return {"compatibility": self.store.set_compatibility(args[0] if args else None, level)}

    def delete_config(self, args: list[str], query: Query, body: object) -> object:
        return {"compatibilityLevel": self.store.delete_compatibility(args[0] if args else None)}

    def get_mode(self, args: list[str], query: Query, body: object) -> object:
        return {"mode": "READWRITE"}

    def put_mode(self, args: list[str], query: Query, body: object) -> object:
        if isinstance(body, dict) and body.get("mode") == "READWRITE":
            return {"mode": "READWRITE"}
        raise errors.operation_not_permitted("This registry only runs in READWRITE mode")

    def contexts(self, args: list[str], query: Query, body: object) -> object:
        return ["."]

    # -- associations (none are kept) ------------------------------------------------------------------------

    def list_associations(self, args: list[str], query: Query, body: object) -> object:
        return []

    def delete_associations(self, args: list[str], query: Query, body: object) -> object:
        raise errors.association_not_found(args[0])

    def create_association(self, args: list[str], query: Query, body: object) -> object:
        raise errors.operation_not_permitted("Associations are not supported by ksi's embedded schema registry;"
                                             " subjects follow the clients' subject name strategy")


# (method, path pattern, handler): "*" matches one path segment, which is passed to the handler.
_ROUTES: list[tuple[str, tuple[str, ...], Handler]] = [
    ("GET", (), RegistryApi.root),
    ("GET", ("schemas",), RegistryApi.list_schemas),
    ("GET", ("schemas", "types"), RegistryApi.schema_types),
    ("GET", ("schemas", "ids", "*"), RegistryApi.schema_by_id),
    ("GET", ("schemas", "ids", "*", "schema"), RegistryApi.raw_schema_by_id),
    ("GET", ("schemas", "ids", "*", "subjects"), RegistryApi.subjects_by_id),
    ("GET", ("schemas", "ids", "*", "versions"), RegistryApi.versions_by_id),
    ("GET", ("subjects",), RegistryApi.list_subjects),
    ("POST", ("subjects", "*"), RegistryApi.lookup),
    ("DELETE", ("subjects", "*"), RegistryApi.delete_subject),
    ("GET", ("subjects", "*", "versions"), RegistryApi.list_versions),
    ("POST", ("subjects", "*", "versions"), RegistryApi.register),
    ("GET", ("subjects", "*", "versions", "*"), RegistryApi.get_version),
    ("DELETE", ("subjects", "*", "versions", "*"), RegistryApi.delete_version),
    ("GET", ("subjects", "*", "versions", "*", "schema"), RegistryApi.raw_version),
    ("GET", ("subjects", "*", "versions", "*", "referencedby"), RegistryApi.referenced_by),
    ("POST", ("compatibility", "subjects", "*", "versions"), RegistryApi.compatibility),
    ("POST", ("compatibility", "subjects", "*", "versions", "*"), RegistryApi.compatibility),
    ("GET", ("config",), RegistryApi.get_config),
    ("PUT", ("config",), RegistryApi.put_config),
    ("DELETE", ("config",), RegistryApi.delete_config),
    ("GET", ("config", "*"), RegistryApi.get_config),
    ("PUT", ("config", "*"), RegistryApi.put_config),
    ("DELETE", ("config", "*"), RegistryApi.delete_config),
    ("GET", ("mode",), RegistryApi.get_mode),
    ("PUT", ("mode",), RegistryApi.put_mode),
    ("GET", ("mode", "*"), RegistryApi.get_mode),
    ("PUT", ("mode", "*"), RegistryApi.put_mode),
    ("GET", ("contexts",), RegistryApi.contexts),
    ("GET", ("associations", "subjects", "*"), RegistryApi.list_associations),
    ("GET", ("associations", "resources", "*"), RegistryApi.list_associations),
    ("GET", ("associations", "resources", "*", "*"), RegistryApi.list_associations),
    ("DELETE", ("associations", "resources", "*"), RegistryApi.delete_associations),
    ("PUT", ("associations", "resources", "*"), RegistryApi.create_association),
    ("POST", ("associations",), RegistryApi.create_association),
    ("POST", ("associations:batchMutate",), RegistryApi.create_association),
]


def _route(method: str, segments: list[str]) -> tuple[Handler, list[str]]:
    path_known = False
    for route_method, pattern, handler in _ROUTES:
        if len(pattern) != len(segments) or any(s != p and (p != "*" or not s)
                                                for p, s in zip(pattern, segments, strict=True)):
            continue
        path_known = True
        if route_method == method:
            return handler, [s for p, s in zip(pattern, segments, strict=True) if p == "*"]
    raise errors.http_error(405, "Method Not Allowed") if path_known else errors.http_error(404, "Not Found")


def _subject_of(segments: list[str]) -> str | None:
    if len(segments) >= 2 and segments[0] in ("subjects", "config", "mode"):
        return segments[1]
    if len(segments) >= 3 and segments[:2] == ["compatibility", "subjects"]:
        return segments[2]
    return None


def _json_body(body: bytes) -> object:
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise errors.RegistryError(400, 400, f"Unexpected request body, not JSON: {exc}") from None


def _submitted(body: object) -> tuple[str, str, list[SchemaReference]]:
    """``(schema_type, text, references)`` from a register, lookup or compatibility body."""
    if not isinstance(body, dict):
        raise errors.invalid_schema("Empty schema")
    schema_type = body.get("schemaType") or "AVRO"
    if not isinstance(schema_type, str):
        raise errors.invalid_schema(f"schemaType must be a string, got {schema_type!r}")
    references = []
    for ref in body.get("references") or ():
        if not (isinstance(ref, dict) and isinstance(ref.get("name"), str) and isinstance(ref.get("subject"), str)
                and isinstance(ref.get("version"), int)):
            raise errors.invalid_schema(f"a reference needs a name, a subject and a version, got {ref!r}")
        references.append(SchemaReference(ref["name"], ref["subject"], ref["version"]))
    text = body.get("schema")
    if not isinstance(text, str):
        raise errors.invalid_schema("Empty schema")
    return schema_type.upper(), text, references


def _version_json(sv: SubjectVersion) -> dict[str, object]:
    out: dict[str, object] = {"subject": sv.subject, "version": sv.version, "id": sv.schema_id}
    if sv.schema.schema_type != "AVRO":
        out["schemaType"] = sv.schema.schema_type
    if sv.schema.references:
        out["references"] = [r.to_json() for r in sv.schema.references]
    out["schema"] = sv.schema.text
    return out


def _schema_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise errors.http_error(404, "Not Found") from None


def _flag(query: Query, name: str) -> bool:
    # confluent-kafka's Python client sends Python's spelling ("True") in some query strings.
    return query.get(name, "false").lower() == "true"


def _page(items: list[T], query: Query) -> list[T]:
    try:
        offset, limit = int(query.get("offset", 0)), int(query.get("limit", -1))
    except ValueError:
        return items
    items = items[max(offset, 0):]
    return items if limit < 0 else items[:limit]


def _dump(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


# -- the HTTP server ------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection
    server_version = "ksi-schema-registry"
    timeout = 120  # an idle keep-alive connection is closed after this many seconds

    def do_GET(self) -> None:
        started = time.perf_counter()
        try:
            body = self._read_body()
        except ValueError as exc:
            self.send_error(400, f"unreadable body: {exc}")
            return
        response = self.server.api.handle(self.command, self.path, body)
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        self.wfile.write(response.body)
        log.debug("schema registry %s %s -> %d in %.1f ms", self.command, self.path, response.status,
                  (time.perf_counter() - started) * 1000)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET  # unrouted methods get a JSON 405

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline().strip():  # trailers
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # do_GET logs each request with its duration

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("schema registry %s: %s", self.address_string(), format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, api: RegistryApi) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.api = api
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__((host, port), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind also resolves the host's FQDN, a reverse DNS lookup we do not need.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver's default prints a traceback to stderr; a client hanging up is not worth one.
        if isinstance(sys.exc_info()[1], OSError):
            log.debug("schema registry connection from %s ended", client_address, exc_info=True)
        else:
            log.warning("schema registry connection from %s failed", client_address, exc_info=True)

    def close_connections(self) -> None:
        """End open (keep-alive) connections, whose handler threads would otherwise wait on them."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class RegistryServer:
    """A running registry: its HTTP server serves in a daemon thread until ``stop()``."""

    def __init__(self, httpd: _Server, store: SchemaStore) -> None:
        self._httpd = httpd
        self.store = store
        host, port = httpd.server_address[:2]
        self.port = int(port)
        self.url = f"http://{_url_host(str(host))}:{self.port}"
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"ksi-registry-{self.port}", daemon=True)
        self._stopped = False
        self._thread.start()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        self._thread.join()
        self.store.close()

    def __enter__(self) -> RegistryServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def start_registry(host: str, port: int, data_dir: str | Path) -> RegistryServer:
    """Open the store under ``data_dir`` and serve the registry on ``host:port`` (0: a free port)."""
    store = SchemaStore(data_dir)
    try:
        httpd = _Server(host, port, RegistryApi(store))
    except BaseException:
        store.close()
        raise
    return RegistryServer(httpd, store)


def run_registry(host: str, port: int, data_dir: str | Path) -> int:
    """Serve the registry until SIGINT or SIGTERM; return the process exit code."""
    try:
        server = start_registry(host, port, data_dir)
    except OSError as exc:
        log.error("schema registry cannot listen on %s:%d: %s", host, port, exc)
        return 1
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda received, frame: stop.set())
    # Ready only once the signal handlers are in: a SIGTERM right after this line stops it cleanly.
    log.info("schema registry at %s (data in %s)", server.url, server.store.path)
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        server.stop()
        log.info("schema registry stopped")
    return 0

