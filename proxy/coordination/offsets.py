"""Offsets of coordinated groups: validated by the engine, stored in the broker.

For a group the proxy coordinates, the members' OffsetCommit, TxnOffsetCommit, OffsetFetch
and OffsetDelete requests are answered here:

* OffsetCommit / TxnOffsetCommit: the engine checks the member id and member epoch
  (:meth:`~translation.coordinator.GroupCoordinator.validate_offset_commit`, relaxed fencing by
  default; topic names are mapped to the broker's topic ids through the topics image). A
  rejected request fails every partition with the engine's error (STALE_MEMBER_EPOCH,
  UNKNOWN_MEMBER_ID...). An accepted one is sent to the group's coordinator broker under the
  proxy's own member id and generation in the broker's classic group
  (:mod:`proxy.coordination.membership`), at the client's version, and the broker's answer
  goes back to the client. If the broker no longer recognises the proxy's membership, the
  membership rejoins and the client gets the retriable COORDINATOR_LOAD_IN_PROGRESS.
* OffsetFetch v9+: a member id with an epoch >= 0 must be a member at that epoch (as Kafka
  checks for consumer groups); the request then goes to the broker without member fields,
  which the classic coordinator does not know.
* OffsetDelete: partitions of topics the group subscribes to are refused with
  GROUP_SUBSCRIBED_TO_TOPIC (the broker cannot know the subscriptions); the rest is deleted
  at the broker.

Every function takes the decoded request value and returns the response value; transport
errors become COORDINATOR_NOT_AVAILABLE, which clients retry after finding the coordinator.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from proxy.coordination.links import Address
from proxy.coordination.membership import COORDINATOR_MOVED, MEMBERSHIP_LOST, BrokerMembership
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode
from translation.topics import TopicId, TopicsImage

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService

OFFSET_COMMIT, OFFSET_FETCH, TXN_OFFSET_COMMIT, OFFSET_DELETE = 8, 9, 28, 47
GROUP_SUBSCRIBED_TO_TOPIC = 86
_UNKNOWN_TOPICS = uuid.UUID("6a1c3f0e-9d43-4b7e-8a53-1f0c2b9e7d10")


def topic_id_of(topic: dict[str, Any], image: TopicsImage) -> TopicId:
    """The broker's topic id of a request topic (v10+ carry it; older ones carry the name).

    A name the image does not know gets a stable id of its own that no member ever holds.
    """
    topic_id = topic.get("topic_id")
    if isinstance(topic_id, uuid.UUID) and topic_id.int:
        return topic_id
    name = topic.get("name") or ""
    meta = image.by_name.get(name)
    return meta.topic_id if meta is not None else uuid.uuid5(_UNKNOWN_TOPICS, name)


def partitions_of(topics: Iterable[dict[str, Any]], image: TopicsImage
                  ) -> list[tuple[TopicId, int]]:
    return [(topic_id_of(t, image), p["partition_index"]) for t in topics
            for p in t["partitions"]]


def _topic_key(topic: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "name" in topic:
        out["name"] = topic["name"]
    if "topic_id" in topic:
        out["topic_id"] = topic["topic_id"]
    return out


def commit_error(value: dict[str, Any], error: int) -> dict[str, Any]:
    """An OffsetCommit / TxnOffsetCommit response failing every partition with ``error``."""
    return {"throttle_time_ms": 0, "topics": [
        dict(_topic_key(t), partitions=[{"partition_index": p["partition_index"],
                                         "error_code": error} for p in t["partitions"]])
        for t in value["topics"]]}


def _partition_errors(response: dict[str, Any]) -> set[int]:
    return {p["error_code"] for t in response["topics"] for p in t["partitions"]}


def _remap_membership_errors(response: dict[str, Any], membership: BrokerMembership) -> None:
    errors = _partition_errors(response)
    if errors & MEMBERSHIP_LOST:
        membership.request_rejoin()
        for t in response["topics"]:
            for p in t["partitions"]:
                if p["error_code"] in MEMBERSHIP_LOST:
                    p["error_code"] = int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    if errors & COORDINATOR_MOVED:
        membership.coordinator = None
        membership.request_rejoin()


async def _commit_upstream(service: CoordinatorService, membership: BrokerMembership,
                           api_key: int, version: int, value: dict[str, Any],
                           member_fields: bool) -> dict[str, Any]:
    if not membership.stable or membership.coordinator is None:
        return commit_error(value, int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    upstream = dict(value)
    if member_fields:
        upstream.update(member_id=membership.member_id,
                        generation_id_or_member_epoch=membership.generation,
                        group_instance_id=None)
    try:
        response = await service.pool.link(membership.coordinator).request(api_key, version,
                                                                           upstream)
    except UpstreamError:
        membership.request_rejoin()
        return commit_error(value, int(ErrorCode.COORDINATOR_NOT_AVAILABLE))
    _remap_membership_errors(response, membership)
    return response


async def offset_commit(service: CoordinatorService, version: int, value: dict[str, Any]
                        ) -> dict[str, Any]:
    group_id = value["group_id"]
    membership = service.membership(group_id)
    if membership is None:
        return commit_error(value, int(ErrorCode.NOT_COORDINATOR))
    error = service.engine.validate_offset_commit(
        group_id, value.get("member_id") or "", value.get("generation_id_or_member_epoch", -1),
        partitions_of(value["topics"], service.engine.image),
        instance_id=value.get("group_instance_id"), api_version=version)
    if error != ErrorCode.NONE:
        return commit_error(value, int(error))
    return await _commit_upstream(service, membership, OFFSET_COMMIT, version, value,
                                  member_fields=version >= 1)


async def txn_offset_commit(service: CoordinatorService, version: int, value: dict[str, Any]
                            ) -> dict[str, Any]:
    group_id = value["group_id"]
    membership = service.membership(group_id)
    if membership is None:
        return commit_error(value, int(ErrorCode.NOT_COORDINATOR))
    error = service.engine.validate_offset_commit(
        group_id, value.get("member_id") or "", value.get("generation_id_or_member_epoch", -1),
        partitions_of(value["topics"], service.engine.image),
        instance_id=value.get("group_instance_id"), transactional=True, api_version=version)
    if error != ErrorCode.NONE:
        return commit_error(value, int(error))
    return await _commit_upstream(service, membership, TXN_OFFSET_COMMIT, version, value,
                                  member_fields=version >= 3)


def fetch_member_error(service: CoordinatorService, group_id: str, member_id: str | None,
                       member_epoch: int) -> ErrorCode:
    """Kafka's OffsetFetch check for consumer groups: epoch < 0 (admin tools) passes."""
    if member_epoch < 0:
        return ErrorCode.NONE
    group = service.engine.group(group_id)
    member = group.members.get(member_id or "") if group is not None else None
    if member is None:
        return ErrorCode.UNKNOWN_MEMBER_ID
    if member.member_epoch != member_epoch:
        return ErrorCode.STALE_MEMBER_EPOCH
    return ErrorCode.NONE


