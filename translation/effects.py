"""Effects: what the engine asks its driver to do or wants it to know.

Every entry point of :class:`~translation.coordinator.GroupCoordinator` returns a list of
these plain dataclasses next to its response. Timer effects let a driver arm real timers
(it may equally ignore them and call ``tick``); the others are notifications for logs,
metrics and the proxy's own bookkeeping (e.g. when to give up a broker-side membership).
"""

from __future__ import annotations

from dataclasses import dataclass

from translation.timers import TimerKey


@dataclass(frozen=True, slots=True)
class TimerArmed:
    key: TimerKey
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class TimerCancelled:
    key: TimerKey


@dataclass(frozen=True, slots=True)
class GroupCreated:
    group_id: str


@dataclass(frozen=True, slots=True)
class GroupEpochBumped:
    group_id: str
    group_epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class TargetAssignmentComputed:
    group_id: str
    assignment_epoch: int
    assignor: str
    changed_members: int


@dataclass(frozen=True, slots=True)
class TargetAssignmentFailed:
    """The assignor raised; the previous target stays and the next heartbeat retries."""

    group_id: str
    group_epoch: int
    assignor: str
    message: str


@dataclass(frozen=True, slots=True)
class MemberJoined:
    group_id: str
    member_id: str
    instance_id: str | None


@dataclass(frozen=True, slots=True)
class MemberReplaced:
    """A static member rejoined under a new member id and took over the old one's place."""

    group_id: str
    old_member_id: str
    new_member_id: str
    instance_id: str


@dataclass(frozen=True, slots=True)
class MemberLeft:
    group_id: str
    member_id: str
    static: bool
    """True for a static leave (epoch -2): the member keeps its partitions for a while."""


@dataclass(frozen=True, slots=True)
class MemberFenced:
    group_id: str
    member_id: str
    reason: str
    """``"session-timeout"`` or ``"rebalance-timeout"``."""


@dataclass(frozen=True, slots=True)
class GroupEmptied:
    group_id: str


@dataclass(frozen=True, slots=True)
class GroupExpired:
    """The group stayed empty past the expiry delay and was deleted (DEAD)."""

    group_id: str


Effect = (
    TimerArmed
    | TimerCancelled
    | GroupCreated
    | GroupEpochBumped
    | TargetAssignmentComputed
    | TargetAssignmentFailed
    | MemberJoined
    | MemberReplaced
    | MemberLeft
    | MemberFenced
    | GroupEmptied
    | GroupExpired
)
