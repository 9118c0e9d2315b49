"""Durable group state: the records the engine's changes produce, and groups rebuilt from them.

With ``GroupConfig.durable_state`` on, every verb that writes a group marks the records it
changed (:mod:`translation.changes`). :func:`drain_records` turns the marks into records
(:mod:`translation.records`) holding the *current* values, so whatever changed several times
since the last drain is written once; :func:`load_groups` rebuilds groups from records read
back, through the same verbs, so every derived index (static members, subscribed names and
regexes, assignor counts, partition owners, the not-yet-reconciled set, the assignor input) is
built as the requests built it.

Order of a drain: groups in the order they first changed since the last drain; within a group
that exists, its group record first (when it changed), then per member id (sorted) its member
record then its assignment record, or for a member gone its assignment tombstone then its member
tombstone; a group gone gives the tombstones of every member key it may have written, then its
group tombstone last. Replayed in order, or folded to the last value of each key as compaction
leaves them, the records give the same state.

Loading re-arms every deadline from the loading engine's ``now_ms``: each member gets a full
session (as Kafka's coordinator does when it loads a group), a member still revoking gets its
rebalance timeout, a classic member its join or sync timer as its position calls for (the
classic layer arms those, :meth:`~translation.state.EngineListener.group_loaded`), an empty
group expires ``empty_group_expiry_ms`` after the wall-clock time it became empty. Nothing is
bumped or recomputed because of the load itself: the stored subscription metadata and preferred
assignor are taken as they are; only when the engine's topic image shows a change the stored
metadata does not (a topic subscribed to was created, resized, deleted or recreated while no
coordinator watched) is the group epoch bumped, as
:meth:`~translation.coordinator.GroupCoordinator.update_topics` would have. A group whose
target was behind (a computation deferred by the assignment interval) computes it on its next
request, as a group that never computed one; what the old coordinator held for the classic
layer (requests, when a member was told to revoke) is not state and starts afresh.

**A released group** (handed back to the broker's coordinator, decision record 0018: the
release) leaves one record behind its tombstones, within record version 1: a ``GROUP``
record whose preferred assignor is :data:`RELEASED_PREFIX` and the coordinator it went to
(:func:`release_marker`), no member records. It says, across sidecar restarts, that the
group was handed back and when (``empty_since_wall_ms``); :func:`released_to` reads it. This
build never loads it as a group (as a tombstone, it loads nothing); groupgate 0.2.0, which
does not know it, loads an empty group whose first join picks a real assignor again (the
preferred assignor is recomputed on every membership change before any target is computed),
and which expires as any empty group does (``tests/integration/test_release_version_skew.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from translation.classic.member import ClassicMemberMetadata
from translation.effects import Effect, GroupLoaded
from translation.group import ConsumerGroup
from translation.member import ConsumerGroupMember, MemberState, PartitionEpochs
from translation.ownership import OwnershipError
from translation.records import (
    AssignmentValue,
    ClassicMemberValue,
    GroupValue,
    MemberValue,
    PartitionEpochList,
    RecordError,
    RecordKey,
    RecordKind,
    StateRecord,
    StateValue,
    check_record,
    fold,
)
from translation.state import CoordinatorState
from translation.target import TargetAssignment
from translation.timers import TimerKey, TimerKind
from translation.topics import TopicId, TopicsImage


class StateLoadError(ValueError):
    """Records that do not make a group (a member without its assignment record, two members
    holding one partition, a group already served here): nothing of the group is loaded."""


# ---------------------------------------------------------------------------------- drain

def drain_records(state: CoordinatorState, wall_ms: int) -> list[StateRecord]:
    """The records for everything changed since the last drain (see the module docstring);
    ``wall_ms`` is the driver's wall clock, stamped on a group that became empty."""
    journal = state.journal
    if journal is None:
        raise RuntimeError("drain_records needs GroupConfig.durable_state")
    out: list[StateRecord] = []
    for group_id, group in journal.items():
        changes = group.changes
        group.changes = None
        if changes is None:
            continue
        member_ids = sorted(changes.members | changes.assignments)
        if group.dead:
            for member_id in member_ids:
                _tombstones(out, group_id, member_id)
            out.append(StateRecord(RecordKey(RecordKind.GROUP, group_id), None))
            continue
        empty = not group.members
        if empty != (group.empty_since_wall_ms is not None):
            group.empty_since_wall_ms = wall_ms if empty else None
            changes.group = True
        if changes.group:
            out.append(StateRecord(RecordKey(RecordKind.GROUP, group_id),
                                   group_value(group, wall_ms)))
        members = group.members
        for member_id in member_ids:
            member = members.get(member_id)
            if member is None:
                _tombstones(out, group_id, member_id)
                continue
            if member_id in changes.members:
                out.append(StateRecord(RecordKey(RecordKind.MEMBER, group_id, member_id),
                                       member_value(member)))
            if member_id in changes.assignments:
                out.append(StateRecord(RecordKey(RecordKind.ASSIGNMENT, group_id, member_id),
                                       assignment_value(group, member)))
    journal.clear()
    return out


