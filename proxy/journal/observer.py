"""From what the engine did to journal events (pure: no I/O, no clock, no trio).

:class:`JournalObserver` rides on a :class:`~translation.coordinator.GroupCoordinator` as an
:class:`~translation.state.EngineListener` and reads the effects each engine call returns::

    observer = JournalObserver(source="10.0.0.7:9092", software=directory.lookup)
    observer.attach(engine)
    response, effects = engine.heartbeat(request, now_ms)
    journal.record_all(observer.observe(effects, wall_ms()))

Call :meth:`JournalObserver.observe` once after every engine call that returns effects (each
call's own list, before the next call), with the wall clock in ms: every event of that call
gets that time. The listener calls are noted as they come, at their place among the call's
effects, so events keep the order in which the engine made the changes.

Cost: a steady heartbeat returns a timer re-arm and nothing else; the observer looks at that
one effect and at its group's state (a few comparisons) and makes no event. Work proportional
to a member's partitions is done only when its assignment moved, and to a group's size only
for :meth:`JournalObserver.snapshot`.

Besides the engine's own changes the wiring reports groups it leaves to the broker
(:meth:`JournalObserver.passed_through`) and asks for periodic snapshots.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from translation.coordinator import GroupCoordinator
from translation.effects import (
    Effect,
    GroupCreated,
    GroupDeleted,
    GroupEmptied,
    GroupEpochBumped,
    GroupExpired,
    GroupHandedBack,
    GroupReleased,
    MemberFenced,
    MemberJoined,
    MemberLeft,
    MemberReplaced,
    TargetAssignmentComputed,
    TargetAssignmentFailed,
    TimerArmed,
    TimerCancelled,
)
from translation.group import ConsumerGroup, GroupState
from translation.member import (
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroupMember,
    PartitionEpochs,
)
from translation.timers import TimerKey
from translation.topics import TopicId, TopicsImage

from .schema import Event, EventType, Partitions

_ENDINGS = frozenset({EventType.GROUP_EXPIRED, EventType.GROUP_DELETED,
                      EventType.GROUP_HANDED_BACK, EventType.GROUP_DROPPED})

SoftwareLookup = Callable[[str, str], "tuple[str, str] | None"]
"""``(client_host, client_id) -> (software name, software version)`` or None when unknown
(KIP-511: what the client sent in ApiVersions v3+)."""

SNAPSHOT_MEMBERS_PER_EVENT = 200
"""A snapshot of a bigger group is split into parts of this many members, so one record stays
well under the broker's default maximum record batch size (1 MiB)."""

PASSED_THROUGH_REPEAT_MS = 3_600_000
PASSED_THROUGH_REMEMBERED = 10_000
DELETED_TOPICS_REMEMBERED = 100_000


