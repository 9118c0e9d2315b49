"""ListGroups / DescribeGroups merging of broker groups and coordinated groups."""

from __future__ import annotations

from typing import Any

from proxy.codec import messages
from proxy.coordination import listing

from .helpers import TOPIC, consumer_heartbeat, coordinate, exchange, make_service, request, router


def _broker(gid: str, state: str = "Stable", kind: str = "classic") -> dict[str, Any]:
    return {"group_id": gid, "protocol_type": "consumer", "group_state": state,
            "group_type": kind}


def test_coordinated_ids_come_from_the_engine_once() -> None:
    broker = [_broker("a"), _broker("coordinated"), _broker("b", "Empty")]
    engine = [{"group_id": "coordinated", "protocol_type": "consumer",
               "group_state": "Reconciling", "group_type": "consumer"}]
    merged = listing.merge_listing(broker, engine, {"coordinated"}, [], [])
    assert [g["group_id"] for g in merged] == ["a", "b", "coordinated"]
    assert merged[-1]["group_state"] == "Reconciling"


def test_filters_apply_to_the_merged_list_case_insensitively() -> None:
    broker = [_broker("a"), _broker("b", "Empty")]
    engine = [{"group_id": "c", "protocol_type": "consumer", "group_state": "Stable",
               "group_type": "consumer"}]

    def ids(states: list[str], types: list[str]) -> list[str]:
        return [g["group_id"] for g in listing.merge_listing(broker, engine, {"c"}, states, types)]

    assert ids([], ["Consumer"]) == ["c"]
    assert ids([], ["classic"]) == ["a", "b"]
    assert ids(["stable"], []) == ["a", "c"]
    assert ids(["EMPTY"], ["classic"]) == ["b"]
    assert ids(["Assigning"], []) == []


async def test_list_groups_sends_no_filters_upstream_and_lists_engine_groups() -> None:
    def answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        assert key == 16 and value["states_filter"] == [] and value["types_filter"] == []
        return {"throttle_time_ms": 0, "error_code": 0,
                "groups": [_broker("g1"), _broker("plain")]}

    service = make_service()
    assert (await exchange(router(service), request(16, 5, {}))).action == "forward"
    coordinate(service, "g1")
    service.engine.heartbeat(_join("g1"), 0)
    value = {"states_filter": ["stable"], "types_filter": []}
    result = await exchange(router(service, 1), request(16, 5, value), answer)
    assert result.response is not None
    assert [(g["group_id"], g["group_type"]) for g in result.response["groups"]] == [
        ("plain", "classic"), ("g1", "consumer")]
    # on another broker's connection the coordinated group is not listed again
    other = await exchange(router(service, 2), request(16, 5, {}), answer)
    assert other.response is not None
    assert [g["group_id"] for g in other.response["groups"]] == ["plain"]


async def test_describe_groups_describes_a_coordinated_group_in_the_classic_shape() -> None:
    def answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        assert value["groups"] == ["plain"]
        return {"groups": [{"error_code": 0, "group_id": "plain", "group_state": "Stable",
                            "protocol_type": "consumer", "protocol_data": "range",
                            "members": []}]}

    service = make_service()
    coordinate(service, "g1")
    service.engine.heartbeat(_join("g1"), 0)
    for version in (0, 5, 6):
        result = await exchange(router(service), request(15, version,
                                                         {"groups": ["g1", "plain"]}), answer)
        assert result.response is not None
        described, plain = result.response["groups"]
        assert plain["group_id"] == "plain" and plain["group_state"] == "Stable"
        assert described["error_code"] == 0 and described["protocol_type"] == "consumer"
        assert described["group_state"] in ("Stable", "CompletingRebalance")
        (member,) = described["members"]
        assert member["member_id"] == "m1" and member["client_host"] == "/h"
        _, subscription = messages.decode_data("ConsumerProtocolSubscription",
                                               memoryview(member["member_metadata"]))
        assert subscription["topics"] == [TOPIC]
        _, assignment = messages.decode_data("ConsumerProtocolAssignment",
                                             memoryview(member["member_assignment"]))
        assert assignment["assigned_partitions"] == [{"topic": TOPIC,
                                                      "partitions": [0, 1, 2, 3]}]
    only = await exchange(router(service), request(15, 5, {"groups": ["g1"]}))
    assert only.action == "local"


async def test_delete_groups_refuses_a_group_with_members_and_deletes_an_empty_one() -> None:
    def answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        return {"throttle_time_ms": 0, "results": [{"group_id": g, "error_code": 0}
                                                   for g in value["groups_names"]]}

    service = make_service()
    membership = coordinate(service, "g1")
    service.engine.heartbeat(_join("g1"), 0)
    busy = await exchange(router(service), request(42, 2, {"groups_names": ["g1", "other"]}),
                          answer)
    assert busy.response is not None and busy.sent is not None
    assert [(r["group_id"], r["error_code"]) for r in busy.response["results"]] == [
        ("g1", 68), ("other", 0)]  # NON_EMPTY_GROUP
    assert busy.sent["groups_names"] == ["other"] and membership.leaves == 0
    leave = consumer_heartbeat({"group_id": "g1", "member_id": "m1", "member_epoch": -1},
                                   client_id="c", client_host="/h", api_version=1)
    service.engine.heartbeat(leave, 1)
    done = await exchange(router(service), request(42, 2, {"groups_names": ["g1"]}), answer)
    assert done.response is not None and done.sent is not None
    assert done.sent["groups_names"] == ["g1"]  # the broker deletes group and offsets
    assert [(r["group_id"], r["error_code"]) for r in done.response["results"]] == [("g1", 0)]
    assert membership.leaves == 1 and "g1" not in service.engine.groups
    assert "g1" not in service.memberships


def _join(group: str) -> Any:
    return consumer_heartbeat(
        {"group_id": group, "member_id": "m1", "member_epoch": 0, "rebalance_timeout_ms": 1000,
         "subscribed_topic_names": [TOPIC], "topic_partitions": []},
        client_id="c", client_host="/h", api_version=1)
