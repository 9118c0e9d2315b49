"""The invariants the simulator checks, usable on their own (and testable with broken input).

* Exclusive ownership, as the *clients* believe it: no partition is owned by two live
  clients at once (:class:`OwnershipTracker`, checked on every acquisition).
* Epochs never go backwards: group epoch and assignment epoch of a group, each member's
  epoch while it stays in the group, each client's epoch between rejoins; and
  assignment epoch <= group epoch, partition assignment epoch <= member epoch <= assignment
  epoch (:class:`EpochMonitor`, :func:`check_group_structure`).
* The coordinator's ownership map matches its members' assigned and revoking partitions.
* Offset commits: a commit from a member whose partition has moved on is rejected; a commit
  from the current owner under the relaxed rule is accepted (checked by the simulator with
  :func:`check_commit_verdict`).
* At quiescence, every subscribed partition is owned by exactly one member and the group is
  STABLE (:func:`check_quiescent`).
* A group loaded from its records is the group that wrote them: epochs, members, assignments
  with their epochs, target, and every derived index (:func:`group_differences`), except the
  requests it held, which are not state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from translation.errors import ErrorCode
from translation.group import ConsumerGroup, GroupState
from translation.member import ConsumerGroupMember
from translation.topics import TopicId, TopicsImage

TP = tuple[TopicId, int]


class InvariantViolation(AssertionError):
    """A protocol invariant does not hold."""


def _fmt_tp(tp: TP) -> str:
    return f"{str(tp[0])[:8]}-{tp[1]}"


class OwnershipTracker:
    """Partition -> client that believes it owns it; a second owner is a violation."""

    __slots__ = ("owners",)

    def __init__(self) -> None:
        self.owners: dict[TP, str] = {}

    def acquire(self, client: str, tp: TP) -> None:
        holder = self.owners.get(tp)
        if holder is not None and holder != client:
            raise InvariantViolation(
                f"partition {_fmt_tp(tp)} owned by {holder} and {client} at the same time"
            )
        self.owners[tp] = client

    def release(self, client: str, tp: TP) -> None:
        if self.owners.get(tp) == client:
            del self.owners[tp]


def check_exclusive_ownership(beliefs: Mapping[str, Iterable[TP]]) -> None:
    """Raise if two clients believe they own the same partition."""
    tracker = OwnershipTracker()
    for client in sorted(beliefs):
        for tp in beliefs[client]:
            tracker.acquire(client, tp)


class EpochMonitor:
    """Remembers the highest epochs seen and raises when one goes backwards."""

    __slots__ = ("assignment_epoch", "group_epoch", "member_epochs")

    def __init__(self) -> None:
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.member_epochs: dict[str, int] = {}

    def observe_group(self, group: ConsumerGroup) -> None:
        if group.group_epoch < self.group_epoch:
            raise InvariantViolation(
                f"group epoch went backwards: {self.group_epoch} -> {group.group_epoch}"
            )
        if group.target.epoch < self.assignment_epoch:
            raise InvariantViolation(
                f"assignment epoch went backwards: {self.assignment_epoch} -> {group.target.epoch}"
            )
        if group.target.epoch > group.group_epoch:
            raise InvariantViolation(
                f"assignment epoch {group.target.epoch} ahead of group epoch {group.group_epoch}"
            )
        self.group_epoch = group.group_epoch
        self.assignment_epoch = group.target.epoch

    def observe_member(self, member_id: str, epoch: int) -> None:
        if epoch < 0:
            return
        last = self.member_epochs.get(member_id, 0)
        if epoch < last:
            raise InvariantViolation(f"member {member_id} epoch went backwards: {last} -> {epoch}")
        self.member_epochs[member_id] = epoch

    def forget_member(self, member_id: str) -> None:
        self.member_epochs.pop(member_id, None)


def check_group_structure(group: ConsumerGroup) -> None:
    """Full consistency of one group (O(members x partitions); used periodically)."""
    held: dict[TP, str] = {}
    for member in group.members.values():
        if member.member_epoch > group.target.epoch:
            raise InvariantViolation(
                f"member {member.member_id} epoch {member.member_epoch} ahead of the "
                f"assignment epoch {group.target.epoch}"
            )
        for source in (member.assigned, member.pending_revocation):
            for topic_id, ps in source.items():
                for p, assignment_epoch in ps.items():
                    tp = (topic_id, p)
                    other = held.get(tp)
                    if other is not None:
                        raise InvariantViolation(
                            f"coordinator gives {_fmt_tp(tp)} to {other} and {member.member_id}"
                        )
                    held[tp] = member.member_id
                    if member.member_epoch >= 0 and assignment_epoch > member.member_epoch:
                        raise InvariantViolation(
                            f"{member.member_id} holds {_fmt_tp(tp)} from epoch "
                            f"{assignment_epoch} > member epoch {member.member_epoch}"
                        )
    owners = {(t, p): m for t, p, m in group.owners.items()}
    if owners != held:
        raise InvariantViolation("coordinator ownership map differs from member assignments")
    expected = {
        m for m, mem in group.members.items() if not mem.is_reconciled_to(group.target.epoch)
    }
    if expected != group.unreconciled:
        raise InvariantViolation("group's unreconciled-members index is stale")


def check_commit_verdict(code: ErrorCode, *, owner: bool, detail: str) -> None:
    if owner and code is not ErrorCode.NONE:
        raise InvariantViolation(
            f"commit from the current owner rejected with {code.name}: {detail}"
        )
    if not owner and code is ErrorCode.NONE:
        raise InvariantViolation(f"zombie commit accepted: {detail}")


def subscribed_partitions(
    subscriptions: Iterable[tuple[frozenset[str], str | None]], image: TopicsImage
) -> set[TP]:
    from translation.regex import resolve

    names: set[str] = set()
    for topics, regex in subscriptions:
        names.update(topics)
        if regex:
            names.update(resolve(regex, image))
    out: set[TP] = set()
    for name in names:
        meta = image.by_name.get(name)
        if meta is not None:
            out.update((meta.topic_id, p) for p in range(meta.partitions))
    return out


def check_quiescent(
    group: ConsumerGroup | None,
    beliefs: Mapping[str, tuple[str, int, Iterable[TP]]],
    subscriptions: Iterable[tuple[frozenset[str], str | None]],
    image: TopicsImage,
) -> None:
    """``beliefs``: client name -> (member id, client epoch, owned partitions)."""
    if not beliefs:
        if group is not None and group.members:
            raise InvariantViolation(
                f"members left in a group without clients: {list(group.members)}"
            )
        return
    if group is None:
        raise InvariantViolation("live clients but no group")
    if group.state is not GroupState.STABLE:
        raise InvariantViolation(f"group is {group.state.name}, not STABLE, at quiescence")
    owned_by: dict[TP, str] = {}
    for name, (member_id, epoch, owned) in beliefs.items():
        member = group.members.get(member_id)
        if member is None:
            raise InvariantViolation(f"client {name} ({member_id}) is not a member at quiescence")
        server = {(t, p) for t, ps in member.assigned.items() for p in ps}
        mine = set(owned)
        if server != mine:
            raise InvariantViolation(
                f"client {name} owns {sorted(map(_fmt_tp, mine))} but the coordinator says "
                f"{sorted(map(_fmt_tp, server))}"
            )
        # A classic client knows the generation it was given, which stays behind the member
        # epoch after a quiet advance; the group being STABLE covers the member epoch.
        known = member.member_epoch if member.classic is None else member.classic.generation
        if epoch != known:
            raise InvariantViolation(
                f"client {name} at epoch {epoch}, coordinator expects {known} "
                f"(member epoch {member.member_epoch})"
            )
        for tp in mine:
            if tp in owned_by:
                raise InvariantViolation(f"{_fmt_tp(tp)} owned by {owned_by[tp]} and {name}")
            owned_by[tp] = name
    if len(group.members) != len(beliefs):
        extra = set(group.members) - {b[0] for b in beliefs.values()}
        raise InvariantViolation(f"coordinator has members without a live client: {sorted(extra)}")
    expected = subscribed_partitions(subscriptions, image)
    missing = expected - set(owned_by)
    if missing:
        raise InvariantViolation(
            f"subscribed partitions owned by nobody at quiescence: {sorted(map(_fmt_tp, missing))}"
        )
    stray = set(owned_by) - expected
    if stray:
        raise InvariantViolation(
            f"partitions owned but not subscribed at quiescence: {sorted(map(_fmt_tp, stray))}"
        )


def _partitions(source: Mapping[TopicId, Mapping[int, int]]) -> dict[TopicId, dict[int, int]]:
    return {t: dict(ps) for t, ps in source.items() if ps}


def _member_facts(member: ConsumerGroupMember) -> dict[str, object]:
    meta = member.classic
    return {
        "instance_id": member.instance_id,
        "rack_id": member.rack_id,
        "client_id": member.client_id,
        "client_host": member.client_host,
        "subscribed_topic_names": member.subscribed_topic_names,
        "subscribed_topic_regex": member.subscribed_topic_regex,
        "server_assignor": member.server_assignor,
        "rebalance_timeout_ms": member.rebalance_timeout_ms,
        "session_timeout_ms": member.session_timeout_ms,
        "protocol": member.protocol,
        "member_epoch": member.member_epoch,
        "previous_member_epoch": member.previous_member_epoch,
        "state": member.state,
        "assigned": _partitions(member.assigned),
        "pending_revocation": _partitions(member.pending_revocation),
        "classic": None if meta is None else (
            meta.session_timeout_ms, meta.protocols, meta.subscription_version, meta.state,
            meta.generation, meta.user_data),
    }


def _group_facts(group: ConsumerGroup) -> dict[str, object]:
    return {
        "group_epoch": group.group_epoch,
        "assignment_epoch": group.target.epoch,
        "target": {
            m: {t: ps for t, ps in a.items() if ps} for m, a in group.target.members.items()},
        "preferred_assignor": group.preferred_assignor,
        "subscription_metadata": group.subscription_metadata,
        "members": set(group.members),
        "owners": sorted((str(t), p, m) for t, p, m in group.owners.items()),
        "static_members": group.static_members,
        "subscribed_names": group.subscribed_names,
        "regex_counts": group.regex_counts,
        "resolved_regex": group.resolved_regex,
        "assignor_counts": group.assignor_counts,
        "unreconciled": group.unreconciled,
        "state": group.state,
    }


def group_differences(loaded: ConsumerGroup, original: ConsumerGroup) -> list[str]:
    """What differs between a group loaded from records and the group that wrote them (empty:
    equivalent). Requests held by the original (a deferred JoinGroup, a held SyncGroup) are
    not state and are not compared."""
    out: list[str] = []
    mine, theirs = _group_facts(loaded), _group_facts(original)
    for name, value in mine.items():
        if value != theirs[name]:
            out.append(f"{name}: loaded {value!r}, original {theirs[name]!r}")
    for member_id in sorted(loaded.members.keys() & original.members.keys()):
        a = _member_facts(loaded.members[member_id])
        b = _member_facts(original.members[member_id])
        for name, value in a.items():
            if value != b[name]:
                out.append(f"member {member_id} {name}: loaded {value!r}, original {b[name]!r}")
    return out


def check_loaded_group(loaded: ConsumerGroup | None, original: ConsumerGroup | None) -> None:
    """Raise unless ``loaded`` is ``original`` rebuilt (both None: no group, fine)."""
    if loaded is None or original is None:
        if loaded is not original:
            raise InvariantViolation(
                f"loaded group {'missing' if loaded is None else 'present'}, original "
                f"{'missing' if original is None else 'present'}")
        return
    differences = group_differences(loaded, original)
    if differences:
        raise InvariantViolation("loaded group differs: " + "; ".join(differences[:8]))
