"""Decoded KIP-848 messages <-> engine dataclasses, through the real codec bytes."""

from __future__ import annotations

import uuid

from proxy.codec import messages
from proxy.coordination import convert
from translation.heartbeat import ConsumerGroupHeartbeatResponse, TopicPartitions
from translation.topics import TopicMetadata, TopicsImage

from .helpers import TOPIC, TOPIC_ID, consumer_heartbeat, make_service


def test_heartbeat_request_from_wire_bytes() -> None:
    raw = messages.encode_request(68, 1, {
        "group_id": "g", "member_id": "m1", "member_epoch": 3, "instance_id": "i",
        "rebalance_timeout_ms": 1000, "subscribed_topic_names": ["a", "b"],
        "server_assignor": "range",
        "topic_partitions": [{"topic_id": TOPIC_ID, "partitions": [2, 0]}]})
    value, _ = messages.decode_request(68, 1, raw)
    request = consumer_heartbeat(value, client_id="cli", client_host="/h", api_version=1)
    assert request.group_id == "g" and request.member_id == "m1" and request.member_epoch == 3
    assert request.instance_id == "i" and request.rack_id is None
    assert request.subscribed_topic_names == ["a", "b"]
    assert request.subscribed_topic_regex is None
    assert request.server_assignor == "range"
    assert request.topic_partitions == [(TOPIC_ID, (2, 0))]
    assert (request.client_id, request.client_host, request.api_version) == ("cli", "/h", 1)


def test_null_owned_partitions_stay_null() -> None:
    raw = messages.encode_request(68, 0, {"group_id": "g", "member_id": "m", "member_epoch": 4})
    value, _ = messages.decode_request(68, 0, raw)
    request = consumer_heartbeat(value, client_id=None, client_host="", api_version=0)
    assert request.topic_partitions is None and request.subscribed_topic_names is None
    assert request.client_id == ""


def test_heartbeat_response_round_trip() -> None:
    other = uuid.uuid4()
    response = ConsumerGroupHeartbeatResponse(
        member_id="m", member_epoch=5, heartbeat_interval_ms=500,
        assignment=[TopicPartitions(TOPIC_ID, [0, 3]), TopicPartitions(other, [])])
    raw = messages.encode_response(68, 1, convert.consumer_group_heartbeat_response(response))
    value, _ = messages.decode_response(68, 1, raw)
    assert value["member_epoch"] == 5 and value["heartbeat_interval_ms"] == 500
    assert value["assignment"]["topic_partitions"] == [
        {"topic_id": TOPIC_ID, "partitions": [0, 3]}, {"topic_id": other, "partitions": []}]
    unchanged = messages.encode_response(68, 1, convert.consumer_group_heartbeat_response(
        ConsumerGroupHeartbeatResponse(member_id="m", member_epoch=5)))
    assert messages.decode_response(68, 1, unchanged)[0]["assignment"] is None


def test_describe_response_carries_names_epochs_and_both_assignments() -> None:
    service = make_service()
    engine = service.engine
    engine.update_topics(TopicsImage.of([TopicMetadata(TOPIC_ID, TOPIC, 2)]), 0)
    request = consumer_heartbeat(
        {"group_id": "g", "member_id": "m1", "member_epoch": 0, "rebalance_timeout_ms": 1000,
         "subscribed_topic_names": [TOPIC], "topic_partitions": []},
        client_id="c", client_host="/h", api_version=1)
    engine.heartbeat(request, 0)
    for version in (0, 1):
        described = convert.consumer_group_describe_response(engine.describe(["g", "nope"]))
        raw = messages.encode_response(69, version, described)
        value, _ = messages.decode_response(69, version, raw)
        found, missing = value["groups"]
        assert found["error_code"] == 0 and found["group_state"] == "Stable"
        assert found["group_epoch"] == 1 and found["assignment_epoch"] == 1
        assert found["assignor_name"] == "uniform"
        (member,) = found["members"]
        assert member["member_id"] == "m1" and member["member_epoch"] == 1
        expected = [{"topic_id": TOPIC_ID, "topic_name": TOPIC, "partitions": [0, 1]}]
        assert member["assignment"]["topic_partitions"] == expected
        assert member["target_assignment"]["topic_partitions"] == expected
        assert member["member_type"] == (1 if version == 1 else -1)
        assert missing["error_code"] == 69  # GROUP_ID_NOT_FOUND
