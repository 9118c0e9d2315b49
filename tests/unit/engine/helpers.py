"""Shared helpers for the engine unit tests: a scripted assignor, topic fixtures, request
builders and a way to seed a group in a given state (like Kafka's tests replay records)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence

from translation.assignors.base import GroupSpec
from translation.config import GroupConfig, OffsetCommitRule
from translation.coordinator import GroupCoordinator
from translation.group import ConsumerGroup
from translation.heartbeat import (
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)
from translation.member import ConsumerGroupMember
from translation.target import TargetAssignment
from translation.topics import SubscribedTopicDescriber, TopicId, TopicMetadata, TopicsImage

FOO = uuid.UUID(int=0xF00)
BAR = uuid.UUID(int=0xBA2)


def image(**topics: tuple[TopicId, int]) -> TopicsImage:
    return TopicsImage.of([TopicMetadata(tid, name, n) for name, (tid, n) in topics.items()])


class ScriptedAssignor:
    """Returns whatever target the test put in ``next``; members it does not mention get
    nothing. Records every GroupSpec it was called with."""

    def __init__(self, name: str = "scripted") -> None:
        self._name = name
        self.next: dict[str, dict[TopicId, frozenset[int]]] = {}
        self.calls: list[GroupSpec] = []

    @property
    def name(self) -> str:
        return self._name

    def assign(
        self, group: GroupSpec, topics: SubscribedTopicDescriber
    ) -> dict[str, dict[TopicId, frozenset[int]]]:
        self.calls.append(group)
        return {mid: dict(self.next.get(mid, {})) for mid in group.members}


def target(**members: Mapping[TopicId, Iterable[int]]) -> dict[str, dict[TopicId, frozenset[int]]]:
    return {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in members.items()}


def make_engine(
    topics: TopicsImage,
    *assignors: object,
    rule: OffsetCommitRule = OffsetCommitRule.RELAXED,
    **kwargs: object,
) -> GroupCoordinator:
    """An engine computing targets on every heartbeat unless told otherwise (the KIP's model),
    without a departure wait (Kafka's)."""
    kwargs.setdefault("assignment_interval_ms", 0)
    kwargs.setdefault("classic_departure_wait_ms", 0)
    config = GroupConfig(assignors=list(assignors), offset_commit_rule=rule, **kwargs)  # type: ignore[arg-type]
    return GroupCoordinator(config, topics)


def join(
    group_id: str,
    member_id: str,
    *,
    topics: Sequence[str] | None = ("foo",),
    regex: str | None = None,
    instance_id: str | None = None,
    assignor: str | None = None,
    rebalance_timeout_ms: int = 5000,
) -> ConsumerGroupHeartbeatRequest:
    return ConsumerGroupHeartbeatRequest(
        group_id=group_id,
        member_id=member_id,
        member_epoch=0,
        instance_id=instance_id,
        rebalance_timeout_ms=rebalance_timeout_ms,
        subscribed_topic_names=topics,
        subscribed_topic_regex=regex,
        server_assignor=assignor,
        topic_partitions=[],
    )


def hb(
    group_id: str,
    member_id: str,
    epoch: int,
    owned: Mapping[TopicId, Iterable[int]] | None = None,
    **fields: object,
) -> ConsumerGroupHeartbeatRequest:
    tps = None if owned is None else [(t, sorted(ps)) for t, ps in owned.items()]
    return ConsumerGroupHeartbeatRequest(
        group_id=group_id,
        member_id=member_id,
        member_epoch=epoch,
        topic_partitions=tps,
        **fields,  # type: ignore[arg-type]
    )


def assignment(resp: ConsumerGroupHeartbeatResponse) -> dict[TopicId, list[int]] | None:
    if resp.assignment is None:
        return None
    return {t: sorted(ps) for t, ps in resp.assignment if ps}


def parts(member: ConsumerGroupMember) -> dict[TopicId, list[int]]:
    return {t: sorted(ps) for t, ps in member.assigned.items() if ps}


def held(member: ConsumerGroupMember) -> dict[TopicId, list[int]]:
    """Assigned plus pending revocation: what the KIP lists as a member's partitions."""
    out: dict[TopicId, set[int]] = {}
    for source in (member.assigned, member.pending_revocation):
        for t, ps in source.items():
            out.setdefault(t, set()).update(ps)
    return {t: sorted(ps) for t, ps in out.items() if ps}


def revoking(member: ConsumerGroupMember) -> dict[TopicId, list[int]]:
    return {t: sorted(ps) for t, ps in member.pending_revocation.items() if ps}


def pending(group: ConsumerGroup, member_id: str) -> dict[TopicId, list[int]]:
    """The KIP's "pending-partitions": target partitions the member does not have yet."""
    member = group.members[member_id]
    out = {}
    for t, ps in group.target.of(member_id).items():
        missing = sorted(set(ps) - set(member.assigned.get(t, {})))
        if missing:
            out[t] = missing
    return out


def target_of(group: ConsumerGroup) -> dict[str, dict[TopicId, list[int]]]:
    return {
        m: {t: sorted(ps) for t, ps in a.items() if ps} for m, a in group.target.members.items()
    }


def seed(
    engine: GroupCoordinator,
    group_id: str,
    *,
    group_epoch: int,
    target_epoch: int,
    members: Mapping[str, tuple[int, Mapping[TopicId, Iterable[int]]]],
    targets: Mapping[str, Mapping[TopicId, Iterable[int]]],
    topics: Sequence[str] = ("foo",),
    now_ms: int = 0,
    rebalance_timeout_ms: int = 5000,
) -> ConsumerGroup:
    """Install a group in a given state, as if it had been running (records replayed)."""
    group = engine.create_group(
        group_id, [], group_epoch=group_epoch,
        target=TargetAssignment(
            target_epoch,
            {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in targets.items()}))
    for member_id, (epoch, assigned) in members.items():
        member = ConsumerGroupMember(
            member_id,
            subscribed_topic_names=frozenset(topics),
            rebalance_timeout_ms=rebalance_timeout_ms,
            member_epoch=epoch,
            previous_member_epoch=epoch - 1,
        )
        member.assigned = {t: dict.fromkeys(ps, epoch) for t, ps in assigned.items()}
        engine.add_member(group, member, [])
        engine.schedule_session_timeout(group, member, now_ms, [])
    engine.refresh_group(group)
    return group
