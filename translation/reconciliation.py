"""Reconciliation: moving one member from its current assignment towards its target.

This is Kafka's ``CurrentAssignmentBuilder``. Per topic, with the member's current assigned
partitions ``current`` and its target ``target``:

* assigned = current ∩ target (keeping each partition's assignment epoch);
* pending revocation = current - assigned;
* pending assignment = target - assigned, minus partitions still held by another member.

If the member still owns partitions it must revoke (per the owned partitions it reported,
a null report counting as "still owns"), it stays at its epoch in UNREVOKED_PARTITIONS and is
told to revoke them. Otherwise it advances to the target epoch: newly free partitions are
added at once with the target epoch as their assignment epoch, and the member is STABLE, or
UNRELEASED_PARTITIONS while something in its target is still held by others. Partitions are
handed out as soon as their former owner releases them; assignments are never acknowledged.

The previous member epoch is set to the epoch before each transition, as Kafka does
(``updateMemberEpoch``); it backs the lost-response rule of the heartbeat. A transition that
moves the member to a new epoch also notes whether it changed nothing but the epoch (the same
assigned partitions before and after, none pending revocation): the rule then accepts the
previous epoch without owned partitions too (``translation/heartbeat.py``).

:func:`reconcile` mutates the member and keeps the group's :class:`PartitionOwners` in step,
touching only the topics of this member.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from translation.errors import ErrorCode, GroupError
from translation.member import ConsumerGroupMember, MemberState, PartitionEpochs
from translation.ownership import PartitionOwners
from translation.topics import TopicId

OwnedPartitions = Sequence[tuple[TopicId, Sequence[int]]]
"""Partitions a member reports owning: ``(topic_id, partitions)`` pairs."""

_EMPTY: frozenset[int] = frozenset()


def owns_any(owned: OwnedPartitions | None, partitions: PartitionEpochs) -> bool:
    """Whether the reported owned partitions include any of ``partitions`` (None: yes)."""
    if owned is None:
        return True
    for topic_id, ps in owned:
        held = partitions.get(topic_id)
        if held:
            for p in ps:
                if p in held:
                    return True
    return False


def reconcile(
    member: ConsumerGroupMember,
    target_epoch: int,
    target: Mapping[TopicId, frozenset[int]],
    owners: PartitionOwners,
    owned: OwnedPartitions | None,
    *,
    subscription_changed: bool = False,
) -> bool:
    """Advance ``member`` towards ``target``; returns whether anything changed.

    ``subscription_changed`` (Kafka's "force consistency with the subscription") recomputes the
    next assignment even for a member STABLE at the target epoch, so that partitions the caller
    filtered out of ``target`` (topics no longer subscribed) are revoked at once."""
    state = member.state
    if state is MemberState.STABLE:
        if member.member_epoch == target_epoch and not subscription_changed:
            return False
        return _next_assignment(member, member.member_epoch, target_epoch, target, owners, owned)
    if state is MemberState.UNREVOKED_PARTITIONS:
        if owns_any(owned, member.pending_revocation):
            return False
        return _next_assignment(member, member.member_epoch, target_epoch, target, owners, owned)
    if state is MemberState.UNRELEASED_PARTITIONS:
        return _next_assignment(member, member.member_epoch, target_epoch, target, owners, owned)
    # UNKNOWN: only a member that owns nothing may continue, straight at the target epoch.
    if owned is None or len(owned) > 0:
        raise GroupError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            "The consumer group member is in a unknown state. "
            "The member must abandon all its partitions and rejoin.",
        )
    return _next_assignment(member, target_epoch, target_epoch, target, owners, owned)


def _next_assignment(
    member: ConsumerGroupMember,
    member_epoch: int,
    target_epoch: int,
    target: Mapping[TopicId, frozenset[int]],
    owners: PartitionOwners,
    owned: OwnedPartitions | None,
) -> bool:
    member_id = member.member_id
    current = member.assigned
    old_revoking = member.pending_revocation
    new_assigned: PartitionEpochs = {}
    new_revoking: PartitionEpochs = {}
    to_assign: dict[TopicId, list[int]] = {}
    has_unreleased = False

    topics = set(target)
    topics.update(current)
    for topic_id in topics:
        tgt = target.get(topic_id, _EMPTY)
        cur = current.get(topic_id)
        if cur:
            kept = {p: e for p, e in cur.items() if p in tgt}
            if len(kept) != len(cur):
                new_revoking[topic_id] = {p: e for p, e in cur.items() if p not in tgt}
        else:
            kept = {}
        if kept:
            new_assigned[topic_id] = kept
        if len(kept) != len(tgt):
            free: list[int] = []
            for p in tgt:
                if p in kept:
                    continue
                holder = owners.owner(topic_id, p)
                if holder is None or holder == member_id:
                    free.append(p)
                else:
                    has_unreleased = True
            if free:
                to_assign[topic_id] = free

    if new_revoking and owns_any(owned, new_revoking):
        # Revoke first: stay at the current epoch until the member acknowledges.
        new_state = MemberState.UNREVOKED_PARTITIONS
        new_epoch = member_epoch
    else:
        # Nothing left to revoke (or the member already let go of it): advance.
        new_revoking = {}
        for topic_id, free in to_assign.items():
            ps = new_assigned.get(topic_id)
            if ps is None:
                ps = new_assigned[topic_id] = {}
            for p in free:
                ps[p] = target_epoch
        new_state = MemberState.UNRELEASED_PARTITIONS if has_unreleased else MemberState.STABLE
        new_epoch = target_epoch

    changed = (
        new_state is not member.state
        or new_epoch != member.member_epoch
        or new_assigned != current
        or new_revoking != old_revoking
    )
    if not changed:
        return False
    _update_owners(member_id, current, old_revoking, new_assigned, new_revoking, owners)
    member.epoch_bump_only = (new_epoch != member.member_epoch
                              and not any(old_revoking.values())
                              and _same_partitions(current, new_assigned))
    member.previous_member_epoch = member.member_epoch
    member.member_epoch = new_epoch
    member.state = new_state
    member.assigned = new_assigned
    member.pending_revocation = new_revoking
    return True


def _same_partitions(a: PartitionEpochs, b: PartitionEpochs) -> bool:
    """Whether ``a`` and ``b`` hold the same partitions (whatever their assignment epochs)."""
    topics = {t for t, ps in a.items() if ps}
    if topics != {t for t, ps in b.items() if ps}:
        return False
    return all(a[t].keys() == b[t].keys() for t in topics)


def _update_owners(
    member_id: str,
    old_assigned: PartitionEpochs,
    old_revoking: PartitionEpochs,
    new_assigned: PartitionEpochs,
    new_revoking: PartitionEpochs,
    owners: PartitionOwners,
) -> None:
    topics = set(old_assigned)
    topics.update(old_revoking, new_assigned, new_revoking)
    for topic_id in topics:
        old: set[int] = set(old_assigned.get(topic_id, ()))
        old.update(old_revoking.get(topic_id, ()))
        new: set[int] = set(new_assigned.get(topic_id, ()))
        new.update(new_revoking.get(topic_id, ()))
        released = old - new
        if released:
            owners.remove(member_id, topic_id, released)
        taken = new - old
        if taken:
            owners.add(member_id, topic_id, taken)


def release_all(member: ConsumerGroupMember, owners: PartitionOwners) -> None:
    """Drop every partition the member holds from the ownership map (member removed)."""
    for topic_id, ps in member.assigned.items():
        owners.remove(member.member_id, topic_id, ps)
    for topic_id, ps in member.pending_revocation.items():
        owners.remove(member.member_id, topic_id, ps)