def _tombstones(out: list[StateRecord], group_id: str, member_id: str) -> None:
    out.append(StateRecord(RecordKey(RecordKind.ASSIGNMENT, group_id, member_id), None))
    out.append(StateRecord(RecordKey(RecordKind.MEMBER, group_id, member_id), None))


def group_records(state: CoordinatorState, group_id: str, wall_ms: int) -> list[StateRecord]:
    """Every record of the group as it stands (none for a group not served here), in drain
    order: what a fold of all its drained records equals."""
    group = state.groups.get(group_id)
    if group is None:
        return []
    out = [StateRecord(RecordKey(RecordKind.GROUP, group_id), group_value(group, wall_ms))]
    for member_id in sorted(group.members):
        member = group.members[member_id]
        out.append(StateRecord(RecordKey(RecordKind.MEMBER, group_id, member_id),
                               member_value(member)))
        out.append(StateRecord(RecordKey(RecordKind.ASSIGNMENT, group_id, member_id),
                               assignment_value(group, member)))
    return out


def group_value(group: ConsumerGroup, wall_ms: int) -> GroupValue:
    empty_since = group.empty_since_wall_ms
    if empty_since is None and not group.members:
        empty_since = wall_ms
    return GroupValue(
        group_epoch=group.group_epoch,
        assignment_epoch=group.target.epoch,
        preferred_assignor=group.preferred_assignor,
        subscription_metadata=tuple(sorted(group.subscription_metadata.items())),
        empty_since_wall_ms=empty_since if not group.members else None,
    )


def member_value(member: ConsumerGroupMember) -> MemberValue:
    meta = member.classic
    return MemberValue(
        instance_id=member.instance_id,
        rack_id=member.rack_id,
        client_id=member.client_id,
        client_host=member.client_host,
        subscribed_topic_names=tuple(sorted(member.subscribed_topic_names)),
        subscribed_topic_regex=member.subscribed_topic_regex,
        server_assignor=member.server_assignor,
        rebalance_timeout_ms=member.rebalance_timeout_ms,
        session_timeout_ms=member.session_timeout_ms,
        protocol=member.protocol,
        classic=None if meta is None else ClassicMemberValue(
            session_timeout_ms=meta.session_timeout_ms,
            protocols=meta.protocols,
            subscription_version=meta.subscription_version,
            user_data=meta.user_data,
        ),
    )


def assignment_value(group: ConsumerGroup, member: ConsumerGroupMember) -> AssignmentValue:
    target = group.target.members.get(member.member_id)
    meta = member.classic
    return AssignmentValue(
        member_epoch=member.member_epoch,
        previous_member_epoch=member.previous_member_epoch,
        state=member.state,
        assigned=_epochs_out(member.assigned),
        pending_revocation=_epochs_out(member.pending_revocation),
        target=None if target is None else tuple(
            (topic_id, tuple(sorted(ps))) for topic_id, ps in sorted(target.items()) if ps),
        classic_state=None if meta is None else meta.state,
        classic_generation=-1 if meta is None else meta.generation,
    )


