"""ConsumerGroupHeartbeat: request/response dataclasses, validation and the handling flow.

Field names are Kafka's schema names in snake_case, so the proxy maps a decoded request
dict with ``ConsumerGroupHeartbeatRequest(**fields)``. Null fields mean "unchanged";
``rebalance_timeout_ms == -1`` means unchanged; an empty ``subscribed_topic_regex`` removes
the regex. ``client_id``, ``client_host`` and ``api_version`` are not schema fields: they come
from the request header and connection.

Flow of a regular heartbeat (Kafka's ``GroupMetadataManager.consumerGroupHeartbeat``): get or
create the group (create only on epoch 0, else GROUP_ID_NOT_FOUND) -> group full and member
new: GROUP_MAX_SIZE_REACHED -> find or create the member (static members: replacement after a
-2 leave, UNRELEASED_INSTANCE_ID, FENCED_INSTANCE_ID) -> member epoch check (with the
lost-response rule, :func:`lost_response`) -> when the member's record changes, it must still
fit the state log (:func:`translation.limits.check_member_record`) -> apply changed fields ->
bump the group epoch once if the membership, the subscription, the resolved regex (resolved
again under the member's rights when it brings them and the regexes are due, as Kafka resolves
them under the rights of the member whose heartbeat triggers it), the subscribed topics'
metadata or the group's preferred assignor changed -> recompute the target if the group epoch
is ahead (at most once per assignment interval) -> reconcile this member -> re-arm its session
timer. Everything that can fail is checked before anything is changed, so an error response
leaves the group as it was.

A consumer-protocol member joining a live group whose members all use the classic protocol is
Kafka's online upgrade: GROUP_ID_NOT_FOUND under the migration policies without upgrades
(``disabled``, ``downgrade``), as Kafka answers; the sidecars refuse it in the broker phase
alike, except a KIP-848 member a hand-back carried over (decision record 0018).

Differences from Kafka, on purpose: the lost-response rule also accepts the previous epoch
with null owned partitions when the move from it changed nothing but the member epoch (see
:func:`lost_response`); a member joining always bumps the group epoch (Kafka
skips the bump when a new member subscribes to nothing; the KIP bumps on every join); a
static member re-sending epoch 0 under its own member id rejoins in place like a dynamic one
(instead of UNRELEASED_INSTANCE_ID). As in Kafka, a static member joining with the instance id
of a *classic* member (a client rolled from the classic protocol to the new one) replaces it at
once, without waiting for a leave.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from translation import limits
from translation import regex as regex_mod
from translation.durable import member_value
from translation.effects import (
    Effect,
    MemberLeft,
)
from translation.errors import ErrorCode, GroupError
from translation.member import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroupMember,
    MemberProtocol,
    MemberState,
    PartitionEpochs,
)
from translation.reconciliation import OwnedPartitions
from translation.records import MemberValue
from translation.topics import TopicId

if TYPE_CHECKING:
    from translation.state import CoordinatorState


class TopicPartitions(NamedTuple):
    topic_id: TopicId
    partitions: Sequence[int]


@dataclass(frozen=True, slots=True)
class ConsumerGroupHeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    """Static membership (KIP-345); None: a dynamic member."""
    rack_id: str | None = None
    """None: unchanged."""
    rebalance_timeout_ms: int = -1
    """-1: unchanged (required when joining)."""
    subscribed_topic_names: Sequence[str] | None = None
    """None: unchanged."""
    subscribed_topic_regex: str | None = None
    """None: unchanged; empty: the regex is removed (RE2, full match)."""
    server_assignor: str | None = None
    """None: unchanged."""
    topic_partitions: Sequence[tuple[TopicId, Sequence[int]]] | None = None
    """The partitions the member owns; None: unchanged; empty when joining."""
    client_id: str = ""
    """From the request header."""
    client_host: str = ""
    """From the connection."""
    api_version: int = 1
    topic_rights: regex_mod.TopicRights | None = None
    """What the member may DESCRIBE of the topics its group's regexes match, when the proxy
    authorizes it (None: not asked, every topic). When the group's regexes are due to be
    resolved again (:meth:`~translation.group.ConsumerGroup.regex_rights_due`), they are
    resolved under these rights."""


@dataclass(slots=True)
class ConsumerGroupHeartbeatResponse:
    error_code: int = 0
    error_message: str | None = None
    member_id: str | None = None
    """The id the member goes on with (v0: the one the coordinator generated)."""
    member_epoch: int = 0
    """The epoch the member is at now (or, for a leave, the -1 / -2 it sent)."""
    heartbeat_interval_ms: int = 0
    assignment: list[TopicPartitions] | None = None
    """None: unchanged. Else the assigned partitions (wire: Assignment.TopicPartitions)."""
    throttle_time_ms: int = 0


def _blank(value: str | None) -> bool:
    return value is not None and not value.strip()


def validate(request: ConsumerGroupHeartbeatRequest, assignors: Sequence[str]) -> None:
    """Kafka's request validation: INVALID_REQUEST or UNSUPPORTED_ASSIGNOR."""
    epoch = request.member_epoch
    if (request.api_version >= 1 or epoch > 0 or epoch == LEAVE_GROUP_MEMBER_EPOCH) and not (
        request.member_id and request.member_id.strip()
    ):
        raise GroupError(ErrorCode.INVALID_REQUEST, "MemberId can't be empty.")
    if not request.group_id or not request.group_id.strip():
        raise GroupError(ErrorCode.INVALID_REQUEST, "GroupId can't be empty.")
    if _blank(request.instance_id):
        raise GroupError(ErrorCode.INVALID_REQUEST, "InstanceId can't be empty.")
    if _blank(request.rack_id):
        raise GroupError(ErrorCode.INVALID_REQUEST, "RackId can't be empty.")
    if epoch == 0:
        if request.rebalance_timeout_ms == -1:
            raise GroupError(
                ErrorCode.INVALID_REQUEST, "RebalanceTimeoutMs must be provided in first request."
            )
        if request.topic_partitions is None or len(request.topic_partitions) > 0:
            raise GroupError(
                ErrorCode.INVALID_REQUEST, "TopicPartitions must be empty when (re-)joining."
            )
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            raise GroupError(
                ErrorCode.INVALID_REQUEST,
                "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when "
                "(re-)joining.",
            )
    elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        if request.instance_id is None:
            raise GroupError(ErrorCode.INVALID_REQUEST, "InstanceId can't be null.")
    elif epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        raise GroupError(ErrorCode.INVALID_REQUEST, "MemberEpoch is invalid.")
    if request.server_assignor is not None and request.server_assignor not in assignors:
        raise GroupError(
            ErrorCode.UNSUPPORTED_ASSIGNOR,
            f"ServerAssignor {request.server_assignor} is not supported. "
            f"Supported assignors: {', '.join(assignors)}.",
        )


