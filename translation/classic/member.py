"""The classic side of a member: what the engine keeps about a JoinGroup/SyncGroup client.

The engine's :class:`~translation.member.ConsumerGroupMember` holds the reconciliation state
(epoch, assigned and revoking partitions) like for any member; a classic member additionally
carries a :class:`ClassicMemberMetadata` in ``member.classic``: its session timeout, the
protocols it offered (names, in preference order), the version of its subscription (the
assignment is encoded at that version) and its position in the classic per-member state
machine of KIP-848:

* PREPARE_REBALANCE: told to rejoin (REBALANCE_IN_PROGRESS), or its JoinGroup is held until the
  target assignment is computed;
* COMPLETING_REBALANCE: JoinGroup answered, SyncGroup expected within the rebalance timeout;
* STABLE: SyncGroup answered; heartbeats keep the session.

``generation`` is the generation id the client was last given (its JoinGroup response). It
equals the engine's member epoch except after a *quiet advance*: a member whose assignment the
new target leaves untouched is moved to the new epoch without a rejoin, and keeps sending the
generation it knows (see :mod:`translation.classic.coordinator`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ClassicMemberState(enum.Enum):
    PREPARE_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(slots=True)
class PendingJoin:
    """A JoinGroup the engine answered with "pending": the proxy holds the client's request."""

    owned: list[tuple[str, list[int]]]
    """Owned partitions (topic names) the member reported in that JoinGroup."""
    rebalance_timeout_ms: int


@dataclass(slots=True)
class ClassicMemberMetadata:
    session_timeout_ms: int
    protocols: tuple[str, ...]
    """Protocol names offered in the last JoinGroup, first = the one answered with."""
    subscription_version: int
    state: ClassicMemberState = ClassicMemberState.PREPARE_REBALANCE
    pending_join: PendingJoin | None = None
    sync_held: bool = False
    """Its SyncGroup is held until the partitions it waits for are released."""
    sync_hold_deadline: int = 0
    """When a held SyncGroup is answered at the latest (engine clock, ms)."""
    generation: int = -1
    """The generation id the client was last given."""
    user_data: bytes | None = field(default=None)
    """The subscription's userData (kept for describe; never sent back)."""

    @property
    def protocol_name(self) -> str:
        return self.protocols[0]
