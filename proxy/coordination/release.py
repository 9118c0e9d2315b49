"""Hand-back: a group the engine coordinates goes back to the broker's classic coordinator
(decision record 0018, section 1, "Downgrade (hand-back)"), so that the sidecars can then be
removed pod by pod without any client being refused.

Started by the ``groupgate release --group G`` command (an IncrementalAlterConfigs of the
GROUP resource ``G`` setting groupgate's config :data:`RELEASE_CONFIG`, answered by
:class:`ReleaseCommandHandler` after the broker authorized the caller for ALTER_CONFIGS on the
group, on the caller's own connection), or by ``migration-policy`` ``downgrade`` /
``bidirectional`` when a group's last KIP-848 member leaves and classic members remain (Kafka's
downgrade rule). The sidecar holding the group acts; per group it goes through two phases,
kept by :class:`ReleaseBook` (sans-I/O: the times are passed in):

* ``releasing``: the lock is still held and the engine's timers for the group are suspended
  (nobody is fenced meanwhile). Every member gives up its partitions before the broker's group
  can form: a classic member's next Heartbeat or SyncGroup is answered ILLEGAL_GENERATION (it
  treats its partitions as lost and joins again, keeping its member id; its JoinGroup is held
  until the group is released, then answered REBALANCE_IN_PROGRESS, and it joins the broker's
  group; a JoinGroup still naming owned partitions, or one the engine held when the phase
  began, is answered ILLEGAL_GENERATION too); a KIP-848 member's heartbeats are answered with
  an empty assignment at its epoch until it reports owning nothing; a new KIP-848 member waits
  (COORDINATOR_LOAD_IN_PROGRESS). Members the engine gave nothing are not waited for.
  The phase ends when every member gave up, or after half the shortest member session
  (:func:`release_bound_s`), whichever is first: every member heartbeats well within that, and
  nobody waits for partitions longer than one session. So the broker's first generation never
  hands out a partition a member behind this sidecar still consumes, whatever the broker's
  ``group.initial.rebalance.delay.ms``; the price is that every member is called back once
  (cooperative ones too): keeping cooperative members' partitions through the hand-back would
  need the lock to stay in the broker's group as a placeholder owner until they rejoined, which
  is not built.
* ``released``: the engine forgets the group (its state log records become tombstones:
  :meth:`~translation.classic.coordinator.ClassicGroupCoordinator.release`), each KIP-848
  member is carried over as a bridged member (:meth:`~.bridged.Bridges.carry_over`: it keeps
  its member id and epoch, and what it still owns: nothing, unless it stayed silent), the lock
  leaves the broker's group, and the bridged members join it. Classic members rejoin
  themselves: a JoinGroup carrying a member id the engine gave is forwarded without it (the
  broker answers MEMBER_ID_REQUIRED with one of its own); their stray Heartbeats and
  SyncGroups are answered ILLEGAL_GENERATION, their commits REBALANCE_IN_PROGRESS. The
  release is remembered (:data:`RELEASED_SECONDS`): meanwhile this sidecar neither takes the
  group over again (a KIP-848 member joining it is bridged, a classic one forwarded) nor
  converts it back (the online upgrade skips it), even while the broker's group is Empty.

Journal ``group_released`` (schema version 2), metric ``groupgate_group_releases_total``.
The command is decided by the sidecar it reaches and never relayed (:class:`ReleaseCommandHandler`).
In a fleet the sidecars that relay for the group are told (:mod:`.release_fleet`); the
release is remembered across restarts in the state log (:class:`DurableReleases`, the marker
of :func:`translation.durable.release_marker`); ``--to native`` hands the group to Kafka 4.x's
own KIP-848 coordinator (:mod:`.native_exit`).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import trio
from cachetools import TTLCache

from proxy.codec.api_keys import ApiKey
from proxy.coordination.handler import (
    PASS,
    Answer,
    ApiHandler,
    GroupRequest,
    Outcome,
    Upstream,
    Value,
)
from proxy.state_log.errors import StateLogError
from translation.durable import released_to
from translation.errors import ErrorCode
from translation.records import RecordError, RecordKey, RecordKind, decode_record, fold

if TYPE_CHECKING:
    from proxy.coordination.durability import Durability

log = logging.getLogger("groupgate.coordination")

RELEASE_CONFIG: Final = "groupgate.release"
"""The GROUP config ``groupgate release`` sets (IncrementalAlterConfigs) to hand a group back."""
GROUP_RESOURCE: Final = 32
"""Kafka's ConfigResource.Type GROUP."""
SET: Final = 0
"""IncrementalAlterConfigs' operation SET."""
RELEASED_SECONDS = 3600.0
"""How long a released group is remembered (not taken over or converted again here)."""
RELEASES_MAX = 10_000
"""Groups remembered at once (the oldest released ones go first)."""
MIN_BOUND_SECONDS = 1.0
CHECKED_SECONDS = 60.0
"""How long what the state log said of a group's release is believed (:class:`DurableReleases`)."""
READ_SECONDS = 10.0


