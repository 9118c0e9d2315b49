"""Which requests the coordinating router answers itself, and what those answers look like."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from proxy.codec import messages
from proxy.codec.header import encode_request_header
from proxy.connection import EXAMINE, FORWARD, RejectRequest, RequestInfo

from .helpers import TOPIC, coordinate, exchange, make_service, request, router


def _commit(group: str) -> dict[str, Any]:
    return {"group_id": group, "generation_id_or_member_epoch": 1, "member_id": "m",
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0,
                                                       "committed_offset": 1}]}]}


async def test_group_requests_are_answered_only_for_coordinated_groups() -> None:
    service = make_service()
    coordinate(service, "mine")
    r = router(service)

    async def action(key: int, version: int, value: dict[str, Any]) -> str:
        return (await exchange(r, request(key, version, value))).action

    assert await action(8, 9, _commit("theirs")) == "forward"
    assert await action(8, 9, _commit("mine")) == "local"  # the engine rejects member "m"
    fetch = {"groups": [{"group_id": "theirs", "topics": None}]}
    assert await action(9, 9, fetch) == "forward"
    fetch["groups"].append({"group_id": "mine", "topics": None})
    assert await action(9, 9, fetch) == "rewrite"
    assert await action(15, 5, {"groups": ["theirs"]}) == "forward"
    assert await action(15, 5, {"groups": ["theirs", "mine"]}) == "rewrite"
    assert await action(16, 4, {}) == "forward"  # the engine has no group yet
    join = {"group_id": "mine", "session_timeout_ms": 1000, "member_id": "",
            "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]}
    # the engine does not take a join whose subscription does not parse: it goes to the
    # broker, with the member mark as its client id
    assert await action(11, 5, join) == "rewrite"
    heartbeat = {"group_id": "any", "member_id": "m", "member_epoch": 1}
    assert await action(68, 1, heartbeat) == "local"
    assert await action(69, 0, {"group_ids": ["x"]}) == "local"


def test_examined_apis_are_examined_from_the_header_alone() -> None:
    r = router(make_service())
    payload = encode_request_header(8, 9, 3, "c") + b"\x05"
    truncated = RequestInfo(8, 9, 3, memoryview(payload), complete=False)
    assert r.classify(truncated) == EXAMINE  # read whole, never streamed past
    assert r.classify(RequestInfo(3, 12, 4, memoryview(b""))) == FORWARD


def test_malformed_examined_request_closes_the_connection() -> None:
    r = router(make_service())
    payload = encode_request_header(68, 1, 3, "c") + b"\x05"
    info = RequestInfo(68, 1, 3, memoryview(payload))
    assert r.classify(info) == EXAMINE
    with pytest.raises(RejectRequest):
        r.decide(info)


async def test_local_answer_has_the_clients_correlation_id_and_header() -> None:
    result = await exchange(router(make_service()), request(69, 1, {"group_ids": ["nope"]},
                                                            correlation=4242))
    assert result.action == "local" and result.response is not None
    assert result.response["groups"][0]["error_code"] == 69


async def test_a_failing_handler_answers_unknown_server_error() -> None:
    service = make_service()
    coordinate(service, "g")

    def broken(group_id: str) -> Any:
        raise RuntimeError("boom")

    service.engine.validate_offset_commit = broken  # type: ignore[assignment,method-assign]
    result = await exchange(router(service), request(8, 9, _commit("g")))
    assert result.action == "local" and result.response is not None
    assert {p["error_code"] for t in result.response["topics"] for p in t["partitions"]} == {-1}


def test_api_versions_advertise_the_served_apis() -> None:
    r = router(make_service())
    broker = {"error_code": 0, "throttle_time_ms": 0, "api_keys": [
        {"api_key": 8, "min_version": 0, "max_version": 9},
        {"api_key": 68, "min_version": 0, "max_version": 0}]}
    rewrite = r.response_rewriter(18, 3)
    assert rewrite is not None
    payload = struct.pack(">i", 1) + messages.encode_response(18, 3, broker)
    out = rewrite(memoryview(payload))
    assert out is not None
    value, _ = messages.decode_response(18, 3, bytes(out), 4)
    versions = {e["api_key"]: (e["min_version"], e["max_version"]) for e in value["api_keys"]}
    assert versions[68] == (0, 1) and versions[69] == (0, 1) and versions[8] == (2, 9)


def test_a_request_too_large_to_decode_passes_only_for_a_group_not_coordinated() -> None:
    from proxy.coordination.peek import group_id_of

    service = make_service()
    coordinate(service, "g")
    r = router(service)
    commit = {"group_id": "", "generation_id_or_member_epoch": 1, "member_id": "m",
              "group_instance_id": None, "retention_time_ms": -1, "topics": []}
    for version in (2, 9):  # int16 and compact strings
        theirs = request(8, version, {**commit, "group_id": "theirs"})
        first_bytes = RequestInfo(8, version, 7, theirs.frame[:40], complete=False)
        assert group_id_of(first_bytes.frame, 8, version) == "theirs"
        assert r.decide_oversized(first_bytes) == FORWARD
        ours = request(8, version, {**commit, "group_id": "g"})
        with pytest.raises(RejectRequest, match="coordinated by the proxy"):
            r.decide_oversized(ours)
    describe = request(15, 5, {"groups": ["theirs"], "include_authorized_operations": False})
    with pytest.raises(RejectRequest, match="cannot be read"):
        r.decide_oversized(describe)  # its groups are an array: decoded or refused
    truncated = RequestInfo(8, 2, 7, request(8, 2, {**commit, "group_id": "x" * 500}).frame[:60],
                            complete=False)
    with pytest.raises(RejectRequest):
        r.decide_oversized(truncated)
