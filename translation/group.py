"""A KIP-848 consumer group: members, epochs, subscriptions, target and ownership.

The group keeps the indexes the heartbeat needs in O(1): members by id and by static
instance id, how many members subscribe to each topic name / regex / assignor, the resolved
regexes, the *subscription metadata* (partition count of every subscribed topic id, whose
change bumps the group epoch), the target assignment, the partition ownership map and the
set of members not yet reconciled to the target (so the group state is O(1) too).

When the engine keeps durable state, the group also marks which of its records changed
(:mod:`translation.changes`): its methods that write a member mark that member, the engine's
verbs mark the rest (see :mod:`translation.state`).

Group states: EMPTY (no members), ASSIGNING (group epoch > assignment epoch), RECONCILING
(some member not STABLE at the assignment epoch), STABLE, DEAD (deleted).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from translation import regex as regex_mod
from translation.assignors.base import MemberSubscription, SubscriptionType
from translation.changes import GroupChanges
from translation.errors import ErrorCode, GroupError
from translation.held_sessions import HeldSessions
from translation.member import ConsumerGroupMember
from translation.ownership import PartitionOwners
from translation.reconciliation import release_all
from translation.target import TargetAssignment
from translation.timers import TimerKey
from translation.topics import TopicId, TopicsImage


class GroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


def _incr(counter: dict[str, int], key: str) -> None:
    counter[key] = counter.get(key, 0) + 1


def _decr(counter: dict[str, int], key: str) -> None:
    n = counter[key] - 1
    if n:
        counter[key] = n
    else:
        del counter[key]


@dataclass(slots=True)
class DepartureWait:
    """A group's open departure wait (:mod:`translation.departures`)."""

    since_ms: int
    until_ms: int
    """When the target is computed at the latest."""
    departed: list[str] = field(default_factory=list)
    arrived: list[str] = field(default_factory=list)

    @property
    def awaited(self) -> int:
        """Arrivals still awaited."""
        return max(0, len(self.departed) - len(self.arrived))


