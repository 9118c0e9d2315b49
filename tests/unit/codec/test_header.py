"""Request-header peek and response-header bytes, checked against kafka-python's encoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.codec import header, messages
from proxy.codec.errors import CodecError
from tests.unit.codec.kp import KpRequestHeader

# kafka-python 3.0.12 loads its schemas with a deprecated importlib.resources call
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _kp_header(api_key: int, version: int, corr: int, client_id: str | None,
               flexible: bool) -> bytes:
    h = KpRequestHeader(request_api_key=api_key, request_api_version=version,
                        correlation_id=corr, client_id=client_id)
    return bytes(h.encode(flexible=flexible))


@settings(max_examples=60, deadline=None)
@given(api_key=st.sampled_from(sorted(messages.api_keys())), data=st.data(),
       corr=st.integers(-(2**31), 2**31 - 1),
       client_id=st.none() | st.text(max_size=20))
def test_parse_matches_kafka_python(api_key: int, data: st.DataObject, corr: int,
                                    client_id: str | None) -> None:
    lo, hi = messages.supported_versions(api_key)
    version = data.draw(st.integers(lo, hi))
    flexible = messages.request_header_version(api_key, version) == 2
    raw = _kp_header(api_key, version, corr, client_id, flexible)
    frame = raw + b"BODY"
    assert header.peek(frame) == (api_key, version, corr)
    h = header.parse_request_header(frame)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (
        api_key, version, corr, client_id)
    assert h.header_length == len(raw)
    assert header.encode_request_header(api_key, version, corr, client_id) == raw


def test_v2_header_with_tagged_fields_and_memoryview() -> None:
    frame = memoryview(b"\x00\x03\x00\x0c\x00\x00\x00\x2a\x00\x03abc" + b"\x01\x05\x02hi" + b"B")
    h = header.parse_request_header(frame)
    assert h.client_id == "abc"
    assert h.unknown_tagged == {5: b"hi"}
    assert h.header_length == len(frame) - 1


def test_invalid_utf8_client_id_is_replaced() -> None:
    frame = b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x02\xff\xff"
    assert header.parse_request_header(frame).client_id == "\ufffd\ufffd"


def test_forwarded_api_without_full_schema_uses_the_index() -> None:
    # CreateTopics (19) v5 is flexible; only the index knows it
    frame = b"\x00\x13\x00\x05\x00\x00\x00\x01\x00\x01c" + b"\x00" + b"BODY"
    assert header.parse_request_header(frame).header_length == len(frame) - 4
    frame4 = b"\x00\x13\x00\x04\x00\x00\x00\x01\x00\x01c" + b"BODY"
    assert header.parse_request_header(frame4).header_length == len(frame4) - 4
    with pytest.raises(CodecError, match="unknown api key"):
        header.parse_request_header(b"\x7f\x00\x00\x00\x00\x00\x00\x01\xff\xff")


def test_null_client_id() -> None:
    frame = b"\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff"
    assert header.parse_request_header(frame).client_id is None
    assert header.client_id(frame) is None


@pytest.mark.parametrize("frame", [
    b"", b"\x00\x03\x00", b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x09ab",
    b"\x00\x03\x00\x01\x00\x00\x00\x01\xff\xfe", b"\x00\x03\x00\x0c\x00\x00\x00\x01\x00\x00\x05",
])
def test_malformed_headers_raise_codec_error(frame: bytes) -> None:
    with pytest.raises(CodecError):
        header.parse_request_header(frame)


@given(st.binary(max_size=40))
@settings(max_examples=200, deadline=None)
def test_fuzz_header(frame: bytes) -> None:
    try:
        h = header.parse_request_header(frame, flexible=bool(frame[-1:] == b"\x01"))
    except CodecError:
        return
    assert 10 <= h.header_length <= len(frame)


def test_response_headers() -> None:
    assert header.response_header(7, 0) == b"\x00\x00\x00\x07"
    assert header.response_header(7, 1) == b"\x00\x00\x00\x07\x00"
    assert header.response_header_for(18, 3, 7) == b"\x00\x00\x00\x07"  # ApiVersions: v0
    assert header.response_header_for(3, 12, 7) == b"\x00\x00\x00\x07\x00"
    assert header.response_correlation_id(b"\xff\xff\xff\xfe\x00") == -2
    with pytest.raises(CodecError):
        header.response_header(1, 2)
