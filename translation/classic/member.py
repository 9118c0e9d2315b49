"""The classic side of a member: what the engine keeps about a JoinGroup/SyncGroup client, and
its state machine.

The engine's :class:`~translation.member.ConsumerGroupMember` holds the reconciliation state
(epoch, assigned and revoking partitions) like for any member; a classic member additionally
carries a :class:`ClassicMemberMetadata` in ``member.classic`` (as Kafka's member carries its
``classicMemberMetadata``): its session timeout, the protocols it offered (names, in preference
order), the version of its subscription (the assignment is encoded at that version) and its
position in the classic per-member state machine.

Theory of operation
===================

KIP-848 gives each classic member of a consumer group its own three states, with no
group-wide barrier:

* PREPARE_REBALANCE: the member must (re)join: it is new, or it was told to rejoin
  (REBALANCE_IN_PROGRESS), or its JoinGroup is *held* until the group's target is computed;
* COMPLETING_REBALANCE: its JoinGroup was answered; a SyncGroup is expected within the
  rebalance timeout. Its SyncGroup may be *held* until the partitions it waits for are
  released by their previous owners;
* STABLE: its SyncGroup was answered; heartbeats keep the session.

A position is a state plus which of the member's requests the engine holds (:class:`Held`):
nothing, its JoinGroup (only in PREPARE_REBALANCE) or its SyncGroup (only in
COMPLETING_REBALANCE). Every change of position is an :class:`ClassicEvent` looked up in
:data:`TRANSITIONS`; a pair missing from the table is a bug in the caller and raises
:class:`ClassicStateError`, so the table is the whole of what can happen:

=====================  ===========  ====================  =====================  ===========
from                   held         event                 to                     held
=====================  ===========  ====================  =====================  ===========
any state              nothing      JOIN_HELD             PREPARE_REBALANCE      JOIN
any state              nothing      JOIN_ANSWERED         COMPLETING_REBALANCE   nothing
PREPARE_REBALANCE      JOIN         JOIN_ANSWERED         COMPLETING_REBALANCE   nothing
PREPARE_REBALANCE      JOIN         HELD_ANSWERED         PREPARE_REBALANCE      nothing
any state              nothing      SYNC_HELD             COMPLETING_REBALANCE   SYNC
COMPLETING_REBALANCE   SYNC         HELD_ANSWERED         COMPLETING_REBALANCE   nothing
COMPLETING_REBALANCE   SYNC         SYNC_ANSWERED         STABLE                 nothing
any state              nothing      SYNC_ANSWERED         STABLE                 nothing
any state              nothing      TOLD_TO_REJOIN        PREPARE_REBALANCE      nothing
PREPARE_REBALANCE      JOIN         TOLD_TO_REJOIN        PREPARE_REBALANCE      JOIN
=====================  ===========  ====================  =====================  ===========

A member answers SyncGroup from any state with nothing held: the engine checks the generation
and the target, not the state, so a member told to rejoin whose target turned out unchanged may
still complete its sync, and a STABLE member may sync again (then it is completing a rebalance
while that SyncGroup is held). HELD_ANSWERED is a held request
answered with an error (the member sent the request again, was replaced, removed, or its group
handed back); a held SyncGroup that ends with REBALANCE_IN_PROGRESS is HELD_ANSWERED then
TOLD_TO_REJOIN.

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


class Held(enum.Enum):
    """Which request of the member the engine holds (the proxy keeps the client's request)."""

    NOTHING = "nothing"
    JOIN = "JoinGroup"
    SYNC = "SyncGroup"


class ClassicEvent(enum.Enum):
    JOIN_HELD = "JoinGroup held until the target is computed"
    JOIN_ANSWERED = "JoinGroup answered"
    SYNC_HELD = "SyncGroup held until partitions are released"
    SYNC_ANSWERED = "SyncGroup answered with an assignment"
    HELD_ANSWERED = "held request answered with an error"
    TOLD_TO_REJOIN = "told to rejoin (REBALANCE_IN_PROGRESS)"


class ClassicStateError(Exception):
    """A transition the table does not allow: the engine's bookkeeping is wrong."""


Position = tuple[ClassicMemberState, Held]

_PREPARE = ClassicMemberState.PREPARE_REBALANCE
_COMPLETING = ClassicMemberState.COMPLETING_REBALANCE
_STABLE = ClassicMemberState.STABLE
_ALL = tuple(ClassicMemberState)


def _table() -> dict[tuple[Position, ClassicEvent], Position]:
    table: dict[tuple[Position, ClassicEvent], Position] = {}
    for state in _ALL:
        free = (state, Held.NOTHING)
        table[(free, ClassicEvent.JOIN_HELD)] = (_PREPARE, Held.JOIN)
        table[(free, ClassicEvent.JOIN_ANSWERED)] = (_COMPLETING, Held.NOTHING)
        table[(free, ClassicEvent.SYNC_ANSWERED)] = (_STABLE, Held.NOTHING)
        table[(free, ClassicEvent.TOLD_TO_REJOIN)] = (_PREPARE, Held.NOTHING)
        table[(free, ClassicEvent.SYNC_HELD)] = (_COMPLETING, Held.SYNC)
    held_join = (_PREPARE, Held.JOIN)
    table[(held_join, ClassicEvent.JOIN_ANSWERED)] = (_COMPLETING, Held.NOTHING)
    table[(held_join, ClassicEvent.HELD_ANSWERED)] = (_PREPARE, Held.NOTHING)
    table[(held_join, ClassicEvent.TOLD_TO_REJOIN)] = held_join
    held_sync = (_COMPLETING, Held.SYNC)
    table[(held_sync, ClassicEvent.HELD_ANSWERED)] = (_COMPLETING, Held.NOTHING)
    table[(held_sync, ClassicEvent.SYNC_ANSWERED)] = (_STABLE, Held.NOTHING)
    return table


TRANSITIONS: dict[tuple[Position, ClassicEvent], Position] = _table()
"""(position, event) -> position: every move a classic member can make."""


@dataclass(slots=True)
class PendingJoin:
    """A JoinGroup the engine holds: what it needs to answer it later."""

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
    held: Held = Held.NOTHING
    pending_join: PendingJoin | None = None
    """The held JoinGroup's content; set exactly while ``held`` is JOIN."""
    sync_hold_deadline: int = 0
    """When a held SyncGroup is answered at the latest (engine clock, ms)."""
    generation: int = -1
    """The generation id the client was last given."""
    user_data: bytes | None = field(default=None)
    """The subscription's userData (kept for describe; never sent back)."""

    @property
    def protocol_name(self) -> str:
        return self.protocols[0]

    @property
    def position(self) -> Position:
        return (self.state, self.held)

    def transition(self, event: ClassicEvent, pending_join: PendingJoin | None = None) -> Held:
        """Move by ``event`` (``pending_join`` with JOIN_HELD); returns what was held before."""
        before = self.held
        after = TRANSITIONS.get((self.position, event))
        if after is None:
            raise ClassicStateError(
                f"{event.name} is not allowed in {self.state.name} with {before.name} held")
        self.state, self.held = after
        if self.held is Held.JOIN:
            if event is ClassicEvent.JOIN_HELD:
                assert pending_join is not None
                self.pending_join = pending_join
        else:
            self.pending_join = None
        return before