def is_subset(owned: OwnedPartitions | None, assigned: PartitionEpochs) -> bool:
    if owned is None:
        return False
    for topic_id, ps in owned:
        held = assigned.get(topic_id)
        if held is None:
            if ps:
                return False
            continue
        for p in ps:
            if p not in held:
                return False
    return True


def lost_response(member: ConsumerGroupMember, received: int,
                  owned: OwnedPartitions | None) -> bool:
    """Whether a heartbeat at an epoch older than the member's is accepted as one whose
    response (the one that moved the member on) was lost.

    Kafka's rule: the epoch is the member's previous one and the owned partitions are
    reported, all of them assigned to the member now. The report is what rules out two owners
    (a member still owning a partition revoked from it, maybe given to another member since,
    is fenced) and what reconciliation goes on from. Null owned partitions ("unchanged") say
    nothing of what the member owns, so Kafka fences them. librdkafka sends them after its own
    request timeout: a heartbeat it gave up on (the coordinator slow, or a follower sidecar's
    relay to a frozen coordinating sidecar) may still be processed and move the member on, and
    the next one comes at the previous epoch without owned partitions.

    Here they are accepted when that move changed nothing but the epoch
    (:attr:`~translation.member.ConsumerGroupMember.epoch_bump_only`: the same assigned
    partitions before and after, none pending revocation): the member can own only what it
    was assigned at the previous epoch, which is what it is assigned now, so a null report
    means what it means at the current epoch (still owning every assigned partition) and
    nobody else has been or can be given any of them until the member reports them released.
    A move that revoked partitions is fenced as in Kafka: the member may still own them. So is
    a move that added partitions: the member has not heard of them, and counting a null report
    as owning them would leave the coordinator waiting for the member to revoke them, should
    its target take them back before the member learns of them, until the rebalance timeout
    fences it while it still consumes the partitions it has (a partition owned twice: found
    by the fleet simulation, seed 900653, while such moves were accepted)."""
    if received != member.previous_member_epoch:
        return False
    if owned is None:
        return member.epoch_bump_only
    return is_subset(owned, member.assigned)


