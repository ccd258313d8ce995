from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from protocol import (
    MalformedFrame,
    ProtocolError,
    expects_response,
    parse_request_header,
    response_correlation_id,
    with_request_correlation_id,
    with_response_correlation_id,
)


def encoded(request, version: int, correlation_id: int = 7, client_id: str | None = "cli") -> bytes:
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(version=version, header=True))


@pytest.mark.parametrize("version", [1, 4, 9, 12])
def test_request_header_flexible_and_not(version: int) -> None:
    data = encoded(MetadataRequest(version=version, topics=[]), version)
    header = parse_request_header(data)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (3, version, 7, "cli")
    assert header.flexible == (version >= 9)
    body = MetadataRequest.decode(data[header.body_offset:], version=version)
    assert body.topics == []


def test_null_client_id_and_unknown_api_key() -> None:
    data = encoded(ApiVersionsRequest(version=0), 0, client_id=None)
    assert parse_request_header(data).client_id is None
    unknown = b"\x00\x44\x00\x00" + data[4:]  # api key 68: not in ksi's codec
    header = parse_request_header(unknown)
    assert header.api_key == 68 and header.body_offset is None


def test_correlation_id_patching_touches_only_those_bytes() -> None:
    data = encoded(FetchRequest(version=12, max_wait_ms=1, min_bytes=1, topics=[]), 12, correlation_id=1)
    patched = with_request_correlation_id(data, 99)
    assert parse_request_header(patched).correlation_id == 99
    assert patched[:4] == data[:4] and patched[8:] == data[8:]
    response = b"\x00\x00\x00\x05rest"
    assert response_correlation_id(with_response_correlation_id(response, 42)) == 42


@pytest.mark.parametrize("version,acks", [(2, 0), (3, 0), (3, -1), (9, 0), (9, 1), (11, -1)])
def test_produce_acks(version: int, acks: int) -> None:
    request = ProduceRequest(version=version, transactional_id="tx" if version >= 3 else None, acks=acks,
                             timeout_ms=1000, topic_data=[])
    data = encoded(request, version)
    assert expects_response(data, parse_request_header(data)) == (acks != 0)


def test_truncated_headers_are_malformed() -> None:
    data = encoded(MetadataRequest(version=9, topics=[]), 9)
    for cut in range(12):
        with pytest.raises(MalformedFrame):
            parse_request_header(data[:cut])


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=200))
def test_random_request_bytes_raise_protocol_errors_only(data: bytes) -> None:
    try:
        header = parse_request_header(data)
        expects_response(data, header)
    except ProtocolError:
        pass
