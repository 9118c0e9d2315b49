"""Seeded discrete-event simulation of one KIP-848 group under churn and faults.

One :class:`GroupCoordinator` and many :class:`SimulatedConsumer` s exchange heartbeats
through a simulated network that delays and loses messages. A seeded ``random.Random``
decides everything (member count, topics, which faults happen when), so a seed replays
exactly. During the chaos phase members join, leave, crash, bounce (static members leave with
epoch -2 and come back under a new member id), change subscriptions (names and regexes),
revoke slowly; topics get partitions, are created, deleted and recreated. Then the chaos
stops and the group must quiesce.

After every event the simulator checks (see :mod:`translation.simulation.invariants`): no
partition owned by two clients at once (as the clients believe it), epochs never go
backwards, the coordinator's ownership map is consistent; commit probes check that a commit
from a member whose partition moved on is rejected and that a commit from the current
owner is accepted under the relaxed rule. At quiescence every subscribed partition must be
owned by exactly one member and the group must be STABLE.

Classic members (:mod:`translation.simulation.classic_client`, eager or cooperative, static
or not) are mixed in: ``Knobs.classic_share`` is the probability that a new client speaks
JoinGroup/SyncGroup/Heartbeat (a static instance may come back under either protocol, as in a
rolling upgrade); it is drawn per seed from its own random stream, so the new-protocol-only
seeds replay as before. Classic requests go through
:class:`~translation.classic.coordinator.ClassicGroupCoordinator`; a held JoinGroup is answered
when the engine emits :class:`~translation.effects.JoinCompleted`.

Coordinator failover (``Knobs.failover_rate`` > 0): the engine keeps durable state, and after
every engine call the simulator drains its records into a write pipeline
(:mod:`translation.simulation.failover`) that acknowledges them after a delay; a response waits
until every unit written up to its call is acknowledged. At random moments (anywhere: during a
rebalance, right after a call wrote records nobody acknowledged yet, right after an
acknowledgement whose responses are still on their way) the coordinator dies: unacknowledged
records and the responses waiting on them are lost, requests in flight to it are lost, and after
a pause a new coordinator loaded from the acknowledged records (sometimes compacted) takes
over, on a monotonic clock of its own. At each failover the simulator checks that the records
drained so far fold to the dying engine's state, that a coordinator loaded with nothing lost is
that same group, and that no live client knows an epoch the new coordinator does not; the usual
invariants go on after every event. Failover decisions draw from their own random stream, and
with the knob at 0 nothing of this runs, so the other seeds replay as before.

``run_seed(seed)`` returns a :class:`SimulationResult`; ``groupgate simulate --seed N``
replays one seed.
"""

from __future__ import annotations

