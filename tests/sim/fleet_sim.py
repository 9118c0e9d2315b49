"""A seeded simulation of a fleet of sidecars around one group, each driven by the fleet core.

Several sidecars (pods) each run a :class:`~proxy.fleet_core.core.GroupCore` for the group, the
real engine (:class:`~translation.coordinator.GroupCoordinator`) once they hold it, and serve
KIP-848 clients of their own pod (:class:`~translation.simulation.client.SimulatedConsumer`).
Around them:

* a broker's classic group coordinator (:class:`Broker`): JoinGroup with MEMBER_ID_REQUIRED,
  a rebalance that completes when every member rejoined or its rebalance timeout passed (the
  leader stays leader if it rejoined), SyncGroup, Heartbeat answering REBALANCE_IN_PROGRESS,
  ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID as Kafka's classic coordinator does, sessions on the
  broker's clock counted from when a call *arrives*, LeaveGroup, and DescribeGroups;
* the state log (:class:`StateLog`): units acknowledged in order after a delay; opening a
  writer fences every earlier one, whose later writes fail;
* the fleet link: messages lost, each with its own delay (in order per client connection).

Faults, drawn per seed: a sidecar killed and restarted (a new process: new clock, nothing
kept), stopped (it steps down: the lock left at once, then it exits and restarts), frozen
(SIGSTOP: everything that reaches it waits, its clock runs on) shorter or longer than a lease,
cut off from the broker while its clients and the other sidecars still reach it, a slow link to
the broker, failed and slow state-log writes, failed loads, lost fleet messages, an
application process dying (a new member starts in its pod later). Each sidecar's clock runs at
its own rate (within ``Knobs.skew`` of the broker's) from its own offset. A client's requests
reach the holder in order and die with the connection it closes on a timeout, as in the proxy
(``Knobs.per_connection_order``).

Checked after every act: a sidecar that runs the engine (a request, a timer) is the broker
group's leader at that moment, and no other sidecar's core may act (at most one holder per
group given the leases: a cut-off or frozen holder has stopped by the time the broker can give
the group away); no partition is owned by two clients (the engine's assignments, as the
clients act on them); and, once the faults stop, the fleet settles: one sidecar coordinates and
every partition is owned by a stable client (progress).

A failing seed replays exactly: ``run_fleet_seed(seed)``.
"""

from __future__ import annotations

import functools
import heapq
import math
import random
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.fleet_core import events as ev
from proxy.fleet_core.core import CoreConfig, GroupCore, Role, moves
from translation.assignors.uniform import UniformAssignor
from translation.config import GroupConfig
from translation.coordinator import GroupCoordinator
from translation.errors import ErrorCode
from translation.heartbeat import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse
from translation.records import StateRecord
from translation.simulation.client import TP, ClientState, SimulatedConsumer
from translation.simulation.invariants import InvariantViolation, OwnershipTracker
from translation.topics import TopicMetadata, TopicsImage

GROUP = "fleet-group"
WALL_MS = 1_700_000_000_000


@dataclass(frozen=True)
class Knobs:
    sidecars: int = 3
    clients: int = 5
    lock_session_ms: int = 3_000
    member_session_ms: int = 6_000
    heartbeat_ms: int = 1_000
    chaos_ms: int = 30_000
    quiet_ms: int = 30_000
    fault_every_ms: int = 3_000
    skew: float = 0.15
    """Clock rates within this share of the broker's (the lease assumes < 1 - 0.8)."""
    lease_fraction: float = 0.8
    fleet_loss: float = 0.05
    fleet_delay_ms: int = 80
    write_delay_ms: int = 60
    write_fail: float = 0.005
    load_fail: float = 0.05
    request_timeout_ms: int = 2_000
    relay_timeout_ms: int = 1_500
    join_moved: float = 0.0
    """Share of the broker's answers to a JoinGroup with a member id that are
    NOT_COORDINATOR (its group coordinator moving), during the chaos."""
    per_connection_order: bool = True
    """A client's requests reach the holder in the order sent, and a request dies with the
    connection the client closed when it timed out (as the proxy's links per client connection
    and its connection handling keep them). False: relays overtake each other freely and live
    on after the client gave up on them."""


