"""The assignor interface, shaped after Kafka's ``ConsumerGroupPartitionAssignor``.

``GroupSpec`` carries, per member, the subscribed topic ids and the member's *current target*
assignment (what the previous target gave it), which sticky assignors try to keep.
``assign`` returns the complete new target: member id -> topic id -> partitions. Members with
nothing assigned are present with an empty mapping.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from translation.topics import SubscribedTopicDescriber, TopicId

Assignment = Mapping[TopicId, frozenset[int]]
"""Partitions per topic id for one member."""


class SubscriptionType(enum.Enum):
    HOMOGENEOUS = "homogeneous"
    """Every member subscribes to the same set of topics."""
    HETEROGENEOUS = "heterogeneous"


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    subscribed_topic_ids: frozenset[TopicId]
    assigned_partitions: Assignment
    """The member's current target assignment (input for stickiness)."""


@dataclass(frozen=True, slots=True)
class GroupSpec:
    members: Mapping[str, MemberSubscription]
    subscription_type: SubscriptionType


class AssignorError(Exception):
    """The assignor could not compute an assignment for this input."""


class PartitionAssignor(Protocol):
    """A server-side assignor. ``name`` is what clients put in ``ServerAssignor``."""

    @property
    def name(self) -> str: ...

    def assign(
        self, group: GroupSpec, topics: SubscribedTopicDescriber
    ) -> dict[str, dict[TopicId, frozenset[int]]]:
        """Return the new target assignment for every member of ``group``."""
        ...


def looks_homogeneous(group: GroupSpec) -> bool:
    """Whether a group flagged homogeneous really has one subscription set for everyone.

    Kafka's assignors trust the flag; this is a cheap guard against a mislabelled group. It
    compares sizes and hashes (a frozenset caches its hash, computed in C from its entries'
    stored hashes) rather than whole sets, which would cost ``O(members x topics)`` comparisons.
    """
    if group.subscription_type is not SubscriptionType.HOMOGENEOUS:
        return False
    subscriptions = iter(group.members.values())
    first = next(subscriptions, None)
    if first is None:
        return True
    topics = first.subscribed_topic_ids
    size, digest = len(topics), hash(topics)
    return all(
        m.subscribed_topic_ids is topics
        or (len(m.subscribed_topic_ids) == size and hash(m.subscribed_topic_ids) == digest)
        for m in subscriptions
    )