import heapq
import random
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from translation.assignors.base import PartitionAssignor
from translation.classic.coordinator import ClassicGroupCoordinator
from translation.classic.messages import (
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
from translation.config import GroupConfig, OffsetCommitRule
from translation.coordinator import GroupCoordinator
from translation.effects import (
    DepartureWaitEnded,
    Effect,
    GroupExpired,
    JoinCompleted,
    MemberFenced,
    MemberLeft,
    MemberReplaced,
    SyncCompleted,
)
from translation.errors import ErrorCode
from translation.group import ConsumerGroup, GroupState
from translation.heartbeat import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse
from translation.records import StateRecord, fold
from translation.simulation.classic_client import (
    ClassicRequest,
    ClassicResponse,
    SimulatedClassicConsumer,
)
from translation.simulation.client import TP, ClientState, SimulatedConsumer
from translation.simulation.failover import WritePipeline, drained_matches
from translation.simulation.invariants import (
    EpochMonitor,
    InvariantViolation,
    OwnershipTracker,
    check_commit_verdict,
    check_group_structure,
    check_loaded_group,
    check_quiescent,
)
from translation.topics import TopicMetadata, TopicsImage

GROUP_ID = "sim-group"
WALL_CLOCK_MS = 1_700_000_000_000
"""The wall clock at simulated time 0 (only the time a group became empty is stored in it)."""


def available_assignors() -> list[PartitionAssignor]:
    """The real server-side assignors that exist in this tree (uniform first)."""
    assignors: list[PartitionAssignor] = []
    try:
        from translation.assignors.uniform import UniformAssignor

        assignors.append(UniformAssignor())
    except ImportError:  # pragma: no cover - depends on the tree
        pass
    try:
        from translation.assignors.range import RangeAssignor  # type: ignore[import-not-found,unused-ignore]

        assignors.append(RangeAssignor())
    except ImportError:
        pass
    return assignors


@dataclass(frozen=True, slots=True)
class Knobs:
    members: int = 5
    """Members at the start."""
    max_members: int = 10
    topics: int = 2
    max_partitions: int = 8
    chaos_ms: int = 30_000
    event_interval_ms: int = 700
    """Mean time between two chaos events."""
    loss_rate: float = 0.03
    max_delay_ms: int = 120
    static_fraction: float = 0.3
    regex_fraction: float = 0.2
    slow_revocation_rate: float = 0.1
    commit_probe_interval_ms: int = 200
    session_timeout_ms: int = 6_000
    heartbeat_interval_ms: int = 500
    rebalance_timeout_ms: int = 3_000
    request_timeout_ms: int = 800
    offset_commit_rule: OffsetCommitRule = OffsetCommitRule.RELAXED
    assignor: str | None = None
    """Force one configured assignor as the default; None: random per seed."""
    assignment_interval_ms: int = 0
    classic_departure_wait_ms: int = 0
    """``GroupConfig.classic_departure_wait_ms`` (:mod:`translation.departures`)."""
    classic_share: float = 0.0
    """Probability that a new client is a classic (JoinGroup/SyncGroup) consumer."""
    failover_rate: float = 0.0
    """Coordinator failovers per simulated second of chaos (0: the coordinator never fails and
    keeps no durable state)."""
    write_delay_ms: int = 30
    """A unit of records is acknowledged 1 to this many ms after it is written."""
    failover_pause_ms: int = 800
    """The new coordinator serves 0 to this many ms after the old one died."""
    wait_for_earlier_writes: bool = True
    """A response waits for every unit written up to its call (False: only its own call's;
    unsafe, kept to show why)."""
    check_loads: bool = True
    """At each failover, compare the group loaded from the records with the dying engine's
    when nothing was lost (off: only the protocol invariants judge a load)."""
    failovers_from_ms: int = 0
    """No failover before this simulated time (e.g. once the group has formed)."""
    chaos_events: bool = True
    """False: no joins, leaves, crashes, bounces, pauses, subscription or topic changes after
    the first members joined (failovers and message loss only)."""
    pod_local_rate: float = 0.0
    """Probability that the crash of a dynamic member is reported by the sidecar next to it
    (pod-local liveness, docs/decisions/0020-pod-local-liveness.md): ``pod_local_grace_ms``
    later the engine is asked to fence it (``fence_member``, reason ``pod-local``) at the epoch
    of its last request, unless the coordinator is down then (the message is dropped)."""
    pod_local_grace_ms: int = 400
    trace_length: int = 40


Client = SimulatedConsumer | SimulatedClassicConsumer
Request = ConsumerGroupHeartbeatRequest | ClassicRequest
Response = ConsumerGroupHeartbeatResponse | ClassicResponse


def knobs_for_seed(seed: int, members: int | None = None, **overrides: Any) -> Knobs:
    """Random-but-reproducible scenario shape for ``seed`` (small groups unless told)."""
    rng = random.Random(seed * 7919 + 17)
    n = members if members is not None else rng.randint(2, 8)
    big = n > 50
    knobs = Knobs(
        members=n,
        max_members=n + max(2, n // 4),
        topics=rng.randint(1, 3) if not big else 4,
        max_partitions=rng.randint(1, 10) if not big else max(4, (3 * n) // 4),
        chaos_ms=rng.randint(12_000, 30_000) if not big else 15_000,
        event_interval_ms=rng.choice([300, 600, 1200]) if not big else 150,
        loss_rate=rng.choice([0.0, 0.02, 0.05]),
        static_fraction=rng.choice([0.0, 0.3, 0.7]),
        regex_fraction=rng.choice([0.0, 0.2, 0.5]),
        slow_revocation_rate=rng.choice([0.0, 0.1, 0.3]),
        offset_commit_rule=(
            OffsetCommitRule.STRICT if rng.random() < 0.15 else OffsetCommitRule.RELAXED
        ),
        commit_probe_interval_ms=200 if not big else 50,
        assignment_interval_ms=rng.choice([0, 0, 1000]) if not big else 1000,
        # Its own stream: adding classic members did not change the other draws of a seed.
        # Large groups stay new-protocol unless told (they measure the engine at scale).
        classic_share=(
            0.0 if big else random.Random(seed * 104_729 + 3).choice([0.0, 0.0, 0.3, 0.6, 1.0])
        ),
        # Its own stream too: the departure wait did not change the other draws of a seed.
        classic_departure_wait_ms=random.Random(seed * 31_337 + 11).choice([0, 2_000, 10_000]),
    )
    return replace(knobs, **overrides)


@dataclass(slots=True)
class SimulationResult:
    seed: int
    ok: bool
    violation: str | None
    events: int
    sim_time_ms: int
    trace: list[str]
    stats: dict[str, int] = field(default_factory=dict)
    knobs: Knobs | None = None

    @property
    def replay(self) -> str:
        return f"groupgate simulate --seed {self.seed}"


Handler = Callable[..., None]


class Simulation:
    def __init__(self, seed: int, knobs: Knobs) -> None:
        self.seed = seed
        self.knobs = knobs
        self.rng = random.Random(seed)
        self.now = 0
        self.queue: list[tuple[int, int, Handler, tuple[Any, ...]]] = []
        self.seq = 0
        self.events = 0
        self.stats: Counter[str] = Counter()
        self.trace: deque[tuple[int, str, str, object]] = deque(maxlen=knobs.trace_length)
        self.chaos_over = False
        self.quiesced = False

        self.durable = knobs.failover_rate > 0
        self.topic_counter = 0
        topics = [
            self._new_topic(self.rng.randint(1, knobs.max_partitions)) for _ in range(knobs.topics)
        ]
        self.image = TopicsImage.of(topics)
        assignors = available_assignors()
        if knobs.assignor is not None:
            assignors.sort(key=lambda a: a.name != knobs.assignor)
        elif len(assignors) > 1 and self.rng.random() < 0.3:
            assignors.reverse()
        self.assignor_names = [a.name for a in assignors]
        config = GroupConfig(
            assignors=assignors,
            session_timeout_ms=knobs.session_timeout_ms,
            heartbeat_interval_ms=knobs.heartbeat_interval_ms,
            empty_group_expiry_ms=10**9,
            offset_commit_rule=knobs.offset_commit_rule,
            assignment_interval_ms=knobs.assignment_interval_ms,
            classic_departure_wait_ms=knobs.classic_departure_wait_ms,
            member_id_factory=self._random_id,
            durable_state=self.durable,
        )
        self.config = config
        self.engine = GroupCoordinator(config, self.image)
        self.classic = ClassicGroupCoordinator(self.engine)
        self.prng = random.Random(seed * 7_368_787 + 5)
        """Pod-local liveness decisions: their own stream (with the knob at 0 nothing is
        drawn from it, so the other seeds replay as before)."""
        self.sent_epochs: dict[str, tuple[str, int]] = {}
        """By client: the member id and epoch of its last request, as its sidecar saw it."""
        self.frng = random.Random(seed * 1_000_003 + 29)
        """Failover decisions and write delays: their own stream, so turning failovers on does
        not change what the rest of a seed draws until the first failover."""
        self.pipeline = WritePipeline(self.frng, knobs.write_delay_ms,
                                      wait_for_earlier_writes=knobs.wait_for_earlier_writes)
        self.incarnation = 0
        self.clock_offset = 0
        """The current coordinator's monotonic clock minus simulated time."""
        self.down = False
        self.call_wrote = False
        self.fail_after = ""
        """"write": fail right after the next call that writes; "ack": right after the next
        acknowledgement; "": at the scheduled moment."""
        self.failed: tuple[GroupCoordinator, bool] = (self.engine, True)
        """The coordinator that died last, and whether all it wrote was acknowledged."""
        self.rejoin_after_leave: set[str] = set()
        self.held_joins: dict[str, tuple[SimulatedClassicConsumer, int]] = {}
        self.held_syncs: dict[str, tuple[SimulatedClassicConsumer, int]] = {}
        """Member id -> the client (and request seq) whose JoinGroup the engine holds."""

        self.clients: dict[str, Client] = {}
        self.client_counter = 0
        self.instance_counter = 0
        self.ownership = OwnershipTracker()
        self.epochs = EpochMonitor()
        self.client_epochs: dict[str, int] = {}
        self.zombies: list[tuple[str, int, TP]] = []
        self.req_seq: dict[str, int] = {}
        self.hb_token: dict[str, int] = {}
        self.guard_token: dict[str, int] = {}
        self.first_unanswered: dict[str, int | None] = {}
        self.last_answered: dict[str, int] = {}
        self.paused_until: dict[str, int] = {}
        self.structure_every = 1 if knobs.max_members * knobs.max_partitions <= 400 else 97
        self.engine_calls = 0

    # -- plumbing ----------------------------------------------------------------------------

    def _random_id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def _new_topic(self, partitions: int, name: str | None = None) -> TopicMetadata:
        if name is None:
            name = f"t{self.topic_counter}"
            self.topic_counter += 1
        return TopicMetadata(uuid.UUID(int=self.rng.getrandbits(128), version=4), name, partitions)

    def at(self, time_ms: int, handler: Handler, *args: Any) -> None:
        heapq.heappush(self.queue, (time_ms, self.seq, handler, args))
        self.seq += 1

    def note(self, kind: str, who: str, detail: object = "") -> None:
        self.trace.append((self.now, kind, who, detail))

    def delay(self) -> int:
        return self.rng.randint(1, self.knobs.max_delay_ms)

    def engine_now(self) -> int:
        """Simulated time on the current coordinator's own monotonic clock."""
        return self.now + self.clock_offset

    def wall(self) -> int:
        return WALL_CLOCK_MS + self.now

    def lost(self) -> bool:
        return not self.chaos_over and self.rng.random() < self.knobs.loss_rate

    def alive_clients(self) -> list[Client]:
        return [c for c in self.clients.values() if c.alive and c.state is not ClientState.LEAVING]

    # -- main loop ---------------------------------------------------------------------------

    def run(self) -> None:
        k = self.knobs
        for _ in range(k.members):
            self.at(self.rng.randint(0, 1000), self.ev_new_client, None)
        if k.chaos_events:
            self.at(self.rng.randint(500, 1500), self.ev_chaos)
        self.at(k.commit_probe_interval_ms, self.ev_commit_probe)
        self.at(k.chaos_ms, self.ev_end_chaos)
        if self.durable:
            self.now = k.failovers_from_ms
            self.at(self.next_failover(), self.ev_failover)
            self.now = 0
        settle = k.session_timeout_ms + 3 * k.rebalance_timeout_ms
        self.at(k.chaos_ms + settle, self.ev_check_quiescent)
        deadline = k.chaos_ms + settle + 60_000
        while self.queue and not self.quiesced:
            time_ms, _, handler, args = heapq.heappop(self.queue)
            if time_ms > deadline:
                break
            self.advance_engine(time_ms)
            self.now = time_ms
            handler(*args)
            self.events += 1
        if not self.quiesced:
            raise InvariantViolation(
                f"the group did not quiesce by t={deadline}ms: {self.describe()}"
            )
        if self.durable and not drained_matches(self.engine, GROUP_ID,
                                                self.pipeline.everything, self.wall()):
            raise InvariantViolation("the drained records do not fold to the group's state")

    def advance_engine(self, time_ms: int) -> None:
        if self.down:
            return
        engine = self.engine
        while True:
            deadline = engine.next_deadline()
            if deadline is None or deadline - self.clock_offset > time_ms:
                return
            self.now = deadline - self.clock_offset
            effects = engine.tick(deadline)
            self.note("timer", "coordinator", effects)
            self.after_engine(effects)

    def after_engine(self, effects: list[Effect]) -> None:
        if self.durable:
            self.write_records()
        for effect in effects:
            if isinstance(effect, MemberFenced):
                self.stats[f"fenced-{effect.reason}"] += 1
                self.epochs.forget_member(effect.member_id)
            elif isinstance(effect, MemberLeft) and not effect.static:
                self.epochs.forget_member(effect.member_id)
            elif isinstance(effect, MemberReplaced):
                self.stats["static-replaced"] += 1
                self.epochs.forget_member(effect.old_member_id)
            elif isinstance(effect, GroupExpired):
                self.epochs = EpochMonitor()
            elif isinstance(effect, JoinCompleted):
                self.deliver_held_join(effect.member_id, effect.response)
            elif isinstance(effect, SyncCompleted):
                self.deliver_held_sync(effect.member_id, effect.response)
            elif isinstance(effect, DepartureWaitEnded):
                self.stats["departure-waits"] += 1
                if effect.arrived:
                    self.stats["departure-waits-folded"] += 1
        group = self.engine.groups.get(GROUP_ID)
        if group is None:
            return
        self.epochs.observe_group(group)
        self.engine_calls += 1
        if self.engine_calls % self.structure_every == 0:
            check_group_structure(group)

    # -- durable state and coordinator failover ----------------------------------------------

    def write_records(self) -> None:
        """The driver's part after an engine call: drain its records and write them."""
        records = self.engine.drain_records(self.wall())
        written = self.pipeline.write(records, self.now)
        self.call_wrote = written is not None
        if written is None:
            return
        unit, ack_at = written
        self.stats["units-written"] += 1
        self.at(ack_at, self.ev_ack, self.incarnation, unit)
        if self.fail_after == "write":
            self.fail_after = ""
            self.at(self.now, self.ev_crash, "after-write")

    def ev_ack(self, incarnation: int, unit: int) -> None:
        if incarnation != self.incarnation or self.down:
            return
        for release in self.pipeline.ack(unit):
            release()
        if self.fail_after == "ack":
            self.fail_after = ""
            self.at(self.now, self.ev_crash, "after-ack")

    def next_failover(self) -> int:
        rate = self.knobs.failover_rate / 1000
        return self.now + int(self.frng.expovariate(rate)) + 1

    def ev_failover(self) -> None:
        if self.chaos_over:
            return
        roll = self.frng.random()
        if roll < 0.4 or self.fail_after:
            # (A failover waiting for a write or an acknowledgement that did not come, at
            # steady state, happens now.)
            self.fail_after = ""
            self.ev_crash("at-random")
        else:
            self.fail_after = "write" if roll < 0.7 else "ack"
        self.at(self.next_failover(), self.ev_failover)

    def ev_crash(self, when: str) -> None:
        """The coordinator dies (``when``: at-random, after-write: before the call's records
        are acknowledged, after-ack: before the responses they released arrive): what it wrote
        and nobody acknowledged is lost, with the responses waiting on it and the requests it
        held; a new one takes over after a pause."""
        if self.down:
            return
        old = self.engine
        if not drained_matches(old, GROUP_ID, self.pipeline.everything, self.wall()):
            raise InvariantViolation("the drained records do not fold to the group's state")
        lost_units, lost_responses = self.pipeline.crash()
        self.stats["failovers"] += 1
        self.stats[f"failover-{when}"] += 1
        self.stats["failover-lost-units"] += lost_units
        self.stats["failover-lost-responses"] += lost_responses
        self.note("failover", "coordinator", f"{when}: {lost_units} unacknowledged units lost")
        self.down = True
        self.incarnation += 1
        self.held_joins.clear()
        self.held_syncs.clear()
        self.failed = (old, lost_units == 0)
        pause = self.frng.randint(0, self.knobs.failover_pause_ms)
        self.at(self.now + pause, self.ev_takeover)

    def ev_takeover(self) -> None:
        """A new coordinator, on a monotonic clock of its own, loads the acknowledged
        records (compacted now and then) and serves."""
        old, nothing_lost = self.failed
        log = self.pipeline.log
        if self.frng.random() < 0.5:
            log = [StateRecord(key, value) for key, value in fold(log).items()]
        self.clock_offset = self.frng.randint(0, 10**9)
        self.engine = GroupCoordinator(self.config, self.image)
        self.classic = ClassicGroupCoordinator(self.engine)
        self.pipeline = WritePipeline(self.frng, self.knobs.write_delay_ms, log=log,
                                      wait_for_earlier_writes=self.knobs.wait_for_earlier_writes)
        self.down = False
        effects = self.engine.load(log, self.engine_now(), self.wall())
        self.note("takeover", "coordinator", effects)
        group = self.engine.groups.get(GROUP_ID)
        if self.knobs.check_loads and nothing_lost and old.image is self.image:
            # (A topic changed while no coordinator served: the load applied it, the old
            # engine never saw it.)
            check_loaded_group(group, old.groups.get(GROUP_ID))
        self.check_clients_known(group)
        self.epochs = EpochMonitor()
        if group is not None:
            for member in group.members.values():
                self.epochs.observe_member(member.member_id, member.member_epoch)
        self.after_engine(effects)

    def check_clients_known(self, group: ConsumerGroup | None) -> None:
        """No live client may know a member epoch the new coordinator does not: every
        response it was given waited for its records."""
        for client in self.clients.values():
            if not client.alive or client.state in (ClientState.JOINING, ClientState.LEAVING):
                continue
            member = None if group is None else group.members.get(client.member_id)
            if member is None or member.member_epoch < 0:
                continue
            known = member.member_epoch if member.classic is None else member.classic.generation
            if client.epoch > known:
                raise InvariantViolation(
                    f"client {client.name} knows epoch {client.epoch} but the coordinator "
                    f"loaded after the failover has {known} for {member.member_id}")

    # -- ownership callbacks -----------------------------------------------------------------

    def on_acquire(self, client: Client, tp: TP) -> None:
        self.ownership.acquire(client.name, tp)

    def on_release(self, client: Client, tp: TP, reason: str) -> None:
        self.ownership.release(client.name, tp)
        if self.durable and self.now >= self.knobs.failovers_from_ms:
            self.stats["released-during-failovers"] += 1
        self.zombies.append((client.member_id, client.epoch, tp))
        if len(self.zombies) > 400:
            del self.zombies[:100]

    # -- clients -----------------------------------------------------------------------------

    def random_subscription(self) -> tuple[frozenset[str], str | None]:
        names = sorted(self.image.by_name)
        if self.rng.random() < self.knobs.regex_fraction:
            choice = self.rng.choice(["t.*", "t[0-9]", "t[0-2]", "t1.*", "(t0|t3)", "t[13579]"])
            extra = (
                frozenset(self.rng.sample(names, 1))
                if names and self.rng.random() < 0.3
                else frozenset()
            )
            return extra, choice
        if not names:
            return frozenset(), None
        if self.rng.random() < 0.6:
            return frozenset(names[: max(1, len(names) - 1)] if len(names) > 1 else names), None
        return frozenset(self.rng.sample(names, self.rng.randint(1, len(names)))), None

    def ev_new_client(self, instance_id: str | None) -> None:
        if self.chaos_over and instance_id is None and self.clients:
            return
        if instance_id is None and self.rng.random() < self.knobs.static_fraction:
            instance_id = f"i{self.instance_counter}"
            self.instance_counter += 1
        topics, regex = self.random_subscription()
        name = f"c{self.client_counter}"
        self.client_counter += 1
        assignor = None
        if self.rng.random() < 0.15:
            assignor = self.rng.choice(self.assignor_names)
        k = self.knobs
        if k.classic_share > 0 and self.rng.random() < k.classic_share:
            self.add_classic_client(name, instance_id, topics, regex)
            return
        client = SimulatedConsumer(
            name,
            self._random_id(),
            GROUP_ID,
            topics=topics,
            regex=regex,
            instance_id=instance_id,
            server_assignor=assignor,
            rebalance_timeout_ms=self.knobs.rebalance_timeout_ms,
            on_acquire=self.on_acquire,
            on_release=self.on_release,
        )
        self.clients[name] = client
        client.subscribe(self.now)
        self.stats["joins"] += 1
        self.note("start", name, (client.member_id[:8], instance_id, sorted(topics), regex))
        self.schedule_heartbeat(client, 0)

    def add_classic_client(
        self, name: str, instance_id: str | None, topics: frozenset[str], regex: str | None
    ) -> None:
        k = self.knobs
        if regex:
            from translation.regex import resolve

            topics = topics | resolve(regex, self.image)
        cooperative = self.rng.random() < 0.5
        client = SimulatedClassicConsumer(
            name,
            GROUP_ID,
            topics=topics,
            instance_id=instance_id,
            cooperative=cooperative,
            session_timeout_ms=k.session_timeout_ms,
            rebalance_timeout_ms=k.rebalance_timeout_ms,
            heartbeat_interval_ms=k.heartbeat_interval_ms,
            image=lambda: self.image,
            on_acquire=self.on_acquire,
            on_release=self.on_release,
        )
        self.clients[name] = client
        client.subscribe(self.now)
        self.stats["joins"] += 1
        self.stats["classic-joins"] += 1
        kind = "cooperative" if cooperative else "eager"
        self.note("start", name, (f"classic-{kind}", instance_id, sorted(topics)))
        self.schedule_heartbeat(client, 0)

    def deliver_held_join(self, member_id: str, response: JoinGroupResponse) -> None:
        self._deliver_held(self.held_joins, "classic-deferred-joins", member_id, response)

    def deliver_held_sync(self, member_id: str, response: SyncGroupResponse) -> None:
        self._deliver_held(self.held_syncs, "classic-held-syncs", member_id, response)

    def _deliver_held(self, held_by_member: dict[str, tuple[SimulatedClassicConsumer, int]],
                      stat: str, member_id: str, response: ClassicResponse) -> None:
        """A request the engine held is answered: send the response to its client."""
        held = held_by_member.pop(member_id, None)
        if held is None:
            return
        client, seq = held
        self.stats[stat] += 1
        if isinstance(response, SyncGroupResponse) and response.assignment is not None:
            client.assignment_image = self.image
        self.respond(client, seq, response)

    def respond(self, client: Client, seq: int, response: Response) -> None:
        """Send a response (lost now and then); with durable state, once the records it
        depends on are acknowledged."""
        if not self.durable:
            self.send(client, seq, response, self.now)
            return
        processed_at = self.now
        self.pipeline.respond(self.call_wrote,
                              lambda: self.send(client, seq, response, processed_at))

    def send(self, client: Client, seq: int, response: Response, processed_at: int) -> None:
        if self.lost():
            self.stats["lost-responses"] += 1
            return
        survives = True
        if self.durable:
            # Whether this response still arrives if its coordinator dies before it does.
            survives = self.frng.random() < 0.5
        self.at(self.now + self.delay(), self.ev_response_arrive, client, seq, response,
                processed_at, self.incarnation, survives)

    def abandon_in_flight(self, client: Client) -> None:
        """The client reset its membership: a response to a request sent before must not be
        applied to the new state (real clients drop it the same way)."""
        self.req_seq[client.name] = self.req_seq.get(client.name, 0) + 1
        self.first_unanswered[client.name] = None
        client.in_flight = False

    def schedule_heartbeat(self, client: Client, after_ms: int) -> None:
        token = self.hb_token.get(client.name, 0) + 1
        self.hb_token[client.name] = token
        self.at(self.now + after_ms, self.ev_heartbeat, client, token)

    def ev_heartbeat(self, client: Client, token: int) -> None:
        if token != self.hb_token.get(client.name) or client.in_flight:
            return
        if not client.alive:
            return
        paused = self.paused_until.get(client.name, 0)
        if self.now < paused:
            self.at(paused, self.ev_heartbeat, client, token)
            return
        request = client.build_request()
        if client.member_id:
            self.sent_epochs[client.name] = (client.member_id, client.epoch)
        seq = self.req_seq.get(client.name, 0) + 1
        self.req_seq[client.name] = seq
        if self.first_unanswered.get(client.name) is None:
            self.first_unanswered[client.name] = self.now
        self.note("send", client.name, request)
        if self.lost():
            self.stats["lost-requests"] += 1
        else:
            self.at(self.now + self.delay(), self.ev_request_arrive, client, seq, request,
                    self.incarnation)
        self.at(self.now + self.knobs.request_timeout_ms, self.ev_request_timeout, client, seq)

    def ev_request_arrive(self, client: Client, seq: int, request: Request,
                          incarnation: int) -> None:
        if self.down or incarnation != self.incarnation:
            # Sent to a coordinator that died (its connection is gone) or while none served.
            self.stats["requests-lost-in-failover"] += 1
            return
        if not isinstance(request, ConsumerGroupHeartbeatRequest):
            assert isinstance(client, SimulatedClassicConsumer)
            self.classic_request_arrive(client, seq, request)
            return
        response, effects = self.engine.heartbeat(request, self.engine_now())
        self.stats["heartbeats"] += 1
        self.note("coordinator", client.name, (response, effects))
        self.after_engine(effects)
        group = self.engine.groups.get(GROUP_ID)
        if response.error_code == 0 and group is not None and request.member_epoch >= 0:
            member = group.members.get(response.member_id or "")
            if member is not None:
                self.epochs.observe_member(member.member_id, member.member_epoch)
        self.respond(client, seq, response)

    def classic_request_arrive(
        self, client: SimulatedClassicConsumer, seq: int, request: ClassicRequest
    ) -> None:
        classic = self.classic
        now = self.engine_now()
        response: ClassicResponse | HeldRequest
        if isinstance(request, JoinGroupRequest):
            response, effects = classic.join_group(request, now)
        elif isinstance(request, SyncGroupRequest):
            response, effects = classic.sync_group(request, now)
        elif isinstance(request, HeartbeatRequest):
            response, effects = classic.heartbeat(request, now)
        else:
            assert isinstance(request, LeaveGroupRequest)
            response, effects = classic.leave_group(request, now)
        self.stats["classic-requests"] += 1
        self.note("coordinator", client.name, (response, effects))
        self.after_engine(effects)
        if isinstance(response, HeldRequest):
            held = self.held_syncs if isinstance(request, SyncGroupRequest) else self.held_joins
            held[response.member_id] = (client, seq)
            return
        group = self.engine.groups.get(GROUP_ID)
        if response.error_code == 0 and group is not None:
            member_id = getattr(response, "member_id", "") or client.member_id
            member = group.members.get(member_id)
            if member is not None:
                self.epochs.observe_member(member.member_id, member.member_epoch)
        if isinstance(response, SyncGroupResponse) and response.assignment is not None:
            # The client reads topic names with the metadata of the moment the coordinator
            # answered: a topic recreated under the same name in between is a hazard of the
            # name-based classic protocol itself, not of the engine.
            client.assignment_image = self.image
        self.respond(client, seq, response)

    def ev_request_timeout(self, client: Client, seq: int) -> None:
        if self.req_seq.get(client.name) != seq or not client.in_flight:
            return
        client.on_request_lost()
        self.note("timeout", client.name)
        self.schedule_heartbeat(client, 100)

    def ev_response_arrive(
        self,
        client: Client,
        seq: int,
        response: Response,
        processed_at: int,
        incarnation: int = 0,
        survives: bool = True,
    ) -> None:
        if incarnation != self.incarnation and not survives:
            self.stats["responses-lost-in-failover"] += 1
            return
        if self.req_seq.get(client.name) != seq or not client.in_flight or not client.alive:
            return
        sent_at = self.first_unanswered.get(client.name) or processed_at
        self.first_unanswered[client.name] = None
        was_leaving = client.state is ClientState.LEAVING
        actions = client.on_response(response, self.now)  # type: ignore[arg-type]
        if (
            isinstance(client, SimulatedClassicConsumer)
            and isinstance(response, JoinGroupResponse)
            and response.error_code == 0
            and client.window_start is None
        ):
            self.open_revocation_window(client, sent_at)
        self.note("recv", client.name, response)
        if response.error_code == 0 and not was_leaving:
            epoch = _epoch_of(response)
            last = self.client_epochs.get(client.name, 0)
            if epoch is not None and epoch < last:
                raise InvariantViolation(
                    f"client {client.name} epoch went backwards: {last} -> {epoch}"
                )
            if epoch is not None:
                self.client_epochs[client.name] = epoch
            self.last_answered[client.name] = sent_at
            guard = self.guard_token.get(client.name, 0) + 1
            self.guard_token[client.name] = guard
            # The coordinator may fence this member once the session timeout, or the
            # rebalance timeout of a revocation it was told about in a lost response, runs
            # out; both started no earlier than ``sent_at``.
            limit = min(self.knobs.session_timeout_ms, self.knobs.rebalance_timeout_ms)
            self.at(
                sent_at + limit - self.knobs.max_delay_ms,
                self.ev_session_guard,
                client,
                guard,
            )
        elif response.error_code:
            self.stats[f"error-{ErrorCode(response.error_code).name}"] += 1
        if client.state is ClientState.LEFT:
            self.after_left(client)
            return
        if client.state is ClientState.FATAL:
            self.stats["fatal"] += 1
            self.at(self.now + self.rng.randint(1000, 3000), self.ev_new_client, client.instance_id)
            return
        if "revoke" in actions:
            self.start_revocation(client, sent_at)
        if "heartbeat-now" in actions or (
            client.state is ClientState.ACKNOWLEDGING
            and frozenset(client.owned) != client.sent_owned
        ):
            self.schedule_heartbeat(client, 0)
        else:
            self.schedule_heartbeat(
                client, client.heartbeat_interval_ms or self.knobs.heartbeat_interval_ms
            )

    def start_revocation(self, client: Client, sent_at: int) -> None:
        k = self.knobs
        if self.rng.random() < k.slow_revocation_rate and not self.chaos_over:
            duration = self.rng.randint(
                k.rebalance_timeout_ms // 2, k.rebalance_timeout_ms * 3 // 2
            )
            self.stats["slow-revocations"] += 1
        else:
            duration = self.rng.randint(0, 150)
        token = client.revocation_token
        self.at(self.now + duration, self.ev_revocation_done, client, token)
        if isinstance(client, SimulatedClassicConsumer):
            return  # guarded by its revocation window (open_revocation_window)
        # The coordinator started the rebalance timeout when it processed a request sent no
        # earlier than ``sent_at``; give up before it can expire.
        self.at(sent_at + k.rebalance_timeout_ms - 50, self.ev_poll_timeout, client, token)

    def open_revocation_window(self, client: SimulatedClassicConsumer, sent_at: int) -> None:
        """A classic member's rebalance timeout may run from the first JoinGroup of a rebalance
        (sent at ``sent_at`` at the earliest) until it is Stable with nothing to revoke; the
        client gives everything up before the coordinator could fence it."""
        client.window_start = sent_at
        deadline = sent_at + self.knobs.rebalance_timeout_ms - 50
        self.at(max(deadline, self.now), self.ev_revocation_window, client, sent_at)

    def ev_revocation_window(self, client: SimulatedClassicConsumer, start: int) -> None:
        if client.window_start != start or not client.alive:
            return
        client.window_start = None
        if client.state is ClientState.LEAVING or not (client.owned or client.revoking):
            return
        self.stats["poll-timeouts"] += 1
        self.note("poll-timeout", client.name)
        client.lose_partitions("rebalance-timeout")
        self.abandon_in_flight(client)
        self.schedule_heartbeat(client, 0)

    def ev_revocation_done(self, client: Client, token: int) -> None:
        if not client.alive:
            return
        actions = client.finish_revocation(token)
        if actions:
            self.note("revoked", client.name)
            self.schedule_heartbeat(client, 0)

    def ev_poll_timeout(self, client: Client, token: int) -> None:
        """The revocation is not acknowledged by the time the coordinator may fence: give up
        every partition and leave (the client's poll timer), then rejoin."""
        if client.revocation_token != token or not client.awaiting_ack or not client.alive:
            return
        if client.state is ClientState.LEAVING:
            return
        self.stats["poll-timeouts"] += 1
        self.note("poll-timeout", client.name)
        client.start_leave(static=False)
        self.abandon_in_flight(client)
        self.rejoin_after_leave.add(client.name)
        self.schedule_heartbeat(client, 0)

    def ev_session_guard(self, client: Client, token: int) -> None:
        if token != self.guard_token.get(client.name) or not client.alive:
            return
        if client.state is ClientState.LEAVING or not (client.owned or client.revoking):
            return
        self.stats["session-lost"] += 1
        self.note("session-lost", client.name)
        client.lose_partitions("session-lost")
        self.abandon_in_flight(client)
        self.schedule_heartbeat(client, 0)

    def after_left(self, client: Client) -> None:
        self.note("left", client.name)
        if client.name in self.rejoin_after_leave:
            self.rejoin_after_leave.discard(client.name)
            client.subscribe(self.now)
            client.sent_owned = None
            self.schedule_heartbeat(client, self.rng.randint(50, 500))

    # -- chaos -------------------------------------------------------------------------------

    def ev_end_chaos(self) -> None:
        self.chaos_over = True
        self.note("chaos-over", "sim")

    def ev_chaos(self) -> None:
        if self.chaos_over:
            return
        k = self.knobs
        alive = self.alive_clients()
        roll = self.rng.random()
        if roll < 0.22 and len(alive) < k.max_members:
            self.ev_new_client(None)
        elif roll < 0.34 and alive:
            client = self.rng.choice(alive)
            self.stats["leaves"] += 1
            self.note("leave", client.name)
            client.start_leave(static=False)
            self.abandon_in_flight(client)
            self.schedule_heartbeat(client, 0)
        elif roll < 0.46 and alive:
            client = self.rng.choice(alive)
            self.stats["crashes"] += 1
            self.note("crash", client.name)
            client.crash()
            if (k.pod_local_rate and client.instance_id is None
                    and client.name in self.sent_epochs
                    and self.prng.random() < k.pod_local_rate):
                member_id, epoch = self.sent_epochs[client.name]
                self.at(self.now + k.pod_local_grace_ms, self.ev_pod_local, client.name,
                        member_id, epoch)
            if client.instance_id is not None or self.rng.random() < 0.5:
                self.at(
                    self.now + self.rng.randint(500, 8000), self.ev_new_client, client.instance_id
                )
        elif roll < 0.60:
            statics = [c for c in alive if c.instance_id is not None]
            if statics:
                client = self.rng.choice(statics)
                self.stats["static-bounces"] += 1
                self.note("bounce", client.name)
                client.start_leave(static=True)
                self.abandon_in_flight(client)
                self.schedule_heartbeat(client, 0)
                self.at(
                    self.now + self.rng.randint(100, 3000), self.ev_new_client, client.instance_id
                )
        elif roll < 0.78 and alive:
            client = self.rng.choice(alive)
            topics, regex = self.random_subscription()
            self.stats["subscription-changes"] += 1
            self.note("resubscribe", client.name, (sorted(topics), regex))
            assignor = client.server_assignor
            if self.rng.random() < 0.2:
                assignor = self.rng.choice([None, *self.assignor_names])
            client.change_subscription(topics, regex, assignor)
        elif roll < 0.86:
            self.change_topics()
        elif roll < 0.92 and alive:
            # A long pause (GC, overloaded host): no heartbeats for a while.
            client = self.rng.choice(alive)
            pause = self.rng.randint(1000, 2 * k.session_timeout_ms)
            self.stats["pauses"] += 1
            self.note("pause", client.name, pause)
            self.paused_until[client.name] = self.now + pause
        self.at(self.now + int(self.rng.expovariate(1 / k.event_interval_ms)) + 1, self.ev_chaos)

    def ev_pod_local(self, name: str, member_id: str, epoch: int) -> None:
        """The sidecar of a crashed client tells the coordinator its member is gone."""
        if self.down:
            self.stats["pod-local-dropped"] += 1
            return
        error, effects = self.engine.fence_member(GROUP_ID, member_id, epoch, "pod-local",
                                                  self.engine_now())
        self.stats[f"pod-local-{error.name}"] += 1
        self.note("pod-local", name, (error.name, effects))
        self.after_engine(effects)

    def change_topics(self) -> None:
        topics = dict(self.image.by_name)
        names = sorted(topics)
        roll = self.rng.random()
        if roll < 0.45 and names:
            name = self.rng.choice(names)
            old = topics[name]
            topics[name] = TopicMetadata(
                old.topic_id, name, old.partitions + self.rng.randint(1, 3)
            )
            what = f"partitions added to {name}"
        elif roll < 0.7 or len(names) <= 1:
            t = self._new_topic(self.rng.randint(1, self.knobs.max_partitions))
            topics[t.name] = t
            what = f"topic {t.name} created"
        elif roll < 0.85:
            name = self.rng.choice(names)
            del topics[name]
            what = f"topic {name} deleted"
        else:
            name = self.rng.choice(names)
            t = self._new_topic(topics[name].partitions, name)
            topics[name] = t
            what = f"topic {name} recreated"
        self.stats["topic-changes"] += 1
        self.image = TopicsImage.of(list(topics.values()))
        self.note("topics", "sim", what)
        if self.down:
            return  # the next coordinator loads with this image
        effects = self.engine.update_topics(self.image, self.engine_now())
        self.after_engine(effects)

    # -- offset-commit probes ----------------------------------------------------------------

    def ev_commit_probe(self) -> None:
        group = None if self.down else self.engine.groups.get(GROUP_ID)
        if group is not None:
            owners = [
                c
                for c in self.clients.values()
                if c.alive and c.state is not ClientState.LEAVING and c.owned
            ]
            if owners:
                client = self.rng.choice(owners)
                tp = self.rng.choice(sorted(client.owned, key=lambda x: (x[0].int, x[1])))
                member = group.members.get(client.member_id)
                if (
                    member is not None
                    and member.assignment_epoch(*tp) is not None
                    and (
                        self.knobs.offset_commit_rule is OffsetCommitRule.RELAXED
                        or client.epoch == member.member_epoch
                    )
                ):
                    code = self.engine.validate_offset_commit(
                        GROUP_ID, client.member_id, client.epoch, [tp]
                    )
                    self.stats["owner-commits"] += 1
                    check_commit_verdict(
                        code,
                        owner=True,
                        detail=f"{client.name} epoch {client.epoch} {member!r} partition {tp}",
                    )
            if self.zombies:
                member_id, epoch, tp = self.rng.choice(self.zombies)
                holder = group.owners.owner(*tp)
                if holder is not None and holder != member_id:
                    code = self.engine.validate_offset_commit(GROUP_ID, member_id, epoch, [tp])
                    self.stats["zombie-commits"] += 1
                    check_commit_verdict(
                        code,
                        owner=False,
                        detail=f"{member_id} epoch {epoch} partition {tp} now held by {holder}",
                    )
        if not self.quiesced:
            self.at(self.now + self.knobs.commit_probe_interval_ms, self.ev_commit_probe)

    # -- quiescence --------------------------------------------------------------------------

    def settled(self) -> bool:
        group = self.engine.groups.get(GROUP_ID)
        live = [c for c in self.clients.values() if c.alive]
        if any(c.state is not ClientState.STABLE for c in live):
            return False
        if group is None:
            return not live
        if len(group.members) != len(live):
            return False
        return group.state is GroupState.STABLE or (not live and not group.members)

    def ev_check_quiescent(self) -> None:
        if not self.settled():
            self.at(self.now + 500, self.ev_check_quiescent)
            return
        group = self.engine.groups.get(GROUP_ID)
        live = [c for c in self.clients.values() if c.alive]
        beliefs = {c.name: (c.member_id, c.epoch, set(c.owned)) for c in live}
        subscriptions = [(c.topics, c.regex) for c in live]
        if group is not None:
            check_group_structure(group)
        check_quiescent(group, beliefs, subscriptions, self.image)
        self.quiesced = True

    def describe(self) -> str:
        group = self.engine.groups.get(GROUP_ID)
        parts = []
        if group is not None:
            parts.append(
                f"group {group.state.name} epoch {group.group_epoch} "
                f"assignment {group.target.epoch}"
            )
            for m in group.members.values():
                parts.append(repr(m))
        for c in self.clients.values():
            if c.alive:
                parts.append(
                    f"client {c.name} {c.member_id[:8]} {c.state.name} epoch {c.epoch} "
                    f"owned {len(c.owned)}"
                )
        return "\n  ".join(parts)

    def format_trace(self) -> list[str]:
        lines = []
        for time_ms, kind, who, detail in self.trace:
            lines.append(f"t={time_ms:>7} {kind:<12} {who:<10} {_short(detail)}")
        return lines


def _epoch_of(response: Response) -> int | None:
    """The epoch a successful response tells its client (None: it tells none)."""
    if isinstance(response, ConsumerGroupHeartbeatResponse):
        return response.member_epoch
    if isinstance(response, JoinGroupResponse):
        return response.generation_id
    return None


def _short(detail: object) -> str:
    if isinstance(
        detail,
        JoinGroupRequest
        | SyncGroupRequest
        | HeartbeatRequest
        | LeaveGroupRequest
        | JoinGroupResponse
        | SyncGroupResponse
        | HeartbeatResponse
        | LeaveGroupResponse,
    ):
        return _short_classic(detail)
    if isinstance(detail, ConsumerGroupHeartbeatRequest):
        owned = (
            None
            if detail.topic_partitions is None
            else sum(len(p) for _, p in detail.topic_partitions)
        )
        return (
            f"HB member={detail.member_id[:8]} epoch={detail.member_epoch} owned={owned} "
            f"names={detail.subscribed_topic_names} regex={detail.subscribed_topic_regex}"
        )
    if isinstance(detail, ConsumerGroupHeartbeatResponse):
        assigned = None if detail.assignment is None else sum(len(p) for _, p in detail.assignment)
        err = ErrorCode(detail.error_code).name
        return f"{err} epoch={detail.member_epoch} assigned={assigned}"
    if (
        isinstance(detail, tuple)
        and len(detail) == 2
        and isinstance(detail[0], ConsumerGroupHeartbeatResponse)
    ):
        effects = [
            type(e).__name__
            for e in detail[1]
            if type(e).__name__ not in ("TimerArmed", "TimerCancelled")
        ]
        return f"{_short(detail[0])} {effects}"
    if isinstance(detail, tuple) and len(detail) == 2 and isinstance(detail[1], list):
        effects = [
            type(e).__name__
            for e in detail[1]
            if type(e).__name__ not in ("TimerArmed", "TimerCancelled")
        ]
        return f"{_short_classic(detail[0])} {effects}"
    if isinstance(detail, list):
        return str(
            [
                type(e).__name__
                for e in detail
                if type(e).__name__ not in ("TimerArmed", "TimerCancelled")
            ]
        )
    return str(detail)


def _short_classic(detail: object) -> str:
    if detail is None:
        return "JoinGroup held"
    name = type(detail).__name__
    code = getattr(detail, "error_code", 0)
    extra = ""
    if isinstance(detail, JoinGroupRequest):
        owned = (
            sum(len(ps) for _, ps in detail.protocols[0].subscription.owned_partitions)
            if (detail.protocols and detail.protocols[0].subscription is not None)
            else 0
        )
        extra = f" member={detail.member_id[:8]} owned={owned}"
    elif isinstance(detail, SyncGroupRequest | HeartbeatRequest):
        extra = f" member={detail.member_id[:8]} gen={detail.generation_id}"
    elif isinstance(detail, JoinGroupResponse):
        extra = f" gen={detail.generation_id} member={detail.member_id[:8]}"
    elif hasattr(detail, "assignment") and detail.assignment is not None:
        extra = f" assigned={sum(len(ps) for _, ps in detail.assignment.partitions)}"
    if code:
        extra += f" {ErrorCode(code).name}"
    return name + extra


def run_seed(seed: int, members: int | None = None, **knobs: Any) -> SimulationResult:
    """Run one seeded scenario; never raises for an invariant violation (see ``ok``)."""
    chosen = knobs_for_seed(seed, members, **knobs)
    sim = Simulation(seed, chosen)
    violation: str | None = None
    try:
        sim.run()
    except InvariantViolation as exc:
        violation = f"{exc}"
    except Exception as exc:  # an engine crash is a failure too
        violation = f"{type(exc).__name__}: {exc}"
    return SimulationResult(
        seed=seed,
        ok=violation is None,
        violation=violation,
        events=sim.events,
        sim_time_ms=sim.now,
        trace=sim.format_trace() if violation is not None else [],
        stats=dict(sim.stats),
        knobs=chosen,
    )


def run_seeds(
    start: int, count: int, members: int | None = None, **knobs: Any
) -> list[SimulationResult]:
    return [run_seed(seed, members, **knobs) for seed in range(start, start + count)]