class ReleasePhase(enum.Enum):
    RELEASING = "releasing"
    RELEASED = "released"


class ReleaseTarget(enum.Enum):
    """Which of the broker's coordinators the group is handed to."""

    CLASSIC = "classic"
    """The broker's classic coordinator (any Kafka): KIP-848 members become bridged members."""
    NATIVE = "native"
    """Kafka 4.x's own KIP-848 coordinator (the exit, :mod:`.native_exit`): KIP-848 members
    are told to rejoin there, classic members join the consumer group the broker keeps."""


@dataclass(slots=True)
class GroupRelease:
    """One group's hand-back on this sidecar."""

    group_id: str
    reason: str
    phase: ReleasePhase
    started: float
    deadline: float
    """End of the ``releasing`` phase at the latest."""
    members: frozenset[str]
    """The group's classic member ids (the engine's)."""
    consumers: frozenset[str] = frozenset()
    """The group's KIP-848 member ids."""
    unreleased: set[str] = field(default_factory=set)
    """Members not known yet to have given up their partitions."""
    left: set[str] = field(default_factory=set)
    """KIP-848 members that left meanwhile (nothing to carry over)."""
    until: float = float("inf")
    """When a released group is forgotten."""
    to: ReleaseTarget = ReleaseTarget.CLASSIC
    told: set[str] = field(default_factory=set)
    """``NATIVE``: KIP-848 members already told to rejoin at the broker (at most
    ``consumers``)."""
    peer: str | None = None
    """Another sidecar hands the group back (its fleet address): this one follows
    (:mod:`.release_fleet`)."""


def release_bound_s(session_timeouts_ms: Iterable[int], default_ms: int) -> float:
    """How long the ``releasing`` phase lasts at most: half the shortest member session (every
    live member heartbeats well within it), at least :data:`MIN_BOUND_SECONDS`."""
    shortest = min((s for s in session_timeouts_ms if s > 0), default=default_ms)
    return max(MIN_BOUND_SECONDS, shortest / 2000)


