"""Classic group API messages as the engine sees them, already decoded by the proxy.

Field names follow Kafka's JSON schemas in snake_case. The embedded consumer protocol is
decoded too: each JoinGroup protocol carries its :class:`ClassicSubscription` (``None`` when
the metadata bytes did not parse as ``ConsumerProtocolSubscription``), and SyncGroup returns a
:class:`ClassicAssignment` the proxy encodes as ``ConsumerProtocolAssignment`` at
``assignment.version``. Topics are names here; the engine maps them to ids with its
:class:`~translation.topics.TopicsImage`.

Version notes the proxy applies when decoding: JoinGroup v0 has no rebalance timeout (use the
session timeout); LeaveGroup v0-v2 name one member (``members`` holds it; the response's
top-level error code is that member's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

CONSUMER_PROTOCOL_TYPE = "consumer"
UNKNOWN_MEMBER_ID = ""


@dataclass(frozen=True, slots=True)
class ClassicSubscription:
    """``ConsumerProtocolSubscription`` (versions 0-3)."""

    version: int
    topics: Sequence[str]
    user_data: bytes | None = None
    owned_partitions: Sequence[tuple[str, Sequence[int]]] = ()
    """v1+: ``(topic name, partitions)`` the member still owns; eager clients send none."""
    generation_id: int = -1
    """v2+."""
    rack_id: str | None = None
    """v3+."""


@dataclass(frozen=True, slots=True)
class ClassicProtocol:
    """One JoinGroup protocol: an assignor name and the member's subscription for it."""

    name: str
    subscription: ClassicSubscription | None
    """None: the metadata is not a valid consumer-protocol subscription."""


@dataclass(frozen=True, slots=True)
class ClassicAssignment:
    """``ConsumerProtocolAssignment`` to encode at ``version``; never carries userData."""

    version: int
    partitions: Sequence[tuple[str, Sequence[int]]]


@dataclass(frozen=True, slots=True)
class JoinGroupRequest:
    group_id: str
    member_id: str
    protocol_type: str
    protocols: Sequence[ClassicProtocol]
    session_timeout_ms: int
    rebalance_timeout_ms: int = -1
    """-1 (v0): the session timeout is used."""
    group_instance_id: str | None = None
    reason: str | None = None
    api_version: int = 9
    client_id: str = ""
    client_host: str = ""


@dataclass(slots=True)
class JoinGroupResponse:
    error_code: int = 0
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    """Always empty: the engine assigns, every classic member is a follower."""
    skip_assignment: bool = False
    member_id: str = ""
    members: list[object] = field(default_factory=list)
    """Always empty (no member is leader)."""
    throttle_time_ms: int = 0
    error_message: str | None = None
    """Not on the wire (JoinGroup has no ErrorMessage); for logs and tests."""


@dataclass(frozen=True, slots=True)
class SyncGroupRequest:
    group_id: str
    member_id: str
    generation_id: int
    group_instance_id: str | None = None
    protocol_type: str | None = None
    """v5+; None when absent."""
    protocol_name: str | None = None
    """v5+; None when absent."""
    api_version: int = 5


@dataclass(slots=True)
class SyncGroupResponse:
    error_code: int = 0
    protocol_type: str | None = None
    """v5+: the join's protocol type (``consumer``)."""
    protocol_name: str | None = None
    """v5+: the join's protocol name (the member's first protocol)."""
    assignment: ClassicAssignment | None = None
    """None with an error (the wire carries empty bytes)."""
    throttle_time_ms: int = 0
    error_message: str | None = None
    """Not on the wire; for logs and tests."""


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    generation_id: int
    group_instance_id: str | None = None
    api_version: int = 4


@dataclass(slots=True)
class HeartbeatResponse:
    error_code: int = 0
    throttle_time_ms: int = 0
    error_message: str | None = None
    """Not on the wire; for logs and tests."""


@dataclass(frozen=True, slots=True)
class LeavingMember:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest:
    group_id: str
    members: Sequence[LeavingMember]
    api_version: int = 5


@dataclass(frozen=True, slots=True)
class LeavingMemberResponse:
    member_id: str
    group_instance_id: str | None
    error_code: int = 0


@dataclass(slots=True)
class LeaveGroupResponse:
    error_code: int = 0
    members: list[LeavingMemberResponse] = field(default_factory=list)
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class HeldRequest:
    """The engine keeps a JoinGroup or SyncGroup for now: the driver holds the client's
    request until a :class:`~translation.effects.JoinCompleted` /
    :class:`~translation.effects.SyncCompleted` effect for (``group_id``, ``member_id``)
    answers it (``member_id`` is the one the engine gave, for a join without one)."""

    group_id: str
    member_id: str
