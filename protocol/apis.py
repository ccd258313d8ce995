"""The table of Kafka APIs ksi knows, built from kafka-python 3's codec (Kafka's JSON message schemas).

ksi never hand-writes a message layout: the classes come from ``kafka.protocol``, which generates them
from the ``*Request.json`` / ``*Response.json`` files that Kafka itself ships.  This module only indexes
them by API key and answers the questions the proxy asks of a (key, version) pair.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any

from kafka.protocol.api_key import ApiKey
from kafka.protocol.api_message import ApiMessage

__all__ = ["Api", "api", "known_api_keys", "api_name", "decode_body", "encode_body"]


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    request: Any  # ApiMessage subclass
    response: Any  # ApiMessage subclass
    min_version: int
    max_version: int
    flexible_from: int | None  # first flexible version, None if never flexible

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def is_flexible(self, version: int) -> bool:
        return self.flexible_from is not None and version >= self.flexible_from

    def request_header_version(self, version: int) -> int:
        return 2 if self.is_flexible(version) else 1

    def response_header_version(self, version: int) -> int:
        # ApiVersions responses always use header v0 so that a client can parse the answer to a
        # version it sent before knowing what the broker supports (KIP-511).
        if self.key == ApiKey.ApiVersions:
            return 0
        return 1 if self.is_flexible(version) else 0


def _walk(cls: type) -> Any:
    for sub in cls.__subclasses__():
        yield sub
        yield from _walk(sub)


def _load() -> dict[int, Api]:
    import kafka.protocol as root

    for package in ("metadata", "consumer", "producer", "admin"):
        mod = importlib.import_module(f"{root.__name__}.{package}")
        for info in pkgutil.iter_modules(mod.__path__):
            importlib.import_module(f"{mod.__name__}.{info.name}")
    requests: dict[int, Any] = {}
    responses: dict[int, Any] = {}
    for cls in _walk(ApiMessage):
        if getattr(cls, "_class_version", None) is not None or getattr(cls, "_json", None) is None:
            continue
        (requests if cls.is_request() else responses)[cls.API_KEY] = cls
    table: dict[int, Api] = {}
    for key, req in requests.items():
        resp = responses.get(key)
        if resp is None:
            continue
        valid = req.valid_versions
        flexible = req._flexible_versions  # noqa: SLF001 - parsed from the JSON schema
        try:
            name = ApiKey(key).name
        except ValueError:
            name = req.name.removesuffix("Request")
        table[key] = Api(
            key=key,
            name=name,
            request=req,
            response=resp,
            min_version=0,
            max_version=valid[1],
            flexible_from=flexible[0] if flexible is not None and flexible[0] >= 0 else None,
        )
    return table


_TABLE = _load()


def api(key: int) -> Api | None:
    """The API for ``key``, or ``None`` if ksi's codec does not know it."""
    return _TABLE.get(key)


def known_api_keys() -> frozenset[int]:
    return frozenset(_TABLE)


def api_name(key: int) -> str:
    entry = _TABLE.get(key)
    if entry is not None:
        return entry.name
    try:
        return ApiKey(key).name
    except ValueError:
        return f"api{key}"


def decode_body(cls: Any, version: int, body: bytes | memoryview) -> Any:
    """Decode a request or response body (no size prefix, no header)."""
    return cls.decode(body, version=version)


def encode_body(message: Any, version: int) -> bytes:
    """Encode a message body decoded by :func:`decode_body` (or built by hand) at ``version``."""
    if getattr(message, "_header", None) is None:
        # Decoded messages skip __init__; the encoder looks the attribute up.
        message._header = None  # noqa: SLF001
    return bytes(message.encode(version=version))
