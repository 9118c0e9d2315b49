"""A seeded simulation of a fleet of sidecars around one group, each driven by the fleet core.

Several sidecars (pods) each run a :class:`~proxy.fleet_core.core.GroupCore` for the group, the
real engine (:class:`~translation.coordinator.GroupCoordinator`) once they hold it, and serve
the KIP-848 consumers of their own pod, each a librdkafka or a Java client with its real
timeouts, retries, backoff and one coordinator connection (``tests/sim/fleet_clients.py``),
which consumes its partitions and commits what it read. Around them:

* a broker's classic group coordinator (:class:`Broker`): JoinGroup with MEMBER_ID_REQUIRED,
  a rebalance that completes when every member rejoined or its rebalance timeout passed (the
  leader stays leader if it rejoined), SyncGroup, Heartbeat answering REBALANCE_IN_PROGRESS,
  ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID as Kafka's classic coordinator does, sessions on the
  broker's clock counted from when a call *arrives*, LeaveGroup, DescribeGroups; the group's
  committed offsets, stored for a commit stamped with a current lock member and generation,
  and expired (KIP-211) for topics no member subscribes to once their last commit is older
  than the retention;
* the state log (:class:`StateLog`): units acknowledged in order after a delay; opening a
  writer fences every earlier one, whose later writes fail;
* the fleet link: messages lost, each with its own delay (in order per client connection).

What the sidecar does around the core is a model of the trio service
(``proxy/coordination/``): a client connection's requests are decided one at a time and
answered in order; a heartbeat that carries the epoch of an answer its client has not read
goes on with the epoch that answer gave (:mod:`proxy.coordination.heartbeat_answers`); the
client's sidecar acknowledges stale commit retries without writing them
(:mod:`proxy.coordination.commit_retries`); a member's session does not run while a request
of it is inside the coordinating sidecar (the engine's held sessions); an accepted commit is
sent to the broker stamped with the lock's member id and generation on the member's own
connection, and answered when the broker answers or when the lease is cut off; a client
connection that closes resets the broker connection behind it (what the broker has not read
is dropped); the lock advertises the loaded group's topics. Each of these, and each fix in the
core, can be switched back to the defect it fixed (:mod:`proxy.fleet_core.defects`,
``Knobs.defects``).

Faults, drawn per seed: a sidecar killed and restarted (a new process: new clock, nothing
kept; its clients' connections reset), stopped (it steps down: the lock left at once, then it
exits and restarts), frozen (SIGSTOP: everything that reaches it waits, its clock runs on)
shorter or longer than a lease, cut off from the broker while its clients and the other
sidecars still reach it, a slow link to the broker, a slow state log, failed writes and loads,
lost fleet messages, an application process dying (a new member starts in its pod later);
contested elections (every client starting at once, several sidecars racing for a free
group after a holder is lost). Each sidecar's clock runs at its own rate (within
``Knobs.skew`` of the broker's) from its own offset.

Checked after every event (:mod:`tests.sim.fleet_checks`): a sidecar that runs the engine (a
request, a timer) is the broker group's leader and within its lease, and no other sidecar's
core may act; no partition has two owners among members that can still reach a coordinator;
no live member is fenced by an engine while a request of it is inside that sidecar; a live
member is told it is fenced only by an engine or by a sidecar letting go of a group it lost; no
committed offset moves back; a lock member joins only a group no other sidecar held when it
got its member id; no client knows an epoch a takeover did not load. Once the faults stop, the
fleet settles: one sidecar coordinates, every partition is owned by a stable client, and every
partition is consumed and committed up to what was produced before the faults stopped.

A failing seed replays exactly: ``run_fleet_seed(seed)`` (with the same ``Knobs``).
"""

from __future__ import annotations

import functools
import heapq
import math
import random
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.coordination.commit_retries import CommitRetries
from proxy.coordination.heartbeat_answers import HeartbeatAnswers
from proxy.fleet_core import events as ev
from proxy.fleet_core.core import HOLDING, CoreConfig, GroupCore, Role, moves
from proxy.fleet_core.defects import NO_DEFECTS, Defects
from tests.sim.fleet_checks import GapViolation, Offsets, Owners, Reach, fmt
from tests.sim.fleet_clients import FENCING, Commit, FleetClient, Kind, Response, Sent
from translation.assignors.uniform import UniformAssignor
from translation.config import GroupConfig
from translation.coordinator import GroupCoordinator
from translation.effects import Effect, MemberFenced
from translation.errors import ErrorCode
from translation.heartbeat import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse
from translation.records import StateRecord
from translation.simulation.client import TP, ClientState, SimulatedConsumer
from translation.simulation.invariants import InvariantViolation
from translation.topics import TopicMetadata, TopicsImage

GROUP = "fleet-group"
WALL_MS = 1_700_000_000_000
ADVERTISE_GRACE_MS = 12_000
WRITE_TIMEOUT_MS = 10_000
"""The state log's ``write_timeout`` (``proxy/state_log/log.py``): a write that takes longer
fails, and the group is given up."""
AUTHORITATIVE = frozenset({ErrorCode.NONE}) | FENCING
"""Answers only a coordinator gives: the member reached one."""


@dataclass(frozen=True)
class Knobs:
    sidecars: int = 3
    clients: int = 5
    java_share: float = 0.5
    """Share of clients that are the Java client (the others librdkafka)."""
    lock_session_ms: int = 6_000
    """``broker-session-timeout-ms``: the lock member's session (and rebalance timeout)."""
    member_session_ms: int = 19_000
    """The members' session: the shortest the fleet rule accepts with 1 s heartbeats and a
    6 s broker session (``docs/operations.md``, "How long a request can wait")."""
    heartbeat_ms: int = 1_000
    commit_interval_ms: int = 2_000
    chaos_ms: int = 45_000
    quiet_ms: int = 45_000
    """Long enough for the fleet to settle after the faults: a takeover (a broker session),
    a member session for members that went with their sidecar, librdkafka's longest
    reconnect backoff."""
    fault_every_ms: int = 4_000
    skew: float = 0.15
    """Clock rates within this share of the broker's (the lease assumes < 1 - 0.8)."""
    lease_fraction: float = 0.8
    fleet_loss: float = 0.05
    fleet_delay_ms: int = 10
    """Longest one-way delay between two sidecars (pods of one cluster: milliseconds)."""
    write_delay_ms: int = 60
    slow_log_ms: int = 25_000
    """How long a write may stall while the state log is slow (a fault: the state topic's
    leader moving, its ISR shrinking; the writer's own timeout ends it at about 30 s)."""
    write_fail: float = 0.005
    load_fail: float = 0.05
    relay_heartbeat_ms: int = 6_000
    """How long a follower waits for the holder's answer to a relayed heartbeat."""
    relay_other_ms: int = 20_000
    """... and to another relayed request (a commit)."""
    record_ms: int = 20
    """One record per partition every this many ms (the idle topic stops at ``idle_after``)."""
    idle_after_ms: int = 10_000
    offsets_retention_ms: int = 25_000
    """The broker's ``offsets.retention.minutes``, scaled: how long after its last commit a
    partition's offset is kept once no member subscribes to its topic (KIP-211)."""
    join_moved: float = 0.0
    """Share of the broker's answers to a JoinGroup with a member id that are
    NOT_COORDINATOR (its group coordinator moving), during the faults."""
    start_together: bool = False
    """Every client starts at the same moment (a contested election for a new group)."""
    strict_gaps: bool = False
    """A known gap of the product (:data:`tests.sim.fleet_checks.KNOWN_GAPS`) fails the seed
    instead of being counted."""
    per_connection_order: bool = True
    """A client's requests reach the holder in the order sent, and a request dies with the
    connection the client closed (as the proxy's links per client connection and its
    connection handling keep them). False: relays overtake each other freely and live on
    after the client gave up on them."""
    defects: Defects = NO_DEFECTS
    """Fixed fleet defects put back (:mod:`proxy.fleet_core.defects`), in every sidecar."""
    skewed_sidecar: bool = False
    """Version skew: sidecar ``s0`` speaks fleet protocol 2, as 0.2.0 does (no commit
    tickets), with ``skewed_defects``: the fixes it does not have."""
    skewed_defects: Defects = NO_DEFECTS


def knobs_for_seed(seed: int) -> Knobs:
    rng = random.Random(seed * 9_176 + 11)
    return Knobs(
        sidecars=rng.randint(2, 4),
        clients=rng.randint(2, 7),
        java_share=rng.choice([0.0, 0.5, 1.0]),
        fault_every_ms=rng.choice([2_000, 4_000, 8_000]),
        fleet_loss=rng.choice([0.0, 0.02, 0.1]),
        fleet_delay_ms=rng.choice([2, 10, 40]),
        write_delay_ms=rng.choice([5, 60, 300]),
        write_fail=rng.choice([0.0, 0.005, 0.03]),
        load_fail=rng.choice([0.0, 0.1]),
        start_together=rng.random() < 0.3,
    )


@dataclass
class FleetResult:
    seed: int
    ok: bool
    violation: str = ""
    events: int = 0
    gaps: list[str] = field(default_factory=list)
    """Known gaps met (the first of each tag), the seed going on past them."""
    stats: Counter[str] = field(default_factory=Counter)
    trace: list[str] = field(default_factory=list)


# -- the broker's classic group --------------------------------------------------------------


@dataclass
class _BMember:
    owner: str
    last_seen: int
    order: int
    join_reply: Callable[[ev.JoinAnswered], None] | None = None
    join_attempt: int = 0
    topics: frozenset[str] = frozenset()
    joined: int = 0