def check_member_epoch(
    member: ConsumerGroupMember, received: int, owned: OwnedPartitions | None
) -> None:
    """FENCED_MEMBER_EPOCH unless the epoch matches or the lost-response rule
    (:func:`lost_response`) applies."""
    if received > member.member_epoch:
        raise GroupError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"The consumer group member has a greater member epoch ({received}) than the one "
            f"known by the group coordinator ({member.member_epoch}). The member must abandon "
            "all its partitions and rejoin.",
        )
    if received < member.member_epoch and not lost_response(member, received, owned):
        raise GroupError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"The consumer group member has a smaller member epoch ({received}) than the one "
            f"known by the group coordinator ({member.member_epoch}). The member must abandon "
            "all its partitions and rejoin.",
        )


def _partition_sets_differ(a: PartitionEpochs, b: PartitionEpochs) -> bool:
    if a is b:
        return False
    if a.keys() != b.keys():
        return True
    return any(a[t].keys() != b[t].keys() for t in a)


def assignment_of(member: ConsumerGroupMember) -> list[TopicPartitions]:
    return [TopicPartitions(t, sorted(ps)) for t, ps in member.assigned.items()]


def handle_regular(
    engine: CoordinatorState,
    request: ConsumerGroupHeartbeatRequest,
    now_ms: int,
    effects: list[Effect],
) -> ConsumerGroupHeartbeatResponse:
    config = engine.config
    epoch = request.member_epoch
    group_id = request.group_id
    group = engine.groups.get(group_id)
    if group is None and epoch != 0:
        raise GroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.")

    member_id = request.member_id
    instance_id = request.instance_id
    members = group.members if group is not None else {}
    if (
        group is not None
        and epoch == 0
        and not config.migration_policy.upgrade_enabled
        and members
        and member_id not in members
        and all(m.protocol is MemberProtocol.CLASSIC for m in members.values())
    ):
        # a live group of classic members only is a classic group to Kafka: a consumer-protocol
        # member joining it is an online upgrade, which ``disabled`` and ``downgrade`` forbid
        # (``GroupMetadataManager.validateOnlineUpgrade``)
        raise GroupError(
            ErrorCode.GROUP_ID_NOT_FOUND,
            f"Cannot upgrade classic group {group_id} to consumer group because the online "
            f"upgrade is disabled (migration policy {config.migration_policy.value}).",
        )
    if (
        group is not None
        and len(members) >= config.max_group_size
        and (not member_id or member_id not in members)
        and (instance_id is None or instance_id not in group.static_members)
    ):
        raise GroupError(
            ErrorCode.GROUP_MAX_SIZE_REACHED,
            f"The consumer group has reached its maximum capacity of {config.max_group_size} "
            "members.",
        )
    if not member_id:
        member_id = config.member_id_factory()
    owned = request.topic_partitions

    # 1. Find or create the member. Nothing is changed until every check has passed.
    replaced: ConsumerGroupMember | None = None
    is_new = False
    adopt_instance = False
    member: ConsumerGroupMember | None
    if instance_id is None:
        member = members.get(member_id)
        if member is None:
            if epoch != 0:
                raise GroupError(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"Member {member_id} is not a member of group {group_id}.",
                )
            member = ConsumerGroupMember(member_id)
            is_new = True
        elif epoch != 0:
            check_member_epoch(member, epoch, owned)
    else:
        existing = group.static_member(instance_id) if group is not None else None
        if epoch == 0:
            if existing is None:
                member = members.get(member_id)
                if member is None:
                    member = ConsumerGroupMember(member_id, instance_id=instance_id)
                    is_new = True
                elif member.instance_id is None:
                    adopt_instance = True
            elif existing.member_id == member_id:
                member = existing
            else:
                # A classic member holding the instance id is replaced at once (Kafka checks
                # UNRELEASED_INSTANCE_ID only when both members use the consumer protocol).
                if (
                    existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH
                    and existing.protocol is not MemberProtocol.CLASSIC
                ):
                    raise GroupError(
                        ErrorCode.UNRELEASED_INSTANCE_ID,
                        f"Static member {member_id} with instance id {instance_id} cannot join "
                        f"the group because the instance id is owned by {existing.member_id} "
                        "member.",
                    )
                replaced = existing
                member = static_replacement(existing, member_id)
        else:
            assert group is not None  # epoch != 0 needs an existing group
            member = group.find_member(member_id, instance_id)
            check_member_epoch(member, epoch, owned)

    new_regex = request.subscribed_topic_regex
    if new_regex and new_regex != member.subscribed_topic_regex:
        regex_mod.validate_regex(new_regex)
    if member.state is MemberState.UNKNOWN and (owned is None or len(owned) > 0):
        raise GroupError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            "The consumer group member is in a unknown state. "
            "The member must abandon all its partitions and rejoin.",
        )

    # An older epoch (accepted by the lost-response rule): the answer that told the member
    # its new epoch and assignment may be lost, so it gets the assignment again.
    stale = not is_new and replaced is None and 0 < epoch < member.member_epoch

    names = (
        member.subscribed_topic_names
        if request.subscribed_topic_names is None
        else frozenset(request.subscribed_topic_names)
    )
    regex = member.subscribed_topic_regex if new_regex is None else (new_regex or None)
    rebalance_timeout = None if request.rebalance_timeout_ms == -1 else request.rebalance_timeout_ms
    if (is_new or replaced is not None or adopt_instance
            or names != member.subscribed_topic_names or regex != member.subscribed_topic_regex
            or request.rack_id not in (None, member.rack_id)
            or request.client_id != member.client_id or request.client_host != member.client_host
            or request.server_assignor not in (None, member.server_assignor)
            or rebalance_timeout not in (None, member.rebalance_timeout_ms)):
        # The member record changes: it must still fit the state log (translation.limits).
        limits.check_member_record(
            config, group_id, member_id,
            member_value_after(member, request, names, regex,
                               instance_id if adopt_instance else member.instance_id),
            api="consumer-group-heartbeat", effects=effects)

    # 2. Apply. From here on nothing raises (barring internal invariant violations).
    if group is None:
        group = engine.create_group(group_id, effects)
    # Rights the member brings resolve the group's regexes when they are due, or when this
    # heartbeat brings a regex new to the group: that one is resolved under them from the
    # start, the others again after the subscription changes.
    rights = request.topic_rights
    if rights is not None and ((regex is not None and regex not in group.regex_counts)
                               or group.regex_rights_due()):
        group.regex_rights = rights
    else:
        rights = None
    reasons: list[str] = []
    if group.group_epoch == 0:
        reasons.append("group created")
    if replaced is not None:
        engine.replace_member(group, replaced, member, effects)
    elif is_new:
        engine.add_member(group, member, effects)
        reasons.append("member joined")
    if engine.update_member(
        group,
        member,
        instance_id=instance_id if adopt_instance else None,
        rack_id=request.rack_id,
        rebalance_timeout_ms=rebalance_timeout,
        client_id=request.client_id,
        client_host=request.client_host,
        server_assignor=request.server_assignor,
        subscription=(names, regex),
    ):
        reasons.append("subscription changed")
    if rights is not None and group.resolve_regexes_under(rights, engine.image):
        reasons.append("regex resolution changed")
    elif (request.topic_rights is None and group.regex_rights is not None and group.regex_due
          and group.resolve_regexes_under(None, engine.image)):
        # no rights came with it (a member behind another sidecar: they are not carried), and
        # topics the group's rights did not check wait: resolved over every topic, as without
        # authorization, so that they do not wait for a member whose rights come along
        reasons.append("regex resolution changed")

    # 3. Group epoch, target assignment, then reconciliation of this member.
    engine.apply_member_changes(group, reasons, now_ms, effects)
    old_assigned = member.assigned if not is_new and replaced is None else {}
    engine.reconcile_member(group, member, owned, now_ms, effects)
    engine.schedule_session_timeout(group, member, now_ms, effects)

    response = ConsumerGroupHeartbeatResponse(
        member_id=member_id,
        member_epoch=member.member_epoch,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
    )
    full = epoch == 0 or (
        request.rebalance_timeout_ms != -1
        and (request.subscribed_topic_names is not None or new_regex is not None)
        and owned is not None
    )
    if (full or _partition_sets_differ(old_assigned, member.assigned)
            or stale or _asked_to_revoke_unheard(member, owned)):
        response.assignment = assignment_of(member)
    return response


