"""FrameSplitter: frames come out whole and in order however the stream is chopped; bad
lengths raise FrameError; nothing else escapes."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.frames import FrameError, FrameSplitter, FrameTooLarge, FrameTooSmall


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def collect(splitter: FrameSplitter, chunks: list[bytes]) -> list[bytes]:
    out = []
    for chunk in chunks:
        blob, spans = splitter.feed(chunk)
        out.extend(bytes(blob[a:b]) for a, b in spans)
    return out


def chop(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=300, deadline=None)
@given(payloads=st.lists(st.binary(min_size=0, max_size=300), max_size=20),
       cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_any_chopping_yields_the_same_frames(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    splitter = FrameSplitter(max_frame_bytes=1000)
    assert collect(splitter, chop(stream, cuts)) == payloads
    assert splitter.buffered == 0


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2000),
       cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=10))
def test_garbage_raises_frame_error_or_parses(data: bytes, cuts: list[int]) -> None:
    splitter = FrameSplitter(max_frame_bytes=512, min_frame_bytes=8)
    try:
        frames = collect(splitter, chop(data, cuts))
    except FrameError:
        return
    assert all(8 <= len(f) <= 512 for f in frames)
    assert sum(4 + len(f) for f in frames) + splitter.buffered == len(data)


def test_negative_length_is_rejected() -> None:
    with pytest.raises(FrameTooSmall, match="-1"):
        FrameSplitter(100).feed(struct.pack(">i", -1) + b"xx")


def test_oversized_length_is_rejected_before_the_body_arrives() -> None:
    with pytest.raises(FrameTooLarge, match="exceeds the maximum of 100"):
        FrameSplitter(100).feed(struct.pack(">i", 101))


def test_large_frame_in_many_pieces_is_joined_once() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    splitter = FrameSplitter(max_frame_bytes=2 << 20)
    stream = frame(payload) + frame(b"tail")
    pieces = chop(stream, list(range(0, len(stream), 65536)))
    assert collect(splitter, pieces) == [payload, b"tail"]


@settings(max_examples=100, deadline=None)
@given(small=st.lists(st.binary(max_size=50), max_size=5), big=st.integers(100, 5000),
       cut=st.integers(1, 99))
def test_large_frame_taken_over_by_the_caller(small: list[bytes], big: int, cut: int) -> None:
    """The caller-owned path for large frames yields the same frames as feeding everything."""
    payload = bytes(i % 251 for i in range(big))
    stream = b"".join(frame(p) for p in small) + frame(payload) + frame(b"after")
    head_len = sum(4 + len(p) for p in small) + 4 + min(cut, big)
    splitter = FrameSplitter(max_frame_bytes=10_000)
    blob, spans = splitter.feed(stream[:head_len])
    out = [bytes(blob[a:b]) for a, b in spans]
    size = splitter.incomplete_frame_size
    assert size == 4 + big
    whole = bytearray(size)
    have = splitter.take_incomplete(whole)
    rest = stream[head_len:]
    whole[have:] = rest[: size - have]
    out.append(bytes(whole[4:]))
    blob, spans = splitter.feed(rest[size - have:])
    out += [bytes(blob[a:b]) for a, b in spans]
    assert out == [*small, payload, b"after"]
    assert splitter.buffered == 0