class Broker:
    """One classic group at the broker, on the broker's (the simulation's) clock."""

    def __init__(self, sim: FleetSimulation, session_ms: int) -> None:
        self.sim = sim
        self.session_ms = session_ms
        self.members: dict[str, _BMember] = {}
        self.pending_ids: dict[str, int] = {}
        """Member ids handed out with MEMBER_ID_REQUIRED -> when."""
        self.state = "Empty"
        self.generation = 0
        self.leader = ""
        self.used = False
        self.rebalance_deadline = 0
        self.syncs: list[tuple[str, Callable[[ev.SyncAnswered], None], int]] = []
        self.held_by = ""
        """The sidecar whose lock member leads the group since ``held_since``."""
        self.held_since = 0
        self.offsets = Offsets(sim.gap)
        self.last_commit: dict[TP, int] = {}
        self._offsets_checked = -10**9
        self._ids = 0
        self._order = 0

    def holder_member(self) -> str:
        if self.leader in self.members:
            return self.leader
        return ""

    def describe(self, attempt: int) -> ev.LookedUp:
        self.expire()
        if not self.members:
            return ev.LookedUp(attempt, ev.Shape.FREE if self.used else ev.Shape.UNUSED)
        lead = self.members.get(self.leader) or min(self.members.values(), key=lambda m: m.order)
        return ev.LookedUp(attempt, ev.Shape.HELD, lead.owner)

    def join(self, owner: str, member_id: str, attempt: int,
             reply: Callable[[ev.JoinAnswered], None]) -> None:
        self.expire()
        now = self.sim.now
        if not member_id:
            self._ids += 1
            new = f"{owner}-m{self._ids}"
            self.pending_ids[new] = now
            reply(ev.JoinAnswered(attempt, ErrorCode.MEMBER_ID_REQUIRED, new))
            return
        sim = self.sim
        if sim.knobs.join_moved and not sim.chaos_over \
                and sim.rng.random() < sim.knobs.join_moved:
            sim.stats["joins-coordinator-moved"] += 1
            reply(ev.JoinAnswered(attempt, ErrorCode.NOT_COORDINATOR))
            return
        member = self.members.get(member_id)
        if member is None:
            if member_id not in self.pending_ids:
                reply(ev.JoinAnswered(attempt, ErrorCode.UNKNOWN_MEMBER_ID))
                return
            issued = self.pending_ids.pop(member_id)
            self._check_contest(owner, issued)
            self._order += 1
            member = self.members[member_id] = _BMember(owner, now, self._order, joined=now)
            self.used = True
        member.last_seen = now
        member.join_reply, member.join_attempt = reply, attempt
        if self.state != "Preparing":
            self.state = "Preparing"
            self.rebalance_deadline = now + self.session_ms
            self.sim.at(self.rebalance_deadline, self.sim.broker_check)
        self._maybe_complete()

    def _check_contest(self, owner: str, issued: int) -> None:
        """A sidecar's lock member joins: no other sidecar may have held the group since
        before this one was given its member id (it looks the group up after that, and
        loses the election without joining if it is held: ``_not_held_elsewhere``)."""
        holder = self.members.get(self.leader)
        if holder is None or holder.owner == owner or self.held_by != holder.owner:
            return
        if self.held_since <= issued:
            raise InvariantViolation(
                f"contested election: {owner}'s lock member joins the group {holder.owner} "
                f"has held since {self.held_since}, before {owner} got its member id at "
                f"{issued} (it did not look the group up in between)")

    def _maybe_complete(self, deadline_passed: bool = False) -> None:
        if self.state != "Preparing":
            return
        waiting = [mid for mid, m in self.members.items() if m.join_reply is None]
        if waiting and not deadline_passed:
            return
        for mid in waiting:
            del self.members[mid]
        self.generation += 1
        if not self.members:
            self.state, self.leader, self.held_by = "Empty", "", ""
            return
        if self.leader not in self.members:
            self.leader = min(self.members, key=lambda mid: self.members[mid].order)
        owner = self.members[self.leader].owner
        if owner != self.held_by:
            self.held_by, self.held_since = owner, self.sim.now
        self.state = "Completing"
        for mid, m in self.members.items():
            reply, attempt = m.join_reply, m.join_attempt
            m.join_reply = None
            m.last_seen = self.sim.now
            assert reply is not None
            reply(ev.JoinAnswered(attempt, ErrorCode.NONE, mid, self.generation, self.leader))
        self.sim.at(self.sim.now + self.session_ms, self.sim.broker_check)

    def sync(self, member_id: str, generation: int, attempt: int,
             reply: Callable[[ev.SyncAnswered], None]) -> None:
        self.expire()
        member = self.members.get(member_id)
        if member is None:
            reply(ev.SyncAnswered(attempt, ErrorCode.UNKNOWN_MEMBER_ID))
            return
        member.last_seen = self.sim.now
        if generation != self.generation:
            reply(ev.SyncAnswered(attempt, ErrorCode.ILLEGAL_GENERATION))
            return
        if self.state == "Preparing":
            reply(ev.SyncAnswered(attempt, ErrorCode.REBALANCE_IN_PROGRESS))
            return
        if self.state == "Completing" and member_id != self.leader:
            self.syncs.append((member_id, reply, attempt))
            return
        if self.state == "Completing":
            self.state = "Stable"
            for _, waiting, waiting_attempt in self.syncs:
                waiting(ev.SyncAnswered(waiting_attempt, ErrorCode.NONE))
            self.syncs.clear()
        reply(ev.SyncAnswered(attempt, ErrorCode.NONE))
        self.sim.at(self.sim.now + self.session_ms, self.sim.broker_check)

    def heartbeat(self, member_id: str, generation: int, attempt: int,
                  reply: Callable[[ev.HeartbeatAnswered], None]) -> None:
        self.expire()
        member = self.members.get(member_id)
        if member is None:
            reply(ev.HeartbeatAnswered(attempt, ErrorCode.UNKNOWN_MEMBER_ID))
            return
        member.last_seen = self.sim.now
        self.sim.at(self.sim.now + self.session_ms, self.sim.broker_check)
        if self.state == "Preparing":
            reply(ev.HeartbeatAnswered(attempt, ErrorCode.REBALANCE_IN_PROGRESS))
        elif generation != self.generation:
            reply(ev.HeartbeatAnswered(attempt, ErrorCode.ILLEGAL_GENERATION))
        else:
            reply(ev.HeartbeatAnswered(attempt, ErrorCode.NONE))

    def leave(self, member_id: str) -> None:
        self.expire()
        self.pending_ids.pop(member_id, None)
        if self.members.pop(member_id, None) is not None:
            self._membership_changed()

    def subscribe(self, member_id: str, topics: frozenset[str]) -> None:
        """The lock member advertises ``topics`` (in its JoinGroup's subscription; the
        rejoin that carries them is not simulated)."""
        member = self.members.get(member_id)
        if member is not None:
            member.topics = topics

    def commit(self, member_id: str, generation: int, offsets: tuple[tuple[TP, int], ...],
               who: str, unseen: frozenset[TP] = frozenset()) -> ErrorCode:
        """An OffsetCommit stamped with a lock member's id and generation; ``unseen``: the
        partitions it carries as a client's retry the stale-retry guard could not know to be
        stale."""
        self.expire()
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if self.state == "Preparing":
            return ErrorCode.REBALANCE_IN_PROGRESS
        for tp, offset in offsets:
            self.offsets.store(tp, offset, who, tp in unseen)
            self.last_commit[tp] = self.sim.now
        return ErrorCode.NONE

    def expire(self) -> None:
        now = self.sim.now
        gone = [mid for mid, m in self.members.items()
                if m.join_reply is None and now >= m.last_seen + self.session_ms]
        for mid in gone:
            del self.members[mid]
            self.sim.stats["broker-expired"] += 1
        if gone:
            self._membership_changed()
        if self.state == "Preparing" and now >= self.rebalance_deadline:
            self._maybe_complete(deadline_passed=True)
        self._expire_offsets()

    def _expire_offsets(self) -> None:
        """KIP-211: a non-empty group's offsets of a topic no member subscribes to expire a
        retention after their last commit. Kafka's cleanup runs every
        ``offsets.retention.check.interval.ms`` (10 min); here it runs at every call, but not
        while a member joined less than ``ADVERTISE_GRACE_MS`` ago (its JoinGroup may wait a
        rebalance timeout for the members before it): a takeover's JoinGroup
        cannot name the topics before the load, and its lock member advertises them right
        after (well under a second, which a 10-minute cleanup all but never meets)."""
        now = self.sim.now
        if now < self._offsets_checked + 500 or not self.members:
            return  # (checked twice a second at most: the retention is many seconds)
        self._offsets_checked = now
        if any(now - m.joined < ADVERTISE_GRACE_MS for m in self.members.values()):
            return
        subscribed = set().union(*(m.topics for m in self.members.values()))
        retention = self.sim.knobs.offsets_retention_ms
        for tp, at in list(self.last_commit.items()):
            name = self.sim.topic_names[tp[0]]
            if name not in subscribed and self.sim.now - at >= retention:
                del self.last_commit[tp]
                self.offsets.expire(tp, f"no lock member subscribes to {name}")

    def _membership_changed(self) -> None:
        self.syncs = [s for s in self.syncs if s[0] in self.members]
        if not self.members:
            if self.state != "Empty":
                self.generation += 1
            self.state, self.leader, self.held_by = "Empty", "", ""
            return
        if self.state in ("Stable", "Completing"):
            self.state = "Preparing"
            self.rebalance_deadline = self.sim.now + self.session_ms
            self.sim.at(self.rebalance_deadline, self.sim.broker_check)
        self._maybe_complete()