class JournalObserver:
    """Turns one engine's changes into :class:`~proxy.journal.schema.Event` values."""

    def __init__(self, *, source: str, software: SoftwareLookup | None = None,
                 passed_through_repeat_ms: int = PASSED_THROUGH_REPEAT_MS) -> None:
        self.source = source
        self.software = software
        self.passed_through_repeat_ms = passed_through_repeat_ms
        self._engine: GroupCoordinator | None = None
        self._seq = 0
        self._noted: list[tuple[int, EventType, str, dict[str, Any]]] = []
        """Events made by listener calls during the current engine call, each with the
        number of effects there were then (its place among them)."""
        self._removed: dict[tuple[str, str], ConsumerGroupMember] = {}
        self._replaced: dict[tuple[str, str], ConsumerGroupMember] = {}
        self._dropped: dict[str, ConsumerGroup] = {}
        self._before: dict[tuple[str, str], tuple[PartitionEpochs, PartitionEpochs]] = {}
        """A member's partitions before its first assignment move in the current call."""
        self._ended: list[tuple[EventType, str, dict[str, Any]]] = []
        """Events of groups forgotten in the current call: they come last (a member's leave
        that caused a hand-back is told before it)."""
        self._touched: dict[str, None] = {}
        """Groups the current call changed (in order, so events come out the same way)."""
        self._states: dict[str, tuple[GroupState, int, int]] = {}
        """Last reported (state, group epoch, assignment epoch) per group."""
        self._passed: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._image: TopicsImage | None = None
        self._deleted_topics: dict[TopicId, str] = {}

    def attach(self, engine: GroupCoordinator) -> None:
        """Listen to ``engine`` (once, before its first call)."""
        self._engine = engine
        self._image = engine.image
        engine.listeners.append(self)

    @property
    def engine(self) -> GroupCoordinator:
        if self._engine is None:
            raise RuntimeError("JournalObserver.attach(engine) was not called")
        return self._engine

    # ------------------------------------------------------------------ after an engine call

    def observe(self, effects: Sequence[Effect], now_wall_ms: int) -> list[Event]:
        """The events of one engine call: its effects and what the listener calls noted."""
        out: list[Event] = []
        engine = self.engine
        if engine.image is not self._image:
            self._note_image()
        if not self._noted and len(effects) == 1 and type(effects[0]) is TimerArmed:
            # The steady heartbeat: one timer re-armed, the group as it was.
            group_id = effects[0].key.group_id
            group = engine.groups.get(group_id)
            last = self._states.get(group_id)
            if group is not None and last is not None and last[1] == group.group_epoch \
                    and last[2] == group.target.epoch and last[0] is group.state:
                return out
            self._check_state(group_id, now_wall_ms, out)
            return out
        noted = self._noted
        n = 0
        for index, effect in enumerate(effects):
            while n < len(noted) and noted[n][0] <= index:
                self._emit_noted(noted[n], now_wall_ms, out)
                n += 1
            self._effect(effect, effects, index, now_wall_ms, out)
        for item in noted[n:]:
            self._emit_noted(item, now_wall_ms, out)
        for event_type, group_id, fields in self._ended:
            out.append(self._event(event_type, group_id, now_wall_ms, fields))
        for group_id in self._touched:
            self._check_state(group_id, now_wall_ms, out)
        self._noted = []
        self._ended = []
        self._removed.clear()
        self._replaced.clear()
        self._dropped.clear()
        self._before.clear()
        self._touched.clear()
        return out

    def _emit_noted(self, item: tuple[int, EventType, str, dict[str, Any]], now: int,
                    out: list[Event]) -> None:
        _, event_type, group_id, fields = item
        out.append(self._event(event_type, group_id, now, fields))
        self._touched[group_id] = None

    def _event(self, event_type: EventType, group_id: str, now: int,
               fields: Mapping[str, Any]) -> Event:
        self._seq += 1
        return Event(event_type, group_id, now, self.source, self._seq, fields)

    def _effect(self, effect: Effect, effects: Sequence[Effect], index: int, now: int,
                out: list[Event]) -> None:
        if isinstance(effect, TimerArmed | TimerCancelled):
            self._touched[effect.key.group_id] = None
            return
        group_id: str | None = getattr(effect, "group_id", None)
        if group_id is None:
            return
        self._touched[group_id] = None
        fields: dict[str, Any]
        if isinstance(effect, GroupEpochBumped):
            event_type = EventType.EPOCH_BUMPED
            fields = {"group_epoch": effect.group_epoch, "reason": effect.reason}
        elif isinstance(effect, MemberJoined):
            event_type = EventType.MEMBER_JOINED
            fields = self._joined(group_id, effect.member_id)
        elif isinstance(effect, MemberLeft | MemberFenced):
            member = self._removed.get((group_id, effect.member_id))
            if member is None:  # a static leave: the member stays, holding its partitions
                member = self._member(group_id, effect.member_id)
                if member is None:
                    return
                released: Partitions = {}
            else:
                released = self._names(member.assigned, member.pending_revocation)
            fields = {"member": member.member_id, "instance": member.instance_id,
                      "protocol": member.protocol.value, "member_epoch": member.member_epoch,
                      "revoked": self._names(member.assigned), "released": released}
            if isinstance(effect, MemberLeft):
                event_type = EventType.MEMBER_LEFT
                fields["static"] = effect.static
            else:
                event_type = EventType.MEMBER_FENCED
                fields["reason"] = effect.reason
        elif isinstance(effect, MemberReplaced):
            event_type = EventType.MEMBER_REPLACED
            fields = self._joined(group_id, effect.new_member_id, identity_only=True)
            old = self._replaced.get((group_id, effect.old_member_id))
            fields["replaced"] = effect.old_member_id
            if old is not None:
                fields["replaced_protocol"] = old.protocol.value
                fields["released"] = self._names(old.pending_revocation)
        elif isinstance(effect, TargetAssignmentComputed):
            event_type = EventType.TARGET_COMPUTED
            group = self.engine.groups.get(group_id)
            fields = {"assignment_epoch": effect.assignment_epoch, "assignor": effect.assignor,
                      "changed_members": effect.changed_members,
                      "member_count": None if group is None else len(group.members)}
        elif isinstance(effect, TargetAssignmentFailed):
            event_type = EventType.TARGET_FAILED
            fields = {"group_epoch": effect.group_epoch, "assignor": effect.assignor,
                      "reason": effect.message}
        elif isinstance(effect, GroupCreated):
            event_type = EventType.GROUP_CREATED
            epoch = self._epoch_at_creation(group_id, effects, index)
            fields = {"group_epoch": epoch, "converted": epoch > 0}
        elif isinstance(effect, GroupExpired):
            event_type, fields = EventType.GROUP_EXPIRED, {}
        elif isinstance(effect, GroupDeleted):
            event_type, fields = EventType.GROUP_DELETED, {}
        elif isinstance(effect, GroupReleased):
            event_type = EventType.GROUP_RELEASED
            fields = {"reason": effect.reason, "assignor": effect.protocol,
                      "member_count": len(effect.members),
                      "member_ids": sorted(m.member_id for m in effect.members)}
        elif isinstance(effect, GroupHandedBack):
            event_type = EventType.GROUP_HANDED_BACK
            fields = {"reason": effect.reason,
                      "member_ids": [member_id for member_id, _ in effect.members],
                      "revoked": self._held_by_all(self._dropped.get(group_id))}
        elif group_id in self._dropped and type(effect).__name__.startswith("Group") \
                and not isinstance(effect, GroupEmptied):
            # A way of forgetting a group this observer does not know by name.
            event_type = EventType.GROUP_DROPPED
            dropped = self._dropped[group_id]
            fields = {"how": _snake(type(effect).__name__.removeprefix("Group")),
                      "reason": getattr(effect, "reason", None),
                      "member_ids": sorted(dropped.members),
                      "revoked": self._held_by_all(dropped)}
        else:
            return  # GroupEmptied (the group's state says it), JoinCompleted, SyncCompleted
        if event_type in _ENDINGS:
            self._ended.append((event_type, group_id, fields))
        else:
            out.append(self._event(event_type, group_id, now, fields))

    def _epoch_at_creation(self, group_id: str, effects: Sequence[Effect], index: int) -> int:
        for later in effects[index + 1:]:
            if isinstance(later, GroupEpochBumped) and later.group_id == group_id:
                return later.group_epoch - 1
        group = self.engine.groups.get(group_id)
        return 0 if group is None else group.group_epoch

    def _check_state(self, group_id: str, now: int, out: list[Event]) -> None:
        group = self.engine.groups.get(group_id)
        if group is None:
            self._states.pop(group_id, None)
            return
        state = group.state
        current = (state, group.group_epoch, group.target.epoch)
        last = self._states.get(group_id)
        if last == current or (last is not None and last[0] is state
                               and state is not GroupState.STABLE):
            return
        self._states[group_id] = current
        out.append(self._event(EventType.GROUP_STATE, group_id, now, {
            "state": state.value, "group_epoch": current[1], "assignment_epoch": current[2],
            "member_count": len(group.members)}))

    # ------------------------------------------------------------------ engine listener

    def target_updated(self, group: ConsumerGroup, now_ms: int, effects: list[Effect]) -> None:
        """Reported from its effect."""

    def member_removed(self, group: ConsumerGroup, member: ConsumerGroupMember, reason: str,
                       now_ms: int, effects: list[Effect]) -> None:
        self._removed[(group.group_id, member.member_id)] = member

    def member_replaced(self, group: ConsumerGroup, old: ConsumerGroupMember,
                        new: ConsumerGroupMember, effects: list[Effect]) -> None:
        self._replaced[(group.group_id, old.member_id)] = old

    def member_reconciled(self, group: ConsumerGroup, member: ConsumerGroupMember,
                          assigned_before: PartitionEpochs, revoking_before: PartitionEpochs,
                          effects: list[Effect]) -> None:
        key = (group.group_id, member.member_id)
        self._before.setdefault(key, (assigned_before, revoking_before))
        assigned, revoking = member.assigned, member.pending_revocation
        # A static member back from a temporary leave consumes again what it kept.
        consumed_before = ({} if member.previous_member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH
                           else assigned_before)
        self._noted.append((len(effects), EventType.ASSIGNMENT, group.group_id, {
            "member": member.member_id,
            "member_epoch": member.member_epoch,
            "state": member.state.value,
            "assigned": self._diff(assigned, consumed_before),
            "revoked": self._diff(assigned_before, assigned),
            "released": self._diff_held(assigned_before, revoking_before, assigned, revoking),
            "revoking": self._diff(revoking, revoking_before),
        }))

    def group_dropped(self, group: ConsumerGroup, effects: list[Effect]) -> None:
        self._dropped[group.group_id] = group

    def group_changed(self, group: ConsumerGroup, now_ms: int, effects: list[Effect]) -> None:
        """Nothing: the group's state is looked at once the call's effects are read."""

    def group_loaded(self, group: ConsumerGroup, now_ms: int, effects: list[Effect]) -> None:
        """Nothing: a sidecar that loads a group's state writes a snapshot of it right after
        (:meth:`snapshot`), so the journal shows where the new coordinator took over."""

    def timer_fired(self, group: ConsumerGroup, key: TimerKey, now_ms: int,
                    effects: list[Effect]) -> None:
        """Nothing: what a timer did comes back as effects."""

    # ------------------------------------------------------------------ asked by the wiring

    def passed_through(self, group_id: str, reason: str, now_wall_ms: int, *,
                       protocol_type: str | None = None, assignor: str | None = None,
                       client_id: str = "", client_host: str = "") -> list[Event]:
        """The proxy left a request of ``group_id`` to the broker because of ``reason``: one
        event per group and reason within ``passed_through_repeat_ms`` (bounded memory)."""
        last = self._passed.get(group_id)
        if last is not None and last[0] == reason \
                and now_wall_ms - last[1] < self.passed_through_repeat_ms:
            return []
        self._passed[group_id] = (reason, now_wall_ms)
        self._passed.move_to_end(group_id)
        while len(self._passed) > PASSED_THROUGH_REMEMBERED:
            self._passed.popitem(last=False)
        name, version = self._software(client_host, client_id)
        return [self._event(EventType.GROUP_PASSED_THROUGH, group_id, now_wall_ms, {
            "reason": reason, "protocol_type": protocol_type, "assignor": assignor,
            "client_id": client_id or None, "client_host": client_host or None,
            "software_name": name, "software_version": version})]

    def converted(self, group_id: str, generation: int, assignor: str,
                  member_ids: list[str], now_wall_ms: int) -> list[Event]:
        """The broker's classic group moved to the engine online (schema version 2)."""
        return [self._event(EventType.GROUP_CONVERTED, group_id, now_wall_ms, {
            "group_epoch": generation, "assignor": assignor, "member_count": len(member_ids),
            "member_ids": sorted(member_ids)})]

    def conversion_aborted(self, group_id: str, generation: int, reason: str,
                           now_wall_ms: int) -> list[Event]:
        """An online upgrade of the broker's group was refused or failed (version 2)."""
        return [self._event(EventType.CONVERSION_ABORTED, group_id, now_wall_ms, {
            "group_epoch": generation, "reason": reason})]

    def snapshot(self, group_id: str, now_wall_ms: int) -> list[Event]:
        """The group as it is now, every member with its assignment (no event for a group
        the engine does not have)."""
        group = self.engine.groups.get(group_id)
        if group is None:
            return []
        members = [self._member_fields(m) for m in group.members.values()]
        step = SNAPSHOT_MEMBERS_PER_EVENT
        parts = max(1, -(-len(members) // step))
        common = {"state": group.state.value, "group_epoch": group.group_epoch,
                  "assignment_epoch": group.target.epoch, "member_count": len(members)}
        return [self._event(EventType.GROUP_SNAPSHOT, group_id, now_wall_ms, {
            **common, "part": part + 1, "parts": parts,
            "members": members[part * step:(part + 1) * step]}) for part in range(parts)]

    def group_ids(self) -> list[str]:
        return list(self.engine.groups)

    # ------------------------------------------------------------------ helpers

    def _member(self, group_id: str, member_id: str) -> ConsumerGroupMember | None:
        group = self.engine.groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        return member if member is not None else self._removed.get((group_id, member_id))

    def _joined(self, group_id: str, member_id: str, *, identity_only: bool = False
                ) -> dict[str, Any]:
        member = self._member(group_id, member_id)
        if member is None:
            return {"member": member_id}
        fields = self._identity(member)
        held = self._before.get((group_id, member_id), (member.assigned, None))[0]
        fields["assigned"] = self._names(held)
        if identity_only:
            fields["member_epoch"] = member.member_epoch
            return fields
        group = self.engine.groups.get(group_id)
        fields.update({
            "member_epoch": member.member_epoch,
            "group_epoch": None if group is None else group.group_epoch,
            "topics": sorted(member.subscribed_topic_names),
            "regex": member.subscribed_topic_regex,
            "rack": member.rack_id,
            "rebalance_timeout_ms": member.rebalance_timeout_ms,
            "session_timeout_ms": member.session_timeout_ms,
        })
        return fields

    def _identity(self, member: ConsumerGroupMember) -> dict[str, Any]:
        name, version = self._software(member.client_host, member.client_id)
        classic = member.classic
        return {
            "member": member.member_id,
            "instance": member.instance_id,
            "protocol": member.protocol.value,
            "assignor": classic.protocol_name if classic is not None else member.server_assignor,
            "client_id": member.client_id or None,
            "client_host": member.client_host or None,
            "software_name": name,
            "software_version": version,
        }

    def _member_fields(self, member: ConsumerGroupMember) -> dict[str, Any]:
        fields = self._identity(member)
        fields.update({"member_epoch": member.member_epoch, "state": member.state.value,
                       "assigned": self._names(member.assigned),
                       "revoking": self._names(member.pending_revocation)})
        return {k: v for k, v in fields.items() if v is not None and v != {}}

    def _software(self, client_host: str, client_id: str) -> tuple[str | None, str | None]:
        if self.software is None:
            return None, None
        found = self.software(client_host, client_id)
        return (None, None) if found is None else found

    def _names(self, *maps: Mapping[TopicId, Iterable[int]]) -> Partitions:
        merged: dict[TopicId, set[int]] = {}
        for partitions in maps:
            for topic_id, ps in partitions.items():
                merged.setdefault(topic_id, set()).update(ps)
        return {self._topic(t): sorted(ps) for t, ps in merged.items() if ps}

    def _held_by_all(self, group: ConsumerGroup | None) -> Partitions:
        if group is None:
            return {}
        return self._names(*(m.assigned for m in group.members.values()))

    def _topic(self, topic_id: TopicId) -> str:
        """The topic's name; a topic deleted since keeps the name it had (members may still
        hold its partitions, or get them from a target computed before the deletion)."""
        topic = self.engine.image.by_id.get(topic_id)
        if topic is not None:
            return topic.name
        return self._deleted_topics.get(topic_id) or str(topic_id)

    def _note_image(self) -> None:
        """Remember the names of topics gone from the engine's topic image since last time."""
        image = self.engine.image
        old, self._image = self._image, image
        if old is None or old is image:
            return
        gone = {t: m.name for t, m in old.by_id.items() if t not in image.by_id}
        if gone:
            if len(self._deleted_topics) + len(gone) > DELETED_TOPICS_REMEMBERED:
                self._deleted_topics.clear()
            self._deleted_topics.update(gone)

    def _diff(self, new: PartitionEpochs, *old: PartitionEpochs) -> Partitions:
        """Partitions in ``new`` that are in none of ``old``."""
        out: Partitions = {}
        for topic_id, ps in new.items():
            gone = [p for p in ps if not any(p in o.get(topic_id, ()) for o in old)]
            if gone:
                out[self._topic(topic_id)] = sorted(gone)
        return out

    def _diff_held(self, assigned_before: PartitionEpochs, revoking_before: PartitionEpochs,
                   assigned: PartitionEpochs, revoking: PartitionEpochs) -> Partitions:
        """Partitions held (assigned or revoking) before and no longer."""
        out = self._diff(assigned_before, assigned, revoking)
        for topic, ps in self._diff(revoking_before, assigned, revoking).items():
            out[topic] = sorted(set(out.get(topic, [])) | set(ps))
        return out


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