async def offset_fetch(service: CoordinatorService, version: int, value: dict[str, Any],
                       address: Address) -> dict[str, Any]:
    """OffsetFetch with at least one coordinated group (``address``: where the rest goes)."""
    if version < 8:
        membership = service.membership(value["group_id"])
        target = membership.coordinator if membership and membership.coordinator else address
        try:
            return await service.pool.link(target).request(OFFSET_FETCH, version, value)
        except UpstreamError:
            return {"throttle_time_ms": 0, "topics": [],
                    "error_code": int(ErrorCode.COORDINATOR_NOT_AVAILABLE)}
    failed: dict[int, int] = {}
    forwarded = []
    target = address
    for index, group in enumerate(value["groups"]):
        membership = service.membership(group["group_id"])
        if membership is None:
            forwarded.append(group)
            continue
        if membership.coordinator is not None:
            target = membership.coordinator
        error = fetch_member_error(service, group["group_id"], group.get("member_id"),
                                   group.get("member_epoch", -1))
        if error != ErrorCode.NONE:
            failed[index] = int(error)
            continue
        forwarded.append(dict(group, member_id=None, member_epoch=-1))
    answers: list[dict[str, Any]] = []
    if forwarded:
        try:
            response = await service.pool.link(target).request(
                OFFSET_FETCH, version, dict(value, groups=forwarded))
            answers = list(response["groups"])
        except UpstreamError:
            answers = [{"group_id": g["group_id"], "topics": [],
                        "error_code": int(ErrorCode.COORDINATOR_NOT_AVAILABLE)}
                       for g in forwarded]
    groups = []
    it = iter(answers)
    for index, group in enumerate(value["groups"]):
        if index in failed:
            groups.append({"group_id": group["group_id"], "topics": [],
                           "error_code": failed[index]})
        else:
            groups.append(next(it))
    return {"throttle_time_ms": 0, "groups": groups}


def subscribed_topic_names(service: CoordinatorService, group_id: str) -> set[str]:
    group = service.engine.group(group_id)
    if group is None:
        return set()
    names = set(group.subscribed_names)
    for resolved in group.resolved_regex.values():
        names.update(resolved)
    return names


async def offset_delete(service: CoordinatorService, version: int, value: dict[str, Any]
                        ) -> dict[str, Any]:
    group_id = value["group_id"]
    membership = service.membership(group_id)
    subscribed = subscribed_topic_names(service, group_id)
    refused = [t for t in value["topics"] if t["name"] in subscribed]
    rest = [t for t in value["topics"] if t["name"] not in subscribed]
    topics: list[dict[str, Any]] = []
    error = 0
    if rest:
        target = membership.coordinator if membership and membership.coordinator else None
        if target is None:
            error = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        else:
            try:
                response = await service.pool.link(target).request(
                    OFFSET_DELETE, version, dict(value, topics=rest))
                error = response["error_code"]
                topics.extend(response["topics"])
            except UpstreamError:
                error = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    for t in refused:
        topics.append({"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": GROUP_SUBSCRIBED_TO_TOPIC}
            for p in t["partitions"]]})
    return {"error_code": error, "throttle_time_ms": 0,
            "topics": topics if error == 0 else []}
