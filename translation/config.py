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


def random_member_id() -> str:
    return str(uuid.uuid4())


@dataclass(slots=True)
class GroupConfig:
    assignors: Sequence[PartitionAssignor]
    """Server-side assignors; the first is the default (Kafka: uniform, then range)."""
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    max_group_size: int = 2**31 - 1
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

    def __post_init__(self) -> None:
        if not self.assignors:
            raise ValueError("at least one server-side assignor must be configured")
        names = [a.name for a in self.assignors]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate assignor names: {names}")
        if self.session_timeout_ms <= 0 or self.heartbeat_interval_ms <= 0:
            raise ValueError("timeouts must be positive")
