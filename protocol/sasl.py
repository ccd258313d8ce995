"""Who a client is, as its broker decided: the principal behind a SASL exchange ksi forwards, sans-IO.

ksi never authenticates anyone.  SaslHandshake and SaslAuthenticate go to the broker on the client's own
upstream connection and the broker decides.  ksi only watches the exchange so it knows the principal
once the broker accepted it, for the one decision the broker cannot make: which clients may read a
lake-only topic (a topic the cluster does not have).  The name is read from the client's first message:

* PLAIN: ``[authzid] NUL authcid NUL password``; the principal is the authzid when given, else the
  authcid (Kafka's PLAIN server refuses an authzid that differs from the authcid).
* SCRAM-SHA-256/512: client-first-message ``n,[a=authzid],n=username,r=nonce`` (RFC 5802; ``=2C`` and
  ``=3D`` unescaped).
* OAUTHBEARER: GS2 header ``n,a=authzid,`` then ``auth=Bearer <JWT>``; the authzid, else the JWT's ``sub``
  claim (read, not verified: the broker verified the token or the exchange fails).

Passwords, proofs and tokens are never kept: :meth:`SaslObserver.request` returns only the name.  The
principal is set when the broker answers the exchange's last round (one round for PLAIN and OAUTHBEARER,
two for SCRAM) with error 0.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["ANONYMOUS", "SaslObserver", "certificate_principal", "sasl_username"]

ANONYMOUS = "User:ANONYMOUS"
_ROUNDS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}


def _scram_unescape(value: str) -> str:
    return value.replace("=2C", ",").replace("=3D", "=")


def _jwt_subject(token: str) -> str | None:
    parts = token.split(".")
    if len(parts) < 2:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError):
        return None
    subject = claims.get("sub") if isinstance(claims, dict) else None
    return subject if isinstance(subject, str) and subject else None


def sasl_username(mechanism: str, first_message: bytes) -> str | None:
    """The user name a client's first SASL message claims, or None when it names none (or is malformed)."""
    try:
        text = first_message.decode("utf-8")
    except UnicodeDecodeError:
        return None
    mechanism = mechanism.upper()
    if mechanism == "PLAIN":
        parts = text.split("\x00")
        if len(parts) != 3:
            return None
        return parts[0] or parts[1] or None
    if mechanism.startswith("SCRAM-"):
        fields = text.split(",")
        if len(fields) < 4 or (fields[0] not in ("n", "y") and not fields[0].startswith("p=")):
            return None
        if fields[1].startswith("a=") and len(fields[1]) > 2:
            return _scram_unescape(fields[1][2:])
        name = fields[2]
        return _scram_unescape(name[2:]) if name.startswith("n=") and len(name) > 2 else None
    if mechanism == "OAUTHBEARER":
        header, _, rest = text.partition("\x01")
        gs2 = header.split(",")
        authzid = next((f[2:] for f in gs2 if f.startswith("a=") and len(f) > 2), None)
        if authzid:
            return _scram_unescape(authzid)
        for item in rest.split("\x01"):
            key, _, value = item.partition("=")
            if key == "auth" and value.lower().startswith("bearer "):
                return _jwt_subject(value[7:].strip())
        return None
    return None  # GSSAPI and others: the name is not in the first message; such clients stay anonymous here


_RDN_NAMES = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
              "stateOrProvinceName": "ST", "localityName": "L", "domainComponent": "DC", "streetAddress": "STREET",
              "userId": "UID"}


def certificate_principal(peer_certificate: Mapping[str, Any] | None) -> str | None:
    """Kafka's default principal for a TLS client certificate: ``User:`` + the subject as an RFC 2253
    name (most specific part first, like Java's X500Principal.getName()), from ``SSLObject.getpeercert()``."""
    if not peer_certificate or not peer_certificate.get("subject"):
        return None
    parts = []
    for rdn in reversed(peer_certificate["subject"]):
        parts.append("+".join(f"{_RDN_NAMES.get(key, key)}={_rfc2253_escape(value)}" for key, value in rdn))
    return "User:" + ",".join(parts)


def _rfc2253_escape(value: str) -> str:
    escaped = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
    if escaped[:1] in ("#", " "):
        escaped = "\\" + escaped
    if escaped.endswith(" "):
        escaped = escaped[:-1] + "\\ "
    return escaped


class SaslObserver:
    """Follows one connection's SASL exchange: feed it the requests and the broker's answers."""

    def __init__(self) -> None:
        self.principal: str | None = None  # "User:NAME" once the broker accepted the exchange
        self._mechanism: str | None = None
        self._claimed: str | None = None
        self._rounds = 0

    def handshake(self, mechanism: str) -> None:
        self._mechanism, self._claimed, self._rounds = mechanism.upper(), None, 0

    def request(self, auth_bytes: bytes) -> None:
        """A SaslAuthenticate request: remember the name its first message claims, nothing else."""
        if self._mechanism is not None and self._rounds == 0 and self._claimed is None:
            self._claimed = sasl_username(self._mechanism, auth_bytes)

    def response(self, error_code: int) -> str | None:
        """The broker's SaslAuthenticate answer; returns the new principal when the exchange succeeded."""
        if self._mechanism is None:
            return None
        if error_code != 0:
            self._mechanism, self._claimed, self._rounds = None, None, 0
            return None
        self._rounds += 1
        if self._rounds < _ROUNDS.get(self._mechanism, 1):
            return None
        claimed, self._mechanism = self._claimed, None
        if claimed is None:
            return None
        self.principal = f"User:{claimed}"
        return self.principal
