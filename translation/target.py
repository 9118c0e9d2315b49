"""The target assignment of a group and how it is recomputed.

The target assignment is the declarative assignment every member converges to: an
assignment epoch (the group epoch it was computed for) and, per member, the partitions the
assignor gave it. It is recomputed only when the group epoch is ahead of the assignment
epoch. The assignor sees every member's subscription and current target (for stickiness);
afterwards only members whose target actually changed are rewritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from translation.assignors.base import (
    GroupSpec,
    MemberSubscription,
    PartitionAssignor,
    SubscriptionType,
)
from translation.topics import TopicId

MemberTarget = dict[TopicId, frozenset[int]]

EMPTY_TARGET: Mapping[TopicId, frozenset[int]] = {}


@dataclass(slots=True)
class TargetAssignment:
    epoch: int = 0
    members: dict[str, MemberTarget] = field(default_factory=dict)

    def of(self, member_id: str) -> Mapping[TopicId, frozenset[int]]:
        return self.members.get(member_id, EMPTY_TARGET)


class SubscriptionMetadataDescriber:
    """``SubscribedTopicDescriber`` over the group's subscribed topic metadata."""

    __slots__ = ("_counts",)

    def __init__(self, counts: Mapping[TopicId, int]) -> None:
        self._counts = counts

    def partition_count(self, topic_id: TopicId) -> int:
        return self._counts.get(topic_id, -1)


def normalize(assignment: Mapping[TopicId, frozenset[int]]) -> MemberTarget:
    """Drop empty topics and make every value a frozenset."""
    return {t: frozenset(ps) for t, ps in assignment.items() if ps}


def compute_target(
    assignor: PartitionAssignor,
    specs: Mapping[str, MemberSubscription],
    subscription_type: SubscriptionType,
    partition_counts: Mapping[TopicId, int],
    current: TargetAssignment,
    epoch: int,
) -> list[str]:
    """Run the assignor, install its result at ``epoch`` and return the changed member ids.

    Raises :class:`~translation.assignors.base.AssignorError` (and leaves ``current``
    untouched) when the assignor fails.
    """
    result = assignor.assign(
        GroupSpec(members=specs, subscription_type=subscription_type),
        SubscriptionMetadataDescriber(partition_counts),
    )
    old = current.members
    new: dict[str, MemberTarget] = {}
    changed: list[str] = []
    for member_id in specs:
        assignment = result.get(member_id)
        previous = old.get(member_id)
        if previous is not None and (assignment == previous or (not assignment and not previous)):
            new[member_id] = previous  # unchanged: keep the very same objects
            continue
        fresh = normalize(assignment) if assignment else {}
        if previous is not None and previous == fresh:
            new[member_id] = previous
        else:
            new[member_id] = fresh
            changed.append(member_id)
    current.members = new
    current.epoch = epoch
    return changed
