"""Every vendored message, every version: encode -> decode -> encode is stable and lossless."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.codec import messages
from tests.unit.codec.strategies import ALL_KEYS, examples, message_values, project, versions

CASES = [(k, r) for k in ALL_KEYS for r in (False, True)]


@pytest.mark.parametrize(("api_key", "response"), CASES)
@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_roundtrip(api_key: int, response: bool, data: st.DataObject) -> None:
    version = data.draw(versions(api_key, response), label="version")
    value = data.draw(message_values(api_key, version, response), label="value")
    enc = messages.encode_response if response else messages.encode_request
    dec = messages.decode_response if response else messages.decode_request
    if api_key == 18 and response:
        value["error_code"] = 0  # error responses are read as v0: test_apiversions covers them
    wire = enc(api_key, version, value)
    got, end = dec(api_key, version, wire)
    assert end == len(wire)
    s = messages.schema(api_key, response).struct
    assert project(got, s, version) == project(value, s, version)
    assert enc(api_key, version, got) == wire


@pytest.mark.parametrize(("api_key", "response"), CASES)
def test_decode_at_offset_and_memoryview(api_key: int, response: bool) -> None:
    valid = messages.schema(api_key, response).valid
    lo, hi = valid.lo, valid.hi
    for version in (lo, hi):
        wire = (messages.encode_response if response else messages.encode_request)(
            api_key, version, {})
        framed = memoryview(b"\x01\x02\x03" + wire + b"\xee")
        dec = messages.decode_response if response else messages.decode_request
        value, end = dec(api_key, version, framed, 3)
        assert end == 3 + len(wire)
        assert value == dec(api_key, version, wire)[0]
