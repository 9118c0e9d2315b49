"""The classic client-side assignors a bridged member runs when the broker elects it leader.

:mod:`translation.bridge` runs it (decision record 0018, "Members behind sidecars in the broker
phase"), driven in the proxy by ``proxy/coordination/bridged.py``. Sans-I/O and pure:
the JoinGroup answer's members (member id, group instance id, decoded subscription) and the
subscribed topics' partition counts in, an assignment per member out (topic name ->
partitions). Topics without a partition count (unknown to the leader's metadata) are skipped,
as Kafka's ``AbstractPartitionAssignor`` skips them.

Ordering rules, as Kafka's Java clients (3.x/4.x, ``clients/.../consumer/RangeAssignor.java``,
``RoundRobinAssignor.java`` and ``AbstractPartitionAssignor.MemberInfo.compareTo``):

* members are ordered static first: two members with a group instance id compare by instance
  id, a member with one comes before a member without, two without compare by member id.
  Java compares strings by UTF-16 code unit, Python by code point: the orders differ only for
  characters outside the Basic Multilingual Plane, which Kafka's generated member ids never
  contain;
* ``range``: per topic, the topic's subscribers in that order; with ``P`` partitions and ``C``
  subscribers, subscriber ``i`` gets ``P // C`` consecutive partitions plus one more if
  ``i < P % C``, starting at ``i * (P // C) + min(i, P % C)``. Kafka's rack-aware variant needs
  partition racks, which this input does not carry: the result is the non-rack one;
* ``roundrobin``: every partition of every subscribed topic, topics by name and partitions by
  number, handed out over the members in that order as a circle; a member not subscribed to
  the partition's topic is skipped.

``sticky`` and ``cooperative-sticky`` are balanced and sticky over the members' owned
partitions, computed by the engine's ``uniform`` assignor (members keep what they own up to
their quota; homogeneous subscriptions end with ``max - min <= 1``). What a member owns:

* ``cooperative-sticky``: the subscription's owned partitions (v1+), at the subscription's
  generation (v2+; before that, the 4-byte generation Kafka's ``CooperativeStickyAssignor``
  writes as user data);
* ``sticky``: eager members revoke everything before joining, so Kafka's ``StickyAssignor``
  reads the previous assignment from its user data (``StickyAssignorUserData`` v1: topic
  partitions and generation; v0 without the generation); the subscription's owned partitions
  are used when the user data is absent or does not parse. Stickiness is an optimisation:
  user data that does not parse is ignored.

A partition claimed by members of different generations belongs to the highest generation's
claimant; claimed twice at the same generation it belongs to nobody (Kafka logs and drops it
the same way). ``cooperative-sticky`` then applies Kafka's cooperative adjustment: a partition
whose new owner is not the member that claims it is left out of the new owner's assignment in
this generation (its owner revokes it, and the revoking member's rejoin starts the follow-up
rebalance that assigns it). This is slightly stricter than Kafka's adjustment: a partition
claimed by any other member, including a losing claimant, is withheld.

Assignments carry no user data: Kafka's sticky assignors put theirs in the subscription, and
a Java client accepts an assignment without it. :func:`subscription_user_data` writes the
subscription user data Kafka's clients write, so a Java leader running ``sticky`` stays
sticky for a bridged member.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from translation.assignors.base import GroupSpec, MemberSubscription, SubscriptionType
from translation.assignors.uniform import UniformAssignor
from translation.classic.messages import ClassicSubscription

__all__ = [
    "CLIENT_ASSIGNORS",
    "COOPERATIVE_PROTOCOLS",
    "ClassicGroupMember",
    "MemberAssignment",
    "assign",
    "parse_sticky_user_data",
    "subscription_user_data",
]

CLIENT_ASSIGNORS = ("cooperative-sticky", "range", "roundrobin", "sticky")
"""The client assignors a bridged member offers and can run as leader."""

COOPERATIVE_PROTOCOLS = frozenset({"cooperative-sticky"})
"""Protocols whose members rebalance cooperatively (the others are eager)."""

MemberAssignment = dict[str, tuple[int, ...]]
"""Topic name -> sorted partitions, for one member (topics with no partition left out)."""


@dataclass(frozen=True, slots=True)
class ClassicGroupMember:
    """One member of a JoinGroup answer, as the leader sees it."""

    member_id: str
    group_instance_id: str | None
    subscription: ClassicSubscription


def _kafka_order(members: Sequence[ClassicGroupMember]) -> list[ClassicGroupMember]:
    """``MemberInfo.compareTo``: static members first by instance id, then by member id."""
    return sorted(
        members,
        key=lambda m: (0, m.group_instance_id, "") if m.group_instance_id is not None
        else (1, "", m.member_id),
    )


def _finish(raw: Mapping[str, Mapping[str, set[int] | list[int]]],
            members: Sequence[ClassicGroupMember]) -> dict[str, MemberAssignment]:
    out: dict[str, MemberAssignment] = {}
    for m in members:
        per = raw.get(m.member_id, {})
        out[m.member_id] = {t: tuple(sorted(p)) for t, p in sorted(per.items()) if p}
    return out


def _range(members: Sequence[ClassicGroupMember],
           counts: Mapping[str, int]) -> dict[str, MemberAssignment]:
    raw: dict[str, dict[str, list[int]]] = {m.member_id: {} for m in members}
    ordered = _kafka_order(members)
    for topic in sorted({t for m in members for t in m.subscription.topics}):
        n = counts.get(topic)
        if n is None or n <= 0:
            continue
        subscribers = [m for m in ordered if topic in m.subscription.topics]
        per, extra = divmod(n, len(subscribers))
        for i, m in enumerate(subscribers):
            start = per * i + min(i, extra)
            length = per + (1 if i < extra else 0)
            if length:
                raw[m.member_id][topic] = list(range(start, start + length))
    return _finish(raw, members)


def _roundrobin(members: Sequence[ClassicGroupMember],
                counts: Mapping[str, int]) -> dict[str, MemberAssignment]:
    raw: dict[str, dict[str, list[int]]] = {m.member_id: {} for m in members}
    ordered = _kafka_order(members)
    if not ordered:
        return {}
    subscribed = [frozenset(m.subscription.topics) for m in ordered]
    at = 0
    for topic in sorted({t for m in members for t in m.subscription.topics}):
        n = counts.get(topic)
        if n is None or n <= 0:
            continue
        for p in range(n):
            while topic not in subscribed[at]:
                at = (at + 1) % len(ordered)
            raw[ordered[at].member_id].setdefault(topic, []).append(p)
            at = (at + 1) % len(ordered)
    return _finish(raw, members)


# --------------------------------------------------------------------------------------------
# Sticky user data (Kafka's StickyAssignorUserData v0/v1, CooperativeStickyAssignor's int32)


def _encode_sticky(owned: Sequence[tuple[str, Sequence[int]]], generation: int) -> bytes:
    parts = [struct.pack(">i", len(owned))]
    for topic, partitions in owned:
        name = topic.encode()
        parts.append(struct.pack(">h", len(name)) + name)
        parts.append(struct.pack(f">i{len(partitions)}i", len(partitions), *partitions))
    parts.append(struct.pack(">i", generation))
    return b"".join(parts)


def parse_sticky_user_data(data: bytes) -> tuple[dict[str, set[int]], int] | None:
    """``StickyAssignorUserData``: (previous assignment, generation or -1), None if invalid."""
    try:
        at = 0
        (count,) = struct.unpack_from(">i", data, at)
        at += 4
        if count < 0 or count > len(data):
            return None
        owned: dict[str, set[int]] = {}
        for _ in range(count):
            (size,) = struct.unpack_from(">h", data, at)
            at += 2
            if size < 0 or at + size > len(data):
                return None
            topic = data[at:at + size].decode()
            at += size
            (n,) = struct.unpack_from(">i", data, at)
            at += 4
            if n < 0 or at + 4 * n > len(data):
                return None
            owned.setdefault(topic, set()).update(struct.unpack_from(f">{n}i", data, at))
            at += 4 * n
        generation = -1
        if at + 4 == len(data):
            (generation,) = struct.unpack_from(">i", data, at)
            at += 4
        return (owned, generation) if at == len(data) else None
    except (struct.error, UnicodeDecodeError):
        return None


def subscription_user_data(
    protocol: str, owned: Sequence[tuple[str, Sequence[int]]], generation: int
) -> bytes | None:
    """The subscription user data a Java client writes for ``protocol`` (None: none)."""
    if protocol == "sticky":
        return _encode_sticky(owned, generation)
    if protocol == "cooperative-sticky":
        return struct.pack(">i", generation)
    return None


def _claims(member: ClassicGroupMember, protocol: str) -> tuple[dict[str, set[int]], int]:
    sub = member.subscription
    owned: dict[str, set[int]] = {}
    for topic, partitions in sub.owned_partitions:
        owned.setdefault(topic, set()).update(partitions)
    generation = sub.generation_id
    if protocol == "sticky" and sub.user_data:
        parsed = parse_sticky_user_data(sub.user_data)
        if parsed is not None:
            return parsed
    if protocol == "cooperative-sticky" and generation < 0 and sub.user_data is not None \
            and len(sub.user_data) == 4:
        (generation,) = struct.unpack(">i", sub.user_data)
    return owned, generation


class _Counts:
    def __init__(self, by_id: Mapping[uuid.UUID, int]) -> None:
        self._by_id = by_id

    def partition_count(self, topic_id: uuid.UUID) -> int:
        return self._by_id.get(topic_id, -1)


def sticky_target(members: Sequence[ClassicGroupMember], counts: Mapping[str, int],
                  protocol: str = "sticky") -> dict[str, MemberAssignment]:
    """The balanced, sticky assignment before any cooperative adjustment."""
    names = sorted({t for m in members for t in m.subscription.topics
                    if counts.get(t, 0) > 0})
    ids = {name: uuid.UUID(int=i + 1) for i, name in enumerate(names)}
    # who owns what: highest generation wins, a tie at that generation leaves it to nobody
    best: dict[tuple[str, int], tuple[int, str | None]] = {}
    for m in sorted(members, key=lambda m: m.member_id):
        owned, generation = _claims(m, protocol)
        for topic, partitions in owned.items():
            if topic not in ids:
                continue
            for p in partitions:
                if not 0 <= p < counts[topic]:
                    continue
                seen = best.get((topic, p))
                if seen is None or generation > seen[0]:
                    best[(topic, p)] = (generation, m.member_id)
                elif generation == seen[0]:
                    best[(topic, p)] = (generation, None)
    current: dict[str, dict[uuid.UUID, set[int]]] = {m.member_id: {} for m in members}
    for (topic, p), (_, owner) in best.items():
        if owner is not None:
            current[owner].setdefault(ids[topic], set()).add(p)
    specs = {}
    for m in members:
        subscribed = frozenset(ids[t] for t in m.subscription.topics if t in ids)
        specs[m.member_id] = MemberSubscription(
            member_id=m.member_id, instance_id=m.group_instance_id, rack_id=None,
            subscribed_topic_ids=subscribed,
            assigned_partitions={t: frozenset(p) for t, p in current[m.member_id].items()
                                 if t in subscribed},
        )
    kind = (SubscriptionType.HOMOGENEOUS
            if len({s.subscribed_topic_ids for s in specs.values()}) <= 1
            else SubscriptionType.HETEROGENEOUS)
    result = UniformAssignor().assign(
        GroupSpec(members=specs, subscription_type=kind),
        _Counts({ids[n]: counts[n] for n in names}))
    by_id = {v: k for k, v in ids.items()}
    raw = {mid: {by_id[t]: set(p) for t, p in a.items()} for mid, a in result.items()}
    return _finish(raw, members)


def _cooperative(members: Sequence[ClassicGroupMember],
                 counts: Mapping[str, int]) -> dict[str, MemberAssignment]:
    target = sticky_target(members, counts, "cooperative-sticky")
    claimed: dict[tuple[str, int], set[str]] = {}
    for m in members:
        for topic, partitions in m.subscription.owned_partitions:
            for p in partitions:
                claimed.setdefault((topic, p), set()).add(m.member_id)
    out: dict[str, MemberAssignment] = {}
    for member_id, assignment in target.items():
        kept: MemberAssignment = {}
        for topic, partitions in assignment.items():
            left = tuple(p for p in partitions
                         if not claimed.get((topic, p), set()) - {member_id})
            if left:
                kept[topic] = left
        out[member_id] = kept
    return out


def assign(protocol: str, members: Sequence[ClassicGroupMember],
           partition_counts: Mapping[str, int]) -> dict[str, MemberAssignment]:
    """Run the client assignor ``protocol`` over the JoinGroup answer's ``members``."""
    if protocol == "range":
        return _range(members, partition_counts)
    if protocol == "roundrobin":
        return _roundrobin(members, partition_counts)
    if protocol == "sticky":
        return sticky_target(members, partition_counts, "sticky")
    if protocol == "cooperative-sticky":
        return _cooperative(members, partition_counts)
    raise ValueError(f"no client assignor {protocol!r}")
