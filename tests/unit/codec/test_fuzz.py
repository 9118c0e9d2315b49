"""Hostile input: every decoder either decodes or raises CodecError, nothing else.

Random bytes, and mutations (truncation, flips, insertions, deletions, huge or negative
lengths) of valid encodings, for every vendored message and direction.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.codec import messages
from proxy.codec.errors import CodecError
from tests.unit.codec.strategies import ALL_KEYS, examples, message_values, mutations, versions

CASES = [(k, r) for k in ALL_KEYS for r in (False, True)]


def _decode(api_key: int, response: bool, version: int, data: bytes) -> None:
    dec = messages.decode_response if response else messages.decode_request
    try:
        value, end = dec(api_key, version, data)
    except CodecError:
        return
    assert 0 <= end <= len(data)
    assert isinstance(value, dict)


@pytest.mark.parametrize(("api_key", "response"), CASES)
@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_bytes(api_key: int, response: bool, data: st.DataObject) -> None:
    version = data.draw(versions(api_key, response))
    _decode(api_key, response, version, data.draw(st.binary(max_size=64)))


@pytest.mark.parametrize(("api_key", "response"), CASES)
@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_messages(api_key: int, response: bool, data: st.DataObject) -> None:
    version = data.draw(versions(api_key, response))
    value = data.draw(message_values(api_key, version, response, max_list=2))
    enc = messages.encode_response if response else messages.encode_request
    wire = enc(api_key, version, value)
    _decode(api_key, response, version, data.draw(mutations(wire)))


@pytest.mark.parametrize("length", [b"\x7f\xff\xff\xff", b"\x10\x00\x00\x00", b"\xff\xff\xff\xfe"])
def test_absurd_array_count_is_rejected_before_allocating(length: bytes) -> None:
    # Metadata v1 response: brokers array count comes first.
    with pytest.raises(CodecError, match=r"array|negative"):
        messages.decode_response(3, 1, length + b"\x00" * 16)


def test_absurd_compact_count_is_rejected() -> None:
    # Metadata v12 response: throttle int32, then compact brokers count (uvarint 2**31).
    with pytest.raises(CodecError, match="array"):
        messages.decode_response(3, 12, b"\x00\x00\x00\x00" + b"\x80\x80\x80\x80\x08" + b"\x00")


def test_overlong_varint_is_rejected() -> None:
    with pytest.raises(CodecError, match="varint"):
        messages.decode_response(3, 12, b"\x00\x00\x00\x00" + b"\xff" * 6)


def test_string_longer_than_buffer() -> None:
    # JoinGroup v0 request: group_id int16 length 200, 3 bytes present.
    with pytest.raises(CodecError, match="string"):
        messages.decode_request(11, 0, b"\x00\xc8abc")


def test_negative_string_length() -> None:
    with pytest.raises(CodecError, match="negative string length"):
        messages.decode_request(11, 0, b"\xff\xf0abc")


def test_invalid_utf8_is_replaced_like_kafka_does() -> None:
    # Heartbeat v0: group_id of 2 invalid bytes; Java's String(bytes, UTF_8) yields U+FFFD.
    got, _ = messages.decode_request(12, 0, b"\x00\x02\xff\xfe" + b"\x00" * 20)
    assert got["group_id"] == "\ufffd\ufffd"
    with pytest.raises(CodecError):
        messages.encode_request(12, 0, {"group_id": "\ud800"})  # lone surrogate


def test_unknown_version_and_api() -> None:
    with pytest.raises(CodecError, match="not supported"):
        messages.decode_request(3, 99, b"")
    with pytest.raises(CodecError, match="no schema"):
        messages.decode_request(9999, 0, b"")


def test_encode_errors_are_codec_errors() -> None:
    with pytest.raises(CodecError):
        messages.encode_request(12, 0, {"group_id": None})  # not nullable
    with pytest.raises(CodecError):
        messages.encode_request(12, 0, {"generation_id": 2**40})  # int32 overflow
    with pytest.raises(CodecError):
        messages.encode_request(12, 0, {"group_id": 5})
    with pytest.raises(CodecError):
        messages.encode_request(12, 0, [])  # type: ignore[arg-type]


def test_strided_buffer_is_accepted() -> None:
    from proxy.codec import messages

    body = messages.encode_request(12, 0, {"group_id": "g", "generation_id": 1, "member_id": "m"})
    doubled = bytes(b for byte in body for b in (byte, 0))
    strided = memoryview(doubled)[::2]
    assert not strided.contiguous
    assert messages.decode_request(12, 0, strided)[0]["group_id"] == "g"