class ReleaseBook:
    """Every group released (or being released) here, by group id; bounded, expiring."""

    def __init__(self, *, max_groups: int = RELEASES_MAX,
                 remember_s: float = RELEASED_SECONDS) -> None:
        self.max_groups = max_groups
        self.remember_s = remember_s
        self._groups: dict[str, GroupRelease] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def get(self, group_id: str, now: float) -> GroupRelease | None:
        release = self._groups.get(group_id)
        if release is not None and now >= release.until:
            del self._groups[group_id]
            return None
        return release

    def phase(self, group_id: str, now: float) -> ReleasePhase | None:
        release = self.get(group_id, now)
        return None if release is None else release.phase

    def start(self, group_id: str, reason: str, classic_members: Iterable[str],
              consumer_members: Iterable[str], now: float, bound_s: float,
              to: ReleaseTarget = ReleaseTarget.CLASSIC, peer: str | None = None
              ) -> GroupRelease | str:
        """Begin releasing ``group_id`` (to the broker's coordinator ``to``; ``peer``: the
        holder that does, this sidecar following); why not (it is being released already)."""
        known = self.get(group_id, now)
        if known is not None and known.phase is ReleasePhase.RELEASING:
            return "the group is being released already"
        self._make_room(now)
        members, consumers = frozenset(classic_members), frozenset(consumer_members)
        release = GroupRelease(group_id, reason, ReleasePhase.RELEASING, now, now + bound_s,
                               members, consumers, set(members | consumers), to=to, peer=peer)
        self._groups.pop(group_id, None)
        self._groups[group_id] = release
        return release

    def _make_room(self, now: float) -> None:
        for group_id in [g for g, r in self._groups.items() if now >= r.until]:
            del self._groups[group_id]
        while len(self._groups) >= self.max_groups:
            oldest = next((g for g, r in self._groups.items()
                           if r.phase is ReleasePhase.RELEASED), None)
            if oldest is None:
                return
            del self._groups[oldest]

    def classic_member(self, group_id: str, member_id: str, now: float) -> bool:
        """Whether ``member_id`` is a classic member of a group being (or) handed back here:
        its Heartbeat and SyncGroup are answered ILLEGAL_GENERATION (it gives up its partitions
        and joins again, keeping its member id), its commits after the hand-back
        REBALANCE_IN_PROGRESS."""
        release = self.get(group_id, now)
        return release is not None and member_id in release.members

    def consumer_member(self, group_id: str, member_id: str, now: float) -> bool:
        """Whether ``member_id`` is a KIP-848 member of a group being handed back here (its
        heartbeats are answered with an empty assignment until it owns nothing)."""
        release = self.get(group_id, now)
        return (release is not None and release.phase is ReleasePhase.RELEASING
                and member_id in release.consumers)

    def had_consumer(self, group_id: str, member_id: str, now: float) -> bool:
        """Whether ``member_id`` was a KIP-848 member of ``group_id`` when it was handed back
        here (it takes part in the broker's group as a bridged member, whatever the policy)."""
        release = self.get(group_id, now)
        return release is not None and member_id in release.consumers

    def gave_up(self, group_id: str, member_id: str, now: float, *, left: bool = False
                ) -> None:
        """``member_id`` owns nothing of the group any more: a classic member's JoinGroup or
        LeaveGroup arrived, or a KIP-848 member reported owning nothing (``left``: it left)."""
        release = self.get(group_id, now)
        if release is None or release.phase is not ReleasePhase.RELEASING:
            return
        release.unreleased.discard(member_id)
        if left:
            release.left.add(member_id)

    def ready(self, group_id: str, now: float) -> bool:
        """Whether the ``releasing`` phase of ``group_id`` is over: every member gave up its
        partitions, or the bound passed."""
        release = self.get(group_id, now)
        return (release is not None and release.phase is ReleasePhase.RELEASING
                and (not release.unreleased or now >= release.deadline))

    def released(self, group_id: str, now: float, classic_members: Iterable[str] = ()) -> None:
        """The group was handed back: remembered for :attr:`remember_s`; ``classic_members``:
        members the engine still had (told to rejoin if they ask again)."""
        release = self.get(group_id, now)
        if release is None:
            return
        release.phase = ReleasePhase.RELEASED
        release.members = release.members | frozenset(classic_members)
        release.until = now + self.remember_s

    def native(self, group_id: str, now: float) -> GroupRelease | None:
        """The release of ``group_id`` if it was handed to the broker's KIP-848 coordinator
        (its requests go to the broker: :mod:`.native_exit`)."""
        release = self.get(group_id, now)
        return (release if release is not None and release.phase is ReleasePhase.RELEASED
                and release.to is ReleaseTarget.NATIVE else None)

    def found_native(self, group_id: str, reason: str, now: float) -> None:
        """The broker's KIP-848 coordinator has ``group_id`` (it was handed there by a sidecar
        that is gone, or the group never had groupgate): remembered as a release to it."""
        started = self.start(group_id, reason, (), (), now, 0.0, ReleaseTarget.NATIVE)
        if not isinstance(started, str):
            self.released(group_id, now)

    def forget(self, group_id: str) -> None:
        """Forget whatever is known of ``group_id``'s release (a holder's replaced one, or one
        that did not happen)."""
        self._groups.pop(group_id, None)

    def abort(self, group_id: str) -> None:
        """The release did not happen (the group was lost meanwhile): forget it."""
        release = self._groups.get(group_id)
        if release is not None and release.phase is ReleasePhase.RELEASING:
            del self._groups[group_id]


