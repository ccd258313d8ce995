"""ksi's embedded Schema Registry: the Confluent Schema Registry REST API that Kafka clients' Avro
serializers talk to, kept in SQLite under a data directory.

    schema.py  a submitted schema parsed and validated, and the identity that decides its global id
    compat.py  Avro reader/writer compatibility and the compatibility levels
    store.py   subjects, versions, ids and config in SQLite, with Confluent's rules
    http.py    the REST API and the threaded HTTP server (``start_registry``, ``run_registry``)
    errors.py  errors carrying Confluent's HTTP status and error_code

AVRO is fully supported; JSON and PROTOBUF schemas are stored and returned as opaque text, without
compatibility checking.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .compat import DEFAULT_LEVEL, LEVELS, Incompatibility, check_level, incompatibilities
from .errors import RegistryError
from .schema import ParsedSchema, SchemaReference, parse
from .store import SchemaStore, SubjectVersion

if TYPE_CHECKING:
    from .http import RegistryApi, RegistryServer, Response, run_registry, start_registry

_SERVER = frozenset({"RegistryApi", "RegistryServer", "Response", "run_registry", "start_registry"})


def __getattr__(name: str) -> Any:
    """The server's names, imported on first use: ``ksi.registry.client`` (which ``ksi archive`` imports to
    read a topic's schemas) loads this package first, and the HTTP server's modules cost it ~0.1 s."""
    if name in _SERVER:
        from . import http

        return getattr(http, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "DEFAULT_LEVEL",
    "LEVELS",
    "Incompatibility",
    "ParsedSchema",
    "RegistryApi",
    "RegistryError",
    "RegistryServer",
    "Response",
    "SchemaReference",
    "SchemaStore",
    "SubjectVersion",
    "check_level",
    "incompatibilities",
    "parse",
    "run_registry",
    "start_registry",
]