class ConsumerGroup:
    __slots__ = (
        "_spec_kinds",
        "_spec_missing",
        "_specs",
        "_topic_ids_cache",
        "assignor_counts",
        "changes",
        "dead",
        "departure_wait",
        "empty_since_wall_ms",
        "group_epoch",
        "group_id",
        "held_sessions",
        "journal",
        "last_assignment_ms",
        "members",
        "owners",
        "preferred_assignor",
        "regex_counts",
        "regex_due",
        "regex_rights",
        "resolved_regex",
        "static_members",
        "subscribed_names",
        "subscription_metadata",
        "suspended",
        "target",
        "unreconciled",
    )

    def __init__(self, group_id: str, default_assignor: str) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.members: dict[str, ConsumerGroupMember] = {}
        self.static_members: dict[str, str] = {}
        """instance id -> member id"""
        self.target = TargetAssignment()
        self.owners = PartitionOwners()
        self.subscribed_names: dict[str, int] = {}
        self.regex_counts: dict[str, int] = {}
        self.resolved_regex: dict[str, frozenset[str]] = {}
        self.regex_rights: regex_mod.TopicRights | None = None
        """The rights of the member whose heartbeat last resolved the regexes (the resolutions
        keep only the topics it may describe); None: resolved without (no authorization)."""
        self.regex_due = False
        """A regex matches a topic ``regex_rights`` did not check: the next heartbeat that
        brings rights resolves the regexes again under them."""
        self.subscription_metadata: dict[TopicId, int] = {}
        self.assignor_counts: dict[str, int] = {}
        self.preferred_assignor = default_assignor
        self.unreconciled: set[str] = set()
        self.dead = False
        self.held_sessions = HeldSessions()
        """Members with a request inside the proxy: their sessions do not run
        (:mod:`translation.held_sessions`)."""
        self.suspended: dict[TimerKey, int] | None = None
        """While the coordinator is not active for the group (see
        :meth:`~translation.coordinator.GroupCoordinator.suspend`): the group's timers that
        came due meanwhile, with their payloads; None while active."""
        self.last_assignment_ms: int | None = None
        """When the target was last computed (None: never)."""
        self.departure_wait: DepartureWait | None = None
        """Members departed, the target held back for their replacements
        (:mod:`translation.departures`); None: no wait open. Not part of the group's records."""
        self.journal: dict[str, ConsumerGroup] | None = None
        """The engine's groups with changes not yet drained (None: no durable state kept)."""
        self.changes: GroupChanges | None = None
        """What changed since the last drain; None: nothing (or no durable state kept)."""
        self.empty_since_wall_ms: int | None = None
        """Wall-clock time the group became empty, as of the last drain of its records."""
        self._topic_ids_cache: dict[tuple[frozenset[str], str | None], frozenset[TopicId]] = {}
        self._specs: dict[str, MemberSubscription] = {}
        """Assignor input per member, kept between computations; stale entries are dropped."""
        self._spec_missing: set[str] = set()
        self._spec_kinds: dict[frozenset[TopicId], int] = {}
        """How many members subscribe to each distinct topic-id set (homogeneous iff one)."""

    # -- state ---------------------------------------------------------------------------

    @property
    def state(self) -> GroupState:
        if self.dead:
            return GroupState.DEAD
        if not self.members:
            return GroupState.EMPTY
        if self.group_epoch > self.target.epoch:
            return GroupState.ASSIGNING
        if self.unreconciled:
            return GroupState.RECONCILING
        return GroupState.STABLE

    @property
    def assignment_epoch(self) -> int:
        return self.target.epoch

    def track(self, member: ConsumerGroupMember) -> None:
        """Update the not-yet-reconciled index after ``member`` changed."""
        if member.is_reconciled_to(self.target.epoch):
            self.unreconciled.discard(member.member_id)
        else:
            self.unreconciled.add(member.member_id)

    def track_all(self) -> None:
        epoch = self.target.epoch
        self.unreconciled = {
            mid for mid, m in self.members.items() if not m.is_reconciled_to(epoch)
        }

    def new_target_installed(self) -> None:
        """A target with a new (higher) epoch: no member is reconciled to it yet."""
        self.unreconciled = set(self.members)

    def static_member(self, instance_id: str) -> ConsumerGroupMember | None:
        member_id = self.static_members.get(instance_id)
        return None if member_id is None else self.members.get(member_id)

    def find_member(self, member_id: str, instance_id: str | None) -> ConsumerGroupMember:
        """The member a request names, by its instance id when it has one (both protocols):
        UNKNOWN_MEMBER_ID when there is none, FENCED_INSTANCE_ID when the instance id belongs
        to another member id."""
        if instance_id is None:
            member = self.members.get(member_id)
            if member is None:
                raise GroupError(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"Member {member_id} is not a member of group {self.group_id}.",
                )
            return member
        member = self.static_member(instance_id)
        if member is None:
            raise GroupError(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
        if member.member_id != member_id:
            raise GroupError(
                ErrorCode.FENCED_INSTANCE_ID,
                f"Static member {member_id} with instance id {instance_id} was fenced by member "
                f"{member.member_id}.",
            )
        return member

    def owner_epoch(self, topic_id: TopicId, partition: int) -> int:
        """Epoch of the member holding the partition, or -1 when it is free (Kafka's map)."""
        owner = self.owners.owner(topic_id, partition)
        if owner is None:
            return -1
        return self.members[owner].member_epoch

    # -- changes since the last drain (durable state) -------------------------------------

    def _changed(self) -> GroupChanges | None:
        journal = self.journal
        if journal is None:
            return None
        changes = self.changes
        if changes is None:
            changes = self.changes = GroupChanges()
            journal[self.group_id] = self
        return changes

    def mark_group(self) -> None:
        """The group record changed (epochs, preferred assignor, subscription metadata)."""
        changes = self._changed()
        if changes is not None:
            changes.group = True

    def mark_member(self, member_id: str) -> None:
        """The member's member record changed (or the member left)."""
        changes = self._changed()
        if changes is not None:
            changes.members.add(member_id)

    def mark_assignment(self, member_id: str) -> None:
        """The member's assignment record changed (or the member left)."""
        changes = self._changed()
        if changes is not None:
            changes.assignments.add(member_id)

    # -- membership ----------------------------------------------------------------------

    def add_member(self, member: ConsumerGroupMember, image: TopicsImage) -> None:
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id
        for name in member.subscribed_topic_names:
            _incr(self.subscribed_names, name)
        regex = member.subscribed_topic_regex
        if regex:
            _incr(self.regex_counts, regex)
            if regex not in self.resolved_regex:
                self.resolved_regex[regex] = self._resolve(regex, image)
        if member.server_assignor is not None:
            _incr(self.assignor_counts, member.server_assignor)
        for topic_id, ps in member.assigned.items():
            self.owners.add(member.member_id, topic_id, ps)
        for topic_id, ps in member.pending_revocation.items():
            self.owners.add(member.member_id, topic_id, ps)
        self._spec_missing.add(member.member_id)
        self.track(member)
        self.mark_member(member.member_id)
        self.mark_assignment(member.member_id)

    def remove_member(self, member_id: str) -> ConsumerGroupMember:
        member = self.members.pop(member_id)
        self.held_sessions.drop(member_id)
        if (
            member.instance_id is not None
            and self.static_members.get(member.instance_id) == member_id
        ):
            del self.static_members[member.instance_id]
        for name in member.subscribed_topic_names:
            _decr(self.subscribed_names, name)
        if member.subscribed_topic_regex:
            _decr(self.regex_counts, member.subscribed_topic_regex)
            if member.subscribed_topic_regex not in self.regex_counts:
                self.resolved_regex.pop(member.subscribed_topic_regex, None)
                self._regexes_gone()
        if member.server_assignor is not None:
            _decr(self.assignor_counts, member.server_assignor)
        release_all(member, self.owners)
        self.invalidate_spec(member_id)
        self._spec_missing.discard(member_id)
        self.unreconciled.discard(member_id)
        self.target.members.pop(member_id, None)
        self.mark_member(member_id)
        self.mark_assignment(member_id)
        return member

    def update_subscription(
        self,
        member: ConsumerGroupMember,
        names: frozenset[str],
        regex: str | None,
        image: TopicsImage,
    ) -> None:
        """Change a member's subscription, keeping counters and regex resolutions in step."""
        for name in member.subscribed_topic_names - names:
            _decr(self.subscribed_names, name)
        for name in names - member.subscribed_topic_names:
            _incr(self.subscribed_names, name)
        old_regex = member.subscribed_topic_regex
        if old_regex != regex:
            if old_regex:
                _decr(self.regex_counts, old_regex)
                if old_regex not in self.regex_counts:
                    self.resolved_regex.pop(old_regex, None)
            if regex:
                _incr(self.regex_counts, regex)
                if regex not in self.resolved_regex:
                    self.resolved_regex[regex] = self._resolve(regex, image)
            self._regexes_gone()
        member.subscribed_topic_names = names
        member.subscribed_topic_regex = regex
        self.invalidate_spec(member.member_id)
        self.mark_member(member.member_id)

    def adopt_instance_id(self, member: ConsumerGroupMember, instance_id: str) -> None:
        """A dynamic member rejoining with an instance id becomes static."""
        member.instance_id = instance_id
        self.static_members[instance_id] = member.member_id
        self.mark_member(member.member_id)

    def update_assignor(self, member: ConsumerGroupMember, assignor: str) -> None:
        if member.server_assignor is not None:
            _decr(self.assignor_counts, member.server_assignor)
        _incr(self.assignor_counts, assignor)
        member.server_assignor = assignor
        self.mark_member(member.member_id)

    def compute_preferred_assignor(self, configured: Sequence[str]) -> str:
        """Most common server assignor among members; ties and none go by configured order."""
        if not self.assignor_counts:
            return configured[0]
        best = max(self.assignor_counts.values())
        for name in configured:
            if self.assignor_counts.get(name) == best:
                return name
        return configured[0]

    def restore(self, subscription_metadata: dict[TopicId, int], preferred_assignor: str,
                empty_since_wall_ms: int | None) -> None:
        """What a group rebuilt from its records (:mod:`translation.durable`) takes as stored
        rather than recomputes: the subscription metadata its target was computed from and its
        preferred assignor (recomputing either could bump the epoch for nothing), and when it
        became empty."""
        self.subscription_metadata = subscription_metadata
        self.preferred_assignor = preferred_assignor
        self.empty_since_wall_ms = empty_since_wall_ms
        self._topic_ids_cache.clear()
        self._specs.clear()
        self._spec_kinds.clear()
        self._spec_missing = set(self.members)

    # -- subscription metadata -----------------------------------------------------------

    def _resolve(self, pattern: str, image: TopicsImage) -> frozenset[str]:
        """``pattern``'s matches in ``image``: those ``regex_rights`` allow, and of those they
        did not check (created since, or matched by a regex the rights were not asked for)
        the ones the resolution already held, until rights that checked them come."""
        matches = regex_mod.resolve(pattern, image)
        rights = self.regex_rights
        if rights is None:
            return matches
        unchecked = matches - rights.checked
        if not unchecked:
            return matches & rights.allowed
        self.regex_due = True
        return (matches & rights.allowed) | (unchecked & self.resolved_regex.get(pattern,
                                                                                  frozenset()))

    def _regexes_gone(self) -> None:
        """No member subscribes to a regex any more: forget the rights they were resolved
        under (a later regex is resolved under the rights of the member that brings it)."""
        if not self.regex_counts:
            self.regex_rights = None
            self.regex_due = False

    def regex_rights_due(self) -> bool:
        """Whether a heartbeat bringing its member's rights resolves the group's regexes again
        under them: some regex was resolved without rights, or matches a topic not checked."""
        return bool(self.regex_counts) and (self.regex_rights is None or self.regex_due)

    def resolve_regexes_under(self, rights: regex_mod.TopicRights | None,
                              image: TopicsImage) -> bool:
        """Resolve every regex again, keeping only what ``rights`` (a member's) allow, as
        Kafka resolves a group's regexes under the rights of the member whose heartbeat
        triggered it (None: over every topic); returns whether any resolution changed."""
        self.regex_rights = rights
        return self.resolve_regexes(image)

    def resolve_regexes(self, image: TopicsImage) -> bool:
        """Re-resolve every regex against ``image`` (under ``regex_rights``, and noting
        whether a match was not checked under them); returns whether any resolution
        changed."""
        changed = False
        self.regex_due = False
        for pattern in self.regex_counts:
            resolved = self._resolve(pattern, image)
            if self.resolved_regex.get(pattern) != resolved:
                self.resolved_regex[pattern] = resolved
                changed = True
        if changed:
            self._topic_ids_cache.clear()
            self._specs.clear()
            self._spec_kinds.clear()
            self._spec_missing = set(self.members)
        return changed

    def compute_subscription_metadata(self, image: TopicsImage) -> dict[TopicId, int]:
        names: set[str] = set(self.subscribed_names)
        for resolved in self.resolved_regex.values():
            names.update(resolved)
        metadata: dict[TopicId, int] = {}
        by_name = image.by_name
        for name in names:
            topic = by_name.get(name)
            if topic is not None:
                metadata[topic.topic_id] = topic.partitions
        return metadata

    def refresh_subscription_metadata(self, image: TopicsImage) -> bool:
        """Recompute the subscription metadata; returns whether it changed."""
        metadata = self.compute_subscription_metadata(image)
        if metadata == self.subscription_metadata:
            return False
        self.subscription_metadata = metadata
        self.mark_group()
        self._topic_ids_cache.clear()
        self._specs.clear()
        self._spec_kinds.clear()
        self._spec_missing = set(self.members)
        return True

    def member_topic_ids(
        self, member: ConsumerGroupMember, image: TopicsImage
    ) -> frozenset[TopicId]:
        """Topic ids a member subscribes to (names and resolved regex), existing ones only."""
        key = (member.subscribed_topic_names, member.subscribed_topic_regex)
        ids = self._topic_ids_cache.get(key)
        if ids is None:
            names: Iterable[str] = member.subscribed_topic_names
            if member.subscribed_topic_regex:
                resolved = self.resolved_regex.get(member.subscribed_topic_regex, frozenset())
                names = set(names) | resolved
            by_name = image.by_name
            ids = frozenset(by_name[n].topic_id for n in names if n in by_name)
            self._topic_ids_cache[key] = ids
        return ids

    # -- assignor input --------------------------------------------------------------------

    def invalidate_spec(self, member_id: str) -> None:
        """Forget a member's assignor input (subscription or target changed)."""
        spec = self._specs.pop(member_id, None)
        if spec is not None:
            kind = spec.subscribed_topic_ids
            n = self._spec_kinds[kind] - 1
            if n:
                self._spec_kinds[kind] = n
            else:
                del self._spec_kinds[kind]
        if member_id in self.members:
            self._spec_missing.add(member_id)

    def invalidate_specs(self, member_ids: Iterable[str]) -> None:
        for member_id in member_ids:
            self.invalidate_spec(member_id)

    def build_specs(
        self, image: TopicsImage
    ) -> tuple[dict[str, MemberSubscription], SubscriptionType]:
        """The assignor input for every member; only members that changed are rebuilt."""
        specs = self._specs
        kinds = self._spec_kinds
        for member_id in self._spec_missing:
            member = self.members[member_id]
            spec = MemberSubscription(
                member_id=member_id,
                instance_id=member.instance_id,
                rack_id=member.rack_id,
                subscribed_topic_ids=self.member_topic_ids(member, image),
                assigned_partitions=self.target.of(member_id),
            )
            specs[member_id] = spec
            kinds[spec.subscribed_topic_ids] = kinds.get(spec.subscribed_topic_ids, 0) + 1
        self._spec_missing = set()
        kind = SubscriptionType.HOMOGENEOUS if len(kinds) <= 1 else SubscriptionType.HETEROGENEOUS
        return dict(specs), kind

    def current_assignments(self) -> Mapping[str, ConsumerGroupMember]:
        return self.members