def knobs_for_seed(seed: int) -> Knobs:
    rng = random.Random(seed * 9_176 + 11)
    return Knobs(
        sidecars=rng.randint(2, 4),
        clients=rng.randint(2, 7),
        fault_every_ms=rng.choice([1_500, 3_000, 6_000]),
        fleet_loss=rng.choice([0.0, 0.02, 0.1]),
        fleet_delay_ms=rng.choice([5, 80, 300]),
        write_delay_ms=rng.choice([5, 60, 900, 4_000]),
        write_fail=rng.choice([0.0, 0.005, 0.03]),
        load_fail=rng.choice([0.0, 0.1]),
    )


@dataclass
class FleetResult:
    seed: int
    ok: bool
    violation: str = ""
    events: int = 0
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


class Broker:
    """One classic group at the broker, on the broker's (the simulation's) clock."""

    def __init__(self, sim: FleetSimulation, session_ms: int) -> None:
        self.sim = sim
        self.session_ms = session_ms
        self.members: dict[str, _BMember] = {}
        self.pending_ids: set[str] = set()
        self.state = "Empty"
        self.generation = 0
        self.leader = ""
        self.used = False
        self.rebalance_deadline = 0
        self.syncs: list[tuple[str, Callable[[ev.SyncAnswered], None], int]] = []
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
            self.pending_ids.add(new)
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
            self.pending_ids.discard(member_id)
            self._order += 1
            member = self.members[member_id] = _BMember(owner, now, self._order)
            self.used = True
        member.last_seen = now
        member.join_reply, member.join_attempt = reply, attempt
        if self.state != "Preparing":
            self.state = "Preparing"
            self.rebalance_deadline = now + self.session_ms
            self.sim.at(self.rebalance_deadline, self.sim.broker_check)
        self._maybe_complete()

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
            self.state, self.leader = "Empty", ""
            return
        if self.leader not in self.members:
            self.leader = min(self.members, key=lambda mid: self.members[mid].order)
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
        if self.members.pop(member_id, None) is not None:
            self._membership_changed()

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

    def _membership_changed(self) -> None:
        self.syncs = [s for s in self.syncs if s[0] in self.members]
        if not self.members:
            if self.state != "Empty":
                self.generation += 1
            self.state, self.leader = "Empty", ""
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


# -- sidecars and clients --------------------------------------------------------------------


@dataclass
class Pending:
    client: SimulatedConsumer | None
    seq: int
    request: ConsumerGroupHeartbeatRequest
    origin: Sidecar | None = None
    origin_incarnation: int = 0
    origin_rid: int = 0
    response: ConsumerGroupHeartbeatResponse | None = None
    relayed: bool = False
    connection: tuple[str, int] = ("", 0)
    """The client's connection the request came on (client name, connection number)."""


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


