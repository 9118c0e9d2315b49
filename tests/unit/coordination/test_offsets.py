"""Offset requests of coordinated groups: engine validation, then the broker under the
proxy's own membership."""

from __future__ import annotations

import uuid
from typing import Any

from proxy.codec import messages
from proxy.coordination import offsets, wire
from translation.topics import TopicMetadata, TopicsImage

from .helpers import COORDINATOR, TOPIC, TOPIC_ID, FakePool, coordinate, make_service


def _join(service: Any, group: str, member: str) -> int:
    response, _ = service.engine.heartbeat(wire.heartbeat_request(
        {"group_id": group, "member_id": member, "member_epoch": 0, "rebalance_timeout_ms": 1000,
         "subscribed_topic_names": [TOPIC], "topic_partitions": []},
        client_id="c", client_host="/h", api_version=1), 0)
    assert response.error_code == 0
    return int(response.member_epoch)


def _commit(member: str, epoch: int, partitions: list[int]) -> dict[str, Any]:
    return {"group_id": "g", "generation_id_or_member_epoch": epoch, "member_id": member,
            "group_instance_id": None, "topics": [{"name": TOPIC, "partitions": [
                {"partition_index": p, "committed_offset": 10, "committed_leader_epoch": -1,
                 "committed_metadata": ""} for p in partitions]}]}


def _ok(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    return offsets.commit_error(value, 0)


def test_topic_ids_by_id_by_name_and_for_unknown_names() -> None:
    image = TopicsImage.of([TopicMetadata(TOPIC_ID, TOPIC, 1)])
    other = uuid.uuid4()
    assert offsets.topic_id_of({"topic_id": other, "name": ""}, image) == other
    assert offsets.topic_id_of({"name": TOPIC}, image) == TOPIC_ID
    unknown = offsets.topic_id_of({"name": "gone"}, image)
    assert unknown == offsets.topic_id_of({"name": "gone"}, image) != TOPIC_ID


async def test_accepted_commit_goes_upstream_under_the_proxys_membership() -> None:
    service = make_service(_ok)
    coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    response = await offsets.offset_commit(service, 9, _commit("m1", epoch, [0, 1]))
    assert {p["error_code"] for t in response["topics"] for p in t["partitions"]} == {0}
    pool = service.pool
    assert isinstance(pool, FakePool)
    ((key, version, sent),) = pool.fake.requests
    assert (key, version) == (8, 9) and pool.addresses == [COORDINATOR]
    assert sent["member_id"] == "proxy-member" and sent["generation_id_or_member_epoch"] == 7
    assert sent["topics"] == _commit("m1", epoch, [0, 1])["topics"]
    messages.encode_response(8, 9, response)


async def test_rejected_commit_never_reaches_the_broker() -> None:
    service = make_service(_ok)
    coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    stale = await offsets.offset_commit(service, 9, _commit("m1", epoch + 1, [0]))
    unknown = await offsets.offset_commit(service, 9, _commit("zombie", epoch, [0]))

    def errors(response: dict[str, Any]) -> set[int]:
        return {p["error_code"] for t in response["topics"] for p in t["partitions"]}

    assert errors(stale) == {113}  # STALE_MEMBER_EPOCH
    assert errors(unknown) == {25}  # UNKNOWN_MEMBER_ID
    assert isinstance(service.pool, FakePool) and not service.pool.fake.requests


async def test_broker_refusing_the_membership_means_rejoin_and_a_retriable_error() -> None:
    service = make_service(lambda k, v, value: offsets.commit_error(value, 22))
    membership = coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    response = await offsets.offset_commit(service, 9, _commit("m1", epoch, [0]))
    assert {p["error_code"] for t in response["topics"] for p in t["partitions"]} == {14}
    assert not membership.stable
    assert isinstance(service.pool, FakePool)
    again = await offsets.offset_commit(service, 9, _commit("m1", epoch, [0]))
    assert {p["error_code"] for t in again["topics"] for p in t["partitions"]} == {14}
    assert len(service.pool.fake.requests) == 1  # not sent while the membership is stale


async def test_txn_commit_validated_as_transactional() -> None:
    service = make_service(_ok)
    coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    value = dict(_commit("m1", epoch + 3, [0]), transactional_id="t", producer_id=1,
                 producer_epoch=0)
    response = await offsets.txn_offset_commit(service, 3, value)
    assert {p["error_code"] for t in response["topics"] for p in t["partitions"]} == {22}
    value["generation_id_or_member_epoch"] = epoch
    await offsets.txn_offset_commit(service, 3, value)
    assert isinstance(service.pool, FakePool)
    ((key, _, sent),) = service.pool.fake.requests
    assert key == 28 and sent["member_id"] == "proxy-member"


async def test_offset_fetch_checks_member_epoch_and_strips_member_fields() -> None:
    def answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        return {"groups": [{"group_id": g["group_id"], "topics": [], "error_code": 0}
                           for g in value["groups"]]}

    service = make_service(answer)
    coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    group = {"group_id": "g", "member_id": "m1", "member_epoch": epoch, "topics": None}
    request = {"groups": [group, dict(group, member_epoch=epoch + 1),
                          dict(group, member_id="x"), dict(group, member_id=None,
                                                           member_epoch=-1)],
               "require_stable": True}
    response = await offsets.offset_fetch(service, 9, request, ("h", 1))
    assert [g["error_code"] for g in response["groups"]] == [0, 113, 25, 0]
    assert isinstance(service.pool, FakePool)
    ((_, _, sent),) = service.pool.fake.requests
    assert [(g["member_id"], g["member_epoch"]) for g in sent["groups"]] == [(None, -1)] * 2
    messages.encode_response(9, 9, response)


async def test_offset_delete_refuses_subscribed_topics() -> None:
    def answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        assert [t["name"] for t in value["topics"]] == ["old"]
        return {"error_code": 0, "topics": [{"name": "old", "partitions": [
            {"partition_index": 0, "error_code": 0}]}]}

    service = make_service(answer)
    coordinate(service, "g")
    _join(service, "g", "m1")
    request = {"group_id": "g", "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0}]},
        {"name": "old", "partitions": [{"partition_index": 0}]}]}
    response = await offsets.offset_delete(service, 0, request)
    errors = {t["name"]: [p["error_code"] for p in t["partitions"]] for t in response["topics"]}
    assert errors == {"old": [0], TOPIC: [86]}  # GROUP_SUBSCRIBED_TO_TOPIC
    messages.encode_response(47, 0, response)
