"""The bridged member: the classic member a sidecar runs in the broker's group on behalf of one
KIP-848 client (decision record 0018, "Members behind sidecars in the broker phase").

The proxy feeds it (``proxy/coordination/bridged.py``). It joins with the *member
mark* as client id (``gg3|<fleet address>|<KIP-848 member id>|<client id>``), offers the
group's current protocol first and then ``cooperative-sticky``, ``range``, ``roundrobin``,
``sticky`` (so that its vote never changes the protocol the broker selects), puts the
client's owned partitions in its subscription (v3: owned partitions, generation, rack), runs
the selected client assignor when the broker elects it leader
(:mod:`translation.classic.client_assignors`), and heartbeats every third of its session. The
member epoch the client is told is the broker generation of its last SyncGroup.

Theory of operation
===================

KIP-848's order holds: partitions leave the client before any are added. The client is shown
``assignment ∩ owned`` while it still owns a partition outside the broker's assignment (the
revocations), and the whole assignment only once it reported those released.

* Eager protocols (``range``, ``roundrobin``, ``sticky``): a rebalance (REBALANCE_IN_PROGRESS,
  a changed subscription) while the client owns partitions first answers the client an empty
  assignment at its current epoch (RELEASING) and rejoins once the client reported it owns
  nothing.
* ``cooperative-sticky``: the member rejoins at once with what it owns; the SyncGroup answer's
  revocations are shown first, the additions after the client released them; a member that
  revoked something rejoins once it has (the cooperative second round, as Kafka's
  ``ConsumerCoordinator`` requests it).
* UNKNOWN_MEMBER_ID and ILLEGAL_GENERATION mean the partitions are lost: the client is shown
  an empty assignment and the member rejoins at once owning nothing (without a member id
  after UNKNOWN_MEMBER_ID); what the next SyncGroup gives still waits for the client's
  release. FENCED_INSTANCE_ID (another member took the static member's instance id) and
  JoinGroup errors other than the retriable ones end the member (FAILED): the client is
  answered GROUP_ID_NOT_FOUND. The coordinator errors (NOT_COORDINATOR,
  COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS) keep the member's id and
  generation: a JoinGroup is sent again, a SyncGroup turns into a rejoin, a Heartbeat is
  simply sent again when due (the caller finds the coordinator again first).
* A client heartbeat at an epoch other than 0, the current one or the one before (a lost
  answer) is answered FENCED_MEMBER_EPOCH and changes nothing; the client then releases
  everything and comes back at epoch 0, which is taken as any heartbeat (its owned partitions
  are what it reports).
* The leader rejoins when the partition counts of the group's topics change
  (:meth:`BridgedMember.metadata_changed`), as Kafka's Java leader does.
* A member *carried over* from the engine (the group was released to the broker's classic
  coordinator, :meth:`BridgedMember.carry_over`) starts with the client's epoch and what the
  engine says it may own: the client keeps seeing those partitions at that epoch (never more
  than it reports owning) until the broker's first SyncGroup. Under a cooperative protocol it
  joins at once with them in its subscription; under an eager one it first has the client
  release everything (RELEASING), as any eager rebalance does, so that no other member is
  given them while the client still consumes them.
* The client leaving (epoch -1) sends LeaveGroup; a static member leaving for now (epoch -2)
  sends nothing and lets its session run out, as a Java static member does on close.

A change of state is a :class:`BridgeEvent` looked up in :data:`TRANSITIONS`; a pair missing
from the table raises :class:`BridgeStateError`:

==========  ==========  ==========
from        event       to
==========  ==========  ==========
UNJOINED    JOIN_SENT   JOINING
UNJOINED    REBALANCE   RELEASING
UNJOINED    FAILED      LEFT
UNJOINED    LEFT        LEFT
JOINING     JOIN_RETRY  JOINING
JOINING     JOINED      SYNCING
JOINING     FENCED      JOINING
JOINING     FAILED      LEFT
JOINING     LEAVE       LEAVING
JOINING     LEFT        LEFT
SYNCING     SYNCED      STABLE
SYNCING     REJOIN      JOINING
SYNCING     REBALANCE   RELEASING
SYNCING     FENCED      JOINING
SYNCING     FAILED      LEFT
SYNCING     LEAVE       LEAVING
SYNCING     LEFT        LEFT
STABLE      REJOIN      JOINING
STABLE      REBALANCE   RELEASING
STABLE      FENCED      JOINING
STABLE      FAILED      LEFT
STABLE      LEAVE       LEAVING
STABLE      LEFT        LEFT
RELEASING   RELEASED    JOINING
RELEASING   FENCED      JOINING
RELEASING   FAILED      LEFT
RELEASING   LEAVE       LEAVING
RELEASING   LEFT        LEFT
LEAVING     LEFT        LEFT
==========  ==========  ==========

One request of JoinGroup, SyncGroup, LeaveGroup is outstanding at a time, plus at most one
Heartbeat; an answer to a request that is not outstanding is stale and ignored. The broker
state the member keeps is one member's (bounded by its subscription).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from translation.bridge.messages import (
    BrokerJoinAnswer,
    BrokerRequest,
    ClientAnswer,
    ClientHeartbeat,
    LeaderSyncGroupRequest,
)
from translation.classic.client_assignors import (
    CLIENT_ASSIGNORS,
    COOPERATIVE_PROTOCOLS,
    assign,
    subscription_user_data,
)
from translation.classic.messages import (
    CONSUMER_PROTOCOL_TYPE,
    ClassicAssignment,
    ClassicProtocol,
    ClassicSubscription,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    LeaveGroupRequest,
    LeavingMember,
    SyncGroupResponse,
)
from translation.errors import ErrorCode

__all__ = ["TRANSITIONS", "BridgeEvent", "BridgeState", "BridgeStateError", "BridgedMember",
           "member_mark"]

SUBSCRIPTION_VERSION = 3
"""ConsumerProtocolSubscription v3: owned partitions (v1), generation (v2), rack (v3)."""

Partitions = dict[str, frozenset[int]]


class BridgeState(enum.Enum):
    UNJOINED = "no JoinGroup sent yet"
    JOINING = "JoinGroup outstanding"
    SYNCING = "SyncGroup outstanding"
    STABLE = "assigned; heartbeating"
    RELEASING = "eager rebalance: waiting for the client to release everything"
    LEAVING = "LeaveGroup outstanding (or to send once the member id is known)"
    LEFT = "done"


class BridgeEvent(enum.Enum):
    JOIN_SENT = "first JoinGroup sent"
    JOIN_RETRY = "JoinGroup answered MEMBER_ID_REQUIRED or REBALANCE_IN_PROGRESS; sent again"
    JOINED = "JoinGroup answered; SyncGroup sent"
    SYNCED = "SyncGroup answered with an assignment"
    REJOIN = "a rebalance with nothing to release first; JoinGroup sent"
    REBALANCE = "an eager rebalance while the client owns partitions"
    RELEASED = "the client reported it owns nothing; JoinGroup sent"
    FENCED = "UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION: partitions lost; JoinGroup sent"
    FAILED = "the group cannot take a bridged member"
    LEAVE = "the client left (epoch -1)"
    LEFT = "LeaveGroup answered, or nothing to leave"


class BridgeStateError(Exception):
    """A transition the table does not allow: the caller's bookkeeping is wrong."""


