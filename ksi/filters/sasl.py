"""SASL observation: the mechanism and the user name a client claims in SaslHandshake/SaslAuthenticate
(never its secret), and the principal once the broker accepts the exchange's last round.  The exchange
itself passes through unchanged: the broker authenticates."""

from __future__ import annotations

import logging

from kafka.protocol.api_key import ApiKey

from protocol import ProtocolError

from .api import Action, Filter, Request, Response, Session

__all__ = ["SaslFilter"]

log = logging.getLogger("ksi.connection")


class SaslFilter(Filter):
    name = "sasl"

    def wants_request(self, api_key: int, api_version: int) -> bool:
        return bool(api_key in (ApiKey.SaslHandshake, ApiKey.SaslAuthenticate))

    def wants_response(self, api_key: int, api_version: int) -> bool:
        return bool(api_key == ApiKey.SaslAuthenticate)

    def on_request(self, request: Request, session: Session) -> Action | None:
        try:
            if request.header.api_key == ApiKey.SaslHandshake:
                session.sasl.handshake(request.message.mechanism)
            else:
                session.sasl.request(bytes(request.message.auth_bytes or b""))
        except ProtocolError:
            pass  # the broker judges the malformed request and answers it
        return None

    async def on_response(self, response: Response, session: Session) -> None:
        if len(response.frame) >= response.offset + 2:
            principal = session.sasl.response(response.error_code())
            if principal is not None:
                log.info("%s: the broker authenticated the client as %s", session.description, principal)
