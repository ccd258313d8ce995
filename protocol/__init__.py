"""The Kafka wire protocol as ksi needs it, sans-IO: bytes in, values out; no sockets, no trio.

Messages come from kafka-python 3's codec (generated from Kafka's JSON schemas); this package adds
framing, header access, ApiVersions intersection and address rewriting on top of it.  The archive's side is
here too: record batches decoded into columns (``batch_columns``) and its Fetch client's few messages
(``fetch_client``), which do without the codec.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api_versions import intersect_api_versions, max_api_versions_version, unsupported_version_response
    from .apis import Api, api, api_name, decode_body, encode_body, known_api, known_api_keys
    from .errors import FrameTooLarge, MalformedFrame, ProtocolError, UnsupportedApi
    from .framing import FrameReader, frame
    from .header import (
        RequestHeader,
        encode_response_header,
        parse_request_header,
        reframe,
        response_body_offset,
        response_correlation_id,
        with_request_correlation_id,
        with_response_correlation_id,
    )
    from .requests import expects_response
    from .rewrite import Endpoints, Node, needs_rewrite, parse_endpoints

# Where each name lives.  The package's names load on first use (PEP 562): the archive's tasks import only
# protocol.batch_columns and protocol.fetch_client, and never pay for kafka-python's codec (0.2-0.3 s).
_HOME = {name: module for module, names in {
    "api_versions": ("intersect_api_versions", "max_api_versions_version", "unsupported_version_response"),
    "apis": ("Api", "api", "api_name", "decode_body", "encode_body", "known_api", "known_api_keys"),
    "errors": ("FrameTooLarge", "MalformedFrame", "ProtocolError", "UnsupportedApi"),
    "framing": ("FrameReader", "frame"),
    "header": ("RequestHeader", "encode_response_header", "parse_request_header", "reframe", "response_body_offset",
               "response_correlation_id", "with_request_correlation_id", "with_response_correlation_id"),
    "requests": ("expects_response",),
    "rewrite": ("Endpoints", "Node", "needs_rewrite", "parse_endpoints"),
}.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import _tagged_fields  # noqa: F401 - kafka-python's codec, patched before any message is built

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Api",
    "Endpoints",
    "FrameReader",
    "FrameTooLarge",
    "MalformedFrame",
    "Node",
    "ProtocolError",
    "RequestHeader",
    "UnsupportedApi",
    "api",
    "api_name",
    "decode_body",
    "encode_body",
    "encode_response_header",
    "expects_response",
    "frame",
    "intersect_api_versions",
    "known_api",
    "known_api_keys",
    "max_api_versions_version",
    "needs_rewrite",
    "parse_endpoints",
    "parse_request_header",
    "reframe",
    "response_body_offset",
    "response_correlation_id",
    "unsupported_version_response",
    "with_request_correlation_id",
    "with_response_correlation_id",
]
