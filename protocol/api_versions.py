"""ApiVersions: what ksi tells a client it may use.

The broker's answer is intersected with what ksi's codec can decode and encode, because ksi rewrites
or answers some of those messages itself.  A client asking with an ApiVersions version newer than ksi
knows gets UNSUPPORTED_VERSION with a v0 body listing the ApiVersions range ksi does support (KIP-511),
so it can retry with an older one.
"""

from __future__ import annotations

from kafka.protocol.api_key import ApiKey
from kafka.protocol.metadata import ApiVersionsResponse

from . import _tagged_fields  # noqa: F401 - kafka-python's codec keeps unknown tagged fields
from .apis import api, decode_body, encode_body
from .errors import UNSUPPORTED_VERSION

__all__ = ["MIN_VERSIONS", "intersect_api_versions", "max_api_versions_version", "unsupported_version_response"]

# Floors that ksi imposes on top of the broker's ranges.
#  - SaslHandshake v0 is followed by raw, unframed SASL tokens that cannot be told apart from Kafka
#    frames; v1 wraps them in SaslAuthenticate requests, which pass through like any other request.
MIN_VERSIONS: dict[int, int] = {ApiKey.SaslHandshake: 1}

# Per-API ceilings below the codec's own maximum (none today; kept as the one place to put them).
MAX_VERSIONS: dict[int, int] = {}


def max_api_versions_version() -> int:
    entry = api(ApiKey.ApiVersions)
    assert entry is not None
    return entry.max_version


def _ksi_range(api_key: int) -> tuple[int, int] | None:
    entry = api(api_key)
    if entry is None:
        return None
    return MIN_VERSIONS.get(api_key, entry.min_version), MAX_VERSIONS.get(api_key, entry.max_version)


def intersect_api_versions(body: bytes, version: int) -> bytes:
    """Rewrite a broker's ApiVersions response body to the ranges ksi can handle.

    Keys ksi does not know are dropped, so clients never send them; a key whose ranges do not
    overlap is dropped too.  Unknown tagged fields and features are kept as the broker sent them.
    """
    message = decode_body(ApiVersionsResponse, version, body)
    if message.error_code != 0:
        version = 0  # error responses are always v0 bodies
    kept = []
    for entry in message.api_keys:
        ours = _ksi_range(entry.api_key)
        if ours is None:
            continue
        low, high = max(entry.min_version, ours[0]), min(entry.max_version, ours[1])
        if low > high:
            continue
        entry.min_version, entry.max_version = low, high
        kept.append(entry)
    message.api_keys = kept
    return encode_body(message, version)


def unsupported_version_response() -> bytes:
    """The v0 body answering an ApiVersions request newer than ksi's codec."""
    message = ApiVersionsResponse(
        version=0,
        error_code=UNSUPPORTED_VERSION,
        api_keys=[ApiVersionsResponse.ApiVersion(version=0, api_key=int(ApiKey.ApiVersions), min_version=0,
                                                 max_version=max_api_versions_version())],
    )
    return encode_body(message, 0)
