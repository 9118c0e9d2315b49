"""Moving a group between the broker's classic coordinator and the engine.

Kafka converts a group in place, under ``group.consumer.migration.policy``
(:class:`~translation.config.MigrationPolicy`): *upgrade* turns a classic group into a
consumer group when the first new-protocol member joins it; *downgrade* turns a consumer group
back into a classic group when its last new-protocol member leaves and only classic members
remain. Behind the proxy the classic group lives in the broker, so:

* upgrade = :func:`convert_classic_group`: the proxy describes the broker's classic group
  (:class:`ClassicGroupSnapshot`: generation, protocol, and each member's subscription and
  assignment) and the engine adopts it as Kafka's ``ConsumerGroup.fromClassicGroup`` does:
  the group epoch and the assignment epoch start at the generation, each member is STABLE at
  that epoch with its current assignment, and the target is the current assignment, so
  nothing moves until the membership changes (the KIP's "Online Migration" case study). A
  *bridged* member (a sidecar's classic member for a KIP-848 client) is adopted under the
  client's member id as a consumer-protocol member at that epoch. It is
  refused (the group stays with the broker) when the policy does not allow upgrades, the
  protocol type is not ``consumer``, the protocol is not a known client assignor, a member's
  subscription does not parse, an assignment carries userData (a custom assignor's state would
  be lost: Kafka's rule), two members claim the same partition, or the group is too big.
  Unlike Kafka, userData in the assignments of a ``sticky`` or ``cooperative-sticky`` group is
  not a refusal (:data:`STATE_IN_ASSIGNMENT`): librdkafka's sticky assignors keep their own
  stickiness state there (each member's partitions and generation), which only makes the
  next client-side assignment sticky; the engine assigns from what members own, so nothing of
  it is lost (a librdkafka cooperative-sticky group would otherwise never convert);
* downgrade = the :class:`~translation.effects.GroupHandedBack` effect, emitted by
  :class:`~translation.classic.coordinator.ClassicGroupCoordinator` when the last
  consumer-protocol member leaves or is fenced, classic members remain, the policy allows
  downgrades and ``GroupConfig.adopt_classic_groups`` is off (with it on, the engine keeps
  serving all-classic groups, so handing them back would only bounce them). The engine forgets
  the group; the proxy stops coordinating it and forwards its requests to the broker again,
  where the classic members rejoin;
* release = :meth:`~translation.classic.coordinator.ClassicGroupCoordinator.release` (the
  ``groupgate release`` command, or the downgrade policy in front of a broker's classic
  coordinator, decision record 0018): the engine forgets the group with tombstones and says,
  per member, what it may still own and at which epoch
  (:class:`~translation.effects.GroupReleased`), and which protocol the broker's group will
  select (:func:`released_protocol`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from translation.config import CLASSIC_ASSIGNORS
from translation.coordinator import GroupCoordinator
from translation.effects import Effect
from translation.member import ConsumerGroupMember, MemberProtocol, MemberState
from translation.target import TargetAssignment
from translation.topics import TopicId

from .member import ClassicMemberMetadata, ClassicMemberState
from .messages import CONSUMER_PROTOCOL_TYPE, ClassicAssignment, ClassicProtocol

STATE_IN_ASSIGNMENT = frozenset({"sticky", "cooperative-sticky"})
"""Protocols whose assignment userData is the client assignor's stickiness state (librdkafka),
lost without harm when the engine takes the group over."""


@dataclass(frozen=True, slots=True)
class ClassicGroupMemberSnapshot:
    member_id: str
    protocols: Sequence[ClassicProtocol]
    """As the member last joined (subscription per protocol, decoded by the proxy)."""
    assignment: ClassicAssignment | None
    """Its current assignment; None when it has none yet (joined but never synced)."""
    assignment_user_data: bytes | None = None
    assignment_malformed: bool = False
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    session_timeout_ms: int = 45_000
    rebalance_timeout_ms: int = 300_000
    kip848_member_id: str | None = None
    """Set for a *bridged* member (the classic member a sidecar runs for a KIP-848 client):
    the client's own member id, under which the engine adopts it as a consumer-protocol
    member at the generation's epoch (decision record 0018, step 4)."""
    subscribed_topic_regex: str | None = None
    """A bridged member's client's regex (its subscription names what it resolved to): the
    engine adopts it subscribed by the regex."""


@dataclass(frozen=True, slots=True)
class ClassicGroupSnapshot:
    """The broker's classic group as the proxy last saw it."""

    group_id: str
    generation_id: int
    protocol_type: str
    protocol_name: str
    members: Sequence[ClassicGroupMemberSnapshot]
    stable: bool = True
    """False if the group was rebalancing: the converted group then starts a new rebalance."""


RELEASED_DEFAULT_PROTOCOL = "cooperative-sticky"
"""The protocol a released group without classic members is handed back with (its KIP-848
members' bridged members offer every client assignor; the incremental one keeps their
partitions where they are)."""


