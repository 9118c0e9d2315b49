"""Configuration of the group engine (Kafka's ``group.consumer.*`` settings).

All durations are integer milliseconds, like every ``now_ms`` the engine receives.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from translation.assignors.base import PartitionAssignor


class OffsetCommitRule(enum.Enum):
    STRICT = "strict"
    """KIP-848: the commit's member epoch must equal the member's epoch."""
    RELAXED = "relaxed"
    """Relaxed fencing (Kafka 4.3+): assignment epoch <= commit epoch <= member epoch."""


class MigrationPolicy(enum.Enum):
    """Which conversions between the broker's classic group and the engine's group are allowed
    (Kafka's ``group.consumer.migration.policy``; see :mod:`translation.classic.migration`)."""

    BIDIRECTIONAL = "bidirectional"
    UPGRADE = "upgrade"
    """Only classic (broker) -> engine, when a new-protocol member joins a classic group."""
    DOWNGRADE = "downgrade"
    """Only engine -> classic (broker), when the last new-protocol member leaves."""
    DISABLED = "disabled"

    @property
    def upgrade_enabled(self) -> bool:
        return self in (MigrationPolicy.BIDIRECTIONAL, MigrationPolicy.UPGRADE)

    @property
    def downgrade_enabled(self) -> bool:
        return self in (MigrationPolicy.BIDIRECTIONAL, MigrationPolicy.DOWNGRADE)


CLASSIC_ASSIGNORS = frozenset({"range", "roundrobin", "sticky", "cooperative-sticky"})
"""Client-side assignors of the Java client and librdkafka whose assignments carry no userData;
a classic member whose first protocol is one of them can be served by the engine."""


def random_member_id() -> str:
    return str(uuid.uuid4())


@dataclass(slots=True)
class GroupConfig:
    assignors: Sequence[PartitionAssignor]
    """Server-side assignors; the first is the default (Kafka: uniform, then range)."""
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    max_group_size: int = 2**31 - 1
    max_members: int = 2**31 - 1
    """Members of all groups together; a new member beyond it gets COORDINATOR_NOT_AVAILABLE
    (retriable: the limit is this coordinator's, not the group's)."""
    max_subscription_topics: int = 2**31 - 1
    max_regex_bytes: int = 2**31 - 1
    empty_group_expiry_ms: int = 600_000
    """How long an EMPTY group is kept before it is deleted (DEAD)."""
    assignment_interval_ms: int = 1_000
    """Minimum time between two target computations of a group (Kafka 4.2+ batches them the
    same way, 1 s by default). Changes in between are folded into one computation, run by
    the first heartbeat after the interval or by the group's assignment timer. 0 computes on
    every heartbeat that finds the group epoch ahead (Kafka 4.0/4.1, the KIP's case studies)."""
    offset_commit_rule: OffsetCommitRule = OffsetCommitRule.RELAXED
    fence_partitions_held_by_others: bool = True
    """Reject a commit for a partition another member holds, even at the current epoch
    (stricter than Kafka; see :mod:`translation.offsets`)."""
    member_id_factory: Callable[[], str] = field(default=random_member_id)
    """Member ids for v0 requests with an empty MemberId (v1 clients bring their own)."""
    migration_policy: MigrationPolicy = MigrationPolicy.BIDIRECTIONAL
    """What may move between the broker's classic group and the engine (Kafka's semantics)."""
    adopt_classic_groups: bool = True
    """Serve groups whose members all speak the classic protocol on the engine too (each member
    reconciled on its own). False follows Kafka: such groups stay with the broker, and a group
    whose last new-protocol member leaves is handed back when downgrades are allowed."""
    classic_assignors: frozenset[str] = CLASSIC_ASSIGNORS
    """Protocol names a classic member's first protocol must have for the engine to take it."""
    classic_min_session_timeout_ms: int = 6_000
    classic_max_session_timeout_ms: int = 1_800_000
    """Kafka's ``group.min/max.session.timeout.ms``: JoinGroup outside: INVALID_SESSION_TIMEOUT."""
    defer_classic_join: bool = True
    """Hold a classic JoinGroup while the group's target assignment waits for the assignment
    interval, and complete it once the target is computed (one rebalance loop instead of two)."""
    quiet_classic_advance: bool = True
    """When the group epoch moves but a classic member's target is exactly what it has, advance
    it to the new epoch without asking it to rejoin (an eager client would revoke everything
    just to get the same partitions back). Its generation stays the one it was given; its
    commits at that generation stay valid under the relaxed commit rule, so this applies only
    with ``offset_commit_rule`` RELAXED. False follows Kafka: every classic member below the
    target epoch is sent REBALANCE_IN_PROGRESS."""
    classic_sync_hold_ms: int = 3_000
    """Hold the SyncGroup of a classic member whose target contains partitions other members
    still hold, and answer it as soon as they are released, so they move in one step instead
    of waiting for the member's next heartbeat and another JoinGroup/SyncGroup round. The hold
    lasts at most this long (3 s: the Java client's default heartbeat interval, within which a
    revoking classic member hears that it must revoke), its rebalance timeout, and half its
    session timeout; then the member gets what is free and collects the rest later. 0: never
    hold (Kafka's behaviour)."""
    classic_departure_wait_ms: int = 10_000
    """When a member leaves (LeaveGroup, a leave heartbeat; not a fence) and the group still
    has an eager classic member
    (one offering a protocol other than ``cooperative-sticky``: it revokes everything at each
    rebalance that touches it), hold the group's next target back until as many members have
    arrived as departed, at most this long from the first departure, so that a restarted
    application's departure and arrival are one target change (one round for eager members
    instead of two). The departed members' partitions stay unassigned meanwhile. 0: compute at
    once (Kafka's behaviour). See :mod:`translation.departures`."""
    durable_state: bool = False
    """Track which group and member records each call changes, for
    :meth:`~translation.coordinator.GroupCoordinator.drain_records` (the driver writes them to
    the group state topic and a coordinator taking over loads them). Off: nothing is tracked
    and ``drain_records`` refuses."""
    max_state_record_bytes: int | None = None
    """The largest state record (key and value bytes, :func:`translation.records.record_bytes`)
    the driver's state log can write; a member whose member record would be larger is refused
    before it is admitted or changed (:func:`translation.limits.check_member_record`). None: no
    limit (no state log)."""

    def __post_init__(self) -> None:
        if not self.assignors:
            raise ValueError("at least one server-side assignor must be configured")
        names = [a.name for a in self.assignors]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate assignor names: {names}")
        if self.session_timeout_ms <= 0 or self.heartbeat_interval_ms <= 0:
            raise ValueError("timeouts must be positive")
        if self.classic_departure_wait_ms < 0:
            raise ValueError("classic_departure_wait_ms must not be negative")
        if self.max_state_record_bytes is not None and self.max_state_record_bytes < 1024:
            raise ValueError("max_state_record_bytes is at least 1 KiB")
