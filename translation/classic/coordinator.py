"""Classic members on the KIP-848 engine: JoinGroup, SyncGroup, Heartbeat and LeaveGroup.

:class:`ClassicGroupCoordinator` rides on a :class:`~translation.coordinator.GroupCoordinator`
(it registers itself as an engine listener) and translates each classic request into the same
steps a ConsumerGroupHeartbeat takes, the way Kafka's ``GroupMetadataManager`` does for
classic members of a consumer group (``classicGroupJoinToConsumerGroup``,
``classicGroupSyncToConsumerGroup``, ``classicGroupHeartbeatToConsumerGroup``,
``classicGroupLeaveToConsumerGroup``):

JoinGroup
    protocol type ``consumer`` and a protocol name every other classic member supports, else
    INCONSISTENT_GROUP_PROTOCOL; v4+ dynamic member without a member id: MEMBER_ID_REQUIRED and a
    generated id; subscription parsed from the first protocol (malformed:
    INCONSISTENT_GROUP_PROTOCOL); get or create the member (a static member joining with an
    unknown member id replaces the one holding its instance id at once, inheriting its
    assignment, so a bounce needs no group-wide rebalance); update the subscription (group
    epoch bump if it changed or the member is new); compute the target if the group epoch is
    ahead; reconcile the member with the owned partitions of its subscription, against its
    target *filtered to its subscribed topics* (a classic client given partitions of topics it
    does not subscribe to rejoins forever). Response: generationId = member epoch,
    protocolName = the member's first protocol, no leader, no member list: every classic
    member is a follower and sends an empty SyncGroup. Arms the session timer (the member's
    own session timeout) and the sync timer (its rebalance timeout).

    **Deferred join.** When the group epoch is ahead of the target and the computation waits
    for the assignment interval (the group's assignment timer is armed), the JoinGroup is
    held: :meth:`ClassicGroupCoordinator.join_group` returns a
    :class:`~translation.classic.messages.HeldRequest` and the proxy
    keeps the client's request. Whatever engine call later computes the group's target (any
    heartbeat, JoinGroup, SyncGroup, or the assignment timer through ``tick``/``fire``)
    reconciles the member and emits :class:`~translation.effects.JoinCompleted` carrying the
    response. A held join is bounded by the assignment interval; it is completed with
    UNKNOWN_MEMBER_ID if its member is removed (or a new-protocol static member takes its
    instance id), FENCED_INSTANCE_ID if a classic static replacement takes its place,
    REBALANCE_IN_PROGRESS if the same member sends another JoinGroup. Where a member stands
    (PrepareRebalance, CompletingRebalance, Stable, and which request is held) is the state
    machine of :mod:`translation.classic.member`; :meth:`ClassicGroupCoordinator._move` is the
    only place it changes.

SyncGroup
    unknown member or a member using the new protocol: UNKNOWN_MEMBER_ID; instance id of
    another member: FENCED_INSTANCE_ID; generation != the one it was given: ILLEGAL_GENERATION;
    protocol type/name other than the join's: INCONSISTENT_GROUP_PROTOCOL; the target ahead of
    the member and the member not revoking: REBALANCE_IN_PROGRESS. Otherwise the member's
    assigned partitions (never those pending revocation), at the version of its subscription,
    without userData; the member is Stable.

    **Held sync.** A member whose target holds partitions other members still own
    (UNRELEASED_PARTITIONS) does not get a partial assignment at once: its SyncGroup is held
    (a ``HeldRequest``; the proxy keeps the request) and answered, through a
    :class:`~translation.effects.SyncCompleted` effect, by whichever request or timer releases
    the last of them, or with what is free when ``GroupConfig.classic_sync_hold_ms`` (bounded by
    its rebalance timeout and half its session timeout) runs out. A joining member thus gets
    its partitions the moment their previous owners let go, instead of on its next heartbeat
    and a second JoinGroup/SyncGroup round.

Heartbeat
    same validation, re-arms the session timer; REBALANCE_IN_PROGRESS when the member epoch is
    below the assignment epoch, when it must revoke, or when every partition it waits for has
    been released (Kafka's rule; KAFKA-20272 compares with the assignment epoch, not the
    group epoch, so members are not sent round while the target is still being batched). A
    member told to rejoin must send JoinGroup within its rebalance timeout (join timer).

LeaveGroup
    per member (v3+ batches): unknown or new-protocol member: UNKNOWN_MEMBER_ID; instance id
    mapped to another member: FENCED_INSTANCE_ID; else the member is removed (group epoch bump).

**Quiet advance** (``GroupConfig.quiet_classic_advance``, relaxed commit rule only). Kafka asks
every classic member below the group epoch to rejoin, so an eager client revokes everything on
every membership change just to get the same partitions back. Here a STABLE member whose
filtered target is exactly its assignment is moved to the target epoch in place when it next
heartbeats or syncs: no REBALANCE_IN_PROGRESS, and it keeps the generation it was given
(``ClassicMemberMetadata.generation``), which Heartbeat and SyncGroup check. Its partitions keep
their assignment epochs, so its commits at that generation pass the relaxed rule
(assignment epoch <= commit epoch <= member epoch). Only members that lose or gain something
are disturbed.

Eager clients report no owned partitions in JoinGroup, so their revocation completes at once;
cooperative clients report what they own and pass through UNREVOKED_PARTITIONS (a JoinGroup at
the old epoch, a SyncGroup without the revoked partitions, a new JoinGroup once revoked). There
is no special case for either.

Where this differs from Kafka, on purpose: quiet advance and held syncs (above; both can be
switched off); classic Heartbeat and SyncGroup compute a pending
target (Kafka 4.3 does it in the background), so an all-classic group converges after a
leave; a rejoining member's own protocols do not count against it in the protocol check;
LeaveGroup bumps the group epoch once per member (Kafka once per request).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from translation import heartbeat as hb
from translation import limits
from translation.config import OffsetCommitRule
from translation.coordinator import GroupCoordinator
from translation.durable import member_value
from translation.effects import (
    Effect,
    GroupHandedBack,
    GroupReleased,
    JoinCompleted,
    MemberFenced,
    MemberLeft,
    ReleasedMember,
    SyncCompleted,
)
from translation.errors import ErrorCode, GroupError
from translation.group import ConsumerGroup
from translation.member import ConsumerGroupMember, MemberProtocol, MemberState, PartitionEpochs
from translation.records import ClassicMemberValue, MemberValue
from translation.timers import TimerKey, TimerKind
from translation.topics import TopicId, TopicsImage

from .member import ClassicEvent, ClassicMemberMetadata, ClassicMemberState, Held, PendingJoin
from .messages import (
    CONSUMER_PROTOCOL_TYPE,
    UNKNOWN_MEMBER_ID,
    ClassicAssignment,
    ClassicSubscription,
    HeartbeatRequest,
    HeartbeatResponse,
    HeldRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    LeavingMemberResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from .migration import released_protocol

MAX_ASSIGNMENT_VERSION = 3
SLOW_HOLDER_MS = 500
"""A held SyncGroup stops waiting for a member that was told to revoke this long ago and
still holds the partitions (see ``ClassicGroupCoordinator._hold_until``)."""
OwnedIds = list[tuple[TopicId, list[int]]]
CLASSIC_TIMERS = (TimerKind.CLASSIC_JOIN, TimerKind.CLASSIC_SYNC)
"""The classic member timers this layer arms and fires (the hold timer is the held sync's)."""


@dataclass(slots=True)
class _JoiningMember:
    """A JoinGroup that passed every check: who joins, and how."""

    group: ConsumerGroup | None
    member: ConsumerGroupMember
    is_new: bool
    replaced: ConsumerGroupMember | None
    subscription: ClassicSubscription


class ClassicGroupCoordinator:
    """The classic group APIs of one engine. Create one per engine; it registers itself."""

    def __init__(self, engine: GroupCoordinator) -> None:
        self.engine = engine
        self.held: dict[Held, dict[str, set[str]]] = {Held.JOIN: {}, Held.SYNC: {}}
        """What is held -> group id -> members whose request of that kind is held; kept by
        :meth:`_move` alone, from each member's position."""
        self.told_at: dict[tuple[str, str], int] = {}
        """(group id, member id) -> when the member was told to revoke (classic: sent
        REBALANCE_IN_PROGRESS; new protocol: first seen revoking). A held SyncGroup stops
        waiting for a holder that has known for ``SLOW_HOLDER_MS`` and still not let go."""
        engine.listeners.append(self)

    def held_joins(self, group_id: str) -> set[str]:
        return self.held[Held.JOIN].get(group_id, set())

    def held_syncs(self, group_id: str) -> set[str]:
        return self.held[Held.SYNC].get(group_id, set())

    def _move(self, group: ConsumerGroup, member: ConsumerGroupMember, event: ClassicEvent,
              pending_join: PendingJoin | None = None) -> None:
        """The one place a classic member changes position (:mod:`translation.classic.member`)
        and the held-request indexes follow."""
        meta = member.classic
        assert meta is not None
        state = meta.state
        before = meta.transition(event, pending_join)
        after = meta.held
        if meta.state is not state:
            self.engine.classic_position_changed(group, member)
        if before is after:
            return
        if before is not Held.NOTHING:
            waiting = self.held[before].get(group.group_id)
            if waiting is not None:
                waiting.discard(member.member_id)
                if not waiting:
                    del self.held[before][group.group_id]
        if after is not Held.NOTHING:
            self.held[after].setdefault(group.group_id, set()).add(member.member_id)

    # ------------------------------------------------------------------ JoinGroup

    def join_group(
        self, request: JoinGroupRequest, now_ms: int
    ) -> tuple[JoinGroupResponse | HeldRequest, list[Effect]]:
        """Handle a JoinGroup; a :class:`HeldRequest` says the engine holds it (see the
        module docstring)."""
        effects: list[Effect] = []
        try:
            response = self._join(request, now_ms, effects)
        except GroupError as err:
            return (
                JoinGroupResponse(
                    error_code=int(err.code),
                    member_id=request.member_id,
                    error_message=err.message,
                ),
                effects,
            )
        self._after(request.group_id, now_ms, effects)
        return response, effects

    def _join(
        self, request: JoinGroupRequest, now_ms: int, effects: list[Effect]
    ) -> JoinGroupResponse | HeldRequest:
        joining = self._check_join(request, effects)
        if isinstance(joining, JoinGroupResponse):
            return joining
        return self._apply_join(request, joining, now_ms, effects)

    def _check_join(self, request: JoinGroupRequest, effects: list[Effect]
                    ) -> _JoiningMember | JoinGroupResponse:
        """Every check a JoinGroup must pass, before anything changes: raises GroupError, or
        answers MEMBER_ID_REQUIRED, or says who joins. The member's state record, as the
        join would leave it, must fit the state log (:func:`translation.limits.check_member_record`;
        INVALID_REQUEST, the member and its group untouched)."""
        engine = self.engine
        config = engine.config
        group_id = request.group_id
        if not group_id or not group_id.strip():
            raise GroupError(ErrorCode.INVALID_GROUP_ID, "GroupId can't be empty.")
        session = request.session_timeout_ms
        if not (
            config.classic_min_session_timeout_ms
            <= session
            <= config.classic_max_session_timeout_ms
        ):
            raise GroupError(ErrorCode.INVALID_SESSION_TIMEOUT, f"Session timeout {session}ms.")
        instance_id = request.group_instance_id
        if instance_id is not None and not instance_id.strip():
            raise GroupError(ErrorCode.INVALID_REQUEST, "GroupInstanceId can't be empty.")
        limits.check_group_id(group_id)
        limits.check_instance_id(instance_id)
        group = engine.groups.get(group_id)
        members: Mapping[str, ConsumerGroupMember] = group.members if group is not None else {}
        member_id = request.member_id
        unknown = member_id == UNKNOWN_MEMBER_ID
        if unknown:
            member_id = config.member_id_factory()
        if (
            group is not None
            and len(members) >= config.max_group_size
            and member_id not in members
            and (instance_id is None or instance_id not in group.static_members)
        ):
            raise GroupError(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"The consumer group has reached its maximum capacity of {config.max_group_size} "
                "members.",
            )
        existing = group.static_member(instance_id) if group and instance_id is not None else None
        self._check_protocols(group, request, member_id, existing)
        if unknown and instance_id is None and request.api_version >= 4:
            # KIP-394: the client must come back with the id it is given.
            return JoinGroupResponse(
                error_code=int(ErrorCode.MEMBER_ID_REQUIRED), member_id=member_id
            )
        subscription = request.protocols[0].subscription
        if subscription is None:
            raise GroupError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"Member {member_id}'s consumer protocol subscription is malformed.",
            )
        limits.check_subscription(subscription.topics, None,
                                  max_topics=config.max_subscription_topics,
                                  max_regex_bytes=config.max_regex_bytes)
        if engine.is_new_member(group_id, request.member_id, instance_id):
            engine.check_room_for_a_member()
        joining = self._joining(group, request, member_id, unknown, existing, subscription)
        limits.check_member_record(
            config, group_id, member_id,
            classic_member_value(joining.member, request, subscription),
            api="join-group", effects=effects)
        return joining

    @staticmethod
    def _joining(group: ConsumerGroup | None, request: JoinGroupRequest, member_id: str,
                 unknown: bool, existing: ConsumerGroupMember | None,
                 subscription: ClassicSubscription) -> _JoiningMember:
        """Who joins (a new member, a member rejoining, a static member replacing its old
        incarnation); nothing is changed yet."""
        members: Mapping[str, ConsumerGroupMember] = group.members if group is not None else {}
        instance_id = request.group_instance_id
        if instance_id is None:
            member = members.get(member_id)
            if member is None:
                new = ConsumerGroupMember(member_id, protocol=MemberProtocol.CLASSIC)
                return _JoiningMember(group, new, True, None, subscription)
            _check_classic(member)
            return _JoiningMember(group, member, False, None, subscription)
        if unknown:
            if existing is None:
                new = ConsumerGroupMember(
                    member_id, instance_id=instance_id, protocol=MemberProtocol.CLASSIC
                )
                return _JoiningMember(group, new, True, None, subscription)
            return _JoiningMember(group, _static_replacement(existing, member_id), False,
                                  existing, subscription)
        if group is None:
            raise GroupError(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
        existing = group.find_member(member_id, instance_id)
        _check_classic(existing)
        return _JoiningMember(group, existing, False, None, subscription)

    def _apply_join(self, request: JoinGroupRequest, joining: _JoiningMember, now_ms: int,
                    effects: list[Effect]) -> JoinGroupResponse | HeldRequest:
        engine = self.engine
        group, member = joining.group, joining.member
        group_id = request.group_id
        member_id = member.member_id
        session = request.session_timeout_ms
        subscription = joining.subscription
        # A member whose previous JoinGroup (or SyncGroup) is still held gets that one
        # answered first (REBALANCE_IN_PROGRESS), so a member never has two held requests.
        if not joining.is_new and joining.replaced is None and group is not None:
            self._answer_held(group, member, ErrorCode.REBALANCE_IN_PROGRESS, effects)
        if group is None:
            group = engine.create_group(group_id, effects)
        reasons: list[str] = []
        if group.group_epoch == 0:
            reasons.append("group created")
        if joining.replaced is not None:
            engine.replace_member(group, joining.replaced, member, effects)
        elif joining.is_new:
            engine.add_member(group, member, effects)
            reasons.append("member joined")
        engine.update_classic_metadata(
            group, member, session_timeout_ms=session,
            protocols=tuple(p.name for p in request.protocols),
            subscription_version=subscription.version, user_data=subscription.user_data)
        if engine.update_member(
            group,
            member,
            rack_id=subscription.rack_id,
            rebalance_timeout_ms=(request.rebalance_timeout_ms
                                  if request.rebalance_timeout_ms != -1 else session),
            session_timeout_ms=session,
            client_id=request.client_id,
            client_host=request.client_host,
            subscription=(frozenset(subscription.topics), None),
        ):
            reasons.append("subscription changed")

        # Group epoch and target, then either hold the join or reconcile and answer.
        engine.apply_member_changes(group, reasons, now_ms, effects)
        self._cancel_timers(group_id, member_id, effects)
        engine.schedule_session_timeout(group, member, now_ms, effects)
        owned = [(t, list(ps)) for t, ps in subscription.owned_partitions]
        if engine.config.defer_classic_join and engine.target_deferred(group):
            self._move(group, member, ClassicEvent.JOIN_HELD,
                       PendingJoin(owned, member.rebalance_timeout_ms))
            return HeldRequest(group_id, member_id)
        return self._complete_join(group, member, owned, now_ms, effects)

    def _check_protocols(
        self,
        group: ConsumerGroup | None,
        request: JoinGroupRequest,
        member_id: str,
        replaced: ConsumerGroupMember | None,
    ) -> None:
        if request.protocol_type != CONSUMER_PROTOCOL_TYPE or not request.protocols:
            raise GroupError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"Member {member_id}'s protocols are not supported.",
            )
        if group is None:
            return
        offered = {p.name for p in request.protocols}
        skip = {member_id} if replaced is None else {member_id, replaced.member_id}
        for other in group.members.values():
            meta = other.classic
            if meta is None or other.member_id in skip:
                continue
            offered.intersection_update(meta.protocols)
            if not offered:
                raise GroupError(
                    ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    f"Member {member_id}'s protocols are not supported.",
                )

    def _complete_join(
        self,
        group: ConsumerGroup,
        member: ConsumerGroupMember,
        owned: list[tuple[str, list[int]]],
        now_ms: int,
        effects: list[Effect],
    ) -> JoinGroupResponse:
        engine = self.engine
        meta = member.classic
        assert meta is not None
        self._reconcile(group, member, _owned_ids(owned, engine.image), now_ms, effects)
        self._move(group, member, ClassicEvent.JOIN_ANSWERED)
        if meta.generation != member.member_epoch:
            meta.generation = member.member_epoch
            engine.classic_position_changed(group, member)
        if member.state is not MemberState.UNREVOKED_PARTITIONS:
            self.told_at.pop((group.group_id, member.member_id), None)
        engine.cancel_timer(
            TimerKey(TimerKind.CLASSIC_JOIN, group.group_id, member.member_id), effects
        )
        engine.schedule_session_timeout(group, member, now_ms, effects)
        key = TimerKey(TimerKind.CLASSIC_SYNC, group.group_id, member.member_id)
        engine.arm_timer(key, now_ms + max(member.rebalance_timeout_ms, 0), effects)
        return JoinGroupResponse(
            generation_id=member.member_epoch,
            protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocol_name=meta.protocol_name,
            member_id=member.member_id,
        )

    def _reconcile(
        self,
        group: ConsumerGroup,
        member: ConsumerGroupMember,
        owned: OwnedIds | None,
        now_ms: int,
        effects: list[Effect],
    ) -> None:
        """The engine's reconciliation, against the target filtered to the subscription (a
        member holding partitions outside it is brought back in line at once)."""
        target = self.filtered_target(group, member)
        self.engine.reconcile_member(group, member, owned, now_ms, effects, target=target,
                                     subscription_changed=not _within(member.assigned, target))

    def filtered_target(
        self, group: ConsumerGroup, member: ConsumerGroupMember
    ) -> Mapping[TopicId, frozenset[int]]:
        """The member's target, restricted to the topics it subscribes to."""
        target = group.target.of(member.member_id)
        subscribed = group.member_topic_ids(member, self.engine.image)
        if all(t in subscribed for t in target):
            return target
        return {t: ps for t, ps in target.items() if t in subscribed}

    # ------------------------------------------------------------------ SyncGroup

    def sync_group(
        self, request: SyncGroupRequest, now_ms: int
    ) -> tuple[SyncGroupResponse | HeldRequest, list[Effect]]:
        """Handle a SyncGroup; a :class:`HeldRequest` says the engine holds it (see the
        module docstring)."""
        effects: list[Effect] = []
        try:
            response = self._sync(request, now_ms, effects)
        except GroupError as err:
            return SyncGroupResponse(error_code=int(err.code), error_message=err.message), effects
        self._after(request.group_id, now_ms, effects)
        return response, effects

    def _sync(
        self, request: SyncGroupRequest, now_ms: int, effects: list[Effect]
    ) -> SyncGroupResponse | HeldRequest:
        engine = self.engine
        group, member = self._validate_member(
            request.group_id, request.member_id, request.group_instance_id
        )
        meta = member.classic
        assert meta is not None
        _check_generation(member, request.generation_id)
        if meta.held is Held.SYNC:
            # The same member syncing twice: the earlier request is answered first.
            self._answer_held(group, member, ErrorCode.REBALANCE_IN_PROGRESS, effects)
        if request.protocol_type is not None and request.protocol_type != CONSUMER_PROTOCOL_TYPE:
            raise GroupError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"The protocol type {request.protocol_type} is not {CONSUMER_PROTOCOL_TYPE}.",
            )
        if request.protocol_name is not None and request.protocol_name != meta.protocol_name:
            raise GroupError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"The protocol name {request.protocol_name} is not the one returned in the join "
                f"response ({meta.protocol_name}).",
            )
        engine.maybe_compute_target_assignment(group, now_ms, effects)
        join_held = meta.held is Held.JOIN
        if not join_held:
            self._advance_quietly(group, member, now_ms, effects)
            self._pick_up_released(group, member, now_ms, effects)
        if join_held or (
            group.target.epoch > member.member_epoch
            and member.state is not MemberState.UNREVOKED_PARTITIONS
        ):
            if not join_held:
                self._ask_to_rejoin(group, member, now_ms, effects)
            raise GroupError(
                ErrorCode.REBALANCE_IN_PROGRESS,
                f"A new rebalance is triggered in group {group.group_id} and member "
                f"{member.member_id} should rejoin to catch up.",
            )
        engine.cancel_timer(
            TimerKey(TimerKind.CLASSIC_SYNC, group.group_id, member.member_id), effects
        )
        if (
            engine.config.classic_sync_hold_ms > 0
            and member.state is MemberState.UNRELEASED_PARTITIONS
            and self._waits_on_others(group, member)
            and self._hold_sync(group, member, now_ms, effects)
        ):
            return HeldRequest(group.group_id, member.member_id)
        return self._sync_response(group, member, now_ms, effects)

    def _sync_response(
        self, group: ConsumerGroup, member: ConsumerGroupMember, now_ms: int, effects: list[Effect]
    ) -> SyncGroupResponse:
        meta = member.classic
        assert meta is not None
        self.engine.schedule_session_timeout(group, member, now_ms, effects)
        self._move(group, member, ClassicEvent.SYNC_ANSWERED)
        if member.state is not MemberState.UNREVOKED_PARTITIONS:
            self.told_at.pop((group.group_id, member.member_id), None)
        return SyncGroupResponse(
            protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocol_name=meta.protocol_name,
            assignment=self.assignment_of(group, member),
        )

    def _hold_sync(
        self, group: ConsumerGroup, member: ConsumerGroupMember, now_ms: int, effects: list[Effect]
    ) -> bool:
        """Keep the SyncGroup until the partitions the member waits for are released, for at
        most ``classic_sync_hold_ms``, its rebalance timeout and half its session timeout. The
        session timer is pushed past the hold: a client waiting for its SyncGroup may not
        heartbeat."""
        meta = member.classic
        assert meta is not None
        hold = max(0, min(self.engine.config.classic_sync_hold_ms, member.rebalance_timeout_ms,
                          meta.session_timeout_ms // 2))
        meta.sync_hold_deadline = now_ms + hold
        until = self._hold_until(group, member, now_ms)
        if until is None:
            return False
        self._move(group, member, ClassicEvent.SYNC_HELD)
        self.engine.schedule_session_timeout(group, member, now_ms + hold, effects)
        self._arm_hold_timer(group, member, until, effects)
        return True

    def _arm_hold_timer(
        self, group: ConsumerGroup, member: ConsumerGroupMember, when: int, effects: list[Effect]
    ) -> None:
        key = TimerKey(TimerKind.CLASSIC_SYNC_HOLD, group.group_id, member.member_id)
        if self.engine.timers.deadline(key) != when:
            self.engine.arm_timer(key, when, effects)

    def _hold_until(
        self, group: ConsumerGroup, member: ConsumerGroupMember, now_ms: int
    ) -> int | None:
        """Until when a held SyncGroup should keep waiting; None: answer it now.

        It waits while a partition of the member's target is held by a member that has not
        been told to revoke yet (it learns on its next heartbeat), up to the hold deadline;
        a holder that was told ``SLOW_HOLDER_MS`` ago and still holds on (stuck in its
        rebalance callback, say) is not waited for: the member gets what is free."""
        meta = member.classic
        assert meta is not None
        if now_ms >= meta.sync_hold_deadline or not self._still_waiting(group, member):
            return None
        give_up = 0
        group_id = group.group_id
        for holder_id in self._holders_awaited(group, member):
            holder = group.members.get(holder_id)
            if holder is None:
                continue
            told = self.told_at.get((group_id, holder_id))
            if holder.state is MemberState.UNREVOKED_PARTITIONS:
                if told is None:
                    told = self.told_at[(group_id, holder_id)] = now_ms
            elif told is None or holder.classic is None or (
                holder.classic.state is not ClassicMemberState.PREPARE_REBALANCE
            ):
                return meta.sync_hold_deadline  # not told yet: it learns on its next heartbeat
            give_up = max(give_up, told + SLOW_HOLDER_MS)
        if now_ms >= give_up:
            return None
        return min(give_up, meta.sync_hold_deadline)

    def _holders_awaited(self, group: ConsumerGroup, member: ConsumerGroupMember) -> set[str]:
        owner = group.owners.owner
        mid = member.member_id
        holders: set[str] = set()
        for topic_id, ps in self.filtered_target(group, member).items():
            have = member.assigned.get(topic_id, {})
            for p in ps:
                if p not in have:
                    holder = owner(topic_id, p)
                    if holder is not None and holder != mid:
                        holders.add(holder)
        return holders

    def _complete_held_sync(
        self,
        group: ConsumerGroup,
        member: ConsumerGroupMember,
        now_ms: int,
        effects: list[Effect],
        *,
        expired: bool,
    ) -> None:
        """Answer a held SyncGroup once the member waits on nobody (or the hold expired)."""
        meta = member.classic
        assert meta is not None and meta.held is Held.SYNC
        self._pick_up_released(group, member, now_ms, effects)
        if not expired:
            until = self._hold_until(group, member, now_ms)
            if until is not None:
                self._arm_hold_timer(group, member, until, effects)
                return
        self.engine.cancel_timer(
            TimerKey(TimerKind.CLASSIC_SYNC_HOLD, group.group_id, member.member_id), effects
        )
        response: SyncGroupResponse
        if group.target.epoch > member.member_epoch:
            self._move(group, member, ClassicEvent.HELD_ANSWERED)
            self._ask_to_rejoin(group, member, now_ms, effects)
            self.engine.schedule_session_timeout(group, member, now_ms, effects)
            response = SyncGroupResponse(error_code=int(ErrorCode.REBALANCE_IN_PROGRESS))
        else:
            response = self._sync_response(group, member, now_ms, effects)
        effects.append(SyncCompleted(group.group_id, member.member_id, response))

    def _still_waiting(self, group: ConsumerGroup, member: ConsumerGroupMember) -> bool:
        return (
            group.target.epoch == member.member_epoch
            and member.state is MemberState.UNRELEASED_PARTITIONS
            and self._waits_on_others(group, member)
        )

    def _release_held_syncs(self, group: ConsumerGroup, now_ms: int, effects: list[Effect]) -> None:
        waiting = self.held[Held.SYNC].get(group.group_id)
        if not waiting:
            return
        for member_id in sorted(waiting):
            member = group.members.get(member_id)
            if member is None or member.classic is None or member.classic.held is not Held.SYNC:
                continue  # answered by an earlier one's completion
            self._complete_held_sync(group, member, now_ms, effects, expired=False)

    def _after(self, group_id: str, now_ms: int, effects: list[Effect]) -> None:
        """After any classic request: answer held SyncGroups whose partitions are free now."""
        group = self.engine.groups.get(group_id)
        if group is not None:
            self._release_held_syncs(group, now_ms, effects)

    def _pick_up_released(self, group: ConsumerGroup, member: ConsumerGroupMember, now_ms: int,
                          effects: list[Effect]) -> None:
        """A member at the target epoch waiting for partitions takes those released since,
        at the same epoch (nothing the client was told changes but its assignment)."""
        if (
            member.state is MemberState.UNRELEASED_PARTITIONS
            and member.member_epoch == group.target.epoch
        ):
            self.engine.reconcile_member(group, member, None, now_ms, effects,
                                         target=self.filtered_target(group, member))

    def _advance_quietly(self, group: ConsumerGroup, member: ConsumerGroupMember, now_ms: int,
                         effects: list[Effect]) -> bool:
        """Move a stable member whose target is exactly its assignment to the target epoch
        without a rejoin (``GroupConfig.quiet_classic_advance``); its generation stays."""
        config = self.engine.config
        if (
            not config.quiet_classic_advance
            or config.offset_commit_rule is not OffsetCommitRule.RELAXED
            or member.state is not MemberState.STABLE
            or member.member_epoch >= group.target.epoch
            or member.classic is None
            or member.classic.state is ClassicMemberState.PREPARE_REBALANCE
        ):
            # A member already told to rejoin (its join timer armed) must rejoin: its client
            # may have revoked everything already.
            return False
        target = self.filtered_target(group, member)
        assigned = member.assigned
        if sum(1 for ps in assigned.values() if ps) != sum(1 for ps in target.values() if ps):
            return False
        by_id = self.engine.image.by_id
        if any(ps and topic_id not in by_id for topic_id, ps in assigned.items()):
            # A topic deleted (or recreated under its name) must reach the client by a rejoin:
            # it only knows names.
            return False
        for topic_id, ps in target.items():
            have = assigned.get(topic_id)
            if len(ps) != (len(have) if have else 0) or (have and not ps.issuperset(have)):
                return False
        self.engine.reconcile_member(group, member, None, now_ms, effects, target=target)
        return True

    def assignment_of(self, group: ConsumerGroup, member: ConsumerGroupMember) -> ClassicAssignment:
        """The member's assigned partitions (topic names), at its subscription's version."""
        meta = member.classic
        version = 0 if meta is None else meta.subscription_version
        subscribed = group.member_topic_ids(member, self.engine.image)
        by_id = self.engine.image.by_id
        partitions: list[tuple[str, list[int]]] = []
        for topic_id, ps in member.assigned.items():
            topic = by_id.get(topic_id)
            if topic is None or topic_id not in subscribed or not ps:
                continue
            partitions.append((topic.name, sorted(ps)))
        partitions.sort()
        return ClassicAssignment(max(0, min(version, MAX_ASSIGNMENT_VERSION)), partitions)

    # ------------------------------------------------------------------ Heartbeat

    def heartbeat(
        self, request: HeartbeatRequest, now_ms: int
    ) -> tuple[HeartbeatResponse, list[Effect]]:
        effects: list[Effect] = []
        try:
            group, member = self._validate_member(
                request.group_id, request.member_id, request.group_instance_id
            )
            _check_generation(member, request.generation_id)
        except GroupError as err:
            return HeartbeatResponse(error_code=int(err.code), error_message=err.message), effects
        self.engine.schedule_session_timeout(group, member, now_ms, effects)
        meta = member.classic
        assert meta is not None
        if meta.held is not Held.NOTHING:
            return HeartbeatResponse(), effects
        self.engine.maybe_compute_target_assignment(group, now_ms, effects)
        self._advance_quietly(group, member, now_ms, effects)
        if self.must_rejoin(group, member):
            self._ask_to_rejoin(group, member, now_ms, effects)
            response = HeartbeatResponse(error_code=int(ErrorCode.REBALANCE_IN_PROGRESS))
        else:
            response = HeartbeatResponse()
        self._release_held_syncs(group, now_ms, effects)
        return response, effects

    def must_rejoin(self, group: ConsumerGroup, member: ConsumerGroupMember) -> bool:
        """Whether the classic member has something to do that only a JoinGroup can carry."""
        if member.member_epoch < group.target.epoch:
            return True
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            return True
        if member.state is MemberState.UNRELEASED_PARTITIONS:
            return not self._waits_on_others(group, member)
        return False

    def _waits_on_others(self, group: ConsumerGroup, member: ConsumerGroupMember) -> bool:
        """Whether a partition of the member's target is still held by another member."""
        return bool(self._holders_awaited(group, member))

    # ------------------------------------------------------------------ LeaveGroup

    def leave_group(
        self, request: LeaveGroupRequest, now_ms: int
    ) -> tuple[LeaveGroupResponse, list[Effect]]:
        effects: list[Effect] = []
        engine = self.engine
        group = engine.groups.get(request.group_id)
        if group is None:
            return LeaveGroupResponse(error_code=int(ErrorCode.UNKNOWN_MEMBER_ID)), effects
        responses: list[LeavingMemberResponse] = []
        for leaving in request.members:
            if engine.groups.get(request.group_id) is not group:
                code = int(ErrorCode.UNKNOWN_MEMBER_ID)
                responses.append(
                    LeavingMemberResponse(leaving.member_id, leaving.group_instance_id, code)
                )
                continue
            try:
                member = self._leaving_member(group, leaving.member_id, leaving.group_instance_id)
            except GroupError as err:
                responses.append(
                    LeavingMemberResponse(
                        leaving.member_id, leaving.group_instance_id, int(err.code)
                    )
                )
                continue
            engine.remove_member(group, member, "member left", now_ms, effects, left=True)
            effects.append(MemberLeft(group.group_id, member.member_id, static=False))
            responses.append(LeavingMemberResponse(member.member_id, leaving.group_instance_id))
        top = 0
        if request.api_version < 3 and responses:
            top = responses[0].error_code
        self._after(request.group_id, now_ms, effects)
        return LeaveGroupResponse(error_code=top, members=responses), effects

    def _leaving_member(
        self, group: ConsumerGroup, member_id: str, instance_id: str | None
    ) -> ConsumerGroupMember:
        if instance_id is None:
            member = group.members.get(member_id)
            if member is None:
                raise GroupError(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is unknown.")
        else:
            found = group.static_member(instance_id)
            if found is None:
                raise GroupError(
                    ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown."
                )
            # Administrative removal by instance id comes without a member id.
            if member_id != UNKNOWN_MEMBER_ID and found.member_id != member_id:
                raise GroupError(
                    ErrorCode.FENCED_INSTANCE_ID, f"Instance id {instance_id} is fenced."
                )
            member = found
        _check_classic(member)
        return member

    # ------------------------------------------------------------------ engine listener

    def target_updated(self, group: ConsumerGroup, now_ms: int, effects: list[Effect]) -> None:
        """Complete the joins held for this group."""
        waiting = self.held[Held.JOIN].get(group.group_id)
        if not waiting:
            return
        for member_id in sorted(waiting):
            member = group.members.get(member_id)
            if member is None or member.classic is None or member.classic.pending_join is None:
                continue
            pending = member.classic.pending_join
            response = self._complete_join(group, member, pending.owned, now_ms, effects)
            effects.append(JoinCompleted(group.group_id, member_id, response))

    def member_removed(self, group: ConsumerGroup, member: ConsumerGroupMember, reason: str,
                       now_ms: int, effects: list[Effect]) -> None:
        self._forget(group, member, ErrorCode.UNKNOWN_MEMBER_ID, effects)
        if member.protocol is MemberProtocol.CLASSIC or not group.members:
            return
        config = self.engine.config
        if config.adopt_classic_groups or not config.migration_policy.downgrade_enabled:
            return
        if any(m.protocol is not MemberProtocol.CLASSIC for m in group.members.values()):
            return
        self.hand_back(group, f"last consumer-protocol member left ({reason})", effects)

    def member_replaced(self, group: ConsumerGroup, old: ConsumerGroupMember,
                        new: ConsumerGroupMember, effects: list[Effect]) -> None:
        # Its classic successor fences it; a new-protocol successor (the client rolled to the
        # new protocol) makes it a member this group no longer knows.
        code = (ErrorCode.FENCED_INSTANCE_ID if new.protocol is MemberProtocol.CLASSIC
                else ErrorCode.UNKNOWN_MEMBER_ID)
        self._forget(group, old, code, effects)

    def member_reconciled(self, group: ConsumerGroup, member: ConsumerGroupMember,
                          assigned_before: PartitionEpochs, revoking_before: PartitionEpochs,
                          effects: list[Effect]) -> None:
        """Nothing to do: held requests follow from ``group_changed`` after every call."""

    def group_dropped(self, group: ConsumerGroup, effects: list[Effect]) -> None:
        for index in self.held.values():
            index.pop(group.group_id, None)

    def group_changed(self, group: ConsumerGroup, now_ms: int, effects: list[Effect]) -> None:
        self._release_held_syncs(group, now_ms, effects)

    def group_loaded(self, group: ConsumerGroup, now_ms: int, effects: list[Effect]) -> None:
        """A member loaded while preparing a rebalance must (re)join, one completing it must
        sync, each within its rebalance timeout from the load (a request the old coordinator
        held died with it; the client sends it again)."""
        for member in group.members.values():
            meta = member.classic
            if meta is None:
                continue
            if meta.state is ClassicMemberState.PREPARE_REBALANCE:
                kind = TimerKind.CLASSIC_JOIN
            elif meta.state is ClassicMemberState.COMPLETING_REBALANCE:
                kind = TimerKind.CLASSIC_SYNC
            else:
                continue
            self.engine.arm_timer(TimerKey(kind, group.group_id, member.member_id),
                                  now_ms + max(member.rebalance_timeout_ms, 0), effects)

    def timer_fired(
        self, group: ConsumerGroup, key: TimerKey, now_ms: int, effects: list[Effect]
    ) -> None:
        member = group.members.get(key.member_id)
        if member is None or member.classic is None:
            return
        if key.kind is TimerKind.CLASSIC_JOIN:
            self.engine.remove_member(group, member, "classic join timeout", now_ms, effects)
            effects.append(MemberFenced(group.group_id, member.member_id, "join-timeout"))
        elif key.kind is TimerKind.CLASSIC_SYNC:
            self.engine.remove_member(group, member, "classic sync timeout", now_ms, effects)
            effects.append(MemberFenced(group.group_id, member.member_id, "sync-timeout"))
        elif key.kind is TimerKind.CLASSIC_SYNC_HOLD and member.classic.held is Held.SYNC:
            self._complete_held_sync(group, member, now_ms, effects, expired=False)

    def hand_back(self, group: ConsumerGroup, reason: str, effects: list[Effect]) -> None:
        """Give the group up to the broker (downgrade): forget it and say so."""
        engine = self.engine
        left = []
        for member in list(group.members.values()):
            self._forget(group, member, ErrorCode.UNKNOWN_MEMBER_ID, effects)
            engine.cancel_member_timers(group.group_id, member.member_id, effects)
            left.append((member.member_id, member.instance_id))
        engine.drop_group(group, GroupHandedBack(group.group_id, reason, tuple(left)), effects)

    def release(self, group_id: str, reason: str) -> tuple[GroupReleased | None, list[Effect]]:
        """Hand the group back to the broker's classic coordinator (a release, decision record
        0018, section 1): answer every held classic request REBALANCE_IN_PROGRESS (the member
        rejoins, now at the broker), forget the group (its records become tombstones) and say
        what each member may still own, so that the proxy can carry the members over. None
        (and no effects) for a group the engine does not have."""
        engine = self.engine
        effects: list[Effect] = []
        group = engine.groups.get(group_id)
        if group is None:
            return None, effects
        names = {t.topic_id: t.name for t in engine.image.by_id.values()}
        members = []
        for member in list(group.members.values()):
            self._forget(group, member, ErrorCode.REBALANCE_IN_PROGRESS, effects)
            engine.cancel_member_timers(group.group_id, member.member_id, effects)
            owned: dict[str, set[int]] = {}
            for source in (member.assigned, member.pending_revocation):
                for topic_id, partitions in source.items():
                    name = names.get(topic_id)
                    if name is not None and partitions:
                        owned.setdefault(name, set()).update(partitions)
            members.append(ReleasedMember(
                member.member_id, member.protocol is MemberProtocol.CONSUMER,
                member.member_epoch, tuple((t, tuple(sorted(p))) for t, p in sorted(owned.items())),
                tuple(sorted(member.subscribed_topic_names)), member.client_id,
                member.instance_id, member.rack_id, member.rebalance_timeout_ms))
        protocol = released_protocol([m.classic.protocols for m in group.members.values()
                                      if m.classic is not None])
        released = GroupReleased(group_id, reason, protocol, tuple(members))
        engine.drop_group(group, released, effects)
        return released, effects

    # ------------------------------------------------------------------ helpers

    def _forget(self, group: ConsumerGroup, member: ConsumerGroupMember, code: ErrorCode,
                effects: list[Effect]) -> None:
        """``member`` is gone (removed, replaced, handed back): answer what it has held with
        ``code``, stop its classic timers, forget when it was told to revoke."""
        self._answer_held(group, member, code, effects)
        self.told_at.pop((group.group_id, member.member_id), None)
        self._cancel_timers(group.group_id, member.member_id, effects)

    def _cancel_timers(self, group_id: str, member_id: str, effects: list[Effect]) -> None:
        for kind in CLASSIC_TIMERS:
            self.engine.cancel_timer(TimerKey(kind, group_id, member_id), effects)

    def _answer_held(
        self,
        group: ConsumerGroup,
        member: ConsumerGroupMember,
        code: ErrorCode,
        effects: list[Effect],
    ) -> None:
        """Answer whatever request of ``member`` is held (a JoinGroup or a SyncGroup) with
        ``code``: it rejoined, was replaced, removed, or its group was handed back."""
        meta = member.classic
        if meta is None or meta.held is Held.NOTHING:
            return
        held = meta.held
        self._move(group, member, ClassicEvent.HELD_ANSWERED)
        if held is Held.JOIN:
            effects.append(JoinCompleted(
                group.group_id, member.member_id,
                JoinGroupResponse(error_code=int(code), member_id=member.member_id)))
        else:
            self.engine.cancel_timer(
                TimerKey(TimerKind.CLASSIC_SYNC_HOLD, group.group_id, member.member_id), effects)
            effects.append(SyncCompleted(group.group_id, member.member_id,
                                         SyncGroupResponse(error_code=int(code))))

    def _validate_member(
        self, group_id: str, member_id: str, instance_id: str | None
    ) -> tuple[ConsumerGroup, ConsumerGroupMember]:
        group = self.engine.groups.get(group_id)
        if group is None or not group.members:
            raise GroupError(ErrorCode.UNKNOWN_MEMBER_ID, f"Group {group_id} not found.")
        member = group.find_member(member_id, instance_id)
        _check_classic(member)
        return group, member

    def _ask_to_rejoin(
        self, group: ConsumerGroup, member: ConsumerGroupMember, now_ms: int, effects: list[Effect]
    ) -> None:
        """REBALANCE_IN_PROGRESS: the member must rejoin within its rebalance timeout."""
        self._move(group, member, ClassicEvent.TOLD_TO_REJOIN)
        self.told_at.setdefault((group.group_id, member.member_id), now_ms)
        key = TimerKey(TimerKind.CLASSIC_JOIN, group.group_id, member.member_id)
        if key not in self.engine.timers:
            self.engine.arm_timer(key, now_ms + max(member.rebalance_timeout_ms, 0), effects)


def _check_classic(member: ConsumerGroupMember) -> None:
    if member.protocol is not MemberProtocol.CLASSIC or member.classic is None:
        raise GroupError(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"Member {member.member_id} does not use the classic protocol.",
        )


def _check_generation(member: ConsumerGroupMember, generation_id: int) -> None:
    """The generation must be the one the client was given (the member epoch, unless the
    member was advanced quietly since)."""
    meta = member.classic
    expected = meta.generation if meta is not None and meta.generation >= 0 else (
        member.member_epoch
    )
    if generation_id != expected:
        raise GroupError(
            ErrorCode.ILLEGAL_GENERATION,
            f"The request generation id {generation_id} is not equal to the generation "
            f"{expected} given to member {member.member_id}.",
        )


def _owned_ids(owned: list[tuple[str, list[int]]], image: TopicsImage) -> OwnedIds:
    out: OwnedIds = []
    by_name = image.by_name
    for name, ps in owned:
        topic = by_name.get(name)
        if topic is not None and ps:
            out.append((topic.topic_id, list(ps)))
    return out


def _within(
    assigned: Mapping[TopicId, Mapping[int, int]], target: Mapping[TopicId, frozenset[int]]
) -> bool:
    for topic_id, ps in assigned.items():
        if not ps:
            continue
        tgt = target.get(topic_id)
        if tgt is None:
            return False
        for p in ps:
            if p not in tgt:
                return False
    return True


def classic_member_value(member: ConsumerGroupMember, request: JoinGroupRequest,
                         subscription: ClassicSubscription) -> MemberValue:
    """The member record ``member`` has once the JoinGroup ``request`` is applied (what
    ``update_classic_metadata`` and ``update_member`` make of it in
    ``ClassicGroupCoordinator._apply_join``): sized before anything is applied."""
    session = request.session_timeout_ms
    rebalance = request.rebalance_timeout_ms
    return replace(
        member_value(member),
        rack_id=member.rack_id if subscription.rack_id is None else subscription.rack_id,
        rebalance_timeout_ms=session if rebalance == -1 else rebalance,
        session_timeout_ms=session,
        client_id=request.client_id,
        client_host=request.client_host,
        subscribed_topic_names=tuple(sorted(set(subscription.topics))),
        subscribed_topic_regex=None,
        classic=ClassicMemberValue(session, tuple(p.name for p in request.protocols),
                                   subscription.version, subscription.user_data),
    )


def _static_replacement(old: ConsumerGroupMember, member_id: str) -> ConsumerGroupMember:
    """A static classic member rejoining under a new member id. Partitions the old
    incarnation was revoking are released (the process that held them is gone); the assigned
    ones are kept, so the bounce moves nothing."""
    new = hb.static_replacement(old, member_id, protocol=MemberProtocol.CLASSIC,
                                state=MemberState.STABLE)
    if old.classic is not None:
        new.classic = ClassicMemberMetadata(
            old.classic.session_timeout_ms, old.classic.protocols, old.classic.subscription_version
        )
    return new