_S = BridgeState
_E = BridgeEvent
_LIVE = (_S.JOINING, _S.SYNCING, _S.STABLE, _S.RELEASING)

TRANSITIONS: dict[tuple[BridgeState, BridgeEvent], BridgeState] = {
    (_S.UNJOINED, _E.JOIN_SENT): _S.JOINING,
    (_S.UNJOINED, _E.REBALANCE): _S.RELEASING,
    (_S.UNJOINED, _E.FAILED): _S.LEFT,
    (_S.UNJOINED, _E.LEFT): _S.LEFT,
    (_S.JOINING, _E.JOIN_RETRY): _S.JOINING,
    (_S.JOINING, _E.JOINED): _S.SYNCING,
    (_S.SYNCING, _E.SYNCED): _S.STABLE,
    (_S.SYNCING, _E.REJOIN): _S.JOINING,
    (_S.SYNCING, _E.REBALANCE): _S.RELEASING,
    (_S.STABLE, _E.REJOIN): _S.JOINING,
    (_S.STABLE, _E.REBALANCE): _S.RELEASING,
    (_S.RELEASING, _E.RELEASED): _S.JOINING,
    (_S.LEAVING, _E.LEFT): _S.LEFT,
    **{(s, _E.FENCED): _S.JOINING for s in _LIVE},
    **{(s, _E.FAILED): _S.LEFT for s in _LIVE},
    **{(s, _E.LEAVE): _S.LEAVING for s in _LIVE},
    **{(s, _E.LEFT): _S.LEFT for s in _LIVE},
}
"""(state, event) -> state: every move a bridged member can make."""

