"""The coordinator's state and the only verbs that change it.

:class:`CoordinatorState` holds every group of one engine instance, the topic image, the timers
and the listeners. Its methods are the one way in for anything that writes a group or a member
(both protocols' request flows, the timers, the migration of a classic group): each keeps the
invariants that span more than one field, the way Kafka routes every write through
``ConsumerGroup.updateMember`` / ``removeMember``:

* a group is in :attr:`CoordinatorState.groups` from :meth:`create_group` until
  :meth:`drop_group`, which cancels its group timers and marks it dead;
* a member enters through :meth:`add_member` or :meth:`replace_member` and leaves through
  :meth:`remove_member`; the group's derived indexes (static members, subscribed names and
  regexes, assignor counts, partition owners, assignor input) are kept by
  :class:`~translation.group.ConsumerGroup`'s own methods, which only these verbs call;
  an empty group has its expiry timer armed, a non-empty one never does;
* a member's fields change through :meth:`update_member` (subscription, assignor, instance
  id, timeouts) and its assignment through :meth:`reconcile_member` or :meth:`static_leave`:
  a member revoking partitions has its rebalance timer armed, no other member does;
* every timer is armed with :meth:`arm_timer` and cancelled with :meth:`cancel_timer`, which
  emit the matching :class:`~translation.effects.TimerArmed` /
  :class:`~translation.effects.TimerCancelled` effect, so a driver's own timers never drift
  from the engine's;
* with ``GroupConfig.durable_state``, each verb marks the records its write changes (the group
  record, a member's member or assignment record; :mod:`translation.changes`), so
  :meth:`~translation.coordinator.GroupCoordinator.drain_records` writes exactly what changed.
  A verb that changes nothing marks nothing: the steady heartbeat produces no record.

Listeners (:class:`EngineListener`: the classic-protocol translation, the proxy's group-event
journal) hear about target computations, member removals, replacements and assignment moves, and
timers of kinds the core does not handle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from translation import departures
from translation.assignors.base import AssignorError, PartitionAssignor
from translation.classic.member import ClassicMemberMetadata
from translation.config import GroupConfig
from translation.effects import (
    Effect,
    GroupCreated,
    GroupEmptied,
    GroupEpochBumped,
    MemberJoined,
    MemberLeft,
    MemberReplaced,
    TargetAssignmentComputed,
    TargetAssignmentFailed,
    TimerArmed,
    TimerCancelled,
)
from translation.group import ConsumerGroup
from translation.member import (
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroupMember,
    MemberState,
    PartitionEpochs,
)
from translation.reconciliation import OwnedPartitions, reconcile
from translation.target import TargetAssignment, compute_target
from translation.timers import TimerKey, TimerKind, Timers
from translation.topics import TopicId, TopicsImage


class EngineListener(Protocol):
    """Something riding on the engine that must hear about target computations and member
    removals, whoever caused them (the classic-protocol translation,
    :class:`translation.classic.coordinator.ClassicGroupCoordinator`)."""

    def target_updated(self, group: ConsumerGroup, now_ms: int, effects: list[Effect]) -> None:
        """A target computation ran for ``group`` (installed or failed)."""

    def member_removed(
        self,
        group: ConsumerGroup,
        member: ConsumerGroupMember,
        reason: str,
        now_ms: int,
        effects: list[Effect],
    ) -> None:
        """``member`` left or was fenced; it is already out of ``group``."""

    def member_replaced(
        self,
        group: ConsumerGroup,
        old: ConsumerGroupMember,
        new: ConsumerGroupMember,
        effects: list[Effect],
    ) -> None:
        """A static member rejoined as ``new``; ``old`` is already out of ``group``."""

    def member_reconciled(
        self,
        group: ConsumerGroup,
        member: ConsumerGroupMember,
        assigned_before: PartitionEpochs,
        revoking_before: PartitionEpochs,
        effects: list[Effect],
    ) -> None:
        """``member``'s assignment moved (:meth:`CoordinatorState.reconcile_member` changed it,
        or a static leave released what it was revoking); ``assigned_before`` and
        ``revoking_before`` are what it held before (the verbs replace those maps, never
        change them in place)."""

    def group_dropped(self, group: ConsumerGroup, effects: list[Effect]) -> None:
        """``group`` is forgotten (expired, deleted or handed back)."""

    def group_loaded(self, group: ConsumerGroup, now_ms: int, effects: list[Effect]) -> None:
        """``group`` was rebuilt from its records (:mod:`translation.durable`): arm the timers
        of the listener's own kinds that its members' positions call for."""

    def group_changed(self, group: ConsumerGroup, now_ms: int, effects: list[Effect]) -> None:
        """A heartbeat or a timer of ``group`` was handled (partitions may have been released)."""

    def timer_fired(
        self, group: ConsumerGroup, key: TimerKey, now_ms: int, effects: list[Effect]
    ) -> None:
        """A timer of a kind the engine does not handle itself went off."""


class CoordinatorState:
    """The groups, topic image, timers and listeners of one engine instance, and the verbs
    that keep their invariants (see the module docstring)."""

    def __init__(self, config: GroupConfig, topics: TopicsImage | None = None) -> None:
        self.config = config
        self.assignors: dict[str, PartitionAssignor] = {a.name: a for a in config.assignors}
        self.assignor_names: list[str] = [a.name for a in config.assignors]
        self.groups: dict[str, ConsumerGroup] = {}
        self.image: TopicsImage = topics if topics is not None else TopicsImage()
        self.timers = Timers()
        self.listeners: list[EngineListener] = []
        self.journal: dict[str, ConsumerGroup] | None = {} if config.durable_state else None
        """Groups with changes not yet drained, first changed first (None: no durable state
        kept, see :mod:`translation.changes`)."""

    # ------------------------------------------------------------------ groups

    def create_group(self, group_id: str, effects: list[Effect], *, group_epoch: int = 0,
                     target: TargetAssignment | None = None) -> ConsumerGroup:
        """A new group; a converted classic group starts at its generation with its current
        assignment as the target (:mod:`translation.classic.migration`)."""
        group = ConsumerGroup(group_id, self.assignor_names[0])
        group.group_epoch = group_epoch
        if target is not None:
            group.target = target
        self.groups[group_id] = group
        journal = self.journal
        if journal is not None:
            group.journal = journal
            dropped = journal.get(group_id)
            if dropped is not None and dropped.changes is not None:
                # Dropped and created again before a drain: the old group's keys the new one
                # does not rewrite become tombstones.
                group.changes = dropped.changes
                journal[group_id] = group
            group.mark_group()
        effects.append(GroupCreated(group_id))
        return group

    def drop_group(self, group: ConsumerGroup, effect: Effect, effects: list[Effect], *,
                   tombstones: bool = True) -> None:
        """Forget ``group`` (expired, deleted, handed back): ``effect`` says which. Its records
        become tombstones at the next drain, unless ``tombstones`` is False (the group's lock is
        lost: another coordinator writes its records now, and nothing of it is written here)."""
        group_id = group.group_id
        self.cancel_timer(TimerKey(TimerKind.GROUP_EXPIRY, group_id), effects)
        self.cancel_timer(TimerKey(TimerKind.ASSIGNMENT, group_id), effects)
        group.dead = True
        group.departure_wait = None
        self.groups.pop(group_id, None)
        if self.journal is not None:
            if tombstones:
                group.mark_group()
                for member_id in group.members:
                    group.mark_member(member_id)
                    group.mark_assignment(member_id)
            else:
                self.journal.pop(group_id, None)
                group.changes = None
        for listener in self.listeners:
            listener.group_dropped(group, effects)
        effects.append(effect)

    def bump_group_epoch(self, group: ConsumerGroup, reason: str, effects: list[Effect]) -> None:
        group.group_epoch += 1
        group.mark_group()
        effects.append(GroupEpochBumped(group.group_id, group.group_epoch, reason))

    def refresh_group(self, group: ConsumerGroup) -> None:
        """Recompute what is derived from the whole membership (subscribed topics' metadata,
        preferred assignor, who is reconciled): after a group is installed in one go."""
        group.refresh_subscription_metadata(self.image)
        group.preferred_assignor = group.compute_preferred_assignor(self.assignor_names)
        group.mark_group()
        group.track_all()

    # ------------------------------------------------------------------ members

    def add_member(self, group: ConsumerGroup, member: ConsumerGroupMember,
                   effects: list[Effect]) -> None:
        """A new member joins: the group stops expiring."""
        if not group.members:
            self.cancel_timer(TimerKey(TimerKind.GROUP_EXPIRY, group.group_id), effects)
        group.add_member(member, self.image)
        departures.arrived(group, member.member_id)
        effects.append(MemberJoined(group.group_id, member.member_id, member.instance_id))

    def replace_member(self, group: ConsumerGroup, old: ConsumerGroupMember,
                       new: ConsumerGroupMember, effects: list[Effect]) -> None:
        """A static member rejoined under a new member id (either protocol): ``new`` takes
        ``old``'s place and its target, with no epoch bump."""
        target = group.target.members.get(old.member_id)
        self.cancel_member_timers(group.group_id, old.member_id, effects)
        group.remove_member(old.member_id)
        if target is not None:
            group.target.members[new.member_id] = target
        group.add_member(new, self.image)
        assert new.instance_id is not None
        effects.append(MemberReplaced(group.group_id, old.member_id, new.member_id,
                                      new.instance_id))
        for listener in self.listeners:
            listener.member_replaced(group, old, new, effects)

    def update_member(
        self,
        group: ConsumerGroup,
        member: ConsumerGroupMember,
        *,
        instance_id: str | None = None,
        rack_id: str | None = None,
        rebalance_timeout_ms: int | None = None,
        session_timeout_ms: int | None = None,
        client_id: str | None = None,
        client_host: str | None = None,
        server_assignor: str | None = None,
        subscription: tuple[frozenset[str], str | None] | None = None,
    ) -> bool:
        """Change a member's fields (None: unchanged); ``subscription`` is the topic names and
        regex it subscribes to. Returns whether the subscription changed (the caller bumps the
        group epoch once for everything that changed). Only a field that really changes marks
        the member's record (every heartbeat passes its client id and host)."""
        if instance_id is not None and member.instance_id is None:
            group.adopt_instance_id(member, instance_id)
        changed = False
        if rack_id is not None and rack_id != member.rack_id:
            member.rack_id = rack_id
            changed = True
        if rebalance_timeout_ms is not None and rebalance_timeout_ms != member.rebalance_timeout_ms:
            member.rebalance_timeout_ms = rebalance_timeout_ms
            changed = True
        if session_timeout_ms is not None and session_timeout_ms != member.session_timeout_ms:
            member.session_timeout_ms = session_timeout_ms
            changed = True
        if client_id is not None and client_id != member.client_id:
            member.client_id = client_id
            changed = True
        if client_host is not None and client_host != member.client_host:
            member.client_host = client_host
            changed = True
        if changed:
            group.mark_member(member.member_id)
        if server_assignor is not None and server_assignor != member.server_assignor:
            group.update_assignor(member, server_assignor)
        if subscription is None:
            return False
        names, regex = subscription
        if names == member.subscribed_topic_names and regex == member.subscribed_topic_regex:
            return False
        group.update_subscription(member, names, regex, self.image)
        return True

    def update_classic_metadata(self, group: ConsumerGroup, member: ConsumerGroupMember, *,
                                session_timeout_ms: int, protocols: tuple[str, ...],
                                subscription_version: int,
                                user_data: bytes | None) -> ClassicMemberMetadata:
        """A classic member's JoinGroup-side facts (:mod:`translation.classic.member`): created
        on its first JoinGroup, updated by the next ones; returns them."""
        meta = member.classic
        if meta is None:
            meta = member.classic = ClassicMemberMetadata(
                session_timeout_ms, protocols, subscription_version, user_data=user_data)
        elif (meta.session_timeout_ms, meta.protocols, meta.subscription_version,
              meta.user_data) == (session_timeout_ms, protocols, subscription_version, user_data):
            return meta
        else:
            meta.session_timeout_ms = session_timeout_ms
            meta.protocols = protocols
            meta.subscription_version = subscription_version
            meta.user_data = user_data
        group.mark_member(member.member_id)
        return meta

    def classic_position_changed(self, group: ConsumerGroup, member: ConsumerGroupMember) -> None:
        """A classic member's state or given generation changed (the classic layer moves it,
        :mod:`translation.classic.member`): its assignment record holds them."""
        group.mark_assignment(member.member_id)

    def remove_member(self, group: ConsumerGroup, member: ConsumerGroupMember, reason: str,
                      now_ms: int, effects: list[Effect], *, left: bool = False) -> None:
        """Remove a member (leave or fence): its partitions become free, the epoch is bumped.
        ``left``: the member said it leaves (LeaveGroup, a leave heartbeat), which may open a
        departure wait (:mod:`translation.departures`); a fence never does."""
        self.cancel_member_timers(group.group_id, member.member_id, effects)
        group.remove_member(member.member_id)
        self.bump_group_epoch(group, reason, effects)
        if left:
            departures.departed(group, member.member_id,
                                self.config.classic_departure_wait_ms, now_ms, effects)
        if not group.members:
            departures.close(group, now_ms, effects)
            effects.append(GroupEmptied(group.group_id))
            key = TimerKey(TimerKind.GROUP_EXPIRY, group.group_id)
            self.arm_timer(key, now_ms + self.config.empty_group_expiry_ms, effects)
        for listener in self.listeners:
            listener.member_removed(group, member, reason, now_ms, effects)

    def static_leave(self, group: ConsumerGroup, member: ConsumerGroupMember, now_ms: int,
                     effects: list[Effect]) -> None:
        """Epoch -2: the member keeps its assigned partitions (nobody else gets them) until it
        rejoins or its session expires; partitions it was revoking are released now."""
        assigned_before, revoking_before = member.assigned, member.pending_revocation
        for topic_id, ps in revoking_before.items():
            group.owners.remove(member.member_id, topic_id, ps)
        member.pending_revocation = {}
        member.assigned = {t: dict.fromkeys(ps, 0) for t, ps in assigned_before.items()}
        member.previous_member_epoch = member.member_epoch
        member.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH
        member.epoch_bump_only = False
        group.track(member)
        group.mark_assignment(member.member_id)
        self.cancel_timer(TimerKey(TimerKind.REBALANCE, group.group_id, member.member_id),
                          effects)
        self.schedule_session_timeout(group, member, now_ms, effects)
        for listener in self.listeners:
            listener.member_reconciled(group, member, assigned_before, revoking_before, effects)
        effects.append(MemberLeft(group.group_id, member.member_id, static=True))

    # ------------------------------------------------------------------ target and reconciliation

    def apply_member_changes(self, group: ConsumerGroup, reasons: list[str], now_ms: int,
                             effects: list[Effect]) -> None:
        """After a member's join or subscription update (either protocol): refresh the
        subscribed topic metadata if anything changed, re-pick the preferred assignor, bump the
        group epoch once for all ``reasons``, and recompute the target if it is behind."""
        if reasons and group.refresh_subscription_metadata(self.image):
            reasons.append("subscribed topic metadata changed")
        preferred = group.compute_preferred_assignor(self.assignor_names)
        if preferred != group.preferred_assignor:
            group.preferred_assignor = preferred
            group.mark_group()
            reasons.append("preferred assignor changed")
        if reasons:
            self.bump_group_epoch(group, "; ".join(reasons), effects)
        self.maybe_compute_target_assignment(group, now_ms, effects)

    def maybe_compute_target_assignment(
        self, group: ConsumerGroup, now_ms: int, effects: list[Effect]
    ) -> None:
        """If the group epoch is ahead of the target: compute the target now, or arm the
        group's assignment timer if the last computation is less than the assignment interval
        ago or a departure wait holds it (:mod:`translation.departures`)."""
        if group.group_epoch <= group.target.epoch:
            return
        interval = self.config.assignment_interval_ms
        last = group.last_assignment_ms
        key = TimerKey(TimerKind.ASSIGNMENT, group.group_id)
        due = departures.holds(group, now_ms, effects)
        if interval > 0 and last is not None and now_ms < last + interval:
            due = max(due or 0, last + interval)
        if due is not None:
            if self.timers.deadline(key) != due:
                self.arm_timer(key, due, effects)
            return
        self.cancel_timer(key, effects)
        group.last_assignment_ms = now_ms
        self._compute_target_assignment(group, effects)
        for listener in self.listeners:
            listener.target_updated(group, now_ms, effects)

    def target_deferred(self, group: ConsumerGroup) -> bool:
        """Whether the group's target is behind and waits for the assignment interval."""
        return (group.group_epoch > group.target.epoch
                and TimerKey(TimerKind.ASSIGNMENT, group.group_id) in self.timers)

    def _compute_target_assignment(self, group: ConsumerGroup, effects: list[Effect]) -> None:
        name = group.preferred_assignor
        assignor = self.assignors[name]
        specs, kind = group.build_specs(self.image)
        try:
            changed = compute_target(
                assignor, specs, kind, group.subscription_metadata, group.target, group.group_epoch
            )
        except AssignorError as exc:
            effects.append(
                TargetAssignmentFailed(group.group_id, group.group_epoch, name, str(exc))
            )
            return
        group.invalidate_specs(changed)
        group.new_target_installed()
        group.mark_group()
        for member_id in changed:
            group.mark_assignment(member_id)
        effects.append(
            TargetAssignmentComputed(group.group_id, group.target.epoch, name, len(changed))
        )

    def reconcile_member(
        self,
        group: ConsumerGroup,
        member: ConsumerGroupMember,
        owned: OwnedPartitions | None,
        now_ms: int,
        effects: list[Effect],
        *,
        target: Mapping[TopicId, frozenset[int]] | None = None,
        subscription_changed: bool = False,
    ) -> bool:
        """Move ``member`` towards its target (``target``: a narrower view of it, as a classic
        member's filtered to its subscribed topics); arms its rebalance timer while it has
        partitions to revoke, cancels it otherwise. Returns whether anything changed."""
        epoch = group.target.epoch
        if member.is_reconciled_to(epoch) and not subscription_changed:
            return False
        if target is None:
            target = group.target.of(member.member_id)
        assigned_before, revoking_before = member.assigned, member.pending_revocation
        changed = reconcile(member, epoch, target, group.owners, owned,
                            subscription_changed=subscription_changed)
        if changed:
            group.track(member)
            group.mark_assignment(member.member_id)
            key = TimerKey(TimerKind.REBALANCE, group.group_id, member.member_id)
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                self.arm_timer(key, now_ms + max(member.rebalance_timeout_ms, 0), effects,
                               payload=member.member_epoch)
            else:
                self.cancel_timer(key, effects)
            for listener in self.listeners:
                listener.member_reconciled(group, member, assigned_before, revoking_before,
                                           effects)
        return changed

    # ------------------------------------------------------------------ timers

    def arm_timer(self, key: TimerKey, deadline_ms: int, effects: list[Effect], *,
                  payload: int = 0) -> None:
        self.timers.schedule(key, deadline_ms, payload)
        effects.append(TimerArmed(key, deadline_ms))

    def cancel_timer(self, key: TimerKey, effects: list[Effect]) -> None:
        if self.timers.cancel(key):
            effects.append(TimerCancelled(key))

    def schedule_session_timeout(
        self, group: ConsumerGroup, member: ConsumerGroupMember, now_ms: int, effects: list[Effect]
    ) -> None:
        timeout = member.session_timeout_ms or self.config.session_timeout_ms
        key = TimerKey(TimerKind.SESSION, group.group_id, member.member_id)
        self.arm_timer(key, now_ms + timeout, effects)
        group.held_sessions.heard(member.member_id, timeout)

    def cancel_member_timers(self, group_id: str, member_id: str, effects: list[Effect]) -> None:
        """The core's timers of a member (a listener cancels its own when it hears of the
        removal)."""
        self.cancel_timer(TimerKey(TimerKind.SESSION, group_id, member_id), effects)
        self.cancel_timer(TimerKey(TimerKind.REBALANCE, group_id, member_id), effects)
