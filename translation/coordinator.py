"""The group coordinator: the engine's entry point, sans-I/O.

Theory of operation
===================

The coordinator owns every KIP-848 consumer group the proxy serves. Like h11, it is a pure
state machine: the caller hands it a request and the current time (``now_ms``, integer
milliseconds on any monotonic clock) and gets back a response and a list of *effects*. It
never reads a clock, never opens a socket, never sleeps. Everything it does is
deterministic given its inputs, which is what makes the discrete-event simulator in
``translation.simulation`` possible.

Three epochs drive a group (KIP-848 "Rebalance Process"):

* the **group epoch** is bumped whenever the assignor's input changes: a member joins,
  leaves or is fenced, a member changes its subscribed names or regex, a regex resolves to
  different topics, the subscribed topics change (partitions added, topic created, deleted or
  recreated with a new id), or the group's preferred assignor changes;
* the **assignment epoch** is the group epoch the current *target assignment* was computed
  for. Whenever the group epoch is ahead, the next heartbeat of any member recomputes the
  target with the group's assignor (the most common ``server_assignor`` among members,
  else the first configured one), at most once per assignment interval (Kafka 4.2+); bumps
  in between are folded into one computation, so a join storm costs a few computations,
  not one per member;
* each member's **member epoch** is the assignment epoch it has reconciled to. A member moves
  to the new epoch only after it has revoked the partitions it must give up (revocation
  before assignment); partitions it gains are added as soon as their previous owner has
  released them (:mod:`translation.reconciliation`). Member states: STABLE,
  UNREVOKED_PARTITIONS, UNRELEASED_PARTITIONS, UNKNOWN.

The coordinator tracks which member holds every partition (assigned or pending revocation).
That map is the safety net: a partition is never given to a member while another still
holds it, so no two members own a partition at once.

Time enters only through ``now_ms``. Timers (session timeout per member, rebalance timeout
while a member has partitions to revoke, a group's deferred target computation, expiry of an
empty group) are stored in
:class:`~translation.timers.Timers`; the caller may call :meth:`GroupCoordinator.tick` at or
after :meth:`GroupCoordinator.next_deadline`, or arm its own timers from the
:class:`~translation.effects.TimerArmed` effects and call :meth:`GroupCoordinator.fire`.
Timers that have been re-armed or cancelled since are ignored.

The steady heartbeat (a member at the current epoch, nothing changed) does constant work:
a few dict lookups and comparisons, one timer re-arm (a dict update), one response object.
Nothing on that path is proportional to the group size.

Topic metadata comes in through :meth:`GroupCoordinator.update_topics` with a full
:class:`~translation.topics.TopicsImage`; the engine identifies topics by id only.

Offset commits stay in the broker; :meth:`GroupCoordinator.validate_offset_commit` tells the
proxy whether a commit may be forwarded (strict KIP-848 rule or the relaxed per-partition
assignment-epoch rule; plus, unlike Kafka, a partition another member holds is always
rejected, which closes a zombie-commit window the simulator found, see
:mod:`translation.offsets`). :meth:`GroupCoordinator.describe` and
:meth:`GroupCoordinator.list_groups` give ConsumerGroupDescribe / ListGroups views.

Members that speak the classic protocol (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) are members
of the same groups, handled by :class:`translation.classic.coordinator.ClassicGroupCoordinator`,
which rides on this class as an :class:`EngineListener`: it hears about every target
computation and member removal, whoever caused them, to complete held JoinGroups
(:class:`~translation.effects.JoinCompleted`) and to hand a group back to the broker
(:class:`~translation.effects.GroupHandedBack`). A classic member carries its own session
timeout and three more timers (join, sync and sync hold, :class:`~translation.timers.TimerKind`),
which the classic layer arms, cancels and handles itself.

Every write to a group or a member goes through the verbs of
:class:`~translation.state.CoordinatorState` (this class's base), which keep the invariants
that span fields: indexes, timers and their effects, listeners told.

Durable state (``GroupConfig.durable_state``): the verbs also mark which records
(:mod:`translation.records`: a group record, and per member a member and an assignment record)
their writes changed. The driver calls :meth:`GroupCoordinator.drain_records` after every
engine call and writes what it returns to the group state topic; a coordinator taking a group
over reads the group's records back and calls :meth:`GroupCoordinator.load_group`, which
rebuilds it through the same verbs with every deadline re-armed from its own clock, so members
keep their member ids, epochs and partitions across the failover. A response may leave only
once every record drained up to the call that produced it is acknowledged (the simulator
models this pipeline, :mod:`translation.simulation.simulator`); see :mod:`translation.durable`.

Where Kafka and the KIP text differ, the engine follows Kafka (noted where it matters):
a fenced or leaving member's target entry is dropped at once (the KIP's case study still
shows it until the next computation); a member re-sending epoch 0 rejoins in place; the
response carries only assigned partitions (no pending list); v1 clients bring their own
member id (KIP-1082); static members leave temporarily with epoch -2; each partition keeps
the epoch it was assigned at (relaxed commit fencing, Kafka 4.3+). One deliberate widening:
the lost-response rule also accepts the previous member epoch with null owned partitions when
the move from it changed nothing but the epoch (:func:`translation.heartbeat.lost_response`).

Safety also needs the clients' cooperation, which the simulator models explicitly: a member
must give up partitions it is revoking once its rebalance timeout is about to expire, and
must treat its partitions as lost when it has not heard from the coordinator for the shorter
of its session and rebalance timeouts (a lost response may have carried a revocation whose
rebalance timeout is running). Without those rules the coordinator may fence a member and
hand its partitions to another while the first still processes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from translation import describe as describe_mod
from translation import durable, limits
from translation import heartbeat as hb
from translation import offsets as offsets_mod
from translation import regex as regex_mod
from translation.effects import Effect, GroupDeleted, GroupExpired, GroupLost, MemberFenced
from translation.errors import ErrorCode, GroupError
from translation.group import ConsumerGroup
from translation.heartbeat import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse
from translation.member import ConsumerGroupMember
from translation.records import StateRecord
from translation.state import CoordinatorState, EngineListener
from translation.timers import TimerKey, TimerKind
from translation.topics import TopicId, TopicsImage

__all__ = ["EngineListener", "GroupCoordinator"]


class GroupCoordinator(CoordinatorState):
    """All KIP-848 groups of one engine instance: the request and timer entry points over
    :class:`~translation.state.CoordinatorState`, whose verbs make every change. Not
    thread-safe; drive it from one task."""

    # ------------------------------------------------------------------ public API

    def heartbeat(
        self, request: ConsumerGroupHeartbeatRequest, now_ms: int
    ) -> tuple[ConsumerGroupHeartbeatResponse, list[Effect]]:
        """Handle one ConsumerGroupHeartbeat. Errors come back as error responses."""
        effects: list[Effect] = []
        try:
            self.check_heartbeat(request, effects)
            if request.member_epoch < 0:
                response = hb.handle_leave(self, request, now_ms, effects)
            else:
                response = hb.handle_regular(self, request, now_ms, effects)
        except GroupError as err:
            return (
                ConsumerGroupHeartbeatResponse(error_code=int(err.code), error_message=err.message),
                effects,
            )
        self._group_changed(request.group_id, now_ms, effects)
        return response, effects

    def check_heartbeat(self, request: ConsumerGroupHeartbeatRequest,
                        effects: list[Effect] | None = None) -> None:
        """Every check a heartbeat must pass before the engine acts on it (Kafka's request
        validation, then :mod:`translation.limits`, for a new member its state record
        included): raises GroupError; a refusal the driver counts leaves its effect in
        ``effects`` (:class:`~translation.effects.MemberTooLarge`). The proxy runs it before it
        starts anything for the group (taking over the broker's group)."""
        hb.validate(request, self.assignor_names)
        config = self.config
        limits.check_group_id(request.group_id)
        limits.check_instance_id(request.instance_id)
        limits.check_subscription(request.subscribed_topic_names, request.subscribed_topic_regex,
                                  max_topics=config.max_subscription_topics,
                                  max_regex_bytes=config.max_regex_bytes)
        if request.member_epoch == 0 and self.is_new_member(
                request.group_id, request.member_id, request.instance_id):
            self.check_room_for_a_member()
            if config.max_state_record_bytes is not None:
                joining = ConsumerGroupMember(request.member_id, instance_id=request.instance_id)
                limits.check_member_record(
                    config, request.group_id, request.member_id,
                    hb.member_value_after(joining, request,
                                          frozenset(request.subscribed_topic_names or ()),
                                          request.subscribed_topic_regex or None,
                                          request.instance_id),
                    api="consumer-group-heartbeat", effects=[] if effects is None else effects)

    def is_new_member(self, group_id: str, member_id: str | None,
                      instance_id: str | None) -> bool:
        group = self.groups.get(group_id)
        if group is None:
            return True
        if member_id and member_id in group.members:
            return False
        return instance_id is None or instance_id not in group.static_members

    def check_room_for_a_member(self) -> None:
        """COORDINATOR_NOT_AVAILABLE once the engine holds ``max_members`` members."""
        limit = self.config.max_members
        if sum(len(g.members) for g in self.groups.values()) >= limit:
            raise GroupError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                             f"This coordinator serves its maximum of {limit} members.")

    def tick(self, now_ms: int) -> list[Effect]:
        """Fire every timer due at ``now_ms``."""
        effects: list[Effect] = []
        for key, payload in self.timers.pop_due(now_ms):
            self._on_timer(key, payload, now_ms, effects)
            self._group_changed(key.group_id, now_ms, effects)
        return effects

    def fire(self, key: TimerKey, now_ms: int) -> list[Effect]:
        """Fire one timer if it is still armed and due (a driver's own timer went off)."""
        effects: list[Effect] = []
        due, payload = self.timers.take_if_due(key, now_ms)
        if due:
            self._on_timer(key, payload, now_ms, effects)
            self._group_changed(key.group_id, now_ms, effects)
        return effects

    def next_deadline(self) -> int | None:
        return self.timers.next_deadline()

    def update_topics(self, image: TopicsImage, now_ms: int) -> list[Effect]:
        """Install new topic metadata; bumps the epoch of every group whose input changed."""
        effects: list[Effect] = []
        self.image = image
        for group in self.groups.values():
            reasons = []
            if group.regex_counts and group.resolve_regexes(image):
                reasons.append("regex resolution changed")
            if group.refresh_subscription_metadata(image):
                reasons.append("subscribed topic metadata changed")
            if reasons and group.members:
                self.bump_group_epoch(group, "; ".join(reasons), effects)
        return effects

    def regex_topics_to_check(self, group_id: str, regex: str | None) -> frozenset[str] | None:
        """The topics whose DESCRIBE a heartbeat of ``group_id`` subscribing to ``regex`` (None:
        unchanged) should bring rights for (:class:`~translation.regex.TopicRights`): every
        match of the group's regexes and ``regex``, when the heartbeat will resolve them (a
        regex new to the group, one resolved without rights, a match not checked yet); None
        when it will not."""
        group = self.groups.get(group_id)
        if group is None:
            if not regex:
                return None
            patterns = {regex}
        else:
            if not (regex and regex not in group.regex_counts) and not group.regex_rights_due():
                return None  # the steady heartbeat: a lookup and two tests
            patterns = set(group.regex_counts)
            if regex:
                patterns.add(regex)
        image = self.image
        matches: set[str] = set()
        for pattern in patterns:
            try:
                matches |= regex_mod.resolve(pattern, image)
            except GroupError:  # an invalid regex: the heartbeat is refused for it
                continue
        return frozenset(matches)

    def validate_offset_commit(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        partitions: Iterable[tuple[TopicId, int]],
        *,
        instance_id: str | None = None,
        transactional: bool = False,
        api_version: int = 9,
    ) -> ErrorCode:
        """Whether an OffsetCommit / TxnOffsetCommit may be forwarded; NONE when it may.

        ``member_epoch`` is the request's GenerationIdOrMemberEpoch. A rejected partition
        rejects the whole request.
        """
        return offsets_mod.validate_offset_commit(
            self.groups.get(group_id),
            member_id,
            member_epoch,
            partitions,
            instance_id=instance_id,
            transactional=transactional,
            api_version=api_version,
            rule=self.config.offset_commit_rule,
            fence_partitions_held_by_others=self.config.fence_partitions_held_by_others,
        )

    def describe(self, group_ids: Sequence[str]) -> list[describe_mod.DescribedGroup]:
        return [describe_mod.describe_group(self, gid) for gid in group_ids]

    def list_groups(self, states_filter: Sequence[str] = ()) -> list[describe_mod.ListedGroup]:
        return describe_mod.list_groups(self, states_filter)

    def group(self, group_id: str) -> ConsumerGroup | None:
        return self.groups.get(group_id)

    def request_arrived(self, group_id: str, member_id: str, now_ms: int) -> None:
        """A request of ``member_id`` is inside the proxy from ``now_ms`` (being decided, or
        waiting behind one that is): its session does not run until :meth:`request_left`
        (:mod:`translation.held_sessions`). Unknown groups and members are ignored."""
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return
        session = member.session_timeout_ms or self.config.session_timeout_ms
        deadline = self.timers.deadline(TimerKey(TimerKind.SESSION, group_id, member_id))
        remaining = deadline - now_ms if deadline is not None else session
        bound = max(member.rebalance_timeout_ms, session)
        group.held_sessions.arrived(member_id, remaining, now_ms, bound)

    def request_left(self, group_id: str, member_id: str, now_ms: int) -> list[Effect]:
        """A request :meth:`request_arrived` reported was answered (or abandoned); after the
        member's last one, its session runs again from what it had left."""
        effects: list[Effect] = []
        group = self.groups.get(group_id)
        if group is None:
            return effects
        held = group.held_sessions.left(member_id)
        if held is not None and member_id in group.members:
            key = TimerKey(TimerKind.SESSION, group_id, member_id)
            self.arm_timer(key, now_ms + held.remaining_ms, effects)
        return effects

    def suspend(self, group_id: str) -> None:
        """The coordinator is not active for ``group_id`` for now (the proxy's hold on the
        broker's group is interrupted): none of the group's timers fires until
        :meth:`resume`, so nobody is fenced for not reaching a coordinator that is not
        there."""
        group = self.groups.get(group_id)
        if group is not None and group.suspended is None:
            group.suspended = {}

    def resume(self, group_id: str, now_ms: int) -> list[Effect]:
        """Active again: as when Kafka's coordinator loads a group, every member gets a full
        session timeout from ``now_ms``, and each timer that came due while suspended is
        re-armed one session timeout from now (same payload)."""
        effects: list[Effect] = []
        group = self.groups.get(group_id)
        if group is None or group.suspended is None:
            return effects
        deferred, group.suspended = group.suspended, None
        for member in group.members.values():
            self.schedule_session_timeout(group, member, now_ms, effects)
        for key, payload in deferred.items():
            if key.kind is TimerKind.SESSION:
                continue
            owner = group.members.get(key.member_id)
            timeout = (owner.session_timeout_ms if owner is not None else 0) \
                or self.config.session_timeout_ms
            self.arm_timer(key, now_ms + timeout, effects, payload=payload)
        return effects

    def fence_member(self, group_id: str, member_id: str, member_epoch: int, reason: str,
                     now_ms: int) -> tuple[ErrorCode, list[Effect]]:
        """Fence a member as its session timeout would, for ``reason`` (``"pod-local"``: the
        sidecar next to it saw its process go, docs/decisions/0020-pod-local-liveness.md).

        ``member_epoch`` is the epoch (a classic member: the generation) the caller observed:
        the member's current epoch, or its previous one (the observed heartbeat was the one
        whose answer moved it on; the engine accepts that epoch from it too, as a lost
        response). A member that moved on since is not fenced (FENCED_MEMBER_EPOCH), nor a
        static member (its session keeps Kafka's semantics: a restart reclaims its
        partitions), nor one whose request is inside the proxy, nor any member of a suspended
        group (COORDINATOR_NOT_AVAILABLE). UNKNOWN_MEMBER_ID for a member the engine does not
        have. NONE: fenced, with the :class:`MemberFenced` effect carrying ``reason``."""
        effects: list[Effect] = []
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, effects
        if group.suspended is not None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, effects
        if member.instance_id is not None:
            return ErrorCode.FENCED_INSTANCE_ID, effects
        meta = member.classic
        if meta is not None:
            current = {meta.generation if meta.generation >= 0 else member.member_epoch}
        else:  # the observation may be the heartbeat whose answer gave the current epoch
            current = {member.member_epoch, member.previous_member_epoch}
        if member_epoch not in current:
            return ErrorCode.FENCED_MEMBER_EPOCH, effects
        if group.held_sessions.protected_until(member_id, now_ms) is not None:
            return ErrorCode.REBALANCE_IN_PROGRESS, effects
        self.remove_member(group, member, reason.replace("-", " "), now_ms, effects)
        effects.append(MemberFenced(group_id, member_id, reason))
        self._group_changed(group_id, now_ms, effects)
        return ErrorCode.NONE, effects

    def forget(self, group_id: str, reason: str) -> list[Effect]:
        """The group's lock is lost (another coordinator may hold it): forget the group and
        its members at once, whatever state it is in; nothing of it is answered here again,
        and none of its records is drained (its state is the next coordinator's to write)."""
        effects: list[Effect] = []
        group = self.groups.get(group_id)
        if group is not None:
            self.drop_group(group, GroupLost(group_id, reason), effects, tombstones=False)
        return effects

    # ------------------------------------------------------------------ durable state

    def drain_records(self, wall_ms: int) -> list[StateRecord]:
        """The records of everything changed since the last drain, one per key with its
        current value (None: tombstone), grouped by group id; replayed in order (or folded by
        key, as compaction leaves them) they give the engine's state. Call it after every
        engine call that may have changed something (any request, ``tick``/``fire``,
        ``update_topics``, ``delete_group``, migration); a steady heartbeat drains nothing.
        ``wall_ms``: the wall clock (ms since the epoch), stamped on a group that became empty
        so its expiry survives a failover. Needs ``GroupConfig.durable_state``."""
        journal = self.journal
        if journal is not None and not journal:
            return []  # nothing changed (the steady heartbeat): no call further down
        return durable.drain_records(self, wall_ms)

    def group_records(self, group_id: str, wall_ms: int) -> list[StateRecord]:
        """Every record of a group as it stands now, independent of what was drained (for a
        first write of a group that has none yet, or to rewrite it whole)."""
        return durable.group_records(self, group_id, wall_ms)

    def load_group(self, group_id: str, records: Iterable[StateRecord], now_ms: int,
                   wall_ms: int) -> list[Effect]:
        """Take ``group_id`` over from its records (as read from the topic, in order, to the
        end; other groups' records are skipped): members keep their member ids, epochs,
        partitions and targets, every member gets a full session from ``now_ms``, a member
        still revoking its rebalance timeout, an empty group expires as it would have (by
        ``wall_ms``). No epoch is bumped and no target computed because of the load; a topic
        that changed meanwhile bumps the epoch as ``update_topics`` would. Requests the old
        coordinator held (a deferred JoinGroup, a held SyncGroup) died with it: their clients
        send them again. The engine's topic image must be current (a fresh Metadata view)
        before the load, as for any request. Raises
        :class:`~translation.durable.StateLoadError` for records that do not make a group."""
        return durable.load_groups(self, records, now_ms, wall_ms, only=group_id)

    def load(self, records: Iterable[StateRecord], now_ms: int, wall_ms: int) -> list[Effect]:
        """:meth:`load_group` for every group ``records`` hold."""
        return durable.load_groups(self, records, now_ms, wall_ms)

    def delete_group(self, group_id: str) -> tuple[ErrorCode, list[Effect]]:
        """DeleteGroups: NON_EMPTY_GROUP while the group has members, else the group is
        forgotten (its offsets are the broker's to delete). An unknown group is not an error
        here: the broker may still have one of that id."""
        effects: list[Effect] = []
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.NONE, effects
        if group.members:
            return ErrorCode.NON_EMPTY_GROUP, effects
        self.drop_group(group, GroupDeleted(group_id), effects)
        return ErrorCode.NONE, effects

    def _group_changed(self, group_id: str, now_ms: int, effects: list[Effect]) -> None:
        group = self.groups.get(group_id)
        if group is not None:
            for listener in self.listeners:
                listener.group_changed(group, now_ms, effects)

    # ------------------------------------------------------------------ timers

    def _on_timer(self, key: TimerKey, payload: int, now_ms: int, effects: list[Effect]) -> None:
        group = self.groups.get(key.group_id)
        if group is None:
            return
        if group.suspended is not None:
            group.suspended[key] = payload
            return
        if key.kind is TimerKind.GROUP_EXPIRY:
            if not group.members:
                self.drop_group(group, GroupExpired(key.group_id), effects)
            return
        if key.kind is TimerKind.ASSIGNMENT:
            if group.members:
                self.maybe_compute_target_assignment(group, now_ms, effects)
            return
        member = group.members.get(key.member_id)
        if member is None:
            return
        if key.kind is TimerKind.SESSION:
            until = group.held_sessions.protected_until(member.member_id, now_ms)
            if until is not None:  # its request is inside the proxy: armed again when it
                self.arm_timer(key, until, effects)  # leaves, or when the hold's bound passes
                return
            self.remove_member(group, member, "session timeout", now_ms, effects)
            effects.append(MemberFenced(group.group_id, member.member_id, "session-timeout"))
        elif key.kind is TimerKind.REBALANCE and member.member_epoch == payload:
            self.remove_member(group, member, "rebalance timeout", now_ms, effects)
            effects.append(MemberFenced(group.group_id, member.member_id, "rebalance-timeout"))
        elif key.kind not in (TimerKind.SESSION, TimerKind.REBALANCE):
            for listener in self.listeners:
                listener.timer_fired(group, key, now_ms, effects)