_FENCING = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION})
_COORDINATOR = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                          ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})


def member_mark(fleet_address: str, member_id: str, client_id: str) -> str:
    """The JoinGroup client id that marks a bridged member (decision record 0018)."""
    return f"gg3|{fleet_address}|{member_id}|{client_id}"


def _norm(parts: Mapping[str, Sequence[int] | frozenset[int]]) -> Partitions:
    return {t: frozenset(p) for t, p in parts.items() if p}


def _minus(a: Partitions, b: Partitions) -> Partitions:
    return _norm({t: p - b.get(t, frozenset()) for t, p in a.items()})


def _and(a: Partitions, b: Partitions) -> Partitions:
    return _norm({t: p & b.get(t, frozenset()) for t, p in a.items()})


def _pairs(parts: Partitions) -> list[tuple[str, list[int]]]:
    return [(t, sorted(p)) for t, p in sorted(parts.items())]


class BridgedMember:
    """One KIP-848 client's classic member in the broker's group.

    Every input method returns the broker requests to send now; :meth:`client_answer` is what
    to answer the client's heartbeat with (None: no epoch yet, the caller answers a retriable
    error). ``now`` is the caller's clock in milliseconds.
    """

    def __init__(
        self,
        *,
        group_id: str,
        fleet_address: str,
        member_id: str,
        client_id: str,
        subscribed_names: Sequence[str],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        current_protocol: str | None = None,
        group_instance_id: str | None = None,
        rack_id: str | None = None,
        epoch: int = 0,
        owned: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        """``epoch`` and ``owned``: a member carried over from the engine
        (:meth:`carry_over`): the client's member epoch, and what it may own by topic."""
        self.group_id = group_id
        self.member_id = member_id
        self.client_id = member_mark(fleet_address, member_id, client_id)
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.current_protocol = current_protocol
        self.group_instance_id = group_instance_id
        self.rack_id = rack_id
        self.state = BridgeState.UNJOINED
        self.subscribed: tuple[str, ...] = tuple(sorted(set(subscribed_names)))
        self.joined_with: tuple[str, ...] = ()
        self.broker_member_id = ""
        self.generation = -1
        self.protocol: str | None = current_protocol
        self.leader = False
        self.epoch = 0
        """The member epoch the client was last told (0: none yet)."""
        self.previous_epoch = 0
        self.stale_heartbeat = False
        """The last client heartbeat's epoch was not 0, the current or the previous one."""
        self.client_owned: Partitions = {}
        self.assignment: Partitions = {}
        """What the broker's last SyncGroup answer gave (emptied when lost or eagerly released)."""
        self.owned_at_join: Partitions = {}
        self.followup = False
        """Cooperative: rejoin once the client released what the last SyncGroup revoked."""
        self.outstanding: type[BrokerRequest] | None = None
        self.heartbeat_outstanding = False
        self.next_heartbeat_ms: int | None = None
        self.error_code = 0
        self.carried = epoch > 0
        """Carried over from the engine: the client keeps its epoch and partitions until
        the broker's first generation."""
        if self.carried:
            self.epoch = self.previous_epoch = epoch
            self.client_owned = _norm(owned or {})
            self.assignment = dict(self.client_owned)

    # -- the table ---------------------------------------------------------------------------

    def _move(self, event: BridgeEvent) -> None:
        after = TRANSITIONS.get((self.state, event))
        if after is None:
            raise BridgeStateError(f"{event.name} is not allowed in {self.state.name}")
        self.state = after

    @property
    def cooperative(self) -> bool:
        return self.protocol in COOPERATIVE_PROTOCOLS

    @property
    def heartbeat_interval_ms(self) -> int:
        return max(1, self.session_timeout_ms // 3)

    # -- requests ----------------------------------------------------------------------------

    def protocols(self) -> list[str]:
        first = [self.current_protocol] if self.current_protocol in CLIENT_ASSIGNORS else []
        return list(dict.fromkeys([*first, *CLIENT_ASSIGNORS]))

    def _join(self, event: BridgeEvent, reason: str) -> list[BrokerRequest]:
        self._move(event)
        owned = _and(self.client_owned, self.assignment)
        self.owned_at_join = owned
        self.joined_with = self.subscribed
        pairs = _pairs(owned)
        self.outstanding = JoinGroupRequest
        return [JoinGroupRequest(
            group_id=self.group_id,
            member_id=self.broker_member_id,
            protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocols=[
                ClassicProtocol(name, ClassicSubscription(
                    version=SUBSCRIPTION_VERSION,
                    topics=list(self.subscribed),
                    user_data=subscription_user_data(name, pairs, self.generation),
                    owned_partitions=pairs,
                    generation_id=self.generation,
                    rack_id=self.rack_id,
                ))
                for name in self.protocols()
            ],
            session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            group_instance_id=self.group_instance_id,
            reason=reason,
            client_id=self.client_id,
        )]

    def _rebalance(self, reason: str) -> list[BrokerRequest]:
        """Rejoin, releasing everything first under an eager protocol."""
        if not self.cooperative:
            if self.client_owned:
                self._move(BridgeEvent.REBALANCE)
                self.outstanding = None
                return []
            self.assignment = {}
        return self._join(BridgeEvent.REJOIN, reason)

    def _fenced(self, error: int) -> list[BrokerRequest]:
        if error == ErrorCode.UNKNOWN_MEMBER_ID:
            self.broker_member_id = ""
        self.generation = -1
        self.assignment = {}
        self.followup = False
        return self._join(BridgeEvent.FENCED, f"fenced: error {error}")

    def _leave(self) -> list[BrokerRequest]:
        self.outstanding = LeaveGroupRequest
        return [LeaveGroupRequest(
            group_id=self.group_id,
            members=[LeavingMember(self.broker_member_id, self.group_instance_id,
                                   "the consumer left the group")],
        )]

    # -- inputs ------------------------------------------------------------------------------

    def client_heartbeat(self, heartbeat: ClientHeartbeat, now: int) -> list[BrokerRequest]:
        """The client's ConsumerGroupHeartbeat; then answer it with :meth:`client_answer`."""
        if self.state in (BridgeState.LEAVING, BridgeState.LEFT):
            return []
        if heartbeat.member_epoch < 0:
            return self.leave(static=heartbeat.member_epoch == -2)
        self.stale_heartbeat = heartbeat.member_epoch not in (0, self.epoch, self.previous_epoch)
        if self.stale_heartbeat:
            return []
        if heartbeat.owned is not None:
            self.client_owned = _norm(heartbeat.owned)
            if self.carried and self.generation < 0:
                # carried over: never shown more than it still owns before the broker gives
                self.assignment = _and(self.assignment, self.client_owned)
        out: list[BrokerRequest] = []
        if heartbeat.subscribed_names is not None:
            out += self.set_subscription(heartbeat.subscribed_names, now)
        if self.state is BridgeState.UNJOINED:
            if self.carried:
                return out  # joins once the broker's group is free (:meth:`carry_over`)
            if self.current_protocol is not None and self.current_protocol not in CLIENT_ASSIGNORS:
                return self._fail()
            return out + self._join(BridgeEvent.JOIN_SENT, "a KIP-848 member joined")
        if self.state is BridgeState.RELEASING and not self.client_owned:
            self.assignment = {}
            return out + self._join(BridgeEvent.RELEASED, "rebalance")
        if (self.state is BridgeState.STABLE and self.followup
                and not _minus(self.client_owned, self.assignment)):
            self.followup = False
            return out + self._rebalance("revoked partitions in a cooperative rebalance")
        return out

    def carry_over(self, now: int) -> list[BrokerRequest]:
        """Start a member carried over from the engine without waiting for its client's
        heartbeat: join with what it owns (cooperative), or first have the client release it
        (eager: RELEASING; the join follows the client's report that it owns nothing)."""
        if self.state is not BridgeState.UNJOINED:
            return []
        if self.current_protocol is not None and self.current_protocol not in CLIENT_ASSIGNORS:
            return self._fail()
        if not self.cooperative and self.client_owned:
            self._move(BridgeEvent.REBALANCE)
            return []
        return self._join(BridgeEvent.JOIN_SENT, "handed back to the broker's coordinator")

    def set_subscription(self, names: Sequence[str], now: int) -> list[BrokerRequest]:
        """The subscribed names changed (a regex resolved to other names): rejoin."""
        self.subscribed = tuple(sorted(set(names)))
        if self.state is BridgeState.STABLE and self.subscribed != self.joined_with:
            return self._rebalance("subscription changed")
        return []

    def leave(self, static: bool = False) -> list[BrokerRequest]:
        """The client left; ``static``: a static member leaving for now (no LeaveGroup)."""
        if self.state is BridgeState.UNJOINED or (static and self.group_instance_id):
            if self.state not in (BridgeState.LEAVING, BridgeState.LEFT):
                self._move(BridgeEvent.LEFT)
            return []
        if self.state in (BridgeState.LEAVING, BridgeState.LEFT):
            return []
        self._move(BridgeEvent.LEAVE)
        if not self.broker_member_id:
            self.outstanding = JoinGroupRequest if self.outstanding is JoinGroupRequest else None
            if self.outstanding is None:
                self._move(BridgeEvent.LEFT)
            return []
        return self._leave()

    def _fail(self, error: int = ErrorCode.GROUP_ID_NOT_FOUND) -> list[BrokerRequest]:
        self._move(BridgeEvent.FAILED)
        self.error_code = error
        self.outstanding = None
        return []

    def on_join_answer(self, answer: BrokerJoinAnswer, partition_counts: Mapping[str, int],
                       now: int) -> list[BrokerRequest]:
        """The broker answered the JoinGroup; ``partition_counts`` for the leader's assignor."""
        if self.outstanding is not JoinGroupRequest:
            return []
        self.outstanding = None
        if self.state is BridgeState.LEAVING:
            if answer.error_code == ErrorCode.NONE or answer.member_id:
                self.broker_member_id = answer.member_id
                return self._leave()
            self._move(BridgeEvent.LEFT)
            return []
        error = answer.error_code
        if error == ErrorCode.MEMBER_ID_REQUIRED:
            self.broker_member_id = answer.member_id
            return self._join(BridgeEvent.JOIN_RETRY, "member id required")
        if error == ErrorCode.REBALANCE_IN_PROGRESS or error in _COORDINATOR:
            return self._join(BridgeEvent.JOIN_RETRY, f"retry after error {error}")
        if error in _FENCING:
            return self._fenced(error)
        if error != ErrorCode.NONE:
            return self._fail()
        if answer.protocol_name not in CLIENT_ASSIGNORS:
            return self._fail()
        self.broker_member_id = answer.member_id
        self.generation = answer.generation_id
        self.protocol = answer.protocol_name
        self.leader = answer.leader == answer.member_id
        assignments: list[tuple[str, ClassicAssignment]] = []
        if self.leader:
            result = assign(answer.protocol_name, answer.members, partition_counts)
            assignments = [
                (member_id, ClassicAssignment(
                    SUBSCRIPTION_VERSION,
                    [(t, list(p)) for t, p in sorted(parts.items())]))
                for member_id, parts in sorted(result.items())
            ]
        self._move(BridgeEvent.JOINED)
        self.outstanding = LeaderSyncGroupRequest
        return [LeaderSyncGroupRequest(
            group_id=self.group_id,
            member_id=self.broker_member_id,
            generation_id=self.generation,
            group_instance_id=self.group_instance_id,
            protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocol_name=answer.protocol_name,
            assignments=assignments,
        )]

    def on_sync_answer(self, answer: SyncGroupResponse, now: int) -> list[BrokerRequest]:
        if self.outstanding is not LeaderSyncGroupRequest or self.state is not BridgeState.SYNCING:
            return []
        self.outstanding = None
        error = answer.error_code
        if error == ErrorCode.REBALANCE_IN_PROGRESS or error in _COORDINATOR:
            return self._rebalance(f"rejoin after error {error}")
        if error in _FENCING:
            return self._fenced(error)
        if error != ErrorCode.NONE or answer.assignment is None:
            return self._fail()
        self.assignment = _norm({t: frozenset(p) for t, p in answer.assignment.partitions})
        if self.generation != self.epoch:
            self.previous_epoch, self.epoch = self.epoch, self.generation
        self.followup = self.cooperative and bool(_minus(self.owned_at_join, self.assignment))
        self._move(BridgeEvent.SYNCED)
        self.next_heartbeat_ms = now + self.heartbeat_interval_ms
        if self.subscribed != self.joined_with:
            return self._rebalance("subscription changed")
        return []

    def on_heartbeat_answer(self, answer: HeartbeatResponse, now: int) -> list[BrokerRequest]:
        if not self.heartbeat_outstanding:
            return []
        self.heartbeat_outstanding = False
        self.next_heartbeat_ms = now + self.heartbeat_interval_ms
        if self.state is not BridgeState.STABLE:
            return []  # a rejoin is already on its way
        if answer.error_code == ErrorCode.REBALANCE_IN_PROGRESS:
            return self._rebalance("rebalance in progress")
        if answer.error_code in _FENCING:
            return self._fenced(answer.error_code)
        if answer.error_code == ErrorCode.FENCED_INSTANCE_ID:
            return self._fail()
        return []

    def metadata_changed(self, now: int) -> list[BrokerRequest]:
        """The partition counts of the group's topics changed: the leader rejoins."""
        if self.leader and self.state is BridgeState.STABLE:
            return self._rebalance("metadata changed")
        return []

    def on_leave_answer(self, now: int) -> list[BrokerRequest]:
        if self.outstanding is LeaveGroupRequest:
            self.outstanding = None
            self._move(BridgeEvent.LEFT)
        return []

    def poll(self, now: int) -> list[BrokerRequest]:
        """Time passed: a Heartbeat when one is due."""
        if (self.state not in (BridgeState.STABLE, BridgeState.RELEASING)
                or self.heartbeat_outstanding or self.next_heartbeat_ms is None
                or now < self.next_heartbeat_ms):
            return []
        self.heartbeat_outstanding = True
        return [HeartbeatRequest(self.group_id, self.broker_member_id, self.generation,
                                 self.group_instance_id)]

    @property
    def next_deadline_ms(self) -> int | None:
        """When :meth:`poll` has something to do next (None: nothing timed)."""
        if self.state in (BridgeState.STABLE, BridgeState.RELEASING) \
                and not self.heartbeat_outstanding:
            return self.next_heartbeat_ms
        return None

    # -- the client's answer -----------------------------------------------------------------

    def client_answer(self) -> ClientAnswer | None:
        """What to answer the client's heartbeat with now (None: no epoch to give yet)."""
        if self.error_code:
            return ClientAnswer(error_code=self.error_code, member_epoch=-1)
        if self.stale_heartbeat:
            return ClientAnswer(error_code=ErrorCode.FENCED_MEMBER_EPOCH, member_epoch=-1)
        if self.state in (BridgeState.LEAVING, BridgeState.LEFT):
            return ClientAnswer(member_epoch=-1, assignment={})
        interval = self.heartbeat_interval_ms
        if self.state is BridgeState.RELEASING:
            return ClientAnswer(member_epoch=self.epoch, assignment={},
                                heartbeat_interval_ms=interval)
        if self.epoch <= 0:
            return None
        if _minus(self.client_owned, self.assignment):
            shown = _and(self.assignment, self.client_owned)
        else:
            shown = dict(self.assignment)
        return ClientAnswer(member_epoch=self.epoch, assignment=shown,
                            heartbeat_interval_ms=interval)