def released_protocol(classic_protocols: Sequence[Sequence[str]],
                      known: frozenset[str] | None = None) -> str | None:
    """The protocol Kafka's classic coordinator selects for a group whose classic members offer
    ``classic_protocols`` (each in its order of preference) and whose bridged members offer
    every client assignor (``known``): among the protocols every member supports, each member
    votes for its first; the most votes win (ties: the first candidate in the first member's
    order). :data:`RELEASED_DEFAULT_PROTOCOL` without classic members; None if they share
    no protocol the bridged members can run too."""
    supported = known if known is not None else CLASSIC_ASSIGNORS
    if not classic_protocols:
        return RELEASED_DEFAULT_PROTOCOL
    candidates = set(supported)
    for names in classic_protocols:
        candidates &= set(names)
    if not candidates:
        return None
    votes: dict[str, int] = {}
    for names in classic_protocols:
        vote = next(n for n in names if n in candidates)
        votes[vote] = votes.get(vote, 0) + 1
    order = [n for n in classic_protocols[0] if n in candidates]
    return max(order, key=lambda n: (votes.get(n, 0), -order.index(n)))


def conversion_refusal(engine: GroupCoordinator, snapshot: ClassicGroupSnapshot) -> str | None:
    """Why ``snapshot`` cannot be converted, or None when it can."""
    config = engine.config
    if not config.migration_policy.upgrade_enabled:
        return "the migration policy does not allow upgrades"
    group = engine.groups.get(snapshot.group_id)
    if group is not None and group.members:
        return "the engine already serves this group"
    if snapshot.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return f"protocol type {snapshot.protocol_type!r} is not 'consumer'"
    if snapshot.protocol_name not in config.classic_assignors:
        return f"assignor {snapshot.protocol_name!r} is not a known client assignor"
    if len(snapshot.members) > config.max_group_size:
        return "the group is larger than the maximum group size"
    claimed: set[tuple[str, int]] = set()
    for m in snapshot.members:
        protocol = next((p for p in m.protocols if p.name == snapshot.protocol_name), None)
        if protocol is None or protocol.subscription is None:
            return f"member {m.member_id} has no consumer-protocol subscription"
        if m.assignment_malformed:
            return f"member {m.member_id}'s assignment is malformed"
        if m.assignment_user_data and snapshot.protocol_name not in STATE_IN_ASSIGNMENT:
            return f"member {m.member_id}'s assignment carries userData that would be lost"
        if m.assignment is not None:
            for name, ps in m.assignment.partitions:
                for p in ps:
                    if (name, p) in claimed:
                        return f"partition {name}-{p} is assigned to two members"
                    claimed.add((name, p))
    return None


def convert_classic_group(
    engine: GroupCoordinator, snapshot: ClassicGroupSnapshot, now_ms: int
) -> tuple[str | None, list[Effect]]:
    """Adopt the broker's classic group; returns ``(refusal, effects)``, refusal None on success."""
    effects: list[Effect] = []
    refusal = conversion_refusal(engine, snapshot)
    if refusal is not None:
        return refusal, effects
    image = engine.image
    generation = snapshot.generation_id
    target: dict[str, dict[TopicId, frozenset[int]]] = {}
    members: list[ConsumerGroupMember] = []
    for m in snapshot.members:
        protocol = next(p for p in m.protocols if p.name == snapshot.protocol_name)
        subscription = protocol.subscription
        assert subscription is not None
        bridged = m.kip848_member_id is not None
        member_id = m.kip848_member_id or m.member_id
        regex = m.subscribed_topic_regex if bridged else None
        member = ConsumerGroupMember(
            member_id,
            instance_id=m.group_instance_id,
            rack_id=subscription.rack_id,
            client_id=m.client_id,
            client_host=m.client_host,
            subscribed_topic_names=frozenset() if regex else frozenset(subscription.topics),
            subscribed_topic_regex=regex,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            member_epoch=generation,
            previous_member_epoch=generation,
            state=MemberState.STABLE,
            protocol=MemberProtocol.CONSUMER if bridged else MemberProtocol.CLASSIC,
        )
        member.session_timeout_ms = m.session_timeout_ms
        if not bridged:
            others = [p.name for p in m.protocols if p.name != snapshot.protocol_name]
            names = (snapshot.protocol_name, *others)
            member.classic = ClassicMemberMetadata(
                m.session_timeout_ms,
                names,
                subscription.version,
                state=ClassicMemberState.STABLE,
                # the generation its client was given: a quiet advance moves the member
                # epoch, never this (else the client's next heartbeat is ILLEGAL_GENERATION)
                generation=generation,
            )
        assigned: dict[TopicId, frozenset[int]] = {}
        if m.assignment is not None:
            for name, ps in m.assignment.partitions:
                topic = image.by_name.get(name)
                if topic is not None and ps:
                    assigned[topic.topic_id] = frozenset(ps) | assigned.get(
                        topic.topic_id, frozenset()
                    )
        member.assigned = {t: dict.fromkeys(ps, generation) for t, ps in assigned.items()}
        target[member_id] = assigned
        members.append(member)
    group = engine.create_group(snapshot.group_id, effects, group_epoch=generation,
                                target=TargetAssignment(generation, target))
    for member in members:
        engine.add_member(group, member, effects)
        engine.schedule_session_timeout(group, member, now_ms, effects)
    engine.refresh_group(group)
    if not snapshot.stable:
        engine.bump_group_epoch(group, "converted while rebalancing", effects)
    return None, effects
