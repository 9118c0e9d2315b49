"""Address rewriters: random valid responses of every version, and hostile ones.

The expected result is computed independently of the rewriter: decode the original, replace the
addresses where the field guide says brokers are advertised, encode. The rewritten body must be
exactly that encoding (so every other byte is unchanged), and a body without any address to
change must come back as the very same object.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.codec import messages
from proxy.codec.errors import CodecError
from proxy.rewrite import DictAddressMap, brokers_in, needs_rewrite, rewrite_response
from tests.unit.codec.strategies import examples, message_values, mutations


def proxy_addr(node_id: int, host: str = "", port: int = 0) -> tuple[str, int]:
    return f"proxy-{node_id}.local", 20000 + node_id % 1000


def amap() -> DictAddressMap:
    return DictAddressMap(allocate=proxy_addr)


def address_nodes(api_key: int, version: int, value: dict[str, Any]) -> list[dict[str, Any]]:
    """Where the field guide says broker addresses are (independent of the rewriter)."""
    if api_key in (3, 60):
        return list(value["brokers"])
    if api_key == 10:
        if version >= 4:
            return list(value["coordinators"])
        return [value] if value["error_code"] == 0 else []
    if (api_key == 0 and version >= 10) or (api_key == 1 and version >= 16):
        return list(value["node_endpoints"] or [])
    return []


def id_key(api_key: int) -> str:
    return "broker_id" if api_key == 60 else "node_id"


def expected(api_key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    v = copy.deepcopy(value)
    k = id_key(api_key)
    for n in address_nodes(api_key, version, v):
        if n[k] >= 0:
            n["host"], n["port"] = proxy_addr(n[k])
    return v


CASES = [(3, v) for v in range(0, 14)] + [(10, v) for v in range(0, 7)] + [
    (60, v) for v in range(0, 3)] + [(0, v) for v in range(10, 14)] + [
    (1, v) for v in range(16, 19)]

node_ids = st.integers(-1, 50)


def _fix_ids(api_key: int, version: int, value: dict[str, Any], ids: list[int]) -> None:
    """Make node ids realistic (small, sometimes -1) so the test exercises both paths."""
    for i, n in enumerate(address_nodes(api_key, version, value)):
        n[id_key(api_key)] = ids[i % len(ids)] if ids else 1


@pytest.mark.parametrize(("api_key", "version"), CASES)
@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_responses(api_key: int, version: int, data: st.DataObject) -> None:
    value = data.draw(message_values(api_key, version, True))
    _fix_ids(api_key, version, value, data.draw(st.lists(node_ids, max_size=4)))
    body = messages.encode_response(api_key, version, value)
    original, _ = messages.decode_response(api_key, version, body)
    m = amap()
    out = rewrite_response(api_key, version, body, m)
    want = expected(api_key, version, original)
    if want == original:
        assert out is body
    else:
        assert out == messages.encode_response(api_key, version, want)
        got, end = messages.decode_response(api_key, version, out)
        assert end == len(out)
        k = id_key(api_key)
        for n in address_nodes(api_key, version, got):
            if n[k] >= 0:
                assert (n["host"], n["port"]) == proxy_addr(n[k])
                assert n[k] in m.upstream
    # brokers_in reports the upstream addresses the rewriter saw
    k = id_key(api_key)
    seen = brokers_in(api_key, version, body)
    assert seen == [(n[k], n["host"], n["port"])
                    for n in address_nodes(api_key, version, original) if n[k] >= 0]


@pytest.mark.parametrize(("api_key", "version"), CASES)
@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_responses(api_key: int, version: int, data: st.DataObject) -> None:
    value = data.draw(message_values(api_key, version, True, max_list=2))
    body = messages.encode_response(api_key, version, value)
    bad = data.draw(mutations(body))
    try:
        out = rewrite_response(api_key, version, bad, amap())
    except CodecError:
        return
    assert isinstance(out, bytes | bytearray | memoryview)


@pytest.mark.parametrize(("api_key", "version"), CASES)
@settings(max_examples=examples(10), deadline=None)
@given(data=st.binary(max_size=64))
def test_random_bytes(api_key: int, version: int, data: bytes) -> None:
    with contextlib.suppress(CodecError):
        rewrite_response(api_key, version, data, amap())


def test_metadata_splice_keeps_topic_bytes() -> None:
    topics = [{"name": f"t{i}", "partitions": [{"partition_index": p, "replica_nodes": [1, 2]}
                                               for p in range(3)]} for i in range(5)]
    value = {"throttle_time_ms": 9, "brokers": [
        {"node_id": 1, "host": "kafka-1.internal", "port": 9092, "rack": "a"},
        {"node_id": 2, "host": "kafka-2.internal", "port": 9092, "rack": None}],
        "cluster_id": "c", "controller_id": 1, "topics": topics}
    body = messages.encode_response(3, 12, value)
    out = bytes(rewrite_response(3, 12, body, amap()))
    assert out[:4] == body[:4]  # throttle time untouched
    old_brokers = messages.encode_response(3, 12, {"brokers": value["brokers"]})[4:-9]
    tail = body[4 + len(old_brokers):]
    assert out.endswith(tail)
    got, _ = messages.decode_response(3, 12, out)
    assert [(b["host"], b["port"], b["rack"]) for b in got["brokers"]] == [
        ("proxy-1.local", 20001, "a"), ("proxy-2.local", 20002, None)]


def test_find_coordinator_error_and_minus_one_untouched() -> None:
    err = messages.encode_response(10, 2, {"error_code": 15, "node_id": -1, "host": "",
                                           "port": -1})
    assert rewrite_response(10, 2, err, amap()) is err
    batched = messages.encode_response(10, 4, {"coordinators": [
        {"key": "g1", "node_id": -1, "host": "", "port": -1, "error_code": 15},
        {"key": "g2", "node_id": 3, "host": "b3", "port": 9092}]})
    got, _ = messages.decode_response(10, 4, rewrite_response(10, 4, batched, amap()))
    assert [(c["node_id"], c["host"], c["port"]) for c in got["coordinators"]] == [
        (-1, "", -1), (3, "proxy-3.local", 20003)]


def test_fetch_without_node_endpoints_is_returned_as_is() -> None:
    import uuid

    value = {"responses": [{"topic_id": uuid.uuid4(), "partitions": [
        {"partition_index": p, "records": b"\x00" * 5000} for p in range(4)]}]}
    body = messages.encode_response(1, 17, value)
    assert rewrite_response(1, 17, body, amap()) is body
    view = memoryview(body)
    assert rewrite_response(1, 17, view, amap()) is view
    # an unknown top-level tag without NodeEndpoints: still untouched
    tagged = messages.encode_response(1, 17, {**value, "_unknown_tagged": {7: b"zz"}})
    assert rewrite_response(1, 17, tagged, amap()) is tagged


def test_fetch_with_node_endpoints_keeps_other_tags() -> None:
    value = {"responses": [], "node_endpoints": [{"node_id": 4, "host": "b4", "port": 1}],
             "_unknown_tagged": {9: b"keep"}}
    body = messages.encode_response(1, 16, value)
    out = rewrite_response(1, 16, body, amap())
    got, _ = messages.decode_response(1, 16, out)
    assert got["node_endpoints"][0]["host"] == "proxy-4.local"
    assert got["_unknown_tagged"] == {9: b"keep"}


def test_trailing_bytes_are_rejected() -> None:
    body = messages.encode_response(1, 16, {"responses": []}) + b"\x00"
    with pytest.raises(CodecError, match="trailing"):
        rewrite_response(1, 16, body, amap())


def test_needs_rewrite() -> None:
    assert needs_rewrite(3, 0) and needs_rewrite(10, 6) and needs_rewrite(60, 0)
    assert not needs_rewrite(0, 9) and needs_rewrite(0, 10)
    assert not needs_rewrite(1, 15) and needs_rewrite(1, 16)
    assert not needs_rewrite(11, 5)
    body = b"anything"
    assert rewrite_response(11, 5, body, amap()) is body
    assert rewrite_response(1, 12, body, amap()) is body


def test_dict_address_map() -> None:
    m = DictAddressMap({1: ("localhost", 19092)})
    assert m.lookup(1, "b1", 9092) == ("localhost", 19092)
    assert m.upstream == {1: ("b1", 9092)}
    with pytest.raises(KeyError):
        m.lookup(2, "b2", 9092)