# ---- the release remembered in the state log ---------------------------------------------------


class DurableReleases:
    """What the state log says of a group released earlier, by any sidecar: the marker its
    holder wrote behind its tombstones (:func:`translation.durable.release_marker`). Asked by
    the online upgrade before it converts a group, so that a sidecar restarted since (whose
    :class:`ReleaseBook` is empty) does not convert a group handed back under ``bidirectional``;
    answers are kept for :data:`CHECKED_SECONDS` (bounded), a marker for as long as it is
    remembered in the book."""

    def __init__(self, *, max_groups: int = RELEASES_MAX) -> None:
        self._checked: TTLCache[str, str | None] = TTLCache(
            maxsize=max_groups, ttl=CHECKED_SECONDS, timer=trio.current_time)

    async def lookup(self, durability: Durability, group_id: str) -> str | None:
        """The coordinator ``group_id`` was handed to (``classic``, ``native``), if the state
        log says it was released; None if not (or if the log cannot be read now)."""
        if group_id in self._checked:
            return self._checked[group_id]
        try:
            with trio.fail_after(READ_SECONDS):
                loaded = await durability.log.load_group(group_id)
            records = [decode_record(key, value) for key, value in loaded.records]
        except (StateLogError, RecordError, trio.TooSlowError) as exc:
            log.info("group %s: could not read the state log for a release: %s", group_id, exc)
            return None
        to = released_to(fold(records).get(RecordKey(RecordKind.GROUP, group_id)))
        self._checked[group_id] = to
        return to


# ---- the command -------------------------------------------------------------------------------


TARGET_VALUES: Final = {"true": ReleaseTarget.CLASSIC, "classic": ReleaseTarget.CLASSIC,
                        "native": ReleaseTarget.NATIVE}
"""The values of :data:`RELEASE_CONFIG` and the coordinator each hands the group to."""


def release_target(value: str | None) -> ReleaseTarget | None:
    """The coordinator a :data:`RELEASE_CONFIG` value names (None: not a value it takes)."""
    return TARGET_VALUES.get((value or "").strip().lower())


def release_groups(value: Value) -> list[str]:
    """The groups an IncrementalAlterConfigs request asks groupgate to release: GROUP resources
    that set :data:`RELEASE_CONFIG` (and nothing else)."""
    out = []
    for resource in value.get("resources") or ():
        configs = resource.get("configs") or []
        if (resource.get("resource_type") == GROUP_RESOURCE and configs
                and all(c.get("name") == RELEASE_CONFIG for c in configs)):
            out.append(resource["resource_name"])
    return out


def release_targets(value: Value) -> dict[str, ReleaseTarget | None]:
    """Per group of :func:`release_groups`, the coordinator its config value names (None: a
    value groupgate does not take; the last value set counts)."""
    out: dict[str, ReleaseTarget | None] = {}
    for resource in value.get("resources") or ():
        configs = resource.get("configs") or []
        if resource.get("resource_type") == GROUP_RESOURCE and configs:
            out[resource["resource_name"]] = release_target(configs[-1].get("value"))
    return out