def member_value_after(member: ConsumerGroupMember, request: ConsumerGroupHeartbeatRequest,
                       names: frozenset[str], regex: str | None,
                       instance_id: str | None) -> MemberValue:
    """The member record ``member`` has once ``request`` is applied (what
    :meth:`~translation.state.CoordinatorState.update_member` makes of it), subscribing to
    ``names`` and ``regex``: sized before anything is applied."""
    rebalance = request.rebalance_timeout_ms
    return replace(
        member_value(member),
        instance_id=instance_id,
        rack_id=member.rack_id if request.rack_id is None else request.rack_id,
        rebalance_timeout_ms=member.rebalance_timeout_ms if rebalance == -1 else rebalance,
        client_id=request.client_id,
        client_host=request.client_host,
        server_assignor=request.server_assignor or member.server_assignor,
        subscribed_topic_names=tuple(sorted(names)),
        subscribed_topic_regex=regex,
    )


def _asked_to_revoke_unheard(member: ConsumerGroupMember, owned: OwnedPartitions | None) -> bool:
    """Whether the member is asked to revoke partitions it has not reported as released.

    Kafka sends the assignment only when it changes or on a full request, and relies on
    clients sending a full request after an error; librdkafka does not always. A member told
    to revoke whose answer was lost (a coordinator failed over after writing it, a sidecar
    between the member and the coordinator died) would then wait for an assignment that never
    comes while the coordinator waits for its revocation. So while a revocation is pending the
    assignment is sent with every answer (as it is while the member answers with an older
    epoch); an assignment the member already has changes nothing on its side."""
    if member.state is not MemberState.UNREVOKED_PARTITIONS:
        return False
    if owned is None:
        return True
    revoking = member.pending_revocation
    return any(p in revoking.get(topic_id, ()) for topic_id, ps in owned for p in ps)


