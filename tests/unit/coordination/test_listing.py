"""ListGroups / DescribeGroups merging of broker groups and coordinated groups."""

from __future__ import annotations

from typing import Any

from proxy.codec import messages
from proxy.coordination import listing, wire

from .helpers import TOPIC, coordinate, make_service


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

    service = make_service(answer)
    coordinate(service, "g1")
    service.engine.heartbeat(_join("g1"), 0)
    request = {"states_filter": ["stable"], "types_filter": []}
    response = await listing.list_groups(service, 5, request, 1, ("h", 1))
    assert [(g["group_id"], g["group_type"]) for g in response["groups"]] == [
        ("plain", "classic"), ("g1", "consumer")]
    # on another broker's connection the coordinated group is not listed again
    other = await listing.list_groups(service, 5, {"states_filter": [], "types_filter": []},
                                      2, ("h", 2))
    assert [g["group_id"] for g in other["groups"]] == ["plain"]
    messages.encode_response(16, 5, response)


def test_describe_groups_of_a_coordinated_group_is_not_classic() -> None:
    new = listing.not_classic("g", 6)
    assert new["error_code"] == 69 and "not a classic group" in new["error_message"]
    old = listing.not_classic("g", 5)
    assert old["error_code"] == 0 and old["group_state"] == "Dead"
    messages.encode_response(15, 6, {"groups": [new]})
    messages.encode_response(15, 0, {"groups": [old]})


async def test_describe_groups_asks_the_broker_only_for_other_groups() -> None:
    def answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        assert value["groups"] == ["plain"]
        return {"groups": [{"error_code": 0, "group_id": "plain", "group_state": "Stable",
                            "protocol_type": "consumer", "protocol_data": "range",
                            "members": []}]}

    service = make_service(answer)
    coordinate(service, "g1")
    response = await listing.describe_groups(service, 5, {"groups": ["g1", "plain"]},
                                             ("h", 1))
    assert [(g["group_id"], g["group_state"]) for g in response["groups"]] == [
        ("g1", "Dead"), ("plain", "Stable")]


def _join(group: str) -> Any:
    return wire.heartbeat_request(
        {"group_id": group, "member_id": "m1", "member_epoch": 0, "rebalance_timeout_ms": 1000,
         "subscribed_topic_names": [TOPIC], "topic_partitions": []},
        client_id="c", client_host="/h", api_version=1)
