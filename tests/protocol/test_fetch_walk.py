"""The Fetch response walker (protocol/fetch_walk.py) against kafka-python's encoder, v4-v18 (the history filter
walks v4+):
fed in pieces of any size, with records taken or passed unread, it gives back the body byte for byte, but
for the error codes of the partitions ``wanted`` took, and refuses a body that does not end where its size
says."""

from __future__ import annotations

import random
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import MalformedFrame, encode_body
from protocol.errors import NONE, OFFSET_OUT_OF_RANGE
from protocol.fetch_walk import DONE, NEED, RECORDS, SEND, FetchWalk

from .test_fetch_scan import VERSIONS, response


def walk_through(walk: FetchWalk, body: bytes, rng: random.Random, pass_unread: bool = True) -> tuple[bytes, int]:
    """Drive ``walk`` over ``body`` as a relay would: pieces of random sizes, records sometimes passed unread
    (copied from ``body`` here, as splice would move them).  Returns what reached the client and the bytes
    passed unread."""
    out = bytearray()
    fed = 0     # body bytes handed to the walk or passed unread
    unread = 0
    while True:
        kind, n = walk.next()
        if kind == SEND:
            out += walk.take(n)
        elif kind == RECORDS and walk.buffered:
            out += walk.take(min(n, walk.buffered, rng.randint(1, n)))
        elif kind == RECORDS and pass_unread and rng.random() < 0.7:
            out += body[fed:fed + n]
            fed += n
            unread += n
            walk.passed(n)
        elif kind in (NEED, RECORDS):
            assert fed < len(body), "the walk wants bytes past the body"
            piece = rng.randint(1, 40)
            walk.feed(body[fed:fed + piece])
            fed += len(body[fed:fed + piece])
        else:
            assert kind == DONE
            return bytes(out), unread


def body_of(version: int, topics: list) -> bytes:
    return bytes(encode_body(response(version, topics), version))


@pytest.mark.parametrize("version", VERSIONS)
def test_a_response_walks_back_byte_for_byte_and_wanted_partitions_lose_their_error(version: int) -> None:
    topics = [("orders", [(0, NONE, b"a" * 3000, 0), (1, OFFSET_OUT_OF_RANGE, None, 0), (2, NONE, b"", 2)]),
              ("other", [(7, OFFSET_OUT_OF_RANGE, b"", 1), (8, NONE, b"b" * 500, 0)])]
    body = body_of(version, topics)
    asked: list[tuple[object, int]] = []

    def wanted(topic: object, partition: int) -> bool:
        asked.append((topic, partition))
        return topic in ("orders", uuid.uuid5(uuid.NAMESPACE_DNS, "orders"))

    walk = FetchWalk(version, len(body), OFFSET_OUT_OF_RANGE, wanted)
    got, _ = walk_through(walk, body, random.Random(version))
    orders = "orders" if version < 13 else uuid.uuid5(uuid.NAMESPACE_DNS, "orders")
    other = "other" if version < 13 else uuid.uuid5(uuid.NAMESPACE_DNS, "other")
    assert asked == [(orders, 1), (other, 7)]
    assert walk.patched == [(orders, 1)]
    patched = [(i, NONE if i == 1 else e, r, a) for i, e, r, a in topics[0][1]]
    assert got == body_of(version, [("orders", patched), topics[1]])


@settings(max_examples=80, deadline=None)
@given(version=st.sampled_from(VERSIONS),
       topics=st.lists(st.tuples(st.text(min_size=1, max_size=8),
                                 st.lists(st.tuples(st.integers(0, 99), st.sampled_from([NONE, 1, OFFSET_OUT_OF_RANGE]),
                                                    st.one_of(st.none(), st.binary(max_size=300)),
                                                    st.integers(0, 3)), max_size=4)), max_size=4),
       seed=st.integers(0, 1000))
def test_any_response_walks_back_whole_however_it_arrives(version: int, topics: list, seed: int) -> None:
    body = body_of(version, topics)
    walk = FetchWalk(version, len(body), OFFSET_OUT_OF_RANGE, lambda topic, partition: False)
    got, unread = walk_through(walk, body, random.Random(seed))
    assert got == body
    assert walk.patched == []
    assert unread <= sum(len(r or b"") for _, ps in topics for _, _, r, _ in ps)


@pytest.mark.parametrize("version", [4, 12, 13])
def test_a_body_that_does_not_end_where_its_size_says_is_refused(version: int) -> None:
    body = body_of(version, [("orders", [(0, NONE, b"x" * 100, 1), (1, NONE, b"y" * 50, 0)])])
    for cut in (1, 30, 60):  # a size short of the fields: the walk refuses to wait for bytes past it
        walk = FetchWalk(version, len(body) - cut, OFFSET_OUT_OF_RANGE, lambda topic, partition: False)
        with pytest.raises(MalformedFrame):
            walk_through(walk, body[:-cut], random.Random(cut), pass_unread=False)
    for extra in (1, 200):  # bytes after the last field
        padded = body + bytes(extra)
        walk = FetchWalk(version, len(padded), OFFSET_OUT_OF_RANGE, lambda topic, partition: False)
        with pytest.raises(MalformedFrame, match="trailing"):
            walk_through(walk, padded, random.Random(extra), pass_unread=False)
    walk = FetchWalk(version, len(body), OFFSET_OUT_OF_RANGE, lambda topic, partition: False)
    with pytest.raises(MalformedFrame, match="past its size"):
        walk.feed(body + b"\x00")


def test_records_that_run_past_the_body_are_refused_before_any_is_passed() -> None:
    body = bytearray(body_of(12, [("orders", [(0, NONE, b"x" * 100, 0)])]))
    at = body.index(b"x" * 100) - 1  # the records' length (compact: n + 1 in one varint byte)
    body[at] = 120
    walk = FetchWalk(12, len(body), OFFSET_OUT_OF_RANGE, lambda topic, partition: False)
    walk.feed(body[:at + 1])
    with pytest.raises(MalformedFrame, match="run past"):
        while walk.next()[0] == SEND:
            walk.take(walk.next()[1])