def _epochs_out(partitions: PartitionEpochs) -> PartitionEpochList:
    return tuple(
        (topic_id, tuple(sorted(ps.items()))) for topic_id, ps in sorted(partitions.items()) if ps)


# ---------------------------------------------------------------------------------- load

RELEASED_PREFIX = "groupgate-released:"
"""The preferred assignor of a released group's marker record, followed by the coordinator
it was handed to (``classic`` or ``native``)."""


def release_marker(group_id: str, to: str, epoch: int, wall_ms: int) -> StateRecord:
    """The record a released group leaves behind its tombstones (written last)."""
    return StateRecord(RecordKey(RecordKind.GROUP, group_id), GroupValue(
        group_epoch=epoch, assignment_epoch=epoch, preferred_assignor=RELEASED_PREFIX + to,
        subscription_metadata=(), empty_since_wall_ms=wall_ms))


def released_to(value: StateValue | None) -> str | None:
    """The coordinator a released group's marker names; None if ``value`` is no marker."""
    if isinstance(value, GroupValue) and value.preferred_assignor.startswith(RELEASED_PREFIX):
        return value.preferred_assignor[len(RELEASED_PREFIX):] or None
    return None


def load_groups(state: CoordinatorState, records: Iterable[StateRecord], now_ms: int,
                wall_ms: int, *, only: str | None = None) -> list[Effect]:
    """Rebuild every group ``records`` hold (read from the topic in order; ``only``: just that
    group) and arm their timers; returns the effects (the timers armed, a
    :class:`~translation.effects.GroupLoaded` per group). A group whose records end in its
    tombstone is not loaded. Raises :class:`StateLoadError` (that group is then not loaded,
    the ones before it are) or :class:`~translation.records.RecordError`."""
    by_group: dict[str, dict[RecordKey, StateValue]] = {}
    for key, value in fold(records).items():
        if only is None or key.group_id == only:
            by_group.setdefault(key.group_id, {})[key] = value
    effects: list[Effect] = []
    for group_id, values in by_group.items():
        _load_group(state, group_id, values, now_ms, wall_ms, effects)
    return effects


def _load_group(state: CoordinatorState, group_id: str, values: dict[RecordKey, StateValue],
                now_ms: int, wall_ms: int, effects: list[Effect]) -> None:
    stored: GroupValue | None = None
    members: dict[str, MemberValue] = {}
    assignments: dict[str, AssignmentValue] = {}
    for key, value in values.items():
        check_record(StateRecord(key, value))
        if isinstance(value, GroupValue):
            stored = value
        elif isinstance(value, MemberValue):
            members[key.member_id] = value
        elif isinstance(value, AssignmentValue):
            assignments[key.member_id] = value
    if stored is None or (released_to(stored) is not None and not members and not assignments):
        if stored is None and (members or assignments):
            raise StateLoadError(f"group {group_id}: member records without a group record")
        return  # nothing, or the marker a released group left: not a group to load
    if members.keys() != assignments.keys():
        odd = sorted(members.keys() ^ assignments.keys())
        raise StateLoadError(
            f"group {group_id}: members without both their member and assignment record: {odd}")
    if group_id in state.groups:
        raise StateLoadError(f"group {group_id} is already served here")

    target = TargetAssignment(stored.assignment_epoch, {
        member_id: {topic_id: frozenset(ps) for topic_id, ps in a.target}
        for member_id, a in assignments.items() if a.target is not None})
    scratch: list[Effect] = []  # creating and adding announce nothing: nobody new joined
    group = state.create_group(group_id, scratch, group_epoch=stored.group_epoch, target=target)
    try:
        for member_id, value in members.items():
            member = _member(member_id, value, assignments[member_id])
            if member.instance_id is not None and member.instance_id in group.static_members:
                raise StateLoadError(
                    f"group {group_id}: instance id {member.instance_id} held by two members")
            state.add_member(group, member, scratch)
    except (OwnershipError, RecordError) as exc:
        state.groups.pop(group_id, None)
        _forget_changes(state, group)
        raise StateLoadError(f"group {group_id}: {exc}") from None
    group.restore(dict(stored.subscription_metadata), stored.preferred_assignor,
                  stored.empty_since_wall_ms)
    _forget_changes(state, group)  # what was just read is what the topic holds

    if _topics_changed(group, state.image):
        group.refresh_subscription_metadata(state.image)
        if group.members:
            state.bump_group_epoch(group, "subscribed topic metadata changed", effects)
    _arm_timers(state, group, now_ms, wall_ms, effects)
    effects.append(GroupLoaded(group_id, group.group_epoch, group.target.epoch,
                               len(group.members)))