# -- the state log ---------------------------------------------------------------------------


class StateLog:
    """The group's records, acknowledged in order per writer; a new writer fences the old."""

    def __init__(self) -> None:
        self.log: list[StateRecord] = []
        self.epoch = 0
        self.broken: set[int] = set()
        self.last_ack: dict[int, int] = {}

    def open(self) -> int:
        self.epoch += 1
        return self.epoch


# -- sidecars --------------------------------------------------------------------------------


Connection = tuple[str, int]
"""A client connection: (client name, connection number)."""


@dataclass(frozen=True)
class Ticket:
    """A CommitTicket the holder grants a follower: the lock's member id and generation the
    follower stamps the member's commit with (decision record 0019)."""

    member_id: str
    generation: int


@dataclass
class Pending:
    """A member's request inside a sidecar, from its arrival to its answer leaving."""

    client: FleetClient | None
    sent: Sent
    origin: Sidecar | None = None
    origin_incarnation: int = 0
    origin_rid: int = 0
    response: Response | Ticket | None = None
    source: str = ""
    """Who decided the answer: ``engine``, the core's role (``core:letting-go``...),
    ``broker``, ``guard`` (a stale retry acknowledged)."""
    relayed: bool = False
    dispatched: bool = False
    carried: int = 0
    """The member epoch the client's heartbeat carried (before a catch-up)."""
    guarded: frozenset[TP] = frozenset()
    """The partitions of this commit the stale-retry guard found stale (whether or not it is
    on: with ``Defects.no_stale_retry_guard`` they are written anyway)."""
    cut_at_broker: bool = False
    """Its commit went to the broker while this sidecar was cut off from it."""
    gone: bool = False
    """No longer inside (answered, or abandoned with its client connection)."""
    upstream: bool = False
    """Sent on to the broker on the client's connection (a stamped commit): the next request
    of the connection may be decided; its answer still waits for this one's."""
    ready: bool = False
    """Its answer is decided and waits for the earlier answers of its connection."""
    reported: GroupCoordinator | None = None
    """The engine told this request is inside (held sessions), to tell when it leaves."""
    connection: Connection = ("", 0)

    @property
    def member_id(self) -> str:
        what = self.sent.what
        return (what.member_id or "") if isinstance(what, ConsumerGroupHeartbeatRequest) \
            else what.member_id

    @property
    def is_commit(self) -> bool:
        return isinstance(self.sent.what, Commit)


class Sidecar:
    def __init__(self, name: str, rate: float) -> None:
        self.name = name
        self.rate = rate
        self.offset = 0
        self.incarnation = 0
        self.alive = True
        self.frozen_until = 0
        self.backlog: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self.cut_until = 0
        self.slow_until = 0
        self.slow_extra = 0
        self.core: GroupCore
        self.engine: GroupCoordinator | None = None
        self.writer = 0
        self.unwritten: list[list[StateRecord]] = []
        self.pending: dict[int, Pending] = {}
        self.tick_token = 0
        self.queues: dict[Connection, deque[int]] = {}
        """Per client connection: its requests here, the first one being decided."""
        self.answers: dict[Connection, HeartbeatAnswers] = {}
        self.guard: CommitRetries
        self.inside: Counter[str] = Counter()
        """Member id -> its requests inside this sidecar now."""
        self.at_broker: dict[int, Connection] = {}
        """rid -> the client connection an accepted commit went to the broker on."""
        self.reset_links: set[Connection] = set()
        """Client connections whose broker connection was reset (closed with requests)."""
        self.closed_links: set[Connection] = set()
        """Client connections closed (whether or not their broker connection was reset)."""
        self.advertises = False
        """Its lock member advertises the group's topics."""
        self.defects = NO_DEFECTS
        """The fixed defects this sidecar's build still has (``Knobs.defects``; the skewed
        sidecar's ``Knobs.skewed_defects``)."""
        self.deciding_role = Role.ABSENT
        """The core's role when it was handed the event whose actions are performed now."""
        self.protocol = 3
        """Its fleet protocol: 2 (0.2.0) takes no commit tickets: its followers' commits are
        relayed to it and it commits them, and as a follower it relays its members' commits."""


