"""Fuzzing the sans-IO protocol package: any bytes into framing, request header parsing,
``expects_response``, response headers, varints and tagged fields, ApiVersions intersection and address
rewriting give a result or the package's own :class:`protocol.ProtocolError`, never another exception
(see tests/ksi/fuzzing.py for the profiles)."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsResponse

from protocol import (
    FrameReader,
    FrameTooLarge,
    ProtocolError,
    api,
    expects_response,
    intersect_api_versions,
    parse_endpoints,
    parse_request_header,
    response_body_offset,
    response_correlation_id,
)
from protocol.api_versions import MIN_VERSIONS
from protocol.header import read_uvarint, skip_tagged_fields
from protocol.rewrite import REWRITTEN_APIS

from .fakes import FakeBroker, FakeCluster
from .fuzz_target import HISTORY_TOPIC
from .fuzzing import PURE, default_body, examples_run, headers, mutated

__all__ = ["PURE_PROPERTIES"]


@PURE
@given(st.lists(st.binary(max_size=300), max_size=8), st.integers(0, 1 << 20))
def test_frame_reader_returns_frames_or_refuses_the_size(chunks: list[bytes], limit: int) -> None:
    """Any bytes in any chunks: the frames handed out plus what stays buffered are exactly the input."""
    examples_run["pure"] += 1
    reader, out = FrameReader(limit), bytearray()
    wire = b"".join(chunks)
    try:
        for chunk in chunks:
            reader.receive_data(chunk)
            while (f := reader.next_frame()) is not None:
                assert len(f) <= limit
                out += struct.pack(">i", len(f)) + bytes(f)
    except FrameTooLarge as exc:
        assert exc.size < 0 or exc.size > limit
        assert wire[len(out):len(out) + 4] == struct.pack(">i", exc.size)
        return
    assert bytes(out) + wire[len(out):] == wire and reader.buffered == len(wire) - len(out)


@st.composite
def request_bytes(draw: st.DrawFn) -> bytes:
    api_key, version, head = draw(headers())
    tail = draw(st.one_of(st.binary(max_size=100), st.just(default_body(api_key, version)),
                          st.just(default_body(api_key, version)).flatmap(mutated)))
    whole = head + tail
    return whole[:draw(st.integers(0, len(whole)))] if draw(st.booleans()) else whole


@PURE
@given(st.one_of(request_bytes(), st.binary(max_size=200)))
def test_request_header_parsing_gives_a_header_or_a_protocol_error(data: bytes) -> None:
    examples_run["pure"] += 1
    try:
        header = parse_request_header(data)
    except ProtocolError:
        return
    assert (header.api_key, header.api_version, header.correlation_id) == struct.unpack_from(">hhi", data)
    assert header.api_key >= 0 and header.api_version >= 0
    if header.body_offset is not None:
        assert 8 <= header.body_offset <= len(data)
    if api(header.api_key) is None:
        assert header.body_offset is None
        return
    with contextlib.suppress(ProtocolError):
        assert expects_response(data, header) in (True, False)


@PURE
@given(st.binary(max_size=64), st.sampled_from([0, 1]))
def test_response_header_gives_an_offset_or_a_protocol_error(data: bytes, header_version: int) -> None:
    examples_run["pure"] += 1
    try:
        assert response_correlation_id(data) == struct.unpack_from(">i", data)[0]
        offset = response_body_offset(data, header_version)
    except ProtocolError:
        return
    assert 4 <= offset <= len(data)


@PURE
@given(st.binary(max_size=64), st.integers(0, 60))
def test_tagged_fields_and_varints_give_a_position_or_a_protocol_error(data: bytes, pos: int) -> None:
    examples_run["pure"] += 1
    for read in (read_uvarint, skip_tagged_fields):
        try:
            result = read(data, pos)
        except ProtocolError:
            continue
        end = result[1] if isinstance(result, tuple) else result
        assert pos < end <= len(data)


def _responses() -> list[tuple[int, int, bytes]]:
    """Valid broker responses that ksi decodes (ApiVersions, and every API it rewrites), as bodies."""
    cluster = FakeCluster(topics=[HISTORY_TOPIC])
    for node_id, port in ((1, 9092), (2, 9093)):
        cluster.brokers.append(FakeBroker(node_id, cluster, port=port))
    broker = cluster.brokers[0]
    out = []
    for key in sorted(REWRITTEN_APIS) + [18]:
        entry = api(key)
        assert entry is not None
        for version in range(entry.max_version + 1):
            try:
                body = broker.answer(key, version, default_body(key, version))
            except Exception:  # noqa: BLE001 - a version the fake does not answer
                continue
            if body is not None:
                out.append((key, version, body))
    return out


RESPONSES = _responses()


@st.composite
def response_bodies(draw: st.DrawFn) -> tuple[int, int, bytes]:
    key, version, body = draw(st.sampled_from(RESPONSES))
    body = draw(st.one_of(mutated(body), st.integers(0, len(body)).map(lambda n: body[:n]), st.binary(max_size=80)))
    return key, version, body


@PURE
@given(response_bodies())
def test_address_rewriting_gives_endpoints_or_a_protocol_error(case: tuple[int, int, bytes]) -> None:
    """What a broker sends back is decoded by ksi for the APIs that name brokers: bad bytes must be a
    ProtocolError (the connection's caller turns it into one closed client connection)."""
    examples_run["pure"] += 1
    key, version, body = case
    if key == 18:
        try:
            answer = intersect_api_versions(body, version)
        except ProtocolError:
            return
        decoded = ApiVersionsResponse.decode(answer, version=version if answer[:2] == b"\x00\x00" else 0)
        for entry in decoded.api_keys:
            ours = api(entry.api_key)
            assert ours is not None and MIN_VERSIONS.get(entry.api_key, 0) <= entry.min_version
            assert entry.min_version <= entry.max_version <= ours.max_version
        return
    try:
        endpoints = parse_endpoints(key, version, body)
    except ProtocolError:
        return
    if endpoints is not None:
        rewritten = endpoints.encode(lambda node_id: ("127.0.0.1", 40000 + (node_id & 0xFFF)))
        again = parse_endpoints(key, version, rewritten)
        assert again is not None
        assert {(n.node_id, n.host, n.port) for n in again.nodes} == {
            (n.node_id, "127.0.0.1", 40000 + (n.node_id & 0xFFF)) for n in endpoints.nodes}


# The properties scripts/fuzz.py runs round after round.
PURE_PROPERTIES: list[Callable[..., None]] = [
    test_frame_reader_returns_frames_or_refuses_the_size,
    test_request_header_parsing_gives_a_header_or_a_protocol_error,
    test_response_header_gives_an_offset_or_a_protocol_error,
    test_tagged_fields_and_varints_give_a_position_or_a_protocol_error,
    test_address_rewriting_gives_endpoints_or_a_protocol_error,
]
