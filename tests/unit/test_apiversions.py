"""ApiVersions: what the client is told, and the KIP-511 answer to a too-new request."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import apiversions
from proxy.codec import messages
from proxy.codec.compiler import UNKNOWN_TAGGED
from tests.unit.codec.kp import KpApiVersionsResponse

# kafka-python 3.0.12 loads its schemas with a deprecated importlib.resources call
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def broker_response() -> dict[str, object]:
    return {
        "error_code": 0,
        "api_keys": [
            {"api_key": 0, "min_version": 0, "max_version": 11},   # Produce: forwarded < v10
            {"api_key": 3, "min_version": 0, "max_version": 99},   # Metadata: capped
            {"api_key": 8, "min_version": 0, "max_version": 9},    # OffsetCommit: 2-9
            {"api_key": 22, "min_version": 0, "max_version": 5},   # InitProducerId: forwarded
            {"api_key": 47, "min_version": 3, "max_version": 4},   # OffsetDelete: empty -> gone
            {"api_key": 68, "min_version": 0, "max_version": 0},   # replaced by the proxy's
        ],
        "throttle_time_ms": 0,
        "supported_features": [{"name": "group.version", "min_version": 0, "max_version": 1}],
        "finalized_features_epoch": 7,
        "finalized_features": [],
        "zk_migration_ready": False,
        UNKNOWN_TAGGED: {42: b"x"},
    }


def test_client_view() -> None:
    broker = broker_response()
    before = copy.deepcopy(broker)
    view = apiversions.client_view(broker, apiversions.default_parse_table(),
                                   served={68: (0, 1), 69: (0, 1)})
    assert broker == before  # input untouched
    ranges = {e["api_key"]: (e["min_version"], e["max_version"]) for e in view["api_keys"]}
    assert ranges == {0: (0, 11), 3: (0, 13), 8: (2, 9), 22: (0, 5), 68: (0, 1), 69: (0, 1)}
    assert view["supported_features"] == broker["supported_features"]
    assert view["finalized_features_epoch"] == 7
    assert view[UNKNOWN_TAGGED] == {42: b"x"}
    wire = messages.encode_response(18, 3, view)
    assert messages.decode_response(18, 3, wire)[0]["api_keys"] == view["api_keys"]


ranges = st.tuples(st.integers(0, 20), st.integers(0, 20)).map(sorted).map(tuple)


@settings(max_examples=100, deadline=None)
@given(broker=st.dictionaries(st.integers(0, 80), ranges, max_size=12),
       parse=st.dictionaries(st.integers(0, 80), ranges, max_size=12),
       served=st.dictionaries(st.integers(60, 80), ranges, max_size=3))
def test_intersection_properties(broker: dict[int, tuple[int, int]],
                                 parse: dict[int, tuple[int, int]],
                                 served: dict[int, tuple[int, int]]) -> None:
    resp = {"error_code": 0, "api_keys": [
        {"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in broker.items()]}
    view = apiversions.client_view(resp, parse, served)
    got = {e["api_key"]: (e["min_version"], e["max_version"]) for e in view["api_keys"]}
    assert [e["api_key"] for e in view["api_keys"]] == sorted(got)
    for k, r in served.items():
        assert got[k] == r
    for k, (lo, hi) in broker.items():
        if k in served:
            continue
        if k in parse:
            plo, phi = parse[k]
            if max(lo, plo) <= min(hi, phi):
                assert got[k] == (max(lo, plo), min(hi, phi))
            else:
                assert k not in got
        else:
            assert got[k] == (lo, hi)
    assert set(got) <= set(broker) | set(served)


def test_default_parse_table_comes_from_the_schemas() -> None:
    table = apiversions.default_parse_table()
    assert table[3] == messages.supported_versions(3)
    assert table[10] == messages.supported_versions(10)
    assert table[0] == (0, messages.supported_versions(0)[1])  # Produce below v10 is opaque
    assert table[1] == (0, messages.supported_versions(1)[1])
    assert 22 not in table  # InitProducerId is only forwarded


def test_kip511_answer() -> None:
    lo, hi = messages.supported_versions(18)
    assert apiversions.is_too_new(hi + 1) and not apiversions.is_too_new(hi)
    frame = apiversions.unsupported_version_response(correlation_id=77)
    assert frame[:4] == (77).to_bytes(4, "big")  # header v0: no tagged fields
    body = frame[4:]
    assert body == (b"\x00\x23" + b"\x00\x00\x00\x01" + b"\x00\x12"
                    + lo.to_bytes(2, "big") + hi.to_bytes(2, "big"))
    # a client that sent a newer version reads the body as v0 because of the error code
    got, end = messages.decode_response(18, 4, body)
    assert end == len(body) and got["error_code"] == 35
    assert got["api_keys"] == [{"api_key": 18, "min_version": lo, "max_version": hi}]
    kp = KpApiVersionsResponse.decode(body, version=3)
    assert kp.error_code == 35
    assert [(a.api_key, a.min_version, a.max_version) for a in kp.api_keys] == [(18, lo, hi)]


def test_a_bridged_api_is_offered_one_version_beyond_a_broker_one_short() -> None:
    parse = apiversions.default_parse_table()
    assert parse[8][1] >= 9  # the proxy parses OffsetCommit v9

    def offered(broker_max: int) -> tuple[int, int]:
        view = apiversions.client_view(
            {"error_code": 0, "api_keys": [
                {"api_key": 8, "min_version": 0, "max_version": broker_max}]},
            parse, bridged=apiversions.BRIDGED)
        (entry,) = view["api_keys"]
        return entry["min_version"], entry["max_version"]

    low = parse[8][0]
    assert offered(8) == (low, 9)  # Kafka 3.0-3.6: v9 offered, sent as v8
    assert offered(9) == (low, 9)  # Kafka 3.7+: its own
    assert offered(7) == (low, 7)  # v8 differs from v7: not bridged
    frame = bytes([0, 8, 0, 9]) + b"rest"
    assert apiversions.downgraded(frame, 8) == bytes([0, 8, 0, 8]) + b"rest"
