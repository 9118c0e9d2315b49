"""A consumer group member as the coordinator bookkeeps it.

A member has its identity (member id, optional static instance id, rack, client id/host),
its subscription (topic names and/or a regex, preferred server assignor, rebalance timeout)
and its *current assignment*: the member epoch, the previous member epoch, the reconciliation
state, the partitions assigned to it and the partitions pending revocation. Each partition
carries its *assignment epoch* (the epoch at which it was given to this member), which the
relaxed offset-commit rule needs.

``protocol`` says whether the member speaks ConsumerGroupHeartbeat (``CONSUMER``) or the
classic JoinGroup/SyncGroup/Heartbeat APIs (``CLASSIC``, translated onto the same
reconciliation later); only a few places differ (offset-commit error code, describe's member
type, timers).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING

from translation.topics import TopicId

if TYPE_CHECKING:
    from translation.classic.member import ClassicMemberMetadata

PartitionEpochs = dict[TopicId, dict[int, int]]
"""Partitions per topic, each with its assignment epoch."""

LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2


class MemberState(enum.Enum):
    STABLE = "stable"
    """At its target epoch with every target partition (or at an older epoch, not yet told)."""
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    """Must revoke partitions before moving to the target epoch."""
    UNRELEASED_PARTITIONS = "unreleased_partitions"
    """At the target epoch, waiting for partitions other members still own."""
    UNKNOWN = "unknown"
    """Unknown (future persisted) state: the member is fenced unless it owns nothing."""


class MemberProtocol(enum.Enum):
    CONSUMER = "consumer"
    CLASSIC = "classic"


class MemberType(enum.IntEnum):
    """ConsumerGroupDescribe v1 MemberType."""

    UNKNOWN = -1
    CLASSIC = 0
    CONSUMER = 1


class ConsumerGroupMember:
    """Mutable member record; the group owns it and keeps its indexes in step."""

    __slots__ = (
        "assigned",
        "classic",
        "client_host",
        "client_id",
        "epoch_bump_only",
        "instance_id",
        "member_epoch",
        "member_id",
        "pending_revocation",
        "previous_member_epoch",
        "protocol",
        "rack_id",
        "rebalance_timeout_ms",
        "server_assignor",
        "session_timeout_ms",
        "state",
        "subscribed_topic_names",
        "subscribed_topic_regex",
    )

    def __init__(
        self,
        member_id: str,
        *,
        instance_id: str | None = None,
        rack_id: str | None = None,
        client_id: str = "",
        client_host: str = "",
        subscribed_topic_names: frozenset[str] = frozenset(),
        subscribed_topic_regex: str | None = None,
        server_assignor: str | None = None,
        rebalance_timeout_ms: int = -1,
        member_epoch: int = 0,
        previous_member_epoch: int = 0,
        state: MemberState = MemberState.STABLE,
        protocol: MemberProtocol = MemberProtocol.CONSUMER,
    ) -> None:
        self.member_id = member_id
        self.instance_id = instance_id
        self.rack_id = rack_id
        self.client_id = client_id
        self.client_host = client_host
        self.subscribed_topic_names = subscribed_topic_names
        self.subscribed_topic_regex = subscribed_topic_regex
        self.server_assignor = server_assignor
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.member_epoch = member_epoch
        self.previous_member_epoch = previous_member_epoch
        self.state = state
        self.protocol = protocol
        self.epoch_bump_only = False
        """Whether the move from the previous member epoch to the current one changed nothing
        but the epoch: the same partitions are assigned, none was pending revocation, none
        revoked or added. It lets the lost-response rule accept the previous epoch without
        owned partitions (:func:`translation.heartbeat.lost_response`). Kept in memory only:
        False (Kafka's rule alone) for a member created, loaded from the state log or moved by
        anything but reconciliation."""
        self.session_timeout_ms: int | None = None
        """Per-member session timeout (classic members bring theirs); None: the group's."""
        self.assigned: PartitionEpochs = {}
        self.pending_revocation: PartitionEpochs = {}
        self.classic: ClassicMemberMetadata | None = None
        """JoinGroup-side state of a classic member (:mod:`translation.classic`); else None."""

    def __repr__(self) -> str:
        return (
            f"ConsumerGroupMember({self.member_id!r}, epoch={self.member_epoch}, "
            f"prev={self.previous_member_epoch}, state={self.state.name}, "
            f"assigned={_fmt(self.assigned)}, pending_revocation={_fmt(self.pending_revocation)})"
        )

    @property
    def member_type(self) -> MemberType:
        if self.protocol is MemberProtocol.CONSUMER:
            return MemberType.CONSUMER
        return MemberType.CLASSIC

    def is_reconciled_to(self, target_epoch: int) -> bool:
        return self.state is MemberState.STABLE and self.member_epoch == target_epoch

    def assigned_partitions(self) -> dict[TopicId, frozenset[int]]:
        """Assigned partitions without their epochs (what the heartbeat response carries)."""
        return {t: frozenset(ps) for t, ps in self.assigned.items()}

    def revoking_partitions(self) -> dict[TopicId, frozenset[int]]:
        return {t: frozenset(ps) for t, ps in self.pending_revocation.items()}

    def assignment_epoch(self, topic_id: TopicId, partition: int) -> int | None:
        """The assignment epoch of a partition this member holds (assigned or revoking)."""
        ps = self.assigned.get(topic_id)
        if ps is not None:
            epoch = ps.get(partition)
            if epoch is not None:
                return epoch
        ps = self.pending_revocation.get(topic_id)
        if ps is not None:
            return ps.get(partition)
        return None


def _fmt(assignment: Mapping[TopicId, Mapping[int, int]]) -> str:
    parts = []
    for topic_id in sorted(assignment):
        ps = assignment[topic_id]
        parts.append(f"{str(topic_id)[:8]}:{sorted(ps)}")
    return "{" + ", ".join(parts) + "}"