def _topics_changed(group: ConsumerGroup, image: TopicsImage) -> bool:
    """Whether a topic the stored metadata names is gone or resized, or a topic the members
    subscribe to now exists and is not in it: a change the old coordinator did not see. The
    stored metadata may hold topics nobody subscribes to any more (it is refreshed on the next
    membership or topic change, not on a leave); that alone is no change."""
    by_id = image.by_id
    stored = group.subscription_metadata
    for topic_id, partitions in stored.items():
        topic = by_id.get(topic_id)
        if topic is None or topic.partitions != partitions:
            return True
    return any(topic_id not in stored for topic_id in group.compute_subscription_metadata(image))


def _forget_changes(state: CoordinatorState, group: ConsumerGroup) -> None:
    if state.journal is not None and state.journal.get(group.group_id) is group:
        del state.journal[group.group_id]
    group.changes = None


def _member(member_id: str, value: MemberValue, at: AssignmentValue) -> ConsumerGroupMember:
    member = ConsumerGroupMember(
        member_id,
        instance_id=value.instance_id,
        rack_id=value.rack_id,
        client_id=value.client_id,
        client_host=value.client_host,
        subscribed_topic_names=frozenset(value.subscribed_topic_names),
        subscribed_topic_regex=value.subscribed_topic_regex,
        server_assignor=value.server_assignor,
        rebalance_timeout_ms=value.rebalance_timeout_ms,
        member_epoch=at.member_epoch,
        previous_member_epoch=at.previous_member_epoch,
        state=at.state,
        protocol=value.protocol,
    )
    member.session_timeout_ms = value.session_timeout_ms
    member.assigned = _epochs_in(at.assigned)
    member.pending_revocation = _epochs_in(at.pending_revocation)
    classic = value.classic
    if (classic is None) != (at.classic_state is None):
        raise RecordError(f"member {member_id}: classic protocols and classic position disagree")
    if classic is not None:
        assert at.classic_state is not None
        member.classic = ClassicMemberMetadata(
            classic.session_timeout_ms,
            classic.protocols,
            classic.subscription_version,
            state=at.classic_state,
            generation=at.classic_generation,
            user_data=classic.user_data,
        )
        if not classic.protocols:
            raise RecordError(f"member {member_id}: a classic member without protocols")
    return member


def _epochs_in(partitions: PartitionEpochList) -> dict[TopicId, dict[int, int]]:
    return {topic_id: dict(pairs) for topic_id, pairs in partitions if pairs}


def _arm_timers(state: CoordinatorState, group: ConsumerGroup, now_ms: int, wall_ms: int,
                effects: list[Effect]) -> None:
    group_id = group.group_id
    for member in group.members.values():
        state.schedule_session_timeout(group, member, now_ms, effects)
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            state.arm_timer(TimerKey(TimerKind.REBALANCE, group_id, member.member_id),
                            now_ms + max(member.rebalance_timeout_ms, 0), effects,
                            payload=member.member_epoch)
    if not group.members:
        since = group.empty_since_wall_ms
        elapsed = 0 if since is None else max(0, wall_ms - since)
        left = max(0, state.config.empty_group_expiry_ms - elapsed)
        state.arm_timer(TimerKey(TimerKind.GROUP_EXPIRY, group_id), now_ms + left, effects)
    for listener in state.listeners:
        listener.group_loaded(group, now_ms, effects)
