"""Translation between decoded KIP-848 messages and the engine's dataclasses (sans-I/O).

The codec decodes ConsumerGroupHeartbeat / ConsumerGroupDescribe requests into dicts with
Kafka's field names in snake_case; the engine takes and returns dataclasses with the same
names. These functions map one onto the other and nothing else, so they are tested without a
network.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from translation.describe import DescribedGroup, DescribedTopicPartitions
from translation.heartbeat import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse


def heartbeat_request(value: dict[str, Any], *, client_id: str | None, client_host: str,
                      api_version: int) -> ConsumerGroupHeartbeatRequest:
    """The engine's request for a decoded ConsumerGroupHeartbeat request body."""
    owned = value.get("topic_partitions")
    return ConsumerGroupHeartbeatRequest(
        group_id=value["group_id"],
        member_id=value["member_id"],
        member_epoch=value["member_epoch"],
        instance_id=value.get("instance_id"),
        rack_id=value.get("rack_id"),
        rebalance_timeout_ms=value.get("rebalance_timeout_ms", -1),
        subscribed_topic_names=value.get("subscribed_topic_names"),
        subscribed_topic_regex=value.get("subscribed_topic_regex"),
        server_assignor=value.get("server_assignor"),
        topic_partitions=None if owned is None else [
            (tp["topic_id"], tuple(tp["partitions"])) for tp in owned],
        client_id=client_id or "",
        client_host=client_host,
        api_version=api_version,
    )


def heartbeat_response(response: ConsumerGroupHeartbeatResponse) -> dict[str, Any]:
    """The ConsumerGroupHeartbeat response body value for an engine response."""
    assignment = None
    if response.assignment is not None:
        assignment = {"topic_partitions": [
            {"topic_id": tp.topic_id, "partitions": list(tp.partitions)}
            for tp in response.assignment]}
    return {
        "throttle_time_ms": response.throttle_time_ms,
        "error_code": response.error_code,
        "error_message": response.error_message,
        "member_id": response.member_id,
        "member_epoch": response.member_epoch,
        "heartbeat_interval_ms": response.heartbeat_interval_ms,
        "assignment": assignment,
    }


def heartbeat_error(error_code: int, message: str) -> dict[str, Any]:
    return heartbeat_response(ConsumerGroupHeartbeatResponse(error_code=error_code,
                                                             error_message=message))


def _partitions(items: Sequence[DescribedTopicPartitions]) -> dict[str, Any]:
    return {"topic_partitions": [
        {"topic_id": tp.topic_id, "topic_name": tp.topic_name, "partitions": list(tp.partitions)}
        for tp in items]}


def describe_response(groups: Sequence[DescribedGroup]) -> dict[str, Any]:
    """The ConsumerGroupDescribe response body value for the engine's descriptions."""
    out = []
    for g in groups:
        out.append({
            "error_code": g.error_code,
            "error_message": g.error_message,
            "group_id": g.group_id,
            "group_state": g.group_state,
            "group_epoch": g.group_epoch,
            "assignment_epoch": g.assignment_epoch,
            "assignor_name": g.assignor_name,
            "members": [{
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "rack_id": m.rack_id,
                "member_epoch": m.member_epoch,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "subscribed_topic_names": list(m.subscribed_topic_names),
                "subscribed_topic_regex": m.subscribed_topic_regex,
                "assignment": _partitions(m.assignment),
                "target_assignment": _partitions(m.target_assignment),
                "member_type": m.member_type,
            } for m in g.members],
        })
    return {"throttle_time_ms": 0, "groups": out}