class ReleaseCommandHandler(ApiHandler):
    """IncrementalAlterConfigs: a request setting :data:`RELEASE_CONFIG` on a GROUP resource is
    the ``groupgate release`` command; every other one passes to the broker untouched.

    The command is first sent on to the broker on the caller's own connection, as
    ``validate_only``: the broker checks ALTER_CONFIGS on the group for the caller's principal
    before it looks at the config (which it does not know, so it changes nothing). A resource
    the broker refuses for authorization keeps the broker's answer; for the others this
    sidecar starts the release and answers NONE, or the reason it cannot
    (NOT_COORDINATOR: this sidecar does not hold the group). The value says where to:
    ``true`` or ``classic``, the broker's classic coordinator; ``native``, Kafka 4.x's own
    KIP-848 coordinator (refused, INVALID_REQUEST, in front of a broker without one)."""

    api_key = ApiKey.INCREMENTAL_ALTER_CONFIGS
    answers_upstream_later = True
    """A native release asks the broker's ApiVersions first (:mod:`.native_exit`)."""

    def group_ids(self, request: GroupRequest) -> tuple[str, ...]:
        """None: the sidecar the command reaches decides it (never relayed: the holder would
        have to ask the broker as itself, not as the caller); a sidecar that does not hold
        the group answers NOT_COORDINATOR, so in a fleet the command goes to the holder."""
        return ()

    def decide(self, request: GroupRequest) -> Outcome:
        groups = release_groups(request.value)
        if not groups or len(groups) != len(request.value.get("resources") or ()):
            return PASS
        targets = release_targets(request.value)
        if any(to is ReleaseTarget.NATIVE for to in targets.values()):
            return Answer(self._after_asking_the_broker(request, targets))
        return self._probe(request, targets, {})

    async def _after_asking_the_broker(self, request: GroupRequest,
                                       targets: dict[str, ReleaseTarget | None]) -> Upstream:
        native = await self.service.exits.broker_has_kip848()
        refused = {} if native else {
            group_id: NO_KIP848 for group_id, to in targets.items()
            if to is ReleaseTarget.NATIVE}
        return self._probe(request, targets, refused)

    def _probe(self, request: GroupRequest, targets: dict[str, ReleaseTarget | None],
               refused: dict[str, str]) -> Upstream:
        service = self.service
        probe = dict(request.value, validate_only=True)

        def on_response(response: Value) -> Value:
            for resource in response.get("responses") or ():
                if resource.get("resource_type") != GROUP_RESOURCE:
                    continue
                if resource.get("error_code") in AUTHORIZATION_ERRORS:
                    continue
                group_id = resource["resource_name"]
                to = targets.get(group_id)
                why = (BAD_VALUE if to is None else refused.get(group_id)
                       or service.start_release(group_id, REASONS[to], to))
                resource["error_code"] = int(ErrorCode.NONE if why is None
                                             else ErrorCode.NOT_COORDINATOR
                                             if why == NOT_HELD else ErrorCode.INVALID_REQUEST)
                resource["error_message"] = why
            return response

        return Upstream(probe, on_response)

    def failure(self, request: GroupRequest, error: int) -> Value:
        return {"throttle_time_ms": 0, "responses": [
            {"error_code": error, "error_message": None,
             "resource_type": r.get("resource_type"), "resource_name": r.get("resource_name")}
            for r in request.value.get("resources") or ()]}


REASONS: Final = {ReleaseTarget.CLASSIC: "groupgate release",
                  ReleaseTarget.NATIVE: "groupgate release --to native"}
BAD_VALUE: Final = (f"{RELEASE_CONFIG} takes true (or classic: the broker's classic "
                    "coordinator) or native (Kafka 4.x's KIP-848 coordinator)")
NO_KIP848: Final = ("the broker has no KIP-848 coordinator (ConsumerGroupHeartbeat is not in "
                    "its ApiVersions): --to native needs Kafka 4.0 or later")
NOT_HELD: Final = "this sidecar does not coordinate the group"
AUTHORIZATION_ERRORS: Final = frozenset({int(ErrorCode.GROUP_AUTHORIZATION_FAILED),
                                         int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)})
