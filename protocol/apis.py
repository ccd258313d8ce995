"""The table of Kafka APIs ksi knows, built from kafka-python 3's codec (Kafka's JSON message schemas).

ksi never hand-writes a message layout: the classes come from ``kafka.protocol``, which generates them
from the ``*Request.json`` / ``*Response.json`` files that Kafka itself ships.  This module only indexes
them by API key and answers the questions the proxy asks of a (key, version) pair.
"""

from __future__ import annotations

import importlib
import pkgutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from kafka.protocol.api_key import ApiKey
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields.struct import StructField

from . import _tagged_fields  # noqa: F401 - kafka-python's codec keeps unknown tagged fields
from .errors import MalformedFrame

__all__ = ["Api", "api", "api_name", "decode_body", "encode_body", "known_api", "known_api_keys"]


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    request: type[ApiMessage]
    response: type[ApiMessage]
    min_version: int
    max_version: int
    flexible_from: int | None  # first flexible version, None if never flexible

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def is_flexible(self, version: int) -> bool:
        return self.flexible_from is not None and version >= self.flexible_from

    def response_header_version(self, version: int) -> int:
        # ApiVersions responses always use header v0 so that a client can parse the answer to a
        # version it sent before knowing what the broker supports (KIP-511).
        if self.key == ApiKey.ApiVersions:
            return 0
        return 1 if self.is_flexible(version) else 0


def _walk(cls: type[ApiMessage]) -> Iterator[type[ApiMessage]]:
    """Every subclass of ``cls``: kafka-python's generated message classes (untyped to mypy)."""
    subclasses: list[type[ApiMessage]] = cls.__subclasses__()
    for sub in subclasses:
        yield sub
        yield from _walk(sub)


def _load() -> dict[int, Api]:
    import kafka.protocol as root

    for package in ("metadata", "consumer", "producer", "admin"):
        mod = importlib.import_module(f"{root.__name__}.{package}")
        for info in pkgutil.iter_modules(mod.__path__):
            importlib.import_module(f"{mod.__name__}.{info.name}")
    requests: dict[int, type[ApiMessage]] = {}
    responses: dict[int, type[ApiMessage]] = {}
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


def known_api(key: int) -> Api:
    """The API for ``key``, one ksi itself speaks (Produce, Fetch, ...): its absence is a broken install."""
    entry = _TABLE.get(key)
    if entry is None:
        raise LookupError(f"kafka-python's codec has no API key {key}: ksi needs kafka-python>=3")
    return entry


def known_api_keys() -> frozenset[int]:
    return frozenset(_TABLE)


def api_name(key: int) -> str:
    entry = _TABLE.get(key)
    if entry is not None:
        return entry.name
    try:
        return str(ApiKey(key).name)
    except ValueError:
        return f"api{key}"


# What kafka-python's generated decoders raise on bytes that are not a message of the version asked
# for: struct.error (too short), IndexError (a varint or array past the end), ValueError (invalid values;
# invalid UTF-8 is a UnicodeDecodeError), EOFError, and AssertionError (its tagged-field reader asserts
# that a struct's tagged fields are empty).
CODEC_ERRORS = (struct.error, IndexError, ValueError, EOFError, AssertionError)


def decode_body(cls: type[ApiMessage], version: int, body: bytes | memoryview) -> ApiMessage:
    """Decode a request or response body (no size prefix, no header).

    Raises :class:`MalformedFrame` when the bytes are not a ``cls`` of that version, including a null
    where the schema allows none (the codec decodes every null array or string as None; Kafka's own
    readers refuse them, and code that walks a message must be able to rely on its schema)."""
    try:
        message = cls.decode(body, version=version)
    except CODEC_ERRORS as exc:
        raise MalformedFrame(f"undecodable {cls.name} v{version}: {exc}") from None
    _reject_nulls(cls._struct, message, version, f"{cls.name} v{version}: ")
    return message


_NULLABLE_KINDS = ("string", "bytes", "records")
_NullPlan = tuple[tuple[str, str, bool, StructField | None, bool, bool], ...]
_NULL_PLANS: dict[tuple[int, int], _NullPlan] = {}


def _null_plan(schema: StructField, version: int) -> _NullPlan:
    """Per field of the struct ``schema`` at ``version`` that may hold a null or nest one: (attribute,
    schema name, must not be null, nested struct, is a struct array, is an array of strings or bytes)."""
    key = (id(schema), version)  # schema objects live as long as their message classes: for ever
    found = _NULL_PLANS.get(key)
    if found is None:
        plan = []
        for f in schema.fields.values():
            if not f.for_version_q(version) or f.tagged_field_q(version):
                continue
            nested = f.array_of if f.is_struct_array() else f if f.is_struct() else None
            required = not f.nullable_for_version_q(version) and (
                f.is_array() or f.is_struct() or f.type_str in _NULLABLE_KINDS)
            elements = f.is_array() and not f.is_struct_array() and f.array_of.type_str in _NULLABLE_KINDS
            if required or nested is not None or elements:
                plan.append((f.name, f._name, required, nested, f.is_struct_array(), elements))  # noqa: SLF001
        _NULL_PLANS[key] = found = tuple(plan)
    return found


def _reject_nulls(schema: StructField, value: object, version: int, path: str) -> None:
    for attr, name, required, nested, is_array, elements in _null_plan(schema, version):
        item = getattr(value, attr, None)
        if item is None:
            if required:
                raise MalformedFrame(f"{path}non-nullable field {name} is null")
            continue
        if nested is not None:
            for element in item if is_array else (item,):
                _reject_nulls(nested, element, version, f"{path}{name}.")
        elif elements and any(e is None for e in item):
            raise MalformedFrame(f"{path}{name} holds a null")


def encode_body(message: ApiMessage, version: int) -> bytes:
    """Encode a message body decoded by :func:`decode_body` (or built by hand) at ``version``."""
    if getattr(message, "_header", None) is None:
        # Decoded messages skip __init__; the encoder looks the attribute up.
        message._header = None  # noqa: SLF001
    return bytes(message.encode(version=version))