class FleetSimulation:
    def __init__(self, seed: int, knobs: Knobs | None = None) -> None:
        self.seed = seed
        self.knobs = k = knobs or knobs_for_seed(seed)
        self.defects = k.defects
        self.rng = random.Random(seed)
        self.now = 0
        self.queue: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self.seq = 0
        self.events = 0
        self.stats: Counter[str] = Counter()
        self.trace: list[str] = []
        self.gaps: list[str] = []
        self.verbose = False
        """Trace every answer and ownership change too (for replaying a failing seed)."""
        self.chaos_over = False
        self.slow_log_until = 0
        self.slow_log_stall = 0
        self.broker = Broker(self, k.lock_session_ms)
        self.log = StateLog()
        topics = [TopicMetadata(uuid.UUID(int=self.rng.getrandbits(128), version=4), f"t{i}",
                                self.rng.randint(1, 6)) for i in range(2)]
        self.topic_names = {t.topic_id: t.name for t in topics}
        self.idle_topic = topics[1].topic_id
        self.image = TopicsImage.of(topics)
        self.all_partitions = {(t.topic_id, p) for t in topics for p in range(t.partitions)}
        self.engine_config = GroupConfig(
            assignors=[UniformAssignor()], session_timeout_ms=k.member_session_ms,
            heartbeat_interval_ms=k.heartbeat_ms, empty_group_expiry_ms=10**9,
            durable_state=True, member_id_factory=self._member_id)
        self.core_config = CoreConfig(
            session_ms=k.lock_session_ms, lease_fraction=k.lease_fraction, hold_ms=5_000,
            lookup_ms=3_000, lookup_wait_ms=k.heartbeat_ms // 2, view_ms=30_000,
            let_go_ms=k.member_session_ms, retry_ms=500, takeover_wait_ms=k.member_session_ms)
        self.sidecars = [Sidecar(f"s{i}", 1 + self.rng.uniform(-k.skew, k.skew))
                         for i in range(k.sidecars)]
        for i, sc in enumerate(self.sidecars):
            sc.defects = k.defects
            if k.skewed_sidecar and i == 0:
                sc.defects, sc.protocol = k.skewed_defects, 2
            self._start(sc)
        self.by_name = {sc.name: sc for sc in self.sidecars}
        self.reach = Reach()
        self.owners = Owners(self.reach, self.gap)
        self.clients: list[FleetClient] = []
        self.by_client: dict[str, FleetClient] = {}
        self.produced: dict[TP, int] = {}
        self.pod: dict[str, Sidecar] = {}
        """Client -> its pod's sidecar."""
        self.fifo: dict[tuple[object, ...], int] = {}
        """Per link and client connection: the last delivery time (messages stay in order)."""
        self.rid = 0
        self.client_counter = 0
        for i in range(k.clients):
            sc = self.sidecars[i % len(self.sidecars)] if i < len(self.sidecars) \
                else self.rng.choice(self.sidecars)
            client = self._new_client(f"c{i}", f"member-{i}", sc)
            client.start(0 if k.start_together else self.rng.randint(0, 200))
        self.at(k.fault_every_ms, self.ev_fault)
        self.at(k.chaos_ms, self.ev_chaos_over)

    # -- plumbing ----------------------------------------------------------------------------

    def _member_id(self) -> str:
        return f"x{self.rng.getrandbits(64):016x}"

    def at(self, t: int, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self.queue, (max(t, self.now), self.seq, fn, args))
        self.seq += 1

    def jitter(self, low: float, high: float) -> float:
        return self.rng.uniform(low, high)

    def gap(self, tag: str, what: str) -> None:
        """A known gap of the product explains what the checks found: counted, or (strict)
        a violation."""
        if self.knobs.strict_gaps:
            raise GapViolation(tag, what)
        self.stats[f"gap-{tag}"] += 1
        if not any(g.startswith(f"[{tag}]") for g in self.gaps):
            self.gaps.append(f"[{tag}] {what}")
        self.note(f"known gap {tag}: {what}")

    def note(self, what: str) -> None:
        self.trace.append(f"{self.now} {what}")
        if len(self.trace) > 400:
            del self.trace[:200]

    def local(self, sc: Sidecar) -> int:
        return sc.offset + int(self.now * sc.rate)

    def real(self, sc: Sidecar, local: float) -> int:
        return math.ceil((local - sc.offset) / sc.rate) + 1  # (local() truncates)

    def run(self) -> FleetResult:
        end = self.knobs.chaos_ms + self.knobs.quiet_ms
        try:
            while self.queue:
                t, _, fn, args = heapq.heappop(self.queue)
                if t > end:
                    break
                self.now = t
                self.events += 1
                fn(*args)
            self.now = end
            self.check_progress()
        except InvariantViolation as exc:
            return FleetResult(self.seed, False, str(exc), self.events, self.gaps, self.stats,
                               self.trace[-60:] + self._moves())
        for client in self.clients:
            self.stats.update(client.stats)
        return FleetResult(self.seed, True, "", self.events, self.gaps, self.stats)

    def _moves(self) -> list[str]:
        return [f"{sc.name}: " + "; ".join(moves(sc.core.history[-12:])) for sc in self.sidecars]

    # -- sidecar lifecycle and faults -------------------------------------------------------

    def _start(self, sc: Sidecar) -> None:
        sc.incarnation += 1
        sc.alive = True
        sc.offset = self.rng.randint(0, 10**9)
        sc.core = GroupCore(GROUP, sc.name, self.core_config, sc.defects)
        sc.engine = None
        sc.writer = 0
        sc.unwritten = []
        sc.pending = {}
        sc.backlog = []
        sc.frozen_until = 0
        sc.queues = {}
        sc.answers = {}
        sc.inside = Counter()
        sc.at_broker = {}
        sc.reset_links = set()
        sc.closed_links = set()
        sc.advertises = False
        sc.guard = CommitRetries(functools.partial(self._seconds, sc))

    def _seconds(self, sc: Sidecar) -> float:
        return self.local(sc) / 1000

    def _out_of_reach(self, sc: Sidecar, why: str) -> None:
        for client in self.clients:
            if self.pod[client.name] is sc:
                self.reach.lost(client.name, why)

    def ev_fault(self) -> None:
        if self.chaos_over:
            return
        k = self.knobs
        sc = self.rng.choice(self.sidecars)
        kind = self.rng.choice(["kill", "stop", "freeze", "freeze", "cut", "cut", "slow",
                                "slow-log", "client-crash", "contest"])
        s = k.lock_session_ms
        if not sc.alive or self.now < sc.frozen_until:
            kind = "none"
        if kind == "client-crash":
            self._crash_client()
        elif kind == "stop":
            # Stepping down: the lock left at once, then the process exits after its drain.
            self.perform(sc, sc.core.handle(ev.Stop(), self.local(sc)))
            self.at(self.now + self.rng.randint(0, 300), self.ev_exit, sc, sc.incarnation)
        elif kind == "kill":
            self._kill(sc)
            self.at(self.now + self.rng.randint(0, 3 * s), self.ev_restart, sc)
        elif kind == "contest":
            # The holder dies while every follower has requests of its members waiting: the
            # followers race for the free group once the broker drops it.
            holder = next((x for x in self.sidecars if x.alive and x.core.role in HOLDING), None)
            if holder is not None:
                self._kill(holder)
                self.at(self.now + self.rng.randint(s, 3 * s), self.ev_restart, holder)
        elif kind == "freeze":
            sc.frozen_until = self.now + self.rng.randint(s // 10, 5 * s // 2)
            self._out_of_reach(sc, "its sidecar is frozen")
            self.at(sc.frozen_until, self.ev_thaw, sc, sc.incarnation)
        elif kind == "cut":
            sc.cut_until = max(sc.cut_until, self.now + self.rng.randint(s // 2, 6 * s))
            if sc.core.role not in HOLDING:  # its members cannot fetch, nor find a holder
                self._out_of_reach(sc, "its sidecar is cut off from the broker")
        elif kind == "slow":
            sc.slow_until = self.now + self.rng.randint(s, 4 * s)
            sc.slow_extra = self.rng.randint(50, 400)
        elif kind == "slow-log":
            self.slow_log_until = self.now + self.rng.randint(s, 3 * s)
            self.slow_log_stall = self.rng.choice([4_000, k.slow_log_ms])
        self.stats[f"fault-{kind}"] += 1
        self.note(f"fault {kind} {sc.name}")
        self.at(self.now + int(self.rng.expovariate(1 / k.fault_every_ms)) + 1, self.ev_fault)

    def _kill(self, sc: Sidecar) -> None:
        sc.alive = False
        sc.incarnation += 1
        self._out_of_reach(sc, "its sidecar is gone")
        for client in self.clients:  # the kernel resets the process's connections
            if self.pod[client.name] is sc and client.transport.conn:
                self.at(self.now + 1, client.connection_reset, client.transport.conn)

    def ev_exit(self, sc: Sidecar, incarnation: int, waited: int = 0) -> None:
        if sc.incarnation != incarnation or not sc.alive:
            return
        if not sc.core.stepped_down and waited < self.core_config.step_down_ms \
                and self.now >= sc.frozen_until:
            # the process exits once its core stepped down (its writes acknowledged, the
            # lock left), as the proxy's drain waits, at most the bound
            self.at(self.now + 50, self.ev_exit, sc, incarnation, waited + 50)
            return
        self._kill(sc)
        self.at(self.now + self.rng.randint(0, self.knobs.lock_session_ms), self.ev_restart, sc)

    def _new_client(self, name: str, member_id: str, sc: Sidecar) -> FleetClient:
        k = self.knobs
        consumer = SimulatedConsumer(
            name, member_id, GROUP, topics=frozenset({"t0", "t1"}), regex=None,
            instance_id=None, server_assignor=None, rebalance_timeout_ms=2 * k.member_session_ms,
            on_acquire=self._acquire, on_release=self._release)
        kind = Kind.JAVA if self.rng.random() < k.java_share else Kind.LIBRDKAFKA
        client = FleetClient(self, consumer, kind, session_ms=k.member_session_ms,
                             heartbeat_ms=k.heartbeat_ms, commit_interval_ms=k.commit_interval_ms)
        self.pod[name] = sc
        self.clients.append(client)
        self.by_client[name] = client
        return client

    def _crash_client(self) -> None:
        """An application process dies; a new one (a new member) starts in its pod later."""
        live = [c for c in self.clients if c.alive]
        if not live:
            return
        client = self.rng.choice(live)
        client.crash()
        self.at(self.now + self.rng.randint(0, self.knobs.member_session_ms),
                self.ev_client_start, client.name)

    def ev_client_start(self, old: str) -> None:
        self.client_counter += 1
        number = self.client_counter
        base = old.split(".")[0]
        client = self._new_client(f"{base}.{number}", f"member-{base}.{number}", self.pod[old])
        client.start(0)

    def ev_restart(self, sc: Sidecar) -> None:
        if sc.alive:
            return
        self._start(sc)
        self.note(f"restart {sc.name}")

    def ev_thaw(self, sc: Sidecar, incarnation: int) -> None:
        if sc.incarnation != incarnation or not sc.alive or self.now < sc.frozen_until:
            return
        backlog, sc.backlog = sc.backlog, []
        self.perform(sc, sc.core.tick(self.local(sc)))
        for fn, args in backlog:
            if sc.incarnation != incarnation:
                return
            fn(*args)
        self.settle(sc)

    def ev_chaos_over(self) -> None:
        self.chaos_over = True
        self.slow_log_until = 0
        for sc in self.sidecars:
            sc.cut_until = sc.slow_until = 0
            if not sc.alive:
                self._start(sc)
            elif self.now < sc.frozen_until:
                sc.frozen_until = self.now
                self.at(self.now, self.ev_thaw, sc, sc.incarnation)
        self.produced = {tp: self.log_end(tp) for tp in self.all_partitions}
        self.note("chaos over")

    def on(self, sc: Sidecar, incarnation: int, fn: Callable[..., None], *args: Any) -> None:
        """Something reaches sidecar ``sc`` (of ``incarnation``) now."""
        if sc.incarnation != incarnation or not sc.alive:
            return
        if self.now < sc.frozen_until:
            sc.backlog.append((fn, args))
            return
        fn(*args)
        self.settle(sc)

    def settle(self, sc: Sidecar) -> None:
        sc.tick_token += 1
        deadline = sc.core.next_deadline()
        if sc.engine is not None and (sc.core.acting(self.local(sc))
                                      or sc.defects.timers_ignore_lease):
            engine_deadline = sc.engine.next_deadline()
            if engine_deadline is not None:
                deadline = min(deadline, engine_deadline)
        if deadline != math.inf:
            self.at(max(self.real(sc, deadline), self.now + 1), self.ev_tick, sc, sc.incarnation,
                    sc.tick_token)

    def ev_tick(self, sc: Sidecar, incarnation: int, token: int) -> None:
        if token != sc.tick_token or sc.incarnation != incarnation or not sc.alive \
                or self.now < sc.frozen_until:
            return  # (a frozen sidecar acts on the time when it thaws)
        self._tick(sc)
        self.settle(sc)

    def _tick(self, sc: Sidecar) -> None:
        now = self.local(sc)
        self.perform(sc, sc.core.tick(now))
        if sc.engine is not None and (sc.core.acting(now) or sc.defects.timers_ignore_lease):
            deadline = sc.engine.next_deadline()
            if deadline is not None and deadline <= now:
                self.check_sole_holder(sc, "timer")
                self._effects(sc, sc.engine.tick(now))
                records = sc.engine.drain_records(WALL_MS + self.now)
                if records:
                    sc.unwritten.append(records)
                self.perform(sc, sc.core.engine_ticked(bool(records), now))

    # -- the links ---------------------------------------------------------------------------

    def _broker_delay(self, sc: Sidecar) -> int:
        extra = sc.slow_extra if self.now < sc.slow_until else 0
        return self.rng.randint(1, 8) + extra

    def to_broker(self, sc: Sidecar, call: Callable[[], None]) -> None:
        """A call on the sidecar's link to the broker (lost while it is cut off)."""
        if self.now < sc.cut_until:
            self.stats["broker-calls-cut"] += 1
            return
        self.at(self.now + self._broker_delay(sc), call)

    def from_broker(self, sc: Sidecar, incarnation: int, event: ev.Event) -> None:
        if self.now < sc.cut_until:
            return
        self.at(self.now + self._broker_delay(sc), self._broker_answer, sc, incarnation, event)

    def _broker_answer(self, sc: Sidecar, incarnation: int, event: ev.Event) -> None:
        if self.now < sc.cut_until:
            return
        self.on(sc, incarnation, self._handle, sc, event)

    def _handle(self, sc: Sidecar, event: ev.Event) -> None:
        before = sc.core.role
        actions = sc.core.handle(event, self.local(sc))
        sc.deciding_role = before
        if self.verbose and sc.core.role is not before:
            self.note(f"{sc.name} {before.value} -> {sc.core.role.value} ({type(event).__name__})")
        self.perform(sc, actions)

    def fleet(self, key: tuple[object, ...], broken: Callable[[], None],
              fn: Callable[..., None], *args: Any) -> None:
        """A message on the fleet link ``key``, in order per link and client connection
        unless ``per_connection_order`` is off. Now and then the link breaks instead (a
        connection reset between pods): ``broken`` runs at the follower after a round trip."""
        k = self.knobs
        if not self.chaos_over and self.rng.random() < k.fleet_loss:
            self.stats["fleet-lost"] += 1
            self.at(self.now + self.rng.randint(1, 2 * k.fleet_delay_ms), broken)
            return
        at = self.now + self.rng.randint(1, k.fleet_delay_ms)
        if k.per_connection_order:
            at = self.fifo[key] = max(at, self.fifo.get(key, 0))
        self.at(at, fn, *args)

    def broker_check(self) -> None:
        self.broker.expire()

    # -- actions -----------------------------------------------------------------------------

    def perform(self, sc: Sidecar, actions: list[ev.Action]) -> None:
        work = list(actions)
        inc = sc.incarnation
        while work:
            action = work.pop(0)
            if isinstance(action, (ev.Lookup, ev.SendJoin, ev.SendSync, ev.SendHeartbeat,
                                   ev.SendLeave)):
                self.to_broker(sc, functools.partial(self._at_broker, sc, inc, action))
            elif isinstance(action, ev.Load):
                sc.writer = self.log.open()
                sc.unwritten = []
                self.stats["loads"] += 1
                self.at(self.now + self.rng.randint(2, 60), self.on, sc, inc, self._loaded, sc)
            elif isinstance(action, ev.RunEngine):
                work[:0] = self._run_engine(sc, action.rid)
            elif isinstance(action, ev.Write):
                self._write(sc, action.unit)
            elif isinstance(action, ev.Respond):
                self._answer(sc, action.rid, None)
            elif isinstance(action, ev.Fail):
                self._fail(sc, action.rid, ErrorCode(action.error))
            elif isinstance(action, ev.Relay):
                self._relay(sc, action.rid, action.holder)
            elif isinstance(action, ev.Suspend):
                if sc.engine is not None:
                    sc.engine.suspend(GROUP)
            elif isinstance(action, ev.Resume):
                if sc.engine is not None:
                    self._effects(sc, sc.engine.resume(GROUP, self.local(sc)))
                    self._drain(sc)
            elif isinstance(action, ev.Forget):
                group = sc.engine.groups.get(GROUP) if sc.engine is not None else None
                members = frozenset(group.members) if group is not None else frozenset()
                sc.engine = None
                sc.writer = 0
                sc.unwritten = []
                self.note(f"{sc.name} forgets: {action.reason}")
                work[:0] = sc.core.handle(ev.Forgotten(members), self.local(sc))
        self._bound_commits(sc)

    def _at_broker(self, sc: Sidecar, incarnation: int, call: ev.Action) -> None:
        """The broker receives ``call`` from ``sc``; its answer goes back on the link."""
        def reply(answer: ev.Event) -> None:
            self.from_broker(sc, incarnation, answer)

        broker = self.broker
        if isinstance(call, ev.Lookup):
            reply(broker.describe(call.attempt))
        elif isinstance(call, ev.SendJoin):
            broker.join(sc.name, call.member_id, call.attempt, reply)
        elif isinstance(call, ev.SendSync):
            broker.sync(call.member_id, call.generation, call.attempt, reply)
        elif isinstance(call, ev.SendHeartbeat):
            broker.heartbeat(call.member_id, call.generation, call.attempt, reply)
        elif isinstance(call, ev.SendLeave):
            broker.leave(call.member_id)

    def _drain(self, sc: Sidecar) -> None:
        assert sc.engine is not None
        records = sc.engine.drain_records(WALL_MS + self.now)
        if records:
            sc.unwritten.append(records)
            self.perform(sc, sc.core.engine_ticked(True, self.local(sc)))

    def _loaded(self, sc: Sidecar) -> None:
        if sc.core.role is not Role.LOADING:
            return
        ok = self.rng.random() >= self.knobs.load_fail or self.chaos_over
        complete = bool(self.log.log)
        if ok:
            engine = GroupCoordinator(self.engine_config, self.image)
            took_over = bool(self.log.log)
            engine.load(list(self.log.log), self.local(sc), WALL_MS + self.now)
            engine.drain_records(WALL_MS + self.now)
            sc.engine = engine
            self.check_clients_known(engine)
            if not (took_over and sc.defects.takeover_advertises_no_topics):
                sc.advertises = True
                self._advertise(sc)
        self.note(f"{sc.name} loaded ok={ok}")
        if ok and not complete:
            self.stats["loads-of-nothing"] += 1
        self._handle(sc, ev.LoadDone(ok, complete))

    def _advertise(self, sc: Sidecar) -> None:
        """The lock member advertises the group's topics (the loaded group's after a
        takeover, and new ones as members subscribe: the planned rejoin, not simulated)."""
        group = sc.engine.groups.get(GROUP) if sc.engine is not None else None
        if group is None or not sc.advertises:
            return
        topics = frozenset(n for m in group.members.values() for n in m.subscribed_topic_names)
        self.broker.subscribe(sc.core.member_id, topics)

    def _write(self, sc: Sidecar, unit: int) -> None:
        records = sc.unwritten.pop(0) if sc.unwritten else []
        writer = sc.writer
        k = self.knobs
        delay = self.rng.randint(1, k.write_delay_ms)
        if self.now < self.slow_log_until:
            delay += self.rng.randint(0, self.slow_log_stall)
        ack_at = max(self.log.last_ack.get(writer, 0), self.now + delay)
        fails = not self.chaos_over and self.rng.random() < k.write_fail
        if ack_at - self.now > WRITE_TIMEOUT_MS:  # the writer gives up (state-log write-timeout)
            ack_at, fails = self.now + WRITE_TIMEOUT_MS, True
            self.stats["writes-timed-out"] += 1
        self.log.last_ack[writer] = ack_at
        self.at(ack_at, self._ack, sc, sc.incarnation, writer, unit, records, fails)

    def _ack(self, sc: Sidecar, incarnation: int, writer: int, unit: int,
             records: list[StateRecord], fails: bool) -> None:
        if writer != self.log.epoch or writer in self.log.broken or fails:
            self.log.broken.add(writer)
            self.stats["writes-failed" if not fails else "writes-failed-at-random"] += 1
            if writer != self.log.epoch:
                self.stats["writes-fenced"] += 1
            self.on(sc, incarnation, self._write_done, sc, writer, ev.WriteFailed(unit))
            return
        self.log.log.extend(records)
        self.stats["writes"] += 1
        self.on(sc, incarnation, self._write_done, sc, writer, ev.Written(unit))

    def _write_done(self, sc: Sidecar, writer: int, event: ev.Event) -> None:
        if writer == sc.writer:
            self._handle(sc, event)

    def _effects(self, sc: Sidecar, effects: list[Effect]) -> None:
        """An engine call's effects: a live member fenced while a request of it is inside a
        sidecar (waiting there, or being decided) is a violation."""
        for effect in effects:
            if not isinstance(effect, MemberFenced):
                continue
            self.stats[f"engine-fenced-{effect.reason}"] += 1
            client = self._client_of(effect.member_id)
            if self.verbose:
                self.note(f"{sc.name}'s engine fences {effect.member_id} ({effect.reason})")
            if client is None or not client.alive or client.consumer.state in (
                    ClientState.JOINING, ClientState.LEAVING):
                continue  # (a member rejoining or leaving has given its partitions up)
            if not self.reach.reaches(client.name):
                continue  # (its sidecar cannot reach a coordinator for it: the network's)
            inside = [x for x in self.sidecars if x.alive and x.inside[effect.member_id]
                      and not self._refused_inside(x, effect.member_id)]
            if not inside:
                continue
            message = (f"{sc.name}'s engine fenced live member {client.name} ({effect.reason}) "
                       f"while a request of it was inside {inside[0].name}")
            gap = self.owners.fenced_by_gap.get(client.name) or self._blocked_by(inside[0],
                                                                                 client)
            if gap is None:
                raise InvariantViolation(message)
            self.owners.fenced_by_gap[client.name] = gap
            self.gap(gap, message)

    def _refused_inside(self, sc: Sidecar, member_id: str) -> bool:
        """Every request of ``member_id`` inside ``sc`` has its answer decided, and it tells
        the member it is fenced (a heartbeat at an epoch the engine refuses): the session's
        end changes nothing for it."""
        mine = [p for p in sc.pending.values() if p.member_id == member_id and not p.gone]
        return bool(mine) and all(
            isinstance(p.response, ConsumerGroupHeartbeatResponse)
            and p.response.error_code in FENCING for p in mine)

    def _blocked_by(self, sc: Sidecar, client: FleetClient) -> str | None:
        """Which known gap holds ``client``'s requests inside ``sc``: the first request of
        its connection there is a ticketed commit waiting for the broker ``sc`` was cut off
        from, or a commit waiting for the holder's CommitTicket."""
        for connection, queue in sc.queues.items():
            head = sc.pending.get(queue[0]) if connection[0] == client.name and queue else None
            if head is None or not head.is_commit:
                continue
            if queue[0] in sc.at_broker and head.cut_at_broker and head.relayed:
                return "stuck-ticketed-commit"
            if head.relayed and queue[0] not in sc.at_broker:
                return "commit-relay-outlasts-session"
        return None

    def _client_of(self, member_id: str) -> FleetClient | None:
        return next((c for c in self.clients if c.consumer.member_id == member_id), None)

    def _run_engine(self, sc: Sidecar, rid: int) -> list[ev.Action]:
        pending = sc.pending[rid]
        assert sc.engine is not None, "the core ran the engine before it was loaded"
        now = self.local(sc)
        if self.closed(pending):
            self._drop(sc, rid)  # it died with its connection while it was held
            self.stats["requests-gone-with-connection"] += 1
            return sc.core.handle(ev.EngineDone(rid, False), now)
        self.check_sole_holder(sc, "request")
        self._report_inside(sc, pending)
        if self._stale_retries(sc, pending, decided_here=True):
            return sc.core.handle(ev.EngineDone(rid, False), now)
        what = pending.sent.what
        if isinstance(what, Commit):
            code = sc.engine.validate_offset_commit(GROUP, what.member_id, what.epoch,
                                                    [tp for tp, _ in what.offsets])
            self.stats["engine-commits"] += 1
            if code is not ErrorCode.NONE:
                pending.response, pending.source = code, "engine"
                return sc.core.handle(ev.EngineDone(rid, False), now)
            stamp = Ticket(sc.core.member_id, sc.core.generation)
            if pending.origin is not None and pending.origin.protocol >= 3 \
                    and sc.protocol >= 3:  # a follower's CommitTicket: it sends the commit
                pending.response, pending.source = stamp, "engine"
                return sc.core.handle(ev.EngineDone(rid, False), now)
            self._commit_to_broker(sc, rid, pending, what, stamp)
            return []  # EngineDone once the broker answers
        response, effects = sc.engine.heartbeat(what, now)
        self._effects(sc, effects)
        pending.response, pending.source = response, "engine"
        records = sc.engine.drain_records(WALL_MS + self.now)
        if records:
            sc.unwritten.append(records)
        self._advertise(sc)
        self.stats["engine-calls"] += 1
        return sc.core.handle(ev.EngineDone(rid, bool(records)), now)

    def _report_inside(self, sc: Sidecar, pending: Pending) -> None:
        if sc.engine is None or pending.reported is not None \
                or sc.defects.sessions_run_while_inside or not pending.member_id:
            return
        sc.engine.request_arrived(GROUP, pending.member_id, self.local(sc))
        pending.reported = sc.engine

    # -- commits at the broker ---------------------------------------------------------------

    def _commit_to_broker(self, sc: Sidecar, rid: int, pending: Pending, what: Commit,
                          stamp: Ticket) -> None:
        """Stamped with the lock's member id and generation, on the member's connection."""
        channel = pending.connection
        sc.at_broker[rid] = channel
        inc = sc.incarnation
        if pending.origin is None and not pending.upstream:
            pending.upstream = True  # the connection's next request may be decided
            self.at(self.now, self.on, sc, inc, self._pump, sc, channel)
        if self.now < sc.cut_until:
            pending.cut_at_broker = True
            self.stats["commits-cut"] += 1
            return
        # A client's retry of a partition the guard did not take for stale can only be one it
        # could not see (with the guard on, the ones it saw are acknowledged and never sent:
        # a retry it found partly stale still carries the other partitions unseen).
        unseen = frozenset(tp for tp, _ in what.offsets if tp not in pending.guarded) \
            if pending.sent.attempt > 0 else frozenset()
        # On the client connection's own broker socket: the broker handles one request of a
        # connection at a time, in order (a slow broker takes longer for each, so a
        # connection with a backlog is carried out late while a new one starts at once).
        key = (sc.name, "broker", channel)
        service = self.rng.randint(20, 200) if self.now < sc.slow_until \
            else self.rng.randint(1, 3)
        at = self.fifo[key] = max(self.now + self._broker_delay(sc),
                                  self.fifo.get(key, 0)) + service
        self.at(at, self._commit_arrives, sc, inc, rid, channel, stamp, what, unseen)

    def _commit_arrives(self, sc: Sidecar, inc: int, rid: int, channel: Connection,
                        stamp: Ticket, what: Commit, unseen: frozenset[TP]) -> None:
        if sc.incarnation == inc and channel in sc.reset_links:
            self.stats["commits-dropped-with-connection"] += 1
            return  # the broker connection was reset: unread requests are dropped
        if sc.incarnation == inc and channel in sc.closed_links:
            # From a connection the proxy knew closed: not a retry the guard could not see,
            # but a commit it should have dropped with the connection (902abd8).
            self.stats["commits-landed-after-close"] += 1
            unseen = frozenset()
        code = self.broker.commit(stamp.member_id, stamp.generation, what.offsets,
                                  f"{channel[0]} via {sc.name}", unseen)
        self.stats[f"broker-commit-{code.name}"] += 1
        if self._answer_cut(sc, inc, rid):
            return
        key = (sc.name, "from-broker", channel)
        at = self.fifo[key] = max(self.now + self._broker_delay(sc), self.fifo.get(key, 0))
        self.at(at, self._commit_answered_at, sc, inc, rid, code)

    def _commit_answered_at(self, sc: Sidecar, inc: int, rid: int, code: ErrorCode) -> None:
        if self._answer_cut(sc, inc, rid):
            return
        self.on(sc, inc, self._commit_done, sc, rid, code)

    def _answer_cut(self, sc: Sidecar, inc: int, rid: int) -> bool:
        """The broker's answer to a commit is lost: ``sc`` is cut off from the broker."""
        if self.now >= sc.cut_until:
            return False
        pending = sc.pending.get(rid) if sc.incarnation == inc else None
        if pending is not None:
            pending.cut_at_broker = True
        return True

    def _commit_done(self, sc: Sidecar, rid: int, code: ErrorCode) -> None:
        if sc.at_broker.pop(rid, None) is None:
            return
        pending = sc.pending.get(rid)
        if pending is None:
            return
        # A refused stamp (the lock's generation moved): the retriable load error.
        pending.response = ErrorCode.NONE if code is ErrorCode.NONE \
            else ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        pending.source = "broker-stamp"
        if pending.relayed:  # a follower's ticketed commit
            pending.relayed = False
            self._handle(sc, ev.RelayDone(rid, refused=False))
            return
        self.perform(sc, sc.core.handle(ev.EngineDone(rid, False), self.local(sc)))

    def _bound_commits(self, sc: Sidecar) -> None:
        """Commits waiting for the broker are answered once the lease is cut off (the holder
        no longer holds the group): the member's later requests wait behind them."""
        if not sc.at_broker or sc.defects.relayed_commits_unbounded:
            return
        if sc.core.role in HOLDING and sc.core.role is not Role.INTERRUPTED:
            return
        if sc.core.role is Role.INTERRUPTED and \
                self.local(sc) < sc.core.session_deadline:
            return
        waiting = [rid for rid in sc.at_broker
                   if rid in sc.pending and not sc.pending[rid].relayed]
        for rid in waiting:
            if sc.at_broker.pop(rid, None) is None:
                continue
            self.stats["commits-bounded"] += 1
            self.perform(sc, sc.core.handle(ev.EngineDone(rid, False), self.local(sc)))

    # -- requests and answers -----------------------------------------------------------------

    def client_send(self, client: FleetClient, sent: Sent) -> None:
        """A request on the client's connection to its pod's sidecar."""
        sc = self.pod[client.name]
        if sc.alive:  # (a copy: the client sends the same request again on a new connection)
            self.at(self._on_connection(client, sent.conn), self.on, sc, sc.incarnation,
                    self.sidecar_request, sc, client, replace(sent))

    def _on_connection(self, client: FleetClient, conn: int) -> int:
        """When what the client writes now on ``conn`` reaches its sidecar (in order)."""
        key = (client.name, "to-sidecar", conn)
        at = self.fifo[key] = max(self.now + self.rng.randint(0, 2), self.fifo.get(key, 0))
        return at

    def client_closed(self, client: FleetClient, conn: int) -> None:
        sc = self.pod[client.name]
        if sc.alive:
            self.at(self._on_connection(client, conn), self.on, sc, sc.incarnation,
                    self._connection_closed, sc, (client.name, conn))

    def sidecar_process_up(self, client: FleetClient) -> bool:
        return self.pod[client.name].alive

    def can_fetch(self, client: FleetClient) -> bool:
        sc = self.pod[client.name]
        return sc.alive and self.now >= sc.frozen_until and self.now >= sc.cut_until

    def committed(self, tp: TP) -> int:
        return self.broker.offsets.get(tp)

    def log_end(self, tp: TP) -> int:
        t = min(self.now, self.knobs.idle_after_ms) if tp[0] == self.idle_topic else self.now
        return t // self.knobs.record_ms

    def sidecar_request(self, sc: Sidecar, client: FleetClient, sent: Sent) -> None:
        self.rid += 1
        rid = self.rid
        connection = (client.name, sent.conn)
        pending = Pending(client, sent, connection=connection)
        sc.pending[rid] = pending
        if pending.member_id:
            sc.inside[pending.member_id] += 1
        sc.queues.setdefault(connection, deque()).append(rid)
        self._pump(sc, connection)

    def _pump(self, sc: Sidecar, connection: Connection) -> None:
        """A client connection's requests, as the proxy's connection handles them
        (``proxy/connection.py``): answers leave in request order; a request is decided once
        every earlier one is answered or sent on to the broker."""
        queue = sc.queues.get(connection)
        while queue:
            head = sc.pending.get(queue[0])
            if head is not None and not head.ready:
                break
            rid = queue.popleft()
            if head is not None:
                del sc.pending[rid]
                self._deliver(sc, head)
        if not queue:
            sc.queues.pop(connection, None)
            return
        for rid in queue:
            p = sc.pending.get(rid)
            if p is None:
                continue
            if not p.dispatched:
                self._dispatch(sc, rid)
                return
            if not (p.ready or p.upstream):
                return

    def _dispatch(self, sc: Sidecar, rid: int) -> None:
        """A request is decided (every earlier one of its connection is answered, or on its
        way to the broker)."""
        pending = sc.pending[rid]
        pending.dispatched = True
        what = pending.sent.what
        if isinstance(what, ConsumerGroupHeartbeatRequest):
            answers = sc.answers.setdefault(pending.connection, HeartbeatAnswers())
            pending.carried = what.member_epoch
            given = answers.catch_up({"member_id": what.member_id,
                                      "member_epoch": what.member_epoch})
            if given is not None:
                self.stats["heartbeats-caught-up"] += 1
                pending.sent = replace(pending.sent, what=replace(what, member_epoch=given))
            self._handle(sc, ev.Request(rid, what.member_id or "",
                                        starts_group=what.member_epoch == 0,
                                        **self._heartbeat_hold(sc)))
            return
        self._handle(sc, ev.Request(rid, what.member_id))

    def _stale_retries(self, sc: Sidecar, pending: Pending, *, decided_here: bool) -> bool:
        """The client's sidecar takes out of a commit the partitions that are stale retries
        (:mod:`proxy.coordination.commit_retries`), once it is decided (after any wait): when
        its own engine decides, any stale retry; when the holder does, only one carrying the
        epoch the newer commit carried. True: nothing is left to write."""
        what = pending.sent.what
        if pending.origin is not None or not isinstance(what, Commit):
            return False
        epoch = None if decided_here else what.epoch
        fresh = tuple((tp, o) for tp, o in what.offsets
                      if not sc.guard.stale(GROUP, what.member_id, (str(tp[0]), tp[1]), o,
                                            epoch))
        pending.guarded = frozenset(tp for tp, _ in what.offsets) - {tp for tp, _ in fresh}
        if not pending.guarded or sc.defects.no_stale_retry_guard:
            return False
        self.stats["stale-retries-acknowledged"] += len(what.offsets) - len(fresh)
        if not fresh:
            pending.response, pending.source = ErrorCode.NONE, "guard"
            return True
        pending.sent = replace(pending.sent, what=replace(what, offsets=fresh))
        return False

    def _link_closed(self, sc: Sidecar, connection: Connection) -> None:
        sc.closed_links.add(connection)
        if not sc.defects.closed_connection_commits_land:
            sc.reset_links.add(connection)

    def _heartbeat_hold(self, sc: Sidecar) -> dict[str, Any]:
        """A heartbeat waits at most half a heartbeat interval for a lookup, an election or
        a load, then gets the retriable COORDINATOR_LOAD_IN_PROGRESS (24049ab)."""
        if sc.defects.heartbeats_held_whole_hold:
            return {}
        return {"hold_ms": self.knobs.heartbeat_ms // 2,
                "hold_error": ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}

    def _connection_closed(self, sc: Sidecar, connection: Connection) -> None:
        """The client closed ``connection``: what waits behind its first request goes; the
        broker connection behind it is reset (what the broker has not read is dropped)."""
        for rid in sc.queues.pop(connection, deque()):
            pending = sc.pending.get(rid)
            if pending is None:
                continue
            if not pending.dispatched or pending.ready:
                self._drop(sc, rid)
            else:
                self._left(sc, pending)  # abandoned: it goes on, but holds the member no more
        sc.answers.pop(connection, None)
        self._link_closed(sc, connection)
        if any(x.protocol < 3 for x in self.sidecars):
            # A protocol-2 holder commits what followers relay: the follower's link for this
            # connection closes, and so, at the holder, does the broker connection behind it.
            for other in self.sidecars:
                if other is not sc:
                    self.at(self.now + self.knobs.fleet_delay_ms, self.on, other,
                            other.incarnation, self._link_closed, other, connection)
        client = self.by_client.get(connection[0])
        if client is not None:
            sc.guard.disrupted(GROUP, client.consumer.member_id)

    def _drop(self, sc: Sidecar, rid: int) -> None:
        pending = sc.pending.pop(rid, None)
        if pending is None:
            return
        self._left(sc, pending)

    def _left(self, sc: Sidecar, pending: Pending) -> None:
        """``pending`` is no longer inside ``sc``."""
        if pending.gone:
            return
        pending.gone = True
        if pending.member_id and sc.inside[pending.member_id] > 0:
            sc.inside[pending.member_id] -= 1
        engine = pending.reported
        if engine is not None and engine is sc.engine:
            self._effects(sc, engine.request_left(GROUP, pending.member_id, self.local(sc)))

    def _relay(self, sc: Sidecar, rid: int, holder: str) -> None:
        pending = sc.pending.get(rid)
        target = self.by_name.get(holder)
        if pending is None or target is None:
            return
        if self.closed(pending):
            self._drop(sc, rid)
            return
        if self._stale_retries(sc, pending, decided_here=False):
            self._answer(sc, rid, None)
            return
        pending.relayed = True
        self.stats["relays"] += 1
        broken = functools.partial(self.on, sc, sc.incarnation, self._relay_timeout, sc, rid)
        self.fleet((sc.name, target.name, pending.connection), broken, self.on, target,
                   target.incarnation, self._inbound, target, sc, sc.incarnation, rid,
                   pending.sent, pending.connection)
        wait = self.knobs.relay_other_ms if pending.is_commit else self.knobs.relay_heartbeat_ms
        self.at(self.now + wait, self.on, sc, sc.incarnation, self._relay_timeout, sc, rid)

    def _relay_timeout(self, sc: Sidecar, rid: int) -> None:
        pending = sc.pending.get(rid)
        if pending is not None and pending.relayed and rid not in sc.at_broker:
            pending.relayed = False
            self._handle(sc, ev.RelayDone(rid, refused=True))

    def _inbound(self, sc: Sidecar, origin: Sidecar, origin_incarnation: int, origin_rid: int,
                 sent: Sent, connection: Connection) -> None:
        self.rid += 1
        pending = Pending(None, sent, origin, origin_incarnation, origin_rid,
                          connection=connection)
        if self.closed(pending):
            return  # the follower closed the link with the client's connection
        sc.pending[self.rid] = pending
        if pending.member_id:
            sc.inside[pending.member_id] += 1
        pending.dispatched = True
        what = sent.what
        heartbeat = isinstance(what, ConsumerGroupHeartbeatRequest)
        starts = heartbeat and what.member_epoch == 0
        hold = self._heartbeat_hold(sc) if heartbeat else {}
        self._handle(sc, ev.Request(self.rid, pending.member_id, starts_group=starts,
                                    inbound=True, **hold))

    def _relayed_back(self, sc: Sidecar, rid: int, response: Response | Ticket,
                      source: str) -> None:
        pending = sc.pending.get(rid)
        if pending is None or not pending.relayed:
            return
        pending.relayed = False
        if isinstance(response, Ticket):
            # CommitTicket granted: the stamped commit goes to the broker on the client's
            # own connection from here; the relay ends with the broker's answer.
            what = pending.sent.what
            assert isinstance(what, Commit)
            self.stats["commit-tickets"] += 1
            pending.relayed = True
            self._commit_to_broker(sc, rid, pending, what, response)
            return
        code = response if isinstance(response, ErrorCode) else ErrorCode(response.error_code)
        if code is ErrorCode.NOT_COORDINATOR:
            self._handle(sc, ev.RelayDone(rid, refused=True))
            return
        pending.response, pending.source = response, source
        self._handle(sc, ev.RelayDone(rid, refused=False))

    def _fail(self, sc: Sidecar, rid: int, error: ErrorCode) -> None:
        pending = sc.pending.get(rid)
        if pending is None:
            return
        role = sc.core.role
        if error is ErrorCode.UNKNOWN_MEMBER_ID and sc.deciding_role is Role.LETTING_GO:
            role = Role.LETTING_GO  # (its last tell ended the letting go: it is absent now)
        if (sc.defects.stepping_down_passes_to_broker and role is Role.STEPPING_DOWN
                and pending.is_commit and pending.origin is None):
            # Passed to the broker, whose group of that id is the lock: it knows no member.
            pending.response, pending.source = ErrorCode.UNKNOWN_MEMBER_ID, "broker"
        elif pending.is_commit:
            pending.response, pending.source = error, f"core:{role.value}"
        else:
            pending.response = ConsumerGroupHeartbeatResponse(error_code=error)
            pending.source = f"core:{role.value}"
        self._answer(sc, rid, None)

    def _answer(self, sc: Sidecar, rid: int, error: ErrorCode | None) -> None:
        pending = sc.pending.get(rid)
        if pending is None or pending.ready:
            return
        sc.at_broker.pop(rid, None)
        response = pending.response
        assert response is not None and error is None
        if pending.origin is None:
            pending.ready = True
            if pending.connection in sc.queues:
                self._pump(sc, pending.connection)
            else:  # its connection closed: the answer has nowhere to go
                self._drop(sc, rid)
            return
        del sc.pending[rid]
        self._left(sc, pending)
        if pending.origin is not None:
            origin = pending.origin
            broken = functools.partial(self.on, origin, pending.origin_incarnation,
                                       self._relay_timeout, origin, pending.origin_rid)
            self.fleet((sc.name, origin.name, pending.connection), broken, self.on, origin,
                       pending.origin_incarnation, self._relayed_back, origin,
                       pending.origin_rid, response, pending.source)
            return

    def _deliver(self, sc: Sidecar, pending: Pending) -> None:
        """``pending``'s answer leaves for its client (every earlier one of its connection
        has)."""
        self._left(sc, pending)
        client = pending.client
        response = pending.response
        assert client is not None and response is not None
        what = pending.sent.what
        if isinstance(what, ConsumerGroupHeartbeatRequest):
            assert isinstance(response, ConsumerGroupHeartbeatResponse)
            answers = sc.answers.get(pending.connection)
            if answers is not None and not sc.defects.no_heartbeat_catch_up:
                answers.answered(pending.carried,
                                 {"member_id": what.member_id},
                                 {"member_id": response.member_id,
                                  "member_epoch": response.member_epoch,
                                  "error_code": response.error_code})
        else:
            assert isinstance(response, ErrorCode)
            self._observe_commit(sc, what, response)
        key = (client.name, "to-client", pending.connection[1])
        at = self.fifo[key] = max(self.now + self.rng.randint(0, 2), self.fifo.get(key, 0))
        self.at(at, self.ev_answer, client, pending, sc)

    def _observe_commit(self, sc: Sidecar, what: Commit, code: ErrorCode) -> None:
        request = {"topics": [{"name": str(tp[0]), "partitions": [
            {"partition_index": tp[1], "committed_offset": o}]} for tp, o in what.offsets],
            "generation_id_or_member_epoch": what.epoch}
        response = {"topics": [{"name": str(tp[0]), "partitions": [
            {"partition_index": tp[1], "error_code": int(code)}]} for tp, _ in what.offsets]}
        sc.guard.observe(GROUP, what.member_id, request, response)

    def closed(self, pending: Pending) -> bool:
        """The client closed the connection ``pending`` came on (it timed out)."""
        name, number = pending.connection
        client = self.by_client.get(name)
        return self.knobs.per_connection_order and (
            client is None or client.transport.conn != number)

    # -- clients -----------------------------------------------------------------------------

    def _acquire(self, consumer: SimulatedConsumer, tp: TP) -> None:
        if self.verbose:
            self.note(f"{consumer.name} acquires {fmt(tp)} at epoch {consumer.epoch}")
        self.owners.acquire(consumer.name, tp)
        client = self._named(consumer.name)
        if client is not None:
            client.acquired(tp)

    def _release(self, consumer: SimulatedConsumer, tp: TP, reason: str) -> None:
        if self.verbose:
            self.note(f"{consumer.name} releases {fmt(tp)} ({reason})")
        self.owners.release(consumer.name, tp)
        client = self._named(consumer.name)
        if client is not None:
            client.released(tp)

    def _named(self, name: str) -> FleetClient | None:
        return self.by_client.get(name)

    def ev_answer(self, client: FleetClient, pending: Pending, sc: Sidecar) -> None:
        """``pending``'s answer reaches its client."""
        sent, response = pending.sent, pending.response
        assert response is not None
        t = client.transport
        if t.conn != sent.conn or sent.seq not in t.in_flight or not client.alive:
            if pending.source == "core:letting-go" and not pending.is_commit and \
                    isinstance(response, ConsumerGroupHeartbeatResponse) and \
                    response.error_code == ErrorCode.UNKNOWN_MEMBER_ID and client.alive:
                self.stats["let-go-tells-lost"] += 1
                self.owners.fenced_by_gap.setdefault(client.name, "let-go-told-once")
            return
        code = response if isinstance(response, ErrorCode) else ErrorCode(response.error_code)
        if pending.is_commit and pending.source == "core:letting-go" \
                and code is ErrorCode.UNKNOWN_MEMBER_ID:
            self.stats["let-go-tells-spent-on-commits"] += 1
            self.owners.fenced_by_gap.setdefault(client.name, "let-go-told-once")
        if self.verbose:
            extra = ""
            if isinstance(response, ConsumerGroupHeartbeatResponse):
                extra = f" epoch {response.member_epoch}"
                if response.assignment is not None:
                    extra += " assignment " + ",".join(
                        fmt((t, p)) for t, ps in response.assignment for p in ps)
            self.note(f"{client.name} <- {code.name} from {pending.source} via {sc.name} "
                      f"({'commit' if pending.is_commit else 'heartbeat'} seq {sent.seq})"
                      + extra)
        if code in FENCING and client.consumer.state not in (ClientState.JOINING,
                                                             ClientState.LEAVING):
            self._check_told_to_let_go(client, pending, code)
        client.answer(sent.seq, sent.conn, response)
        if code in AUTHORITATIVE and not pending.is_commit:  # (a commit says nothing of it)
            if self.reach.heard(client.name):  # once it acted on the answer
                self.owners.back_in_reach(client.name, client.consumer.owned)
        elif self.now < sc.cut_until and sc.core.role not in HOLDING | {
                Role.LETTING_GO, Role.FOLLOWING}:
            self.reach.lost(client.name, "its sidecar is cut off and knows no holder")

    def _check_told_to_let_go(self, client: FleetClient, pending: Pending,
                              code: ErrorCode) -> None:
        """Only an engine, or a sidecar letting go of a group it lost, tells a live member
        it is fenced."""
        self.stats[f"told-{code.name}-{pending.source}"] += 1
        if pending.source in ("engine", "core:letting-go"):
            return
        raise InvariantViolation(
            f"live member {client.name} told {code.name} by {pending.source} "
            f"({'commit' if pending.is_commit else 'heartbeat'})")

    def revocation_started(self, client: FleetClient, token: int) -> None:
        """The client's revocation callback runs for a while, then it releases."""
        self.at(self.now + self.rng.randint(0, 150), self.ev_revoked, client, token)

    def ev_revoked(self, client: FleetClient, token: int) -> None:
        if client.alive and client.consumer.finish_revocation(token):
            client.heartbeat_now()

    # -- the checks ---------------------------------------------------------------------------

    def check_sole_holder(self, sc: Sidecar, what: str) -> None:
        """``sc`` runs the engine now: it must be the broker group's leader, and no other
        sidecar may be acting."""
        self.stats[f"acts-{what}"] += 1
        self.broker.expire()
        if not sc.core.acting(self.local(sc)):
            raise InvariantViolation(f"{sc.name} runs the engine ({what}) outside its lease")
        if self.broker.holder_member() != sc.core.member_id:
            raise InvariantViolation(
                f"{sc.name} runs the engine ({what}) as {sc.core.member_id!r} while the broker's "
                f"group is led by {self.broker.leader!r} (members "
                f"{sorted(self.broker.members)}, {self.broker.state})")
        for other in self.sidecars:
            if other is not sc and other.alive and self.now >= other.frozen_until \
                    and other.core.acting(self.local(other)):
                raise InvariantViolation(f"{sc.name} and {other.name} both act for the group")

    def check_clients_known(self, engine: GroupCoordinator) -> None:
        """No client may know a member epoch the log a takeover loaded does not hold: every
        answer waited for the writes it depends on."""
        group = engine.groups.get(GROUP)
        for client in self.clients:
            c = client.consumer
            if c.state in (ClientState.JOINING, ClientState.LEAVING) or not c.epoch \
                    or not c.alive:
                continue
            member = None if group is None else group.members.get(c.member_id)
            if member is not None and c.epoch > member.member_epoch:
                raise InvariantViolation(
                    f"client {c.name} knows epoch {c.epoch}, the state log loaded by "
                    f"a takeover only {member.member_epoch}")

    def _stranded(self, unowned: set[TP]) -> bool:
        """Every unowned partition is one the engine assigned to a live, stable member at the
        epoch its client has, which the client never heard of (its answer was lost)."""
        engine = next((sc.engine for sc in self.sidecars
                       if sc.engine is not None and sc.core.acting(self.local(sc))), None)
        group = engine.groups.get(GROUP) if engine is not None else None
        if group is None:
            return False
        for tp in unowned:
            member = next((m for m in group.members.values()
                           if tp[1] in m.assigned_partitions().get(tp[0], ())), None)
            client = self._client_of(member.member_id) if member is not None else None
            if client is None or not client.alive or client.consumer.epoch != member.member_epoch:
                return False
        return True

    def check_progress(self) -> None:
        acting = [sc.name for sc in self.sidecars if sc.core.acting(self.local(sc))]
        if len(acting) != 1:
            raise InvariantViolation(f"no progress: {len(acting)} sidecars coordinate "
                                     f"({acting}) after the faults stopped")
        live = [c for c in self.clients if c.alive]
        owned = {tp for c in live for tp in c.consumer.owned}
        unsettled = [c.name for c in live if c.consumer.state is not ClientState.STABLE]
        if owned != self.all_partitions or unsettled:
            message = (f"no progress: {len(self.all_partitions - owned)} partitions unowned, "
                       f"clients not stable: {unsettled}")
            if unsettled or not self._stranded(self.all_partitions - owned):
                raise InvariantViolation(message)
            self.gap("stranded-after-lost-answer", message)
            return
        self.broker.offsets.check_consumed(self.produced)


def run_fleet_seed(seed: int, knobs: Knobs | None = None) -> FleetResult:
    return FleetSimulation(seed, knobs).run()


def with_defects(seed: int, **switches: bool) -> Knobs:
    """The seed's knobs with the named defects put back."""
    knobs = knobs_for_seed(seed)
    return replace(knobs, defects=replace(knobs.defects, **switches))


__all__ = ["GROUP", "FleetResult", "FleetSimulation", "Knobs", "fmt", "knobs_for_seed",
           "run_fleet_seed", "with_defects"]
