"""ConsumerGroupDescribe and ListGroups views of the engine's groups.

Plain dataclasses with Kafka's field names in snake_case; topic names are filled in from the
current topics image (empty when the topic is gone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from translation.errors import ErrorCode
from translation.topics import TopicId, TopicsImage

if TYPE_CHECKING:
    from translation.state import CoordinatorState


@dataclass(frozen=True, slots=True)
class DescribedTopicPartitions:
    topic_id: TopicId
    topic_name: str
    partitions: list[int]


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: list[str]
    subscribed_topic_regex: str | None
    assignment: list[DescribedTopicPartitions]
    target_assignment: list[DescribedTopicPartitions]
    member_type: int
    """ConsumerGroupDescribe v1: 1 consumer, 0 classic."""
    state: str
    """Reconciliation state (not on the wire; for operators and tests)."""
    partitions_pending_revocation: list[DescribedTopicPartitions]


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    error_code: int
    group_id: str
    error_message: str | None = None
    group_state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: list[DescribedMember] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    group_state: str
    group_type: str


def _topic_partitions(
    assignment: Mapping[TopicId, Mapping[int, int] | frozenset[int]], image: TopicsImage
) -> list[DescribedTopicPartitions]:
    out = []
    for topic_id in sorted(assignment):
        meta = image.by_id.get(topic_id)
        out.append(
            DescribedTopicPartitions(
                topic_id, meta.name if meta is not None else "", sorted(assignment[topic_id])
            )
        )
    return out


def describe_group(engine: CoordinatorState, group_id: str) -> DescribedGroup:
    group = engine.groups.get(group_id)
    if group is None:
        return DescribedGroup(
            error_code=int(ErrorCode.GROUP_ID_NOT_FOUND),
            group_id=group_id,
            error_message=f"Group {group_id} not found.",
            group_state="Dead",
        )
    image = engine.image
    members = [
        DescribedMember(
            member_id=m.member_id,
            instance_id=m.instance_id,
            rack_id=m.rack_id,
            member_epoch=m.member_epoch,
            client_id=m.client_id,
            client_host=m.client_host,
            subscribed_topic_names=sorted(m.subscribed_topic_names),
            subscribed_topic_regex=m.subscribed_topic_regex,
            assignment=_topic_partitions(m.assigned, image),
            target_assignment=_topic_partitions(group.target.of(m.member_id), image),
            member_type=int(m.member_type),
            state=m.state.name,
            partitions_pending_revocation=_topic_partitions(m.pending_revocation, image),
        )
        for m in group.members.values()
    ]
    return DescribedGroup(
        error_code=0,
        group_id=group_id,
        group_state=group.state.value,
        group_epoch=group.group_epoch,
        assignment_epoch=group.target.epoch,
        assignor_name=group.preferred_assignor,
        members=members,
    )


def list_groups(engine: CoordinatorState, states_filter: Sequence[str]) -> list[ListedGroup]:
    wanted = {s.lower() for s in states_filter}
    out = []
    for group_id, group in engine.groups.items():
        state = group.state.value
        if wanted and state.lower() not in wanted:
            continue
        out.append(ListedGroup(group_id, "consumer", state, "consumer"))
    return out
