from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import FrameReader, FrameTooLarge, frame


def frames_of(data: bytes, limit: int = 1 << 20, step: int | None = None) -> list[bytes]:
    reader = FrameReader(limit)
    out = []
    chunks = [data] if step is None else [data[i:i + step] for i in range(0, len(data), step)]
    for chunk in chunks:
        reader.receive_data(chunk)
        while (f := reader.next_frame()) is not None:
            out.append(f)
    return out


def test_whole_buffer_byte_by_byte_and_trailing_bytes() -> None:
    payloads = [b"", b"a", b"hello world" * 50]
    wire = b"".join(frame(p) for p in payloads)
    assert frames_of(wire) == payloads
    assert frames_of(wire, step=1) == payloads
    reader = FrameReader(1024)
    reader.receive_data(wire + b"\x00\x00")
    got = []
    while (f := reader.next_frame()) is not None:
        got.append(f)
    assert got == payloads
    assert reader.buffered == 2  # a partial size prefix stays buffered


def test_oversized_frame_refused_before_its_body_arrives() -> None:
    reader = FrameReader(100)
    reader.receive_data(struct.pack(">i", 101))
    with pytest.raises(FrameTooLarge) as info:
        reader.next_frame()
    assert info.value.size == 101 and info.value.limit == 100


def test_negative_size_is_refused() -> None:
    reader = FrameReader(100)
    reader.receive_data(struct.pack(">i", -5))
    with pytest.raises(FrameTooLarge):
        reader.next_frame()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=10), st.integers(min_value=1, max_value=64))
def test_round_trip_any_split(payloads: list[bytes], step: int) -> None:
    wire = b"".join(frame(p) for p in payloads)
    assert frames_of(wire, step=step) == payloads


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=2000))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    reader = FrameReader(512)
    reader.receive_data(data)
    try:
        while reader.next_frame() is not None:
            pass
    except FrameTooLarge:
        pass


def test_large_frame_filling_the_buffer_is_handed_out_without_a_copy() -> None:
    payload = bytes(range(256)) * 1024  # 256 KiB
    reader = FrameReader(1 << 20)
    reader.receive_data(frame(payload))
    got = reader.next_frame()
    assert isinstance(got, memoryview) and got == payload
    assert reader.buffered == 0 and reader.next_frame() is None
    reader.receive_data(frame(b"next"))
    assert reader.next_frame() == b"next"


@given(st.lists(st.binary(max_size=300), max_size=6), st.integers(1, 64))
@settings(max_examples=200)
def test_next_sized_gives_each_frame_with_its_prefix_in_any_chunking(payloads: list[bytes], step: int) -> None:
    wire = b"".join(frame(p) for p in payloads)
    for chunks in ([wire], [wire[i:i + step] for i in range(0, len(wire), step)]):
        reader, out = FrameReader(1 << 20), []
        for chunk in chunks:
            reader.receive_data(chunk)
            while (f := reader.next_sized()) is not None:
                out.append(f)
        assert [bytes(f) for f in out] == [frame(p) for p in payloads]
        assert reader.buffered == 0
        for f in out:  # each is a buffer of its own: patching one leaves the others as they were
            f[0:4] = b"\xff\xff\xff\xff"
        assert [bytes(f[4:]) for f in out] == payloads


def test_next_sized_keeps_trailing_bytes_and_refuses_oversized_frames() -> None:
    reader = FrameReader(8)
    reader.receive_data(frame(b"abc") + b"\x00\x00")
    assert reader.next_sized() == bytearray(frame(b"abc"))
    assert reader.next_sized() is None and reader.buffered == 2
    reader.receive_data(b"\x00\x09")
    with pytest.raises(FrameTooLarge):
        reader.next_sized()


def test_next_sized_copies_the_smaller_side_and_hands_out_whole_frames() -> None:
    big, small = bytes(range(256)) * 400, b"next"
    wire = frame(big) + frame(small) + frame(big)
    for cut in (len(frame(big)) + 3, len(frame(big)) + 20, len(frame(big)) + len(frame(small)) + 5000):
        reader = FrameReader(1 << 20)
        reader.receive_data(wire[:cut])
        first = reader.next_sized()
        assert first == frame(big)
        reader.receive_data(wire[cut:])
        assert reader.next_sized() == frame(small) and reader.next_sized() == frame(big)
        assert reader.next_sized() is None and reader.buffered == 0
        first[4:8] = b"\xff\xff\xff\xff"  # a frame handed out is the caller's to patch: the reader is unaffected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=3000), max_size=8), st.integers(min_value=1, max_value=5000))
def test_next_sized_round_trip_any_split(payloads: list[bytes], step: int) -> None:
    wire = b"".join(frame(p) for p in payloads)
    reader = FrameReader(1 << 20)
    got = []
    for i in range(0, len(wire), step):
        reader.receive_data(wire[i:i + step])
        while (f := reader.next_sized()) is not None:
            got.append(bytes(f))
    assert got == [frame(p) for p in payloads] and reader.buffered == 0


def test_a_partial_frame_is_taken_with_the_count_still_to_come() -> None:
    """take_partial: a large frame's first bytes go to the caller (which splices the rest on), and the reader
    starts afresh with what the stream brings after the frame."""
    reader = FrameReader(1 << 20)
    reader.receive_data(frame(b"x" * 10) + frame(b"y" * 1000)[:300])
    assert reader.next_sized() == bytearray(frame(b"x" * 10))
    assert reader.next_sized() is None
    assert reader.partial_size == 1000 and bytes(reader.peek()) == frame(b"y" * 1000)[:300]
    head, rest = reader.take_partial()
    assert bytes(head) == frame(b"y" * 1000)[:300] and rest == 704
    assert reader.buffered == 0 and reader.partial_size is None
    reader.receive_data(frame(b"z"))
    assert reader.next_frame() == b"z"
