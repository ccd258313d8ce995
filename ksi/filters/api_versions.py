"""ApiVersions: the broker's answer intersected with what ksi's codec can encode, and an ApiVersions
request newer than ksi knows answered with UNSUPPORTED_VERSION and a v0 body (KIP-511), as Kafka does."""

from __future__ import annotations

import logging

from kafka.protocol.api_key import ApiKey

from protocol import (
    encode_response_header,
    intersect_api_versions,
    max_api_versions_version,
    unsupported_version_response,
)

from ..metrics import CLIENT_ERRORS
from .api import Action, Answer, Filter, Request, Response, Session

__all__ = ["ApiVersionsFilter"]

log = logging.getLogger("ksi.connection")


class ApiVersionsFilter(Filter):
    name = "api-versions"

    def wants_request(self, api_key: int, api_version: int) -> bool:
        return bool(api_key == ApiKey.ApiVersions and api_version > max_api_versions_version())

    def wants_response(self, api_key: int, api_version: int) -> bool:
        return bool(api_key == ApiKey.ApiVersions)

    def on_request(self, request: Request, session: Session) -> Action | None:
        CLIENT_ERRORS.labels("unsupported_version").inc()
        log.info("%s: ApiVersions v%d is newer than ksi's v%d; answering UNSUPPORTED_VERSION", session.description,
                 request.header.api_version, max_api_versions_version())
        return Answer(encode_response_header(0, 0) + unsupported_version_response())

    async def on_response(self, response: Response, session: Session) -> None:
        response.replace_body(intersect_api_versions(bytes(response.body), response.header.api_version))
