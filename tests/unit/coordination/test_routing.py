"""Which requests the coordinating router answers itself, and what those answers look like."""

from __future__ import annotations

import struct
from collections.abc import Awaitable
from typing import Any

import pytest

from proxy.codec import messages
from proxy.codec.header import encode_request_header
from proxy.connection import FORWARD, LOCAL, RejectRequest, RequestInfo
from proxy.coordination.routing import CoordinatingRouter
from proxy.metrics import RequestCounters
from proxy.rewrite import DictAddressMap
from proxy.router import parse_table

from .helpers import TOPIC, coordinate, make_service


def _request(key: int, version: int, value: dict[str, Any], correlation: int = 7
             ) -> RequestInfo:
    payload = (encode_request_header(key, version, correlation, "client-1")
               + messages.encode_request(key, version, value))
    return RequestInfo(key, version, correlation, memoryview(payload))


def _router(service: Any) -> CoordinatingRouter:
    return CoordinatingRouter(DictAddressMap({}), RequestCounters("test"), parse_table(),
                              service, 1)


def _commit(group: str) -> dict[str, Any]:
    return {"group_id": group, "generation_id_or_member_epoch": 1, "member_id": "m",
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0,
                                                       "committed_offset": 1}]}]}


def test_group_requests_are_local_only_for_coordinated_groups() -> None:
    service = make_service()
    coordinate(service, "mine")
    router = _router(service)
    assert router.classify(_request(8, 9, _commit("theirs"))) == FORWARD
    assert router.classify(_request(8, 9, _commit("mine"))) == LOCAL
    fetch = {"groups": [{"group_id": "theirs", "topics": None}]}
    assert router.classify(_request(9, 9, fetch)) == FORWARD
    fetch["groups"].append({"group_id": "mine", "topics": None})
    assert router.classify(_request(9, 9, fetch)) == LOCAL
    assert router.classify(_request(15, 5, {"groups": ["theirs"]})) == FORWARD
    assert router.classify(_request(15, 5, {"groups": ["theirs", "mine"]})) == LOCAL
    assert router.classify(_request(16, 4, {})) == FORWARD  # the engine has no group yet
    # classic protocol requests always go to the broker, which refuses them for "mine"
    join = {"group_id": "mine", "session_timeout_ms": 1000, "member_id": "",
            "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]}
    assert router.classify(_request(11, 5, join)) == FORWARD
    heartbeat = {"group_id": "any", "member_id": "m", "member_epoch": 1}
    assert router.classify(_request(68, 1, heartbeat)) == LOCAL
    assert router.classify(_request(69, 0, {"group_ids": ["x"]})) == LOCAL


def test_malformed_owned_request_closes_the_connection() -> None:
    router = _router(make_service())
    payload = encode_request_header(68, 1, 3, "c") + b"\x05"
    with pytest.raises(RejectRequest):
        router.classify(RequestInfo(68, 1, 3, memoryview(payload)))


async def test_local_answer_has_the_clients_correlation_id_and_header() -> None:
    router = _router(make_service())
    request = _request(69, 1, {"group_ids": ["nope"]}, correlation=4242)
    assert router.classify(request) == LOCAL
    answer = router.answer(request)
    assert isinstance(answer, Awaitable)
    payload = await answer
    (correlation,) = struct.unpack_from(">i", payload, 0)
    assert correlation == 4242
    value, _ = messages.decode_response(69, 1, payload, 5)  # response header v1
    assert value["groups"][0]["error_code"] == 69


def test_api_versions_advertise_the_served_apis() -> None:
    router = _router(make_service())
    broker = {"error_code": 0, "throttle_time_ms": 0, "api_keys": [
        {"api_key": 8, "min_version": 0, "max_version": 9},
        {"api_key": 68, "min_version": 0, "max_version": 0}]}
    rewrite = router.response_rewriter(18, 3)
    assert rewrite is not None
    payload = struct.pack(">i", 1) + messages.encode_response(18, 3, broker)
    out = rewrite(memoryview(payload))
    assert out is not None
    value, _ = messages.decode_response(18, 3, bytes(out), 4)
    versions = {e["api_key"]: (e["min_version"], e["max_version"]) for e in value["api_keys"]}
    assert versions[68] == (0, 1) and versions[69] == (0, 1) and versions[8] == (2, 9)