def static_replacement(
    old: ConsumerGroupMember,
    member_id: str,
    *,
    protocol: MemberProtocol = MemberProtocol.CONSUMER,
    state: MemberState | None = None,
) -> ConsumerGroupMember:
    """A static member rejoining under a new member id takes over the old one's assignment
    (both protocols use this). It starts at member epoch 0 and holds its assigned partitions
    "from epoch 0" for relaxed commit fencing."""
    new = ConsumerGroupMember(
        member_id,
        instance_id=old.instance_id,
        rack_id=old.rack_id,
        client_id=old.client_id,
        client_host=old.client_host,
        subscribed_topic_names=old.subscribed_topic_names,
        subscribed_topic_regex=old.subscribed_topic_regex,
        server_assignor=old.server_assignor,
        rebalance_timeout_ms=old.rebalance_timeout_ms,
        member_epoch=0,
        previous_member_epoch=0,
        state=old.state if state is None else state,
        protocol=protocol,
    )
    new.assigned = {t: dict.fromkeys(ps, 0) for t, ps in old.assigned.items()}
    return new


def handle_leave(
    engine: CoordinatorState,
    request: ConsumerGroupHeartbeatRequest,
    now_ms: int,
    effects: list[Effect],
) -> ConsumerGroupHeartbeatResponse:
    group_id = request.group_id
    group = engine.groups.get(group_id)
    if group is None:
        raise GroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.")
    member_id = request.member_id
    member = group.find_member(member_id, request.instance_id)
    if request.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        engine.static_leave(group, member, now_ms, effects)
    else:
        engine.remove_member(group, member, "member left", now_ms, effects, left=True)
        effects.append(MemberLeft(group_id, member_id, static=False))
    return ConsumerGroupHeartbeatResponse(member_id=member_id, member_epoch=request.member_epoch)
