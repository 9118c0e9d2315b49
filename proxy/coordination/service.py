"""The coordinator service: drives the sans-I/O group engine from trio.

One :class:`CoordinatorService` per proxy process owns the
:class:`~translation.coordinator.GroupCoordinator` and everything that gives it a clock and a
network:

* time: ``now_ms`` is trio's monotonic clock in milliseconds; a timer task sleeps until the
  engine's :meth:`~translation.coordinator.GroupCoordinator.next_deadline` (or until a new
  timer is armed) and calls ``tick`` (session timeouts, rebalance timeouts, deferred target
  computations, expiry of empty groups), after suspending every group whose lease ran out
  meanwhile (:meth:`~proxy.coordination.membership.BrokerMembership.lease_expired`);
* serialization: engine calls are plain synchronous calls made from trio tasks of one thread,
  and none of them awaits, so each runs to completion before another starts: no lock needed;
* taking a group over: the first ConsumerGroupHeartbeat with epoch 0 for a group id the proxy
  does not coordinate yet starts a :class:`~proxy.coordination.membership.BrokerMembership`;
  only once the proxy holds the broker's classic group of that id does the engine see the
  heartbeat. If the broker's group has members connected straight to the broker, the takeover
  fails (INCONSISTENT_GROUP_PROTOCOL): the group is in the broker phase here, and the member
  gets a bridged member in the broker's group (:mod:`.bridged`; a member subscribing by regex
  with its regex resolved to names, every topic listed first);
* topics: a :class:`~proxy.coordination.topics.TopicWatcher` feeds topic metadata into
  ``update_topics``; a joining member naming a topic the image does not know (or bringing a
  new regex) waits for one refresh first, so its first assignment already covers the topic;
* classic members (``classic-translation``): JoinGroup, SyncGroup, Heartbeat and LeaveGroup
  of groups the engine serves go to the engine's
  :class:`~translation.classic.coordinator.ClassicGroupCoordinator`. A classic JoinGroup that
  starts a group takes the broker's group over exactly like a first ConsumerGroupHeartbeat; if
  the broker's group has members connected straight to it, the group is remembered as
  active at the broker for :data:`BROKER_ACTIVE_SECONDS` (joins of that group are then
  forwarded, :meth:`CoordinatorService.broker_group_active`) and the join is answered with the
  retriable COORDINATOR_NOT_AVAILABLE, so the client retries and reaches the broker. A
  JoinGroup the engine holds (deferred join: the group's target is being batched) waits on a
  :class:`Held` keyed by (group, member), resolved from the ``JoinCompleted`` effect of
  whatever engine call completes it, and bounded by the client's rebalance timeout. A held
  SyncGroup (the member waits for partitions others still own) waits the same way for its
  ``SyncCompleted``; the engine's own hold timer answers it first;
* the request funnel (:mod:`.funnel`): every group API's request is admitted (lease decided,
  members told to let go, this sidecar holding the group, a member's group loaded) and
  answered (the write barrier, the lease checked again) by the same two calls;
* effects: every engine call's effects go through :meth:`CoordinatorService.apply`: timers
  wake the timer task, ``JoinCompleted`` / ``SyncCompleted`` resolve held requests, a group
  that expired (empty past ``group-empty-expiry-ms``) or was handed back to the broker leaves
  the broker's group; at shutdown every broker group is left so that direct clients can take
  over.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio
from cachetools import TTLCache

from proxy import __version__, metrics
from proxy.config import ProxyConfig, shortest_classic_fleet_session_ms
from proxy.coordination import release_fleet
from proxy.coordination.bridged import Bridges, BridgeSettings
from proxy.coordination.commit_retries import CommitRetries
from proxy.coordination.durability import Durability
from proxy.coordination.fleet import OLD_FOLLOWER, Card, StateLogSettingsId
from proxy.coordination.funnel import Funnel
from proxy.coordination.handoff import HandOff
from proxy.coordination.membership import BrokerMembership
from proxy.coordination.native_exit import NativeExits
from proxy.coordination.peers import Directory, Routes, lookup_wait
from proxy.coordination.release import (
    NOT_HELD,
    DurableReleases,
    GroupRelease,
    ReleaseBook,
    ReleasePhase,
    ReleaseTarget,
    release_bound_s,
)
from proxy.coordination.release_fleet import FleetRelease, Relayers
from proxy.coordination.tickets import Tickets
from proxy.coordination.topics import TopicWatcher
from proxy.coordination.upgrade import Upgrades, adopt_snapshot
from proxy.journal.clients import ClientSoftwareDirectory
from proxy.journal.observer import JournalObserver
from proxy.journal.writer import JournalWriter, run_snapshots
from proxy.kafka_client.links import Address, LinkPool
from proxy.security.policy import Security
from proxy.state_log.log import StateLog, StateLogSettings
from translation.assignors import BUILTIN_ASSIGNORS
from translation.classic.coordinator import ClassicGroupCoordinator
from translation.classic.messages import (
    UNKNOWN_MEMBER_ID,
    HeartbeatRequest,
    HeartbeatResponse,
    HeldRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from translation.classic.migration import ClassicGroupSnapshot
from translation.classic.routing import classify_classic_join
from translation.config import GroupConfig, MigrationPolicy
from translation.coordinator import GroupCoordinator
from translation.durable import release_marker
from translation.effects import (
    DepartureWaitEnded,
    DepartureWaitStarted,
    Effect,
    GroupCreated,
    GroupEpochBumped,
    GroupExpired,
    GroupHandedBack,
    GroupLoaded,
    GroupLost,
    GroupReleased,
    JoinCompleted,
    MemberFenced,
    MemberJoined,
    MemberLeft,
    MemberReplaced,
    MemberTooLarge,
    SyncCompleted,
    TargetAssignmentComputed,
    TargetAssignmentFailed,
    TimerArmed,
)
from translation.errors import ErrorCode, GroupError
from translation.heartbeat import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse
from translation.member import MemberProtocol
from translation.records import key_group_id
from translation.topics import TopicsImage

log = logging.getLogger("groupgate.coordination")
RESTART_SECONDS = 1.0
"""How long a failed task of the service waits before it is started again."""

JOURNAL_DRAIN_SECONDS = 5.0
"""How long a stopping proxy waits for its journal events to be written."""
TOPIC_WAIT_SECONDS = 3.0
"""How long a joining member naming an unknown topic waits for a metadata refresh."""
TAKEOVER_WAIT_SECONDS = 10.0
"""How long a joining heartbeat waits for the broker-side membership before it is answered
with the retriable COORDINATOR_LOAD_IN_PROGRESS (the membership keeps trying)."""
HEARTBEAT_WAIT_FRACTION = 0.5
"""A ConsumerGroupHeartbeat waits at most this share of the heartbeat interval (and at most
:data:`TAKEOVER_WAIT_SECONDS`) for a takeover or a topic refresh, then gets the retriable
COORDINATOR_LOAD_IN_PROGRESS while the takeover goes on: librdkafka gives a heartbeat
request one heartbeat interval before it times it out and backs off reconnecting, so a
longer wait only delays the member."""


BROKER_ACTIVE_SECONDS = 10.0
"""How long a group whose takeover the broker refused (its group has members of another
protocol, an authorization error; never a lost election) counts as active at the broker: its
classic JoinGroups are forwarded meanwhile, then the next new one tries the takeover again."""
REMEMBERED_MAX = 10_000
"""Most member ids / broker-active groups remembered at once (least recently used go first)."""
SYNC_HOLD_SLACK = 5.0
"""Seconds a held SyncGroup may wait beyond ``classic-sync-hold-ms`` before the proxy answers
it itself (the engine's own hold timer normally answers it at ``classic-sync-hold-ms``)."""
PEER_RELEASE_LOOKUPS = 4
PEER_RELEASE_RETRY_SECONDS = 5.0
"""A follower never told how a hand-back ended asks the broker's group this many times, this
far apart (:meth:`CoordinatorService._peer_release_bound`)."""
RELEASE_POLL_SECONDS = 0.05
"""How often a release under way looks whether every classic member has been told."""
ISSUED_ID_SECONDS = 60.0
"""How long a member id the engine handed out with MEMBER_ID_REQUIRED routes the member's
next JoinGroup to the engine while the group has no members yet."""
SHORT_SESSION_NOTE_SECONDS = 3600.0
"""How often a group whose classic members bring a session too short for a fleet's failover is
logged (once per group in that time)."""


R = TypeVar("R", JoinGroupResponse, SyncGroupResponse)


@dataclass(frozen=True, slots=True)
class NotTaken:
    """Why this sidecar did not take a group over."""

    reason: str
    kind: str = "refused"
    direct: bool = False
    """Refused because clients connected straight to the broker hold its group: the group is
    in the broker phase here (its KIP-848 members are bridged, :mod:`.bridged`)."""
    """``lost-election``, ``refused`` or ``unavailable`` (:attr:`BrokerMembership.failure_kind`),
    or ``nothing-loaded`` (a takeover to load a member's group found no members in the state
    log and gave the broker's group back): only a refusal leaves the group to the broker's own
    members for a while."""

    def __str__(self) -> str:
        return self.reason


class NothingLoaded(Exception):
    """A takeover started to load a member's group found no member of it in the state log:
    the broker's group is given back (the membership leaves it)."""


class Held(Generic[R]):
    """A classic request the engine answered with "pending" (a held JoinGroup or SyncGroup),
    resolved by its ``JoinCompleted`` / ``SyncCompleted`` effect."""

    __slots__ = ("done", "response")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.response: R | None = None

    def resolve(self, response: R) -> None:
        if not self.done.is_set():
            self.response = response
            self.done.set()

    async def wait(self, timeout_s: float) -> R | None:
        with trio.move_on_after(max(timeout_s, 0.0)):
            await self.done.wait()
        return self.response


def wall_ms() -> int:
    """The wall clock in milliseconds (for times that must survive a restart: the engine's
    own clock is per process)."""
    return int(time.time() * 1000)


def group_config(config: ProxyConfig) -> GroupConfig:
    return GroupConfig(
        assignors=[cls() for cls in BUILTIN_ASSIGNORS],
        session_timeout_ms=config.group_session_timeout_ms,
        heartbeat_interval_ms=config.group_heartbeat_interval_ms,
        max_group_size=config.group_max_size,
        max_members=config.max_members,
        max_subscription_topics=config.max_subscription_topics,
        max_regex_bytes=config.max_regex_bytes,
        empty_group_expiry_ms=config.group_empty_expiry_ms,
        quiet_classic_advance=config.classic_quiet_advance,
        classic_sync_hold_ms=config.classic_sync_hold_ms,
        classic_departure_wait_ms=config.classic_departure_wait_ms,
        durable_state=config.state_log,
        migration_policy=MigrationPolicy(config.migration_policy),
    )


def state_log_settings(config: ProxyConfig) -> StateLogSettings:
    return StateLogSettings(
        topic=config.state_log_topic, partitions=config.state_log_partitions,
        replication_factor=config.state_log_replication_factor,
        topic_configs=dict(config.state_log_topic_config),
        transactional_id_prefix=config.state_log_transactional_id_prefix,
        transaction_timeout_ms=config.state_log_transaction_timeout_ms,
        write_timeout=config.state_log_write_timeout_ms / 1000,
        load_timeout=config.state_log_load_timeout_ms / 1000)


def issued_by_a_broker(member_id: str) -> bool:
    """Whether ``member_id`` has the shape of the ids a Kafka broker gives classic members:
    the client id, a dash and a UUID."""
    if len(member_id) <= 37 or member_id[-37] != "-":
        return False
    try:
        return str(uuid.UUID(member_id[-36:])) == member_id[-36:]
    except ValueError:
        return False


def issued_by_a_proxy(member_id: str) -> bool:
    """Whether ``member_id`` has the shape of the ids the engine hands classic members (a bare
    UUID). A Kafka broker's ids start with the client id and a dash, so such a member comes
    from a proxy (this one before a restart, or another); its join must not be forwarded to a
    broker group that a proxy holds, which would refuse it as INCONSISTENT_GROUP_PROTOCOL, an
    error clients treat as fatal."""
    try:
        return str(uuid.UUID(member_id)) == member_id
    except ValueError:
        return False


class CoordinatorService:
    """The engine plus its timers, topic metadata and broker-side memberships."""

    def __init__(self, config: ProxyConfig, security: Security | None = None) -> None:
        """``security``: how the service's own connections are opened (TLS and SASL to the
        brokers as the proxy's identity, the fleet's to other sidecars); by default as
        ``config`` says."""
        self.config = config
        self.security = security if security is not None else Security(config)
        self.engine = GroupCoordinator(group_config(config))
        self.pool = LinkPool(connect_timeout=config.connect_timeout,
                             request_timeout=config.connect_timeout + 20,
                             max_frame_bytes=config.max_frame_bytes, security=self.security)
        self.memberships: dict[str, BrokerMembership] = {}
        self.topics = TopicWatcher(self.pool, config.upstream,
                                   config.group_metadata_refresh_ms / 1000, self._wanted_topics,
                                   self._install_topics)
        self.node_address: Callable[[int | None], Address] = lambda _node: config.upstream[0]
        """Upstream address of a broker node (the server's directory; set by the app)."""
        self._pending_names: dict[str, int] = {}
        self._pending_regex = 0
        self.classic: ClassicGroupCoordinator | None = (
            ClassicGroupCoordinator(self.engine) if config.classic_translation else None)
        """The engine's classic-member translation (None: classic requests are forwarded)."""
        self.held_joins: dict[tuple[str, str], Held[JoinGroupResponse]] = {}
        self.held_syncs: dict[tuple[str, str], Held[SyncGroupResponse]] = {}
        # Both are fed by client requests: bounded, entries expire (docs/decisions/0008).
        self._broker_active: TTLCache[str, bool] = TTLCache(
            maxsize=REMEMBERED_MAX, ttl=BROKER_ACTIVE_SECONDS, timer=trio.current_time)
        self._issued_ids: TTLCache[tuple[str, str], bool] = TTLCache(
            maxsize=REMEMBERED_MAX, ttl=ISSUED_ID_SECONDS, timer=trio.current_time)
        self._short_sessions_noted: TTLCache[str, bool] = TTLCache(
            maxsize=REMEMBERED_MAX, ttl=SHORT_SESSION_NOTE_SECONDS, timer=trio.current_time)
        self._timer_wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.hand_off = HandOff()
        self.card = Card(config.advertised_fleet_address, __version__,
                         state_log=StateLogSettingsId.of(
                             config.state_log, config.state_log_topic,
                             config.state_log_transactional_id_prefix))
        """What this sidecar tells the others in the broker's groups it holds."""
        self.funnel = Funnel(self)
        """The admission and the answer of every group API's request (:mod:`.funnel`)."""
        self.directory = Directory(lambda: self.pool, config.upstream)
        self.tickets = Tickets(lambda: self.pool)
        """Commit tickets (:mod:`.tickets`): given out as a holder, reported as a follower."""
        self.routes = Routes(self.claims, self.directory, config.advertised_fleet_address,
                             self.card, lookup_wait(config.group_heartbeat_interval_ms))
        self.durability: Durability | None = None
        """The group state log (``state-log``): what the engine changes is written there
        before the answers depending on it leave, and loaded when a group is taken over."""
        if config.state_log:
            state_log = StateLog(config.upstream, state_log_settings(config),
                                 group_of=key_group_id, connect_timeout=config.connect_timeout,
                                 max_frame_bytes=max(config.max_frame_bytes, 8 << 20),
                                 security=self.security)
            self.durability = Durability(state_log, self.engine, wall_ms, self.now_ms,
                                         self._refresh_for_load)
            self.durability.lost = self._state_lost
        mark_address = config.advertised_fleet_address or (config.client_host,
                                                             config.listen[1])
        self.bridges = Bridges(BridgeSettings(
            fleet_address=f"{mark_address[0]}:{mark_address[1]}",
            session_timeout_ms=config.broker_session_timeout_ms,
            client_session_ms=config.group_session_timeout_ms,
            metadata_refresh_s=config.group_metadata_refresh_ms / 1000,
            connect_timeout=config.connect_timeout, max_members=config.max_members),
            lambda: self.pool, config.upstream)
        """KIP-848 members of groups in the broker phase: bridged into the broker's group
        (:mod:`.bridged`)."""
        self.bridges.image = lambda: self.engine.image
        self.software = ClientSoftwareDirectory()
        """What clients said they are in ApiVersions (KIP-511), for the journal."""
        self.commit_retries = CommitRetries(trio.current_time)
        """What this sidecar's clients were told of their commits, to recognise a retry that a
        newer commit overtook (:mod:`.commit_retries`)."""
        self.observer: JournalObserver | None = None
        self.journal: JournalWriter | None = None
        """The group-event journal (``journal-topic``; docs/pipeline.md)."""
        journal_settings = config.journal
        if journal_settings.enabled:
            self.observer = JournalObserver(source=journal_settings.source,
                                            software=self.software.lookup)
            self.observer.attach(self.engine)
            self.journal = JournalWriter(journal_settings, self.pool, config.upstream)
        metrics.GROUPS_HELD.set_function(
            lambda: sum(1 for m in self.memberships.values() if m.established and not m.left))
        self._metrics_view = metrics.CoordinationView(self._group_shapes, self.routes.followed)
        metrics.watch_coordination(self._metrics_view)
        self.stepping_down = False
        self._stepped_down: set[str] = set()
        """The groups this sidecar held when it stepped down (at most ``max-groups``)."""
        """The proxy is stopping with the state log on: it answers no group request."""
        self.heartbeat_wait_s = min(TAKEOVER_WAIT_SECONDS, HEARTBEAT_WAIT_FRACTION
                                    * config.group_heartbeat_interval_ms / 1000)
        """The longest a ConsumerGroupHeartbeat waits here for a takeover
        (:data:`HEARTBEAT_WAIT_FRACTION`)."""
        self._loading: dict[str, float] = {}
        """Groups taken over from another coordinator: trio time until which their joins are
        answered COORDINATOR_LOAD_IN_PROGRESS (``takeover-wait-ms``)."""
        self._nothing_loaded: weakref.WeakSet[BrokerMembership] = weakref.WeakSet()
        """Memberships given back because the load they were started for found no members
        (:class:`NothingLoaded`); gone with the membership."""
        fleet_address = config.advertised_fleet_address or (config.client_host,
                                                              config.listen[1])
        self.upgrades = Upgrades(self.engine.config.migration_policy,
                                 f"{fleet_address[0]}:{fleet_address[1]}",
                                 default_session_ms=config.group_session_timeout_ms)
        """The online upgrade of broker groups whose members are all behind sidecars
        (:mod:`.upgrade`)."""
        self.releases = ReleaseBook()
        """Groups handed back to the broker's classic coordinator here (:mod:`.release`)."""
        self._release_done: dict[str, trio.Event] = {}
        self.routes.decided_here = self.released  # the broker's group: no lookup needed
        self.relayers = Relayers(config.group_session_timeout_ms / 1000)
        """Who relayed each group's requests here (:mod:`.release_fleet`)."""
        self.fleet_release = FleetRelease(self)
        """What this sidecar answers of another's hand-back (FleetControl)."""
        self.durable_releases = DurableReleases()
        """Releases the state log remembers (:mod:`.release`)."""
        self.exits = NativeExits(lambda: self.pool, config.upstream)
        """Groups handed to Kafka 4.x's own KIP-848 coordinator (:mod:`.native_exit`)."""
        self._had_consumer_members: set[str] = set()
        """Engine groups that have had a KIP-848 member (the downgrade policy hands such a
        group back when its last one leaves); bounded by the engine's groups."""
        self.bridges.on_leader = self.upgrades.note_leader

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, *, watch_topics: bool = True,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the timer task and (unless ``watch_topics`` is off) the topic watcher."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.directory.background = nursery
                await nursery.start(self.bridges.run)
                nursery.start_soon(self._supervised, "timer task", self._timers)
                nursery.start_soon(self._supervised, "commit tickets", self.tickets.run)
                if watch_topics:
                    nursery.start_soon(self._supervised, "topic watcher", self.topics.run)
                if self.engine.config.migration_policy.upgrade_enabled:
                    nursery.start_soon(self._supervised, "online upgrade",
                                       lambda: self.upgrades.run(self))
                if self.durability is not None:
                    nursery.start_soon(self._supervised, "state log", self.durability.run)
                nursery.start_soon(self._ask_broker_features)
                if self.journal is not None and self.observer is not None:
                    nursery.start_soon(self._supervised, "journal writer", self.journal.run)
                    interval = self.config.journal.snapshot_interval_ms / 1000
                    observer, journal = self.observer, self.journal
                    nursery.start_soon(self._supervised, "journal snapshots",
                                       lambda: run_snapshots(observer, journal, interval))
                task_status.started()
        finally:
            self.directory.background = None  # (a lookup asked now runs in its task)

    async def _ask_broker_features(self) -> None:
        """Whether the broker has a KIP-848 coordinator, asked at the start (:mod:`.native_exit`)
        so that the first takeover does not wait for it."""
        try:
            await self.exits.broker_has_kip848()
        except Exception:  # asked again by the first takeover
            log.exception("asking the broker's ApiVersions failed")

    async def _supervised(self, name: str, task: Callable[[], Awaitable[None]]) -> None:
        """Run one of the service's own tasks; a bug in it is logged and the task started
        again a second later, never the end of the process."""
        while True:
            try:
                await task()
                return
            except Exception:
                log.exception("the %s failed unexpectedly; starting it again in %.0fs", name,
                              RESTART_SECONDS)
            await trio.sleep(RESTART_SECONDS)

    async def _run_membership(self, membership: BrokerMembership) -> None:
        """A group's broker membership, started on behalf of the member that joined first: a
        bug in it (a broker answer it cannot read, a value it cannot encode) ends that group's
        membership with a log line; clients get a retriable error, nothing else is touched."""
        group_id = membership.group_id
        try:
            await membership.run()
        except Exception as exc:
            log.exception("group %s: the proxy's membership in the broker's group failed "
                          "unexpectedly; the group is not coordinated", group_id)
            membership.fail(f"unexpected {type(exc).__name__}: {exc}")
            if self.memberships.get(group_id) is membership:
                del self.memberships[group_id]
        else:
            if membership.failure is not None and self.memberships.get(group_id) is membership:
                # A takeover that failed (lost the election, refused, nothing to load) is
                # dropped here, not only by whoever waits for it in :meth:`_take_over`: a
                # waiter may have given up first (a heartbeat's bound, a closed connection),
                # and a failed membership left in place would claim the group, so that every
                # request of it were answered COORDINATOR_NOT_AVAILABLE here until the next
                # join, instead of being looked up and relayed to the sidecar holding it.
                del self.memberships[group_id]
                self.directory.forget(group_id)

    async def let_go(self, timeout_s: float) -> None:
        """Before the proxy stops. With the state log: stop answering (members get the
        retriable COORDINATOR_NOT_AVAILABLE and keep their partitions), write what is
        pending and leave the broker's groups at once, so that the next coordinator loads
        them and nobody is disturbed. Without it: make every member drop its partitions
        before the groups are given up: from now on each member's next request is answered
        UNKNOWN_MEMBER_ID (:mod:`.handoff`); waits until all have been told or ``timeout_s``
        has passed. Bridged members' clients are told to let go either way (their broker
        membership ends with the proxy), meanwhile (:meth:`.bridged.Bridges.let_go`)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._let_bridged_go, timeout_s)
            if self.durability is not None:
                await self._step_down(timeout_s)
            else:
                await self._hand_off(timeout_s)

    async def _let_bridged_go(self, timeout_s: float) -> None:
        members = len(self.bridges.members)
        if not members:
            self.bridges.stopping = True
            return
        untold = await self.bridges.let_go(timeout_s)
        log.info("stopping: %d of %d bridged member(s) told to let go of their partitions%s",
                 members - untold, members,
                 f"; {untold} not heard from within {timeout_s:.1f}s" if untold else "")

    async def _hand_off(self, timeout_s: float) -> None:
        self.hand_off.start(self.engine)
        for key, held in list(self.held_joins.items()):
            held.resolve(JoinGroupResponse(error_code=int(ErrorCode.UNKNOWN_MEMBER_ID),
                                           member_id=key[1]))
            self.hand_off.told(*key)
        for key, held_sync in list(self.held_syncs.items()):
            held_sync.resolve(SyncGroupResponse(error_code=int(ErrorCode.UNKNOWN_MEMBER_ID)))
            self.hand_off.told(*key)
        members = len(self.hand_off.pending)
        untold = await self.hand_off.wait(timeout_s)
        log.info("handing off %d group(s): %d of %d member(s) told to let go of their "
                 "partitions%s", len(self.engine.groups), members - untold, members,
                 f"; {untold} not heard from within {timeout_s:.1f}s" if untold else "")

    async def _step_down(self, timeout_s: float) -> None:
        assert self.durability is not None
        self.stepping_down = True
        for group_id in {key[0] for key in (*self.held_joins, *self.held_syncs)}:
            self._answer_held(group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        await self.durability.flush(timeout_s)
        groups = list(self.memberships)
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for membership in list(self.memberships.values()):
                    nursery.start_soon(membership.leave)
        self._stepped_down.update(groups)
        for group_id in groups:
            self.durability.release(group_id)
            self.apply(self.engine.forget(group_id, "this proxy is stopping"))
            # the view named this sidecar: dropped, so that requests read before the drain
            # and decided after this look the group up and are relayed to the next
            # coordinator once one holds it (until then COORDINATOR_NOT_AVAILABLE,
            # :mod:`.stages.stepped_down`); the drain reads no new request
            self.directory.forget(group_id)
        self.memberships.clear()
        log.info("stepping down: %d group(s) written and left for the next coordinator to "
                 "load", len(groups))

    def stepped_down_from(self, group_id: str, member_id: str) -> bool:
        """Whether a request of ``member_id`` for ``group_id`` must be answered
        COORDINATOR_NOT_AVAILABLE: this sidecar is stopping, stepped down from the group (its
        state is written and left for the next coordinator to load) and no longer serves it,
        and the member id is not a broker's. Passed to the broker, whose group of that id is
        the fleet's lock, an engine member's commit or heartbeat would be answered
        UNKNOWN_MEMBER_ID, and the client would drop its partitions and rejoin under a new
        member id while the next coordinator loads it with the old one; answered this way, it
        keeps them until it reaches the next coordinator (its sidecar's connections close
        when the drain ends)."""
        return (self.stepping_down and group_id in self._stepped_down and bool(member_id)
                and not issued_by_a_broker(member_id) and not self.claims(group_id))

    def to_let_go(self, group_id: str, member_id: str) -> bool:
        """Whether ``member_id`` must be told to let go of its partitions of ``group_id``
        (answered UNKNOWN_MEMBER_ID): the group's lease was cut off, the broker may have given
        the group to another sidecar, and the member has not been told yet. A lease that
        has just been cut off (:meth:`BrokerMembership.lease_expired`) counts at once."""
        membership = self.memberships.get(group_id)
        if membership is not None:
            membership.lease_expired()
        return self.hand_off.to_tell(group_id, member_id)

    async def aclose(self) -> None:
        """Leave every broker-side group (so direct clients can take over) and stop."""
        with trio.CancelScope(shield=True):
            if self.journal is not None:
                await self.journal.drain(JOURNAL_DRAIN_SECONDS)
            async with trio.open_nursery() as nursery:
                for membership in list(self.memberships.values()):
                    nursery.start_soon(membership.leave)
            self.memberships.clear()
            await self.bridges.aclose()
            metrics.unwatch_coordination(self._metrics_view)
            await self.pool.aclose()
            if self.durability is not None:
                await self.durability.aclose()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def now_ms(self) -> int:
        return int(trio.current_time() * 1000)

    def request_arrived(self, group_id: str, member_id: str) -> bool:
        """A request of ``member_id`` starts waiting in this sidecar: its session stops until
        :meth:`request_left` (:mod:`.inside`); False if the engine does not know the member
        (nothing to release then)."""
        group = self.engine.group(group_id)
        if group is None or member_id not in group.members:
            return False
        self.engine.request_arrived(group_id, member_id, self.now_ms())
        return True

    def request_left(self, group_id: str, member_id: str) -> None:
        self.apply(self.engine.request_left(group_id, member_id, self.now_ms()))

    # -- which groups the proxy coordinates ---------------------------------------------------

    def claims(self, group_id: str) -> bool:
        """Whether the proxy coordinates ``group_id``, is taking it over, still has it in
        its engine, still tells its members to let go, or runs bridged members in the
        broker's group of that id (a request for it must be decoded, never passed to the
        broker as it is, nor relayed)."""
        return (group_id in self.memberships or group_id in self.engine.groups
                or self.hand_off.telling(group_id) or self.bridges.has_group(group_id))

    def engine_claims(self, group_id: str) -> bool:
        """:meth:`claims`, bridged members aside: the engine has (or is getting) the group."""
        return (group_id in self.memberships or group_id in self.engine.groups
                or self.hand_off.telling(group_id))

    def coordinates(self, group_id: str) -> bool:
        membership = self.memberships.get(group_id)
        return membership is not None and membership.established

    def broker_of(self, group_ids: Sequence[str]) -> Address | None:
        """The broker coordinating the first of ``group_ids`` whose broker group this proxy
        holds (None: it holds none of them)."""
        for group_id in group_ids:
            membership = self.membership(group_id)
            if membership is not None and membership.coordinator is not None:
                return membership.coordinator
        return None

    def membership(self, group_id: str) -> BrokerMembership | None:
        membership = self.memberships.get(group_id)
        return membership if membership is not None and membership.established else None

    @property
    def has_groups(self) -> bool:
        return bool(self.engine.groups)

    # -- ConsumerGroupHeartbeat ---------------------------------------------------------------

    async def heartbeat(self, request: ConsumerGroupHeartbeatRequest
                        ) -> ConsumerGroupHeartbeatResponse:
        group_id = request.group_id
        arrived = trio.current_time()
        if (releasing := self._releasing_heartbeat(request)) is not None:
            return releasing
        if (bridged := await self._bridged_heartbeat(request)) is not None:
            return bridged
        if (admitted := await self.funnel.admit(
                group_id, request.member_id, load=False,
                decide=self.heartbeat_wait_s if request.member_epoch > 0 else None,
                hand_off_error=(ErrorCode.COORDINATOR_NOT_AVAILABLE if request.member_epoch == 0
                                else ErrorCode.UNKNOWN_MEMBER_ID))) is not None:
            return ConsumerGroupHeartbeatResponse(error_code=int(admitted.error),
                                                  error_message=admitted.message)
        if request.member_epoch == 0 and group_id and group_id.strip():
            refused: list[Effect] = []
            try:  # a join the engine refuses must not take the broker's group over
                self.engine.check_heartbeat(request, refused)
            except GroupError as exc:
                self.apply(refused)
                return ConsumerGroupHeartbeatResponse(error_code=int(exc.code),
                                                      error_message=exc.message)
            failure: NotTaken | None = None
            with trio.move_on_after(self.heartbeat_wait_s) as waiting:
                failure = await self._take_over(group_id, request.subscribed_topic_names or ())
            if waiting.cancelled_caught:
                # e.g. the broker waits for a stale member of a killed proxy to time out
                return ConsumerGroupHeartbeatResponse(
                    error_code=int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
                    error_message=f"groupgate is still joining the broker's group {group_id}")
            if failure is not None:
                self._not_taken(group_id, failure)
                if failure.direct:
                    return await self._bridge(request, arrived)
                return ConsumerGroupHeartbeatResponse(
                    error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                    error_message=f"groupgate cannot coordinate group {group_id}: {failure}")
            if left := self.loading(group_id):
                return ConsumerGroupHeartbeatResponse(
                    error_code=int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
                    error_message=f"group {group_id} was taken over from another "
                                  f"coordinator; assigning in {left:.1f} s")
            await self._await_topics(request)
            if self.hand_off.active:  # the proxy began to stop while this join waited
                return ConsumerGroupHeartbeatResponse(
                    error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                    error_message="groupgate is handing its groups off")
            if self.funnel.not_coordinating(group_id) or not self.coordinates(group_id):
                # the lease ran out (or was lost) while this join waited
                return ConsumerGroupHeartbeatResponse(
                    error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                    error_message=f"groupgate is not holding the broker's group {group_id} "
                                  "now")
        elif (waited := await self.load_for_member(
                group_id, request.member_id, request.subscribed_topic_names or (),
                wait_s=self.heartbeat_wait_s)) is not None:
            return ConsumerGroupHeartbeatResponse(
                error_code=int(waited),
                error_message=(f"Group {group_id} is not coordinated here (any more); rejoin."
                               if waited == ErrorCode.UNKNOWN_MEMBER_ID
                               else f"groupgate is taking group {group_id} over"))
        elif self.funnel.not_coordinating(group_id):  # the lease ran out during a takeover wait
            return ConsumerGroupHeartbeatResponse(
                error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                error_message=f"groupgate is not holding the broker's group {group_id} now")
        elif request.member_epoch > 0 and self.engine.group(group_id) is None:
            # The group is unknown here (e.g. the proxy restarted and lost its state): the
            # member must rejoin with epoch 0. Kafka would say GROUP_ID_NOT_FOUND, which
            # clients treat as fatal; its coordinators never forget a group.
            return ConsumerGroupHeartbeatResponse(
                error_code=int(ErrorCode.UNKNOWN_MEMBER_ID),
                error_message=f"Group {group_id} is not coordinated here (any more); rejoin.")
        response, effects = self.engine.heartbeat(request, self.now_ms())
        self.apply(effects)
        if response.error_code:
            self._release_if_unused(group_id)
        self._refresh_if_unknown(request.subscribed_topic_names or ())
        if (unanswered := await self.funnel.answer(
                group_id, response.member_id or request.member_id,
                confirms=response.error_code == ErrorCode.NONE and request.member_epoch >= 0)
                ) is not None:
            return ConsumerGroupHeartbeatResponse(error_code=int(unanswered.error),
                                                  error_message=unanswered.message)
        return response

    async def _bridged_heartbeat(self, request: ConsumerGroupHeartbeatRequest
                                 ) -> ConsumerGroupHeartbeatResponse | None:
        """A heartbeat of a bridged member, or a KIP-848 join of a group that is in the broker
        phase here (it has bridged members already); None: neither (:mod:`.bridged`)."""
        answer = await self.bridges.heartbeat(request, self.heartbeat_wait_s)
        if answer is not None:
            return answer
        group_id = request.group_id
        if (request.member_epoch != 0 or not self.bridges.has_group(group_id)
                or group_id in self.memberships):
            return None
        refused: list[Effect] = []
        try:
            self.engine.check_heartbeat(request, refused)
        except GroupError as exc:
            self.apply(refused)
            return ConsumerGroupHeartbeatResponse(error_code=int(exc.code),
                                                  error_message=exc.message)
        return await self._bridge(request, trio.current_time())

    async def _bridge(self, request: ConsumerGroupHeartbeatRequest, arrived: float
                      ) -> ConsumerGroupHeartbeatResponse:
        """A KIP-848 member joining a group whose broker group has members connected straight
        to the broker: it gets a bridged member there (decision record 0018); the heartbeat
        waits for its first assignment until :attr:`heartbeat_wait_s` after it ``arrived``.
        With a ``migration-policy`` that forbids upgrades (``disabled``, ``downgrade``) it is
        refused as Kafka refuses a KIP-848 member into a classic group it may not upgrade:
        GROUP_ID_NOT_FOUND; a member the engine had when the group was handed back is not
        (:meth:`.release.ReleaseBook.had_consumer`: it takes part in the broker's group)."""
        group_id = request.group_id
        policy = self.engine.config.migration_policy
        if not policy.upgrade_enabled and not self.releases.had_consumer(
                group_id, request.member_id, trio.current_time()):
            metrics.BRIDGED_MEMBERS.labels("refused").inc()
            return ConsumerGroupHeartbeatResponse(
                error_code=int(ErrorCode.GROUP_ID_NOT_FOUND),
                error_message=f"Cannot upgrade the classic group {group_id} to a consumer "
                              f"group: migration-policy is {policy.value} (the broker's "
                              "classic coordinator holds it)")
        if not self.bridges.has_group(group_id):
            metrics.BROKER_PHASE_GROUPS.inc()
            log.warning("group %s: in the broker phase here: clients connected straight to the "
                        "broker hold its group; KIP-848 members join it as bridged classic "
                        "members until they are gone", group_id)
        if request.subscribed_topic_regex:  # resolved against every topic: list them first
            await self._await_subscription(group_id, (), request.subscribed_topic_regex,
                                           min(TOPIC_WAIT_SECONDS, self.heartbeat_wait_s))
        wait_s = max(0.0, arrived + self.heartbeat_wait_s - trio.current_time())
        return await self.bridges.join(request, wait_s)

    def _not_taken(self, group_id: str, failure: NotTaken) -> None:
        """A takeover failed: if another sidecar holds the group, the members of a cut-off
        lease still to be told are routed to it from now on, and it decides (it knows them
        from the state log, or tells them to rejoin)."""
        if failure.kind == "lost-election":
            self.hand_off.release(group_id)

    def _release_if_unused(self, group_id: str) -> None:
        """A broker membership started for a join the engine then refused, with no engine
        group to expire it later: give the broker's group back now."""
        if self.engine.group(group_id) is not None or self.hand_off.active:
            return
        membership = self.memberships.pop(group_id, None)
        if membership is not None and self._nursery is not None:
            log.info("group %s: the join that started it was refused; leaving the broker's "
                     "group", group_id)
            self._nursery.start_soon(membership.leave)

    async def take_over_converting(self, snapshot: ClassicGroupSnapshot,
                                   leaving: Sequence[tuple[str, str | None]]) -> NotTaken | None:
        """Take the broker's group over for an online upgrade (:mod:`.upgrade`): its members
        ``leaving`` are removed by a LeaveGroup sent back to back with the lock's JoinGroup, and
        once the lock is held the engine adopts ``snapshot``. Returns why not, or None."""
        topics = {t for m in snapshot.members for p in m.protocols[:1]
                  if p.subscription is not None for t in p.subscription.topics}
        return await self._take_over(snapshot.group_id, sorted(topics),
                                     converting=(snapshot, leaving))

    async def _take_over(self, group_id: str, topics: Iterable[str], *, to_load: bool = False,
                         converting: tuple[ClassicGroupSnapshot,
                                           Sequence[tuple[str, str | None]]] | None = None
                         ) -> NotTaken | None:
        """Hold the broker's group ``group_id`` (subscribed to the group's topics, at first
        ``topics``, those of the member that starts the group); returns why not, or None.
        ``to_load``: started for a member's request rather than a join (:meth:`may_load`): if
        the state log has no member of the group, the broker's group is given back at once
        (kind ``nothing-loaded``)."""
        membership = self.memberships.get(group_id)
        if membership is None:
            if self.hand_off.active or self.stepping_down:
                return NotTaken("the proxy is stopping", "unavailable")
            if converting is None and self.releases.native(group_id, trio.current_time()):
                return NotTaken("the group was handed to the broker's KIP-848 coordinator",
                                "native")
            if converting is None and self.releases.get(group_id, trio.current_time()):
                # handed back here: the broker's classic coordinator keeps it (even while its
                # group is Empty); KIP-848 members are bridged, classic ones forwarded
                return NotTaken("the group was handed back to the broker's classic "
                                "coordinator (groupgate release)", "refused", direct=True)
            if len(self.memberships) >= self.config.max_groups:
                return NotTaken(f"the proxy coordinates its maximum of "
                                f"{self.config.max_groups} groups (max-groups)")
            if converting is None and (native := await self._native_at_broker(group_id)):
                return native
            membership = self.memberships.get(group_id)
        if membership is None:
            assert self._nursery is not None
            first = tuple(topics)
            membership = BrokerMembership(
                group_id, self.pool, self.config.upstream,
                connect_timeout=self.config.connect_timeout,
                topics=lambda: self.group_topics(group_id) or first,
                session_timeout_ms=self.config.broker_session_timeout_ms,
                card=self.card, leave_first=converting[1] if converting else ())
            self.adopt(membership, to_load=to_load)
            if converting is not None:
                snapshot = converting[0]
                membership.on_established = lambda: adopt_snapshot(self, snapshot)
            self._nursery.start_soon(self._run_membership, membership)
        await membership.settled.wait()
        if membership.failure is not None:
            if self.memberships.get(group_id) is membership:
                del self.memberships[group_id]
            self.directory.forget(group_id)
            kind = ("nothing-loaded" if membership in self._nothing_loaded
                    else membership.failure_kind or "unavailable")
            return NotTaken(membership.failure, kind, membership.direct_members)
        return None

    async def _established(self, membership: BrokerMembership, to_load: bool = False) -> None:
        """The broker's group is held for the first time: with the state log, load the
        group's state (members keep their ids, epochs and partitions); if there is none (or
        some of it could not be loaded) and another coordinator may have served the group,
        wait before assigning (``takeover-wait-ms``, :meth:`_start_loading`): the log may be
        another one (a sidecar with other state-log settings), or lost. No wait when the log
        shows the group deleted by a coordinator writing it. A takeover started ``to_load`` a
        member's group that loads no member raises :class:`NothingLoaded`: the membership
        leaves the broker's group (whoever started it is answered UNKNOWN_MEMBER_ID, whoever
        else waits the retriable COORDINATOR_NOT_AVAILABLE)."""
        group_id = membership.group_id
        if self.durability is not None:
            loaded = await self.durability.take_over(group_id)
            self.apply(loaded.effects)
            self.drop_told_members(group_id, self.hand_off.told_members(group_id))
            group = self.engine.group(group_id)
            if to_load and (group is None or not group.members):
                self._give_back_unloaded(membership)
                raise NothingLoaded(f"the state log has no member of group {group_id}; "
                                    "giving the broker's group back")
            if loaded.records and self.journal is not None and self.observer is not None:
                self.journal.record_all(self.observer.snapshot(group_id, wall_ms()))
            if loaded.deleted or (loaded.records and not loaded.skipped):
                return
        self._start_loading(membership)

    def _give_back_unloaded(self, membership: BrokerMembership) -> None:
        """Undo a takeover whose load found no member (before the membership leaves): stop
        writing the group, forget what was loaded of it, and free its place at once, even if
        whoever started the takeover has stopped waiting for it."""
        group_id = membership.group_id
        self._nothing_loaded.add(membership)
        log.info("group %s: taken over to load a member's state, but the state log has no "
                 "member of it; giving the broker's group back", group_id)
        if self.durability is not None:
            self.durability.release(group_id)
        if self.engine.group(group_id) is not None:
            self.apply(self.engine.forget(group_id, "no member in the state log"))
        if self.memberships.get(group_id) is membership:
            del self.memberships[group_id]
        self._loading.pop(group_id, None)
        self.directory.forget(group_id)

    async def refresh_topics(self, names: Iterable[str]) -> None:
        """Topic metadata for ``names`` (a group about to be converted: its members' topics
        must be in the image, or their partitions would not be adopted)."""
        await self._await_subscription("", names, None)

    async def _refresh_for_load(self, names: Iterable[str], regex: bool) -> None:
        """Topic metadata for a group about to be loaded: its members' topics must be in the
        image, or the load would see them as deleted."""
        await self._await_subscription("", names, "." if regex else None)

    def _state_lost(self, group_id: str, reason: str) -> None:
        """The group's state could not be written: give the group up (leave the broker's
        group), so that it is taken over again from what the log holds."""
        membership = self.memberships.get(group_id)
        if membership is None:
            return
        self._membership_lost(membership, reason)
        if self._nursery is not None:
            self._nursery.start_soon(membership.leave)

    async def taken_over(self, group_id: str, wait_s: float = TAKEOVER_WAIT_SECONDS
                         ) -> ErrorCode | None:
        """If the broker's group ``group_id`` is being taken over (its state loaded), wait
        for that (``wait_s`` at most); the error to answer with if it failed or takes too
        long, else None."""
        membership = self.memberships.get(group_id)
        if membership is None:
            return None
        if not membership.settled.is_set():
            with trio.move_on_after(wait_s):
                await membership.settled.wait()
        if not membership.settled.is_set():
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if membership.failure is not None:  # failed at first, or lost since
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return None

    def _start_loading(self, membership: BrokerMembership) -> None:
        """A group just taken over: if another groupgate may have coordinated it until
        moments ago, its members may still consume what it assigned them, and nothing here
        says what that was. Joins wait ``takeover-wait-ms`` (by default one session timeout,
        after which Kafka too gives a silent member's partitions away); members of the old
        coordinator meanwhile hear UNKNOWN_MEMBER_ID and let go. Not needed for a group that
        never had members (its broker generation was 0), or whose last holder this sidecar
        saw was the broker's own coordinator (direct classic members, rolled onto the proxy)."""
        group_id = membership.group_id
        wait = self.config.takeover_wait_seconds
        if membership.previous_generation <= 0 or wait <= 0:
            return
        if self.directory.last_kind(group_id) == "broker":
            return
        self._loading[group_id] = trio.current_time() + wait
        log.warning("group %s: taken over (broker generation %d before); joins wait %.1f s "
                    "(takeover-wait-ms) for members of an earlier coordinator to let go",
                    group_id, membership.previous_generation, wait)

    def loading(self, group_id: str) -> float:
        """Seconds joins of ``group_id`` still wait after a takeover (0: none)."""
        until = self._loading.get(group_id)
        if until is None:
            return 0.0
        left = until - trio.current_time()
        if left <= 0:
            del self._loading[group_id]
            return 0.0
        return left

    def adopt(self, membership: BrokerMembership, *, to_load: bool = False) -> None:
        """Keep ``membership`` as the proxy's hold on its group, and follow its
        interruptions (``to_load``: see :meth:`_take_over`)."""
        group_id = membership.group_id
        membership.on_interrupted = (
            lambda interrupted: self._membership_interrupted(group_id, interrupted))
        membership.on_lost = lambda reason: self._membership_lost(membership, reason)
        membership.on_established = lambda: self._established(membership, to_load)
        self.memberships[group_id] = membership

    def _membership_lost(self, membership: BrokerMembership, reason: str) -> None:
        """The lease on the broker's group is gone for good (another sidecar won it, or the
        broker dropped the proxy's member): forget the group at once; its members' next
        requests find the group's holder and rejoin there. If the broker did not answer for a
        whole session (cut off), they cannot find it through this sidecar, and another
        sidecar may be handing their partitions out: each is told to let go first
        (:meth:`_tell_to_let_go`)."""
        group_id = membership.group_id
        if membership.cut_off:
            self._tell_to_let_go(group_id, reason)
        if self.memberships.get(group_id) is membership:
            del self.memberships[group_id]
        self._loading.pop(group_id, None)
        self.directory.forget(group_id)
        self.apply(self.engine.forget(group_id, reason))
        if self.durability is not None:
            self.durability.release(group_id)

    def drop_told_members(self, group_id: str, member_ids: Iterable[str]) -> None:
        """Members of ``group_id`` told to let go after its lease was cut off whom the
        engine has again (this sidecar held the group again within the bound and loaded it from
        the state log, written before the cut): each has dropped its partitions and rejoins (a
        classic member under a new member id), so the engine fences it now (reason
        ``let-go``) instead of keeping its partitions for it until its session ends. Static
        members are kept: they rejoin under their instance id and take their place back."""
        group = self.engine.group(group_id)
        if group is None or self.hand_off.active:
            return
        for member_id in member_ids:
            member = group.members.get(member_id)
            if member is None or member.instance_id is not None:
                continue
            meta = member.classic
            epoch = (meta.generation if meta is not None and meta.generation >= 0
                     else member.member_epoch)
            error, effects = self.engine.fence_member(group_id, member_id, epoch, "let-go",
                                                      self.now_ms())
            self.apply(effects)
            if error is ErrorCode.NONE:
                log.info("group %s: member %s fenced (let-go): told to let go when the lease "
                         "was cut off, it rejoins afresh", group_id, member_id)

    def _tell_to_let_go(self, group_id: str, reason: str) -> None:
        """The members ``group_id`` has now are answered UNKNOWN_MEMBER_ID on their next
        request (held ones at once), for at most one member session; the engine forgets the
        group (in :meth:`_membership_lost`), so that nothing of it is resumed if the broker
        answers again: the state log, or whoever holds the group then, decides."""
        group = self.engine.group(group_id)
        if group is None:
            return
        bound_ms = max([self.config.group_session_timeout_ms]
                       + [m.session_timeout_ms or 0 for m in group.members.values()])
        self.hand_off.lose_group(group_id, group.members, trio.current_time() + bound_ms / 1000)
        log.warning("group %s: %s; its %d member(s) are told to let go of their partitions "
                    "(for up to %.1f s)", group_id, reason, len(group.members), bound_ms / 1000)
        for key, held in list(self.held_joins.items()):
            if key[0] == group_id:
                held.resolve(JoinGroupResponse(error_code=int(ErrorCode.UNKNOWN_MEMBER_ID),
                                               member_id=key[1]))
                self.hand_off.told(*key)
        for key, held_sync in list(self.held_syncs.items()):
            if key[0] == group_id:
                held_sync.resolve(SyncGroupResponse(
                    error_code=int(ErrorCode.UNKNOWN_MEMBER_ID)))
                self.hand_off.told(*key)

    def _membership_interrupted(self, group_id: str, interrupted: bool) -> None:
        """The proxy lost (or regained) its hold on the broker's group: while it does not
        hold it, it is not the group's coordinator and the engine's timers for the group
        wait (members keep their partitions, as with a Kafka coordinator failover)."""
        if interrupted:
            log.warning("group %s: not holding the broker's group; its members are answered "
                        "COORDINATOR_NOT_AVAILABLE until it is held again", group_id)
            self.engine.suspend(group_id)
        else:
            log.info("group %s: holding the broker's group again; every member gets a full "
                     "session timeout from now", group_id)
            self.apply(self.engine.resume(group_id, self.now_ms()))

    async def lease_cut_off(self, group_id: str) -> None:
        """Return once the lease this sidecar holds now on ``group_id`` is cut off: the broker
        did not answer for a whole session (never, if it holds none, or if it is lost or
        left otherwise: the broker answers then)."""
        membership = self.memberships.get(group_id)
        if membership is None:
            await trio.sleep_forever()
        else:
            await membership.wait_cut_off()

    def group_topics(self, group_id: str) -> set[str]:
        """The topic names group ``group_id`` subscribes to (names and regex matches)."""
        group = self.engine.group(group_id)
        if group is None:
            return set()
        names = set(group.subscribed_names)
        for resolved in group.resolved_regex.values():
            names.update(resolved)
        return names

    async def delete_group(self, group_id: str) -> ErrorCode:
        """DeleteGroups of a group the proxy may coordinate: refused while it has members,
        else the engine forgets it and the proxy leaves the broker's group, so that the
        broker can delete the group and its offsets."""
        error, effects = self.engine.delete_group(group_id)
        self.apply(effects)
        if error != ErrorCode.NONE:
            return error
        membership = self.memberships.pop(group_id, None)
        if membership is not None:
            await self._give_up(group_id, membership)
        return ErrorCode.NONE

    async def _give_up(self, group_id: str, membership: BrokerMembership) -> None:
        """The engine is done with the group (deleted, expired, handed back): once its last
        records (tombstones) are written, stop writing it and leave the broker's group."""
        if self.durability is not None:
            await self.durability.settled(group_id)
            self.durability.release(group_id)
        await membership.leave()

    async def _await_topics(self, request: ConsumerGroupHeartbeatRequest) -> None:
        await self._await_subscription(request.group_id, request.subscribed_topic_names or (),
                                       request.subscribed_topic_regex,
                                       min(TOPIC_WAIT_SECONDS, self.heartbeat_wait_s))

    async def _await_subscription(self, group_id: str, topic_names: Iterable[str],
                                  regex: str | None,
                                  wait_s: float = TOPIC_WAIT_SECONDS) -> None:
        image = self.engine.image
        names = [n for n in topic_names if n not in image.by_name]
        group = self.engine.group(group_id)
        new_regex = bool(regex) and (group is None or regex not in group.regex_counts)
        if not names and not new_regex:
            return
        for n in names:
            self._pending_names[n] = self._pending_names.get(n, 0) + 1
        self._pending_regex += new_regex
        try:
            await self.topics.refresh(wait_s)
        finally:
            for n in names:
                left = self._pending_names[n] - 1
                if left:
                    self._pending_names[n] = left
                else:
                    del self._pending_names[n]
            self._pending_regex -= new_regex

    def _refresh_if_unknown(self, names: Iterable[str]) -> None:
        if any(n not in self.engine.image.by_name for n in names):
            assert self._nursery is not None
            self._nursery.start_soon(self.topics.refresh, TOPIC_WAIT_SECONDS)

    # -- classic members (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) ------------------------

    def broker_group_active(self, group_id: str) -> bool:
        """Whether the broker's own group ``group_id`` has members that are not sidecars:
        the broker refused the proxy's membership when it last tried to take the group over
        (remembered for :data:`BROKER_ACTIVE_SECONDS`), or the directory saw members of
        another protocol holding it (clients connected straight to the broker)."""
        if group_id in self._broker_active:
            return True
        view = self.directory.view(group_id)
        return view is not None and view.kind == "broker"

    def serves_classic(self, group_id: str, member_id: str = "") -> bool:
        """Whether SyncGroup, Heartbeat and LeaveGroup of ``group_id`` are the engine's: the
        engine has the group, the proxy holds the broker's group of that id or is taking it
        over, or (with the state log) ``member_id`` is a member the log may know of a group
        free at the broker (:meth:`may_load`)."""
        if self.classic is None or self.released(group_id):
            return False
        return (self.engine.group(group_id) is not None or group_id in self.memberships
                or self.to_let_go(group_id, member_id) or self.may_load(group_id, member_id))

    def may_load(self, group_id: str, member_id: str) -> bool:
        """Whether a request of member ``member_id`` for ``group_id``, which this sidecar does
        not hold, should take the group over to load its state: the state log is on, the
        broker's group shows that a sidecar may have held it (``free``: emptied by its
        coordinator dying or leaving; or held by this sidecar's own former member), and the
        member id is not one a broker gave (a member of the broker's own group, e.g. Kafka
        Connect). The broker would refuse the member; the log may know it. A group the broker
        shows as never held by members of protocol type ``consumer`` (``unused``: Dead, e.g.
        a made-up group id) is never taken over for a member's request."""
        if (self.durability is None or not member_id or issued_by_a_broker(member_id)
                or self.claims(group_id) or self.hand_off.active or self.stepping_down
                or self.releases.get(group_id, trio.current_time()) is not None):
            return False
        view = self.directory.view(group_id)
        return view is not None and view.kind in ("free", "sidecar")

    async def load_for_member(self, group_id: str, member_id: str,
                              topics: Iterable[str] = (),
                              wait_s: float = TAKEOVER_WAIT_SECONDS) -> ErrorCode | None:
        """A member's request for a group not held here (:meth:`may_load`): take it over
        (loading its state) first; the error to answer with if that failed: UNKNOWN_MEMBER_ID
        if the state log has no member of the group (the broker's group was given back at
        once; the member must join afresh). The one place every API's request takes a group
        over for a member (ConsumerGroupHeartbeat with epoch != 0, classic JoinGroup with a
        member id, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit)."""
        if self.claims(group_id) or not self.may_load(group_id, member_id):
            return await self.taken_over(group_id, wait_s)
        with trio.move_on_after(wait_s) as waiting:
            failure = await self._take_over(group_id, topics, to_load=True)
        if waiting.cancelled_caught:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if failure is not None and failure.kind == "nothing-loaded":
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.COORDINATOR_NOT_AVAILABLE if failure is not None else None

    def takes_join(self, request: JoinGroupRequest) -> bool:
        """Whether the engine takes this classic JoinGroup (else it is forwarded to the broker,
        with the member mark: :mod:`.upgrade`)."""
        if self.classic is None:
            return False
        group_id = request.group_id
        if not group_id.strip() or self.released(group_id):
            return False
        if self.to_let_go(group_id, request.member_id):
            return True  # to be told to let go (join_group answers UNKNOWN_MEMBER_ID)
        group = self.engine.group(group_id)
        coordinated = self.coordinates(group_id)
        if (request.member_id and not coordinated and (group is None or not group.members)
                and not self._issued(group_id, request.member_id)
                and not issued_by_a_proxy(request.member_id)):
            # A member id the engine did not hand out, for a group it does not serve: the
            # member belongs to the broker's group.
            self._passed_through(request, "a member of the broker's own group")
            return False
        active = not coordinated and self.broker_group_active(group_id)
        routing = classify_classic_join(self.engine, request, broker_group_active=active)
        if not routing.to_engine:
            self._passed_through(request, routing.reason)
        return routing.to_engine

    def _passed_through(self, request: JoinGroupRequest, reason: str) -> None:
        """Tell the journal that a group's JoinGroup went to the broker, and why."""
        if self.journal is None or self.observer is None:
            return
        protocols = request.protocols
        self.journal.record_all(self.observer.passed_through(
            request.group_id, reason, wall_ms(), protocol_type=request.protocol_type,
            assignor=protocols[0].name if protocols else None,
            client_id=request.client_id or "", client_host=request.client_host or ""))

    def _issued(self, group_id: str, member_id: str) -> bool:
        return (group_id, member_id) in self._issued_ids

    def _remember_issued(self, group_id: str, member_id: str) -> None:
        self._issued_ids[(group_id, member_id)] = True

    def _note_short_classic_session(self, group_id: str, session_ms: int) -> None:
        """A classic member brings its own session (``session.timeout.ms``); with a fleet, one
        shorter than a failover of the coordinating sidecar may take (docs/operations.md,
        "How long a request can wait") is accepted as Kafka accepts it, and logged once per
        group: a client that times its own session (librdkafka) gives its partitions up when
        the holder dies and rejoins. The engine does not fence it for the failover (a loaded
        member gets a full session from the load)."""
        if self.config.fleet_listen is None:
            return
        needed = shortest_classic_fleet_session_ms(self.config.broker_session_timeout_ms)
        if session_ms >= needed or group_id in self._short_sessions_noted:
            return
        self._short_sessions_noted[group_id] = True
        log.warning("group %s: a classic member joined with session.timeout.ms=%d, shorter than "
                    "a failover of the coordinating sidecar may leave it unanswered (its "
                    "heartbeat interval + broker-session-timeout-ms + the takeover + the wait "
                    "at its own sidecar: at least %d ms plus its heartbeat interval): when the "
                    "holder dies, a client that times its own session (librdkafka) gives its "
                    "partitions up and rejoins; raise the client's session.timeout.ms",
                    group_id, session_ms, needed)

    async def join_group(self, request: JoinGroupRequest) -> JoinGroupResponse:
        """A classic JoinGroup the engine takes (:meth:`takes_join`); waits while held."""
        classic = self.classic
        assert classic is not None
        group_id = request.group_id
        self._note_short_classic_session(group_id, request.session_timeout_ms)
        known = request.member_id != UNKNOWN_MEMBER_ID
        if (refused := await self.funnel.admit(
                group_id, request.member_id, load=False,
                decide=float("inf") if request.member_id else None,  # may own partitions
                hand_off_error=(ErrorCode.UNKNOWN_MEMBER_ID if known
                                else ErrorCode.COORDINATOR_NOT_AVAILABLE))) is not None:
            return JoinGroupResponse(error_code=int(refused.error), member_id=request.member_id,
                                     error_message=refused.message)
        if (request.member_id and self.engine.group(group_id) is None
                and not self._issued(group_id, request.member_id)):
            # A member of a coordinator that is gone: with the state log, it may know it.
            waited = await self.load_for_member(group_id, request.member_id)
            if waited is not None:
                return JoinGroupResponse(error_code=int(waited), member_id=request.member_id)
        if (request.member_id and self.engine.group(group_id) is None
                and not self._issued(group_id, request.member_id)):
            # a member of a proxy that is gone (killed, restarted): it must join afresh
            return JoinGroupResponse(
                error_code=int(ErrorCode.UNKNOWN_MEMBER_ID), member_id=request.member_id,
                error_message=f"Group {group_id} is not coordinated here (any more); rejoin.")
        if not self.coordinates(group_id):
            failure: NotTaken | None = None
            subscription = request.protocols[0].subscription if request.protocols else None
            with trio.move_on_after(TAKEOVER_WAIT_SECONDS) as waiting:
                failure = await self._take_over(
                    group_id, subscription.topics if subscription is not None else ())
            if waiting.cancelled_caught:
                return JoinGroupResponse(
                    error_code=int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
                    member_id=request.member_id,
                    error_message=f"groupgate is still joining the broker's group {group_id}")
            if failure is not None:
                self._not_taken(group_id, failure)
            if failure is not None and failure.kind != "refused":
                # Someone else leads the broker's group, or the broker could not be asked.
                # Retriable: the client's next request is looked up, and relayed to the
                # sidecar that holds the group, or passed to the broker if its own members
                # hold it (the directory tells them apart), or tried here again. Never sent
                # to the broker from here: next to a sidecar holding the group the client
                # would be a second coordinator's member.
                log.info("group %s: not coordinated here now: %s", group_id, failure)
                return JoinGroupResponse(
                    error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                    member_id=request.member_id,
                    error_message=f"groupgate cannot coordinate group {group_id} now: {failure}")
            if failure is not None:
                # Retriable: the client finds the coordinator again and its next JoinGroup is
                # forwarded to the broker, whose group it then joins.
                self._broker_active[group_id] = True
                log.info("group %s: stays with the broker for now: %s", group_id, failure)
                return JoinGroupResponse(
                    error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                    member_id=request.member_id,
                    error_message=f"groupgate cannot coordinate group {group_id}: {failure}")
        if left := self.loading(group_id):
            return JoinGroupResponse(
                error_code=int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
                member_id=request.member_id,
                error_message=f"group {group_id} was taken over from another coordinator; "
                              f"assigning in {left:.1f} s")
        subscription = request.protocols[0].subscription if request.protocols else None
        topics = subscription.topics if subscription is not None else ()
        await self._await_subscription(group_id, topics, None)
        if self.hand_off.active:  # the proxy began to stop while this join waited
            return JoinGroupResponse(
                error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE), member_id=request.member_id,
                error_message="groupgate is handing its groups off")
        if self.funnel.not_coordinating(group_id) or not self.coordinates(group_id):
            # the lease ran out (or was lost) while this join waited
            return JoinGroupResponse(
                error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE), member_id=request.member_id,
                error_message=f"groupgate is not holding the broker's group {group_id} now")
        response, effects = classic.join_group(request, self.now_ms())
        self.apply(effects)  # before holding: may answer this member's previous held join
        if self.releasing(group_id) and not any(
                ps for p in request.protocols[:1] if p.subscription is not None
                for _, ps in p.subscription.owned_partitions):
            # this join started a hand-back (a static replacement), or came in while one
            # started: its member owns nothing to give up
            self.releases.gave_up(group_id, response.member_id, trio.current_time())
        if not isinstance(response, HeldRequest):
            if response.error_code not in (int(ErrorCode.NONE),
                                           int(ErrorCode.MEMBER_ID_REQUIRED)):
                self._release_if_unused(group_id)
            self._refresh_if_unknown(topics)
            if response.error_code == int(ErrorCode.MEMBER_ID_REQUIRED):
                self._remember_issued(group_id, response.member_id)
            return await self._recorded_join(group_id, response)
        self._refresh_if_unknown(topics)
        member_id = response.member_id
        if self.releasing(group_id):  # this join started a hand-back (a static replacement)
            return JoinGroupResponse(error_code=int(ErrorCode.REBALANCE_IN_PROGRESS),
                                     member_id=member_id)
        held: Held[JoinGroupResponse] = Held()
        key = (group_id, member_id)
        self.held_joins[key] = held
        timeout_ms = (request.rebalance_timeout_ms if request.rebalance_timeout_ms > 0
                      else request.session_timeout_ms)
        try:
            answer = await held.wait(timeout_ms / 1000)
        finally:  # answered, timed out, or the client went away
            if self.held_joins.get(key) is held:
                del self.held_joins[key]
        if answer is None:
            return JoinGroupResponse(
                error_code=int(ErrorCode.REBALANCE_IN_PROGRESS), member_id=member_id,
                error_message="the group's assignment was not ready within the rebalance "
                              "timeout; rejoin")
        return await self._recorded_join(group_id, answer)

    async def _recorded_join(self, group_id: str, response: JoinGroupResponse
                             ) -> JoinGroupResponse:
        if (refused := await self.funnel.answer(
                group_id, response.member_id, confirms=response.error_code == ErrorCode.NONE)
                ) is not None:
            return JoinGroupResponse(error_code=int(refused.error), member_id=response.member_id,
                                     error_message=refused.message)
        return response

    async def sync_group(self, request: SyncGroupRequest) -> SyncGroupResponse:
        """A classic SyncGroup; waits while the engine holds it (the member waits for
        partitions that other members still own)."""
        assert self.classic is not None
        if (refused := await self.funnel.admit(request.group_id, request.member_id)) is not None:
            return SyncGroupResponse(error_code=int(refused.error))
        response, effects = self.classic.sync_group(request, self.now_ms())
        self.apply(effects)
        if not isinstance(response, HeldRequest):
            return await self._recorded_sync(request.group_id, request.member_id, response)
        held: Held[SyncGroupResponse] = Held()
        key = (request.group_id, request.member_id)
        self.held_syncs[key] = held
        try:  # the engine's hold timer answers first; this bound only guards against a leak
            answer = await held.wait(self.config.classic_sync_hold_ms / 1000 + SYNC_HOLD_SLACK)
        finally:
            if self.held_syncs.get(key) is held:
                del self.held_syncs[key]
        if answer is None:
            return SyncGroupResponse(
                error_code=int(ErrorCode.REBALANCE_IN_PROGRESS),
                error_message="the held SyncGroup was not answered in time; rejoin")
        return await self._recorded_sync(request.group_id, request.member_id, answer)

    async def _recorded_sync(self, group_id: str, member_id: str, response: SyncGroupResponse
                             ) -> SyncGroupResponse:
        if (refused := await self.funnel.answer(
                group_id, member_id, confirms=response.error_code == ErrorCode.NONE)) is not None:
            return SyncGroupResponse(error_code=int(refused.error), error_message=refused.message)
        return response

    async def classic_heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        assert self.classic is not None
        if (refused := await self.funnel.admit(request.group_id, request.member_id)) is not None:
            return HeartbeatResponse(error_code=int(refused.error))
        response, effects = self.classic.heartbeat(request, self.now_ms())
        self.apply(effects)
        if (refused := await self.funnel.answer(
                request.group_id, request.member_id,
                confirms=response.error_code == ErrorCode.NONE)) is not None:
            return HeartbeatResponse(error_code=int(refused.error), error_message=refused.message)
        return response

    async def leave_group(self, request: LeaveGroupRequest) -> LeaveGroupResponse:
        assert self.classic is not None
        first = request.members[0].member_id if request.members else ""
        # no wait for the lease, nobody told to let go first: the members leave
        if (refused := await self.funnel.admit(request.group_id, first, decide=None,
                                               tell=False)) is not None:
            return LeaveGroupResponse(error_code=int(refused.error))
        response, effects = self.classic.leave_group(request, self.now_ms())
        self.apply(effects)
        for member in request.members:
            self.funnel.handing_off(request.group_id, member.member_id)
        if (refused := await self.funnel.answer(request.group_id, first, confirms=False)
                ) is not None:
            log.info("group %s: LeaveGroup not answered: %s", request.group_id, refused.message)
            return LeaveGroupResponse(error_code=int(refused.error))
        return response

    # -- engine effects, timers, topics -------------------------------------------------------

    def apply(self, effects: list[Effect]) -> None:
        """The one place the effects of every engine call are handled (and, with the state
        log, what the call changed is queued to be written)."""
        if self.durability is not None:
            self.durability.submit(self.engine.drain_records(wall_ms()))
        if self.journal is not None and self.observer is not None:
            self.journal.record_all(self.observer.observe(effects, wall_ms()))
        left: set[str] = set()
        for effect in effects:
            if isinstance(effect, MemberJoined | GroupLoaded):
                self._note_consumer_members(effect.group_id)
            elif isinstance(effect, MemberLeft | MemberFenced | MemberReplaced):
                left.add(effect.group_id)  # (a classic static member replacing the last
                # KIP-848 one downgrades too, as in Kafka)
            elif isinstance(effect, GroupExpired | GroupLost | GroupHandedBack | GroupReleased):
                self._had_consumer_members.discard(effect.group_id)
        for effect in effects:
            if isinstance(effect, TimerArmed):
                self._timer_wake.set()
            elif isinstance(effect, GroupEpochBumped | GroupLoaded):
                if isinstance(effect, GroupEpochBumped):
                    metrics.REBALANCES.labels(metrics.rebalance_reason(effect.reason)).inc()
                # the group's topics may have changed (or were just loaded, after a JoinGroup
                # that could not name them yet): the broker keeps only the offsets of topics
                # its member advertises (KIP-211)
                membership = self.memberships.get(effect.group_id)
                if membership is not None:
                    membership.subscription_changed()
            elif isinstance(effect, JoinCompleted):
                held_join = self.held_joins.pop((effect.group_id, effect.member_id), None)
                if held_join is not None:
                    held_join.resolve(effect.response)
            elif isinstance(effect, SyncCompleted):
                held_sync = self.held_syncs.pop((effect.group_id, effect.member_id), None)
                if held_sync is not None:
                    held_sync.resolve(effect.response)
            elif isinstance(effect, GroupReleased):
                self._carry_over(effect)
            elif isinstance(effect, GroupHandedBack):
                log.info("group %s: handed back to the broker (%s)", effect.group_id,
                         effect.reason)
                membership = self.memberships.pop(effect.group_id, None)
                if membership is not None and self._nursery is not None:
                    self._nursery.start_soon(self._give_up, effect.group_id, membership)
            elif isinstance(effect, GroupLost):
                log.warning("group %s: forgotten: %s", effect.group_id, effect.reason)
                self._answer_held(effect.group_id, ErrorCode.NOT_COORDINATOR)
            elif isinstance(effect, GroupExpired):
                log.info("group %s: expired after staying empty", effect.group_id)
                membership = self.memberships.pop(effect.group_id, None)
                if membership is not None and self._nursery is not None:
                    self._nursery.start_soon(self._give_up, effect.group_id, membership)
            elif isinstance(effect, MemberTooLarge):
                log.warning("group %s: member %s refused (%s): its state record would be %d "
                            "bytes, the state log takes at most %d", effect.group_id,
                            effect.member_id or "(new)", effect.api, effect.record_bytes,
                            effect.limit)
                metrics.STATE_MEMBERS_TOO_LARGE.labels(effect.api).inc()
            elif isinstance(effect, MemberFenced):
                metrics.MEMBERS_FENCED.labels(metrics.fence_reason(effect.reason)).inc()
                log.info("%s", effect)
            elif isinstance(effect, DepartureWaitStarted):
                log.info("group %s: member %s left; the group's next assignment waits up to "
                         "%.1f s for its replacement (eager classic members)", effect.group_id,
                         effect.member_id, max(0, effect.until_ms - self.now_ms()) / 1000)
            elif isinstance(effect, DepartureWaitEnded):
                replaced = len(effect.arrived) >= len(effect.departed)
                metrics.DEPARTURE_WAITS.labels(
                    "replaced" if replaced else "not-replaced").inc()
                log.info("group %s: assigning after a departure wait of %.1f s: %d left (%s), "
                         "%d arrived (%s)", effect.group_id, effect.waited_ms / 1000,
                         len(effect.departed), ", ".join(effect.departed), len(effect.arrived),
                         ", ".join(effect.arrived) or "-")
            elif isinstance(effect, GroupCreated | MemberJoined | MemberLeft
                            | TargetAssignmentComputed | TargetAssignmentFailed):
                log.info("%s", effect)

        for group_id in left:
            self._downgrade_if_due(group_id)

    # -- hand-back to the broker's classic coordinator (release) -------------------------------

    def start_release(self, group_id: str, reason: str,
                      to: ReleaseTarget = ReleaseTarget.CLASSIC) -> str | None:
        """Start handing ``group_id`` back to the broker's classic coordinator, or ``to`` its
        KIP-848 one (:mod:`.release`, :mod:`.native_exit`); why not, or None (started, or
        under way already)."""
        now = trio.current_time()
        if self.releases.phase(group_id, now) is ReleasePhase.RELEASING:
            return None
        if self.classic is None:
            return "classic-translation is off: the broker's classic group cannot take over"
        if not self.engine.config.migration_policy.downgrade_enabled:
            return (f"migration-policy {self.engine.config.migration_policy.value} does not "
                    "allow a downgrade; roll downgrade (or bidirectional) first")
        group = self.engine.group(group_id)
        if (group is None or not self.coordinates(group_id)
                or self.funnel.not_coordinating(group_id) or self.hand_off.active
                or self._nursery is None):
            return NOT_HELD
        old = release_fleet.old_followers(self.relayers.of(group_id))
        if old:
            return (f"groupgate sidecar(s) without fleet protocol 3 (0.2.0) at "
                    f"{', '.join(old)} relayed for the group within the last session and "
                    "cannot be told of a hand-back: roll them first")
        classic = [m for m in group.members.values() if m.protocol is MemberProtocol.CLASSIC]
        consumers = [m for m in group.members.values()
                     if m.protocol is MemberProtocol.CONSUMER]
        bound = release_bound_s(
            [m.session_timeout_ms or 0 for m in classic]
            + [self.config.group_session_timeout_ms] * bool(consumers),
            self.config.group_session_timeout_ms)
        started = self.releases.start(group_id, reason, (m.member_id for m in classic),
                                      (m.member_id for m in consumers), now, bound, to)
        if isinstance(started, str):
            return started
        for member in group.members.values():
            if not any(member.assigned.values()) and not any(
                    member.pending_revocation.values()):
                self.releases.gave_up(group_id, member.member_id, now)  # nothing to give up
        self.engine.suspend(group_id)  # nobody is fenced while the members are told
        for (held_group, member_id), held in list(self.held_joins.items()):
            if held_group == group_id:  # it gives up what it owns and joins again
                held.resolve(JoinGroupResponse(error_code=int(ErrorCode.ILLEGAL_GENERATION),
                                               member_id=member_id))
        for (held_group, _member_id), held_sync in list(self.held_syncs.items()):
            if held_group == group_id:  # as its Heartbeat would be (:mod:`.classic`)
                held_sync.resolve(SyncGroupResponse(
                    error_code=int(ErrorCode.ILLEGAL_GENERATION)))
        done = self._release_done[group_id] = trio.Event()
        metrics.GROUP_RELEASES.labels("started").inc()
        log.warning("group %s: handing it back to the broker's %s coordinator (%s): its "
                    "%d classic and %d KIP-848 member(s) give up their partitions first (at "
                    "most %.1f s)", group_id,
                    "KIP-848" if to is ReleaseTarget.NATIVE else "classic", reason,
                    len(classic), len(consumers), bound)
        self._nursery.start_soon(self._release, group_id, reason, done)
        return None

    async def release_finished(self, group_id: str, wait_s: float) -> None:
        """Return once the release of ``group_id`` under way is over (or ``wait_s`` passed)."""
        done = self._release_done.get(group_id)
        if done is not None:
            with trio.move_on_after(wait_s):
                await done.wait()

    def released_member(self, group_id: str, member_id: str) -> bool:
        """Whether ``member_id`` is a classic member of a group this sidecar handed back (it
        rejoins at the broker; its member id is the engine's)."""
        now = trio.current_time()
        return (self.releases.phase(group_id, now) is ReleasePhase.RELEASED
                and self.releases.classic_member(group_id, member_id, now))

    def _releasing_heartbeat(self, request: ConsumerGroupHeartbeatRequest
                             ) -> ConsumerGroupHeartbeatResponse | None:
        """A KIP-848 heartbeat of a group being handed back (:mod:`.release`): its member is
        answered an empty assignment at its epoch until it reports owning nothing; a new member
        waits; None: not such a heartbeat."""
        group_id, member_id = request.group_id, request.member_id
        now = trio.current_time()
        release = self.releases.get(group_id, now)
        if release is None or release.phase is not ReleasePhase.RELEASING:
            return None
        if release.peer is not None:  # another sidecar hands it back: wait for the outcome
            return ConsumerGroupHeartbeatResponse(
                error_code=int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
                error_message=f"group {group_id} is being handed back to the broker's "
                              f"coordinator by the sidecar at {release.peer}")
        if not self.releases.consumer_member(group_id, member_id, now):
            if request.member_epoch == 0:
                return ConsumerGroupHeartbeatResponse(
                    error_code=int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
                    error_message=f"group {group_id} is being handed back to the broker's "
                                  "classic coordinator")
            return None
        group = self.engine.group(group_id)
        member = group.members.get(member_id) if group is not None else None
        if request.member_epoch < 0 or member is None:
            self.releases.gave_up(group_id, member_id, now, left=True)
            return ConsumerGroupHeartbeatResponse(member_id=member_id,
                                                  member_epoch=min(request.member_epoch, -1))
        owned = request.topic_partitions
        if owned is not None and not any(parts for _, parts in owned):
            self.releases.gave_up(group_id, member_id, now)
        return ConsumerGroupHeartbeatResponse(
            member_id=member_id, member_epoch=member.member_epoch,
            heartbeat_interval_ms=self.config.group_heartbeat_interval_ms, assignment=[])

    def releasing(self, group_id: str) -> bool:
        return self.releases.phase(group_id, trio.current_time()) is ReleasePhase.RELEASING

    def released(self, group_id: str) -> bool:
        return self.releases.phase(group_id, trio.current_time()) is ReleasePhase.RELEASED

    async def _release(self, group_id: str, reason: str, done: trio.Event) -> None:
        """The release's ``releasing`` phase, then the hand-back itself."""
        classic = self.classic
        assert classic is not None
        holder = self.routes.own_fleet_address
        told = self._followers(group_id)
        try:
            release = self.releases.get(group_id, trio.current_time())
            if told and release is not None and holder is not None:
                # step 1 in a fleet: every sidecar relaying for the group is told first
                why = await release_fleet.announce(self, release, holder, told)
                if why is not None:
                    self._abort_release(group_id, f"not every sidecar relaying for it could be "
                                                  f"told: {why}")
                    return
                log.info("group %s: %d sidecar(s) relaying for it were told of the hand-back",
                         group_id, len(told))
            while not self.releases.ready(group_id, trio.current_time()):
                if self.engine.group(group_id) is None or not self.coordinates(group_id):
                    self.releases.abort(group_id)
                    metrics.GROUP_RELEASES.labels("aborted").inc()
                    log.warning("group %s: not handed back: the group was lost meanwhile",
                                group_id)
                    return
                await trio.sleep(RELEASE_POLL_SECONDS)
            release = self.releases.get(group_id, trio.current_time())
            untold = sorted(release.unreleased) if release is not None else []
            membership = self.memberships.get(group_id)
            group = self.engine.group(group_id)
            epoch = group.group_epoch if group is not None else 0
            released, effects = classic.release(group_id, reason)
            self.apply(effects)  # GroupReleased: its KIP-848 members carried over
            if self.durability is not None and release is not None:
                # behind the tombstones: the release remembered across restarts (.release)
                self.durability.submit([release_marker(group_id, release.to.value, epoch,
                                                       wall_ms())])
            if membership is not None and self.memberships.get(group_id) is membership:
                del self.memberships[group_id]
                await self._give_up(group_id, membership)  # tombstones, then the lock leaves
            self._loading.pop(group_id, None)
            self.directory.forget(group_id)
            if release is not None and release.to is ReleaseTarget.NATIVE:
                await self._anchored(group_id, untold)
            else:
                carried = self.bridges.start_carried(group_id)
                metrics.GROUP_RELEASES.labels("released").inc()
                log.warning("group %s: handed back to the broker's classic coordinator; %d "
                            "KIP-848 member(s) joining it as bridged members%s", group_id,
                            carried, f"; still owning partitions (silent): {', '.join(untold)}"
                            if untold else "")
            followers = sorted(set(told) | set(self._followers(group_id)))
            if followers and release is not None and holder is not None:
                # step 2: the followers answer their members' requests themselves from now on
                await release_fleet.tell_released(
                    self, release, holder, followers,
                    released.protocol if released is not None else None)
        finally:
            done.set()
            if self._release_done.get(group_id) is done:
                del self._release_done[group_id]

    def _followers(self, group_id: str) -> list[str]:
        """The fleet addresses of the sidecars that relayed for ``group_id`` within the last
        session (:mod:`.release_fleet`), this one's aside."""
        own = self.routes.own_fleet_address
        return [f for f in self.relayers.of(group_id)
                if not f.startswith(OLD_FOLLOWER) and f != own]

    def _abort_release(self, group_id: str, why: str) -> None:
        """The hand-back does not happen: the engine goes on coordinating the group."""
        self.releases.abort(group_id)
        if self.engine.group(group_id) is not None:
            self.apply(self.engine.resume(group_id, self.now_ms()))
        metrics.GROUP_RELEASES.labels("aborted").inc()
        log.warning("group %s: not handed back: %s; the engine goes on coordinating it",
                    group_id, why)

    def peer_release_started(self, group_id: str, release: GroupRelease) -> None:
        """Another sidecar hands ``group_id`` back (``GroupReleasing``, :mod:`.release_fleet`):
        this one's requests of the group that it decides itself wait for the outcome."""
        previous = self._release_done.pop(group_id, None)
        if previous is not None:
            previous.set()
        self._release_done[group_id] = trio.Event()
        if self._nursery is not None:
            self._nursery.start_soon(self._peer_release_bound, group_id, release)

    def peer_release_ended(self, group_id: str, *, released: bool) -> None:
        """The holder's hand-back of ``group_id`` is over: released (``GroupReleased``, or the
        broker's group no longer held by it), or not."""
        now = trio.current_time()
        if released:
            self.releases.released(group_id, now)
            self.routes.forget([group_id])
            self.directory.forget(group_id)
        else:
            self.releases.forget(group_id)
        done = self._release_done.pop(group_id, None)
        if done is not None:
            done.set()

    async def _peer_release_bound(self, group_id: str, release: GroupRelease) -> None:
        """No ``GroupReleased`` by the announced bound: the broker's group decides (its holder
        still holds it: no hand-back)."""
        await trio.sleep_until(release.deadline)
        for _ in range(PEER_RELEASE_LOOKUPS):
            if (self.releases.get(group_id, trio.current_time()) is not release
                    or release.phase is not ReleasePhase.RELEASING):
                return
            holder = await self.directory.lookup(group_id)
            if holder.kind in ("free", "unused", "broker", "sidecar"):
                held = holder.kind == "sidecar"  # the lock is still (or again) held
                log.warning("group %s: the sidecar at %s did not say how its hand-back ended; "
                            "the broker's group says it %s", group_id, release.peer,
                            "did not happen" if held else "happened")
                self.peer_release_ended(group_id, released=not held)
                return
            await trio.sleep(PEER_RELEASE_RETRY_SECONDS)
        log.warning("group %s: the sidecar at %s did not say how its hand-back ended, nor can "
                    "the broker; forgotten", group_id, release.peer)
        self.peer_release_ended(group_id, released=False)

    async def _anchored(self, group_id: str, untold: list[str]) -> None:
        """A release to the broker's KIP-848 coordinator, after the lock left: the anchor
        makes the broker's group a consumer group before the classic members' held joins are
        answered (:mod:`.native_exit`)."""
        assert self._nursery is not None
        joined = self.exits.start_anchor(group_id, self._nursery)
        with trio.move_on_after(10.0):
            await joined.wait()
        metrics.GROUP_RELEASES.labels("released").inc()
        log.warning("group %s: handed to the broker's KIP-848 coordinator; its KIP-848 members "
                    "rejoin there, its classic members join the broker's consumer group%s",
                    group_id, f"; still owning partitions (silent): {', '.join(untold)}"
                    if untold else "")

    async def released_durably(self, group_id: str) -> bool:
        """Whether the state log remembers ``group_id`` handed back (by any sidecar, before a
        restart too): the online upgrade does not convert it then, except under
        ``migration-policy=upgrade`` (the way back to the engine, docs/operations.md)."""
        if (self.durability is None
                or self.engine.config.migration_policy is MigrationPolicy.UPGRADE):
            return False
        to = await self.durable_releases.lookup(self.durability, group_id)
        if to is None:
            return False
        now = trio.current_time()
        if self.releases.get(group_id, now) is None:
            log.info("group %s: the state log remembers it handed back to the broker's %s "
                     "coordinator; not converted again (migration-policy %s)", group_id, to,
                     self.engine.config.migration_policy.value)
            target = ReleaseTarget.NATIVE if to == "native" else ReleaseTarget.CLASSIC
            started = self.releases.start(group_id, "remembered in the state log", (), (),
                                          now, 0.0, target)
            if not isinstance(started, str):
                self.releases.released(group_id, now)
        return True

    async def _native_at_broker(self, group_id: str) -> NotTaken | None:
        """Before a takeover in front of a broker with a KIP-848 coordinator: if that
        coordinator has the group, it is never taken (:mod:`.native_exit`)."""
        if not await self.exits.at_broker(group_id):
            return None
        if self.releases.native(group_id, trio.current_time()) is None:
            log.warning("group %s: the broker's KIP-848 coordinator has it; not taken over "
                        "here: its requests go to the broker", group_id)
            self.releases.found_native(group_id, "the broker's KIP-848 coordinator has it",
                                       trio.current_time())
        return NotTaken("the broker's KIP-848 coordinator has the group", "native")

    def _carry_over(self, released: GroupReleased) -> None:
        """The engine handed ``released`` back: remember it, and give each KIP-848 member a
        bridged member that keeps its epoch and partitions (it joins once the lock is left)."""
        now = trio.current_time()
        group_id = released.group_id
        release = self.releases.get(group_id, now)
        if release is None:  # released without a release under way
            started = self.releases.start(group_id, released.reason, (), (), now, 0.0)
            assert not isinstance(started, str)
            release = started
        still_owning, left = set(release.unreleased), set(release.left)
        self.releases.released(group_id, now, [m.member_id for m in released.members
                                               if not m.consumer_protocol])
        if release.to is ReleaseTarget.NATIVE:
            log.info("group %s: released by the engine (%s); its KIP-848 members are told to "
                     "rejoin at the broker's KIP-848 coordinator", group_id, released.reason)
            return
        topics = dict(self.engine.image.by_name)
        for member in released.members:
            if (member.consumer_protocol and member.member_epoch > 0
                    and member.member_id not in left):
                if member.member_id not in still_owning:  # it gave everything up
                    member = dataclasses.replace(member, owned=())
                self.bridges.carry_over(group_id, member, released.protocol, topics)
        log.info("group %s: released by the engine (%s); the broker's group selects %s",
                 group_id, released.reason, released.protocol or "(no common protocol)")

    def _note_consumer_members(self, group_id: str) -> None:
        group = self.engine.group(group_id)
        if group is not None and any(m.protocol is MemberProtocol.CONSUMER
                                     for m in group.members.values()):
            self._had_consumer_members.add(group_id)

    def _downgrade_if_due(self, group_id: str) -> None:
        """Kafka's downgrade rule, under ``migration-policy`` downgrade or bidirectional: a
        group whose last KIP-848 member left while classic members remain is handed back."""
        if (group_id not in self._had_consumer_members
                or not self.engine.config.migration_policy.downgrade_enabled):
            return
        group = self.engine.group(group_id)
        if group is None or not group.members or any(
                m.protocol is MemberProtocol.CONSUMER for m in group.members.values()):
            return
        self._had_consumer_members.discard(group_id)
        why = self.start_release(group_id, "its last KIP-848 member left (migration-policy "
                                           f"{self.engine.config.migration_policy.value})")
        if why is not None:
            log.info("group %s: its last KIP-848 member left; not handed back: %s", group_id,
                     why)

    def _group_shapes(self) -> Iterator[tuple[str, Iterator[str]]]:
        """State and member protocols of every group the engine coordinates (read when
        Prometheus scrapes)."""
        for group in list(self.engine.groups.values()):
            yield (group.state.value.lower(),
                   (member.protocol.value for member in group.members.values()))

    def _answer_held(self, group_id: str, error: ErrorCode) -> None:
        """Answer every held JoinGroup / SyncGroup of ``group_id`` with ``error``."""
        for (held_group, member_id), held in list(self.held_joins.items()):
            if held_group == group_id:
                held.resolve(JoinGroupResponse(error_code=int(error), member_id=member_id))
        for (held_group, _member_id), held_sync in list(self.held_syncs.items()):
            if held_group == group_id:
                held_sync.resolve(SyncGroupResponse(error_code=int(error)))

    async def _timers(self) -> None:
        while True:
            self._timer_wake = wake = trio.Event()
            deadline = self.engine.next_deadline()
            if deadline is None:
                await wake.wait()
            else:
                with trio.move_on_at((deadline + 1) / 1000):
                    await wake.wait()
            # The process may have been frozen or starved past a lease: the groups it no
            # longer holds are suspended (or, cut off, forgotten) before any of their timers
            # fences a member whose heartbeats could not reach this sidecar.
            for membership in list(self.memberships.values()):
                membership.lease_expired()
            self.apply(self.engine.tick(self.now_ms()))

    def _wanted_topics(self) -> tuple[frozenset[str], bool]:
        names = set(self._pending_names)
        regex = self._pending_regex > 0 or self.bridges.has_regex()
        for group in self.engine.groups.values():
            names.update(group.subscribed_names)
            regex = regex or bool(group.regex_counts)
        return frozenset(names), regex

    def _install_topics(self, image: TopicsImage) -> None:
        if image == self.engine.image:
            return
        self.apply(self.engine.update_topics(image, self.now_ms()))
