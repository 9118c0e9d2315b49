"""What a bridged member takes in and gives out, already decoded (topics by name).

In: the KIP-848 client's heartbeat (:class:`ClientHeartbeat`), the broker's JoinGroup answer
(:class:`BrokerJoinAnswer`, its members' subscriptions decoded), and the broker's SyncGroup,
Heartbeat and LeaveGroup answers as :mod:`translation.classic.messages` decodes them. Out: the
requests to send to the broker (:data:`BrokerRequest`) and the client's answer
(:class:`ClientAnswer`). The proxy's driver (``proxy/coordination/bridged.py``) encodes and
decodes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from translation.classic.client_assignors import ClassicGroupMember
from translation.classic.messages import (
    ClassicAssignment,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
)


@dataclass(frozen=True, slots=True)
class ClientHeartbeat:
    """The parts of a ConsumerGroupHeartbeat the bridged member needs."""

    member_epoch: int
    """0 joining, -1 leaving, -2 a static member leaving for now."""
    owned: Mapping[str, Sequence[int]] | None = None
    """Owned partitions by topic name; None: unchanged since the last heartbeat."""
    subscribed_names: Sequence[str] | None = None
    """Subscribed topic names, a regex already resolved; None: unchanged."""


@dataclass(frozen=True, slots=True)
class ClientAnswer:
    error_code: int = 0
    member_epoch: int = 0
    assignment: Mapping[str, frozenset[int]] | None = None
    """The whole assignment by topic name (the proxy maps names to ids)."""
    heartbeat_interval_ms: int = 0


@dataclass(frozen=True, slots=True)
class BrokerJoinAnswer:
    """A JoinGroup answer; ``members`` is filled for the leader only."""

    error_code: int = 0
    generation_id: int = -1
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: Sequence[ClassicGroupMember] = ()


@dataclass(frozen=True, slots=True)
class LeaderSyncGroupRequest:
    """A SyncGroup; the leader's carries every member's assignment (others send none)."""

    group_id: str
    member_id: str
    generation_id: int
    group_instance_id: str | None
    protocol_type: str
    protocol_name: str
    assignments: Sequence[tuple[str, ClassicAssignment]] = field(default_factory=tuple)


BrokerRequest = JoinGroupRequest | LeaderSyncGroupRequest | HeartbeatRequest | LeaveGroupRequest
"""A request the bridged member sends to the broker's coordinator."""
