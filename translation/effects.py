"""Effects: what the engine asks its driver to do or wants it to know.

Every entry point of :class:`~translation.coordinator.GroupCoordinator` returns a list of
these plain dataclasses next to its response. Timer effects let a driver arm real timers
(it may equally ignore them and call ``tick``); the others are notifications for logs,
metrics and the proxy's own bookkeeping (e.g. when to give up a broker-side membership).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from translation.timers import TimerKey

if TYPE_CHECKING:
    from translation.classic.messages import JoinGroupResponse, SyncGroupResponse


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
class MemberTooLarge:
    """A member was refused (nothing of the group changed) because its state record would
    not fit the state log (:class:`~translation.errors.StateRecordTooLarge`)."""

    group_id: str
    member_id: str
    api: str
    """``"consumer-group-heartbeat"`` or ``"join-group"``."""
    record_bytes: int
    limit: int


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
    """``"session-timeout"``, ``"rebalance-timeout"`` or ``"pod-local"`` (the sidecar next
    to the member saw its process go, :meth:`GroupCoordinator.fence_member`); classic members
    also ``"join-timeout"`` and ``"sync-timeout"``."""


@dataclass(frozen=True, slots=True)
class DepartureWaitStarted:
    """A member left a group that has eager classic members: its next target waits for a
    replacement until ``until_ms`` at the latest (:mod:`translation.departures`)."""

    group_id: str
    member_id: str
    until_ms: int


@dataclass(frozen=True, slots=True)
class DepartureWaitEnded:
    """The group's departure wait is over: ``arrived`` came for ``departed`` (fewer: it ran
    out, or no eager classic member is left) after ``waited_ms``; the target is computed."""

    group_id: str
    departed: tuple[str, ...]
    arrived: tuple[str, ...]
    waited_ms: int


@dataclass(frozen=True, slots=True)
class GroupEmptied:
    group_id: str


@dataclass(frozen=True, slots=True)
class GroupExpired:
    """The group stayed empty past the expiry delay and was deleted (DEAD)."""

    group_id: str


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    """An empty group was deleted on request (DeleteGroups)."""

    group_id: str


@dataclass(frozen=True, slots=True)
class GroupLost:
    """The proxy no longer holds the group's lock (another coordinator may hold it now): the
    engine forgot the group with its members; their next requests find the group's current
    coordinator and they rejoin there."""

    group_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class GroupLoaded:
    """The group was rebuilt from its records (this coordinator took it over): its members go
    on with their member ids, epochs and partitions; every member has a full session from the
    load."""

    group_id: str
    group_epoch: int
    assignment_epoch: int
    members: int


@dataclass(frozen=True, slots=True)
class JoinCompleted:
    """A classic JoinGroup the engine answered with "pending" is complete: send ``response``
    to the client whose JoinGroup (``group_id``, ``member_id``) the proxy is holding."""

    group_id: str
    member_id: str
    response: JoinGroupResponse


@dataclass(frozen=True, slots=True)
class SyncCompleted:
    """A classic SyncGroup the engine answered with "pending" (held until the partitions the
    member waits for are released) is complete: send ``response`` to the client whose
    SyncGroup (``group_id``, ``member_id``) the proxy is holding."""

    group_id: str
    member_id: str
    response: SyncGroupResponse


@dataclass(frozen=True, slots=True)
class GroupHandedBack:
    """The engine gave the group up (downgrade): only classic members were left and the
    migration policy lets the broker's classic coordinator take it back. The proxy stops
    coordinating the group and forwards its requests to the broker again; the classic members
    listed rejoin there (their next request gets UNKNOWN_MEMBER_ID from the broker)."""

    group_id: str
    reason: str
    members: Sequence[tuple[str, str | None]]
    """``(member_id, instance_id)`` of the classic members that were in the group."""


@dataclass(frozen=True, slots=True)
class ReleasedMember:
    """A member of a group handed back to the broker's classic coordinator (what its sidecar
    needs to carry it over: a classic client rejoins the broker's group itself; a KIP-848
    client gets a bridged member that joins with the partitions it owns and keeps its epoch
    until the broker's first generation)."""

    member_id: str
    consumer_protocol: bool
    """True: a KIP-848 (consumer-protocol) member; False: a classic one."""
    member_epoch: int
    owned: Sequence[tuple[str, Sequence[int]]]
    """What the client may still own, by topic name: assigned or pending revocation."""
    subscribed_topic_names: Sequence[str] = ()
    client_id: str = ""
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1


@dataclass(frozen=True, slots=True)
class GroupReleased:
    """The engine handed the group back to the broker's classic coordinator (a release: the
    ``groupgate release`` command or the downgrade policy). Its records become tombstones; the
    proxy leaves the broker's group and carries the members over (:class:`ReleasedMember`).
    Held classic requests were answered REBALANCE_IN_PROGRESS."""

    group_id: str
    reason: str
    protocol: str | None
    """The classic protocol the broker's group will select from the members' votes (None: no
    protocol every classic member supports)."""
    members: Sequence[ReleasedMember]


Effect = (
    TimerArmed
    | TimerCancelled
    | GroupCreated
    | GroupEpochBumped
    | TargetAssignmentComputed
    | TargetAssignmentFailed
    | MemberJoined
    | MemberTooLarge
    | MemberReplaced
    | MemberLeft
    | MemberFenced
    | DepartureWaitStarted
    | DepartureWaitEnded
    | GroupEmptied
    | GroupExpired
    | GroupDeleted
    | GroupLost
    | GroupLoaded
    | JoinCompleted
    | SyncCompleted
    | GroupHandedBack
    | GroupReleased
)
