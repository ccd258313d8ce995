"""The Fetch response walk (protocol.fetch_walk) against kafka-python's encoder, every version it walks: its
steps give back the response's bytes in order, records passed unread, error codes replaced where asked."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import MalformedFrame, encode_body, encode_response_header
from protocol.errors import KAFKA_STORAGE_ERROR, NONE, OFFSET_OUT_OF_RANGE
from protocol.fetch_walk import PASS, READ, WRITE, Replace, first_records_size, walk_fetch_response

from .test_fetch_scan import TOPICS, response

VERSIONS = list(range(4, 16))


def header(version: int) -> bytes:
    return encode_response_header(42, 1 if version >= 12 else 0)


def walked(version: int, frame: bytes, replace: Replace) -> tuple[bytes, list[bytes], int]:
    """What the walk relays of ``frame`` (a response without size prefix): the bytes, the passed parts, and
    how many bytes of the frame it read."""
    walk = walk_fetch_response(version, len(header(version)), replace)
    out, passed, pos = bytearray(), [], 0
    step = next(walk, None)
    while step is not None:
        op, arg = step
        if op == READ:
            if pos + arg > len(frame):
                raise MalformedFrame("read past the end")
            data, pos = frame[pos:pos + arg], pos + arg
            step = walk.send(data)
            continue
        if op == WRITE:
            out += arg
        else:
            assert op == PASS
            if pos + arg > len(frame):
                raise MalformedFrame("records past the end")
            passed.append(frame[pos:pos + arg])
            out += frame[pos:pos + arg]
            pos += arg
        step = next(walk, None)
    return bytes(out), passed, pos


def as_is(topic: str | uuid.UUID, partition: int, error: int) -> int | None:
    return None


@pytest.mark.parametrize("version", VERSIONS)
def test_the_walk_gives_the_response_back_its_records_passed_unread(version: int) -> None:
    topics = [("orders", [(0, NONE, b"abc" * 50, 0), (3, OFFSET_OUT_OF_RANGE, None, 2), (4, NONE, b"", 0)]),
              ("t2", [(1, NONE, b"xyz" * 7, 1)])]
    frame = header(version) + encode_body(response(version, topics), version)
    out, passed, read = walked(version, frame, as_is)
    assert out == frame and read == len(frame)
    assert passed == [b"abc" * 50, b"xyz" * 7]  # only records are passed, never a field


@pytest.mark.parametrize("version", VERSIONS)
def test_an_error_code_is_replaced_before_its_partition_goes_on(version: int) -> None:
    topics = [("orders", [(0, NONE, b"a" * 100, 0), (3, OFFSET_OUT_OF_RANGE, None, 1)]),
              ("t2", [(3, OFFSET_OUT_OF_RANGE, None, 0)])]
    asked: list[tuple[object, int, int]] = []
    orders = "orders" if version < 13 else uuid.uuid5(uuid.NAMESPACE_DNS, "orders")

    def replace(topic: str | uuid.UUID, partition: int, error: int) -> int | None:
        asked.append((topic, partition, error))
        return KAFKA_STORAGE_ERROR if topic == orders and error == OFFSET_OUT_OF_RANGE else None

    frame = header(version) + encode_body(response(version, topics), version)
    out, _, _ = walked(version, frame, replace)
    want = [("orders", [(0, NONE, b"a" * 100, 0), (3, KAFKA_STORAGE_ERROR, None, 1)]),
            ("t2", [(3, OFFSET_OUT_OF_RANGE, None, 0)])]
    assert out == header(version) + encode_body(response(version, want), version)
    t2 = "t2" if version < 13 else uuid.uuid5(uuid.NAMESPACE_DNS, "t2")
    assert asked == [(orders, 0, NONE), (orders, 3, OFFSET_OUT_OF_RANGE), (t2, 3, OFFSET_OUT_OF_RANGE)]


@settings(max_examples=60, deadline=None)
@given(version=st.sampled_from(VERSIONS), topics=TOPICS, cut=st.integers(1, 40))
def test_any_response_walks_whole_and_a_cut_one_is_refused(version: int, topics: list, cut: int) -> None:
    frame = header(version) + encode_body(response(version, topics), version)
    out, _, read = walked(version, frame, as_is)
    assert out == frame and read == len(frame)
    short = frame[:max(len(frame) - cut, 0)]
    with pytest.raises(MalformedFrame):
        walked(version, short, as_is)


def test_versions_outside_the_walk_are_refused() -> None:
    for version in (3, 16, 17):
        with pytest.raises(ValueError, match=f"Fetch v{version}"):
            next(walk_fetch_response(version, 4, as_is))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_first_records_size_is_read_from_a_head(version: int) -> None:
    """What a relay asks before it walks a response: the size of its first partition's records with any."""
    topics = [("orders", [(3, OFFSET_OUT_OF_RANGE, None, 2), (0, NONE, b"a" * 5000, 1)]), ("t2", [(1, NONE, b"b", 0)])]
    frame = header(version) + encode_body(response(version, topics), version)
    assert first_records_size(frame, version, len(header(version))) == 5000
    cut = frame.index(b"a" * 5000)
    assert first_records_size(frame[:cut], version, len(header(version))) == 5000  # the head reaches its size
    assert first_records_size(frame[:cut - 5], version, len(header(version))) is None
    empty = header(version) + encode_body(response(version, [("orders", [(3, NONE, None, 0)])]), version)
    assert first_records_size(empty, version, len(header(version))) is None
