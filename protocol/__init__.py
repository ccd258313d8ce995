"""The Kafka wire protocol as ksi needs it, sans-IO: bytes in, values out; no sockets, no trio.

Messages come from kafka-python 3's codec (generated from Kafka's JSON schemas); this package adds
framing, header access, ApiVersions intersection and address rewriting on top of it.
"""

from __future__ import annotations

from . import _tagged_fields

_tagged_fields.install()

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
