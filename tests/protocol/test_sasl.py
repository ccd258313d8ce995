"""The principal behind a forwarded SASL exchange: names read from first messages, never secrets kept."""

from __future__ import annotations

import base64
import json

from hypothesis import given
from hypothesis import strategies as st

from protocol.sasl import SaslObserver, certificate_principal, sasl_username


def jwt(claims: dict[str, str]) -> bytes:
    part = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=")
    return b"eyJhbGciOiJSUzI1NiJ9." + part + b".c2ln"


def test_names_from_each_mechanism_first_message() -> None:
    assert sasl_username("PLAIN", b"\x00alice\x00pw") == "alice"
    assert sasl_username("plain", b"admin\x00alice\x00pw") == "admin"          # authzid wins (Kafka: must match)
    assert sasl_username("PLAIN", b"alice-no-separators") is None
    assert sasl_username("SCRAM-SHA-256", b"n,,n=al=2Cice=3D,r=nonce") == "al,ice="
    assert sasl_username("SCRAM-SHA-512", b"n,a=boss,n=alice,r=nonce") == "boss"
    assert sasl_username("SCRAM-SHA-512", b"garbage") is None
    assert sasl_username("OAUTHBEARER", b"n,,\x01auth=Bearer " + jwt({"sub": "svc-reporting"}) + b"\x01\x01") \
        == "svc-reporting"
    assert sasl_username("OAUTHBEARER", b"n,a=carol,\x01auth=Bearer " + jwt({"sub": "x"}) + b"\x01\x01") == "carol"
    assert sasl_username("OAUTHBEARER", b"n,,\x01auth=Bearer not-a-jwt\x01\x01") is None
    assert sasl_username("GSSAPI", b"\x60\x82") is None


def test_principal_only_after_the_brokers_last_yes() -> None:
    scram = SaslObserver()
    scram.handshake("SCRAM-SHA-512")
    scram.request(b"n,,n=alice,r=abc")
    assert scram.response(0) is None and scram.principal is None          # server-first: not a login yet
    scram.request(b"c=biws,r=abcdef,p=proof")
    assert scram.response(0) == "User:alice" == scram.principal

    refused = SaslObserver()
    refused.handshake("PLAIN")
    refused.request(b"\x00mallory\x00guess")
    assert refused.response(58) is None and refused.principal is None

    retried = SaslObserver()                                                # a second exchange starts afresh
    retried.handshake("PLAIN")
    retried.request(b"\x00bob\x00pw")
    assert retried.response(0) == "User:bob"
    assert SaslObserver().response(0) is None                               # no handshake seen: nothing claimed


def test_certificate_subject_as_kafka_names_it() -> None:
    subject = ((("countryName", "GB"),), (("organizationName", "Acme, Ltd"),), (("commonName", "reporting"),))
    assert certificate_principal({"subject": subject}) == "User:CN=reporting,O=Acme\\, Ltd,C=GB"
    assert certificate_principal({}) is None and certificate_principal(None) is None


@given(st.sampled_from(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI", "x"]), st.binary())
def test_any_bytes_give_a_name_or_none(mechanism: str, data: bytes) -> None:
    name = sasl_username(mechanism, data)
    assert name is None or isinstance(name, str)