class FleetSimulation:
    def __init__(self, seed: int, knobs: Knobs | None = None) -> None:
        self.seed = seed
        self.knobs = k = knobs or knobs_for_seed(seed)
        self.rng = random.Random(seed)
        self.now = 0
        self.queue: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self.seq = 0
        self.events = 0
        self.stats: Counter[str] = Counter()
        self.trace: list[str] = []
        self.chaos_over = False
        self.broker = Broker(self, k.lock_session_ms)
        self.log = StateLog()
        topics = [TopicMetadata(uuid.UUID(int=self.rng.getrandbits(128), version=4), f"t{i}",
                                self.rng.randint(1, 6)) for i in range(2)]
        self.image = TopicsImage.of(topics)
        self.all_partitions = {(t.topic_id, p) for t in topics for p in range(t.partitions)}
        self.engine_config = GroupConfig(
            assignors=[UniformAssignor()], session_timeout_ms=k.member_session_ms,
            heartbeat_interval_ms=k.heartbeat_ms, empty_group_expiry_ms=10**9,
            durable_state=True, member_id_factory=self._member_id)
        self.core_config = CoreConfig(
            session_ms=k.lock_session_ms, lease_fraction=k.lease_fraction, hold_ms=3_000,
            lookup_ms=1_000, view_ms=10_000, let_go_ms=k.member_session_ms, retry_ms=200,
            takeover_wait_ms=k.member_session_ms)
        self.sidecars = [Sidecar(f"s{i}", 1 + self.rng.uniform(-k.skew, k.skew))
                         for i in range(k.sidecars)]
        for sc in self.sidecars:
            self._start(sc)
        self.by_name = {sc.name: sc for sc in self.sidecars}
        self.ownership = OwnershipTracker()
        self.clients: list[tuple[SimulatedConsumer, Sidecar]] = []
        self.req_seq: dict[str, int] = {}
        self.first_unanswered: dict[str, int | None] = {}
        self.guard_token: dict[str, int] = {}
        self.hb_token: dict[str, int] = {}
        self.connections: dict[str, int] = {}
        """Client -> the number of its current connection (a new one after a timeout)."""
        self.fifo: dict[tuple[object, ...], int] = {}
        """Per link and client connection: the last delivery time (messages stay in order)."""
        self.rid = 0
        self.client_counter = 0
        for i in range(k.clients):
            sc = self.sidecars[i % len(self.sidecars)] if i < len(self.sidecars) \
                else self.rng.choice(self.sidecars)
            client = SimulatedConsumer(
                f"c{i}", f"member-{i}", GROUP, topics=frozenset({"t0", "t1"}), regex=None,
                instance_id=None, server_assignor=None,
                rebalance_timeout_ms=2 * k.member_session_ms,
                on_acquire=self._acquire, on_release=self._release)
            self.clients.append((client, sc))
            client.subscribe(0)
            self.schedule_heartbeat(client, self.rng.randint(0, 200))
        self.at(k.fault_every_ms, self.ev_fault)
        self.at(k.chaos_ms, self.ev_chaos_over)

    # -- plumbing ----------------------------------------------------------------------------

    def _member_id(self) -> str:
        return f"x{self.rng.getrandbits(64):016x}"

    def at(self, t: int, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self.queue, (max(t, self.now), self.seq, fn, args))
        self.seq += 1

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
            return FleetResult(self.seed, False, str(exc), self.events, self.stats,
                               self.trace[-60:] + self._moves())
        return FleetResult(self.seed, True, "", self.events, self.stats)

    def _moves(self) -> list[str]:
        return [f"{sc.name}: " + "; ".join(moves(sc.core.history[-12:])) for sc in self.sidecars]

    # -- sidecar lifecycle and faults -------------------------------------------------------

    def _start(self, sc: Sidecar) -> None:
        sc.incarnation += 1
        sc.alive = True
        sc.offset = self.rng.randint(0, 10**9)
        sc.core = GroupCore(GROUP, sc.name, self.core_config)
        sc.engine = None
        sc.writer = 0
        sc.unwritten = []
        sc.pending = {}
        sc.backlog = []
        sc.frozen_until = 0

    def ev_fault(self) -> None:
        if self.chaos_over:
            return
        k = self.knobs
        sc = self.rng.choice(self.sidecars)
        kind = self.rng.choice(["kill", "stop", "freeze", "freeze", "cut", "cut", "slow",
                                "client-crash"])
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
            sc.alive = False
            sc.incarnation += 1
            self.at(self.now + self.rng.randint(0, 3 * s), self.ev_restart, sc)
        elif kind == "freeze":
            sc.frozen_until = self.now + self.rng.randint(s // 10, 5 * s // 2)
            self.at(sc.frozen_until, self.ev_thaw, sc, sc.incarnation)
        elif kind == "cut":
            sc.cut_until = max(sc.cut_until, self.now + self.rng.randint(s // 2, 4 * s))
        elif kind == "slow":
            sc.slow_until = self.now + self.rng.randint(s, 4 * s)
            sc.slow_extra = self.rng.randint(50, s // 2)
        self.stats[f"fault-{kind}"] += 1
        self.note(f"fault {kind} {sc.name}")
        self.at(self.now + int(self.rng.expovariate(1 / k.fault_every_ms)) + 1, self.ev_fault)

    def ev_exit(self, sc: Sidecar, incarnation: int, waited: int = 0) -> None:
        if sc.incarnation != incarnation or not sc.alive:
            return
        if not sc.core.stepped_down and waited < self.core_config.step_down_ms \
                and self.now >= sc.frozen_until:
            # the process exits once its core stepped down (its writes acknowledged, the
            # lock left), as the proxy's drain waits, at most the bound
            self.at(self.now + 50, self.ev_exit, sc, incarnation, waited + 50)
            return
        sc.alive = False
        sc.incarnation += 1
        self.at(self.now + self.rng.randint(0, self.knobs.lock_session_ms), self.ev_restart, sc)

    def _crash_client(self) -> None:
        """An application process dies; a new one (a new member) starts in its pod later."""
        index = self.rng.randrange(len(self.clients))
        client = self.clients[index][0]
        if not client.alive:
            return
        client.crash()
        self.hb_token[client.name] = self.hb_token.get(client.name, 0) + 1
        self.at(self.now + self.rng.randint(0, self.knobs.member_session_ms),
                self.ev_client_start, index)

    def ev_client_start(self, index: int) -> None:
        old, sc = self.clients[index]
        self.client_counter += 1
        number = self.client_counter
        client = SimulatedConsumer(
            f"{old.name.split('.')[0]}.{number}", f"member-{index}.{number}", GROUP,
            topics=frozenset({"t0", "t1"}), regex=None, instance_id=None, server_assignor=None,
            rebalance_timeout_ms=2 * self.knobs.member_session_ms,
            on_acquire=self._acquire, on_release=self._release)
        self.clients[index] = (client, sc)
        client.subscribe(self.now)
        self.schedule_heartbeat(client, 0)

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
        for sc in self.sidecars:
            sc.cut_until = sc.slow_until = 0
            if not sc.alive:
                self._start(sc)
            elif self.now < sc.frozen_until:
                sc.frozen_until = self.now
                self.at(self.now, self.ev_thaw, sc, sc.incarnation)
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
        if sc.engine is not None and sc.core.acting(self.local(sc)):
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
        if sc.engine is not None and sc.core.acting(now):
            deadline = sc.engine.next_deadline()
            if deadline is not None and deadline <= now:
                self.check_sole_holder(sc, "timer")
                sc.engine.tick(now)
                records = sc.engine.drain_records(WALL_MS + self.now)
                if records:
                    sc.unwritten.append(records)
                self.perform(sc, sc.core.engine_ticked(bool(records), now))

    # -- the links ---------------------------------------------------------------------------

    def to_broker(self, sc: Sidecar, call: Callable[[], None]) -> None:
        """A call on the sidecar's link to the broker (lost while it is cut off)."""
        if self.now < sc.cut_until:
            self.stats["broker-calls-cut"] += 1
            return
        extra = sc.slow_extra if self.now < sc.slow_until else 0
        self.at(self.now + self.rng.randint(1, 8) + extra, call)

    def from_broker(self, sc: Sidecar, incarnation: int, event: ev.Event) -> None:
        if self.now < sc.cut_until:
            return
        extra = sc.slow_extra if self.now < sc.slow_until else 0
        self.at(self.now + self.rng.randint(1, 8) + extra, self._broker_answer, sc,
                incarnation, event)

    def _broker_answer(self, sc: Sidecar, incarnation: int, event: ev.Event) -> None:
        if self.now < sc.cut_until:
            return
        self.on(sc, incarnation, self._handle, sc, event)

    def _handle(self, sc: Sidecar, event: ev.Event) -> None:
        self.perform(sc, sc.core.handle(event, self.local(sc)))

    def fleet(self, key: tuple[object, ...], fn: Callable[..., None], *args: Any) -> None:
        """A message on the fleet link ``key`` (lost now and then; in order per link and
        client connection unless ``per_connection_order`` is off)."""
        k = self.knobs
        if not self.chaos_over and self.rng.random() < k.fleet_loss:
            self.stats["fleet-lost"] += 1
            return
        at = self.now + self.rng.randint(1, k.fleet_delay_ms)
        if k.per_connection_order:
            at = self.fifo[key] = max(at, self.fifo.get(key, 0))
        self.at(at, fn, *args)

    def closed(self, pending: Pending) -> bool:
        """The client closed the connection ``pending`` came on (it timed out)."""
        name, number = pending.connection
        return self.knobs.per_connection_order and self.connections.get(name, 0) != number

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
                self._answer(sc, action.rid, action.error)
            elif isinstance(action, ev.Relay):
                self._relay(sc, action.rid, action.holder)
            elif isinstance(action, ev.Suspend):
                if sc.engine is not None:
                    sc.engine.suspend(GROUP)
            elif isinstance(action, ev.Resume):
                if sc.engine is not None:
                    sc.engine.resume(GROUP, self.local(sc))
                    self._drain(sc)
            elif isinstance(action, ev.Forget):
                group = sc.engine.groups.get(GROUP) if sc.engine is not None else None
                members = frozenset(group.members) if group is not None else frozenset()
                sc.engine = None
                sc.writer = 0
                sc.unwritten = []
                self.note(f"{sc.name} forgets: {action.reason}")
                work[:0] = sc.core.handle(ev.Forgotten(members), self.local(sc))

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
            engine.load(list(self.log.log), self.local(sc), WALL_MS + self.now)
            engine.drain_records(WALL_MS + self.now)
            sc.engine = engine
            self.check_clients_known(engine)
        self.note(f"{sc.name} loaded ok={ok}")
        if ok and not complete:
            self.stats["loads-of-nothing"] += 1
        self._handle(sc, ev.LoadDone(ok, complete))

    def _write(self, sc: Sidecar, unit: int) -> None:
        records = sc.unwritten.pop(0) if sc.unwritten else []
        writer = sc.writer
        k = self.knobs
        delay = self.rng.randint(1, k.write_delay_ms)
        ack_at = max(self.log.last_ack.get(writer, 0), self.now + delay)
        self.log.last_ack[writer] = ack_at
        fails = not self.chaos_over and self.rng.random() < k.write_fail
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

    def _run_engine(self, sc: Sidecar, rid: int) -> list[ev.Action]:
        pending = sc.pending[rid]
        assert sc.engine is not None, "the core ran the engine before it was loaded"
        now = self.local(sc)
        if self.closed(pending):
            del sc.pending[rid]  # it died with its connection while it was held
            self.stats["requests-gone-with-connection"] += 1
            return sc.core.handle(ev.EngineDone(rid, False), now)
        self.check_sole_holder(sc, "request")
        response, _ = sc.engine.heartbeat(pending.request, now)
        pending.response = response
        records = sc.engine.drain_records(WALL_MS + self.now)
        if records:
            sc.unwritten.append(records)
        self.stats["engine-calls"] += 1
        return sc.core.handle(ev.EngineDone(rid, bool(records)), now)

    # -- requests and answers -----------------------------------------------------------------

    def sidecar_request(self, sc: Sidecar, client: SimulatedConsumer, seq: int,
                        request: ConsumerGroupHeartbeatRequest, connection: int) -> None:
        self.rid += 1
        sc.pending[self.rid] = Pending(client, seq, request, connection=(client.name, connection))
        self._handle(sc, ev.Request(self.rid, request.member_id or "",
                                    starts_group=request.member_epoch == 0))

    def _relay(self, sc: Sidecar, rid: int, holder: str) -> None:
        pending = sc.pending.get(rid)
        target = self.by_name.get(holder)
        if pending is None or target is None:
            return
        if self.closed(pending):
            del sc.pending[rid]
            return
        pending.relayed = True
        self.stats["relays"] += 1
        self.fleet((sc.name, target.name, pending.connection), self.on, target,
                   target.incarnation, self._inbound, target, sc, sc.incarnation, rid,
                   pending.request, pending.connection)
        self.at(self.now + self.knobs.relay_timeout_ms, self.on, sc, sc.incarnation,
                self._relay_timeout, sc, rid)

    def _relay_timeout(self, sc: Sidecar, rid: int) -> None:
        pending = sc.pending.get(rid)
        if pending is not None and pending.relayed:
            pending.relayed = False
            self._handle(sc, ev.RelayDone(rid, refused=True))

    def _inbound(self, sc: Sidecar, origin: Sidecar, origin_incarnation: int, origin_rid: int,
                 request: ConsumerGroupHeartbeatRequest, connection: tuple[str, int]) -> None:
        self.rid += 1
        pending = Pending(None, 0, request, origin, origin_incarnation, origin_rid,
                          connection=connection)
        if self.closed(pending):
            return  # the follower closed the link with the client's connection
        sc.pending[self.rid] = pending
        self._handle(sc, ev.Request(self.rid, request.member_id or "",
                                    starts_group=request.member_epoch == 0, inbound=True))

    def _relayed_back(self, sc: Sidecar, rid: int,
                      response: ConsumerGroupHeartbeatResponse) -> None:
        pending = sc.pending.get(rid)
        if pending is None or not pending.relayed:
            return
        pending.relayed = False
        if response.error_code == ErrorCode.NOT_COORDINATOR:
            self._handle(sc, ev.RelayDone(rid, refused=True))
            return
        pending.response = response
        self._handle(sc, ev.RelayDone(rid, refused=False))

    def _answer(self, sc: Sidecar, rid: int, error: int | None) -> None:
        pending = sc.pending.pop(rid, None)
        if pending is None:
            return
        if error is None:
            response = pending.response
            assert response is not None
        else:
            response = ConsumerGroupHeartbeatResponse(error_code=error)
            if error == ErrorCode.UNKNOWN_MEMBER_ID and sc.core.role is Role.LETTING_GO:
                self.stats["told-to-let-go"] += 1
        if pending.origin is not None:
            origin = pending.origin
            self.fleet((sc.name, origin.name, pending.connection), self.on, origin,
                       pending.origin_incarnation, self._relayed_back, origin,
                       pending.origin_rid, response)
            return
        client = pending.client
        assert client is not None
        self.at(self.now + self.rng.randint(0, 2), self.ev_response, client, pending.seq,
                response)

    # -- clients -----------------------------------------------------------------------------

    def _acquire(self, client: SimulatedConsumer, tp: TP) -> None:
        self.ownership.acquire(client.name, tp)

    def _release(self, client: SimulatedConsumer, tp: TP, reason: str) -> None:
        self.ownership.release(client.name, tp)

    def _sidecar_of(self, client: SimulatedConsumer) -> Sidecar:
        return next(sc for c, sc in self.clients if c is client)

    def schedule_heartbeat(self, client: SimulatedConsumer, after: int) -> None:
        token = self.hb_token.get(client.name, 0) + 1
        self.hb_token[client.name] = token
        self.at(self.now + after, self.ev_heartbeat, client, token)

    def ev_heartbeat(self, client: SimulatedConsumer, token: int) -> None:
        if token != self.hb_token.get(client.name) or client.in_flight or not client.alive:
            return
        request = client.build_request()
        seq = self.req_seq.get(client.name, 0) + 1
        self.req_seq[client.name] = seq
        if self.first_unanswered.get(client.name) is None:
            self.first_unanswered[client.name] = self.now
        sc = self._sidecar_of(client)
        if sc.alive:
            self.at(self.now + self.rng.randint(0, 2), self.on, sc, sc.incarnation,
                    self.sidecar_request, sc, client, seq, request,
                    self.connections.get(client.name, 0))
        self.at(self.now + self.knobs.request_timeout_ms, self.ev_timeout, client, seq)

    def ev_timeout(self, client: SimulatedConsumer, seq: int) -> None:
        if self.req_seq.get(client.name) != seq or not client.in_flight:
            return
        client.on_request_lost()
        self.connections[client.name] = self.connections.get(client.name, 0) + 1
        self.stats["client-timeouts"] += 1
        self.schedule_heartbeat(client, 100)

    def ev_response(self, client: SimulatedConsumer, seq: int,
                    response: ConsumerGroupHeartbeatResponse) -> None:
        if self.req_seq.get(client.name) != seq or not client.in_flight or not client.alive:
            return
        sent_at = self.first_unanswered.get(client.name) or self.now
        self.first_unanswered[client.name] = None
        actions = client.on_response(response, self.now)
        k = self.knobs
        if response.error_code == ErrorCode.NONE:
            guard = self.guard_token.get(client.name, 0) + 1
            self.guard_token[client.name] = guard
            # The engine's session for the member started when this request (sent no earlier
            # than ``sent_at``) reached it, on a clock up to ``skew`` faster than this one.
            limit = int(k.member_session_ms / (1 + k.skew)) - 2 * k.fleet_delay_ms - 20
            self.at(sent_at + limit, self.ev_session_guard, client, guard)
        else:
            self.stats[f"client-error-{ErrorCode(response.error_code).name}"] += 1
        if "revoke" in actions:
            token = client.revocation_token
            self.at(self.now + self.rng.randint(0, 150), self.ev_revoked, client, token)
        if "heartbeat-now" in actions:
            self.schedule_heartbeat(client, 0)
        elif response.error_code not in (ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID):
            self.schedule_heartbeat(client, 200)
        else:
            self.schedule_heartbeat(client, client.heartbeat_interval_ms or k.heartbeat_ms)

    def ev_revoked(self, client: SimulatedConsumer, token: int) -> None:
        if client.alive and client.finish_revocation(token):
            self.schedule_heartbeat(client, 0)

    def ev_session_guard(self, client: SimulatedConsumer, token: int) -> None:
        if token != self.guard_token.get(client.name) or not client.alive:
            return
        if not (client.owned or client.revoking):
            return
        self.stats["client-session-lost"] += 1
        client.lose_partitions("session-lost")
        self.req_seq[client.name] = self.req_seq.get(client.name, 0) + 1
        self.first_unanswered[client.name] = None
        client.in_flight = False
        self.schedule_heartbeat(client, 0)

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
        for client, _ in self.clients:
            if client.state in (ClientState.JOINING, ClientState.LEAVING) or not client.epoch:
                continue
            member = None if group is None else group.members.get(client.member_id)
            if member is not None and client.epoch > member.member_epoch:
                raise InvariantViolation(
                    f"client {client.name} knows epoch {client.epoch}, the state log loaded by "
                    f"a takeover only {member.member_epoch}")

    def check_progress(self) -> None:
        acting = [sc.name for sc in self.sidecars if sc.core.acting(self.local(sc))]
        if len(acting) != 1:
            raise InvariantViolation(f"no progress: {len(acting)} sidecars coordinate "
                                     f"({acting}) after the faults stopped")
        owned = {tp for c, _ in self.clients for tp in c.owned}
        unsettled = [c.name for c, _ in self.clients if c.state is not ClientState.STABLE]
        if owned != self.all_partitions or unsettled:
            raise InvariantViolation(
                f"no progress: {len(self.all_partitions - owned)} partitions unowned, clients "
                f"not stable: {unsettled}")


def run_fleet_seed(seed: int, knobs: Knobs | None = None) -> FleetResult:
    return FleetSimulation(seed, knobs).run()
